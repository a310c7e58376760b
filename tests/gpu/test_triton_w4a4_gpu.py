"""GPU checks of the W4A4 kernels (issue 4 item 2) on their AOT cubins (scripts/gpu_suite.sh w4a4).

On the H200 (sm_90a) ``tl.dot_scaled`` runs Triton's bf16 emulation (exact e2m1 * UE4M3 products, fp32
HGMMA accumulation); the cubins were built with Triton 3.9 on the CPU machine (Triton 3.6, the H200
image's, crashes compiling that emulation). Run with TSCT_TRITON_BACKEND=aot and TSCT_AOT_DIR pointing at
the W4A4 cubins so nothing JITs. Checks: the quantizer byte for byte against the torch recipe; the
up-projection against the torch model of its math and against quantize-then-multiply; padding rows zero;
b1 shape (E=1024, r=64, f=5461) smoke + timing; sync-free under CUDA graph capture.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

from tsct import quant  # noqa: E402
from tsct.kernels.triton_w4a4 import emulation as EM  # noqa: E402
from tsct.kernels.triton_w4a4 import w4a4  # noqa: E402
from _cuda_graph import captured  # noqa: E402

DEV = "cuda"


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


@pytest.fixture(autouse=True)
def _aot_only(monkeypatch):
    if os.environ.get("TSCT_W4A4_ALLOW_JIT") != "1":
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k", [(40, 64), (1000, 80), (77, 2048)])
def test_quantizer_bit_exact(dtype, m, k):
    g = torch.Generator().manual_seed(m + k)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]).to(dtype)
    x[0] = 0
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[4, :16] = -0.0
    q = w4a4.quantize_rows(x.to(DEV))
    c, s, se = EM.quantize_rows_torch(x)
    assert torch.equal(q.codes.cpu(), c)
    assert torch.equal(q.block_scale.view(torch.uint8).cpu(), s.view(torch.uint8))
    assert torch.equal(q.row_scale.cpu(), se)
    assert w4a4.backend_counts().get(("aot", "nvfp4_quant_rows"), 0) > 0


def _problem(E, r, f, counts, pad, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.as_tensor(counts)
    m = int(counts.sum()) + pad
    offs = torch.cumsum(counts, 0).to(torch.int32)
    w = quant.quantize_nvfp4(torch.randn(E, r, f, generator=g) / r ** 0.5, backend="torch")
    z = torch.randn(m, r, generator=g)
    rw = torch.rand(m, generator=g)
    return offs, w, z, rw


def _to(w, dev):
    return type(w)(codes=w.codes.to(dev), block_scale=w.block_scale.to(dev), global_scale=w.global_scale.to(dev),
                   layout=w.layout, shape=w.shape)


@pytest.mark.parametrize("E,r,f,counts,rw", [
    (4, 64, 37, [10, 0, 70, 1], True), (3, 144, 45, [5, 66, 9], True), (2, 16, 20, [3, 4], False),
    (8, 64, 5461, [40, 0, 0, 33, 1, 64, 65, 2], True)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("z_dtype", [torch.float32, torch.bfloat16])
def test_up_matches_model(E, r, f, counts, rw, out_dtype, z_dtype):
    """z in fp32 (the exact check) and in bf16 (what the GLU feeds: z has x's dtype); both quantizer
    variants ship (the 2026-11-29 run lacked the fp32 one)."""
    offs, w, z, rwt = _problem(E, r, f, counts, 3, E + r + f)
    rwt = rwt if rw else None
    zq = w4a4.quantize_rows(z.to(z_dtype).to(DEV))
    y = w4a4.up_forward(zq, offs.to(DEV), _to(w, DEV), None if rwt is None else rwt.to(DEV), out_dtype=out_dtype)
    zq_cpu = w4a4.RowNVFP4(zq.codes.cpu(), zq.block_scale.cpu(), zq.row_scale.cpu())
    ym = EM.up_forward_model(zq_cpu, offs, w, rwt)
    valid = int(offs[-1])
    tol = 2e-5 if out_dtype == torch.float32 else 8e-3
    assert _rel(y[:valid].cpu(), ym[:valid]) <= tol
    assert (y[valid:] == 0).all()
    assert w4a4.backend_counts().get(("aot", "w4a4_up_fwd"), 0) > 0


def test_b1_shape_and_graph(tmp_path):
    E, r, f, M = 1024, 64, 5461, 32768
    g = torch.Generator(device=DEV).manual_seed(0)
    counts = torch.bincount(torch.randint(0, E, (M,), device=DEV, generator=g), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    w = quant.quantize_nvfp4(torch.randn(E, r, f, device=DEV, generator=g) / 8, backend="torch")
    z = torch.randn(M, r, device=DEV, generator=g, dtype=torch.bfloat16)
    rw = torch.rand(M, device=DEV, generator=g)

    def run():
        return w4a4.up_forward(w4a4.quantize_rows(z), offs, w, rw)

    y = run()
    torch.cuda.synchronize()
    # spot check a few experts against the model
    zq = w4a4.quantize_rows(z)
    sel = [0, 1, 511, 1023]
    b = [0] + offs.cpu().tolist()
    for e in sel:
        lo, hi = b[e], b[e + 1]
        if hi > lo:
            sub = w4a4.RowNVFP4(zq.codes[lo:hi].cpu(), zq.block_scale[lo:hi].cpu(), zq.row_scale[lo:hi].cpu())
            we = type(w)(codes=w.codes[e:e + 1].cpu(), block_scale=w.block_scale[e:e + 1].cpu(),
                         global_scale=w.global_scale[e:e + 1].cpu(), layout="linear", shape=(1, r, f))
            ym = EM.up_forward_model(sub, torch.tensor([hi - lo], dtype=torch.int32), we, rw[lo:hi].cpu())
            assert _rel(y[lo:hi].cpu(), ym) <= 8e-3
    # sync-free: capture in a CUDA graph and replay
    graph, yg = captured(run)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)
    # timing (emulated fp4 on sm_90: labelled so)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(3):
        graph.replay()
    ev[0].record()
    for _ in range(20):
        graph.replay()
    ev[1].record()
    torch.cuda.synchronize()
    ms = ev[0].elapsed_time(ev[1]) / 20
    res = {"shape": "b1 up-projection (quantize z + W4A4 z @ w_down, rw)", "E": E, "r": r, "f": f, "M": M,
           "ms": ms, "device": torch.cuda.get_device_name(), "mode": "dot_scaled bf16 emulation (sm_90a)"}
    print("W4A4 b1:", json.dumps(res))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "w4a4_b1.json"), "w") as fh:
            json.dump(res, fh, indent=1)


# ---- the W4A4 down-projection and the whole pass (forward + STE backward) --------------------------------

def _nvfp4(t):
    return quant.quantize_nvfp4(t, backend="torch")


def _down_problem(E, d, r, counts, T, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    counts = torch.as_tensor(counts)
    m = int(counts.sum()) + 3
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(T if T else m, d, generator=g).to(dtype)
    gidx = torch.randint(0, T, (m,), generator=g) if T else None
    wg = _nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5)
    wu = _nvfp4(torch.randn(E, d, r, generator=g) / d ** 0.5)
    sg = 1 + 0.1 * torch.randn(E, r, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, generator=g)
    rw = torch.rand(m, generator=g)
    return offs, x, gidx, wg, wu, sg, su, rw


@pytest.mark.parametrize("E,d,r,counts,T", [
    (4, 2048, 64, [10, 0, 70, 1], 50), (3, 80, 144, [5, 66, 9], 0), (8, 2048, 64, [40, 0, 0, 33, 1, 64, 65, 2], 90)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("save", [False, True])
def test_down_matches_model(E, d, r, counts, T, dtype, save):
    """w4a4_down_fwd on the cubins (sm_90a: dot_scaled's bf16 emulation, exact products, fp32 HGMMA) vs the torch
    model of its math on the same x codes: hg / hu fp32 at 2e-5, z at 2e-5 (fp32) / 8e-3 (bf16 rounding)."""
    offs, x, gidx, wg, wu, sg, su, rw = _down_problem(E, d, r, counts, T, E + d + r, dtype)
    z, saved = w4a4.down_forward(x.to(DEV), offs.to(DEV), _to(wg, DEV), _to(wu, DEV), sg.to(DEV), su.to(DEV),
                                 None if gidx is None else gidx.to(DEV), rw.to(DEV), save=save)
    xq = w4a4.quantize_rows(x.to(DEV))
    xq_cpu = w4a4.RowNVFP4(xq.codes.cpu(), xq.block_scale.cpu(), xq.row_scale.cpu())
    mh, mu, mz = EM.down_forward_model(xq_cpu, offs, wg, wu, sg, su, gidx)
    v = int(offs[-1])
    tol = 2e-5 if dtype == torch.float32 else 8e-3
    assert _rel(z[:v].cpu(), mz[:v]) <= tol
    if save:
        hg, hu, zw = (t.cpu() for t in saved)
        assert _rel(hg[:v], mh[:v]) <= 2e-5 and _rel(hu[:v], mu[:v]) <= 2e-5
        assert _rel(zw[:v], mz[:v] * rw[:v, None]) <= tol
    assert w4a4.backend_counts().get(("aot", "w4a4_down_fwd"), 0) > 0


def _route(T, k, E, g, dev="cpu"):
    ids = torch.randint(0, E, (T, k), generator=g)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    return offs.to(dev), (order // k).to(dev), order


@pytest.mark.parametrize("T,k,E,d,r,f", [(64, 2, 8, 2048, 64, 5461), (40, 2, 6, 80, 32, 37)])
def test_full_pass_forward_backward(T, k, E, d, r, f):
    """triton_w4a4.grouped_glu (bf16 x: the backward's low-bit cubins are bf16-only) with gather / scatter and
    masters. Forward: the GPU's own z, quantized by the torch recipe and multiplied by the up model, combined in
    fp32, vs the output (bf16 y and out rounding: 1e-2); hg / hu vs the down model (2e-5); vs the fp32 reference
    on the dequantized factors loosely (Frobenius < 0.3: 4-bit activations at both GEMMs). Backward: all seven
    gradients vs the fp64 STE model at the GPU's own hg / hu (bf16 intermediates dh, z*rw, dx rows: 3e-2)."""
    import tsct.kernels.triton_w4a4 as W
    from tsct import reference as R

    g = torch.Generator().manual_seed(T + d + f)
    offs, tok, _ = _route(T, k, E, g)
    m = T * k
    x = torch.randn(T, d, generator=g).to(torch.bfloat16)
    wg, wu, wd = (_nvfp4(torch.randn(*s, generator=g) / s[1] ** 0.5) for s in ((E, d, r), (E, d, r), (E, r, f)))
    sg = 1 + 0.1 * torch.randn(E, r, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, generator=g)
    rw = torch.rand(m, generator=g)
    go = torch.randn(T, f, generator=g).to(torch.bfloat16)
    xd = x.to(DEV).requires_grad_()
    sgd, sud, rwd = (t.to(DEV).requires_grad_() for t in (sg, su, rw))
    masters = [torch.zeros(w.shape, device=DEV, requires_grad=True) for w in (wg, wu, wd)]
    y = W.grouped_glu(xd, offs.to(DEV), _to(wg, DEV), _to(wu, DEV), _to(wd, DEV), sgd, sud, row_weight=rwd,
                      gather_idx=tok.to(DEV), scatter_idx=tok.to(DEV), num_out_rows=T, masters=masters)
    y.backward(go.to(DEV))
    out, (hg, hu, zw) = w4a4.grouped_glu_forward_saved(x.to(DEV), offs.to(DEV), _to(wg, DEV), _to(wu, DEV),
                                                       _to(wd, DEV), sg.to(DEV), su.to(DEV), rw.to(DEV),
                                                       tok.to(DEV), tok.to(DEV), T)
    assert torch.equal(out, y.detach())  # the autograd entry runs the same forward (deterministic)
    z, _ = w4a4.down_forward(x.to(DEV), offs.to(DEV), _to(wg, DEV), _to(wu, DEV), sg.to(DEV), su.to(DEV), tok.to(DEV))
    v = int(offs[-1])
    zq = w4a4.RowNVFP4(*EM.quantize_rows_torch(z.float().cpu()))
    rows = EM.up_forward_model(zq, offs, wd, rw)
    ym = torch.zeros(T, f).index_add_(0, tok[:v], rows[:v])
    assert _rel(y.detach().cpu(), ym) <= 1e-2
    xq = w4a4.quantize_rows(x.to(DEV))
    mh, mu, _ = EM.down_forward_model(w4a4.RowNVFP4(xq.codes.cpu(), xq.block_scale.cpu(), xq.row_scale.cpu()), offs,
                                      wg, wu, None, None, tok)
    assert _rel(hg[:v].cpu(), mh[:v]) <= 2e-5 and _rel(hu[:v].cpu(), mu[:v]) <= 2e-5
    yref = R.grouped_glu_forward(x.float(), offs, *(w.dequantize(torch.float32) for w in (wg, wu, wd)), sg, su, rw,
                                 tok, tok, T)
    fro = float((y.detach().cpu().float() - yref).norm() / yref.norm())
    assert 1e-3 < fro < 0.3, fro
    want = EM.ste_grads_model(go.float(), x.float(), offs, wg, wu, wd, sg, su, rw, tok, tok, T, hg.cpu(), hu.cpu())
    got = [xd.grad, *(mt.grad for mt in masters), sgd.grad, sud.grad, rwd.grad]
    for name, a, b in zip(["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"], got, want):
        assert a is not None and _rel(a.cpu(), b) <= 3e-2, (name, _rel(a.cpu(), b))
    print("W4A4 full pass", (T, k, E, d, r, f), "vs reference Frobenius", round(fro, 4))


def test_b1_full_pass_timing():
    """b1 (T 16384, top-2, E 1024, d 2048, r 64, f 5461, bf16): the whole W4A4 pass (routing sort excluded:
    the inputs arrive routed), CUDA-graph capture and replay (same bits), timings of the forward (graph replay)
    and forward+backward (eager), and the per-expert check of a few experts' hg / hu. Labelled: on sm_90 the
    block-scaled MMA is Triton's bf16 emulation."""
    import tsct.kernels.triton_w4a4 as W

    T, k, E, d, r, f = 16384, 2, 1024, 2048, 64, 5461
    g = torch.Generator(device=DEV).manual_seed(1)
    ids = torch.randint(0, E, (T, k), device=DEV, generator=g)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    tok = order // k
    x = torch.randn(T, d, device=DEV, generator=g).to(torch.bfloat16)
    wg, wu, wd = (quant.quantize_nvfp4(torch.randn(*s, device=DEV, generator=g) / s[1] ** 0.5, backend="torch")
                  for s in ((E, d, r), (E, d, r), (E, r, f)))
    sg = 1 + 0.1 * torch.randn(E, r, device=DEV, generator=g)
    su = 1 + 0.1 * torch.randn(E, r, device=DEV, generator=g)
    rw = torch.rand(T * k, device=DEV, generator=g)

    def fwd():
        return w4a4.grouped_glu_forward(x, offs, wg, wu, wd, sg, su, rw, tok, tok, T)

    y = fwd()
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()
    graph, yg = captured(fwd)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)  # sync-free and deterministic

    def timed(fn, n):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(3):
            fn()
        ev[0].record()
        for _ in range(n):
            fn()
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]) / n

    ms_graph = timed(graph.replay, 20)
    ms_eager = timed(fwd, 20)
    xd = x.detach().requires_grad_()
    rwd = rw.detach().requires_grad_()
    masters = [torch.zeros(w.shape, device=DEV, dtype=torch.bfloat16, requires_grad=True) for w in (wg, wu, wd)]
    go = torch.randn(T, f, device=DEV, dtype=torch.bfloat16)

    def fwd_bwd():
        for t in (xd, rwd, *masters):
            t.grad = None
        W.grouped_glu(xd, offs, wg, wu, wd, sg, su, row_weight=rwd, gather_idx=tok, scatter_idx=tok, num_out_rows=T,
                      masters=masters).backward(go)

    ms_fb = timed(fwd_bwd, 10)
    assert all(torch.isfinite(t.grad).all() for t in (xd, rwd, *masters))
    # a few experts' hg / hu against the model
    _, (hg, hu, _) = w4a4.down_forward(x, offs, wg, wu, None, None, tok, None, save=True)
    xq = w4a4.quantize_rows(x)
    b = [0] + offs.cpu().tolist()
    for e in (0, 511, 1023):
        lo, hi = b[e], b[e + 1]
        if hi <= lo:
            continue
        sub = [type(wg)(codes=w.codes[e:e + 1].cpu(), block_scale=w.block_scale[e:e + 1].cpu(),
                        global_scale=w.global_scale[e:e + 1].cpu(), layout="linear", shape=(1, d, r)) for w in (wg, wu)]
        ti = tok[lo:hi].cpu()
        mh, mu, _ = EM.down_forward_model(w4a4.RowNVFP4(xq.codes.cpu(), xq.block_scale.cpu(), xq.row_scale.cpu()),
                                          torch.tensor([hi - lo], dtype=torch.int32), *sub, None, None, ti)
        assert _rel(hg[lo:hi].cpu(), mh) <= 2e-5 and _rel(hu[lo:hi].cpu(), mu) <= 2e-5
    res = {"shape": "b1 whole W4A4 pass, inputs routed (W4A4 down + quantize z + W4A4 up + combine)", "T": T, "k": k,
           "E": E, "d": d, "r": r, "f": f, "fwd_ms_graph": ms_graph, "fwd_ms_eager": ms_eager,
           "fwd_bwd_ms_eager": ms_fb, "device": torch.cuda.get_device_name(),
           "mode": "emulated (sm_90): dot_scaled bf16 emulation (sm_90a cubins)"}
    print("W4A4 b1 full:", json.dumps(res))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "w4a4_b1_full.json"), "w") as fh:
            json.dump(res, fh, indent=1)


def test_explicit_dispatch_path_and_its_selftest():
    """impl="triton-w4a4" through tsct.ops (tsct::grouped_glu_q): the self-test against the W4A4 model passes,
    auto never takes it, and the op's gradients reach x, the row weights and an STE master."""
    from tsct import dispatch, selftest
    from tsct.ops import grouped_glu

    cap = torch.cuda.get_device_capability()
    assert dispatch.status(dispatch.TRITON_W4A4, cap, "nvfp4").ok
    assert dispatch.TRITON_W4A4 not in dispatch.preferences(cap, "nvfp4")
    res = selftest.w4a4_forward(torch.device("cuda"))
    assert res.ok, res.detail
    g = torch.Generator().manual_seed(3)
    E, d, r, f, T = 4, 64, 32, 40, 12
    counts = torch.tensor([7, 0, 12, 5])
    offs = counts.cumsum(0).to(torch.int32).cuda()
    m = int(counts.sum())
    tok = (torch.arange(m) % T).cuda()
    x = torch.randn(T, d, generator=g).to(torch.bfloat16).cuda().requires_grad_(True)
    master = (torch.randn(E, d, r, generator=g) / 8).cuda().requires_grad_(True)
    wg = quant.quantize_nvfp4(master.detach(), backend="torch")
    wu, wd = (quant.quantize_nvfp4((torch.randn(E, k, n, generator=g) / 8).cuda(), backend="torch")
              for k, n in ((d, r), (r, f)))
    rw = torch.rand(m, generator=g).cuda().requires_grad_(True)
    y = grouped_glu(x, offs, wg, wu, wd, row_weight=rw, gather_idx=tok, scatter_idx=tok, num_out_rows=T,
                    impl="triton-w4a4", masters=(master, None, None))
    y.float().square().sum().backward()
    for t in (x, rw, master):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_triton_w4a4_agrees_with_the_sm120_kernel_emulation():
    """Issue 5 item 4(c): the Triton W4A4 up-projection (tl.dot_scaled, run here as its sm_90 emulation) and
    the torch emulation of the sm_120 CuTeDSL row-weight kernel (``tsct.emulation``: per-16 block products,
    fp32 accumulation, swizzled per-expert scales, alpha = 1 / (s_enc_z * s_enc_w)) on the SAME NVFP4
    operands. The two activation recipes differ (one encode scale per row vs per expert), so the rows are
    built with one amax per expert: then both quantizers must give the same codes and scales (checked),
    and the two GEMMs the same fp32 products up to summation order."""
    from tsct.emulation import grouped_glu as EG
    from tsct.emulation import nvfp4_mma as MMA
    from tsct.emulation import plan as P

    g = torch.Generator().manual_seed(21)
    E, r, f = 4, 64, 96
    counts = torch.tensor([9, 0, 40, 3])
    offs = counts.cumsum(0).to(torch.int32)
    m = int(counts.sum())
    z = torch.rand(m, r, generator=g) - 0.5  # |z| < 0.5 < every expert's amax below
    amax = torch.tensor([1.5, 2.0, 3.25, 0.75])
    z[:, 0] = torch.repeat_interleave(amax, counts)  # one amax per expert: per-row scale == per-expert scale
    rw = torch.rand(m, generator=g)
    wd = quant.quantize_nvfp4(torch.randn(E, r, f, generator=g), layout="swizzled_128x4", backend="torch")

    tile_m = 32
    zq = EG.quantize_rows_grouped(z, offs, tile_m)
    plan = P.make_plan(offs, m, f, r, tile_m=tile_m, tile_n=32)
    want = MMA.grouped_gemm_emulated(zq.codes, zq.sfa, zq.sfa_offsets, wd.codes, wd.block_scale, offs,
                                     plan.tile_expert, plan.tile_row, tile_m,
                                     P.alpha_from_encode_scales(zq.s_enc, wd.global_scale), epilogue="row_weight",
                                     ep0=rw, out_dtype=torch.float32, m_out=m)

    zr = w4a4.quantize_rows(z.cuda())
    assert torch.equal(zr.codes.cpu(), zq.codes[:m])  # same recipe, same operands
    assert torch.equal(zr.row_scale.cpu(), torch.repeat_interleave(zq.s_enc, counts))
    got = w4a4.up_forward(zr, offs.cuda(), quant.to_layout(wd, "linear").to("cuda"), rw.cuda(),
                          out_dtype=torch.float32).cpu()
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-5, err  # fp32 sums in another order; 4-bit quantization is identical on both sides
