"""Triton sources of the W4A4 (NVFP4 x NVFP4) grouped GLU kernels. Host side: ``w4a4.py``.

NVFP4 here is decision 0002's format: E2M1 codes two per byte (even element in the LOW nibble, which
is also ``tl.dot_scaled``'s packing), one UE4M3 block scale per 16 consecutive K elements in the
LINEAR layout (``[rows, K/16]``, which is exactly the ``[M, K/16]`` / ``[N, K/16]`` shape that
``tl.dot_scaled`` takes), one fp32 ENCODE scale per matrix (decode divides by it).

Activations: each routed row is quantized with the 0002 recipe taking ONE ROW as the "matrix", i.e.
its second-level scale is per row: s_row = 2688 / amax(row) (1 if the row is zero, <= FLT_MAX).
Kernels:

  nvfp4_quant_rows   x [M, K] (bf16/fp16/fp32, row stride stride_x) -> codes [M, K/2] u8, linear
                     block scales [M, K/16] (UE4M3 bytes), s_row [M] fp32. Two passes over each row
                     tile (row amax, then quantize) so any K (multiple of 16) is served by one variant.
                     Bit-identical to ``tsct.quant.nvfp4._quantize_blocks_torch`` on the [M, 1, K] view
                     with s_enc = ``nvfp4_encode_scale`` per row (tests/cpu/test_triton_w4a4.py).
  w4a4_down_fwd      the down-projection on NVFP4 x rows (the quantizer's output for the token-major x,
                     gathered per routed row through gather_idx) and NVFP4 w_gate / w_up (codes [E, r, d/2]:
                     K = d is the 16-element block dimension, linear scales [E, r, d/16], encode scales [E]):
                     acc_g = sum_k xq*sfx * wq*sfw in ``tl.dot_scaled`` (fp32), hg = acc_g * alpha_g with
                     alpha_g = 1 / (s_row * s_wg[e]) (same for up), then s_gate / s_up per rank and the
                     SiLU-GLU: z [M, r] in z's dtype; SAVE (training) also writes hg, hu fp32 and z*rw.
  w4a4_up_fwd        y[rows, :f] = (sum_k zq*sfz * wq*sfw) * alpha_row, alpha_row = rw / (s_row * s_w[e])
                     (alpha = 1 / (s_row * s_w[e]) without row weights): the up-projection z @ w_down
                     on NVFP4 z (per-row scales above) and NVFP4 w_down (codes [E, f, r/2], linear
                     scales [E, f, r/16], encode scales [E]); ``tl.dot_scaled`` with e2m1 operands and
                     float8e4nv scales (native OMMA.SF...UE4M3.4X on sm_120a, bf16 emulation on sm_90a),
                     fp32 accumulation; f masked (f = 5461 is odd).

Schedule: the forward tile map of ``tsct.kernels.triton_glu`` (``cum`` = inclusive cumulative row
tiles per expert, built on the device; a program finds its expert by counting ``cum <= pid``; grid =
cdiv(M, BM) + E, an upper bound): no host reads, graph-capturable. Rows past offs[-1] are not
written by ``w4a4_up_fwd`` (the host zeroes them, as the bf16 path does).
"""

from __future__ import annotations

import triton
import triton.language as tl

# the forward tile map of the bf16 kernels, reused as is (the AOT build registers triton_glu/_kernels.py
# under this name before loading this module by path)
from tsct.kernels.triton_glu._kernels import _expert_bounds, _expert_of_tile, _row_index  # noqa: F401


# ---- activation quantizer (decision 0002 recipe, one row = one matrix) ----------------------------

@triton.jit
def _ue4m3_rne(v):
    """fp32 v in [0, 448] rounded to the nearest UE4M3 value, ties to even, as fp32. Done in integer /
    exact fp32 arithmetic rather than by the fp32 -> fp8 cast: Triton 3.9's interpreter rounds that cast's
    ties away from zero (336 -> 352; cvt.rn.satfinite on the GPU gives 320), and sm_80 has no such cvt.
    Normal range (v >= 2^-6): round the fp32 mantissa to 3 bits (RNE bias trick). Subnormal range:
    (v + 2^14) - 2^14 rounds to a multiple of 2^-9 (the fp32 ulp at 2^14), RNE by the FPU."""
    bits = v.to(tl.int32, bitcast=True)
    rb = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576          # -1048576 == 0xFFF00000
    normal = rb.to(tl.float32, bitcast=True)
    sub = (v + 16384.0) - 16384.0
    return tl.where(v >= 0.015625, normal, sub)


@triton.jit
def nvfp4_quant_rows(
    x_ptr, codes_ptr, sf_ptr, senc_ptr,
    M, K, stride_x,
    BM: tl.constexpr, BK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    x_row = rows64 * stride_x
    ks = tl.arange(0, BK)
    # pass 1: amax over the row's finite elements (0002 step 1)
    amax = tl.zeros((BM,), dtype=tl.float32)
    for k in range(0, K, BK):
        m = rmask[:, None] & ((k + ks) < K)[None, :]
        x = tl.load(x_ptr + x_row[:, None] + (k + ks)[None, :], mask=m, other=0.0).to(tl.float32)
        ax = tl.abs(x)
        ax = tl.where(ax < float("inf"), ax, 0.0)  # nan compares false, inf is excluded: finite only
        amax = tl.maximum(amax, tl.max(ax, axis=1))
    # step 2: s_enc = 1 if amax == 0 else min(2688 / amax, FLT_MAX), a true division
    num = tl.full((BM,), 2688.0, tl.float32)
    s = tl.minimum(tl.math.div_rn(num, tl.where(amax == 0.0, 1.0, amax)), 3.4028234663852886e38)
    s = tl.where(amax == 0.0, 1.0, s)
    tl.store(senc_ptr + rows, s, mask=rmask)
    # pass 2: blocks of 16 (steps 3-6)
    kh = tl.arange(0, BK // 2)
    kb = tl.arange(0, BK // 16)
    c_row = rows64 * (K // 2)
    s_row = rows64 * (K // 16)
    for k in range(0, K, BK):
        m = rmask[:, None] & ((k + ks) < K)[None, :]
        x = tl.load(x_ptr + x_row[:, None] + (k + ks)[None, :], mask=m, other=0.0).to(tl.float32)
        xb = tl.reshape(x, (BM, BK // 16, 16))
        axb = tl.abs(xb)
        finite = axb < float("inf")
        bad = tl.max((~finite).to(tl.int32), axis=2) > 0                      # [BM, BK/16]
        bamax = tl.max(tl.where(finite, axb, 0.0), axis=2)
        six = tl.full((BM, BK // 16), 6.0, tl.float32)
        sf32 = tl.minimum(tl.math.div_rn(bamax * s[:, None], six), 448.0)
        sfv = _ue4m3_rne(sf32)                      # exactly representable in UE4M3 from here on
        sf = sfv.to(tl.float8e4nv)                  # exact conversion (no rounding left to do)
        y = tl.math.div_rn(xb * s[:, None, None], tl.broadcast_to(sfv[:, :, None], (BM, BK // 16, 16)))
        ay = tl.abs(y)  # nan (zero block scale) gives magnitude 0 below; it is forced to 0 anyway
        mag = ((ay > 0.25).to(tl.int32) + (ay >= 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)
               + (ay >= 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay >= 3.5).to(tl.int32)
               + (ay > 5.0).to(tl.int32))
        mag = tl.where(sfv[:, :, None] == 0.0, 0, mag)
        sign = (xb.to(tl.int32, bitcast=True) >> 31) & 1                      # signbit(x), never of y
        code = mag | (sign << 3)
        code = tl.where(bad[:, :, None], 0, code)
        lo, hi = tl.split(tl.reshape(code, (BM, BK // 2, 2)))
        byte = (lo | (hi << 4)).to(tl.uint8)
        sfb = tl.where(bad, 0x7F, sf.to(tl.uint8, bitcast=True).to(tl.int32)).to(tl.uint8)
        hmask = rmask[:, None] & ((k // 2 + kh) < K // 2)[None, :]
        tl.store(codes_ptr + c_row[:, None] + (k // 2 + kh)[None, :], byte, mask=hmask)
        bmask = rmask[:, None] & ((k // 16 + kb) < K // 16)[None, :]
        tl.store(sf_ptr + s_row[:, None] + (k // 16 + kb)[None, :], sfb, mask=bmask)


# ---- down-projection: hg, hu = (xq @ wq_g[e]), (xq @ wq_u[e]), SiLU-GLU -> z --------------------------

@triton.jit
def w4a4_down_fwd(
    xc_ptr, xs_ptr, xg_ptr, gidx_ptr, offs_ptr, cum_ptr, gc_ptr, gs_ptr, gg_ptr, uc_ptr, us_ptr, ug_ptr,
    sg_ptr, su_ptr, rw_ptr, z_ptr, zw_ptr, hg_ptr, hu_ptr,
    E, d, r,
    HAS_GATHER: tl.constexpr, HAS_S: tl.constexpr, HAS_RW: tl.constexpr, SAVE: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One program per (row tile, rank block pr): z[rows, ranks] of the GLU with both down-projections in
    W4A4. xc [T, d/2] u8, xs [T, d/16] fp8e4nv, xg [T] fp32: the NVFP4 rows of x (row src = gidx[row] with
    HAS_GATHER, else the routed row itself); gc/uc [E, r, d/2] u8, gs/us [E, r, d/16] fp8e4nv, gg/ug [E] fp32;
    sg, su [E, r] fp32 (HAS_S: both); rw [M] fp32 (SAVE and HAS_RW). Outputs: z [M, r]; SAVE: hg, hu [M, r]
    fp32 (x_hat @ W_hat, s not applied: what ``glu_bwd_epi`` reads) and zw = z * rw [M, r] in z's dtype
    (what ``lowbit_bwd_dz`` reads). d: a multiple of 16 (the NVFP4 block); the K tail of a BK step is masked
    (codes and scales 0: products 0). Rows past offs[-1] are not written."""
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
    src = _row_index(gidx_ptr, rows, rmask, HAS_GATHER)
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    dh = d // 2
    ds = d // 16
    kh = tl.arange(0, BK // 2)
    kb = tl.arange(0, BK // 16)
    xc_row = src * dh
    xs_row = src * ds
    # factor tiles: codes as [BK/2, BR] (K-major columns: each rank's d/2 bytes are contiguous), scales [BR, BK/16]
    w_c = cols.to(tl.int64)[None, :] * dh + kh[:, None]
    w_s = cols.to(tl.int64)[:, None] * ds + kb[None, :]
    gc_base = gc_ptr + e64 * r * dh
    uc_base = uc_ptr + e64 * r * dh
    gs_base = gs_ptr + e64 * r * ds
    us_base = us_ptr + e64 * r * ds
    acc_g = tl.zeros((BM, BR), dtype=tl.float32)
    acc_u = tl.zeros((BM, BR), dtype=tl.float32)
    for k in range(0, d, BK):
        kmh = (k // 2 + kh) < dh
        kmb = (k // 16 + kb) < ds
        a = tl.load(xc_ptr + xc_row[:, None] + (k // 2 + kh)[None, :], mask=rmask[:, None] & kmh[None, :], other=0)
        sa = tl.load(xs_ptr + xs_row[:, None] + (k // 16 + kb)[None, :], mask=rmask[:, None] & kmb[None, :],
                     other=0.0)
        bmask = kmh[:, None] & cmask[None, :]
        smask = cmask[:, None] & kmb[None, :]
        bg = tl.load(gc_base + k // 2 + w_c, mask=bmask, other=0)
        sbg = tl.load(gs_base + k // 16 + w_s, mask=smask, other=0.0)
        bu = tl.load(uc_base + k // 2 + w_c, mask=bmask, other=0)
        sbu = tl.load(us_base + k // 16 + w_s, mask=smask, other=0.0)
        acc_g = tl.dot_scaled(a, sa, "e2m1", bg, sbg, "e2m1", acc_g)
        acc_u = tl.dot_scaled(a, sa, "e2m1", bu, sbu, "e2m1", acc_u)
    # epilogue: the two second-level scales per row and factor, alpha = 1 / (s_row * s_w[e]) (true division)
    s_row = tl.load(xg_ptr + src, mask=rmask, other=1.0)
    one = tl.full((BM,), 1.0, tl.float32)
    hg = acc_g * tl.math.div_rn(one, s_row * tl.load(gg_ptr + e))[:, None]
    hu = acc_u * tl.math.div_rn(one, s_row * tl.load(ug_ptr + e))[:, None]
    hmask = rmask[:, None] & cmask[None, :]
    h_off = rows.to(tl.int64)[:, None] * r + cols[None, :]
    if SAVE:
        tl.store(hg_ptr + h_off, hg, mask=hmask)
        tl.store(hu_ptr + h_off, hu, mask=hmask)
    if HAS_S:
        hg = hg * tl.load(sg_ptr + e * r + cols, mask=cmask, other=0.0)[None, :]
        hu = hu * tl.load(su_ptr + e * r + cols, mask=cmask, other=0.0)[None, :]
    z = hg * tl.sigmoid(hg) * hu
    tl.store(z_ptr + h_off, z.to(z_ptr.dtype.element_ty), mask=hmask)
    if SAVE:
        if HAS_RW:
            z = z * tl.load(rw_ptr + rows, mask=rmask, other=0.0)[:, None]
        tl.store(zw_ptr + h_off, z.to(zw_ptr.dtype.element_ty), mask=hmask)


# ---- up-projection: y = (zq @ wq[e]^T) * alpha_row -------------------------------------------------

@triton.jit
def w4a4_up_fwd(
    zc_ptr, zs_ptr, zg_ptr, offs_ptr, cum_ptr, wc_ptr, ws_ptr, wg_ptr, rw_ptr, y_ptr,
    E, r, f, ldy, fsplit,
    HAS_RW: tl.constexpr, SINGLE_K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One program per (row tile, column stripe pn): y[rows, n-blocks pn, pn + fsplit, ...].
    zc [M, r/2] u8, zs [M, r/16] fp8e4nv, zg [M] fp32 (per-row encode scales); wc [E, f, r/2] u8,
    ws [E, f, r/16] fp8e4nv, wg [E] fp32; rw [M] fp32; y [M, ldy]. BK: K elements per step (>= 64)."""
    pid = tl.program_id(0)
    pn = tl.program_id(1)
    e = _expert_of_tile(cum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    lo, hi = _expert_bounds(offs_ptr, e)
    tiles_before = tl.load(cum_ptr + e - 1, mask=e > 0, other=0)
    row0 = lo + (pid - tiles_before) * BM
    bm = tl.arange(0, BM)
    rows = row0 + bm
    rmask = rows < hi
    rh = r // 2
    rs = r // 16
    # epilogue factor per row: alpha = rw / (s_row * s_w[e]) (true division), or 1 / (...)
    zg = tl.load(zg_ptr + rows, mask=rmask, other=1.0)
    wg = tl.load(wg_ptr + e)
    if HAS_RW:
        num = tl.load(rw_ptr + rows, mask=rmask, other=0.0)
    else:
        num = tl.full((BM,), 1.0, tl.float32)
    alpha = tl.math.div_rn(num, zg * wg)
    kh = tl.arange(0, BK // 2)
    kb = tl.arange(0, BK // 16)
    ns = tl.arange(0, BN)
    zc_base = zc_ptr + row0.to(tl.int64) * rh
    zs_base = zs_ptr + row0.to(tl.int64) * rs
    wc_base = wc_ptr + e.to(tl.int64) * f * rh
    ws_base = ws_ptr + e.to(tl.int64) * f * rs
    y_base = y_ptr + row0.to(tl.int64) * ldy
    y_tile = bm[:, None] * ldy + ns[None, :]
    if SINGLE_K:  # the whole rank in one step (r <= BK): the z tile is loaded once
        a = tl.load(zc_base + bm[:, None] * rh + kh[None, :], mask=rmask[:, None] & (kh < rh)[None, :], other=0)
        sa = tl.load(zs_base + bm[:, None] * rs + kb[None, :], mask=rmask[:, None] & (kb < rs)[None, :], other=0.0)
    for n in range(pn * BN, f, fsplit * BN):
        cols = n + ns
        cmask = cols < f
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if SINGLE_K:
            b = tl.load(wc_base + cols.to(tl.int64)[None, :] * rh + kh[:, None],
                        mask=(kh < rh)[:, None] & cmask[None, :], other=0)                 # [BK/2, BN]
            sb = tl.load(ws_base + cols.to(tl.int64)[:, None] * rs + kb[None, :],
                         mask=cmask[:, None] & (kb < rs)[None, :], other=0.0)             # [BN, BK/16]
            acc = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)
        else:
            for k in range(0, r, BK):
                kmh = (k // 2 + kh) < rh
                kmb = (k // 16 + kb) < rs
                a = tl.load(zc_base + bm[:, None] * rh + (k // 2 + kh)[None, :], mask=rmask[:, None] & kmh[None, :],
                            other=0)
                sa = tl.load(zs_base + bm[:, None] * rs + (k // 16 + kb)[None, :],
                             mask=rmask[:, None] & kmb[None, :], other=0.0)
                b = tl.load(wc_base + cols.to(tl.int64)[None, :] * rh + (k // 2 + kh)[:, None],
                            mask=kmh[:, None] & cmask[None, :], other=0)
                sb = tl.load(ws_base + cols.to(tl.int64)[:, None] * rs + (k // 16 + kb)[None, :],
                             mask=cmask[:, None] & kmb[None, :], other=0.0)
                acc = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)
        acc = acc * alpha[:, None]
        tl.store(y_base + n + y_tile, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
