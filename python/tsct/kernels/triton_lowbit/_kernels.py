"""Triton sources of the low-bit grouped GLU (path "triton-lowbit", issue 4): W4A16 / sign-A16.

Same schedule, tiles and notation as ``tsct.kernels.triton_glu._kernels`` (read that docstring
first); the difference is how a factor tile reaches ``tl.dot``. Each factor has a constexpr format
and three pointers (storage: ``docs/decisions/0002-nvfp4-recipe.md``; logical shape [E, K, N],
stored K-contiguous):

    FMT 0  dense     p0 = w [E, K, N] (x.dtype)
    FMT 1  NVFP4     p0 = codes u8 [E, N, K/2] (even k in the low nibble), p1 = block scales as raw
                     UE4M3 bytes u8 [E, N, K/16] (linear layout), p2 = s_enc f32 [E]
    FMT 2  sign      p0 = bits u8 [E, N, K/8] (k%8 = bit, 1 = negative), p1 = a f32 [E, K],
                     p2 = b f32 [E, N]

Decode happens in registers (``_w_tile``): the packed bytes of a [BN, BK] tile are loaded, expanded
and scaled, transposed to [BK, BN] and cast to the activation dtype for ``tl.dot``. Neither global
nor shared memory ever holds a decoded copy (Triton may stage the *packed* bytes; the decoded tile is
an operand of the dot). Per-expert / per-column factors are applied outside the dot, exactly:

    NVFP4  W = (e2m1 * sf) / s_enc.  The tile holds e2m1 * sf (<= 6 significant bits: EXACT in bf16),
           the accumulator is divided by s_enc[e] afterwards (``_w_scalar``). So the product is
           (x @ (e2m1*sf)) / s_enc: no bf16 rounding of the decoded weight at all, and in fp32 the same
           value as x @ W_hat up to accumulation order.
    sign   W = (+-1 * a[k]) * b[n].  The tile holds +-a[k] (a select, no multiply), rounded once to the
           dot dtype (the reference rounds (+-a)*b once: same error size); b[n] multiplies the
           accumulator's columns (``_w_cols``), or, for the transposed product dY @ W^T, the
           columns of the left operand before the dot.

Everything else (the GLU epilogue, row weights, gather, int64 row offsets, empty experts, padding)
is the bf16 kernels' code, unchanged. The weight-free backward kernel (``glu_bwd_epi``) and the
combines are the bf16 path's own kernels, launched from ``glu.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tsct.kernels.triton_glu._kernels import _expert_bounds, _expert_of_tile

DENSE, NVFP4, SIGN = 0, 1, 2


# ---- decode helpers ------------------------------------------------------------------------------

@triton.jit
def _e2m1(c):
    """4-bit E2M1 code (int32, 0..15) -> fp32: magnitude index m in bits 2..0, sign bit 3.
    m >= 2: 2^((m >> 1) - 1) * (1 + (m & 1) / 2) built as fp32 bits; m < 2: m / 2. Exact."""
    m = c & 7
    big = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    v = tl.where(m >= 2, big.to(tl.float32, bitcast=True), m.to(tl.float32) * 0.5)
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def _ue4m3(b):
    """float8_e4m3fn byte (int32, 0..255) -> fp32, exact: normal 2^(e-7) (1 + m/8), subnormal m 2^-9,
    0x7F / 0xFF NaN (0002: the NaN block scale of a non-finite block)."""
    ex = (b >> 3) & 15
    man = b & 7
    norm = ((ex + 120) << 23) | (man << 20)
    v = tl.where(ex > 0, norm.to(tl.float32, bitcast=True), man.to(tl.float32) * 0.001953125)
    v = tl.where((b & 127) == 127, float("nan"), v)
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def _w_tile(FMT: tl.constexpr, p0, p1, e64, k0, K, N, ns, nmask, BK: tl.constexpr, BN: tl.constexpr):
    """Tile W[e, k0:k0+BK, ns] as [BK, BN]: the transpose of ``_w_tile_nk``."""
    return tl.trans(_w_tile_nk(FMT, p0, p1, e64, k0, K, N, ns, nmask, BK, BN))


@triton.jit
def _w_tile_nk(FMT: tl.constexpr, p0, p1, e64, k0, K, N, ns, nmask, BK: tl.constexpr, BN: tl.constexpr):
    """Tile W[e, k0:k0+BK, ns]^T as [BN, BK] (storage order; masked entries 0): dense in its own dtype;
    NVFP4 as fp32 e2m1*sf (no 1/s_enc: ``_w_scalar``); sign as fp32 +-a[k] (no b[n]: ``_w_cols``).
    k0 is a multiple of BK, and BK of 16 (NVFP4) or 8 (sign)."""
    ks = k0 + tl.arange(0, BK)
    kmask = ks < K
    if FMT == 0:
        w = tl.load(p0 + e64 * K * N + ks[None, :] * N + ns[:, None], mask=kmask[None, :] & nmask[:, None],
                    other=0.0)
    elif FMT == 1:
        k2 = K // 2
        hs = k0 // 2 + tl.arange(0, BK // 2)
        byt = tl.load(p0 + e64 * N * k2 + ns[:, None] * k2 + hs[None, :], mask=nmask[:, None] & (hs < k2)[None, :],
                      other=0).to(tl.int32)                                   # [BN, BK/2]
        v = tl.join(_e2m1(byt & 15), _e2m1(byt >> 4))                        # [BN, BK/2, 2]: even k low nibble
        v = tl.reshape(v, (BN, BK // 16, 16))
        k16 = K // 16
        bs = k0 // 16 + tl.arange(0, BK // 16)
        sb = tl.load(p1 + e64 * N * k16 + ns[:, None] * k16 + bs[None, :], mask=nmask[:, None] & (bs < k16)[None, :],
                     other=0).to(tl.int32)                                    # [BN, BK/16]
        w = tl.reshape(v * _ue4m3(sb)[:, :, None], (BN, BK))
    else:
        k8 = K // 8
        bs = k0 // 8 + tl.arange(0, BK // 8)
        byt = tl.load(p0 + e64 * N * k8 + ns[:, None] * k8 + bs[None, :], mask=nmask[:, None] & (bs < k8)[None, :],
                      other=0).to(tl.int32)                                   # [BN, BK/8]
        bit = (byt[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1         # LSB first
        bit = tl.reshape(bit, (BN, BK))
        a = tl.load(p1 + e64 * K + ks, mask=kmask, other=0.0)
        w = tl.where(bit != 0, -a[None, :], a[None, :])
    return w


@triton.jit
def _w_scalar(FMT: tl.constexpr, acc, p2, e):
    """NVFP4: acc / s_enc[e] (the second-level scale, once per output element); else acc."""
    if FMT == 1:
        acc = acc / tl.load(p2 + e)
    return acc


@triton.jit
def _w_cols(FMT: tl.constexpr, t, p2, e64, N, ns, nmask):
    """sign: t[:, j] * b[e, ns[j]] (columns over the factor's N); else t."""
    if FMT == 2:
        t = t * tl.load(p2 + e64 * N + ns, mask=nmask, other=0.0)[None, :]
    return t


# ---- forward ------------------------------------------------------------------------------------

@triton.jit
def lowbit_down_fwd(
    x_ptr, gidx_ptr, offs_ptr, cum_ptr, g0, g1, g2, u0, u1, u2, sg_ptr, su_ptr, z_ptr, hg_ptr, hu_ptr, rw_ptr,
    E, d, r, stride_x,
    FMT_G: tl.constexpr, FMT_U: tl.constexpr,
    HAS_GATHER: tl.constexpr, HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr,
    BWD: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_down_fwd`` with w_gate / w_up in any format (decoded in registers).
    hg, hu (BWD) are x @ W_hat exactly as the bf16 kernel's (second-level scales applied, s not)."""
    pid = tl.program_id(0)
    pr = tl.program_id(1)
    e = _expert_of_tile(cum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    e64 = e.to(tl.int64)
    lo, hi = _expert_bounds(offs_ptr, e)
    tiles_before = tl.load(cum_ptr + e - 1, mask=e > 0, other=0)
    rows = lo + (pid - tiles_before) * BM + tl.arange(0, BM)
    rmask = rows < hi
    if HAS_GATHER:
        src = tl.load(gidx_ptr + rows, mask=rmask, other=0).to(tl.int64)
    else:
        src = rows.to(tl.int64)
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    ks = tl.arange(0, BK)
    x_row = src * stride_x
    # swapped operands: acc^T [BR, BM] = W^T [BR, BK] @ x^T [BK, BM], so the decoded factor tile is
    # the A operand, which tensor cores (wgmma, mma.sync) take from registers; x goes the usual way
    acc_g = tl.zeros((BR, BM), dtype=tl.float32)
    acc_u = tl.zeros((BR, BM), dtype=tl.float32)
    for k in range(0, d, BK):
        kmask = (k + ks) < d
        a = tl.load(x_ptr + x_row[None, :] + (k + ks)[:, None], mask=rmask[None, :] & kmask[:, None], other=0.0)
        wg = _w_tile_nk(FMT_G, g0, g1, e64, k, d, r, cols, cmask, BK, BR).to(a.dtype)
        wu = _w_tile_nk(FMT_U, u0, u1, e64, k, d, r, cols, cmask, BK, BR).to(a.dtype)
        acc_g = tl.dot(wg, a, acc_g)
        acc_u = tl.dot(wu, a, acc_u)
    acc_g = tl.trans(acc_g)
    acc_u = tl.trans(acc_u)
    acc_g = _w_cols(FMT_G, _w_scalar(FMT_G, acc_g, g2, e), g2, e64, r, cols, cmask)
    acc_u = _w_cols(FMT_U, _w_scalar(FMT_U, acc_u, u2, e), u2, e64, r, cols, cmask)
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
def lowbit_up_fwd(
    z_ptr, offs_ptr, cum_ptr, d0, d1, d2, rw_ptr, y_ptr,
    E, r, f, ldy,
    FMT_D: tl.constexpr, HAS_RW: tl.constexpr, SINGLE_K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_up_fwd`` (FSPLIT 1) with w_down in any format: y[rows, :f] = (z Wd_hat[e]) * rw.
    Packed w_down rows are K-contiguous ([f, r/2] or [f, r/8] bytes), so the odd f no longer
    misaligns the factor loads (only y's stores)."""
    pid = tl.program_id(0)
    e = _expert_of_tile(cum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    e64 = e.to(tl.int64)
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
    y_base = y_ptr + row0.to(tl.int64) * ldy
    y_tile = bm[:, None] * ldy + ns[None, :]
    # swapped operands (see lowbit_down_fwd): y^T [BN, BM] = Wd^T [BN, BK] (decoded, A) @ z^T [BK, BM]
    if SINGLE_K:  # the whole rank fits one K step: load the z tile once
        zt = tl.load(z_base + bm[None, :] * r + ks[:, None], mask=rmask[None, :] & (ks < r)[:, None], other=0.0)
    for n in range(0, f, BN):
        cols = n + ns
        cmask = cols < f
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        if SINGLE_K:
            acc = tl.dot(_w_tile_nk(FMT_D, d0, d1, e64, 0, r, f, cols, cmask, BK, BN).to(zt.dtype), zt, acc)
        else:
            for k in range(0, r, BK):
                kmask = (k + ks) < r
                a = tl.load(z_base + bm[None, :] * r + (k + ks)[:, None], mask=rmask[None, :] & kmask[:, None],
                            other=0.0)
                acc = tl.dot(_w_tile_nk(FMT_D, d0, d1, e64, k, r, f, cols, cmask, BK, BN).to(a.dtype), a, acc)
        acc = tl.trans(acc)
        acc = _w_cols(FMT_D, _w_scalar(FMT_D, acc, d2, e), d2, e64, f, cols, cmask)
        if HAS_RW:
            acc = acc * rw[:, None]
        tl.store(y_base + n + y_tile, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


# ---- backward -----------------------------------------------------------------------------------

@triton.jit
def lowbit_bwd_dz(
    dy_ptr, sidx_ptr, offs_ptr, d0, d1, d2, zw_ptr, part_ptr, dwd_ptr,
    M, r, f, f_slice,
    FMT_D: tl.constexpr, HAS_SCATTER: tl.constexpr, DO_DWD: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
):
    """``triton_glu.glu_bwd_dz`` with w_down in any format: part[fs, rows, ranks] = dY[:, slice] Wd_hat^T.
    dWd (DO_DWD) is the gradient w.r.t. the DECODED factor, (z*rw)^T dY, dense [E, r, f]: the STE
    gradient of a master factor (glu.py). Sign: b[n] scales dY's columns before the dot; NVFP4:
    1/s_enc scales each partial."""
    e = tl.program_id(0)
    pr = tl.program_id(1)
    fs = tl.program_id(2)
    e64 = e.to(tl.int64)
    lo, hi = _expert_bounds(offs_ptr, e)
    n_tiles = (hi - lo + BM - 1) // BM
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    ns = tl.arange(0, BN)
    bm = tl.arange(0, BM)
    n_lo = fs * f_slice
    n_hi = tl.minimum(n_lo + f_slice, f)
    dwd_base = dwd_ptr + e64 * r * f
    wd_tile = cols[:, None] * f + ns[None, :]             # int32 [BR, BN] (dense dWd)
    h_tile = bm[:, None] * r + cols[None, :]              # int32 [BM, BR]
    part_base = part_ptr + fs.to(tl.int64) * M * r
    for t in range(0, n_tiles):
        row0 = lo + t * BM
        rows = row0 + bm
        rmask = rows < hi
        hmask = rmask[:, None] & cmask[None, :]
        if HAS_SCATTER:
            dst = tl.load(sidx_ptr + rows, mask=rmask, other=0).to(tl.int64)
        else:
            dst = rows.to(tl.int64)
        dy_row = dst * f
        zw = tl.load(zw_ptr + row0.to(tl.int64) * r + h_tile, mask=hmask, other=0.0)
        dz = tl.zeros((BR, BM), dtype=tl.float32)  # swapped: dz^T = Wd[ranks, slice] (decoded, A) @ dY^T
        for n in range(n_lo, n_hi, BN):
            nmask = (n + ns) < n_hi
            dy = tl.load(dy_ptr + dy_row[:, None] + (n + ns)[None, :], mask=rmask[:, None] & nmask[None, :], other=0.0)
            w = _w_tile(FMT_D, d0, d1, e64, pr * BR, r, f, n + ns, nmask, BR, BN)  # [BR, BN]
            dys = _w_cols(FMT_D, dy, d2, e64, f, n + ns, nmask).to(dy.dtype)
            dz = tl.dot(w.to(dy.dtype), tl.trans(dys), dz)
            if DO_DWD:
                if n_tiles == 1:
                    dwd = tl.dot(tl.trans(zw), dy)
                    tl.store(dwd_base + n + wd_tile, dwd.to(dwd_ptr.dtype.element_ty),
                             mask=cmask[:, None] & nmask[None, :])
        dz = _w_scalar(FMT_D, tl.trans(dz), d2, e)
        tl.store(part_base + row0.to(tl.int64) * r + h_tile, dz, mask=hmask)
    if DO_DWD:
        if n_tiles != 1:  # zero or several row tiles: dWd = sum over tiles of (z*rw)^T dY
            for n in range(n_lo, n_hi, BN):
                nmask = (n + ns) < n_hi
                acc = tl.zeros((BR, BN), dtype=tl.float32)
                for t in range(0, n_tiles):
                    row0 = lo + t * BM
                    rows = row0 + bm
                    rmask = rows < hi
                    if HAS_SCATTER:
                        dst = tl.load(sidx_ptr + rows, mask=rmask, other=0).to(tl.int64)
                    else:
                        dst = rows.to(tl.int64)
                    zt = tl.load(zw_ptr + row0.to(tl.int64) * r + h_tile, mask=rmask[:, None] & cmask[None, :],
                                 other=0.0)
                    dy = tl.load(dy_ptr + (dst * f)[:, None] + (n + ns)[None, :],
                                 mask=rmask[:, None] & nmask[None, :], other=0.0)
                    acc = tl.dot(tl.trans(zt), dy, acc)
                tl.store(dwd_base + n + wd_tile, acc.to(dwd_ptr.dtype.element_ty), mask=cmask[:, None] & nmask[None, :])


@triton.jit
def lowbit_bwd_dx_dw(
    x_ptr, gidx_ptr, offs_ptr, g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr,
    d, r, stride_x,
    FMT_G: tl.constexpr, FMT_U: tl.constexpr,
    HAS_GATHER: tl.constexpr, DO_DX: tl.constexpr, DO_DW: tl.constexpr,
    BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
):
    """``triton_glu.glu_bwd_dx_dw`` with w_gate / w_up in any format: dx_routed = dhg Wg_hat^T + dhu Wu_hat^T
    (decoded in registers); dWg / dWu (DO_DW) are the dense gradients w.r.t. the decoded factors
    (X^T dh), the STE gradients of master factors."""
    e = tl.program_id(0)
    pd = tl.program_id(1)
    e64 = e.to(tl.int64)
    lo, hi = _expert_bounds(offs_ptr, e)
    n_tiles = (hi - lo + BM - 1) // BM
    d0 = pd * BD
    dl = tl.arange(0, BD)
    dm = (d0 + dl) < d
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    w_base = e64 * d * r + d0 * r
    h_tile = bm[:, None] * r + rs[None, :]     # int32 [BM, BR]
    if DO_DW:
        w_tile = dl[:, None] * r + rs[None, :]     # int32 [BD, BR]
        for rb in range(0, r, BR):
            rm = (rb + rs) < r
            accg = tl.zeros((BD, BR), dtype=tl.float32)
            accu = tl.zeros((BD, BR), dtype=tl.float32)
            for t in range(0, n_tiles):
                row0 = lo + t * BM
                rows = row0 + bm
                rmask = rows < hi
                if HAS_GATHER:
                    src = tl.load(gidx_ptr + rows, mask=rmask, other=0).to(tl.int64)
                else:
                    src = rows.to(tl.int64)
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
            tl.store(dwg_ptr + w_base + rb + w_tile, accg.to(dwg_ptr.dtype.element_ty), mask=wmask)
            tl.store(dwu_ptr + w_base + rb + w_tile, accu.to(dwu_ptr.dtype.element_ty), mask=wmask)
    if DO_DX:
        dx_tile = bm[:, None] * d + dl[None, :]    # int32 [BM, BD]
        for t in range(0, n_tiles):
            row0 = lo + t * BM
            rmask = (row0 + bm) < hi
            h_row = row0.to(tl.int64) * r
            accg = tl.zeros((BD, BM), dtype=tl.float32)  # swapped: dx^T = W[dblk, ranks] (decoded, A) @ dh^T
            accu = tl.zeros((BD, BM), dtype=tl.float32)
            for rb in range(0, r, BR):
                rm = (rb + rs) < r
                hmask = rmask[:, None] & rm[None, :]
                hg = tl.load(dhg_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
                hu = tl.load(dhu_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
                wg = _w_tile(FMT_G, g0, g1, e64, d0, d, r, rb + rs, rm, BD, BR)   # [BD, BR]
                wu = _w_tile(FMT_U, u0, u1, e64, d0, d, r, rb + rs, rm, BD, BR)
                hgs = _w_cols(FMT_G, hg, g2, e64, r, rb + rs, rm).to(hg.dtype)
                hus = _w_cols(FMT_U, hu, u2, e64, r, rb + rs, rm).to(hu.dtype)
                accg = tl.dot(wg.to(hg.dtype), tl.trans(hgs), accg)
                accu = tl.dot(wu.to(hu.dtype), tl.trans(hus), accu)
            acc = tl.trans(_w_scalar(FMT_G, accg, g2, e) + _w_scalar(FMT_U, accu, u2, e))
            tl.store(dx_ptr + row0.to(tl.int64) * d + d0 + dx_tile, acc.to(dx_ptr.dtype.element_ty),
                     mask=rmask[:, None] & dm[None, :])
