"""tsct.quant.formats against the format definitions, written down INDEPENDENTLY in tests/_format_values.py.

E2M1 (OCP MX spec): 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit, no inf/nan.
E4M3 (OCP, "fn"): 1 sign, 4 exponent (bias 7), 3 mantissa; S.1111.111 is NaN; no inf; max 448.
Nothing here imports the constants under test.
"""

import math

import pytest
import torch

from _format_values import e2m1_value, e4m3_value
from tsct.quant.formats import (
    e2m1_decode,
    e2m1_encode_rne,
    pack_bits,
    pack_nibbles,
    unpack_bits,
    unpack_nibbles,
)


POS_MAGS = [e2m1_value(c) for c in range(8)]


def test_e2m1_magnitudes_are_the_spec_values():
    assert POS_MAGS == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_all_16_e2m1_codes_decode():
    codes = torch.arange(16, dtype=torch.uint8)
    got = e2m1_decode(codes)
    assert got.dtype == torch.float32
    want = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float32)
    assert torch.equal(got, want)
    assert torch.equal(torch.signbit(got), codes >= 8)  # code 8 is -0.0
    # bits above the nibble are ignored
    assert torch.equal(e2m1_decode(codes | 0xF0), want)


def test_every_e2m1_value_encodes_to_its_code():
    vals = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float32)
    assert e2m1_encode_rne(vals).tolist() == list(range(16))


def test_all_256_ue4m3_bytes_decode_like_float8_e4m3fn():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = b.view(torch.float8_e4m3fn).float()
    for i in range(256):
        want = e4m3_value(i)
        if math.isnan(want):
            assert i in (0x7F, 0xFF)
            assert math.isnan(got[i].item())
        else:
            assert got[i].item() == want, hex(i)
    assert e4m3_value(0x7E) == 448.0 and e4m3_value(0x01) == 2.0 ** -9 and e4m3_value(0x08) == 2.0 ** -6


def test_fp32_to_ue4m3_cast_is_round_to_nearest_even():
    """The recipe's block-scale rounding is torch's cast; check it is RNE, subnormals included."""
    pos = [(e4m3_value(i), i) for i in range(0x7F)]  # 0 .. 448, increasing
    mids, lo_hi = [], []
    for (v0, b0), (v1, b1) in zip(pos, pos[1:]):
        mids.append((v0 + v1) / 2)  # exact in fp32 (few bits)
        lo_hi.append((b0, b1))
    m = torch.tensor(mids, dtype=torch.float32)
    got = m.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    want = [b0 if b0 % 2 == 0 else b1 for b0, b1 in lo_hi]
    assert got == want
    below = torch.nextafter(m, torch.zeros_like(m)).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    above = torch.nextafter(m, torch.full_like(m, 1e9)).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert below == [b0 for b0, _ in lo_hi]
    assert above == [b1 for _, b1 in lo_hi]
    # negative side mirrors, 0 stays 0
    assert torch.equal((-m).to(torch.float8_e4m3fn).view(torch.uint8), torch.tensor(want, dtype=torch.uint8) | 0x80)
    assert torch.tensor([0.0]).to(torch.float8_e4m3fn).view(torch.uint8).item() == 0


# (lower index, midpoint, expected index): every midpoint, ties to the even index
MIDPOINT_CASES = [(i, (POS_MAGS[i] + POS_MAGS[i + 1]) / 2, i if i % 2 == 0 else i + 1) for i in range(7)]


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("lo,mid,idx", MIDPOINT_CASES)
def test_e2m1_rne_ties_go_to_even_index(lo, mid, idx, sign):
    y = torch.tensor([sign * mid], dtype=torch.float32)
    sb = 8 if sign < 0 else 0
    assert e2m1_encode_rne(y).item() == idx | sb
    # just off the midpoint: the nearer neighbour
    below = torch.nextafter(y, torch.zeros(1))
    above = torch.nextafter(y, torch.tensor([sign * 100.0]))
    assert e2m1_encode_rne(below).item() == lo | sb
    assert e2m1_encode_rne(above).item() == (lo + 1) | sb


def test_e2m1_ties_named_in_decision_0002():
    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    y = torch.tensor(list(ties), dtype=torch.float32)
    assert e2m1_decode(e2m1_encode_rne(y)).tolist() == list(ties.values())
    assert e2m1_decode(e2m1_encode_rne(-y)).tolist() == [-v for v in ties.values()]


def test_e2m1_saturates_at_6():
    big = [6.0, 6.0000005, 6.5, 7.0, 100.0, 3.0e38, float("inf")]
    y = torch.tensor(big, dtype=torch.float32)
    assert e2m1_encode_rne(y).tolist() == [7] * len(big)
    assert e2m1_encode_rne(-y).tolist() == [15] * len(big)


def test_e2m1_zero_sign_and_nan():
    y = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 0.2499, -0.2499, math.nan, -math.nan], dtype=torch.float32)
    got = e2m1_encode_rne(y).tolist()
    assert got[:6] == [0, 8, 0, 8, 0, 8]
    # NaN: magnitude 0, its sign bit (documented; the quantizer never passes NaN here)
    assert got[6] & 7 == 0 and got[7] & 7 == 0
    assert got[6] >> 3 == int(torch.signbit(y[6])) and got[7] >> 3 == int(torch.signbit(y[7]))


def _brute_force_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Nearest magnitude by distance in float64 (exact here), ties to the even index."""
    mags = torch.tensor(POS_MAGS, dtype=torch.float64)
    d = (y.double().abs().unsqueeze(-1) - mags).abs()
    cand = d == d.min(dim=-1, keepdim=True).values
    even = (torch.arange(8) % 2 == 0)
    ce = cand & even
    idx = torch.where(ce.any(-1), ce.int().argmax(-1), cand.int().argmax(-1))
    return idx.to(torch.uint8) | (torch.signbit(y).to(torch.uint8) << 3)


def test_e2m1_encode_matches_brute_force_on_random_values():
    g = torch.Generator().manual_seed(1234)
    y = torch.cat([
        (torch.rand(20000, generator=g) * 16 - 8),
        torch.randn(20000, generator=g) * torch.exp2(torch.randint(-20, 20, (20000,), generator=g).float()),
        torch.tensor([m / 4 * k for m in range(1, 49) for k in (1, -1)]),  # quarter grid: all ties and more
    ]).float()
    assert torch.equal(e2m1_encode_rne(y), _brute_force_e2m1(y))


def test_encode_rejects_non_float():
    with pytest.raises(TypeError, match="y"):
        e2m1_encode_rne(torch.arange(4))
    with pytest.raises(TypeError, match="codes"):
        e2m1_decode(torch.arange(4))


def test_nibble_order_even_element_in_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x8]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x21, 0x8F]]
    g = torch.Generator().manual_seed(7)
    c = torch.randint(0, 16, (3, 5, 64), generator=g, dtype=torch.uint8)
    p = pack_nibbles(c)
    assert p.shape == (3, 5, 32)
    for i in range(32):
        assert torch.equal(p[..., i] & 0xF, c[..., 2 * i])
        assert torch.equal(p[..., i] >> 4, c[..., 2 * i + 1])
    assert torch.equal(unpack_nibbles(p), c)
    with pytest.raises(ValueError, match="even"):
        pack_nibbles(torch.zeros(3, dtype=torch.uint8))


def test_sign_bit_order_lsb_first():
    neg = torch.zeros(2, 16, dtype=torch.bool)
    neg[0, 0] = True  # element 0 -> byte 0 bit 0
    neg[0, 9] = True  # element 9 -> byte 1 bit 1
    neg[1, 7] = True  # element 7 -> byte 0 bit 7
    assert pack_bits(neg).tolist() == [[0x01, 0x02], [0x80, 0x00]]
    g = torch.Generator().manual_seed(8)
    r = torch.rand(4, 3, 40, generator=g) < 0.5
    p = pack_bits(r)
    assert p.shape == (4, 3, 5) and p.dtype == torch.uint8
    for i in range(5):
        want = sum(r[..., 8 * i + j].to(torch.int64) << j for j in range(8))
        assert torch.equal(p[..., i].to(torch.int64), want)
    assert torch.equal(unpack_bits(p), r)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_bits(torch.zeros(12, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        pack_bits(torch.zeros(16))
