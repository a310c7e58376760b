"""CPU check of the W4A4 kernels through Triton's interpreter (with the UE4M3-scale patch of
``emulation.patch_interpreter_e4m3_scales``; Triton 3.9's interpreter decodes e4m3 dot_scaled scales as
E8M0 otherwise).

    TRITON_INTERPRET=1 PYTHONPATH=python python -m tsct.kernels.triton_w4a4._interp_check [--json PATH]

quant_*: ``nvfp4_quant_rows`` against the torch recipe (0002, one row = one matrix), byte for byte
(codes, scale bytes, encode scales), with zero rows, nan/inf, tiny rows, -0.0, ties, a row stride.
up_*: ``w4a4_up_fwd`` against ``emulation.up_forward_model`` on the same codes (relative error; the
products are exact, only the fp32 accumulation order differs) and padding rows exactly zero.
down_*: ``w4a4_down_fwd`` (via ``w4a4.down_forward``: token-major quantizer + gathered codes) against
``emulation.down_forward_model`` (hg, hu, z; fp32, relative error ~1e-7: exact products, fp32 accumulation
order and sigmoid), with empty / one-row experts, gather, d not a multiple of 64, nan / inf rows.
full_*: the whole W4A4 pass (``grouped_glu``, autograd) against ``emulation.w4a4_full_model`` (forward) and
``emulation.ste_grads_model`` (all seven gradients, straight-through) in fp32, and, loosely, against the fp32
reference GLU on the dequantized factors (``tsct.reference``; 4-bit activations at both GEMMs).
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
import tsct.kernels.triton_w4a4 as W  # noqa: E402

TOL = 1e-5
TOL_BWD = 1e-5  # fp32 kernels vs the fp64 STE model at the same hg / hu: accumulation order only


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
    """``w4a4.glu_forward`` (the benchmark arm's pass, forward only): the W4A4 down kernel, the row quantizer,
    the W4A4 up-projection and the bf16 path's combine, with gather / scatter, against the torch model
    (``w4a4_full_model``) per routed row summed per token. Not bit-exact: the kernels' fp32 accumulation order
    differs from the model's, which can move a z element across an NVFP4 rounding boundary."""
    g = torch.Generator().manual_seed(seed)
    m = T * k
    counts = torch.bincount(torch.randint(0, E, (m,), generator=g), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    w = quant.quantize_nvfp4(torch.randn(E, r, f, generator=g) / r ** 0.5, backend="torch")
    x = torch.randn(T, d, generator=g)
    wg = quant.quantize_nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5, backend="torch")
    wu = quant.quantize_nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5, backend="torch")
    sg = 1 + 0.1 * torch.randn(E, r, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, generator=g)
    rwt = torch.rand(m, generator=g)
    tok = torch.randperm(m, generator=g) // k
    y = w4a4.glu_forward(x, offs, wg, wu, w, sg, su, rwt, tok, tok, T)
    rows = EM.w4a4_full_model(x, offs, wg, wu, w, sg, su, rwt, tok)
    ym = torch.zeros(T, f).index_add_(0, tok, rows)
    err = _rel(y, ym)
    return {"name": name, "rel_err": err, "ok": err <= tol and tuple(y.shape) == (T, f)}


def _nvfp4(t):
    return quant.quantize_nvfp4(t, backend="torch")


def _factors(g, E, d, r, f):
    wg = _nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5)
    wu = _nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5)
    wd = _nvfp4(torch.randn(E, r, f, generator=g) / r ** 0.5) if f else None
    return wg, wu, wd


def down_case(name, E, d, r, counts, T=None, pad=2, scales=True, special=False, seed=0, dtype=torch.float32):
    """``w4a4.down_forward`` (save=True) vs ``down_forward_model``; T: token rows gathered (None: no gather).
    special: row 0 of x zero, a nan in token 1, an inf in token 2: the rows reading them must be non-finite
    in hg / hu / z exactly where the model's are, every other row finite and matching."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.as_tensor(counts)
    m = int(counts.sum()) + pad
    offs = torch.cumsum(counts, 0).to(torch.int32)
    n_x = T if T is not None else m
    x = torch.randn(n_x, d, generator=g).to(dtype)
    gidx = torch.randint(0, T, (m,), generator=g) if T is not None else None
    if special:
        x[0] = 0
        x[1, 5 % d] = float("nan")
        x[2, 17 % d] = float("inf")
        if gidx is not None:
            gidx[:3] = torch.tensor([0, 1, 2])
    wg, wu, _ = _factors(g, E, d, r, 0)
    sg = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    su = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    rwt = torch.rand(m, generator=g)
    z, (hg, hu, zw) = w4a4.down_forward(x, offs, wg, wu, sg, su, gidx, rwt, save=True)
    z2, none = w4a4.down_forward(x, offs, wg, wu, sg, su, gidx)
    mh, mu, mz = EM.down_forward_model(w4a4.quantize_rows(x), offs, wg, wu, sg, su, gidx)
    v = int(offs[-1])
    fin = torch.isfinite(mz[:v]).all(1) & torch.isfinite(mh[:v]).all(1) & torch.isfinite(mu[:v]).all(1)
    same_nonfinite = all(bool(torch.equal(torch.isfinite(a[:v]), torch.isfinite(b[:v])))
                         for a, b in ((hg, mh), (hu, mu), (z.float(), mz)))
    errs = [_rel(a[:v][fin], b[:v][fin]) if bool(fin.any()) else 0.0 for a, b in ((hg, mh), (hu, mu), (z, mz))]
    zw_err = _rel(zw[:v][fin], (mz[:v] * rwt[:v, None])[fin]) if bool(fin.any()) else 0.0
    tol = TOL if dtype == torch.float32 else 8e-3
    ok = (max(errs) <= tol and zw_err <= tol and same_nonfinite and none == []
          and torch.equal(torch.nan_to_num(z2[:v]), torch.nan_to_num(z[:v])))  # inference mode: same z bits
    if special:
        ok = ok and int((~fin).sum()) >= 2  # the nan and the inf token rows did reach some routed rows
    return {"name": name, "rel_err_hg": errs[0], "rel_err_hu": errs[1], "rel_err_z": errs[2], "rel_err_zw": zw_err,
            "nonfinite_rows": int((~fin).sum()), "same_nonfinite": same_nonfinite, "ok": bool(ok)}


def full_case(name, T, k, E, d, r, f, empty=(), one_row=(), scatter=True, seed=0, fwd_tol=1e-2):
    """``grouped_glu`` (W4A4 forward + STE backward through autograd, masters for the three factors).

    Forward vs ``w4a4_full_model``: not bit-exact by construction (the kernels' fp32 accumulation order differs
    from the model's fp64, which can move a z element across an NVFP4 rounding boundary: one e2m1 step of one
    z element); ``fwd_rel_err`` is max-abs / max-abs and must be <= fwd_tol (1e-2), ``fwd_rows_exact`` counts
    the output rows within 1e-5. Backward vs ``ste_grads_model`` evaluated at the kernel's own hg / hu
    (``down_forward_model`` on the same codes): smooth in hg / hu, so tight (TOL_BWD). Loose: the forward vs the
    fp32 reference on dequantized factors (``vs_ref_*``)."""
    g = torch.Generator().manual_seed(seed)
    m = T * k
    ids = torch.randint(0, E, (m,), generator=g)
    for e in empty:
        ids[ids == e] = (e + 1) % E
    for e in one_row:
        ids[ids == e] = (e + 1) % E
        ids[e % m] = e
    counts = torch.bincount(ids, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(T, d, generator=g)
    wg, wu, wd = _factors(g, E, d, r, f)
    sg = (1 + 0.1 * torch.randn(E, r, generator=g)).requires_grad_()
    su = (1 + 0.1 * torch.randn(E, r, generator=g)).requires_grad_()
    rwt = torch.rand(m, generator=g).requires_grad_()
    tok = torch.randperm(m, generator=g) // k
    xx = x.clone().requires_grad_()
    masters = [torch.zeros(w.shape, requires_grad=True) for w in (wg, wu, wd)]
    if scatter:
        y = W.grouped_glu(xx, offs, wg, wu, wd, sg, su, row_weight=rwt, gather_idx=tok, scatter_idx=tok,
                          num_out_rows=T, masters=masters)
        rows = EM.w4a4_full_model(x, offs, wg, wu, wd, sg.detach(), su.detach(), rwt.detach(), tok)
        ym = torch.zeros(T, f).index_add_(0, tok, rows)
        yref = R.grouped_glu_forward(x, offs, *(w.dequantize(torch.float32) for w in (wg, wu, wd)), sg.detach(),
                                     su.detach(), rwt.detach(), tok, tok, T)
    else:
        xr = x[tok]
        xx = xr.clone().requires_grad_()
        y = W.grouped_glu(xx, offs, wg, wu, wd, sg, su, row_weight=rwt, masters=masters)
        ym = EM.w4a4_full_model(xr, offs, wg, wu, wd, sg.detach(), su.detach(), rwt.detach())
        yref = R.grouped_glu_forward(xr, offs, *(w.dequantize(torch.float32) for w in (wg, wu, wd)), sg.detach(),
                                     su.detach(), rwt.detach())
    go = torch.randn(y.shape, generator=g)
    (y * go).sum().backward()
    gidx = tok if scatter else None
    xsrc = x if scatter else x[tok]
    hg, hu, _ = EM.down_forward_model(w4a4.quantize_rows(xsrc), offs, wg, wu, None, None, gidx)
    want = EM.ste_grads_model(go, xsrc, offs, wg, wu, wd, sg.detach(), su.detach(), rwt.detach(), gidx,
                              tok if scatter else None, T if scatter else None, hg, hu)
    got = [xx.grad, *(mt.grad for mt in masters), sg.grad, su.grad, rwt.grad]
    names = ["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"]
    bwd = {n: _rel(a, b) for n, a, b in zip(names, got, want)}
    err = _rel(y, ym)
    rows_exact = int(((y - ym).abs().max(1).values <= 1e-5 * ym.abs().max()).sum())
    empty_ok = all(bool((masters[i].grad[e] == 0).all()) for e in empty for i in range(3))
    res = {"name": name, "fwd_rel_err": err, "fwd_rows_exact": rows_exact, "rows": int(y.shape[0]),
           "vs_ref_max_rel": _rel(y, yref), "vs_ref_fro_rel": float((y - yref).norm() / yref.norm()),
           "bwd_rel_err": bwd, "empty_expert_grads_zero": empty_ok, "finite": bool(torch.isfinite(y).all())}
    res["ok"] = bool(err <= fwd_tol and max(bwd.values()) <= TOL_BWD and empty_ok and res["finite"]
                     and tuple(y.shape) == ((T, f) if scatter else (m, f)))
    return res


def error_case(name):
    """Named errors: a dense factor, a d that is not a multiple of 16 (the NVFP4 format refuses it), x's d."""
    g = torch.Generator().manual_seed(0)
    wg, wu, wd = _factors(g, 2, 32, 16, 8)
    x = torch.randn(4, 32)
    offs = torch.tensor([2, 4], dtype=torch.int32)
    msgs = {}
    for key, call in (
        ("dense_w_up", lambda: W.grouped_glu(x, offs, wg, torch.randn(2, 32, 16), wd)),
        ("d_40", lambda: _nvfp4(torch.randn(2, 40, 16))),
        ("x_d", lambda: W.grouped_glu(torch.randn(4, 48), offs, wg, wu, wd)),
    ):
        try:
            call()
            msgs[key] = None
        except (TypeError, ValueError) as e:
            msgs[key] = str(e)
    ok = (msgs["dense_w_up"] is not None and "w_up" in msgs["dense_w_up"] and "NVFP4Tensor" in msgs["dense_w_up"]
          and msgs["d_40"] is not None and "multiple of 16" in msgs["d_40"]
          and msgs["x_d"] is not None and msgs["x_d"].startswith("x must be"))
    return {"name": name, "messages": msgs, "ok": bool(ok)}


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
        down_case("down_gather_d2048_r64", 4, 2048, 64, [9, 0, 1, 30], T=25, seed=8),
        down_case("down_d80_r32_empty_one_row", 5, 80, 32, [0, 1, 7, 0, 66], seed=9),
        down_case("down_d48_r144_multi_rank_block", 2, 48, 144, [3, 12], T=9, scales=False, seed=10),
        down_case("down_nan_inf_rows", 3, 64, 16, [6, 2, 5], T=8, special=True, seed=11),
        down_case("down_bf16", 3, 128, 64, [20, 0, 13], T=17, seed=12, dtype=torch.bfloat16),
        full_case("full_gather_scatter_d80_r32_f37", 24, 2, 6, 80, 32, 37, empty=(2,), one_row=(4,), seed=13),
        full_case("full_f5461_d64_r16", 6, 2, 3, 64, 16, 5461, empty=(1,), seed=14),
        full_case("full_no_scatter_d48_r32_f20", 10, 2, 4, 48, 32, 20, one_row=(0,), scatter=False, seed=15),
        error_case("errors_named"),
    ]
    for r in res:
        print(json.dumps(r))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if all(r["ok"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
