"""FP8 factors against the format definition, written down INDEPENDENTLY here and in tests/_format_values.py.

E4M3 (OCP, "fn"): 1 sign, 4 exponent (bias 7), 3 mantissa; S.1111.111 is NaN; no inf; max 448.
The format (docs/decisions/0021-fp8-format.md): per column n of each expert (K elements), scale =
fp32(amax / 448) over the finite elements (1 if that is 0); code = the E4M3 value nearest to x / scale,
ties to the even mantissa, |x / scale| above 448 saturating to 448, signed zeros kept; nan and +-inf get
the NaN code 0x7F. Decode: e4m3(code) * scale in fp32. Storage: codes [E, N, K] (K contiguous), scales [E, N].
Nothing here uses the quantizer's own rounding code.
"""

import math

import pytest
import torch

from _format_values import e4m3_value
from tsct.quant import FP8Tensor, quantize_fp8
from tsct.quant.formats import e4m3_decode, e4m3_encode


MAGS = torch.tensor([e4m3_value(b) for b in range(0x7F)], dtype=torch.float64)  # 0 .. 448, increasing


def oracle_codes(y: torch.Tensor) -> torch.Tensor:
    """Nearest E4M3 magnitude by search over the table (ties to the even byte), saturating, sign of y."""
    a = y.double().abs().clamp_max(448.0).reshape(-1, 1)
    dist = (a - MAGS.reshape(1, -1)).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = dist == best
    # among tied candidates take the even byte (mantissa LSB 0); there are at most two, adjacent
    idx = torch.where(cand & (torch.arange(0x7F) % 2 == 0), torch.arange(0x7F), 1000).min(dim=1).values
    idx = torch.where(cand.sum(1) == 1, cand.to(torch.int64).argmax(1), idx)
    code = idx.to(torch.uint8).reshape(y.shape) | (torch.signbit(y).to(torch.uint8) << 7)
    return code.masked_fill(~torch.isfinite(y), 0x7F)


def oracle_scale(x: torch.Tensor) -> torch.Tensor:
    """x logical [E, K, N] -> [E, N]: fp32(amax / 448) (the float64 quotient rounded once is the fp32 quotient)."""
    amax = torch.where(torch.isfinite(x), x.double().abs(), 0).amax(dim=1)
    s = (amax / 448.0).float()
    return torch.where(s == 0, torch.ones_like(s), s)


def test_every_code_decodes():
    got = e4m3_decode(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    for b in range(256):
        want = e4m3_value(b)
        if math.isnan(want):
            assert b in (0x7F, 0xFF) and math.isnan(got[b].item())
        else:
            assert got[b].item() == want and math.copysign(1, got[b].item()) == math.copysign(1, want), hex(b)


def test_every_finite_value_round_trips_exactly():
    """Each column holds every finite E4M3 value (both signs) with amax 448 * 2^j: scale 2^j exactly, the codes
    are the values' own bytes and the decode gives the values back."""
    finite = [b for b in range(256) if not math.isnan(e4m3_value(b))]
    vals = torch.tensor([e4m3_value(b) for b in finite], dtype=torch.float32)
    for j, dtype in ((0, torch.float32), (-20, torch.float32), (5, torch.bfloat16)):
        w = (vals * 2.0 ** j).reshape(1, -1, 1).repeat(2, 1, 3).to(dtype)
        q = quantize_fp8(w, backend="torch")
        assert torch.equal(q.scale_n, torch.full((2, 3), 2.0 ** j))
        want = torch.tensor(finite, dtype=torch.uint8).reshape(1, 1, -1).expand(2, 3, -1)
        assert torch.equal(q.codes.view(torch.uint8), want)
        assert torch.equal(q.dequantize(torch.float32, backend="torch"), w.float())
        assert torch.equal(torch.signbit(q.dequantize(torch.float32, backend="torch")), torch.signbit(w.float()))


def test_ties_go_to_the_even_mantissa_and_overflow_saturates():
    """Midpoints between neighbouring E4M3 values (normal and subnormal) in columns of amax 448 (scale 1)."""
    mids = (MAGS[:-1] + MAGS[1:]) / 2
    y = torch.cat([mids, -mids]).float()
    w = torch.cat([torch.tensor([448.0]), y]).reshape(-1, 1)
    codes = quantize_fp8(w, backend="torch").codes.view(torch.uint8)[0, 0, 1:]
    low = torch.arange(0x7E, dtype=torch.int64)  # midpoint i lies between bytes i and i+1
    even = torch.where(low % 2 == 0, low, low + 1).to(torch.uint8)
    assert torch.equal(codes, torch.cat([even, even | 0x80]))
    assert torch.equal(codes, oracle_codes(y))
    # the encoder saturates what the division can overshoot, and marks non-finite values
    big = torch.tensor([448.0, 449.0, 464.0, 480.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan")])
    assert e4m3_encode(big).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x7F]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_columns_match_the_oracle(dtype):
    g = torch.Generator().manual_seed(80)
    # columns spanning many binades, so codes land in the subnormals and at zero too
    w = torch.randn(3, 48, 7, generator=g) * torch.exp2(torch.randint(-12, 4, (3, 48, 7), generator=g).float())
    w = w.to(dtype)
    q = quantize_fp8(w, backend="torch")
    assert q.codes.shape == (3, 7, 48) and q.codes.dtype == torch.float8_e4m3fn
    assert torch.equal(q.scale_n, oracle_scale(w))
    y = (w.double() / oracle_scale(w).double().unsqueeze(1)).float()  # x / scale, correctly rounded to fp32
    assert torch.equal(q.codes.view(torch.uint8), oracle_codes(y).transpose(1, 2))
    sub = (q.codes.view(torch.uint8) & 0x7F) < 8
    assert sub.any() and (~sub).any()  # both ranges exercised
    want = torch.tensor([e4m3_value(b) for b in range(256)])[q.codes.view(torch.uint8).long()]
    got = q.dequantize(torch.float32, backend="torch").transpose(1, 2)
    assert torch.equal(got, (want.float() * q.scale_n.unsqueeze(2)))
    assert torch.equal(q.dequantize(dtype, backend="torch"), got.transpose(1, 2).to(dtype))


def test_zero_columns_and_signed_zeros():
    g = torch.Generator().manual_seed(81)
    w = torch.randn(2, 16, 4, generator=g)
    w[0, :, 1] = 0.0
    w[0, ::2, 1] = -0.0
    w[1] = -0.0
    q = quantize_fp8(w, backend="torch")
    assert q.scale_n[0, 1] == 1.0 and (q.scale_n[1] == 1.0).all()
    codes = q.codes.view(torch.uint8)
    assert codes[0, 1].tolist() == [0x80 if k % 2 == 0 else 0x00 for k in range(16)]
    assert (codes[1] == 0x80).all()
    d = q.dequantize(torch.float32, backend="torch")
    assert (d[0, :, 1] == 0).all() and torch.equal(torch.signbit(d[0, :, 1]), torch.signbit(w[0, :, 1]))
    assert torch.signbit(d[1]).all()
    assert torch.isfinite(d).all()
    # an amax whose quotient by 448 underflows to 0 also gets scale 1 (the values round to signed zeros)
    tiny = torch.tensor([[2.0 ** -149], [-(2.0 ** -149)]])
    qt = quantize_fp8(tiny, backend="torch")
    assert qt.scale_n.item() == 1.0 and qt.codes.view(torch.uint8).flatten().tolist() == [0x00, 0x80]


def test_nonfinite_inputs_poison_themselves_only():
    g = torch.Generator().manual_seed(82)
    w = torch.randn(2, 32, 5, generator=g)
    w[0, 3, 1] = float("nan")
    w[0, 9, 1] = float("inf")
    w[1, 0, 4] = float("-inf")
    w[1, :, 2] = float("nan")  # a column with no finite value: scale 1, every code NaN
    q = quantize_fp8(w, backend="torch")
    clean = w.clone()
    bad = ~torch.isfinite(w)
    clean[bad] = 0.0
    assert torch.equal(q.scale_n, oracle_scale(clean))
    assert q.scale_n[1, 2] == 1.0
    codes = q.codes.view(torch.uint8).transpose(1, 2)
    assert (codes[bad] == 0x7F).all() and not (codes[~bad] & 0x7F == 0x7F).any()
    d = q.dequantize(torch.float32, backend="torch")
    assert torch.equal(torch.isnan(d), bad)
    ref = quantize_fp8(clean, backend="torch").dequantize(torch.float32, backend="torch")
    assert torch.equal(d[~bad], ref[~bad])


def test_error_on_gaussian_factors():
    """3 mantissa bits: relative error within 2^-4 per element (normal range), ~2.6e-2 rel-Frobenius overall."""
    g = torch.Generator().manual_seed(83)
    w = torch.randn(4, 256, 32, generator=g) * 0.02
    d = quantize_fp8(w, backend="torch").dequantize(torch.float32, backend="torch")
    rel = ((d - w).norm() / w.norm()).item()
    assert 1e-2 < rel < 4e-2
    normal = w.abs() >= (w.abs().amax(dim=1, keepdim=True) / 448.0) * 2.0 ** -6
    assert ((d - w).abs()[normal] <= w.abs()[normal] * 2.0 ** -4 * (1 + 1e-6)).all()


def test_shapes_container_and_validation():
    g = torch.Generator().manual_seed(84)
    w2 = torch.randn(37, 5, generator=g)  # any K
    q = quantize_fp8(w2, backend="torch")
    assert q.shape == (37, 5) and q.codes.shape == (1, 5, 37) and q.scale_n.shape == (1, 5)
    assert q.dequantize(backend="torch").shape == (37, 5) and q.dequantize(backend="torch").dtype == torch.bfloat16
    assert q.nbytes == 5 * 37 + 5 * 4
    assert "FP8Tensor" in repr(q) and "[37, 5]" in repr(q)
    assert q.to("cpu").device == torch.device("cpu")
    with pytest.raises(TypeError, match="w.dtype"):
        quantize_fp8(w2.double())
    with pytest.raises(ValueError, match="w must be"):
        quantize_fp8(w2.flatten())
    with pytest.raises(RuntimeError, match="native"):
        quantize_fp8(w2, backend="native")
    with pytest.raises(TypeError, match="codes must have dtype"):
        FP8Tensor(q.codes.view(torch.uint8), q.scale_n, q.shape)
    with pytest.raises(ValueError, match="scale_n must have shape"):
        FP8Tensor(q.codes, q.scale_n[:, :3], q.shape)
    empty = quantize_fp8(torch.zeros(2, 0, 3), backend="torch")
    assert empty.codes.shape == (2, 3, 0) and (empty.scale_n == 1).all()
    assert empty.dequantize(torch.float32).shape == (2, 0, 3)
