"""Triton sources of the low-bit grouped GLU (path "triton-lowbit"): W4A16 / sign-A16 / W8A16 / ternary-A16.

Same schedule, tiles and notation as the bf16 family (``tsct.kernels.triton_common._kernels``: the schedule,
``tsct.kernels.triton_glu._kernels``: the GLU; read those docstrings first); the difference is how a factor tile
reaches ``tl.dot``. Each factor has a constexpr format and three pointers (storage:
``docs/decisions/0002-nvfp4-recipe.md``; logical shape [E, K, N], stored K-contiguous):

    FMT 0  dense     p0 = w [E, K, N] (x.dtype)
    FMT 1  NVFP4     p0 = codes u8 [E, N, K/2] (even k in the low nibble), p1 = block scales as raw
                     UE4M3 bytes u8 [E, N, K/16] (linear layout), p2 = s_enc f32 [E]
    FMT 2  sign      p0 = bits u8 [E, N, K/8] (k%8 = bit, 1 = negative), p1 = a f32 [E, K],
                     p2 = b f32 [E, N]
    FMT 3  fp8       p0 = E4M3 ("fn") codes as raw bytes u8 [E, N, K], p2 = scale_n f32 [E, N]
                     (docs/decisions/0021-fp8-format.md; p1 unread)
    FMT 4  ternary   p0 = 2-bit codes u8 [E, N, K/4] (k%4 = bit pair, 00 = 0, 01 = +1, 11 = -1, 10 = NaN),
                     p2 = scale_n f32 [E, N] (absmean scaling; p1 unread; docs/decisions/0022-ternary-format.md)
    FMT 5  ternary   as FMT 4 with the rank-1 scaling: p1 = scale_k f32 [E, K]

Decode happens in registers (``_w_tile``): the packed words / bytes of a [BN, BK] tile are loaded,
expanded with constant shifts and masks into fp32 bit patterns (no selects, no conversions: 4-5
instructions per element; NVFP4 tiles for a bf16 product go straight to bf16, two codes per shift and
mask: ``_e2m1_pair``), scaled, joined back into k order, rounded to the activation dtype and transposed
for ``tl.dot``. Global memory never holds a decoded copy. Shared memory (TTGIR of the b1 variants, Triton 3.9):
on sm_100a the forward kernels hand the decoded tile to tcgen05 through tensor memory (no shared copy); on
sm_120 lowbit_up_fwd (PLANES: aligned r in 33..64) decodes byte planes straight into the mma.sync operand
registers (``_w_plane``, the z tile read in the same planes: ``_x_plane``), and so does lowbit_down_fwd's opt-in
PLANES variant (x split into the planes in registers: ``_t_planes``; off by default: slower on an H200 running
mma.sync); a CPU test checks the TTGIR of both. Everywhere else (lowbit_down_fwd by default, the backward kernels,
every kernel on sm_90a, where the forward runs the CUDA kernels instead) the joined tile passes
through a tile-sized shared-memory scratch on its way to the dot-operand register layout (Triton's
convert_layout: STS.128 + LDSM). That scratch is how the warps of a program share one decode: a backward decoding
in the operand registers instead (NVFP4 half planes) made every warp decode the whole tile, 6-9x slower
(docs/performance.md). Per-expert / per-column factors are applied outside the dot, exactly:

    NVFP4  W = (e2m1 * sf) / s_enc.  The tile holds e2m1 * sf * 2^-8 (<= 6 significant bits: EXACT in
           bf16), the accumulator is multiplied by 2^8 / s_enc[e] afterwards (``_w_scalar``). So the
           product is (x @ (e2m1*sf)) / s_enc: no bf16 rounding of the decoded weight at all, and in fp32
           the same value as x @ W_hat up to accumulation order (and an ulp for the reciprocal).
    sign   W = (+-1 * a[k]) * b[n].  The tile holds +-a[k] (the bit xor-ed into a's sign), rounded once to the
           dot dtype (the reference rounds (+-a)*b once: same error size); b[n] multiplies the
           accumulator's columns (``_w_cols``), or, for the transposed product dY @ W^T, the
           columns of the left operand before the dot.
    fp8    W = e4m3 * scale_n[n].  The tile holds e4m3 (exact in bf16), decoded by bits (no fp8 conversion
           instruction, so any arch and Triton's interpreter): for a bf16 product two bytes per shift and mask
           straight to a bf16 pair (``_e4m3_pair``), else to fp32 (``_ue4m3``); scale_n is sign's b (``_w_cols``).
    ternary  W = q * scale_n[n] (FMT 4) or (q * scale_k[k]) * scale_n[n] (FMT 5), q in {-1, 0, +1}. The tile
           holds q (exact; for a bf16 product two codes per shift and mask straight to bf16: ``_ternary_pair``) or
           q * scale_k[k] (rounded once, as sign's +-a); scale_n is sign's b (``_w_cols``).
    A NaN code (fp8 0x7F / 0xFF, ternary 0b10) decodes to NaN in the tile, as the reference's decode.

Everything else (the GLU epilogue, row weights, gather, int64 row offsets, empty experts, padding)
is the bf16 kernels' code, unchanged. The weight-free kernels (the tile map, the combines, the padding zeroing,
the backward epilogue ``glu_bwd_epi`` and the chunked dW kernels) are ``tsct.kernels.triton_common``'s, launched from
``glu.py`` through ``triton_common.runtime``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tsct.kernels.triton_common._kernels import (_bwd_rows, _bwd_tile, _dw_one_tile, _dw_store, _dw_zero,
                                                _expert_bounds,
                                                _expert_of_tile, _glu_bwd_tile, _glu_fwd_epilogue, _one_tile_dh,
                                                _row_index)

DENSE, NVFP4, SIGN, FP8, TERNARY, TERNARY_R1 = 0, 1, 2, 3, 4, 5


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
    0x7F / 0xFF NaN (0002: the NaN block scale of a non-finite block). The sign bit is or-ed into the fp32 bits
    (a negation compiles to 0 - v, which reads 0x80 as +0 where torch reads -0)."""
    ex = (b >> 3) & 15
    man = b & 7
    norm = ((ex + 120) << 23) | (man << 20)
    v = tl.where(ex > 0, norm.to(tl.float32, bitcast=True), man.to(tl.float32) * 0.001953125)
    v = tl.where((b & 127) == 127, float("nan"), v)
    return (v.to(tl.uint32, bitcast=True) | ((b & 128).to(tl.uint32) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_pair(p):
    """Two float8_e4m3fn bytes (bits 0..7 and 16..23 of each uint32) -> the two values in bf16, exact: the
    magnitude bits go to bf16 bits 10..4 and the sign to bit 15 of each half, which reads as e4m3 * 2^-120 (a bf16
    subnormal for the subnormal codes: Triton's multiply does not flush them, as ``_e2m1_pair``), so one multiply
    by 2^120 gives e4m3; a NaN code (magnitude 0x7F, the only one whose magnitude + 1 carries into bit 7) gets the
    exponent bits all set first, so it stays NaN. Returns (low byte's value, high byte's value)."""
    t = ((p & 0x007F007F) + 0x00010001) >> 7
    bits = ((p << 4) & 0x07F007F0) | ((p << 8) & 0x80008000) | ((t & 0x00010001) * 0x7FC0)
    lo = (bits & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return lo * 1.329227995784916e+36, hi * 1.329227995784916e+36


@triton.jit
def _e2m1_w(wrd, J: tl.constexpr, sfw):
    """Nibble J of each uint32 word (E2M1: sign bit 3, magnitude bits 2..0) times ``sfw`` = sf * 2^118
    (the word's block scale, fp32; <= 448 * 2^118 < 2^127): the magnitude bits go to fp32 bits 24..22 and
    the sign to bit 31, which reads as e2m1 * 2^-126 (an fp32 subnormal for the codes 0 and 0.5; Triton's
    fp32 multiply does not flush them), so one multiply gives e2m1 * sf * 2^-8: exact (<= 6 significant
    bits, >= 2^-18: a normal bf16). The 2^-8 goes back with 1/s_enc (``_inv_senc``)."""
    if J <= 5:
        mag = (wrd << (22 - 4 * J)) & 0x01C00000
    else:
        mag = (wrd >> (4 * J - 22)) & 0x01C00000
    sgn = ((wrd << (28 - 4 * J)) >> 31) << 31
    return (mag | sgn).to(tl.float32, bitcast=True) * sfw


@triton.jit
def _e2m1_pair(wrd, J: tl.constexpr, sfb):
    """Nibbles J and J + 4 (J < 4) of each uint32 word, decoded together into bf16 (``_e2m1_w`` on two
    codes at once: they sit 16 bits apart, as two bf16 halves of a word do): one shift and mask place
    both magnitudes at bf16 bits 8..6 and one shift and mask both signs at bits 15 / 31, which read as
    e2m1 * 2^-126 (bf16 has fp32's exponent range; the code 0.5 is a bf16 subnormal); one multiply by
    ``sfb`` = sf * 2^118 (bf16, exact: 4 significant bits) gives e2m1 * sf * 2^-8, exact (<= 6
    significant bits, >= 2^-18). Returns (element J, element J + 4), each [BN, BK/8] bf16."""
    if J <= 1:
        mag = (wrd << (6 - 4 * J)) & 0x01C001C0
    else:
        mag = (wrd >> (4 * J - 6)) & 0x01C001C0
    pair = mag | ((wrd << (12 - 4 * J)) & 0x80008000)
    lo = (pair & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (pair >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return lo * sfb, hi * sfb


@triton.jit
def _sign_w(byt, ap, bmask, J: tl.constexpr):
    """Bit J of each sign byte applied to a[8 i + J] (fp32): +-a as fp32 bits, a [BK/8] per byte column."""
    a = tl.load(ap + J, mask=bmask, other=0.0).to(tl.uint32, bitcast=True)
    return (a[None, :] ^ ((byt << (31 - J)) >> 31 << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _ternary_w(byt, J: tl.constexpr):
    """Bit pair J of each ternary byte (an integer 0..255) -> fp32 {-1, 0, +1}, NaN for the code 0b10: the low bit
    gives the magnitude's fp32 bits (1.0), the high bit the sign (bit 31 of a uint32: no signed shift overflow)."""
    c = ((byt >> (2 * J)) & 3).to(tl.uint32)
    v = (((c & 1) * 0x3F800000) | ((c >> 1) << 31)).to(tl.float32, bitcast=True)
    return tl.where(c == 2, float("nan"), v)


@triton.jit
def _ternary_pair(byt, J: tl.constexpr):
    """Bit pairs J and J + 2 (J < 2) of each ternary byte (uint32, 0..255), decoded together into bf16: a copy of
    the byte 12 bits up puts code J + 2 16 bits above code J, as two bf16 halves of a word; the low bit gives the
    magnitude's bits (1.0 = 0x3F80), the high bit the sign, and the code 0b10 (high bit without low bit) the
    exponent bits too, so it reads NaN. Returns (code J's value, code J + 2's value), exact, no arithmetic."""
    q = ((byt | (byt << 12)) >> (2 * J)) & 0x00030003
    hi_bit = (q >> 1) & 0x00010001
    bits = ((q & 0x00010001) * 0x3F80) | (hi_bit << 15) | ((hi_bit & ~q) * 0x7FC0)
    lo = (bits & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    hi = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _join4(v0, v1, v2, v3, BN: tl.constexpr, BK: tl.constexpr):
    """[BN, BK/4] x 4 (element j of group i) -> [BN, BK] with k = 4 i + j (register-only join/reshape)."""
    return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (BN, BK))


@triton.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7, BN: tl.constexpr, BK: tl.constexpr):
    """[BN, BK/8] x 8 (element j of group i) -> [BN, BK] with k = 8 i + j (register-only join/reshape)."""
    t = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))
    return tl.reshape(t, (BN, BK))


@triton.jit
def _w_words(FMT: tl.constexpr, p0, e64, k0, K, N, ns, nmask, BK: tl.constexpr):
    """The packed codes of W[e, k0:k0+BK, ns]^T as uint32 [BN, BK/8]: NVFP4 words of 8 codes (nibble j of word i
    is k = k0 + 8 i + j; read as 32-bit words: K % 16 == 0 keeps rows 8-byte aligned and the host keeps the codes
    16-byte aligned), sign bytes of 8 bits (bit j: k = k0 + 8 i + j). 0 outside ``nmask`` and past K."""
    tl.static_assert(FMT != 0, "_w_words: a packed format")
    k8 = K // 8
    ws = k0 // 8 + tl.arange(0, BK // 8)
    wmask = nmask[:, None] & (ws < k8)[None, :]
    if FMT == 1:
        wp = p0.to(tl.pointer_type(tl.uint32), bitcast=True)
        return tl.load(wp + e64 * N * k8 + ns[:, None] * k8 + ws[None, :], mask=wmask, other=0)
    return tl.load(p0 + e64 * N * k8 + ns[:, None] * k8 + ws[None, :], mask=wmask, other=0).to(tl.uint32)


@triton.jit
def _sign_a(p1, e64, k0, K, BK: tl.constexpr):
    """sign: the pointers to a[e, k0 + 8 i] (the first k of each byte column of the step, [BK/8]) and their mask."""
    bs = k0 // 8 + tl.arange(0, BK // 8)
    return p1 + e64 * K + bs * 8, bs < K // 8


@triton.jit
def _w_tile(FMT: tl.constexpr, p0, p1, e64, k0, K, N, ns, nmask, BK: tl.constexpr, BN: tl.constexpr,
            DT: tl.constexpr):
    """Tile W[e, k0:k0+BK, ns] as [BK, BN]: the transpose of ``_w_tile_nk``."""
    return tl.trans(_w_tile_nk(FMT, p0, p1, e64, k0, K, N, ns, nmask, BK, BN, DT))


@triton.jit
def _w_tile_nk(FMT: tl.constexpr, p0, p1, e64, k0, K, N, ns, nmask, BK: tl.constexpr, BN: tl.constexpr,
               DT: tl.constexpr):
    """Tile W[e, k0:k0+BK, ns]^T as [BN, BK] in DT, the dtype of the product (storage order; masked
    entries 0): dense as stored, then DT; NVFP4 as e2m1*sf*2^-8 (no 2^8/s_enc: ``_w_scalar``; exact in
    bf16 and fp32, so decoding straight to bf16 (``_e2m1_pair``) gives the bits of decoding to fp32 and
    rounding); sign as +-a[k] rounded once to DT (no b[n]: ``_w_cols``); fp8 as e4m3 (exact; no scale_n:
    ``_w_cols``); ternary as q (FMT 4, exact) or q * scale_k[k] (FMT 5, rounded once; no scale_n).
    NVFP4 reads the codes as uint32 words: their base must be 4-byte aligned (``glu._factor_args``).
    k0 is a multiple of BK, and BK of 16 (NVFP4), 8 (sign) or 4 (ternary)."""
    ks = k0 + tl.arange(0, BK)
    kmask = ks < K
    if FMT == 0:
        w = tl.load(p0 + e64 * K * N + ks[None, :] * N + ns[:, None], mask=kmask[None, :] & nmask[:, None],
                    other=0.0)
    elif FMT == 1:
        # 32-bit words of 8 codes (``_w_words``). Each code becomes fp32 bits by two shifts and two masks
        # (``_e2m1_w``: e2m1 * 2^-126, exact, subnormal for the codes 0 and 0.5), or, for a bf16 product, two
        # codes become a bf16 pair the same way (``_e2m1_pair``); then one multiply gives e2m1 * sf * 2^-8
        # (``_w_scalar`` undoes the 2^-8); the eight nibbles are joined back into k order in registers.
        wrd = _w_words(FMT, p0, e64, k0, K, N, ns, nmask, BK)                 # uint32 [BN, BK/8]
        k16 = K // 16
        bs = k0 // 16 + tl.arange(0, BK // 16)
        sb = tl.load(p1 + e64 * N * k16 + ns[:, None] * k16 + bs[None, :], mask=nmask[:, None] & (bs < k16)[None, :],
                     other=0).to(tl.int32)                                    # [BN, BK/16]
        sf = _ue4m3(sb)
        sfw = tl.reshape(tl.join(sf, sf), (BN, BK // 8)) * 3.32306998946229e+35  # per word, * 2^118 (exact in fp32)
        if DT == tl.bfloat16:  # two codes per shift-and-mask, one bf16 multiply each (~2x fewer instructions)
            sfb = sfw.to(tl.bfloat16)
            a0, b0 = _e2m1_pair(wrd, 0, sfb)
            a1, b1 = _e2m1_pair(wrd, 1, sfb)
            a2, b2 = _e2m1_pair(wrd, 2, sfb)
            a3, b3 = _e2m1_pair(wrd, 3, sfb)
            w = _join8(a0, a1, a2, a3, b0, b1, b2, b3, BN, BK)
        else:
            w = _join8(_e2m1_w(wrd, 0, sfw), _e2m1_w(wrd, 1, sfw), _e2m1_w(wrd, 2, sfw), _e2m1_w(wrd, 3, sfw),
                       _e2m1_w(wrd, 4, sfw), _e2m1_w(wrd, 5, sfw), _e2m1_w(wrd, 6, sfw), _e2m1_w(wrd, 7, sfw),
                       BN, BK)
    elif FMT == 2:
        # one byte of 8 sign bits per 8 k (LSB first); element j of byte i: +-a[k0 + 8 i + j], the sign
        # bit moved to bit 31 and xor-ed into a's fp32 bits (constant shifts, no select)
        byt = _w_words(FMT, p0, e64, k0, K, N, ns, nmask, BK)                 # [BN, BK/8]
        ap, bmask = _sign_a(p1, e64, k0, K, BK)
        w = _join8(_sign_w(byt, ap, bmask, 0), _sign_w(byt, ap, bmask, 1), _sign_w(byt, ap, bmask, 2),
                   _sign_w(byt, ap, bmask, 3), _sign_w(byt, ap, bmask, 4), _sign_w(byt, ap, bmask, 5),
                   _sign_w(byt, ap, bmask, 6), _sign_w(byt, ap, bmask, 7), BN, BK)
    elif FMT == 3:
        # one E4M3 byte per element, in k order: decoded by its bits (exact). For a bf16 product two bytes at a
        # time straight to a bf16 pair (``_e4m3_pair``), else one at a time to fp32 (``_ue4m3``)
        byt = tl.load(p0 + e64 * N * K + ns[:, None] * K + ks[None, :], mask=nmask[:, None] & kmask[None, :],
                      other=0)
        if DT == tl.bfloat16:
            ev, od = tl.split(tl.reshape(byt, (BN, BK // 2, 2)))
            lo, hi = _e4m3_pair(ev.to(tl.uint32) | (od.to(tl.uint32) << 16))
            w = tl.reshape(tl.join(lo, hi), (BN, BK))
        else:
            w = _ue4m3(byt.to(tl.int32))
    else:
        # one byte of 4 two-bit codes per 4 k; element j of byte i: k = k0 + 4 i + j
        k4 = K // 4
        bs = k0 // 4 + tl.arange(0, BK // 4)
        byt = tl.load(p0 + e64 * N * k4 + ns[:, None] * k4 + bs[None, :], mask=nmask[:, None] & (bs < k4)[None, :],
                      other=0).to(tl.int32)                                   # [BN, BK/4]
        if FMT == 4 and DT == tl.bfloat16:  # two codes per shift and mask straight to bf16 (``_ternary_pair``)
            c0, c2 = _ternary_pair(byt.to(tl.uint32), 0)
            c1, c3 = _ternary_pair(byt.to(tl.uint32), 1)
            w = _join4(c0, c1, c2, c3, BN, BK)
        else:
            w = _join4(_ternary_w(byt, 0), _ternary_w(byt, 1), _ternary_w(byt, 2), _ternary_w(byt, 3), BN, BK)
        if FMT == 5:  # the rank-1 scaling's scale_k[k] (0 past K: those codes are 0 there too)
            w = w * tl.load(p1 + e64 * K + ks, mask=kmask, other=0.0)[None, :]
    return w.to(DT)


@triton.jit
def _w_packed(FMT: tl.constexpr, p0, p1, e64, k0, K, N, ns, nmask, BK: tl.constexpr, BN: tl.constexpr):
    """The packed storage of W[e, k0:k0+BK, ns]^T for ``_w_plane``: NVFP4 (uint32 words [BN, BK/8] of 8 codes,
    the words' block scales sf * 2^118 fp32 [BN, BK/8]); sign (bytes of 8 bits [BN, BK/8] as uint32, and 0.0,
    unused). As ``_w_tile_nk``'s loads (the same alignment rules). NVFP4 and sign only (``specs.up_planes``)."""
    tl.static_assert(FMT == 1 or FMT == 2, "_w_packed: NVFP4 or sign")
    wrd = _w_words(FMT, p0, e64, k0, K, N, ns, nmask, BK)
    sfw = 0.0
    if FMT == 1:
        # the words' block scales from one [BN] load per block of the step, broadcast over its two words: a 2-D
        # scale load (or a join) here makes Triton send the decoded planes through shared memory
        k16 = K // 16
        srow = p1 + e64 * N * k16 + ns * k16 + k0 // 16
        wb = tl.arange(0, BK // 8)[None, :] // 2  # block of each word within the step
        sb = tl.zeros((BN, BK // 8), tl.int32)
        for q in tl.static_range(BK // 16):
            # the block bound as a [BN] condition (ns * 0 + ...): Triton's interpreter needs the mask a tensor
            sq = tl.load(srow + q, mask=nmask & ((ns * 0 + k0 // 16 + q) < k16), other=0).to(tl.int32)
            sb = tl.where(wb == q, sq[:, None], sb)
        sfw = _ue4m3(sb) * 3.32306998946229e+35
    return wrd, sfw


@triton.jit
def _plane_ks(k0, BK: tl.constexpr, B: tl.constexpr):
    """The k of the BK/4 columns of byte plane B of a BK step: column 2 i + j is k = k0 + 8 i + 2 B + j."""
    c = tl.arange(0, BK // 4)
    return k0 + 8 * (c // 2) + 2 * B + c % 2


@triton.jit
def _w_plane(FMT: tl.constexpr, wrd, sfw, p1, e64, k0, K, B: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             DEC16: tl.constexpr, DT: tl.constexpr):
    """Byte plane B of the decoded tile [BN, BK/4] (the columns ``_plane_ks`` names; values as ``_w_tile_nk``,
    rounded to DT; DEC16: NVFP4 decoded straight to bf16): the two codes of byte B of each word (NVFP4) or bits
    2B, 2B + 1 of each byte (sign). Only a join of two and a reshape, from inputs loaded as ``_w_packed`` does: on
    sm_120, Triton 3.9 then computes the plane in the mma.sync operand registers, with no shared-memory copy
    (docs/performance.md: the eight-way join of ``_w_tile_nk``, a 2-D scale load or BK = 128 bring one
    back)."""
    if FMT == 1:
        if DEC16 and DT == tl.bfloat16:  # the byte's two nibbles spread 16 bits apart: one _e2m1_pair
            t = wrd >> (8 * B)
            lo, hi = _e2m1_pair((t & 0xF) | ((t << 12) & 0xF0000), 0, sfw.to(tl.bfloat16))
        else:
            lo = _e2m1_w(wrd, 2 * B, sfw)
            hi = _e2m1_w(wrd, 2 * B + 1, sfw)
    else:
        ap, bmask = _sign_a(p1, e64, k0, K, BK)
        lo = _sign_w(wrd, ap, bmask, 2 * B)
        hi = _sign_w(wrd, ap, bmask, 2 * B + 1)
    return tl.reshape(tl.join(lo, hi), (BN, BK // 4)).to(DT)


@triton.jit
def _plane_dots(FMT: tl.constexpr, wrd, sfw, p1, e64, k0, K, t0, t1, t2, t3, acc, BN: tl.constexpr, BK: tl.constexpr,
                DEC16: tl.constexpr, DT: tl.constexpr):
    """acc + one K step as four byte-plane dots: sum over B of ``_w_plane(..., B, ...)`` [BN, BK/4] @ t_B, t_B the
    other operand's plane B [BK/4, C] (``_x_plane`` / ``_t_planes``); the other arguments as ``_w_plane``'s."""
    acc = tl.dot(_w_plane(FMT, wrd, sfw, p1, e64, k0, K, 0, BN, BK, DEC16, DT), t0, acc)
    acc = tl.dot(_w_plane(FMT, wrd, sfw, p1, e64, k0, K, 1, BN, BK, DEC16, DT), t1, acc)
    acc = tl.dot(_w_plane(FMT, wrd, sfw, p1, e64, k0, K, 2, BN, BK, DEC16, DT), t2, acc)
    return tl.dot(_w_plane(FMT, wrd, sfw, p1, e64, k0, K, 3, BN, BK, DEC16, DT), t3, acc)


@triton.jit
def _x_plane(xp, xmask, k0, K, BK: tl.constexpr, B: tl.constexpr):
    """Rows ``_plane_ks(k0, BK, B)`` of X^T, [BK/4, BM]: X[m, k] = *(xp[m] + k), 0 for masked m or k >= K."""
    kb = _plane_ks(k0, BK, B)
    return tl.load(xp[None, :] + kb[:, None], mask=xmask[None, :] & (kb < K)[:, None], other=0.0)


@triton.jit
def _t_planes(t, BK: tl.constexpr, C: tl.constexpr):
    """The four byte planes of a [BK, C] tile loaded in k order (rows ``_plane_ks(k0, BK, B)`` for B = 0..3), split
    in registers (a reshape, a permute and two splits)."""
    t = tl.reshape(t, (BK // 8, 2, 2, 2, C))                       # [i, B1, B0, j, C]: k = 8 i + 2 (2 B1 + B0) + j
    t = tl.reshape(tl.permute(t, (0, 3, 4, 1, 2)), (BK // 4, C, 2, 2))  # [2 i + j, C, B1, B0]
    t0, t1 = tl.split(t)                                            # the last dim: B0 = 0 / 1
    q0, q2 = tl.split(t0)
    q1, q3 = tl.split(t1)
    return q0, q1, q2, q3


@triton.jit
def _inv_senc(p2, e):
    """NVFP4: 2^8 / s_enc[e], the factor that turns a product with decoded tiles (e2m1 * sf * 2^-8,
    ``_e2m1_w``) into one with W_hat (one division per program; a multiply per output element, within an
    ulp of the division by s_enc)."""
    return 256.0 / tl.load(p2 + e)


@triton.jit
def _w_scalar(FMT: tl.constexpr, acc, p2, e):
    """NVFP4: acc * 2^8 / s_enc[e] (the second-level scale and the decode's 2^-8); else acc."""
    if FMT == 1:
        acc = acc * _inv_senc(p2, e)
    return acc


@triton.jit
def _w_cols(FMT: tl.constexpr, t, p2, e64, N, ns, nmask):
    """sign, fp8, ternary: t[:, j] * scale_n[e, ns[j]] (sign's b; columns over the factor's N); else t."""
    if FMT >= 2:
        t = t * tl.load(p2 + e64 * N + ns, mask=nmask, other=0.0)[None, :]
    return t


# ---- forward ------------------------------------------------------------------------------------

@triton.jit
def lowbit_down_fwd(
    x_ptr, gidx_ptr, offs_ptr, cum_ptr, g0, g1, g2, u0, u1, u2, sg_ptr, su_ptr, z_ptr, hg_ptr, hu_ptr, rw_ptr,
    E, d, r, stride_x,
    FMT_G: tl.constexpr, FMT_U: tl.constexpr,
    HAS_GATHER: tl.constexpr, HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr,
    BWD: tl.constexpr, PLANES: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_down_fwd`` with w_gate / w_up in any format (decoded in registers).
    hg, hu (BWD) are x @ W_hat exactly as the bf16 kernel's (second-level scales applied, s not).
    PLANES (``specs.down_planes``: both factors packed, BK = 64; opt-in, shipped for sm_120): each K step as four
    byte-plane dots per factor, the x tile loaded whole (cp.async) and split into the same planes in registers
    (``_t_planes``; reading x plane by plane from global memory was 3x slower on the H200): no shared-memory copy
    of a decoded tile on sm_120, but 1.66x (NVFP4) / 1.12x (sign) the joined tile's time on an H200 running
    mma.sync (docs/performance.md)."""
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
    ks = tl.arange(0, BK)
    x_row = src * stride_x
    # swapped operands: acc^T [BR, BM] = W^T [BR, BK] @ x^T [BK, BM], so the decoded factor tile is
    # the A operand, which tensor cores (wgmma, mma.sync) take from registers; x goes the usual way
    acc_g = tl.zeros((BR, BM), dtype=tl.float32)
    acc_u = tl.zeros((BR, BM), dtype=tl.float32)
    for k in range(0, d, BK):
        kmask = (k + ks) < d
        a = tl.load(x_ptr + x_row[None, :] + (k + ks)[:, None], mask=rmask[None, :] & kmask[:, None], other=0.0)
        if PLANES:
            a0, a1, a2, a3 = _t_planes(a, BK, BM)
            gw, gs = _w_packed(FMT_G, g0, g1, e64, k, d, r, cols, cmask, BK, BR)
            uw, us = _w_packed(FMT_U, u0, u1, e64, k, d, r, cols, cmask, BK, BR)
            acc_g = _plane_dots(FMT_G, gw, gs, g1, e64, k, d, a0, a1, a2, a3, acc_g, BR, BK, True, a.dtype)
            acc_u = _plane_dots(FMT_U, uw, us, u1, e64, k, d, a0, a1, a2, a3, acc_u, BR, BK, True, a.dtype)
        else:
            wg = _w_tile_nk(FMT_G, g0, g1, e64, k, d, r, cols, cmask, BK, BR, a.dtype)
            wu = _w_tile_nk(FMT_U, u0, u1, e64, k, d, r, cols, cmask, BK, BR, a.dtype)
            acc_g = tl.dot(wg, a, acc_g)
            acc_u = tl.dot(wu, a, acc_u)
    acc_g = tl.trans(acc_g)
    acc_u = tl.trans(acc_u)
    acc_g = _w_cols(FMT_G, _w_scalar(FMT_G, acc_g, g2, e), g2, e64, r, cols, cmask)
    acc_u = _w_cols(FMT_U, _w_scalar(FMT_U, acc_u, u2, e), u2, e64, r, cols, cmask)
    _glu_fwd_epilogue(acc_g, acc_u, e, rows, rmask, cols, cmask, r, sg_ptr, su_ptr, rw_ptr, z_ptr, hg_ptr, hu_ptr,
                      HAS_SG, HAS_SU, HAS_RW, BWD)


@triton.jit
def lowbit_up_fwd(
    z_ptr, offs_ptr, cum_ptr, d0, d1, d2, rw_ptr, y_ptr,
    E, r, f, ldy,
    FMT_D: tl.constexpr, HAS_RW: tl.constexpr, SINGLE_K: tl.constexpr, Y_PAD: tl.constexpr, DEC16: tl.constexpr,
    PLANES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_up_fwd`` (FSPLIT 1) with w_down in any format: y[rows, :f] = (z Wd_hat[e]) * rw.
    DEC16: decode w_down tiles straight to z's dtype (bf16: ``_e2m1_pair``); else to fp32, then round
    (same bits; ``specs.up_dec16``: Triton 3.6 and 3.9 fail to compile the first at BK = 16 for
    compute capability 10.x / 11.0). PLANES (``specs.up_planes``: packed w_down, SINGLE_K at BK = 64, sm_120): the
    K step as four byte-plane dots (``_w_plane``) over the z tile's planes, read once per program.
    Packed w_down rows are K-contiguous ([f, r/2] or [f, r/8] bytes), so the odd f does not misalign the
    factor loads. Y_PAD (as the bf16 kernel's): ldy is a multiple of 8 and y's pad columns [f, ldy) may be
    written (zeros here: the decoded columns past f are masked), so the y stores vectorize."""
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
        if FMT_D == 1:
            rw = rw * _inv_senc(d2, e)  # one multiply per output element for both
    ks = tl.arange(0, BK)
    ns = tl.arange(0, BN)
    z_base = z_ptr + row0.to(tl.int64) * r
    if Y_PAD:
        ldy = (ldy // 8) * 8  # == ldy; lets Triton see the multiple of 8 (an argument cannot carry a hint)
        ncol = ldy
    else:
        ncol = f
    y_base = y_ptr + row0.to(tl.int64) * ldy
    y_tile = bm[:, None] * ldy + ns[None, :]
    # swapped operands (see lowbit_down_fwd): y^T [BN, BM] = Wd^T [BN, BK] (decoded, A) @ z^T [BK, BM]
    zp = z_base + bm * r
    if SINGLE_K:  # the whole rank fits one K step: load the z tile (its planes) once
        if PLANES:
            zq0 = _x_plane(zp, rmask, 0, r, BK, 0)
            zq1 = _x_plane(zp, rmask, 0, r, BK, 1)
            zq2 = _x_plane(zp, rmask, 0, r, BK, 2)
            zq3 = _x_plane(zp, rmask, 0, r, BK, 3)
        else:
            zt = tl.load(zp[None, :] + ks[:, None], mask=rmask[None, :] & (ks < r)[:, None], other=0.0)
    for n in range(0, f, BN):
        cols = n + ns
        cmask = cols < f
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        if PLANES:
            wrd, sfw = _w_packed(FMT_D, d0, d1, e64, 0, r, f, cols, cmask, BK, BN)
            acc = _plane_dots(FMT_D, wrd, sfw, d1, e64, 0, r, zq0, zq1, zq2, zq3, acc, BN, BK, DEC16, zq0.dtype)
        elif SINGLE_K:
            acc = tl.dot(_w_tile_nk(FMT_D, d0, d1, e64, 0, r, f, cols, cmask, BK, BN,
                                    zt.dtype if DEC16 else tl.float32).to(zt.dtype), zt, acc)
        else:
            for k in range(0, r, BK):
                kmask = (k + ks) < r
                a = tl.load(zp[None, :] + (k + ks)[:, None], mask=rmask[None, :] & kmask[:, None], other=0.0)
                acc = tl.dot(_w_tile_nk(FMT_D, d0, d1, e64, k, r, f, cols, cmask, BK, BN,
                                        a.dtype if DEC16 else tl.float32).to(a.dtype), a, acc)
        acc = _w_cols(FMT_D, tl.trans(acc), d2, e64, f, cols, cmask)
        if HAS_RW:
            acc = acc * rw[:, None]  # (NVFP4: 2^8 / s_enc folded in)
        else:
            acc = _w_scalar(FMT_D, acc, d2, e)
        tl.store(y_base + n + y_tile, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & ((n + ns) < ncol)[None, :])


# ---- backward -----------------------------------------------------------------------------------
# The shared schedule (triton_common/_kernels.py "backward"): these two row kernels run on the expert-major row
# tiles and give dW to an expert of at most one tile (exact zeros for an empty one); the other experts' dW (X^T dh,
# (z*rw)^T dY: no factor involved) come from the shared chunked kernels (glu_bwd_dwd, glu_bwd_dw,
# bwd_slot_reduce).

@triton.jit
def lowbit_bwd_dz(
    dy_ptr, sidx_ptr, offs_ptr, xcum_ptr, d0, d1, d2, zw_ptr, part_ptr, dwd_ptr,
    hg_ptr, hu_ptr, sg_ptr, su_ptr, rw_ptr, dhg_ptr, dhu_ptr, dsgp_ptr, dsup_ptr, drw_ptr,
    E, M, r, f, f_slice,
    FMT_D: tl.constexpr, HAS_SCATTER: tl.constexpr, DO_DWD: tl.constexpr, FUSE_EPI: tl.constexpr,
    HAS_SG: tl.constexpr, HAS_SU: tl.constexpr, HAS_RW: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_bwd_dz`` with w_down in any format: part[fs, rows, ranks] = dY[rows, slice] Wd_hat^T for
    one (row tile, rank block, f slice). dWd (DO_DWD, an expert of at most one tile) is the gradient w.r.t.
    the DECODED factor, (z*rw)^T dY, dense [E, r, f]: the STE gradient of a master factor (glu.py). Sign: b[n]
    scales dY's columns before the dot; NVFP4: 1/s_enc scales each partial. FUSE_EPI (one f slice, so the
    program's dz0 is complete): no part buffer; the GLU backward of ``glu_bwd_epi`` follows in the same program
    (``_glu_bwd_tile``: dhg, dhu, d rw, the tile's d s partial sums; HAS_SG / HAS_SU / HAS_RW as there)."""
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
    e64 = e.to(tl.int64)
    cols = pr * BR + tl.arange(0, BR)
    cmask = cols < r
    ns = tl.arange(0, BN)
    bm = tl.arange(0, BM)
    n_lo = fs * f_slice
    n_hi = tl.minimum(n_lo + f_slice, f)
    n_w = tl.where(row0 < hi, n_hi, 0)                    # w_down is decoded only for a tile with rows
    dwd_base = dwd_ptr + e64 * r * f
    wd_tile = cols[:, None] * f + ns[None, :]             # int32 [BR, BN] (dense dWd)
    h_tile = bm[:, None] * r + cols[None, :]              # int32 [BM, BR]
    rows = row0 + bm
    rmask = rows < hi
    hmask = rmask[:, None] & cmask[None, :]
    dst = _row_index(sidx_ptr, rows, rmask, HAS_SCATTER)
    dy_row = dst * f
    zw = tl.load(zw_ptr + row0.to(tl.int64) * r + h_tile, mask=hmask, other=0.0)
    dz = tl.zeros((BR, BM), dtype=tl.float32)  # swapped: dz^T = Wd[ranks, slice] (decoded, A) @ dY^T
    for n in range(n_lo, n_hi, BN):
        nmask = (n + ns) < n_hi
        dy = tl.load(dy_ptr + dy_row[:, None] + (n + ns)[None, :], mask=rmask[:, None] & nmask[None, :], other=0.0)
        w = _w_tile(FMT_D, d0, d1, e64, pr * BR, r, f, n + ns, (n + ns) < n_w, BR, BN, dy.dtype)
        dys = _w_cols(FMT_D, dy, d2, e64, f, n + ns, (n + ns) < n_w).to(dy.dtype)
        dz = tl.dot(w, tl.trans(dys), dz)
        if DO_DWD:
            if one:
                dwd = tl.dot(tl.trans(zw), dy)
                tl.store(dwd_base + n + wd_tile, dwd.to(dwd_ptr.dtype.element_ty), mask=cmask[:, None] & nmask[None, :])
    dz = _w_scalar(FMT_D, tl.trans(dz), d2, e)
    if FUSE_EPI:
        if row0 < hi:  # an empty expert's tile has no rows (and no d s partial, as in glu_bwd_epi)
            _glu_bwd_tile(dz, pid, pr, e, rows, rmask, cols, cmask, row0.to(tl.int64) * r + h_tile, hg_ptr, hu_ptr,
                          sg_ptr, su_ptr, rw_ptr, dhg_ptr, dhu_ptr, dsgp_ptr, dsup_ptr, drw_ptr, M, r, HAS_SG, HAS_SU,
                          HAS_RW)
    else:
        tl.store(part_ptr + fs.to(tl.int64) * M * r + row0.to(tl.int64) * r + h_tile, dz, mask=hmask)


@triton.jit
def lowbit_bwd_dx_dw(
    x_ptr, gidx_ptr, offs_ptr, xcum_ptr, g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr,
    E, d, r, stride_x,
    FMT_G: tl.constexpr, FMT_U: tl.constexpr,
    HAS_GATHER: tl.constexpr, DO_DX: tl.constexpr, DO_DW: tl.constexpr,
    BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, NDB: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """``triton_glu.glu_bwd_dx_dw`` with w_gate / w_up in any format: dx_routed = dhg Wg_hat^T + dhu Wu_hat^T
    (decoded in registers) for one (row tile, NDB d blocks); dWg / dWu (DO_DW, an expert of at most one tile; an
    empty one's program stores zeros and returns) are the dense gradients w.r.t. the decoded factors (X^T dh), the
    STE gradients of master factors. As in the bf16 kernel, a rank that fits one block (r = 64) loads dhg / dhu once
    and walks the d blocks in one loop; a larger one, NDB 1, or a column-scaled factor (sign, FP8, ternary: dh and its
    scaled copy held across the blocks would cost a CTA per SM) takes the per-block body for each d block."""
    pid = tl.program_id(0)
    pd = tl.program_id(1)
    e, t = _bwd_tile(xcum_ptr, pid, E, BLOCK_E)
    if e >= E:
        return
    row0, hi, one = _bwd_rows(offs_ptr, e, t, BM)
    e64 = e.to(tl.int64)
    d_lo = pd * BD * NDB
    d_hi = tl.minimum(d_lo + BD * NDB, d)
    if row0 >= hi:  # an empty expert's tile: its dW block is zeros (no row, no decode, no product), or nothing
        if DO_DW:
            _dw_zero(dwg_ptr, dwu_ptr, e64 * d * r, d_lo, d_hi, r, BD * BR)
        return
    dl = tl.arange(0, BD)
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    h_tile = bm[:, None] * r + rs[None, :]     # int32 [BM, BR]
    if NDB == 1:  # one d block per program: the per-block body only (sign: no second path's registers)
        if DO_DW:
            if one:
                _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, dwg_ptr, dwu_ptr, e64 * d * r + d_lo * r, row0, hi, 1,
                          d_lo, d, r, stride_x, HAS_GATHER, BM, BD, BR)
        if DO_DX:
            _lowbit_dx_block(g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, e, row0, hi, d_lo, d, r, h_tile,
                             FMT_G, FMT_U, BM, BD, BR)
    elif FMT_G >= 2 or FMT_U >= 2:  # a column scale (sign, FP8, ternary): no held dh copies (their registers)
        _dx_dw_blocks(x_ptr, gidx_ptr, g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr, e, row0, hi,
                      one, d_lo, d_hi, d, r, stride_x, h_tile, FMT_G, FMT_U, HAS_GATHER, DO_DX, DO_DW, BM, BD, BR)
    elif r <= BR:
        rmask, src, rm, hg, hu = _one_tile_dh(gidx_ptr, dhg_ptr, dhu_ptr, row0, hi, r, h_tile, HAS_GATHER, BM, BR)
        if DO_DX:
            hgs = tl.trans(_w_cols(FMT_G, hg, g2, e64, r, rs, rm).to(hg.dtype))  # [BR, BM]
            hus = tl.trans(_w_cols(FMT_U, hu, u2, e64, r, rs, rm).to(hu.dtype))
        for d0 in range(d_lo, d_hi, BD):
            dm = (d0 + dl) < d
            if DO_DW:
                if one:
                    _dw_one_tile(x_ptr, src, rmask, rm, hg, hu, dwg_ptr, dwu_ptr, e64 * d * r, d0, d, r, stride_x,
                                 BD, BR)
            if DO_DX:
                wg = _w_tile(FMT_G, g0, g1, e64, d0, d, r, rs, rm, BD, BR, hg.dtype)   # [BD, BR]
                wu = _w_tile(FMT_U, u0, u1, e64, d0, d, r, rs, rm, BD, BR, hu.dtype)
                acc = tl.trans(_w_scalar(FMT_G, tl.dot(wg, hgs), g2, e) + _w_scalar(FMT_U, tl.dot(wu, hus), u2, e))
                tl.store(dx_ptr + row0.to(tl.int64) * d + d0 + bm[:, None] * d + dl[None, :],
                         acc.to(dx_ptr.dtype.element_ty), mask=rmask[:, None] & dm[None, :])
    else:
        _dx_dw_blocks(x_ptr, gidx_ptr, g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr, e, row0, hi,
                      one, d_lo, d_hi, d, r, stride_x, h_tile, FMT_G, FMT_U, HAS_GATHER, DO_DX, DO_DW, BM, BD, BR)


@triton.jit
def _dx_dw_blocks(x_ptr, gidx_ptr, g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, dwg_ptr, dwu_ptr, e, row0, hi, one,
                  d_lo, d_hi, d, r, stride_x, h_tile, FMT_G: tl.constexpr, FMT_U: tl.constexpr,
                  HAS_GATHER: tl.constexpr, DO_DX: tl.constexpr, DO_DW: tl.constexpr, BM: tl.constexpr,
                  BD: tl.constexpr, BR: tl.constexpr):
    """lowbit_bwd_dx_dw's d blocks [d_lo, d_hi) of one row tile, each with the per-block body (dh loaded in each)."""
    e64 = e.to(tl.int64)
    for d0 in range(d_lo, d_hi, BD):
        if DO_DW:
            if one:
                _dw_store(x_ptr, gidx_ptr, dhg_ptr, dhu_ptr, dwg_ptr, dwu_ptr, e64 * d * r + d0 * r, row0, hi, 1,
                          d0, d, r, stride_x, HAS_GATHER, BM, BD, BR)
        if DO_DX:
            _lowbit_dx_block(g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, e, row0, hi, d0, d, r, h_tile,
                             FMT_G, FMT_U, BM, BD, BR)


@triton.jit
def _lowbit_dx_block(g0, g1, g2, u0, u1, u2, dhg_ptr, dhu_ptr, dx_ptr, e, row0, hi, d0, d, r, h_tile,
                     FMT_G: tl.constexpr, FMT_U: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """dx_routed[row0 + i, d0:d0 + BD] for the rows row0 + i < hi of one row tile, over every rank block."""
    e64 = e.to(tl.int64)
    dl = tl.arange(0, BD)
    dm = (d0 + dl) < d
    bm = tl.arange(0, BM)
    rs = tl.arange(0, BR)
    rmask = (row0 + bm) < hi
    h_row = row0.to(tl.int64) * r
    accg = tl.zeros((BD, BM), dtype=tl.float32)  # swapped: dx^T = W[dblk, ranks] (decoded, A) @ dh^T
    accu = tl.zeros((BD, BM), dtype=tl.float32)
    for rb in range(0, r, BR):
        rm = (rb + rs) < r
        hmask = rmask[:, None] & rm[None, :]
        hg = tl.load(dhg_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
        hu = tl.load(dhu_ptr + h_row + rb + h_tile, mask=hmask, other=0.0)
        wg = _w_tile(FMT_G, g0, g1, e64, d0, d, r, rb + rs, rm, BD, BR, hg.dtype)   # [BD, BR]
        wu = _w_tile(FMT_U, u0, u1, e64, d0, d, r, rb + rs, rm, BD, BR, hu.dtype)
        hgs = _w_cols(FMT_G, hg, g2, e64, r, rb + rs, rm).to(hg.dtype)
        hus = _w_cols(FMT_U, hu, u2, e64, r, rb + rs, rm).to(hu.dtype)
        accg = tl.dot(wg, tl.trans(hgs), accg)
        accu = tl.dot(wu, tl.trans(hus), accu)
    acc = tl.trans(_w_scalar(FMT_G, accg, g2, e) + _w_scalar(FMT_U, accu, u2, e))
    tl.store(dx_ptr + row0.to(tl.int64) * d + d0 + bm[:, None] * d + dl[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=rmask[:, None] & dm[None, :])
