"""The emulated sm_120 NVFP4 GEMM math (tsct.emulation.nvfp4_mma) against dequantize-then-matmul."""

import pytest
import torch

from tsct.emulation import plan
from tsct.emulation.nvfp4_mma import (block_scaled_mma, decode_codes, dense_gemm_emulated, gather_scales_swizzled,
                                      grouped_gemm_emulated)
from tsct.quant import quantize_nvfp4
from tsct.quant.layout import to_linear


def _q(w, layout="swizzled_128x4"):
    return quantize_nvfp4(w, layout=layout, backend="torch")


def test_decode_low_nibble_is_even_element():
    codes = torch.tensor([[0x71, 0xA2]], dtype=torch.uint8)  # (0.5, 6.0), (1.0, -1.0)
    assert decode_codes(codes).tolist() == [[0.5, 6.0, 1.0, -1.0]]


def test_swizzled_gather_matches_linear():
    torch.manual_seed(0)
    q = _q(torch.randn(256, 200))  # logical [K=256, N=200]: scales [1, 200, 16] -> swizzled
    lin = to_linear(q.block_scale[0], 200, 16).float()
    got = gather_scales_swizzled(q.block_scale[0], 0, torch.arange(200), 256)
    assert torch.equal(got, lin)


@pytest.mark.parametrize("m,n,k", [(32, 32, 64), (48, 40, 192), (7, 130, 2048)])
def test_block_scaled_mma_matches_dequantized_matmul(m, n, k):
    torch.manual_seed(m + n + k)
    qa, qb = _q(torch.randn(k, m) * 3), _q(torch.randn(k, n) / 7)
    sfa = gather_scales_swizzled(qa.block_scale[0], 0, torch.arange(m), k)
    sfb = gather_scales_swizzled(qb.block_scale[0], 0, torch.arange(n), k)
    acc = block_scaled_mma(decode_codes(qa.codes[0]), sfa, decode_codes(qb.codes[0]), sfb)
    # oracle: e2m1 * sf products in float64 (exact), one dot product
    a64 = (decode_codes(qa.codes[0]).double().reshape(m, k // 16, 16) * sfa.double().unsqueeze(-1)).reshape(m, k)
    b64 = (decode_codes(qb.codes[0]).double().reshape(n, k // 16, 16) * sfb.double().unsqueeze(-1)).reshape(n, k)
    ref = a64 @ b64.t()
    scale = (a64.abs() @ b64.abs().t()).clamp_min(1e-30)
    assert ((acc.double() - ref).abs() / scale).max() < 4 * (k // 64) * 2 ** -24
    # and with the global scales folded as alpha it is the dequantized product
    alpha = plan.alpha_from_encode_scales(qa.global_scale, qb.global_scale)
    out = dense_gemm_emulated(qa.codes, qa.block_scale, qb.codes, qb.block_scale, alpha, out_dtype=torch.float32)
    deq = qa.dequantize(torch.float32).t().double() @ qb.dequantize(torch.float32).double()
    torch.testing.assert_close(out[0].double(), deq, rtol=1e-5, atol=1e-5 * deq.abs().max().item())


def test_exact_when_products_are_exact():
    # values on the E2M1 grid (amax 6: codes decode to x exactly): the accumulator is exact and only
    # the fp32 alpha = 1/(448*448) rounds
    a = torch.tensor([[1.0, -0.5, 6.0, 2.0] * 16])
    b = torch.tensor([[3.0, 6.0, -1.5, 0.5] * 16])
    qa, qb = _q(a.t()), _q(b.t())
    alpha = plan.alpha_from_encode_scales(qa.global_scale, qb.global_scale)
    out = dense_gemm_emulated(qa.codes, qa.block_scale, qb.codes, qb.block_scale, alpha, out_dtype=torch.float32)
    da, db = qa.dequantize(torch.float32).t(), qb.dequantize(torch.float32).t()
    assert torch.equal(da, a) and torch.equal(db, b)
    assert out.item() == pytest.approx((a.double() @ b.double().t()).item(), rel=2 ** -23)


def _grouped_case(counts, n, k, tile_m=32, seed=0):
    torch.manual_seed(seed)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    m = int(offs[-1])
    from tsct.emulation.grouped_glu import quantize_rows_grouped, dequantize_rows_grouped
    x = torch.randn(m, k)
    xq = quantize_rows_grouped(x, offs, tile_m)
    w = _q(torch.randn(len(counts), k, n) / 10)
    p = plan.make_plan(offs, m, n, k, tile_m=tile_m)
    return offs, m, xq, w, p, dequantize_rows_grouped(xq, offs)


@pytest.mark.parametrize("counts", [[32, 0, 5, 70, 0], [1], [0, 0, 33]])
def test_grouped_alpha_matches_per_expert_matmul(counts):
    n, k = 40, 128
    offs, m, xq, w, p, xd = _grouped_case(counts, n, k)
    alpha = plan.alpha_from_encode_scales(xq.s_enc, w.global_scale)
    y = grouped_gemm_emulated(xq.codes, xq.sfa, xq.sfa_offsets, w.codes, w.block_scale, offs, p.tile_expert,
                              p.tile_row, p.tile_m, alpha, out_dtype=torch.float32, m_out=m)
    wd = w.dequantize(torch.float32)
    bounds = [0] + offs.tolist()
    for e in range(len(counts)):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            torch.testing.assert_close(y[lo:hi], xd[lo:hi] @ wd[e], rtol=1e-5, atol=1e-5)


def test_grouped_row_weight_and_padding_rows_zero():
    n, k = 24, 64
    offs, m, xq, w, p, xd = _grouped_case([10, 3], n, k)
    m_out = m + 5  # rows past offs[-1] are padding
    rw = torch.rand(m_out)
    alpha = plan.alpha_from_encode_scales(xq.s_enc, w.global_scale)
    y = grouped_gemm_emulated(xq.codes, xq.sfa, xq.sfa_offsets, w.codes, w.block_scale, offs, p.tile_expert,
                              p.tile_row, p.tile_m, alpha, epilogue="row_weight", ep0=rw,
                              out_dtype=torch.float32, m_out=m_out)
    wd = w.dequantize(torch.float32)
    ref = torch.cat([xd[:10] @ wd[0], xd[10:13] @ wd[1]]) * rw[:m].unsqueeze(1)
    torch.testing.assert_close(y[:m], ref, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(y[m:]) == 0
