"""Ternary factors against the format definition, which this file writes down INDEPENDENTLY.

BitNet b1.58 (arXiv:2402.17764): q = RoundClip(W / gamma, -1, 1) = max(-1, min(1, round(W / gamma))),
decoded q * gamma. Here (docs/decisions/0022-ternary-format.md): gamma per output column per expert =
mean |W| over the column's finite elements ("absmean"), or gamma[k, n] = a[k] * b[n] from the sign format's
rank-1 fit ("rank1"). round() is half to even, so |y| = 1/2 gives 0 and 3/2 gives +-2 -> +-1. gamma = 0
gives 0. 2-bit codes 00 = 0, 01 = +1, 11 = -1, 10 = NaN (a nan / inf input); element 4i+j of a row is in bits
2j..2j+1 of byte i. Codes are stored [E, N, K/4] (K contiguous).
"""

import pytest
import torch

from tsct.quant import TernaryTensor, quantize_ternary
from tsct.quant.formats import pack_2bit, ternary_decode, unpack_2bit
from tsct.quant.sign import rank1_magnitude_fit

CODE = {0.0: 0b00, 1.0: 0b01, -1.0: 0b11}


def oracle_q(w: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """q in {-1, 0, 1} (NaN for non-finite w) per element of logical w [E, K, N], gamma broadcast to it (float64
    division of fp32 operands rounded to fp32 = the fp32 quotient)."""
    y = (w.double() / gamma.double()).float()
    q = torch.round(y).clamp(-1, 1)  # torch.round: half to even
    q = torch.where(gamma == 0, torch.zeros_like(q), q)
    return torch.where(torch.isfinite(w), q, torch.full_like(q, float("nan")))


def oracle_bytes(q: torch.Tensor) -> list:
    """q logical [E, K, N] -> bytes [E][N][K/4], element 4i+j in bits 2j..2j+1."""
    e_, k_, n_ = q.shape
    def code(v):
        return 0b10 if v != v else CODE[v]
    return [[[sum(code(float(q[e, 4 * i + j, n])) << (2 * j) for j in range(4)) for i in range(k_ // 4)]
             for n in range(n_)] for e in range(e_)]


def oracle_absmean(w: torch.Tensor) -> torch.Tensor:
    fin = torch.isfinite(w)
    return (torch.where(fin, w.double().abs(), 0).sum(1) / fin.sum(1).clamp_min(1)).float()  # [E, N]


def test_packing_layout_by_hand():
    w = torch.tensor([1.0, 0.0, -1.0, float("nan"), 0.0, 0.0, 0.0, 1.0]).reshape(8, 1)
    w[1] = 0.1  # |y| small: 0
    q = quantize_ternary(w, backend="torch")
    # column absmean over the 7 finite values: (1 + 0.1 + 1 + 1) / 7
    assert q.codes.tolist() == [[[0b10_11_00_01, 0b01_00_00_00]]]
    assert unpack_2bit(q.codes).tolist() == [[[1, 0, 3, 2, 0, 0, 0, 1]]]
    assert pack_2bit(torch.tensor([[1, 0, 3, 2, 0, 0, 0, 1]], dtype=torch.uint8)).tolist() == [[0xB1, 0x40]]


def test_every_code_decodes():
    got = ternary_decode(torch.arange(4, dtype=torch.uint8))
    assert got[0].item() == 0.0 and got[1].item() == 1.0 and got[3].item() == -1.0 and got[2].isnan()
    assert torch.equal(ternary_decode(torch.tensor([0xFC, 0xFD, 0xFF], dtype=torch.uint8)), torch.tensor([0., 1., -1.]))
    codes = torch.tensor([[[0b11_10_01_00]]], dtype=torch.uint8)  # k = 0, 1, 2, 3 -> 0, +1, NaN, -1
    t = TernaryTensor(codes, None, torch.tensor([[0.25]]), (4, 1))
    d = t.dequantize(torch.float32, backend="torch").flatten()
    assert d[0] == 0 and d[1] == 0.25 and d[2].isnan() and d[3] == -0.25
    r = TernaryTensor(codes, torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[0.5]]), (4, 1))
    d = r.dequantize(torch.float32, backend="torch").flatten()
    assert d[0] == 0 and d[1] == 1.0 and d[2].isnan() and d[3] == -2.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_absmean_codes_and_decode_match_the_oracle(dtype):
    g = torch.Generator().manual_seed(90)
    w = (torch.randn(3, 64, 9, generator=g) * torch.exp(torch.randn(3, 1, 9, generator=g))).to(dtype)
    q = quantize_ternary(w, backend="torch")
    assert q.scaling == "absmean" and q.scale_k is None and q.codes.shape == (3, 9, 16)
    assert torch.equal(q.scale_n, oracle_absmean(w))
    qq = oracle_q(w.float(), q.scale_n.unsqueeze(1))
    assert q.codes.tolist() == oracle_bytes(qq)
    assert torch.equal(q.dequantize(torch.float32, backend="torch"), qq * q.scale_n.unsqueeze(1))
    assert torch.equal(q.dequantize(dtype, backend="torch"), (qq * q.scale_n.unsqueeze(1)).to(dtype))
    frac0 = (qq == 0).float().mean().item()
    assert 0.2 < frac0 < 0.5  # Gaussian columns: P(|x| <= mean|x| / 2) = 0.31


def test_ties_round_half_to_even():
    """Columns with absmean c exactly (a power of two): |y| = 1/2 -> 0, just above -> +-1, 3/2 -> +-1."""
    c = 0.125
    col = torch.tensor([0.5, 1.5, 1.0, 1.0]) * c  # mean c
    w = torch.stack([col, -col, col * torch.tensor([1.0, 1.0, 1.0, 1.0])], dim=1)  # [4, 3]
    q = quantize_ternary(w, backend="torch")
    assert torch.equal(q.scale_n, torch.full((1, 3), c))
    assert unpack_2bit(q.codes)[0].tolist() == [[0, 1, 1, 1], [0, 3, 3, 3], [0, 1, 1, 1]]
    above = torch.tensor([0.5 + 2 ** -20, 1.5 - 2 ** -20, 1.0, 1.0]).reshape(4, 1)  # mean 1 exactly
    assert unpack_2bit(quantize_ternary(above, backend="torch").codes).flatten().tolist() == [1, 1, 1, 1]


def test_representable_columns_round_trip_exactly():
    """Columns of +-c (any fp32 c): absmean c, y = +-1, decode +-c bit for bit."""
    g = torch.Generator().manual_seed(91)
    c = torch.rand(2, 1, 6, generator=g) * 10 + 1e-3
    s = torch.where(torch.rand(2, 32, 6, generator=g) < 0.5, -1.0, 1.0)
    w = s * c
    q = quantize_ternary(w, backend="torch")
    assert torch.equal(q.scale_n, c.squeeze(1))
    assert torch.equal(q.dequantize(torch.float32, backend="torch"), w)


def test_zero_columns_signed_zeros_and_nonfinite():
    g = torch.Generator().manual_seed(92)
    w = torch.randn(2, 16, 5, generator=g)
    w[0, :, 2] = 0.0
    w[0, 1::2, 2] = -0.0
    w[1, 3, 0] = float("nan")
    w[1, 4, 0] = float("-inf")
    w[1, 5, 1] = float("inf")
    w[1, :, 4] = float("nan")
    q = quantize_ternary(w, backend="torch")
    assert q.scale_n[0, 2] == 0 and (unpack_2bit(q.codes[0, 2]) == 0).all()
    assert q.scale_n[1, 4] == 0  # no finite value
    bad = ~torch.isfinite(w)
    assert torch.equal(q.scale_n, oracle_absmean(w))
    codes = unpack_2bit(q.codes).transpose(1, 2)
    assert (codes[bad] == 0b10).all() and not (codes[~bad] == 0b10).any()
    d = q.dequantize(torch.float32, backend="torch")
    assert torch.equal(torch.isnan(d), bad)
    assert (d[0, :, 2] == 0).all() and not torch.signbit(d[0, :, 2]).any()  # -0.0 codes 0, decodes +0.0
    assert q.codes.tolist() == oracle_bytes(oracle_q(w, q.scale_n.unsqueeze(1)))


def test_rank1_scaling_matches_its_definition():
    g = torch.Generator().manual_seed(93)
    w = torch.randn(3, 32, 12, generator=g) * (torch.rand(3, 32, 1, generator=g) + 0.1)
    w[2, 5, 3] = float("nan")
    q = quantize_ternary(w, scaling="rank1", backend="torch")
    assert q.scaling == "rank1" and q.scale_k.shape == (3, 32) and q.scale_n.shape == (3, 12)
    a, b = rank1_magnitude_fit(w.transpose(1, 2), poison=False)
    assert torch.equal(q.scale_k, a) and torch.equal(q.scale_n, b)
    assert torch.isfinite(q.scale_k).all()  # the NaN marks its element, not its row
    gamma = q.scale_k.unsqueeze(2) * q.scale_n.unsqueeze(1)
    qq = oracle_q(w, gamma)
    assert q.codes.tolist() == oracle_bytes(qq)
    want = (qq * q.scale_k.unsqueeze(2)) * q.scale_n.unsqueeze(1)
    assert torch.equal(q.dequantize(torch.float32, backend="torch").nan_to_num(7.0), want.nan_to_num(7.0))
    assert q.nbytes == 3 * 12 * 8 + 3 * 12 * 4 + 3 * 32 * 4


def test_rank1_cuts_the_error_on_outlier_rows():
    """Factors whose K rows differ in magnitude: the rank-1 scaling beats the column absmean (decision 0022)."""
    g = torch.Generator().manual_seed(94)
    w = torch.randn(4, 256, 16, generator=g)
    w[:, :4] *= 30.0
    err = {}
    for s in ("absmean", "rank1"):
        d = quantize_ternary(w, scaling=s, backend="torch").dequantize(torch.float32, backend="torch")
        err[s] = ((d - w).norm() / w.norm()).item()
    assert err["rank1"] < 0.7 * err["absmean"], err
    gauss = torch.randn(4, 256, 16, generator=g)
    e = [((quantize_ternary(gauss, scaling=s).dequantize(torch.float32) - gauss).norm() / gauss.norm()).item()
         for s in ("absmean", "rank1")]
    assert abs(e[0] - e[1]) < 0.05 and 0.45 < e[0] < 0.56  # no gain on Gaussian factors; BitNet's ~0.51


def test_shapes_container_and_validation():
    g = torch.Generator().manual_seed(95)
    w2 = torch.randn(12, 7, generator=g)
    q = quantize_ternary(w2, backend="torch")
    assert q.shape == (12, 7) and q.codes.shape == (1, 7, 3) and q.dequantize(backend="torch").shape == (12, 7)
    assert q.nbytes == 7 * 3 + 7 * 4
    assert "TernaryTensor" in repr(q) and "absmean" in repr(q)
    assert q.to("cpu").scale_k is None
    with pytest.raises(ValueError, match="K = w.shape.-2. = 10 must be a multiple of 4"):
        quantize_ternary(torch.randn(10, 4, generator=g))
    with pytest.raises(ValueError, match="scaling must be one of"):
        quantize_ternary(w2, scaling="absmax")
    with pytest.raises(ValueError, match="iters"):
        quantize_ternary(w2, scaling="rank1", iters=0)
    with pytest.raises(TypeError, match="w.dtype"):
        quantize_ternary(w2.to(torch.int32))
    with pytest.raises(RuntimeError, match="native"):
        quantize_ternary(w2, backend="native")
    with pytest.raises(ValueError, match="scale_k must have shape"):
        TernaryTensor(q.codes, torch.ones(1, 5), q.scale_n, q.shape)
    with pytest.raises(TypeError, match="codes must have dtype"):
        TernaryTensor(q.codes.to(torch.int8), None, q.scale_n, q.shape)
    # bf16 input: the same codes and scales as its fp32 copy
    wb = w2.to(torch.bfloat16)
    qb, qf = quantize_ternary(wb, backend="torch"), quantize_ternary(wb.float(), backend="torch")
    assert torch.equal(qb.codes, qf.codes) and torch.equal(qb.scale_n, qf.scale_n)
