"""Host-side preparation of the CUTLASS sm_120 grouped NVFP4 GEMM (tests/cpu/_cutlass_plan.py), on CPU.

Checked against tsct's own layout code (tsct.quant.layout, tsct.emulation.plan) and against a
decode-and-matmul oracle that reads operands ONLY through the plan's pointers and offsets. CUTLASS's
own layout functions are checked against the same formula in test_cutlass_build.py.
"""

import pytest
import torch

import _cutlass_plan as cp
from tsct.quant import layout as L

N, K = 64, 256


def _offs(counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)


COUNTS = [32, 0, 5, 130, 31, 0, 1]


def test_problem_shapes_swap_ab():
    p = cp.problem_nmk(_offs(COUNTS), N, K)
    assert p.dtype == torch.int32 and p.shape == (len(COUNTS), 3)
    assert p[:, 0].tolist() == [N] * len(COUNTS)
    assert p[:, 1].tolist() == COUNTS  # CUTLASS N' = rows of the expert, 0 kept (no tile)
    assert p[:, 2].tolist() == [K] * len(COUNTS)


@pytest.mark.parametrize("n,k,ok", [(64, 256, True), (8, 128, True), (60, 256, False), (64, 192, False),
                                    (64, 0, False)])
def test_shape_rules(n, k, ok):
    if ok:
        cp.check_shapes(n, k)
    else:
        with pytest.raises(ValueError):
            cp.check_shapes(n, k)


@pytest.mark.parametrize("rows,k", [(1, 128), (32, 256), (128, 128), (130, 384), (300, 2048)])
def test_sf_offset_matches_tsct_layout(rows, k):
    kb = k // 16
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(kb).unsqueeze(0)
    ours = cp.sf_offset(r, c, k)
    assert torch.equal(ours, L.swizzle_offsets(rows, kb))
    # every offset inside the group's block, all distinct
    assert int(ours.max()) < cp.sf_block_bytes(rows, k)
    assert ours.flatten().unique().numel() == rows * kb


def test_x_sf_offsets_match_emulation_plan():
    from tsct.emulation import plan
    offs = _offs(COUNTS)
    ours = cp.x_sf_offsets(offs, K)
    theirs, padded = plan.sfa_layout(offs, K)
    assert ours.tolist() == theirs.long().tolist()
    assert all(o % 512 == 0 for o in ours.tolist())
    total = int(ours[-1]) + cp.sf_block_bytes(COUNTS[-1], K)
    assert total <= cp.x_sf_bytes_bound(sum(COUNTS), len(COUNTS), K)
    assert cp.x_sf_bytes_bound(sum(COUNTS), len(COUNTS), K) == plan.sfa_bytes_bound(sum(COUNTS), len(COUNTS), K)


def test_x_sf_bound_is_tight_enough_and_safe():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        e = int(torch.randint(1, 40, (1,), generator=g))
        m = int(torch.randint(0, 400, (1,), generator=g))
        split = torch.multinomial(torch.ones(e), m, replacement=True, generator=g) if m else torch.zeros(0, dtype=torch.long)
        cnt = torch.bincount(split, minlength=e).tolist()
        offs = _offs(cnt)
        used = int(cp.x_sf_offsets(offs, K)[-1]) + cp.sf_block_bytes(cnt[-1], K)
        assert used <= cp.x_sf_bytes_bound(m, e, K)


def test_w_sf_bytes_is_tsct_quant_block():
    np_, kbp = L.swizzled_shape(N, K // 16)
    assert cp.w_sf_bytes(N, K) == np_ * kbp


def test_pointer_arrays_and_alignment():
    offs = _offs(COUNTS)
    base = dict(w=1 << 20, w_sf=2 << 20, x=3 << 20, x_sf=4 << 20, out=5 << 20)
    p = cp.pointer_arrays(offs, N, K, **base)
    cnt, starts = cp.counts_starts(offs)
    assert p["ptr_x"].tolist() == [base["x"] + s * K // 2 for s in starts.tolist()]
    assert p["ptr_out"].tolist() == [base["out"] + s * N * 2 for s in starts.tolist()]
    assert p["ptr_w"].tolist() == [base["w"] + e * N * K // 2 for e in range(len(COUNTS))]
    assert p["ptr_w_sf"].tolist() == [base["w_sf"] + e * cp.w_sf_bytes(N, K) for e in range(len(COUNTS))]
    assert bool(cp.check_alignment(p))
    bad = dict(p, ptr_x=p["ptr_x"] + 8)
    assert not bool(cp.check_alignment(bad))


def test_no_host_reads_on_meta():
    offs = _offs(COUNTS).to("meta")
    p = cp.problem_nmk(offs, N, K)
    assert p.device.type == "meta" and p.shape == (len(COUNTS), 3)
    ptrs = cp.pointer_arrays(offs, N, K, w=0, w_sf=0, x=0, x_sf=0, out=0)
    assert all(t.device.type == "meta" and t.shape == (len(COUNTS),) for t in ptrs.values())
    assert cp.check_alignment(ptrs).device.type == "meta"


def test_prep_workspace_rule():
    assert cp.prep_bytes(0, (8, 8, 8, 48, 48)) == 0
    assert cp.prep_bytes(1, (8, 8, 8, 48, 48)) == 5 * 256
    assert cp.prep_bytes(100, (8, 8, 8, 48, 48)) == 3 * 1024 + 2 * 4864


def test_oracle_through_plan_addresses():
    """Decode every operand by the plan's addresses/offsets from flat buffers; compare with a direct decode."""
    torch.manual_seed(0)
    counts = [3, 0, 40, 7]
    offs = _offs(counts)
    e, m = len(counts), sum(counts)
    codes_x = torch.randint(0, 256, (m, K // 2), dtype=torch.uint8)
    codes_w = torch.randint(0, 256, (e, N, K // 2), dtype=torch.uint8)
    sf_x = (torch.rand(m, K // 16) * 4 + 0.25).to(torch.float8_e4m3fn)
    sf_w = (torch.rand(e, N, K // 16) * 4 + 0.25).to(torch.float8_e4m3fn)
    alpha = torch.rand(e) + 0.5

    # flat byte buffers laid out as the kernel reads them
    buf_x_sf = torch.zeros(cp.x_sf_bytes_bound(m, e, K), dtype=torch.uint8)
    buf_w_sf = torch.zeros(e * cp.w_sf_bytes(N, K), dtype=torch.uint8)
    p = cp.pointer_arrays(offs, N, K, w=0, w_sf=0, x=0, x_sf=0, out=0)
    cnt, starts = cp.counts_starts(offs)
    kb = torch.arange(K // 16)
    for g in range(e):
        rows = torch.arange(counts[g])
        o = cp.sf_offset(rows.unsqueeze(1), kb.unsqueeze(0), K) + int(p["ptr_x_sf"][g])
        buf_x_sf[o] = sf_x[int(starts[g]):int(starts[g]) + counts[g]].view(torch.uint8)
        rw = torch.arange(N)
        o = cp.sf_offset(rw.unsqueeze(1), kb.unsqueeze(0), K) + int(p["ptr_w_sf"][g])
        buf_w_sf[o] = sf_w[g].view(torch.uint8)

    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])

    def dec(codes):  # [..., K/2] -> [..., K], even element in the low nibble
        return torch.stack([lut[(codes & 15).long()], lut[(codes >> 4).long()]], -1).flatten(-2)

    flat_x, flat_w = codes_x.flatten(), codes_w.flatten()
    out_plan = torch.zeros(m * N)
    for g in range(e):
        M_e = int(cp.problem_nmk(offs, N, K)[g, 1])
        if not M_e:
            continue
        xs = flat_x[int(p["ptr_x"][g]):int(p["ptr_x"][g]) + M_e * K // 2].view(M_e, K // 2)
        ws = flat_w[int(p["ptr_w"][g]):int(p["ptr_w"][g]) + N * K // 2].view(N, K // 2)
        rows = torch.arange(M_e)
        sx = buf_x_sf[cp.sf_offset(rows.unsqueeze(1), kb.unsqueeze(0), K) + int(p["ptr_x_sf"][g])]
        sw = buf_w_sf[cp.sf_offset(torch.arange(N).unsqueeze(1), kb.unsqueeze(0), K) + int(p["ptr_w_sf"][g])]
        a = dec(xs) * sx.view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
        b = dec(ws) * sw.view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
        d = alpha[g] * (a @ b.T)  # [M_e, N]
        o0 = int(p["ptr_out"][g]) // 2  # bf16 elements
        out_plan[o0:o0 + M_e * N] = d.flatten()

    xd = dec(codes_x) * sf_x.float().repeat_interleave(16, -1)
    wd = dec(codes_w) * sf_w.float().repeat_interleave(16, -1)
    ref = cp.grouped_reference(xd, wd, offs, alpha)
    torch.testing.assert_close(out_plan.view(m, N), ref, rtol=1e-6, atol=1e-5)
