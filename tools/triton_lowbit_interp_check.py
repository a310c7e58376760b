"""CPU check of the low-bit Triton GLU through Triton's interpreter, in fp32 (the interpreter is only
trusted for fp32 dots, design.md section 5): x fp32, packed factors decoded in-kernel to fp32, against
``tsct.reference`` on ``tsct.quant.dequantize``'d factors (fp32). Same math, so a tight tolerance.

    TRITON_INTERPRET=1 PYTHONPATH=python python tools/triton_lowbit_interp_check.py [--json PATH] [CASE...]

Cases: each format (nvfp4, sign, fp8, ternary absmean / rank-1) for all three factors, and mixes (nvfp4
gate/up + sign down, dense + packed, fp8 + ternary + nvfp4);
gather/scatter on and off, scales/row weight on and off, padding rows (NaN row weights, garbage
indices), empty and one-row experts, multi-tile experts, odd f (37), r > 128 (multi-K up kernel), a
swizzled-layout NVFP4 factor (converted, counted). Forward and all seven gradients (factor slots: the
gradient w.r.t. the decoded factor, which the reference computes on the dequantized dense factor).
Exit status 1 if any relative error exceeds TOL.
"""

from __future__ import annotations

import collections
import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":  # must be set before triton is imported
    sys.exit("set TRITON_INTERPRET=1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tsct import quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_lowbit import glu as L  # noqa: E402
from triton_lowbit_decode_check import check_tile_decode, tile_mismatches  # noqa: E402  (a sibling in tools/)
from tsct.kernels.triton_lowbit._kernels import _e2m1, _ternary_w, _ue4m3  # noqa: E402

TOL = 2e-5  # fp32, same math; only accumulation order and the place of 1/s_enc and b[n] differ


def make(T, k, E, d, r, f, fmts=("nvfp4", "nvfp4", "nvfp4"), pad=3, gather=True, scatter=True, scales=True,
         rw=True, counts=None, seed=0, swizzle=False):
    g = torch.Generator().manual_seed(seed)
    valid = T * k
    m = valid + pad
    if counts is None:
        counts = torch.bincount(torch.randint(0, E, (valid,), generator=g), minlength=E)
    counts = torch.as_tensor(counts)
    assert int(counts.sum()) == valid
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(T if gather else m, d, generator=g)
    dense = [torch.randn(E, d, r, generator=g) / d ** 0.5, torch.randn(E, d, r, generator=g) / d ** 0.5,
             torch.randn(E, r, f, generator=g) / r ** 0.5]
    facs = []
    for w, fmt in zip(dense, fmts):
        if fmt == "dense":
            facs.append(w)
        elif fmt == "nvfp4":
            facs.append(quant.quantize_nvfp4(w, layout="swizzled_128x4" if swizzle else "linear", backend="torch"))
        elif fmt == "fp8":
            facs.append(quant.quantize_fp8(w, backend="torch"))
        elif fmt in ("ternary", "ternary_r1"):
            facs.append(quant.quantize_ternary(w, scaling="rank1" if fmt == "ternary_r1" else "absmean",
                                               backend="torch"))
        else:
            facs.append(quant.quantize_sign(w, backend="torch"))
    sg = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    su = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    rwt = torch.cat([torch.rand(valid, generator=g), torch.full((pad,), float("nan"))]) if rw else None
    gi = torch.cat([torch.randperm(valid, generator=g) // k, torch.full((pad,), 10 ** 9)]).to(torch.int32) \
        if gather else None
    si = torch.cat([torch.randperm(valid, generator=g) // k, torch.full((pad,), -7)]) if scatter else None
    return [x, offs, *facs, sg, su, rwt, gi, si, (T if scatter else None)]


def dequantized(args):
    out = list(args)
    for i in (2, 3, 4):
        out[i] = quant.dequantize(args[i], dtype=torch.float32, backend="torch")
    return out


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


N, S, D, F8, T, T1 = "nvfp4", "sign", "dense", "fp8", "ternary", "ternary_r1"
CASES = {
    "nvfp4_basic": dict(T=24, k=2, E=4, d=32, r=16, f=40),
    "sign_basic": dict(T=24, k=2, E=4, d=32, r=16, f=40, fmts=(S, S, S)),
    "sign_r64": dict(T=40, k=2, E=3, d=64, r=64, f=37, counts=[0, 70, 10], fmts=(S, S, S)),
    "nvfp4_r64": dict(T=16, k=2, E=3, d=64, r=64, f=5461, counts=[20, 0, 12]),
    "nvfp4_nogs": dict(T=24, k=2, E=4, d=32, r=16, f=37, gather=False, scatter=False),
    # rows of f % 8 == 0 without scatter: the up kernel's vector-store variant (Y_PAD) writes y itself
    "sign_nogs_f64_multitile": dict(T=50, k=2, E=3, d=32, r=16, f=64, counts=[0, 90, 10], fmts=(S, S, S),
                                    gather=False, scatter=False),
    "sign_nogs_noscales": dict(T=24, k=2, E=5, d=48, r=16, f=37, fmts=(S, S, S), gather=False, scatter=False,
                               scales=False, rw=False),
    "mixed_ns_d": dict(T=20, k=2, E=3, d=64, r=32, f=37, fmts=(N, S, D)),
    "mixed_dd_n": dict(T=20, k=2, E=3, d=32, r=16, f=21, fmts=(D, D, N), scatter=False),
    "empty_one_multitile": dict(T=50, k=2, E=5, d=32, r=16, f=37, counts=[0, 1, 0, 98, 1], fmts=(S, N, S)),
    "nvfp4_d80_r48": dict(T=16, k=2, E=3, d=80, r=48, f=70, pad=5),
    "sign_d72_r24": dict(T=16, k=2, E=3, d=72, r=24, f=29, fmts=(S, S, S)),
    "nvfp4_r144_multik": dict(T=10, k=2, E=2, d=32, r=144, f=19, pad=2, fmts=(N, S, N)),
    "swizzled_nvfp4": dict(T=16, k=2, E=3, d=32, r=16, f=24, swizzle=True),
    "f5461_sign_nvfp4": dict(T=6, k=2, E=2, d=16, r=16, f=5461, counts=[12, 0], fmts=(S, N, N), pad=1),
    "fp8_basic": dict(T=24, k=2, E=4, d=32, r=16, f=37, counts=[10, 0, 37, 1], fmts=(F8, F8, F8)),
    "fp8_d37_r20_nogs": dict(T=16, k=2, E=3, d=37, r=20, f=29, counts=[0, 20, 12], fmts=(F8, F8, F8), gather=False,
                             scatter=False),
    "fp8_r64_f5461": dict(T=8, k=2, E=3, d=64, r=64, f=5461, counts=[0, 14, 2], fmts=(F8, F8, F8), pad=1),
    "ternary_basic": dict(T=24, k=2, E=4, d=32, r=16, f=37, counts=[0, 12, 35, 1], fmts=(T, T, T)),
    "ternary_r1_d72_r24": dict(T=16, k=2, E=3, d=72, r=24, f=29, counts=[5, 0, 27], fmts=(T1, T1, T1)),
    "ternary_r144_multik": dict(T=10, k=2, E=2, d=32, r=144, f=19, pad=2, fmts=(T, T1, T)),
    "mixed_f8_t_n": dict(T=20, k=2, E=3, d=32, r=16, f=21, counts=[0, 30, 10], fmts=(F8, T, N)),
    "mixed_t1_d_f8": dict(T=20, k=2, E=3, d=48, r=32, f=37, fmts=(T1, D, F8), scales=False),
}


@triton.jit
def _decode_all(src, out_a, out_b, out_t):
    i = tl.arange(0, 256)
    b = tl.load(src + i).to(tl.int32)
    tl.store(out_a + i, _e2m1(b & 15))
    tl.store(out_b + i, _ue4m3(b))
    for j in tl.static_range(4):
        tl.store(out_t + 4 * i + j, _ternary_w(b, j))


def check_decode() -> float:
    """Exhaustive: the in-kernel E2M1 (16 codes), E4M3 (256 bytes: the NVFP4 block scales and the fp8 codes) and
    ternary (256 bytes of 4 codes) decoders against tsct.quant's tables; NaN where torch has NaN. Returns 0.0 when
    all match bit for bit (NaN == NaN), else inf."""
    from tsct.quant import formats

    src = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    a = torch.empty(256)
    b = torch.empty(256)
    t = torch.empty(256 * 4)
    _decode_all[(1,)](src, a, b, t)
    want_a = formats.e2m1_decode(src & 15)
    want_b = src.view(torch.float8_e4m3fn).float()
    want_t = formats.ternary_decode(formats.unpack_2bit(src.reshape(1, 1, 256))).reshape(-1).float()

    def same(got, want):
        nan = want.isnan()
        return torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))

    ok = torch.equal(a.view(torch.int32), want_a.view(torch.int32)) and same(b, want_b) and same(t, want_t)
    return 0.0 if ok else float("inf")


def check_op(fmts=("nvfp4", "sign", "nvfp4"), tags_want=("nvfp4", "sign", "nvfp4-swizzled_128x4")) -> dict:
    """The same kernels behind the ``tsct::grouped_glu`` custom op (what ``tsct.ops.grouped_glu`` calls for
    packed factors on a GPU; auto never picks this path on the CPU, so the op is called directly with
    ``impl="triton-lowbit"``): containers packed to (tag, storage, carrier) and rebuilt in the op; masters
    as carriers get the STE gradient through the op's registered autograd (a packed factor without one gets
    none); x, s_gate and the row weight their gradients; an NVFP4 w_down swizzled."""
    from tsct.ops import _function as F

    args = make(T=16, k=2, E=3, d=32, r=16, f=24, fmts=fmts, seed=4)
    if fmts[2] == "nvfp4":
        args[4] = quant.to_layout(args[4], "swizzled_128x4")
    ref_args = dequantized(args)
    masters = [torch.randn(3, 32, 16, requires_grad=True), None, torch.randn(3, 16, 24, requires_grad=True)]
    x = args[0].clone().requires_grad_(True)
    sg = args[5].clone().requires_grad_(True)
    rw = args[7].clone().requires_grad_(True)
    routing = F.Routing(args[1], args[8], args[9], args[10], rw)
    inputs, call = F.encode(x, tuple(args[2:5]), masters, sg, args[6], routing, "triton-lowbit")
    tags = tuple(call.formats.split(","))
    out, _saved = torch.ops.tsct.grouped_glu(*F._op_args(inputs, call))
    go = torch.randn_like(out)
    out.backward(go)
    want = R.grouped_glu_backward(go, *ref_args, [True] * 7)
    return {"op_fwd": rel(out.detach(), R.grouped_glu_forward(*ref_args)), "op_x": rel(x.grad, want[0]),
            "op_master_gate": rel(masters[0].grad, want[1]), "op_master_down": rel(masters[2].grad, want[3]),
            "op_s_gate": rel(sg.grad, want[4]), "op_row_weight": rel(rw.grad, want[6]),
            "op_tags_ok": 0.0 if tags == tags_want else 1.0}


def check_nan_codes() -> dict:
    """A non-finite element of an fp8 / ternary (absmean, rank-1) w_down gets the format's NaN code: the forward is
    NaN exactly where the reference on the dequantized factors is (that expert's rows, that column; mask mismatch:
    inf) and matches it elsewhere (the relative error)."""
    errs = {}
    for fmt, opts in (("fp8", {}), ("ternary", {"scaling": "absmean"}), ("ternary_r1", {"scaling": "rank1"})):
        args = make(T=16, k=2, E=3, d=32, r=16, f=24, counts=[0, 20, 12], fmts=("fp8", "ternary", "nvfp4"), seed=6)
        w = torch.randn(3, 16, 24, generator=torch.Generator().manual_seed(7)) / 4
        w[1, 3, 5] = float("nan")
        args[4] = quant.quantize(w, fmt.split("_")[0], backend="torch", **opts)
        ref = R.grouped_glu_forward(*dequantized(args))
        out = L.grouped_glu_forward(*args)
        nan = ref.isnan()
        same = bool(nan.any()) and torch.equal(out.isnan(), nan)
        errs[fmt] = rel(out[~nan], ref[~nan]) if same else float("inf")
    return errs


def run(names):
    results = {}
    for name in names:
        kw = CASES[name]
        args = make(**kw)
        ref_args = dequantized(args)
        ref = R.grouped_glu_forward(*ref_args)
        out = L.grouped_glu_forward(*args)
        errs = {"fwd": rel(out, ref)}
        m = kw["T"] * kw["k"]
        if not kw.get("scatter", True) and kw.get("pad", 3):
            errs["pad_rows_nonzero"] = float((out[m:] != 0).sum())
        go = torch.randn_like(ref)
        got = L.grouped_glu_backward(go, *args, [True] * 7)
        want = R.grouped_glu_backward(go, *ref_args, [True] * 7)
        for gname, a, b in zip(["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"], got, want):
            if (a is None) != (b is None):
                errs[gname] = float("inf")
            elif b is not None:
                errs[gname] = rel(a, b) if tuple(a.shape) == tuple(b.shape) else float("inf")
        counts = torch.diff(args[1], prepend=args[1].new_zeros(1))
        empty = counts == 0
        if empty.any():  # empty experts: exact zero gradients in every per-expert slot
            errs["empty_expert_grads_nonzero"] = float(sum(int((g[empty] != 0).sum()) for g in got[1:6]
                                                           if g is not None))
        if got[6] is not None and kw.get("pad", 3):
            errs["pad_drw_nonzero"] = float((got[6][m:] != 0).sum())
        # dX only (what a frozen packed model needs)
        only = L.grouped_glu_backward(go, *args, [True] + [False] * 6)
        errs["dx_only"] = rel(only[0], want[0])
        # the forward that saves hg, hu, z*rw and the backward that reads them instead of recomputing
        out_s, saved = L.grouped_glu_forward_saved(*args)
        errs["saved_fwd"] = rel(out_s, ref)
        got_s = L.grouped_glu_backward(go, *args, [True] * 7, saved=saved)
        errs["saved_grads"] = max((rel(a, b) for a, b in zip(got_s, want) if b is not None), default=0.0)
        results[name] = errs
        worst = max(errs.values())
        print(f"{name:22s} worst rel err {worst:.2e}  " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()),
              flush=True)
    return results


def main(argv) -> int:
    path = None
    if argv[:1] == ["--json"]:
        path, argv = argv[1], argv[2:]
    names = argv or list(CASES)
    res = run(names)
    if not argv:
        # the NVFP4 / FP8 bf16 pair decoders multiply, which the interpreter gets wrong in bf16: the GPU tests; the
        # ternary one only moves bits, so its bf16 tile is checked here too (element mismatches)
        res["decode_exhaustive"] = {"mismatch": check_decode(),
                                    "tile_fp32": check_tile_decode("cpu", dtypes=(torch.float32,)),
                                    "tile_ternary_bf16": float(tile_mismatches("cpu", (torch.bfloat16,))
                                                               ["ternary bfloat16"])}
        res["custom_op"] = check_op()
        res["custom_op_fp8_ternary"] = check_op(("fp8", "ternary_r1", "ternary"), ("fp8", "ternary", "ternary"))
        res["nan_codes"] = check_nan_codes()
        for k in ("decode_exhaustive", "custom_op", "custom_op_fp8_ternary", "nan_codes"):
            print(f"{k:22s} " + " ".join(f"{a}={b:.1e}" for a, b in res[k].items()), flush=True)
    if path:
        with open(path, "w") as fh:
            launches = collections.Counter(L.launch_counts())  # this family's, then the shared kernels' (both backends)
            for (_, kernel), n in C.backend_counts().items():
                launches[kernel] += n
            json.dump({"tol": TOL, "results": res, "conversions": L.layout_conversions(), "launches": launches}, fh)
    worst = max(max(v.values()) for v in res.values())
    print(f"worst {worst:.2e} (tol {TOL:.0e})")
    return 0 if worst < TOL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
