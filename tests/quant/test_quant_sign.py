"""Sign (1-bit) factors: bit order, decode arithmetic, the rank-1 magnitude fit, zero and non-finite input."""

import math

import pytest
import torch

from tsct.quant import SignTensor, quantize_sign
from tsct.quant.sign import rank1_magnitude_fit


def independent_bits(w: torch.Tensor) -> list:
    """Logical [E, K, N] -> bytes [E][N][K/8]: element 8i+j of row n is bit j of byte i, 1 = negative."""
    e_, k_, n_ = w.shape
    return [[[sum((1 << j) for j in range(8) if math.copysign(1.0, float(w[e, 8 * i + j, n])) < 0)
              for i in range(k_ // 8)] for n in range(n_)] for e in range(e_)]


def test_bit_pack_order_and_signed_zero():
    g = torch.Generator().manual_seed(60)
    w = torch.randn(2, 24, 3, generator=g)
    w[0, 0, 0] = -0.0
    w[0, 1, 0] = 0.0
    w[1, 9, 2] = float("-inf")
    s = quantize_sign(w, backend="torch")
    assert s.bits.shape == (2, 3, 3) and s.bits.dtype == torch.uint8
    assert s.bits.tolist() == independent_bits(w)
    assert s.bits[0, 0, 0].item() & 1 == 1  # -0.0 -> 1
    assert s.bits[0, 0, 0].item() >> 1 & 1 == 0  # +0.0 -> 0
    one = torch.zeros(1, 8, 1)
    one[0, 5, 0] = -1.0
    assert quantize_sign(one + 0.5, backend="torch").bits.item() == 1 << 5  # -0.5 at k=5


def test_decode_is_sign_times_a_times_b():
    g = torch.Generator().manual_seed(61)
    w = torch.randn(3, 32, 5, generator=g)
    s = quantize_sign(w, backend="torch")
    sign = torch.where(torch.signbit(w), -1.0, 1.0)
    want = (sign * s.scale_k.unsqueeze(2)) * s.scale_n.unsqueeze(1)  # logical [E, K, N], fp32
    got = s.dequantize(torch.float32, backend="torch")
    assert got.shape == w.shape and got.is_contiguous()
    assert torch.equal(got, want)
    assert torch.equal(s.dequantize(backend="torch"), want.to(torch.bfloat16))
    assert torch.equal(s.dequantize(torch.float16, backend="torch"), want.to(torch.float16))


def _fit_error(w, a, b):
    return ((w.abs() - a.unsqueeze(-1) * b.unsqueeze(-2)).norm()).item()


def test_fit_positive_and_better_than_mean():
    g = torch.Generator().manual_seed(62)
    # rows and columns with different magnitudes: a rank-1 magnitude structure plus noise
    w = torch.randn(4, 64, 16, generator=g) * torch.rand(4, 64, 1, generator=g) * torch.rand(4, 1, 16, generator=g)
    s = quantize_sign(w, backend="torch")
    assert (s.scale_k > 0).all() and (s.scale_n > 0).all()
    d = s.dequantize(torch.float32, backend="torch")
    for e in range(4):
        err_fit = (w[e] - d[e]).norm()
        m = w[e].abs().mean()
        err_mean = (w[e] - torch.sign(w[e]) * m).norm()  # a = b = sqrt(mean|W|)
        assert err_fit < 0.9 * err_mean
        # the fit is the best rank-1 approximation of |W| (SVD in float64)
        u, sv, vh = torch.linalg.svd(w[e].abs().double())
        best = (w[e].abs().double() - sv[0] * torch.outer(u[:, 0], vh[0])).norm().item()
        assert _fit_error(w[e].double(), s.scale_k[e].double(), s.scale_n[e].double()) <= best * (1 + 1e-4)
        # the split is balanced
        assert torch.allclose(s.scale_k[e].norm(), s.scale_n[e].norm(), rtol=1e-5)


def test_fit_is_deterministic_and_chunk_independent():
    g = torch.Generator().manual_seed(63)
    w = torch.randn(5, 16, 8, generator=g)
    s1, s2 = quantize_sign(w, backend="torch"), quantize_sign(w, backend="torch")
    assert torch.equal(s1.scale_k, s2.scale_k) and torch.equal(s1.scale_n, s2.scale_n)
    # each expert's fit depends only on its own matrix
    s3 = quantize_sign(w[2:3], backend="torch")
    assert torch.equal(s3.scale_k[0], s1.scale_k[2]) and torch.equal(s3.scale_n[0], s1.scale_n[2])


def test_all_zero_matrix_and_zero_rows():
    g = torch.Generator().manual_seed(64)
    w = torch.randn(2, 16, 4, generator=g)
    w[0] = 0.0
    w[1, 3, :] = 0.0  # a zero row of the logical W (one k)
    w[1, :, 2] = 0.0  # a zero column (one n)
    s = quantize_sign(w, backend="torch")
    assert (s.scale_k[0] == 0).all() and (s.scale_n[0] == 0).all() and (s.bits[0] == 0).all()
    d = s.dequantize(torch.float32, backend="torch")
    assert (d[0] == 0).all() and not torch.signbit(d[0]).any()
    assert s.scale_k[1, 3] == 0 and s.scale_n[1, 2] == 0
    assert (s.scale_k[1, torch.arange(16) != 3] > 0).all()
    assert torch.isfinite(d).all()


def test_nonfinite_poisons_its_row_only():
    g = torch.Generator().manual_seed(65)
    w = torch.randn(2, 16, 6, generator=g)
    w[0, 4, 1] = float("nan")
    w[0, 9, 5] = float("inf")
    q = quantize_sign(w, backend="torch")
    clean = quantize_sign(torch.nan_to_num(w, nan=0.0, posinf=0.0), backend="torch")
    bad = torch.zeros(2, 16, dtype=torch.bool)
    bad[0, 4] = bad[0, 9] = True
    assert torch.isnan(q.scale_k[bad]).all()
    assert torch.equal(q.scale_k[~bad], clean.scale_k[~bad])
    assert torch.equal(q.scale_n, clean.scale_n)
    d = q.dequantize(torch.float32, backend="torch")
    assert torch.isnan(d[0, 4]).all() and torch.isnan(d[0, 9]).all()
    keep = torch.ones(2, 16, dtype=torch.bool)
    keep[0, 4] = keep[0, 9] = False
    assert torch.isfinite(d[keep]).all()
    assert (q.bits[0, 5, 1] >> 1) & 1 == 0  # +inf at k=9 -> bit 1 of byte 1 is 0
    # a matrix with no finite entry: fit 0, every row NaN
    allbad = quantize_sign(torch.full((1, 8, 2), float("nan")), backend="torch")
    assert torch.isnan(allbad.scale_k).all() and (allbad.scale_n == 0).all()


def test_rank1_fit_direct_and_huge_values():
    g = torch.Generator().manual_seed(66)
    a0 = torch.rand(2, 24, generator=g) + 0.1
    b0 = torch.rand(2, 10, generator=g) + 0.1
    x = (b0.unsqueeze(2) * a0.unsqueeze(1)) * torch.where(torch.rand(2, 10, 24, generator=g) < .5, -1.0, 1.0)
    a, b = rank1_magnitude_fit(x)  # storage [B, N, K]
    assert torch.allclose(b.unsqueeze(2) * a.unsqueeze(1), x.abs(), rtol=1e-5)  # exact rank-1 recovered
    big = x * 1e37  # sums of |x| would overflow fp32 without the pre-scaling
    ab, bb = rank1_magnitude_fit(big)
    assert torch.isfinite(ab).all() and torch.isfinite(bb).all()
    assert torch.allclose(bb.unsqueeze(2) * ab.unsqueeze(1), big.abs(), rtol=1e-4)
    # a large matrix of large finite values: sigma (~ sqrt(N K) = 362 here) times amax (1e36) overflows fp32
    flat = quantize_sign(torch.full((1, 2048, 64), 1e36, dtype=torch.bfloat16), backend="torch")
    deq = flat.dequantize(torch.float32)
    assert torch.isfinite(deq).all() and torch.allclose(deq, torch.full_like(deq, 1e36), rtol=2e-2)
    with pytest.raises(ValueError, match="iters"):
        rank1_magnitude_fit(x, 0)


def test_shapes_container_and_validation():
    g = torch.Generator().manual_seed(67)
    w2 = torch.randn(40, 7, generator=g)
    s2 = quantize_sign(w2, backend="torch")
    assert s2.shape == (40, 7) and s2.bits.shape == (1, 7, 5) and s2.scale_k.shape == (1, 40)
    assert s2.dequantize(backend="torch").shape == (40, 7)
    assert s2.nbytes == 7 * 5 + 40 * 4 + 7 * 4
    assert "SignTensor" in repr(s2) and "[40, 7]" in repr(s2)
    assert s2.to("cpu").device == torch.device("cpu")
    with pytest.raises(ValueError, match="K = w.shape.-2. = 12 must be a multiple of 8"):
        quantize_sign(torch.randn(12, 4, generator=g))
    with pytest.raises(TypeError, match="w.dtype"):
        quantize_sign(w2.double())
    with pytest.raises(ValueError, match="w must be"):
        quantize_sign(w2.flatten())
    with pytest.raises(ValueError, match="iters"):
        quantize_sign(w2, iters=0)
    with pytest.raises(TypeError, match="iters"):
        quantize_sign(w2, iters=2.0)
    with pytest.raises(RuntimeError, match="native"):
        quantize_sign(w2, backend="native")
    with pytest.raises(ValueError, match="scale_n"):
        SignTensor(s2.bits, s2.scale_k, s2.scale_n[:, :3], s2.shape)
    # half inputs: same bits, fit of the same values
    wb = w2.to(torch.bfloat16)
    sb, sf = quantize_sign(wb, backend="torch"), quantize_sign(wb.float(), backend="torch")
    assert torch.equal(sb.bits, sf.bits) and torch.equal(sb.scale_k, sf.scale_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rank1_fit_does_not_depend_on_how_the_factor_is_stored(dtype):
    """A factor quantizes to the same bytes whether it is stored [E, K, N] or K-major (a transposed [E, N, K], as
    the README keeps w_down): sign, and ternary with the rank-1 scaling, which shares the fit."""
    from tsct.quant import quantize

    g = torch.Generator().manual_seed(3)
    kmajor = torch.randn(5, 32, 24, generator=g).to(dtype).transpose(1, 2)  # logical [5, 24, 32], K contiguous
    for fmt, kw in (("sign", {}), ("ternary", {"scaling": "rank1"})):
        a, b = quantize(kmajor, fmt, backend="torch", **kw), quantize(kmajor.contiguous(), fmt, backend="torch", **kw)
        for name in ("scale_k", "scale_n"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (fmt, name)
