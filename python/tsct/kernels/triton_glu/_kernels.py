"""Triton sources of the bf16 / fp16 grouped GLU: the four kernels that read the factors (forward and backward).
Host side: ``glu.py``.

Notation (design.md section 2; the schedules, tile map, backward row tiles and combines: ``triton_common/_kernels.py``,
read that docstring first). For row i of expert e:

    hg = x_i @ Wg[e], hu = x_i @ Wu[e]        (fp32 accumulators, [r])
    g = hg * sg[e], u = hu * su[e], z = silu(g) * u
    y_i = (z @ Wd[e]) * rw_i                  ([f])

Rows of odd length (w_down, dY, y, out at f = 5461) are only 2-byte aligned: the aligned launches read
w_down (and, with VEC, dY) as shifted 8-byte words (``_ld_words`` / ``_words_to_tile``), write y with a
16-byte padded stride and read it back with vector loads (docs/performance.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tsct.kernels.triton_common._kernels import (_bwd_rows, _bwd_tile, _dw_one_tile, _dw_store, _dw_zero,
                                                _expert_bounds,
                                                _expert_of_tile, _glu_fwd_epilogue, _one_tile_dh, _row_index,
                                                _tile_of_offs)
# The "glu" AOT family compiles and indexes the shared kernels too (their spec keys, index entries and sm_120 proxy
# verdicts have always been the glu family's: ``specs.KERNELS``), so its kernel module holds every kernel its table
# lists.
from tsct.kernels.triton_common._kernels import (  # noqa: F401
    bwd_maps, bwd_slot_reduce, combine_rows, csr_keys, glu_bwd_dw, glu_bwd_dwd, glu_bwd_epi, glu_bwd_sred, route_place,
    route_rank, tile_cum, zero_tail_rows,
)


@triton.jit
def _zero_padding_rows(offs_ptr, hg_ptr, hu_ptr, z_ptr, E, M, r, cols, cmask, s, n_spare, BM: tl.constexpr,
                       BR: tl.constexpr):
    """Rows [offs[E-1], M) of hg, hu (fp32) and z set to 0 in this program's rank block (a saving forward's
    outputs are op outputs: defined on every row). Spare program s of n_spare (the grid's programs past the last
    row tile; there is at least one, as cdiv(M, BM) + E exceeds the tile count) takes row tiles s, s + n_spare..."""
    start = tl.maximum(tl.load(offs_ptr + E - 1), 0)
    zero = tl.zeros((BM, BR), dtype=tl.float32)
    for row0 in range(start + s * BM, M, n_spare * BM):
        rows = row0 + tl.arange(0, BM)
        mask = (rows < M)[:, None] & cmask[None, :]
        off = rows.to(tl.int64)[:, None] * r + cols[None, :]
        tl.store(hg_ptr + off, zero, mask=mask)
        tl.store(hu_ptr + off, zero, mask=mask)
        tl.store(z_ptr + off, zero.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _ld_words(ptr, start, valid, rmask, BN: tl.constexpr):
    """The 8-byte words behind a [R, BN] tile t[i, j] = ptr[start[i] + j] (j < valid, rows with rmask),
    for ``_words_to_tile``: rows of odd length (f = 5461) start at any 2-byte offset, which gives
    Triton no vector loads (or cp.async) of a plain tile. Word i and word i+1 of each row (the
    second read mostly hits L1); a word is read only if it holds a wanted element, so nothing
    outside the row's 8-byte granules is touched. ``ptr``: 8-byte aligned, 2-byte elements;
    ``start``: int64. Plain loads into registers: callers prefetch them one step ahead (Triton's
    cp.async pipelining of these tiles picked a bank-conflicted shared layout: 4x slower on the H200)."""
    q = start % 4
    wp = ptr.to(tl.pointer_type(tl.uint64), bitcast=True) + (start - q) // 4
    i = tl.arange(0, BN // 4)
    nw = (q + valid + 3) // 4                                   # words holding wanted elements
    m = rmask[:, None] & (i[None, :] < nw[:, None])
    lo = tl.load(wp[:, None] + i[None, :], mask=m, other=0)
    hi = tl.load(wp[:, None] + (i + 1)[None, :], mask=m & ((i + 1)[None, :] < nw[:, None]), other=0)
    return lo, hi


@triton.jit
def _words_to_tile(lo, hi, start, valid, dtype: tl.constexpr, BN: tl.constexpr, ZERO: tl.constexpr):
    """The tile of ``_ld_words``: each row shifted by q = start % 4 elements. Per 4 elements: three
    selects pick the 32-bit halves (q >= 2 skips one), two constant 16-bit funnel shifts (odd q) and
    two selects (~3 instructions per element; a variable 64-bit funnel shift cost ~19 and made the
    kernels ALU-bound). ZERO: elements past ``valid`` become 0 (else they hold the next row's data,
    or whatever lies in the row's last 8-byte granule)."""
    q = (start % 4).to(tl.int32)[:, None]
    two = q >= 2
    lo_y = (lo >> 32).to(tl.uint32)
    hi_x = hi.to(tl.uint32)
    a = tl.where(two, lo_y, lo.to(tl.uint32))
    b = tl.where(two, hi_x, lo_y)
    c = tl.where(two, (hi >> 32).to(tl.uint32), hi_x)
    odd = (q % 2) == 1
    ox = tl.where(odd, (a >> 16) | (b << 16), a)               # elements 4i, 4i+1 (low half first)
    oy = tl.where(odd, (b >> 16) | (c << 16), b)               # elements 4i+2, 4i+3
    t0 = (ox & 0xFFFF).to(tl.uint16)
    t1 = (ox >> 16).to(tl.uint16)
    t2 = (oy & 0xFFFF).to(tl.uint16)
    t3 = (oy >> 16).to(tl.uint16)
    # element 4i + 2a + b sits at [i, a, b]
    t = tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), (start.shape[0], BN))
    t = t.to(dtype, bitcast=True)
    if ZERO:
        t = tl.where(tl.arange(0, BN)[None, :] < valid, t, 0.0)
    return t


@triton.jit
def _ld_rows(ptr, start, valid, rmask, BN: tl.constexpr):
    """[R, BN] tile t[i, j] = ptr[start[i] + j] for j < valid and rmask[i], else 0 (``_ld_words``)."""
    lo, hi = _ld_words(ptr, start, valid, rmask, BN)
    return _words_to_tile(lo, hi, start, valid, ptr.dtype.element_ty, BN, True)


# ---- forward ------------------------------------------------------------------------------------

@triton.jit
def glu_down_fwd(
    x_ptr, gidx_ptr, offs_ptr, cum_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, z_ptr, hg_ptr, hu_ptr, rw_ptr,
    E, M, d, r, stride_x,
    HAS_GATHER: tl.constexpr, HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr,
    BWD: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """z[rows, rank block] = silu(x Wg * sg) * (x Wu * su) for one (row tile, rank block).
    With BWD (the saving forward, the backward's recompute): also stores hg = x Wg and hu = x Wu (fp32,
    unscaled), writes z * rw instead of z, and the programs past the last row tile zero the M - offs[E-1]
    padding rows of all three. The tile map: every program forms it from offs (``_tile_of_offs``) and program
    (0, 0) writes it to cum_ptr for the up kernel (no ``tile_cum`` launch before this one)."""
    pid = tl.program_id(0)
    pr = tl.program_id(1)
    e, tiles_before, n_tiles = _tile_of_offs(offs_ptr, cum_ptr, pid, E, (pid == 0) & (pr == 0), BM, BLOCK_E)
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    if e >= E:
        if BWD:
            _zero_padding_rows(offs_ptr, hg_ptr, hu_ptr, z_ptr, E, M, r, cols, cmask, pid - n_tiles,
                               tl.num_programs(0) - n_tiles, BM, BR)
        return
    lo, hi = _expert_bounds(offs_ptr, e)
    rows = lo + (pid - tiles_before) * BM + tl.arange(0, BM)
    rmask = rows < hi
    src = _row_index(gidx_ptr, rows, rmask, HAS_GATHER)
    ks = tl.arange(0, BK)
    x_row = src * stride_x                                   # int64 [BM]
    w_tile = ks[:, None] * r + cols[None, :]                 # int32 [BK, BR], loop-invariant
    wg_base = wg_ptr + e.to(tl.int64) * d * r
    wu_base = wu_ptr + e.to(tl.int64) * d * r
    acc_g = tl.zeros((BM, BR), dtype=tl.float32)
    acc_u = tl.zeros((BM, BR), dtype=tl.float32)
    for k in range(0, d, BK):
        kmask = (k + ks) < d
        a = tl.load(x_ptr + x_row[:, None] + (k + ks)[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        wmask = kmask[:, None] & cmask[None, :]
        wg = tl.load(wg_base + k * r + w_tile, mask=wmask, other=0.0)
        wu = tl.load(wu_base + k * r + w_tile, mask=wmask, other=0.0)
        acc_g = tl.dot(a, wg, acc_g)
        acc_u = tl.dot(a, wu, acc_u)
    _glu_fwd_epilogue(acc_g, acc_u, e, rows, rmask, cols, cmask, r, sg_ptr, su_ptr, rw_ptr, z_ptr, hg_ptr, hu_ptr,
                      HAS_SG, HAS_SU, HAS_RW, BWD)


@triton.jit
def glu_up_fwd(
    z_ptr, offs_ptr, cum_ptr, wd_ptr, rw_ptr, y_ptr,
    E, r, f, ldy,
    HAS_RW: tl.constexpr, FSPLIT: tl.constexpr, SINGLE_K: tl.constexpr, VEC: tl.constexpr, Y_PAD: tl.constexpr,
    WD_T: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """y[rows, :f] = (z Wd[e]) * rw for one row tile, over column blocks pn, pn + FSPLIT, ...
    (y has row stride ldy >= f). VEC (aligned launches): w_down rows read as shifted 8-byte words
    (``_ld_words``), prefetched one column block ahead. Y_PAD: ldy is a multiple of 8 and y's pad
    columns [f, ldy) may be written (with anything: readers stop at f), so the stores vectorize.
    WD_T (aligned launches): w_down is K-major, element (k, n) of expert e at
    e*r*f + n*r + k (the transpose of a contiguous [E, f, r], nn.Linear's layout): every column is r
    contiguous elements, so the tiles load as 16-byte vectors that Triton pipelines (cp.async)."""
    pid = tl.program_id(0)
    pn = tl.program_id(1)
    e = _expert_of_tile(cum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    lo, hi = _expert_bounds(offs_ptr, e)
    tiles_before = tl.load(cum_ptr + e - 1, mask=e > 0, other=0)
    row0 = lo + (pid - tiles_before) * BM
    bm = tl.arange(0, BM)
    rmask = (row0 + bm) < hi
    if HAS_RW:
        rw = tl.load(rw_ptr + row0 + bm, mask=rmask, other=0.0).to(tl.float32)
    ks = tl.arange(0, BK)
    ns = tl.arange(0, BN)
    z_base = z_ptr + row0.to(tl.int64) * r
    if Y_PAD:
        ldy = (ldy // 8) * 8  # == ldy; lets Triton see the multiple of 8 (an argument cannot carry a hint)
        ncol = ldy
    else:
        ncol = f
    y_base = y_ptr + row0.to(tl.int64) * ldy
    wd_off = e.to(tl.int64) * r * f
    wd_base = wd_ptr + wd_off
    wd_tile = ks[:, None] * f + ns[None, :]    # int32 [BK, BN], loop-invariant
    wd_rows = wd_off + ks.to(tl.int64) * f     # int64 [BK]: row starts (VEC)
    y_tile = bm[:, None] * ldy + ns[None, :]   # int32 [BM, BN]
    kmask0 = ks < r
    if SINGLE_K:  # the whole rank fits one K step (BK >= r): load the z tile once
        zt = tl.load(z_base + bm[:, None] * r + ks[None, :], mask=rmask[:, None] & kmask0[None, :], other=0.0)
        if WD_T:
            wdt_tile = ns[None, :] * r + ks[:, None]    # int32 [BK, BN], contiguous along k
        elif VEC:  # prefetch: the next block's words are in flight while this one is shifted and multiplied
            n0 = pn * BN
            wlo_next, whi_next = _ld_words(wd_ptr, wd_rows + n0, f - n0, kmask0, BN)
        else:
            # software prefetch: plain w_down loads (rows not 16-byte aligned) are not pipelined
            n0 = pn * BN
            b_next = tl.load(wd_base + n0 + wd_tile, mask=kmask0[:, None] & ((n0 + ns) < f)[None, :], other=0.0)
    for n in range(pn * BN, f, FSPLIT * BN):
        cmask = (n + ns) < f
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if SINGLE_K:
            if WD_T:
                b = tl.load(wd_base + n * r + wdt_tile, mask=kmask0[:, None] & cmask[None, :], other=0.0)
            elif VEC:
                wlo = wlo_next  # (lo, hi: the expert's row bounds)
                whi = whi_next
                n2 = n + FSPLIT * BN
                wlo_next, whi_next = _ld_words(wd_ptr, wd_rows + n2, f - n2, kmask0, BN)
                # columns past f only reach y's columns past f, which no one reads: no zeroing
                b = _words_to_tile(wlo, whi, wd_rows + n, f - n, wd_ptr.dtype.element_ty, BN, False)
            else:
                b = b_next
                n2 = n + FSPLIT * BN
                b_next = tl.load(wd_base + n2 + wd_tile, mask=kmask0[:, None] & ((n2 + ns) < f)[None, :], other=0.0)
            acc = tl.dot(zt, b, acc)
        else:
            for k in range(0, r, BK):
                kmask = (k + ks) < r
                a = tl.load(z_base + bm[:, None] * r + (k + ks)[None, :], mask=rmask[:, None] & kmask[None, :],
                            other=0.0)
                if WD_T:
                    b = tl.load(wd_base + (k + ks)[:, None] + (n + ns)[None, :] * r,
                                mask=kmask[:, None] & cmask[None, :], other=0.0)
                elif VEC:
                    b = _ld_rows(wd_ptr, wd_rows + k * f + n, f - n, kmask, BN)
                else:
                    b = tl.load(wd_base + k * f + n + wd_tile, mask=kmask[:, None] & cmask[None, :], other=0.0)
                acc = tl.dot(a, b, acc)
        if HAS_RW:
            acc = acc * rw[:, None]
        tl.store(y_base + n + y_tile, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & ((n + ns) < ncol)[None, :])


# ---- backward (schedule: triton_common/_kernels.py) -----------------------------------------------

@triton.jit
def glu_bwd_dz(
    dy_ptr, sidx_ptr, offs_ptr, xcum_ptr, wd_ptr, zw_ptr, part_ptr, dwd_ptr,
    E, M, r, f, f_slice,
    HAS_SCATTER: tl.constexpr, DO_DWD: tl.constexpr, VEC: tl.constexpr, WD_T: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One program per (row tile, rank block, f slice): part[fs, rows, ranks] = dY[rows, slice] Wd[e][:, slice]^T,
    and, for an expert of at most one tile (DO_DWD), dWd[e][ranks, slice] = (z*rw)^T dY[:, slice] in the same f loop
    (exact zeros for an empty expert, whose w_down is not read; other experts: glu_bwd_dwd).
    VEC (aligned launches): dY rows (and, unless WD_T, w_down rows) read as shifted 8-byte words
    (``_ld_rows``). WD_T (aligned launches): w_down and dWd are K-major (``glu_up_fwd``): their
    [BR, BN] tiles are contiguous along the ranks (16-byte vectors, pipelined loads, vector stores)."""
    pid = tl.program_id(0)
    pr = tl.program_id(1)
    fs = tl.program_id(2)
    e, t = _bwd_tile(xcum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    row0, hi, one = _bwd_rows(offs_ptr, e, t, BM)
    if not DO_DWD:
        if row0 >= hi:  # an empty expert's tile: nothing to do without dWd
            return
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    wcmask = cols < tl.where(row0 < hi, r, 0)             # w_down is read only for a tile with rows
    ns = tl.arange(0, BN)
    bm = tl.arange(0, BM)
    n_lo = fs * f_slice
    n_hi = tl.minimum(n_lo + f_slice, f)
    wd_off = e.to(tl.int64) * r * f
    wd_base = wd_ptr + wd_off
    dwd_base = dwd_ptr + wd_off
    if WD_T:
        wd_tile = cols[:, None] + ns[None, :] * r         # int32 [BR, BN], contiguous along the ranks
        wd_step = r                                       # elements per column step
    else:
        wd_tile = cols[:, None] * f + ns[None, :]         # int32 [BR, BN]
        wd_step = 1
    wd_rows = wd_off + cols.to(tl.int64) * f              # int64 [BR]: row starts (VEC)
    h_tile = bm[:, None] * r + cols[None, :]              # int32 [BM, BR]
    rows = row0 + bm
    rmask = rows < hi
    hmask = rmask[:, None] & cmask[None, :]
    dst = _row_index(sidx_ptr, rows, rmask, HAS_SCATTER)
    dy_row = dst * f
    zw = tl.load(zw_ptr + row0.to(tl.int64) * r + h_tile, mask=hmask, other=0.0)
    dz = tl.zeros((BM, BR), dtype=tl.float32)
    if VEC:  # prefetch: the next step's words are in flight while this one is shifted and multiplied
        ylo_next, yhi_next = _ld_words(dy_ptr, dy_row + n_lo, n_hi - n_lo, rmask, BN)
        if not WD_T:
            wlo_next, whi_next = _ld_words(wd_ptr, wd_rows + n_lo, n_hi - n_lo, wcmask, BN)
    for n in range(n_lo, n_hi, BN):
        nmask = (n + ns) < n_hi
        wmask = cmask[:, None] & nmask[None, :]
        wlmask = wcmask[:, None] & nmask[None, :]
        if VEC:
            ylo = ylo_next
            yhi = yhi_next
            n2 = n + BN
            ylo_next, yhi_next = _ld_words(dy_ptr, dy_row + n2, n_hi - n2, rmask, BN)
            dy = _words_to_tile(ylo, yhi, dy_row + n, n_hi - n, dy_ptr.dtype.element_ty, BN, True)
            if WD_T:  # aligned tiles: plain (pipelined) loads; only dY needs the words
                wd = tl.load(wd_base + n * wd_step + wd_tile, mask=wlmask, other=0.0)
            else:
                wlo = wlo_next
                whi = whi_next
                wlo_next, whi_next = _ld_words(wd_ptr, wd_rows + n2, n_hi - n2, wcmask, BN)
                wd = _words_to_tile(wlo, whi, wd_rows + n, n_hi - n, wd_ptr.dtype.element_ty, BN, True)
        else:
            dy = tl.load(dy_ptr + dy_row[:, None] + (n + ns)[None, :], mask=rmask[:, None] & nmask[None, :],
                         other=0.0)
            wd = tl.load(wd_base + n * wd_step + wd_tile, mask=wlmask, other=0.0)
        dz = tl.dot(dy, tl.trans(wd), dz)
        if DO_DWD:
            if one:
                if WD_T and BR < BN:  # dWd^T = dY^T (z*rw): M is BN, not the small rank block (fewer registers),
                    # and K-major dWd^T rows are contiguous along the ranks (a row-major dWd would need a transpose)
                    dwd_t = tl.dot(tl.trans(dy), zw)
                    tl.store(dwd_base + n * wd_step + tl.trans(wd_tile), dwd_t.to(dwd_ptr.dtype.element_ty),
                             mask=tl.trans(wmask))
                else:
                    dwd = tl.dot(tl.trans(zw), dy)
                    tl.store(dwd_base + n * wd_step + wd_tile, dwd.to(dwd_ptr.dtype.element_ty), mask=wmask)
    tl.store(part_ptr + fs.to(tl.int64) * M * r + row0.to(tl.int64) * r + h_tile, dz, mask=hmask)


@triton.jit
def glu_bwd_dx_dw(
    x_ptr, gidx_ptr, offs_ptr, xcum_ptr, wg_ptr, wu_ptr, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr,
    E, d, r, stride_x,
    HAS_GATHER: tl.constexpr, DO_DX: tl.constexpr, DO_DW: tl.constexpr,
    BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, NDB: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One program per (row tile, NDB d blocks): dx_routed[rows, dblk] = dhg Wg^T + dhu Wu^T, and, for an expert of
    at most one tile (DO_DW), dWg/dWu[e][dblk, :] = X^T dhg / X^T dhu (an empty expert's program stores zeros and
    returns; other experts: glu_bwd_dw). A rank that fits one block (b1: r = 64) loads dhg / dhu once and walks
    the d blocks in one loop (``_dx_dw_loop``) whose loads Triton pipelines: the loop with dW or the one without is
    chosen once per program, not per d block; a larger one takes the per-block path over its rank blocks."""
    pid = tl.program_id(0)
    pd = tl.program_id(1)
    e, t = _bwd_tile(xcum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    row0, hi, one = _bwd_rows(offs_ptr, e, t, BM)
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    h_tile = bm[:, None] * r + rs[None, :]     # int32 [BM, BR]
    d_lo = pd * BD * NDB
    d_hi = tl.minimum(d_lo + BD * NDB, d)
    w_e = e.to(tl.int64) * d * r
    live = row0 < hi                           # the tile has rows (else an empty expert's)
    if DO_DW:
        if not live:  # an empty expert: its dW block is zeros; no row, no factor, no product
            _dw_zero(dwg_ptr, dwu_ptr, w_e, d_lo, d_hi, r, BD * BR)
            return
    if r <= BR:
        rmask, src, rm, hg, hu = _one_tile_dh(gidx_ptr, dhg_ptr, dhu_ptr, row0, hi, r, h_tile, HAS_GATHER, BM, BR)
        if DO_DW:
            if one:
                _dx_dw_loop(x_ptr, wg_ptr, wu_ptr, dx_ptr, dwg_ptr, dwu_ptr, src, rmask, rm, hg, hu, w_e, row0,
                            d_lo, d_hi, d, r, stride_x, DO_DX, True, BM, BD, BR)
            elif DO_DX:
                _dx_dw_loop(x_ptr, wg_ptr, wu_ptr, dx_ptr, dwg_ptr, dwu_ptr, src, rmask, rm, hg, hu, w_e, row0,
                            d_lo, d_hi, d, r, stride_x, True, False, BM, BD, BR)
        elif live:
            _dx_dw_loop(x_ptr, wg_ptr, wu_ptr, dx_ptr, dwg_ptr, dwu_ptr, src, rmask, rm, hg, hu, w_e, row0,
                        d_lo, d_hi, d, r, stride_x, DO_DX, False, BM, BD, BR)
    else:
        for d0 in range(d_lo, d_hi, BD):
            if DO_DW:
                if one:
                    _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, dwg_ptr, dwu_ptr, w_e + d0 * r, row0, hi, 1, d0, d,
                              r, stride_x, HAS_GATHER, BM, BD, BR)
            if DO_DX:
                if live:
                    _dx_block(wg_ptr, wu_ptr, dhg_ptr, dhu_ptr, dx_ptr, w_e + d0 * r, row0, hi, d0, d, r, BM, BD, BR)


@triton.jit
def _dx_dw_loop(x_ptr, wg_ptr, wu_ptr, dx_ptr, dwg_ptr, dwu_ptr, src, rmask, rm_w, hg, hu, w_e, row0, d_lo, d_hi, d,
                r, stride_x, DX: tl.constexpr, DW: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                BR: tl.constexpr):
    """``glu_bwd_dx_dw``'s d loop over [d_lo, d_hi) for one row tile whose rank fits one block (``_one_tile_dh``'s
    rmask, src, hg, hu): dx_routed (DX; the factors read under ``rm_w``, the rank mask) and the expert's dWg / dWu
    (DW: this tile holds all its rows), with no branch in the loop, so that Triton pipelines every load of it."""
    dl = tl.arange(0, BD)
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    rm = rs < r
    for d0 in range(d_lo, d_hi, BD):
        dm = (d0 + dl) < d
        if DW:
            _dw_one_tile(x_ptr, src, rmask, rm, hg, hu, dwg_ptr, dwu_ptr, w_e, d0, d, r, stride_x, BD, BR)
        if DX:
            wt_off = w_e + d0 * r + dl[None, :] * r + rs[:, None]
            tmask = rm_w[:, None] & dm[None, :]
            wgT = tl.load(wg_ptr + wt_off, mask=tmask, other=0.0)
            wuT = tl.load(wu_ptr + wt_off, mask=tmask, other=0.0)
            acc = tl.dot(hg, wgT)
            acc = tl.dot(hu, wuT, acc)
            tl.store(dx_ptr + row0.to(tl.int64) * d + d0 + bm[:, None] * d + dl[None, :],
                     acc.to(dx_ptr.dtype.element_ty), mask=rmask[:, None] & dm[None, :])


@triton.jit
def _dx_block(wg_ptr, wu_ptr, dhg_ptr, dhu_ptr, dx_ptr, w_base, row0, hi, d0, d, r, BM: tl.constexpr,
              BD: tl.constexpr, BR: tl.constexpr):
    """dx_routed[row0 + i, d0:d0 + BD] = dhg Wg^T + dhu Wu^T for the rows row0 + i < hi of one row tile, over every
    rank block; ``w_base``: int64 offset of [e, d0, 0] in the factors."""
    dl = tl.arange(0, BD)
    dm = (d0 + dl) < d
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    rmask = (row0 + bm) < hi
    wt_tile = dl[None, :] * r + rs[:, None]    # int32 [BR, BD]: W^T block
    h_tile = bm[:, None] * r + rs[None, :]
    h_row = row0.to(tl.int64) * r
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    for rb in range(0, r, BR):
        rm = (rb + rs) < r
        hmask = rmask[:, None] & rm[None, :]
        hg = tl.load(dhg_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
        hu = tl.load(dhu_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
        tmask = rm[:, None] & dm[None, :]
        wgT = tl.load(wg_ptr + w_base + rb + wt_tile, mask=tmask, other=0.0)
        wuT = tl.load(wu_ptr + w_base + rb + wt_tile, mask=tmask, other=0.0)
        acc = tl.dot(hg, wgT, acc)
        acc = tl.dot(hu, wuT, acc)
    tl.store(dx_ptr + row0.to(tl.int64) * d + d0 + bm[:, None] * d + dl[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=rmask[:, None] & dm[None, :])
