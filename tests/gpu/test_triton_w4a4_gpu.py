"""GPU checks of the W4A4 kernels (issue 4 item 2) on their AOT cubins (scripts/h200_w4a4.sh).

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
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = run()
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
