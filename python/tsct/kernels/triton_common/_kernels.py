"""Triton sources both Triton kernel families launch or call (``tsct.kernels.triton_glu``, bf16 / fp16 factors;
``tsct.kernels.triton_lowbit``, packed factors). Host side: ``runtime.py``; the variant table: ``specs.py``.

Notation (design.md section 2): rows are sorted by expert, ``offs`` holds cumulative END offsets, expert e owns rows
[offs[e-1], offs[e]). Schedules (no host reads of offs; every grid is sized by an upper bound):

  tile map        forward kernels run one program per (expert, row tile of BM rows): the map is ``cum``, the
                  inclusive cumulative count of row tiles per expert (``tile_cum``, or formed in registers from offs
                  by ``_tile_of_offs``); a program finds its expert by counting ``cum <= pid`` (``_expert_of_tile``)
                  and exits if pid is past the last tile. Grid = cdiv(M, BM) + E tiles, an upper bound of
                  sum_e cdiv(m_e, BM).
  backward        the per-row work on the same row tiles, one program per row tile (times a rank block, f slice or
                  d block), so one expert with many rows spreads over the GPU; the per-expert reductions (dW, d s) are
                  cut into row tiles or chunks of rows whose partial sums are added in a fixed order afterwards:
                  deterministic, no atomics, exact zeros for an empty expert (section "backward": ``bwd_maps``, the
                  row-tile and chunk lookups, the chunked dW kernels, the slot sums, the weight-free GLU backward
                  ``glu_bwd_epi`` and its scale sums ``glu_bwd_sred``).
  combines        forward [M, f] -> [T, f] and dX [M, d] -> [T, d] sum each target's rows in increasing row order
                  through a CSR built with a stable sort (``csr_keys`` + torch) or by ``route_place``
                  (``combine_rows``): deterministic for any top-k. ``zero_tail_rows`` zeroes the padding rows of an
                  uncombined output.
  routing         ``tsct.ops.sort_by_expert``'s stable counting sort (``route_rank``, ``route_place``).

All row offsets are int64 (M * f may pass 2^31). The kernels keep the names they were first compiled under
(``glu_bwd_*``: the GLU backward's weight-free kernels); the AOT build compiles and indexes them as the "glu" family
(``triton_glu.specs``).
"""

from __future__ import annotations

import triton
import triton.language as tl


# ---- tile map and row helpers ----------------------------------------------------------------------

@triton.jit
def _expert_of_tile(cum_ptr, pid, E, BLOCK_E: tl.constexpr):
    """Expert owning row tile ``pid``: the number of experts whose inclusive tile count is <= pid."""
    cnt = pid * 0
    for start in range(0, E, BLOCK_E):
        idx = start + tl.arange(0, BLOCK_E)
        c = tl.load(cum_ptr + idx, mask=idx < E, other=2147483647)
        cnt += tl.sum((c <= pid).to(tl.int32), axis=0)
    return cnt


@triton.jit
def _tile_of_offs(offs_ptr, cum_ptr, pid, E, WRITE, BM: tl.constexpr, BLOCK_E: tl.constexpr):
    """(expert owning row tile ``pid``, row tiles of the experts before it, row tiles in all), computed from ``offs``
    itself: the tile map ``tile_cum`` builds (inclusive count of row tiles per expert), formed in registers.
    WRITE: also store that map to ``cum_ptr`` (one program does, for the kernels after this one)."""
    cnt = pid * 0
    before = pid * 0
    carry = pid * 0
    for start in range(0, E, BLOCK_E):
        idx = start + tl.arange(0, BLOCK_E)
        m = idx < E
        hi = tl.load(offs_ptr + idx, mask=m, other=0)
        lo = tl.load(offs_ptr + idx - 1, mask=m & (idx > 0), other=0)
        n = tl.where(m, (hi - lo + BM - 1) // BM, 0)
        c = tl.cumsum(n, axis=0) + carry
        if WRITE:
            tl.store(cum_ptr + idx, c, mask=m)
        past = m & (c <= pid)  # the experts whose tiles all come before tile pid
        cnt += tl.sum(past.to(tl.int32), axis=0)
        before += tl.sum(tl.where(past, n, 0), axis=0)
        carry += tl.sum(n, axis=0)
    return cnt, before, carry


@triton.jit
def _expert_bounds(offs_ptr, e):
    lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
    hi = tl.load(offs_ptr + e)
    return lo, hi


@triton.jit
def _row_index(idx_ptr, rows, rmask, HAS_IDX: tl.constexpr):
    """int64 index of each routed row: ``idx[rows]`` (gather_idx / scatter_idx; rows outside rmask read
    nothing and get 0) when HAS_IDX, else the row itself."""
    if HAS_IDX:
        out = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    else:
        out = rows.to(tl.int64)
    return out


# ---- combine, padding rows, tile map ------------------------------------------------------------

@triton.jit
def _glu_fwd_epilogue(acc_g, acc_u, e, rows, rmask, cols, cmask, r, sg_ptr, su_ptr, rw_ptr, z_ptr, hg_ptr, hu_ptr,
                      HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr, BWD: tl.constexpr):
    """The forward's GLU on one (row tile, rank block) of both families' down kernels: acc_g = x Wg, acc_u = x Wu
    (fp32); z = silu(acc_g * sg) * (acc_u * su) stored in z's dtype. With BWD (the saving forward): hg, hu stored
    first (fp32, before the scales sg, su) and z * rw stored instead of z."""
    hmask = rmask[:, None] & cmask[None, :]
    h_off = rows.to(tl.int64)[:, None] * r + cols[None, :]
    if BWD:
        tl.store(hg_ptr + h_off, acc_g, mask=hmask)
        tl.store(hu_ptr + h_off, acc_u, mask=hmask)
    if HAS_SG:
        acc_g = acc_g * tl.load(sg_ptr + e * r + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_SU:
        acc_u = acc_u * tl.load(su_ptr + e * r + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    z = acc_g * tl.sigmoid(acc_g) * acc_u
    if BWD:
        if HAS_RW:
            z = z * tl.load(rw_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    tl.store(z_ptr + h_off, z.to(z_ptr.dtype.element_ty), mask=hmask)


@triton.jit
def combine_rows(src_ptr, order_ptr, ptr_ptr, out_ptr, offs_ptr, E, ncols, ld_src, SRC8: tl.constexpr,
                 BN: tl.constexpr, NB: tl.constexpr):
    """out[t, blk] = sum over j in [ptr[t], ptr[t+1]) of src[order[j], blk] for the rows order[j] < offs[E-1], in
    increasing j (fp32), for the NB column blocks of BN columns of program (t, pn) (at b1 one program covers a
    whole row of f = 5461). The CSR of ``glu._csr`` holds no padding row; the one ``sort_by_expert`` links to its
    token tensor keeps k entries per token, a dropped choice's padding row last (``route_place``).
    SRC8: ld_src is a multiple of 8 and src's columns [ncols, ld_src) may be read (vector loads).
    The first two rows' indices, then their values, are loaded together (top-2: one dependent chain ptr ->
    order -> src per program instead of two), later rows one by one. The sum is the sequential one bit for
    bit: acc starts as 0 + src[order[lo]] (exact, and never -0.0), and a masked-off row adds +0.0."""
    t = tl.program_id(0)
    pn = tl.program_id(1)
    lo = tl.load(ptr_ptr + t)
    hi = tl.load(ptr_ptr + t + 1)
    end = tl.load(offs_ptr + E - 1).to(tl.int64)
    r0 = tl.load(order_ptr + lo, mask=lo < hi, other=0).to(tl.int64)
    r1 = tl.load(order_ptr + lo + 1, mask=lo + 1 < hi, other=0).to(tl.int64)
    # whether each of the first two rows is summed, in every lane (Triton's interpreter rejects a scalar bool in
    # a load mask)
    zero = tl.zeros((BN,), dtype=tl.int32)
    use0 = (zero + (lo < hi).to(tl.int32) * (r0 < end).to(tl.int32)) > 0
    use1 = (zero + (lo + 1 < hi).to(tl.int32) * (r1 < end).to(tl.int32)) > 0
    if SRC8:
        ld_src = (ld_src // 8) * 8  # == ld_src; lets Triton see the multiple of 8
    for b in tl.static_range(NB):
        cols = (pn * NB + b) * BN + tl.arange(0, BN)
        cmask = cols < ncols
        if SRC8:
            lmask = cols < ld_src
        else:
            lmask = cmask
        v0 = tl.load(src_ptr + r0 * ld_src + cols, mask=lmask & use0, other=0.0).to(tl.float32)
        v1 = tl.load(src_ptr + r1 * ld_src + cols, mask=lmask & use1, other=0.0).to(tl.float32)
        acc = tl.zeros((BN,), dtype=tl.float32) + v0
        acc += v1
        for j in range(lo + 2, hi):
            row = tl.load(order_ptr + j).to(tl.int64)
            acc += tl.load(src_ptr + row * ld_src + cols, mask=lmask & ((zero + (row < end).to(tl.int32)) > 0),
                           other=0.0).to(tl.float32)
        tl.store(out_ptr + t.to(tl.int64) * ncols + cols, acc.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def zero_tail_rows(out_ptr, offs_ptr, E, M, ncols, BM: tl.constexpr, BN: tl.constexpr):
    """out[rows >= offs[E-1], :] = 0 (padding rows), for rows < M."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    start = tl.load(offs_ptr + E - 1)
    rows = pm * BM + tl.arange(0, BM)
    rmask = (rows >= start) & (rows < M)
    cols = pn * BN + tl.arange(0, BN)
    cmask = cols < ncols
    zero = tl.zeros((BM, BN), dtype=out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * ncols + cols[None, :], zero, mask=rmask[:, None] & cmask[None, :])


@triton.jit
def tile_cum(offs_ptr, cum_ptr, E, t0_ptr, t1_ptr, t2_ptr, M, W01, W2, BM: tl.constexpr, BLOCK: tl.constexpr,
             ZERO: tl.constexpr, ZBLOCK: tl.constexpr):
    """cum[e] = sum over e' <= e of cdiv(m_e', BM), int32 (the forward tile map): program 0. One launch
    instead of the five small torch ops it replaces (host time per call).
    ZERO: programs 1.. also zero the rows at or past offs[E-1] of three [M, W] arrays of 16-bit words (W01 words
    per row for t0 and t1, W2 for t2: a saving forward's hg, hu, z * rw seen as words), in the same launch."""
    pid = tl.program_id(0)
    if pid == 0:
        _tile_of_offs(offs_ptr, cum_ptr, pid, E, True, BM, BLOCK)  # writes the map (its results are not needed)
    if ZERO:
        if pid > 0:
            start_row = tl.maximum(tl.load(offs_ptr + E - 1), 0).to(tl.int64)  # never before the tensors
            step = (tl.num_programs(0) - 1).to(tl.int64) * ZBLOCK
            zero = tl.zeros((ZBLOCK,), dtype=tl.int16)
            ks = tl.arange(0, ZBLOCK)
            end01 = M.to(tl.int64) * W01
            for off in range(start_row * W01 + (pid - 1) * ZBLOCK, end01, step):
                tl.store(t0_ptr + off + ks, zero, mask=off + ks < end01)
                tl.store(t1_ptr + off + ks, zero, mask=off + ks < end01)
            end2 = M.to(tl.int64) * W2
            for off in range(start_row * W2 + (pid - 1) * ZBLOCK, end2, step):
                tl.store(t2_ptr + off + ks, zero, mask=off + ks < end2)


@triton.jit
def csr_keys(idx_ptr, offs_ptr, key_ptr, E, M, n_out, BLOCK: tl.constexpr):
    """key[i] = idx[i] for the rows i < offs[E-1], n_out (past every target) for padding rows, whose idx
    entries are never read; in key_ptr's type (int16 when n_out fits, else int32: the host decides)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < M
    live = i < tl.load(offs_ptr + E - 1)
    v = tl.load(idx_ptr + i, mask=m & live, other=0)
    tl.store(key_ptr + i, tl.where(live, v.to(tl.int32), n_out).to(key_ptr.dtype.element_ty), mask=m)


# ---- sort by expert (tsct.ops.sort_by_expert): a stable counting sort in chunks of B rows ----------
# route_rank sorts each chunk by (key, position), keeps each row's rank among its chunk's rows of the same key
# and the chunk's count per key in hist [E + 1, P] (key-major); an inclusive cumsum of hist (torch) then
# gives, per (key, chunk), the end of that chunk's rows of that key in the sorted order; route_place
# scatters. Key = expert id, or E for ids outside [0, E) (padding rows, after offs[E-1]).

@triton.jit
def _imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _route_key(v, E):
    """The sort key of expert id v: v in [0, E), else E (a padding row, after every expert)."""
    return tl.where((v >= 0) & (v < E), v, E).to(tl.int32)


@triton.jit
def route_rank(ids_ptr, srt_ptr, rank_ptr, hist_ptr, crank_ptr, M, E, P, K, B: tl.constexpr, EBLK: tl.constexpr):
    """Chunk p (rows p*B ..): srt[p*B + q] = key * B + local row of the q-th row in (key, row) order, rank[p*B + q] =
    its rank among the chunk's rows of that key; hist[key, p] = the chunk's row count of each key (0 if none).
    Lanes past M get key E + 1: sorted last, counted nowhere. crank[row] = the row's rank among its token's K
    rows in (key, choice) order, i.e. in sorted order (for the combine's CSR, ``route_place``)."""
    p = tl.program_id(0)
    q = tl.arange(0, B)
    i = p * B + q
    v = tl.load(ids_ptr + i, mask=i < M, other=0)
    key = tl.where(i < M, _route_key(v, E), E + 1)
    first = i - i % K  # the token's first row: its K ids are this row's neighbours (cached)
    c = tl.zeros((B,), dtype=tl.int32)
    for j in range(0, K):
        kj = _route_key(tl.load(ids_ptr + first + j, mask=i < M, other=0), E)
        c += ((kj < key) | ((kj == key) & (first + j < i))).to(tl.int32)
    tl.store(crank_ptr + i, c, mask=i < M)
    s = tl.sort(key * B + q)
    base = p.to(tl.int64) * B
    tl.store(srt_ptr + base + q, s)
    for e0 in range(0, E + 1, EBLK):  # this chunk's column of hist, zeroed before its counts land
        es = e0 + tl.arange(0, EBLK)
        tl.store(hist_ptr + es.to(tl.int64) * P + p, tl.zeros((EBLK,), tl.int32), mask=es <= E)
    tl.debug_barrier()  # the sorted chunk and the zeroed column are visible to the whole program
    ks = s // B
    prev = tl.load(srt_ptr + base + q - 1, mask=q > 0, other=0) // B
    nxt = tl.load(srt_ptr + base + q + 1, mask=q < B - 1, other=0) // B
    first = (q == 0) | (prev != ks)
    last = (q == B - 1) | (nxt != ks)
    rank = q - tl.associative_scan(tl.where(first, q, 0), 0, _imax)
    tl.store(rank_ptr + base + q, rank)
    tl.store(hist_ptr + ks.to(tl.int64) * P + p, rank + 1, mask=last & (ks <= E))


@triton.jit
def route_place(srt_ptr, rank_ptr, hist_ptr, cum_ptr, crank_ptr, order_ptr, token_ptr, offs_ptr, w_ptr, rw_ptr,
                rows_ptr, ptr_ptr, M, E, P, K, HAS_W: tl.constexpr, B: tl.constexpr):
    """Row p*B + local of chunk p goes to position cum[key, p] - hist[key, p] + rank: order there = the row
    (its index in the flattened [T, K] ids), token = row // K, and with HAS_W rw = w[row] in fp32 (the router
    weight of the sorted row). offs[e] = cum[e, P - 1] (rows of experts <= e).
    Also the combine's CSR over the tokens (``glu._csr``'s form, T = M // K targets of K rows each): ptr[t] = t*K,
    rows[t*K + crank[row]] = the row's position: token t's K positions in increasing order (``route_rank`` ranks
    them by (key, choice)), so a dropped choice (key E, after offs[E-1]) comes last."""
    p = tl.program_id(0)
    q = tl.arange(0, B)
    base = p.to(tl.int64) * B
    s = tl.load(srt_ptr + base + q)
    ks = s // B
    live = ks <= E
    h_at = ks.to(tl.int64) * P + p
    pos = (tl.load(cum_ptr + h_at, mask=live, other=0) - tl.load(hist_ptr + h_at, mask=live, other=0)
           + tl.load(rank_ptr + base + q)).to(tl.int64)
    row = base + s % B
    tok = row // K
    tl.store(order_ptr + pos, row, mask=live)
    tl.store(token_ptr + pos, tok, mask=live)
    if HAS_W:
        tl.store(rw_ptr + pos, tl.load(w_ptr + row, mask=live, other=0.0).to(tl.float32), mask=live)
    tl.store(rows_ptr + tok * K + tl.load(crank_ptr + row, mask=live, other=0), pos, mask=live)
    tl.store(ptr_ptr + tok, tok * K, mask=live & (row == tok * K))
    tl.store(ptr_ptr + M // K + q, tl.zeros((B,), dtype=tl.int64) + M, mask=base + q == 0)  # ptr[T] = M
    for e0 in range(p * B, E, P * B):
        es = e0 + q
        tl.store(offs_ptr + es, tl.load(cum_ptr + es.to(tl.int64) * P + P - 1, mask=es < E, other=0), mask=es < E)


# ---- backward -----------------------------------------------------------------------------------
# Row kernels (glu_bwd_dz, glu_bwd_epi, glu_bwd_dx_dw; lowbit_bwd_dz, lowbit_bwd_dx_dw) run one program per row tile,
# numbered expert-major (``_bwd_tile``): program e < E holds expert e's first row tile, found without a search (at b1
# every tile there is), programs E, E + 1, ... the further tiles of the experts of several tiles (``maps`` row 3). An
# expert's reductions over rows (dW, d s) are made in a fixed order and never depend on how the GPU schedules the
# programs:
#   d s       each row tile writes its partial sums ([tiles, r]); glu_bwd_sred adds an expert's tiles in order.
#   dW        an expert of at most one row tile (at b1 almost all of them; exact zeros for an empty one) gets its dW
#             from the row kernel that holds its first tile (glu_bwd_dz: dWd; glu_bwd_dx_dw: dWg, dWu), in the same
#             loop as the rest of that tile's work, as a per-expert kernel would. Every expert of several tiles is
#             cut into chunks of CH rows (``maps`` row 1: chunks per expert); glu_bwd_dwd / glu_bwd_dw sum a
#             chunk's row tiles in order; an expert of one chunk stores its dW directly, an expert of several
#             chunks stores each chunk's fp32 sum in a workspace slot (``maps`` row 2: slots per expert) and
#             bwd_slot_reduce adds the slots in chunk order. The result depends on CH (a host choice from the
#             shape: runtime.chunk_size) and on nothing else.

@triton.jit
def _find_expert(cum_ptr, pid, E, BLOCK_E: tl.constexpr):
    """Owner of item ``pid`` (a row tile, chunk or slot) under ``cum``, the non-decreasing inclusive item counts per
    expert: the number of experts whose count is <= pid (E when pid is past the last item). A program past the last
    item learns it from one load (the grids are upper bounds: at b1 nearly every program of the chunked kernels is
    one); below it, up to BLOCK_E experts one vector load (``_expert_of_tile``), more a binary search (log2 E
    dependent loads, not E / BLOCK_E vector loads in every program)."""
    if pid >= tl.load(cum_ptr + E - 1):
        res = pid * 0 + E
    elif E <= BLOCK_E:
        res = _expert_of_tile(cum_ptr, pid, E, BLOCK_E)
    else:
        lo = pid * 0
        hi = lo + E
        while lo < hi:
            mid = (lo + hi) // 2
            le = tl.load(cum_ptr + mid) <= pid
            lo = tl.where(le, mid + 1, lo)
            hi = tl.where(le, hi, mid)
        res = lo
    return res


@triton.jit
def _bwd_tile(xcum_ptr, pid, E, BLOCK_E: tl.constexpr):
    """(expert, tile index within the expert) of backward row program ``pid``: program e < E holds expert e's first
    row tile (a tile of no rows for an empty expert), no search; program E + j the j-th further tile, under ``xcum``
    (the inclusive counts per expert of the tiles past its first, ``bwd_maps`` row 3). Expert E past the last one."""
    if pid < E:
        e = pid
        t = pid * 0
    else:
        j = pid - E
        e = _find_expert(xcum_ptr, j, E, BLOCK_E)
        t = j + 1 - tl.load(xcum_ptr + e - 1, mask=e > 0, other=0)
    return e, t


@triton.jit
def _bwd_rows(offs_ptr, e, t, BM: tl.constexpr):
    """First row of tile ``t`` of expert ``e`` (e < E), the end of the expert's rows, and whether the expert has at
    most one tile (that tile then holds all its rows, none for an empty expert: its dW needs no other program)."""
    lo, hi = _expert_bounds(offs_ptr, e)
    return lo + t * BM, hi, (hi - lo) <= BM


@triton.jit
def _chunk_rows(offs_ptr, ccum_ptr, scum_ptr, e, pid, CH):
    """Rows [clo, chi) of chunk ``pid`` of expert ``e`` (chunk map ``ccum``, CH rows per chunk), whether it is the
    expert's only chunk, and its workspace slot (``scum``: only experts of several chunks have slots)."""
    lo, hi = _expert_bounds(offs_ptr, e)
    c = pid - tl.load(ccum_ptr + e - 1, mask=e > 0, other=0)
    clo = lo + c * CH
    chi = tl.minimum(clo + CH, hi)
    single = (hi - lo) <= CH
    slot = tl.load(scum_ptr + e - 1, mask=e > 0, other=0) + c
    return clo, chi, single, slot


@triton.jit
def _bwd_counts(offs_ptr, idx, m, CH, BM: tl.constexpr):
    """Per expert ``idx`` (where ``m``, else 0), from its rows n = offs[e] - offs[e-1] clamped at 0: row tiles
    cdiv(n, BM), chunks of the chunked dW kernels (0 if n <= BM: the row kernels' dW, else cdiv(n, CH)), workspace
    slots (cdiv(n, CH) if that is >= 2, else 0) and row tiles past the expert's first (max(cdiv(n, BM) - 1, 0))."""
    hi = tl.load(offs_ptr + idx, mask=m, other=0)
    lo = tl.load(offs_ptr + idx - 1, mask=m & (idx > 0), other=0)
    n = tl.where(m, tl.maximum(hi - lo, 0), 0)
    t = (n + BM - 1) // BM
    k = (n + CH - 1) // CH
    return t, tl.where(n <= BM, 0, k), tl.where(k >= 2, k, 0), tl.maximum(t - 1, 0)


@triton.jit
def bwd_maps(offs_ptr, maps_ptr, E, CH, BM: tl.constexpr, BLOCK: tl.constexpr, CARRY: tl.constexpr):
    """The backward's four maps from offs, int32 [4, E], each the inclusive cumulative count over the experts of
    ``_bwd_counts``'s four counts:
      row 0  row tiles                              (the forward's tile map: the low-bit recompute's)
      row 1  chunks of the chunked dW kernels
      row 2  workspace slots
      row 3  row tiles past the expert's first      (the backward row kernels' tile map)
    Program p writes experts [p BLOCK, (p + 1) BLOCK): its carry is the sum of the counts of the experts before it,
    taken in steps of CARRY experts (sums only: no dependence between programs, and at E 16384 the last program
    reads its 15,360 predecessors in 4 steps instead of the 15 block scans one program would chain)."""
    pid = tl.program_id(0)
    start = pid * BLOCK
    ct = pid * 0
    cc = pid * 0
    cs = pid * 0
    cx = pid * 0
    for s in range(0, start, CARRY):
        idx = s + tl.arange(0, CARRY)
        t, c, k, x = _bwd_counts(offs_ptr, idx, idx < start, CH, BM)
        ct += tl.sum(t, axis=0)
        cc += tl.sum(c, axis=0)
        cs += tl.sum(k, axis=0)
        cx += tl.sum(x, axis=0)
    idx = start + tl.arange(0, BLOCK)
    m = idx < E
    t, c, k, x = _bwd_counts(offs_ptr, idx, m, CH, BM)
    tl.store(maps_ptr + idx, tl.cumsum(t, axis=0) + ct, mask=m)
    tl.store(maps_ptr + E + idx, tl.cumsum(c, axis=0) + cc, mask=m)
    tl.store(maps_ptr + 2 * E + idx, tl.cumsum(k, axis=0) + cs, mask=m)
    tl.store(maps_ptr + 3 * E + idx, tl.cumsum(x, axis=0) + cx, mask=m)


@triton.jit
def _item_range(n_items, P):
    """Items [lo, hi) of this program of P when n_items are cut into contiguous ranges (the chunked kernels: a
    range's consecutive items mostly share a chunk, so a program looks its chunk up once per chunk)."""
    per = (n_items + P - 1) // P
    lo = tl.minimum(tl.program_id(0) * per, n_items)
    return lo, tl.minimum(lo + per, n_items)


@triton.jit
def _chunk_of_item(offs_ptr, maps_ptr, c, cp, e, clo, chi, single, slot, E, CH, BLOCK_E: tl.constexpr):
    """(expert, rows [clo, chi), only chunk of its expert, workspace slot) of chunk ``c``: looked up when ``c`` is not
    ``cp`` (the chunk of the previous item), else the previous item's values."""
    if c != cp:
        e = _find_expert(maps_ptr + E, c, E, BLOCK_E)
        clo, chi, single, slot = _chunk_rows(offs_ptr, maps_ptr + E, maps_ptr + 2 * E, e, c, CH)
    return e, clo, chi, single, slot


@triton.jit
def glu_bwd_dwd(
    dy_ptr, sidx_ptr, offs_ptr, maps_ptr, zw_ptr, dwd_ptr, ws_ptr,
    E, r, f, f_slice, n_fs, CH,
    HAS_SCATTER: tl.constexpr, WD_T: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """dWd of the experts the row kernel leaves out (more than one row tile). Work items (chunk of the chunk map
    (``maps`` row 1), rank block, f slice), in contiguous ranges over the programs (a bounded grid: at b1 there is no
    item, at Zipf 1.2 a few thousand): acc[ranks, slice] = (z*rw)^T dY over the chunk's row tiles in order (fp32),
    stored to dWd (in its layout: K-major with WD_T) when the chunk is its expert's only one, else to the chunk's
    workspace slot (``ws``: one [r*f] block per slot, in dWd's element order), which ``bwd_slot_reduce`` adds up."""
    nrb = (r + BR - 1) // BR
    per_chunk = nrb * n_fs
    lo, hi = _item_range(tl.load(maps_ptr + 2 * E - 1) * per_chunk, tl.num_programs(0))
    ns = tl.arange(0, BN)
    bm = tl.arange(0, BM)
    cp = lo * 0 - 1
    e = lo * 0
    clo = e
    chi = e
    slot = e
    single = cp > 0
    for i in range(lo, hi):
        c = i // per_chunk
        e, clo, chi, single, slot = _chunk_of_item(offs_ptr, maps_ptr, c, cp, e, clo, chi, single, slot, E, CH,
                                                   BLOCK_E)
        cp = c
        pr = (i % per_chunk) // n_fs
        fs = i % n_fs
        n_t = (chi - clo + BM - 1) // BM
        cols = pr * BR + tl.arange(0, BR)
        cmask = cols < r
        n_lo = fs * f_slice
        n_hi = tl.minimum(n_lo + f_slice, f)
        h_tile = bm[:, None] * r + cols[None, :]
        out_base = dwd_ptr + e.to(tl.int64) * r * f
        ws_base = ws_ptr + slot.to(tl.int64) * r * f
        for n in range(n_lo, n_hi, BN):
            nmask = (n + ns) < n_hi
            acc = tl.zeros((BR, BN), dtype=tl.float32)
            for t in range(0, n_t):
                row0 = clo + t * BM
                rows = row0 + bm
                rmask = rows < chi
                dst = _row_index(sidx_ptr, rows, rmask, HAS_SCATTER)
                zt = tl.load(zw_ptr + row0.to(tl.int64) * r + h_tile, mask=rmask[:, None] & cmask[None, :],
                             other=0.0)
                dy = tl.load(dy_ptr + (dst * f)[:, None] + (n + ns)[None, :], mask=rmask[:, None] & nmask[None, :],
                             other=0.0)
                acc = tl.dot(tl.trans(zt), dy, acc)
            omask = cmask[:, None] & nmask[None, :]
            if WD_T:  # dWd's element order within an expert (int32 [BR, BN]), made here: not live over the row loop
                o_tile = cols[:, None] + (n + ns)[None, :] * r
            else:
                o_tile = cols[:, None] * f + (n + ns)[None, :]
            if single:
                tl.store(out_base + o_tile, acc.to(dwd_ptr.dtype.element_ty), mask=omask)
            else:
                tl.store(ws_base + o_tile, acc, mask=omask)


@triton.jit
def bwd_slot_reduce(ws_ptr, maps_ptr, out_ptr, E, S, NCB, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    """out[e, :S] = sum over the expert's workspace slots, in chunk order, of ws[slot, :S] (fp32, rounded once to
    out's dtype), for the experts of several chunks (``maps`` row 2). Work items (slot, column group of NCB) in
    contiguous ranges over the programs; the n slots x NCB groups of an expert share its column blocks of BLOCK
    elements round robin (item k * NCB + cb of the expert, k its slot, takes blocks k * NCB + cb, + n * NCB, ...), so
    a hot expert's reduction spreads over as many items as it has slots times NCB; every element still sums the
    slots in chunk order."""
    scum = maps_ptr + 2 * E
    lo, hi = _item_range(tl.load(scum + E - 1) * NCB, tl.num_programs(0))
    ks = tl.arange(0, BLOCK)
    for i in range(lo, hi):
        j = i // NCB
        e = _find_expert(scum, j, E, BLOCK_E)
        first = tl.load(scum + e - 1, mask=e > 0, other=0)
        n = tl.load(scum + e) - first
        unit = (j - first) * NCB + i % NCB
        ws_e = ws_ptr + first.to(tl.int64) * S
        out_e = out_ptr + e.to(tl.int64) * S
        for c0 in range(unit * BLOCK, S, n * NCB * BLOCK):
            cm = (c0 + ks) < S
            pc = ws_e + c0 + ks
            acc = tl.load(pc, mask=cm, other=0.0)
            for c in range(1, n):  # the next slot: a pointer step (c * S may pass 2^31)
                pc += S
                acc += tl.load(pc, mask=cm, other=0.0)
            tl.store(out_e + c0 + ks, acc.to(out_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _glu_bwd_tile(dz0, pid, pr, e, rows, rmask, cols, cmask, h_off, hg_ptr, hu_ptr, sg_ptr, su_ptr, rw_ptr, dhg_ptr,
                  dhu_ptr, dsgp_ptr, dsup_ptr, drw_ptr, M, r,
                  HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr):
    """The GLU backward of row program ``pid`` (rank block ``pr``) of expert ``e`` from its complete dz0 [BM, BR]
    (fp32, the up projection's input gradient before the row weight): d rw (this rank block's part, row ``pr`` of
    ``drw``), dhg = dg*sg, dhu = du*su, and (HAS_SG) the tile's partial sums of d sg, d su over its rows ([tiles, r]
    by program id, summed per expert by ``glu_bwd_sred``). ``h_off``: the tile's [BM, BR] offsets into the [M, r]
    buffers. Called by ``glu_bwd_epi`` (dz0 summed from f-slice partials) and by a dz kernel of one f slice."""
    hmask = rmask[:, None] & cmask[None, :]
    hg = tl.load(hg_ptr + h_off, mask=hmask, other=0.0)
    hu = tl.load(hu_ptr + h_off, mask=hmask, other=0.0)
    g = hg
    u = hu
    if HAS_SG:
        sg = tl.load(sg_ptr + e * r + cols, mask=cmask, other=0.0).to(tl.float32)
        g = hg * sg[None, :]
    if HAS_SU:
        su = tl.load(su_ptr + e * r + cols, mask=cmask, other=0.0).to(tl.float32)
        u = hu * su[None, :]
    sig = tl.sigmoid(g)
    silu_g = g * sig
    tl.store(drw_ptr + pr.to(tl.int64) * M + rows, tl.sum(dz0 * (silu_g * u), axis=1), mask=rmask)
    if HAS_RW:
        dz0 = dz0 * tl.load(rw_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    dg = dz0 * u * sig * (1.0 + g * (1.0 - sig))
    du = dz0 * silu_g
    if HAS_SG:
        p_off = pid.to(tl.int64) * r + cols
        tl.store(dsgp_ptr + p_off, tl.sum(dg * hg, axis=0), mask=cmask)
        tl.store(dsup_ptr + p_off, tl.sum(du * hu, axis=0), mask=cmask)
        dg = dg * sg[None, :]
    if HAS_SU:
        du = du * su[None, :]
    tl.store(dhg_ptr + h_off, dg.to(dhg_ptr.dtype.element_ty), mask=hmask)
    tl.store(dhu_ptr + h_off, du.to(dhu_ptr.dtype.element_ty), mask=hmask)


@triton.jit
def glu_bwd_epi(
    hg_ptr, hu_ptr, part_ptr, offs_ptr, xcum_ptr, sg_ptr, su_ptr, rw_ptr, dhg_ptr, dhu_ptr, dsgp_ptr, dsup_ptr,
    drw_ptr, E, M, r, n_fs, part_stride,
    HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One program per (row tile, rank block): dz0 = sum of the f-slice partials (fixed order), then the GLU
    backward (``_glu_bwd_tile``); none for an empty expert's tile."""
    pid = tl.program_id(0)
    pr = tl.program_id(1)
    e, t = _bwd_tile(xcum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    row0, hi, one = _bwd_rows(offs_ptr, e, t, BM)
    if row0 >= hi:  # an empty expert's tile: no rows
        return
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    bm = tl.arange(0, BM)
    rows = row0 + bm
    rmask = rows < hi
    hmask = rmask[:, None] & cmask[None, :]
    h_off = row0.to(tl.int64) * r + bm[:, None] * r + cols[None, :]
    dz0 = tl.zeros((BM, BR), dtype=tl.float32)
    pp = part_ptr + h_off
    for i in range(0, n_fs):  # the f-slice partials, always in the same order
        dz0 += tl.load(pp, mask=hmask, other=0.0)
        pp += part_stride
    _glu_bwd_tile(dz0, pid, pr, e, rows, rmask, cols, cmask, h_off, hg_ptr, hu_ptr, sg_ptr, su_ptr, rw_ptr, dhg_ptr,
                  dhu_ptr, dsgp_ptr, dsup_ptr, drw_ptr, M, r, HAS_SG, HAS_SU, HAS_RW)


@triton.jit
def glu_bwd_sred(dsgp_ptr, dsup_ptr, offs_ptr, xcum_ptr, dsg_ptr, dsu_ptr, E, r, BR: tl.constexpr):
    """One program per (expert, rank block): d sg[e], d su[e] = the sums of the expert's row-tile partials
    (glu_bwd_epi, by program id: its first tile's at e, its further tiles' at E + xcum[e-1] ...) in tile order;
    exact zeros for an empty expert."""
    e = tl.program_id(0)
    pr = tl.program_id(1)
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    lo, hi = _expert_bounds(offs_ptr, e)
    x0 = tl.load(xcum_ptr + e - 1, mask=e > 0, other=0)
    x1 = tl.load(xcum_ptr + e)
    accg = tl.zeros((BR,), dtype=tl.float32)
    accu = tl.zeros((BR,), dtype=tl.float32)
    if hi > lo:
        p_off = e.to(tl.int64) * r + cols
        accg += tl.load(dsgp_ptr + p_off, mask=cmask, other=0.0)
        accu += tl.load(dsup_ptr + p_off, mask=cmask, other=0.0)
        pg = dsgp_ptr + (E + x0).to(tl.int64) * r + cols
        pu = dsup_ptr + (E + x0).to(tl.int64) * r + cols
        for t in range(x0, x1):
            accg += tl.load(pg, mask=cmask, other=0.0)
            accu += tl.load(pu, mask=cmask, other=0.0)
            pg += r
            pu += r
    tl.store(dsg_ptr + e * r + cols, accg, mask=cmask)
    tl.store(dsu_ptr + e * r + cols, accu, mask=cmask)


@triton.jit
def glu_bwd_dw(
    x_ptr, gidx_ptr, offs_ptr, maps_ptr, dhg_ptr, dhu_ptr, dwg_ptr, dwu_ptr, wsg_ptr, wsu_ptr,
    E, d, r, stride_x, CH,
    HAS_GATHER: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """dWg / dWu of the experts the row kernel leaves out (more than one row tile). Work items (chunk of the chunk
    map (``maps`` row 1), d block), in contiguous ranges over the programs: X^T dhg, X^T dhu over the chunk's row
    tiles in order (fp32), every rank block, stored to dWg / dWu when the chunk is its expert's only one, else to the
    chunk's workspace slots (one [d*r] block per slot in wsg / wsu, dW's element order), which ``bwd_slot_reduce``
    adds up. Shared by triton_lowbit (X^T dh does not involve the factors)."""
    nd = (d + BD - 1) // BD
    lo, hi = _item_range(tl.load(maps_ptr + 2 * E - 1) * nd, tl.num_programs(0))
    cp = lo * 0 - 1
    e = lo * 0
    clo = e
    chi = e
    slot = e
    single = cp > 0
    for i in range(lo, hi):
        c = i // nd
        e, clo, chi, single, slot = _chunk_of_item(offs_ptr, maps_ptr, c, cp, e, clo, chi, single, slot, E, CH,
                                                   BLOCK_E)
        cp = c
        n_t = (chi - clo + BM - 1) // BM
        d0 = (i % nd) * BD
        if single:
            _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, dwg_ptr, dwu_ptr, e.to(tl.int64) * d * r + d0 * r, clo, chi,
                      n_t, d0, d, r, stride_x, HAS_GATHER, BM, BD, BR)
        else:
            _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, wsg_ptr, wsu_ptr, slot.to(tl.int64) * d * r + d0 * r, clo,
                      chi, n_t, d0, d, r, stride_x, HAS_GATHER, BM, BD, BR)


# ---- dW of w_gate / w_up, shared by glu_bwd_dx_dw / glu_bwd_dw and triton_lowbit's lowbit_bwd_dx_dw ---------------
# (X^T dh does not involve the factors, so it is the same for every factor format)

@triton.jit
def _one_tile_dh(gidx_ptr, dhg_ptr, dhu_ptr, lo, hi, r, h_tile, HAS_GATHER: tl.constexpr, BM: tl.constexpr,
                 BR: tl.constexpr):
    """A row tile starting at row ``lo`` (its rows < hi) whose rank fits one block (r <= BR): its row mask, source
    rows of x, rank mask and dhg / dhu tiles [BM, BR] (0 outside the masks)."""
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    rows = lo + bm
    rmask = rows < hi
    src = _row_index(gidx_ptr, rows, rmask, HAS_GATHER)
    rm = rs < r
    hmask = rmask[:, None] & rm[None, :]
    hg = tl.load(dhg_ptr + lo.to(tl.int64) * r + h_tile, mask=hmask, other=0.0)
    hu = tl.load(dhu_ptr + lo.to(tl.int64) * r + h_tile, mask=hmask, other=0.0)
    return rmask, src, rm, hg, hu


@triton.jit
def _dw_zero(dwg_ptr, dwu_ptr, w_e, d_lo, d_hi, r, BLK: tl.constexpr):
    """dWg / dWu[e][d_lo:d_hi, :] = 0 (an empty expert's gradient: one contiguous run of (d_hi - d_lo) * r elements
    at ``w_e + d_lo * r``; no row, no factor, no product)."""
    i = tl.arange(0, BLK)
    zero = tl.zeros((BLK,), dtype=dwg_ptr.dtype.element_ty)
    for j in range(d_lo * r, d_hi * r, BLK):
        m = (j + i) < d_hi * r
        tl.store(dwg_ptr + w_e + j + i, zero, mask=m)
        tl.store(dwu_ptr + w_e + j + i, zero, mask=m)


@triton.jit
def _dw_one_tile(x_ptr, src, rmask, rm, hg, hu, dwg_ptr, dwu_ptr, w_e, d0, d, r, stride_x, BD: tl.constexpr,
                 BR: tl.constexpr):
    """dWg / dWu[e][d0:d0 + BD, :r] = X^T hg / X^T hu for the one row tile of ``_one_tile_dh``; ``w_e``: int64
    offset of expert e in dWg / dWu ([E, d, r])."""
    dl = tl.arange(0, BD)
    rs = tl.arange(0, BR)
    dm = (d0 + dl) < d
    xt = tl.load(x_ptr + (src * stride_x + d0)[:, None] + dl[None, :], mask=rmask[:, None] & dm[None, :], other=0.0)
    xT = tl.trans(xt)
    w_off = w_e + d0 * r + dl[:, None] * r + rs[None, :]
    wmask = dm[:, None] & rm[None, :]
    tl.store(dwg_ptr + w_off, tl.dot(xT, hg).to(dwg_ptr.dtype.element_ty), mask=wmask)
    tl.store(dwu_ptr + w_off, tl.dot(xT, hu).to(dwu_ptr.dtype.element_ty), mask=wmask)


@triton.jit
def _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, outg_ptr, outu_ptr, o_base, lo, hi, n_tiles, d0, d, r, stride_x,
              HAS_GATHER: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """outg / outu[o_base + i*r + k] = (X^T dhg / X^T dhu)[d0 + i, k] over rows [lo, hi) in ``n_tiles`` row tiles
    in order (fp32 sums, rounded once to the output's dtype; exact zeros for no rows), rank block by rank block;
    ``o_base``: int64 offset of [e, d0, 0] of dW (or of a workspace slot's block at d0)."""
    dl = tl.arange(0, BD)
    dm = (d0 + dl) < d
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    h_tile = bm[:, None] * r + rs[None, :]     # int32 [BM, BR]
    w_tile = dl[:, None] * r + rs[None, :]     # int32 [BD, BR]
    for rb in range(0, r, BR):
        rm = (rb + rs) < r
        accg = tl.zeros((BD, BR), dtype=tl.float32)
        accu = tl.zeros((BD, BR), dtype=tl.float32)
        for t in range(0, n_tiles):
            row0 = lo + t * BM
            rows = row0 + bm
            rmask = rows < hi
            src = _row_index(gidx_ptr, rows, rmask, HAS_GATHER)
            xt = tl.load(x_ptr + (src * stride_x + d0)[:, None] + dl[None, :], mask=rmask[:, None] & dm[None, :],
                         other=0.0)
            hmask = rmask[:, None] & rm[None, :]
            h_base = row0.to(tl.int64) * r + rb
            hg = tl.load(dhg_ptr + h_base + h_tile, mask=hmask, other=0.0)
            hu = tl.load(dhu_ptr + h_base + h_tile, mask=hmask, other=0.0)
            xT = tl.trans(xt)
            accg = tl.dot(xT, hg, accg)
            accu = tl.dot(xT, hu, accu)
        wmask = dm[:, None] & rm[None, :]
        tl.store(outg_ptr + o_base + rb + w_tile, accg.to(outg_ptr.dtype.element_ty), mask=wmask)
        tl.store(outu_ptr + o_base + rb + w_tile, accu.to(outu_ptr.dtype.element_ty), mask=wmask)
