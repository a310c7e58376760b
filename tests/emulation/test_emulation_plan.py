"""Host-side preparation for the sm_120 grouped NVFP4 kernels (tsct.emulation.plan), design.md 6 (b)."""

import math

import pytest
import torch

from tsct.emulation import plan
from tsct.quant.layout import swizzled_shape


def _offs(counts, device="cpu"):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def _expected_tiles(counts, tile_m):
    out, lo = [], 0
    for e, c in enumerate(counts):
        out += [(e, lo + i * tile_m) for i in range(math.ceil(c / tile_m))]
        lo += c
    return out


@pytest.mark.parametrize("counts,tile_m", [([32, 0, 5, 70, 0], 32), ([0, 0, 0], 32), ([1] * 9, 16),
                                           ([128, 127, 129], 64), ([], 32)])
def test_tile_map(counts, tile_m):
    m = sum(counts)
    t = max(1, plan.max_tiles(m, len(counts), tile_m))
    te, tr = plan.tile_map(_offs(counts), tile_m, t)
    exp = _expected_tiles(counts, tile_m)
    assert len(exp) <= t
    assert list(zip(te.tolist(), tr.tolist()))[:len(exp)] == exp
    assert te[len(exp):].eq(-1).all() and tr[len(exp):].eq(0).all()
    assert te.dtype == tr.dtype == torch.int32


def test_max_tiles_is_a_bound_and_tight():
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        e = int(torch.randint(1, 20, (1,), generator=rng))
        counts = torch.randint(0, 80, (e,), generator=rng).tolist()
        m = sum(counts)
        assert sum(math.ceil(c / 32) for c in counts) <= plan.max_tiles(m, e, 32)
    assert plan.max_tiles(32 * 5 + 5, 5, 32) == sum(math.ceil(c / 32) for c in [33] * 5)  # tight
    # b1: M = 32768 rows over E = 1024 experts, tile 32
    assert plan.max_tiles(32768, 1024, 32) == (32768 + 1024 * 31) // 32 == 2016


def test_sfa_layout_offsets_and_bound():
    counts, k = [32, 0, 5, 200, 0, 128], 2048
    off, padded = plan.sfa_layout(_offs(counts), k)
    kbp = swizzled_shape(1, k // 16)[1]
    sizes = [swizzled_shape(c, k // 16)[0] * kbp if c else 0 for c in counts]
    assert padded.tolist() == [swizzled_shape(c, 1)[0] if c else 0 for c in counts]
    assert off.tolist() == [sum(sizes[:i]) for i in range(len(counts))]
    assert sum(sizes) <= plan.sfa_bytes_bound(sum(counts), len(counts), k)
    # K = r = 64 (w_down's activations): Kb = 4, one 512-byte tile per 128 rows
    off64, _ = plan.sfa_layout(_offs([1, 129]), 64)
    assert off64.tolist() == [0, 512]


def test_sfa_bound_is_a_bound():
    rng = torch.Generator().manual_seed(1)
    for _ in range(200):
        e = int(torch.randint(1, 12, (1,), generator=rng))
        counts = torch.randint(0, 300, (e,), generator=rng).tolist()
        off, padded = plan.sfa_layout(_offs(counts), 128)
        total = int(off[-1]) + int(padded[-1]) * 8
        assert total <= plan.sfa_bytes_bound(sum(counts), e, 128)


def test_sizes():
    assert plan.a_rows_alloc(100, 32) == 131
    assert plan.sfb_bytes(1024, 64, 2048) == 1024 * 128 * 128  # w_gate/w_up: r=64 padded to 128
    assert plan.sfb_bytes(1024, 5461, 64) == 1024 * 5504 * 4  # w_down: f=5461 -> 5504 rows, Kb=4


def test_interleave_rows():
    a = torch.arange(6).reshape(1, 3, 2)
    b = 100 + torch.arange(6).reshape(1, 3, 2)
    out = plan.interleave_rows(a, b)
    assert out[0, 0::2].tolist() == a[0].tolist() and out[0, 1::2].tolist() == b[0].tolist()
    with pytest.raises(ValueError):
        plan.interleave_rows(a, b[:, :2])


def test_alpha_and_glu_scales():
    s = torch.tensor([2688.0, 3.0])
    alpha = plan.alpha_from_encode_scales(s, torch.tensor([2.0, 7.0]))
    assert alpha.tolist() == [torch.div(torch.tensor(1.0), torch.tensor(5376.0)).item(),
                              torch.div(torch.tensor(1.0), torch.tensor(21.0)).item()]
    ep0, ep1 = plan.glu_scales(torch.tensor([2.0]), torch.tensor([4.0]), torch.tensor([[1.0, 3.0]]), None, 2)
    assert ep0.tolist() == [[0.5, 1.5]] and ep1.tolist() == [[0.25, 0.25]]


def test_plan_is_sync_free_on_meta_device():
    # on the meta device any host read (.item(), .tolist(), int(t), bool(t)) raises: the plan makes none
    offs = torch.empty(1024, dtype=torch.int32, device="meta")
    p = plan.make_plan(offs, 32768, 128, 2048, tile_m=32, tile_n=128)
    assert p.tile_expert.device.type == "meta" and p.tile_expert.shape == (2016,)
    assert p.grid == (2016, 1, 1)
    assert p.sfa_bytes == plan.sfa_bytes_bound(32768, 1024, 2048)


def test_plan_rejects_bad_input():
    with pytest.raises(TypeError):
        plan.make_plan(torch.tensor([3, 5]), 5, 32, 64)  # int64 offs
    with pytest.raises(ValueError):
        plan.make_plan(_offs([3]), 3, 32, 48)  # K not a multiple of 64
