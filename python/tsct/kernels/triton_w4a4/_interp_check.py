"""CPU check of the W4A4 kernels through Triton's interpreter (with the UE4M3-scale patch of
``emulation.patch_interpreter_e4m3_scales``; Triton 3.9's interpreter decodes e4m3 dot_scaled scales as
E8M0 otherwise).

    TRITON_INTERPRET=1 PYTHONPATH=python python -m tsct.kernels.triton_w4a4._interp_check [--json PATH]

quant_*: ``nvfp4_quant_rows`` against the torch recipe (0002, one row = one matrix), byte for byte
(codes, scale bytes, encode scales), with zero rows, nan/inf, tiny rows, -0.0, ties, a row stride.
up_*: ``w4a4_up_fwd`` against ``emulation.up_forward_model`` on the same codes (relative error; the
products are exact, only the fp32 accumulation order differs) and padding rows exactly zero.
glu_*: end to end (reference-style latent z in fp32 -> kernel quantizer -> kernel up-projection) against
``emulation.w4a4_glu_model`` (quantize-then-multiply in torch) and, for scale, the relative error of
W4A4 against the fp32 reference GLU on the dequantized w_down (``tsct.reference``; z unquantized).
Exit status 1 if a check fails.
"""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1")

import torch  # noqa: E402

from tsct import quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.kernels.triton_w4a4 import emulation as EM  # noqa: E402
from tsct.kernels.triton_w4a4 import w4a4  # noqa: E402

TOL = 1e-5


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def quant_case(name, m, k, dtype, seed, special=True, stride_pad=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(m, k + stride_pad, generator=g) * torch.logspace(-3, 3, m)[:, None]
    x = base.to(dtype)[:, :k]
    if special and m >= 10:
        x[0] = 0
        x[1, 3] = float("nan")
        x[2, 20 % k] = float("inf")
        x[2, 21 % k] = float("-inf")
        x[3] *= 1e-30 if dtype == torch.float32 else 1e-4
        x[4, :16] = -0.0
        x[5, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5,
                                  -3.5, -5.0, 448.0]).to(dtype)
    q = w4a4.quantize_rows(x)
    c, s, se = EM.quantize_rows_torch(x)
    return {"name": name, "codes_equal": bool(torch.equal(q.codes, c)),
            "scales_equal": bool(torch.equal(q.block_scale.view(torch.uint8), s.view(torch.uint8))),
            "senc_equal": bool(torch.equal(q.row_scale, se)),
            "ok": bool(torch.equal(q.codes, c) and torch.equal(q.block_scale.view(torch.uint8), s.view(torch.uint8))
                       and torch.equal(q.row_scale, se))}


def _problem(E, r, f, counts, pad, seed, swizzle=False):
    g = torch.Generator().manual_seed(seed)
    counts = torch.as_tensor(counts)
    m = int(counts.sum()) + pad
    offs = torch.cumsum(counts, 0).to(torch.int32)
    wd = torch.randn(E, r, f, generator=g) / r ** 0.5
    w = quant.quantize_nvfp4(wd, layout="swizzled_128x4" if swizzle else "linear", backend="torch")
    return g, m, offs, w


def up_case(name, E, r, f, counts, pad=3, rw=True, seed=0, swizzle=False, out_dtype=torch.float32):
    g, m, offs, w = _problem(E, r, f, counts, pad, seed, swizzle)
    z = torch.randn(m, r, generator=g)
    rwt = torch.rand(m, generator=g) if rw else None
    if rw and pad:
        rwt[-pad:] = float("nan")  # padding rows: never read
    zq = w4a4.quantize_rows(z)
    y = w4a4.up_forward(zq, offs, w, rwt, out_dtype=out_dtype)
    ym = EM.up_forward_model(zq, offs, w, rwt)
    valid = int(offs[-1])
    err = _rel(y[:valid], ym[:valid]) if valid else 0.0
    tail_zero = bool((y[valid:] == 0).all())
    tol = TOL if out_dtype == torch.float32 else 8e-3
    return {"name": name, "rel_err": err, "tail_zero": tail_zero, "ok": err <= tol and tail_zero
            and bool(torch.isfinite(y).all())}


def glu_case(name, E, d, r, f, counts, seed=0):
    g, m, offs, w = _problem(E, r, f, counts, 0, seed)
    x = torch.randn(m, d, generator=g)
    wg = torch.randn(E, d, r, generator=g) / d ** 0.5
    wu = torch.randn(E, d, r, generator=g) / d ** 0.5
    sg = 1 + 0.1 * torch.randn(E, r, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, generator=g)
    rwt = torch.rand(m, generator=g)
    # latent z as the reference computes it (fp32), then the W4A4 kernels
    z = torch.zeros(m, r)
    b = [0] + offs.tolist()
    for e in range(E):
        if b[e + 1] > b[e]:
            xe = x[b[e]:b[e + 1]]
            z[b[e]:b[e + 1]] = torch.nn.functional.silu((xe @ wg[e]) * sg[e]) * ((xe @ wu[e]) * su[e])
    y = w4a4.up_forward(w4a4.quantize_rows(z), offs, w, rwt, out_dtype=torch.float32)
    ym = EM.w4a4_glu_model(x, offs, wg, wu, w, sg, su, rwt)
    yref = R.grouped_glu_forward(x, offs, wg, wu, w.dequantize(torch.float32), sg, su, rwt)
    err = _rel(y, ym)
    return {"name": name, "rel_err": err, "rel_err_vs_unquantized_z": _rel(y, yref), "ok": err <= TOL}


def pass_case(name, T, k, E, d, r, f, seed=0, tol=1e-2):
    """``w4a4.glu_forward`` (the benchmark arm's pass): the low-bit down kernel, the row quantizer, the
    W4A4 up-projection and the bf16 path's combine, with gather / scatter, against the torch model per
    routed row summed per token. Not bit-exact: the down kernel's fp32 dot accumulates in another order
    than torch, which can move a z element across an NVFP4 rounding boundary."""
    g = torch.Generator().manual_seed(seed)
    m = T * k
    counts = torch.bincount(torch.randint(0, E, (m,), generator=g), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    w = quant.quantize_nvfp4(torch.randn(E, r, f, generator=g) / r ** 0.5, backend="torch")
    x = torch.randn(T, d, generator=g)
    wg = torch.randn(E, d, r, generator=g) / d ** 0.5
    wu = torch.randn(E, d, r, generator=g) / d ** 0.5
    sg = 1 + 0.1 * torch.randn(E, r, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, generator=g)
    rwt = torch.rand(m, generator=g)
    tok = torch.randperm(m, generator=g) // k
    y = w4a4.glu_forward(x, offs, wg, wu, w, sg, su, rwt, tok, tok, T)
    rows = EM.w4a4_glu_model(x[tok], offs, wg, wu, w, sg, su, rwt)
    ym = torch.zeros(T, f).index_add_(0, tok, rows)
    err = _rel(y, ym)
    return {"name": name, "rel_err": err, "ok": err <= tol and tuple(y.shape) == (T, f)}


def main():
    EM.patch_interpreter_e4m3_scales()
    res = [
        quant_case("quant_bf16_k64", 40, 64, torch.bfloat16, 0),
        quant_case("quant_fp32_k80", 33, 80, torch.float32, 1),
        quant_case("quant_fp16_k48_stride", 21, 48, torch.float16, 2, stride_pad=16),
        quant_case("quant_bf16_k2048", 12, 2048, torch.bfloat16, 3),
        up_case("up_r64_single_k", 4, 64, 37, [10, 0, 70, 1]),
        up_case("up_r144_multi_k", 3, 144, 45, [5, 66, 9], seed=1),
        up_case("up_r16", 2, 16, 20, [3, 4], seed=2),
        up_case("up_norw_empty_first", 3, 64, 30, [0, 17, 0], rw=False, seed=3),
        up_case("up_f5461_bf16", 2, 64, 5461, [9, 3], pad=2, seed=4, out_dtype=torch.bfloat16),
        up_case("up_swizzled_w", 2, 64, 33, [7, 8], seed=5, swizzle=True),
        glu_case("glu_d128_r64_f70", 4, 128, 64, 70, [12, 0, 30, 5], seed=6),
        pass_case("pass_gather_scatter_d64_r32_f37", 20, 2, 4, 64, 32, 37, seed=7),
    ]
    for r in res:
        print(json.dumps(r))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if all(r["ok"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
