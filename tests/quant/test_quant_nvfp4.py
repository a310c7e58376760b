"""NVFP4 quantizer (torch backend) against decision 0002, with an independent per-element reference.

The reference below re-derives everything from the text of 0002: exact rational arithmetic
(fractions.Fraction) for nearest-value searches, numpy float32 for the fp32 steps (a product or
quotient of two fp32 values computed in float64 and rounded once to fp32 is the correctly rounded
fp32 result).
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from tsct.quant import NVFP4Tensor, dequantize, native_fallback_counts, quantize_nvfp4

FLT_MAX = float(np.finfo(np.float32).max)


# ---- independent definitions -------------------------------------------------------------------

def _e4m3_value(byte):
    exp, man = (byte >> 3) & 0xF, byte & 7
    return (man / 8) * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)


E4M3_POS = [(_e4m3_value(b), b) for b in range(0x7F)]  # all finite non-negative values, 0 .. 448
E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def f32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def nearest_even(v: float, table):
    """Index into table [(value, tie_key)] of the nearest value to v, ties to the even tie_key."""
    fv = Fraction(v)
    return min(range(len(table)), key=lambda i: (abs(Fraction(table[i][0]) - fv), table[i][1] % 2))


def e4m3_rne(v: float):
    i = nearest_even(v, E4M3_POS)
    return E4M3_POS[i]  # (value, byte)


def e2m1_rne_index(v: float) -> int:
    if v > 6.0:
        return 7
    return nearest_even(v, [(m, i) for i, m in enumerate(E2M1_POS)])


def reference_quantize(w: torch.Tensor):
    """w: logical [E, K, N] -> (codes [E, N, K/2] bytes, scale bytes [E, N, K/16], s_enc [E]) as lists."""
    w = w.double()  # exact for f32/bf16/f16 inputs
    e_, k_, n_ = w.shape
    codes, scales, s_encs = [], [], []
    for e in range(e_):
        vals = [float(v) for v in w[e].flatten()]
        finite = [abs(v) for v in vals if math.isfinite(v)]
        amax = max(finite) if finite else 0.0
        s_enc = 1.0 if amax == 0 else f32(min(2688.0 / amax, FLT_MAX))
        s_encs.append(s_enc)
        c_e, s_e = [], []
        for n in range(n_):
            c_row, s_row = [], []
            for kb in range(k_ // 16):
                block = [float(w[e, kb * 16 + j, n]) for j in range(16)]
                if not all(math.isfinite(x) for x in block):
                    s_row.append(0x7F)
                    c_row += [0] * 16
                    continue
                bamax = max(abs(x) for x in block)
                sf32 = min(f32(f32(bamax * s_enc) / 6.0), 448.0)
                sfv, sbyte = e4m3_rne(sf32)
                s_row.append(sbyte)
                for x in block:
                    sign = 8 if math.copysign(1.0, x) < 0 else 0
                    if sfv == 0:
                        c_row.append(sign)
                    else:
                        y = f32(f32(x * s_enc) / sfv)
                        c_row.append(sign | e2m1_rne_index(abs(y)))
            c_e.append([c_row[2 * i] | (c_row[2 * i + 1] << 4) for i in range(k_ // 2)])
            s_e.append(s_row)
        codes.append(c_e)
        scales.append(s_e)
    return codes, scales, s_encs


def reference_decode(codes, scales, s_encs, k_):
    """-> fp32 logical [E, K, N]: (e2m1 * sf) / s_enc, NaN for a 0x7F block."""
    e_, n_ = len(codes), len(codes[0])
    out = torch.empty(e_, k_, n_, dtype=torch.float32)
    for e in range(e_):
        for n in range(n_):
            for k in range(k_):
                byte = codes[e][n][k // 2]
                c = (byte >> (4 * (k % 2))) & 0xF
                sb = scales[e][n][k // 16]
                if sb == 0x7F:
                    out[e, k, n] = math.nan
                    continue
                v = (-1.0 if c & 8 else 1.0) * E2M1_POS[c & 7]
                out[e, k, n] = f32(f32(v * _e4m3_value(sb)) / s_encs[e])
    return out


def assert_matches_reference(w: torch.Tensor):
    q = quantize_nvfp4(w, backend="torch")
    w3 = w if w.dim() == 3 else w.unsqueeze(0)
    codes, scales, s_encs = reference_quantize(w3)
    assert q.codes.tolist() == codes
    assert q.block_scale.view(torch.uint8).tolist() == scales
    assert q.global_scale.tolist() == s_encs
    got = q.dequantize(torch.float32, backend="torch").reshape(w3.shape)
    want = reference_decode(codes, scales, s_encs, w3.shape[1])
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    fin = ~torch.isnan(want)
    assert torch.equal(got[fin].view(torch.int32), want[fin].view(torch.int32))  # bit for bit, -0.0 included
    return q


def random_blocks(g, e, k, n, lo=-14, hi=6):
    """Gaussian values, each 16-element block scaled by its own power of two (wide dynamic range)."""
    w = torch.randn(e, k, n, generator=g)
    scale = torch.exp2(torch.randint(lo, hi, (e, k // 16, 1, n), generator=g).float())
    return (w.view(e, k // 16, 16, n) * scale).view(e, k, n)


# ---- tests ---------------------------------------------------------------------------------------

def test_matches_independent_reference_on_random_matrix():
    g = torch.Generator().manual_seed(20261129)
    w = random_blocks(g, 2, 64, 5)
    w[0, 16:32, 1] = 0.0  # a zero block
    w[1, 0:16, 2] = -0.0  # a negative-zero block
    w[1, 32:48, 3] *= 1e-6  # a block whose scale rounds to 0 (sign-only codes)
    q = assert_matches_reference(w)
    sb = q.block_scale.view(torch.uint8)
    assert sb[1, 3, 2].item() == 0
    assert ((sb > 0) & (sb < 8)).any()  # subnormal block scales are exercised


def test_matches_reference_with_extreme_ranges_and_nonfinite():
    g = torch.Generator().manual_seed(5)
    w = random_blocks(g, 3, 32, 3, lo=-30, hi=30)
    w[0, 3, 0] = float("nan")
    w[0, 20, 2] = float("inf")
    w[1, 5, 1] = -float("inf")
    w[2] = torch.randn(32, 3, generator=g) * 1e37  # near the top of fp32
    w[2, 0:16, 0] = 1e-44  # subnormal inputs
    assert_matches_reference(w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_reference_for_half_inputs(dtype):
    g = torch.Generator().manual_seed(6)
    w = random_blocks(g, 1, 32, 4, lo=-6, hi=4).to(dtype)
    assert_matches_reference(w)
    assert torch.equal(quantize_nvfp4(w, backend="torch").codes, quantize_nvfp4(w.float(), backend="torch").codes)


E2M1_GRID = torch.tensor([s * m for s in (1.0, -1.0) for m in E2M1_POS])
MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
TIE_RESULT = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # even magnitude index


def exact_matrix(g, e, k, n, p_list, dtype=torch.float32, ties=False):
    """w = v * 2^t / s_enc with s_enc = 2^p and block scales 2^t (or 448 in the amax block): exact.

    Returns (w, expected decode). With ties=True some elements sit on E2M1 midpoints (y exactly).
    """
    w = torch.empty(e, k, n, dtype=torch.float64)
    want = torch.empty_like(w)
    for ei in range(e):
        inv_s = 2.0 ** -p_list[ei]
        for ni in range(n):
            for kb in range(k // 16):
                first = ni == 0 and kb == 0
                sf = 448.0 if first else 2.0 ** int(torch.randint(-9, 9, (), generator=g))
                v = E2M1_GRID[torch.randint(0, 16, (16,), generator=g)].double()
                v[int(torch.randint(0, 16, (), generator=g))] = 6.0 * (1 if torch.rand((), generator=g) < .5 else -1)
                vq = v.clone()
                if ties:
                    for j in range(16):
                        if abs(v[j]) != 6.0 and torch.rand((), generator=g) < 0.5:
                            t = int(torch.randint(0, 7, (), generator=g))
                            sgn = 1 if torch.rand((), generator=g) < .5 else -1
                            v[j], vq[j] = sgn * MIDPOINTS[t], sgn * TIE_RESULT[t]
                w[ei, kb * 16:(kb + 1) * 16, ni] = v * sf * inv_s
                want[ei, kb * 16:(kb + 1) * 16, ni] = vq * sf * inv_s
    assert torch.equal(w.to(dtype).double(), w)  # representable
    return w.to(dtype), want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_exact_round_trip_for_representable_values(dtype):
    g = torch.Generator().manual_seed(42)
    w, want = exact_matrix(g, 2, 48, 4, [3, -2], dtype)
    q = quantize_nvfp4(w, backend="torch")
    assert q.global_scale.tolist() == [8.0, 0.25]
    assert q.block_scale.float()[:, 0, 0].tolist() == [448.0, 448.0]
    for out_dtype in (torch.float32, dtype):
        got = q.dequantize(out_dtype, backend="torch")
        assert got.dtype == out_dtype and got.shape == w.shape
        assert torch.equal(got.double(), want)


def test_rne_ties_through_the_quantizer_both_signs():
    g = torch.Generator().manual_seed(43)
    w, want = exact_matrix(g, 2, 64, 6, [0, 5], ties=True)
    assert not torch.equal(w.double(), want)  # there are ties
    got = quantize_nvfp4(w, backend="torch").dequantize(torch.float32, backend="torch")
    assert torch.equal(got.double(), want)
    assert_matches_reference(w[:, :32, :3].contiguous())


def test_zero_blocks_and_negative_zero():
    g = torch.Generator().manual_seed(44)
    w = torch.randn(2, 48, 3, generator=g)
    w[0, 16:32, 1] = 0.0
    w[1, 32:48, 2] = -0.0
    q = quantize_nvfp4(w, backend="torch")
    sb = q.block_scale.view(torch.uint8)
    assert sb[0, 1, 1] == 0 and (q.codes[0, 1, 8:16] == 0).all()
    assert sb[1, 2, 2] == 0 and (q.codes[1, 2, 16:24] == 0x88).all()  # sign-only codes, both nibbles
    d = q.dequantize(torch.float32, backend="torch")
    assert (d[0, 16:32, 1] == 0).all() and not torch.signbit(d[0, 16:32, 1]).any()
    assert (d[1, 32:48, 2] == 0).all() and torch.signbit(d[1, 32:48, 2]).all()
    assert (sb != 0).sum() == 2 * 3 * 3 - 2  # every other block has a nonzero scale


def test_whole_zero_matrix():
    w = torch.zeros(2, 32, 5)
    w[1] = torch.randn(32, 5, generator=torch.Generator().manual_seed(45))  # expert 1 is not zero
    q = quantize_nvfp4(w, backend="torch")
    assert q.global_scale[0].item() == 1.0
    assert (q.codes[0] == 0).all() and (q.block_scale.view(torch.uint8)[0] == 0).all()
    d = q.dequantize(torch.bfloat16, backend="torch")
    assert (d[0] == 0).all() and not torch.signbit(d[0]).any()
    assert q.global_scale[1].item() == np.float32(2688.0) / np.float32(w[1].abs().max().item())


def test_nonfinite_poisons_only_its_block():
    g = torch.Generator().manual_seed(46)
    w = torch.randn(2, 64, 4, generator=g)
    w[0, 2, 0] = float("nan")  # block (n=0, kb=0)
    w[0, 17, 1] = float("inf")  # block (n=1, kb=1)
    w[0, 63, 3] = -float("inf")  # block (n=3, kb=3)
    w[0, 40, 2] = 1000.0  # the finite amax
    q = quantize_nvfp4(w, backend="torch")
    clean = quantize_nvfp4(torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0), backend="torch")
    assert torch.equal(q.global_scale, clean.global_scale)  # amax ignores nan/inf
    assert q.global_scale[0].item() == np.float32(2688.0) / np.float32(1000.0)
    poisoned = [(0, 0, 0), (0, 1, 1), (0, 3, 3)]
    sb, csb = q.block_scale.view(torch.uint8), clean.block_scale.view(torch.uint8)
    mask = torch.zeros_like(sb, dtype=torch.bool)
    for e, n, kb in poisoned:
        assert sb[e, n, kb] == 0x7F
        assert (q.codes[e, n, kb * 8:(kb + 1) * 8] == 0).all()
        mask[e, n, kb] = True
    assert torch.equal(sb[~mask], csb[~mask])
    cmask = mask.repeat_interleave(8, dim=-1)
    assert torch.equal(q.codes[~cmask], clean.codes[~cmask])
    for dt in (torch.float32, torch.bfloat16):
        d, dc = q.dequantize(dt, backend="torch"), clean.dequantize(dt, backend="torch")
        emask = mask.repeat_interleave(16, dim=-1).transpose(-1, -2)  # logical [E, K, N]
        assert torch.isnan(d[emask]).all()
        assert torch.equal(d[~emask], dc[~emask])


def test_all_nonfinite_matrix():
    w = torch.full((1, 32, 2), float("nan"))
    w[0, 0, 0] = float("inf")
    q = quantize_nvfp4(w, backend="torch")
    assert q.global_scale.tolist() == [1.0]
    assert (q.block_scale.view(torch.uint8) == 0x7F).all() and (q.codes == 0).all()
    assert torch.isnan(q.dequantize(backend="torch")).all()


def test_s_enc_clamps_to_float_max_for_tiny_amax():
    w = torch.zeros(1, 16, 2)
    w[0, 3, 0] = 1e-45  # the smallest subnormal: 2688 / amax overflows fp32
    w[0, 4, 1] = -1e-45
    q = quantize_nvfp4(w, backend="torch")
    assert q.global_scale.item() == FLT_MAX
    assert (q.block_scale.view(torch.uint8) == 0).all()  # (amax * FLT_MAX) / 6 rounds to 0 in UE4M3
    assert q.codes[0, 1, 2].item() == 0x08  # row n=1: k=4 (low nibble of byte 2) = -tiny -> sign-only, k=5 = 0
    assert q.codes[0, 0, 1].item() == 0x00  # row n=0: k=3 = +tiny -> +0 (high nibble), k=2 = 0
    d = q.dequantize(torch.float32, backend="torch")
    assert (d == 0).all() and torch.isfinite(d).all()
    assert_matches_reference(w)


def test_error_bound_on_gaussian():
    g = torch.Generator().manual_seed(47)
    w = torch.randn(3, 128, 24, generator=g)
    q = quantize_nvfp4(w, backend="torch")
    d = q.dequantize(torch.float32, backend="torch")
    # |x - x_hat| <= (largest half-gap of E2M1 = 1, plus the block-scale rounding slack) * sf / s_enc
    unit = (q.block_scale.float().repeat_interleave(16, -1).transpose(-1, -2) / q.global_scale.view(-1, 1, 1))
    assert ((w - d).abs() <= 1.0 * unit * (1 + 2 ** -20)).all()
    rel = (w - d).norm() / w.norm()
    assert 0.05 < rel < 0.15  # 4-bit with fine scales: ~0.1


def test_shapes_2d_noncontiguous_and_container():
    g = torch.Generator().manual_seed(48)
    w2 = torch.randn(48, 6, generator=g)
    q2 = quantize_nvfp4(w2, backend="torch")
    assert q2.shape == (48, 6) and q2.codes.shape == (1, 6, 24) and q2.global_scale.shape == (1,)
    d2 = q2.dequantize(backend="torch")
    assert d2.shape == (48, 6) and d2.dtype == torch.bfloat16 and d2.is_contiguous()
    q3 = quantize_nvfp4(w2.unsqueeze(0), backend="torch")
    assert torch.equal(q3.codes, q2.codes) and torch.equal(dequantize(q3, backend="torch")[0], d2)
    # a non-contiguous factor (here: the transpose of a [E, N, K] buffer) gives the same bytes
    buf = torch.randn(2, 6, 48, generator=g)
    wt = buf.transpose(1, 2)
    qa, qb = quantize_nvfp4(wt, backend="torch"), quantize_nvfp4(wt.contiguous(), backend="torch")
    assert torch.equal(qa.codes, qb.codes) and torch.equal(qa.block_scale.view(torch.uint8),
                                                           qb.block_scale.view(torch.uint8))
    assert qa.nbytes == 2 * 6 * 24 + 2 * 6 * 3 + 2 * 4
    assert qa.device == torch.device("cpu") and qa.to("cpu").nbytes == qa.nbytes
    r = repr(qa)
    assert "NVFP4Tensor" in r and "[2, 48, 6]" in r and "linear" in r
    with pytest.raises(dataclasses_frozen_error()):
        qa.layout = "swizzled_128x4"
    e0 = quantize_nvfp4(torch.randn(0, 32, 3, generator=g), backend="torch")
    assert e0.codes.shape == (0, 3, 16) and e0.dequantize(backend="torch").shape == (0, 32, 3)


def dataclasses_frozen_error():
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_validation_names_the_argument():
    g = torch.Generator().manual_seed(49)
    w = torch.randn(2, 32, 4, generator=g)
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        quantize_nvfp4(w.numpy())
    with pytest.raises(TypeError, match="w.dtype"):
        quantize_nvfp4(w.double())
    with pytest.raises(TypeError, match="w.dtype"):
        quantize_nvfp4(w.to(torch.int32))
    with pytest.raises(ValueError, match="w must be"):
        quantize_nvfp4(w[0, :, 0])
    with pytest.raises(ValueError, match="w must be"):
        quantize_nvfp4(w.unsqueeze(0))
    with pytest.raises(ValueError, match="K = w.shape.-2. = 24 must be a multiple of 16"):
        quantize_nvfp4(w[:, :24])
    with pytest.raises(ValueError, match="layout"):
        quantize_nvfp4(w, layout="Linear")
    with pytest.raises(ValueError, match="backend"):
        quantize_nvfp4(w, backend="cuda")
    with pytest.raises(RuntimeError, match="backend='native' cannot run"):
        quantize_nvfp4(w, backend="native")
    q = quantize_nvfp4(w, backend="torch")
    with pytest.raises(TypeError, match="dtype"):
        q.dequantize(torch.int8)
    with pytest.raises(TypeError, match="codes"):
        NVFP4Tensor(q.codes.to(torch.int16), q.block_scale, q.global_scale, "linear", q.shape)
    with pytest.raises(ValueError, match="global_scale"):
        NVFP4Tensor(q.codes, q.block_scale, q.global_scale[:1], "linear", q.shape)
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):  # not truncated to (2, 32, 4)
        NVFP4Tensor(q.codes, q.block_scale, q.global_scale, "linear", (2.0, 32.5, 4))
    with pytest.raises(ValueError, match="non-negative sizes, got .-2, 32, 4."):
        NVFP4Tensor(q.codes, q.block_scale, q.global_scale, "linear", (-2, 32, 4))
    r = NVFP4Tensor(q.codes, q.block_scale, q.global_scale, "linear", (np.int64(2), 32, torch.tensor(4)))
    assert r.shape == (2, 32, 4) and all(type(s) is int for s in r.shape)


def test_auto_on_cpu_is_torch_and_not_a_counted_fallback():
    before = native_fallback_counts()
    g = torch.Generator().manual_seed(50)
    w = torch.randn(32, 8, generator=g)
    a, t = quantize_nvfp4(w), quantize_nvfp4(w, backend="torch")
    assert torch.equal(a.codes, t.codes)
    assert native_fallback_counts() == before
