"""The grouped activation quantizer's CUDA kernel (tsct_nvfp4_quantize_rows_grouped) against the
torch reference (tsct.kernels.sm120_fp4.quant_rows.quantize_rows_grouped_torch), BIT FOR BIT:
codes, every byte of the per-expert swizzled scale buffer (padding included), sfa_offsets, s_enc.

Cases: tests/_native_cases.py rows_grouped_cases() (random, Student-t heavy tails, nan/inf/+-0 blocks,
empty experts, all experts empty, padding rows and the m_alloc tail, gather with never-read padding
entries, per-expert column scale, one 300-row expert, E = 0) and the b1 shape (M = 32768 gathered rows,
E = 1024, K = 2048, bf16). Outputs are poisoned (0xA5) before each launch. Also: a CUDA-graph
capture (no host sync inside), a side stream, and an unaligned x (scalar loads).

Runs on any CUDA GPU (the kernel is built for every gencode); it has run on an H200.
    pytest -s -m gpu tests/kernels/test_sm120_quant_rows_gpu.py     (TSCT_GPU_LOG=path appends the lines)
"""

from __future__ import annotations

import time

import pytest
import torch
from _gpu_log import log

from tsct.kernels.sm120_fp4.quant_rows import quantize_rows_grouped, quantize_rows_grouped_torch
from tsct.native import _ops
import _native_cases as T
from _cuda_graph import gc_paused

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = T.rows_grouped_cases()


@pytest.fixture(autouse=True)
def _poison():
    old = _ops._POISON_OUTPUTS
    _ops._POISON_OUTPUTS = True
    yield
    _ops._POISON_OUTPUTS = old


def _to(kw, dev):
    return {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in kw.items()}


def _compare(name, ref, got):
    checks = {
        "codes": torch.equal(got.codes.cpu(), ref.codes.cpu()),
        "scales": torch.equal(got.sfa.view(torch.uint8).cpu(), ref.sfa.view(torch.uint8).cpu()),
        "sfa_offsets": torch.equal(got.sfa_offsets.cpu(), ref.sfa_offsets.cpu()),
        "s_enc": torch.equal(got.s_enc.cpu().view(torch.int32), ref.s_enc.cpu().view(torch.int32)),
    }
    ok = all(checks.values())
    log(f"[{'PASS' if ok else 'FAIL'}] rows_grouped {name}: " + ", ".join(f"{k} {'=' if v else 'DIFFER'}"
                                                                         for k, v in checks.items()))
    assert ok, checks


@pytest.mark.parametrize("name,x,offs,kw", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_torch_bitwise(name, x, offs, kw):
    dev = torch.device("cuda")
    ref = quantize_rows_grouped_torch(x, offs, **kw)  # on the CPU: device-independent reference
    got = quantize_rows_grouped(x.to(dev), offs.to(dev), backend="native", **_to(kw, dev))
    _compare(name, ref, got)
    ref_gpu = quantize_rows_grouped_torch(x.to(dev), offs.to(dev), **_to(kw, dev))  # torch on the GPU too
    _compare(name + " (torch on GPU)", ref, ref_gpu)


def test_b1_shape_bitwise():
    x, offs, gi = T.rows_grouped_b1_case()
    dev = torch.device("cuda")
    x, offs, gi = x.to(dev), offs.to(dev), gi.to(dev)
    m_alloc = gi.shape[0] + 31
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = quantize_rows_grouped(x, offs, gather_idx=gi, m_alloc=m_alloc, backend="native")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    ref = quantize_rows_grouped_torch(x, offs, gather_idx=gi, m_alloc=m_alloc)
    log(f"[INFO] b1 rows_grouped: kernel {1e3 * (t1 - t0):.2f} ms (first call), reference "
        f"{time.perf_counter() - t1:.2f} s")
    _compare("b1 (M 32768, E 1024, K 2048, bf16, gather)", ref, got)
    # warm timing: median of 10
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        quantize_rows_grouped(x, offs, gather_idx=gi, m_alloc=m_alloc, backend="native")
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    log(f"[INFO] b1 rows_grouped warm median {sorted(ts)[5]:.3f} ms")


def test_graph_capture_side_stream_and_unaligned():
    name, x, offs, kw = next(c for c in CASES if c[0] == "gather")
    dev = torch.device("cuda")
    xd, od, kd = x.to(dev), offs.to(dev), _to(kw, dev)
    ref = quantize_rows_grouped_torch(x, offs, **kw)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = quantize_rows_grouped(xd, od, backend="native", **kd)
    torch.cuda.current_stream().wait_stream(s)
    _compare("side stream", ref, got)
    g = torch.cuda.CUDAGraph()
    quantize_rows_grouped(xd, od, backend="native", **kd)  # warm-up outside the capture
    torch.cuda.synchronize()
    with gc_paused(), torch.cuda.graph(g):
        cap = quantize_rows_grouped(xd, od, backend="native", **kd)
    g.replay()
    torch.cuda.synchronize()
    _compare("CUDA graph replay", ref, cap)
    # unaligned x: a view starting one element in (scalar loads)
    big = torch.empty(x.numel() + 1, dtype=x.dtype, device=dev)
    xu = big[1:].view(x.shape)
    xu.copy_(xd)
    _compare("unaligned x", ref, quantize_rows_grouped(xu, od, backend="native", **kd))


def test_native_errors_name_arguments():
    dev = torch.device("cuda")
    x = torch.randn(8, 32, device=dev)
    offs = torch.tensor([3, 8], dtype=torch.int32, device=dev)
    with pytest.raises(TypeError, match="offs"):
        _ops.nvfp4_quantize_rows_grouped(x, offs.long())
    with pytest.raises(ValueError, match="m_alloc"):
        _ops.nvfp4_quantize_rows_grouped(x, offs, m_alloc=3)
    with pytest.raises(ValueError, match="col_scale"):
        _ops.nvfp4_quantize_rows_grouped(x, offs, col_scale=torch.ones(2, 16, device=dev))
