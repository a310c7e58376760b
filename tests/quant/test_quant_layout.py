"""Block-scale layouts: swizzled_128x4 offsets against design.md's formula, conversions, containers."""

import itertools

import numpy as np
import pytest
import torch

from tsct.quant import NVFP4Tensor, quantize_nvfp4, quantize_sign, to_layout
from tsct.quant.layout import swizzle_offsets, swizzled_shape, to_linear, to_swizzled

NS = [1, 127, 128, 129, 5461]
KBS = [1, 3, 4, 5, 128]


def formula_offsets(n: int, kb: int) -> np.ndarray:
    """design.md section 3, written out: rows padded to 128, Kb to 4."""
    kbp = -(-kb // 4) * 4
    m, k = np.meshgrid(np.arange(n, dtype=np.int64), np.arange(kb, dtype=np.int64), indexing="ij")
    return (m // 128) * (kbp // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4


def blocked_reference(scales: torch.Tensor) -> torch.Tensor:
    """Independent construction (the tile view of torchao's to_blocked): [N, Kb] -> flat bytes."""
    n, kb = scales.shape
    np_, kbp = -(-n // 128) * 128, -(-kb // 4) * 4
    p = torch.zeros(np_, kbp, dtype=scales.dtype)
    p[:n, :kb] = scales
    tiles = p.view(np_ // 128, 128, kbp // 4, 4).permute(0, 2, 1, 3)  # [row tile, col tile, 128, 4]
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)  # in-tile: row 32*b+c -> c*16 + b*4


@pytest.mark.parametrize("n,kb", list(itertools.product(NS, KBS)))
def test_swizzle_offsets_match_design_formula(n, kb):
    off = swizzle_offsets(n, kb)
    assert off.shape == (n, kb) and off.dtype == torch.int64
    assert np.array_equal(off.numpy(), formula_offsets(n, kb))
    np_, kbp = swizzled_shape(n, kb)
    assert (np_, kbp) == (-(-n // 128) * 128, -(-kb // 4) * 4)
    flat = off.flatten()
    assert flat.unique().numel() == flat.numel()  # injective
    assert int(flat.min()) >= 0 and int(flat.max()) < np_ * kbp


@pytest.mark.parametrize("n,kb", [(1, 1), (127, 3), (128, 4), (129, 5), (5461, 4), (300, 128)])
def test_to_swizzled_places_every_scale_and_zero_pads(n, kb):
    g = torch.Generator().manual_seed(n * 1000 + kb)
    lin = torch.randint(1, 256, (2, n, kb), generator=g, dtype=torch.int32).to(torch.uint8)  # nonzero bytes
    sw = to_swizzled(lin)
    np_, kbp = swizzled_shape(n, kb)
    assert sw.shape == (2, np_ * kbp) and sw.dtype == torch.uint8
    off = swizzle_offsets(n, kb)
    for e in range(2):
        assert torch.equal(sw[e][off], lin[e])
        assert torch.equal(sw[e], blocked_reference(lin[e]))
        pad = torch.ones(np_ * kbp, dtype=torch.bool)
        pad[off.flatten()] = False
        assert (sw[e][pad] == 0).all()
    assert torch.equal(to_linear(sw, n, kb), lin)


def test_float8_bytes_move_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    b = torch.randint(0, 256, (3, 130, 6), generator=g, dtype=torch.int32).to(torch.uint8)  # incl. 0x7F NaN
    f8 = b.view(torch.float8_e4m3fn)
    sw = to_swizzled(f8)
    assert sw.dtype == torch.float8_e4m3fn
    back = to_linear(sw, 130, 6)
    assert back.dtype == torch.float8_e4m3fn and torch.equal(back.view(torch.uint8), b)


def test_layout_helpers_reject_bad_input():
    with pytest.raises(ValueError, match="swizzled"):
        to_linear(torch.zeros(2, 100, dtype=torch.uint8), 128, 4)
    with pytest.raises(TypeError, match="1-byte"):
        to_swizzled(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="scales"):
        to_swizzled(torch.zeros(4, dtype=torch.uint8))


def _w(g, *shape):
    return torch.randn(*shape, generator=g)


def test_container_to_layout_round_trip_and_same_decode():
    g = torch.Generator().manual_seed(11)
    w = _w(g, 3, 80, 130)  # N = 130 rows (2 row tiles), Kb = 5 (padded to 8)
    lin = quantize_nvfp4(w, backend="torch")
    sw = to_layout(lin, "swizzled_128x4")
    assert sw.layout == "swizzled_128x4" and sw.block_scale.shape == (3, 256 * 8)
    assert torch.equal(sw.codes, lin.codes) and torch.equal(sw.global_scale, lin.global_scale)
    direct = quantize_nvfp4(w, layout="swizzled_128x4", backend="torch")
    assert torch.equal(direct.block_scale.view(torch.uint8), sw.block_scale.view(torch.uint8))
    back = to_layout(sw, "linear")
    assert torch.equal(back.block_scale.view(torch.uint8), lin.block_scale.view(torch.uint8))
    assert to_layout(lin, "linear") is lin
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(sw.dequantize(dt, backend="torch"), lin.dequantize(dt, backend="torch"))
    assert sw.nbytes == lin.nbytes + 3 * (256 * 8 - 130 * 5)


def test_to_layout_rejects_bad_names_and_types():
    g = torch.Generator().manual_seed(12)
    w = _w(g, 32, 8)
    q = quantize_nvfp4(w, backend="torch")
    with pytest.raises(ValueError, match="layout"):
        to_layout(q, "swizzled")
    with pytest.raises(ValueError, match="layout"):
        quantize_nvfp4(w, layout="blocked", backend="torch")
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        to_layout(quantize_sign(w, backend="torch"), "linear")
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        to_layout(w, "linear")
    # a container must be labelled consistently with its buffer
    with pytest.raises(ValueError, match="block_scale"):
        NVFP4Tensor(q.codes, q.block_scale, q.global_scale, "swizzled_128x4", q.shape)
