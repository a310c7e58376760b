"""Grouped activation quantizer (the sm_120 fp4 path) on the CPU.

* The CUDA kernel's per-item code (csrc/quant/rows_grouped_impl.cuh), compiled for the host
  (csrc/tools/host_rows_grouped.cpp), against the torch reference, bit for bit: codes, every byte of
  the scale buffer (swizzle padding included), sfa_offsets and the per-expert s_enc.
* The torch reference against the emulation's quantizer (tsct.emulation.quantize_rows_grouped) and
  the plan's scale offsets (tsct.emulation.plan.sfa_layout), and its scales decoded through the
  swizzle formula of design.md section 3.
The GPU test (tests/kernels/test_sm120_quant_rows_gpu.py) runs the same cases through the CUDA kernel.
"""

from pathlib import Path

import pytest
import torch

from tsct.emulation import plan, quantize_rows_grouped as emu_quantize
from tsct.kernels.sm120_fp4.quant_rows import quantize_rows_grouped, quantize_rows_grouped_torch
import _native_cases as T
from tsct.quant import quantize_nvfp4
from tsct.quant.layout import swizzle_offsets

REPO = Path(__file__).resolve().parents[2]
CASES = T.rows_grouped_cases()


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if not (REPO / "csrc" / "tools" / "host_rows_grouped.cpp").is_file():
        pytest.skip("needs the source tree")
    try:
        return T.build_host_rows_grouped(str(REPO), str(tmp_path_factory.mktemp("rows_grouped")))
    except RuntimeError as e:
        pytest.skip(f"cannot build the host harness: {e}")


def _same(ref, got):
    codes, sfa, sfo, s_enc = got
    assert torch.equal(codes, ref.codes), "codes differ"
    assert torch.equal(sfa.view(torch.uint8), ref.sfa.view(torch.uint8)), "scale bytes differ"
    assert torch.equal(sfo, ref.sfa_offsets), (sfo, ref.sfa_offsets)
    assert torch.equal(s_enc.view(torch.int32), ref.s_enc.view(torch.int32)), (s_enc, ref.s_enc)


@pytest.mark.parametrize("name,x,offs,kw", CASES, ids=[c[0] for c in CASES])
def test_host_harness_matches_torch_bitwise(host_lib, name, x, offs, kw):
    ref = quantize_rows_grouped_torch(x, offs, **kw)
    _same(ref, T.rows_grouped_host(host_lib, x, offs, **kw))


def test_host_harness_poisons_out_of_range_gather(host_lib):
    x = torch.randn(4, 32)
    offs = torch.tensor([3], dtype=torch.int32)
    gi = torch.tensor([0, 99, 1])
    codes, sfa, sfo, s_enc = T.rows_grouped_host(host_lib, x, offs, gather_idx=gi)
    lin = sfa[swizzle_offsets(3, 2).flatten()].reshape(3, 2)
    assert lin[1].eq(0x7F).all() and codes[1].eq(0).all()  # NaN block scale, zero codes
    assert lin[0].ne(0x7F).all() and lin[2].ne(0x7F).all()


@pytest.mark.parametrize("name,x,offs,kw", CASES, ids=[c[0] for c in CASES])
def test_reference_layout_and_plan(name, x, offs, kw):
    q = quantize_rows_grouped_torch(x, offs, **kw)
    k = x.shape[1]
    sfo, padded = plan.sfa_layout(offs, k)
    assert torch.equal(q.sfa_offsets, sfo)
    m = q.m
    assert q.sfa.numel() == plan.sfa_bytes_bound(m, offs.shape[0], k)
    assert q.codes.shape == (kw.get("m_alloc", m), k // 2)
    # decode each expert through the design.md swizzle formula and compare with quantize_nvfp4 on its rows
    bounds = [0] + offs.tolist()
    rows_all = x[kw["gather_idx"].long()[:bounds[-1]]] if "gather_idx" in kw else x
    for e in range(offs.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            assert float(q.s_enc[e]) == 1.0
            continue
        rows = rows_all[lo:hi]
        if "col_scale" in kw:
            rows = rows.float() * kw["col_scale"][e]
        want = quantize_nvfp4(rows.t(), layout="linear", backend="torch")
        off = swizzle_offsets(hi - lo, k // 16) + int(sfo[e])
        assert torch.equal(q.sfa.view(torch.uint8)[off], want.block_scale[0].view(torch.uint8))
        assert torch.equal(q.codes[lo:hi], want.codes[0])
        assert torch.equal(q.s_enc[e:e + 1], want.global_scale)
    assert q.codes[bounds[-1]:].eq(0).all()  # padding rows
    used = torch.zeros(q.sfa.numel(), dtype=torch.bool)
    for e in range(offs.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            used[(swizzle_offsets(hi - lo, k // 16) + int(sfo[e])).flatten()] = True
    assert q.sfa.view(torch.uint8)[~used].eq(0).all()  # swizzle padding and the tail are 0


def test_reference_equals_emulation_quantizer():
    for name, x, offs, kw in CASES:
        if kw.get("gather_idx") is not None or kw.get("col_scale") is not None or offs.numel() == 0:
            continue
        m = x.shape[0]
        emu = emu_quantize(x.float() if x.dtype != torch.float32 else x, offs, 32)
        ref = quantize_rows_grouped_torch(x.float(), offs, m_alloc=plan.a_rows_alloc(m, 32))
        assert torch.equal(ref.codes, emu.codes), name
        n = ref.sfa.numel()
        assert torch.equal(ref.sfa.view(torch.uint8), emu.sfa.view(torch.uint8)[:n]), name
        assert torch.equal(ref.s_enc, emu.s_enc) and torch.equal(ref.sfa_offsets, emu.sfa_offsets), name


def test_auto_backend_on_cpu_is_torch_and_errors_name_arguments():
    x = torch.randn(8, 32)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    q = quantize_rows_grouped(x, offs)
    assert q.codes.shape == (8, 16)
    with pytest.raises(TypeError, match="offs"):
        quantize_rows_grouped(x, offs.long())
    with pytest.raises(ValueError, match="K=30"):
        quantize_rows_grouped(torch.randn(8, 30), offs)
    with pytest.raises(ValueError, match="col_scale"):
        quantize_rows_grouped(x, offs, col_scale=torch.ones(3, 32))
    with pytest.raises(ValueError, match="backend"):
        quantize_rows_grouped(x, offs, backend="cuda")
