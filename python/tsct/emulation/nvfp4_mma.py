"""Torch emulation of the sm_120 NVFP4 GEMM kernels' math and addressing.

Emulates ``cutedsl/tsct_cutedsl/nvfp4_gemm_sm120.py`` (``mma.sync.aligned.m16n8k64.kind::mxf4nvf4
.block_scale.scale_vec::4X .f32.e2m1.e2m1.f32.ue4m3``):

* operands are read as the kernel reads them: E2M1 codes two per byte (even k in the low nibble),
  UE4M3 block scales fetched through the ``swizzled_128x4`` byte offsets (per expert for the
  activations, at ``sfa_offsets[e]``), rows through the device tile map;
* per 16-element block the product sum ``sum(a*b)`` is exact in fp32 (E2M1 products have <= 3
  significant bits, 16 of them sum to <= 576), and ``block_sum * sfa * sfb`` is exact too (UE4M3
  has 4 significant bits); the four block terms of one 64-wide k-step are added and rounded to fp32
  once, then added to the fp32 accumulator in k order. PTX does not specify the MMA's internal
  rounding; hardware may differ from this by rounding inside a k-step (bounded by a few fp32 ulps
  of the k-step's magnitude per step). Tests compare with fp32 tolerances, never bitwise;
* epilogues in fp32: ``alpha``, the GLU (``g = alpha*acc_g*ep0``, ``u = alpha*acc_u*ep1``,
  ``z = silu(g)*u`` with ``silu(g) = g / (1 + exp(-g))``), ``row_weight``; then the output dtype.

* the sign variant (``grouped_sign_gemm_emulated``): B codes come from 1-bit sign bits expanded as
  the kernel expands them in registers (``sign_bits_to_codes``: nibble = 0x2 | bit << 3, so
  +1.0 / -1.0), B block scales are UE4M3 1.0 (0x38), and the epilogue applies the per-column scale
  first: ``y_p = acc_p * col_scale[p, e, n] * alpha[p, e]``.

Pure torch, any device, no CuTeDSL. Used as the oracle for the kernel's math (on the CPU, and on the
H200 against the since retired Triton W4A4 kernels, docs/retired.md), never as a fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tsct.quant.formats import NVFP4_BLOCK_SIZE, e2m1_decode, unpack_bits, unpack_nibbles
from tsct.quant.layout import swizzle_offsets

__all__ = ["MMA_K", "decode_codes", "gather_scales_swizzled", "block_scaled_mma", "silu_f32",
           "grouped_gemm_emulated", "dense_gemm_emulated", "expand_sign_byte", "sign_bits_to_codes",
           "grouped_sign_gemm_emulated",
           "E2M1_PLUS_ONE", "E2M1_MINUS_ONE", "UE4M3_ONE"]

MMA_K = 64  # K of one m16n8k64 MMA: the accumulation step
_BLOCKS_PER_STEP = MMA_K // NVFP4_BLOCK_SIZE  # 4 scales per row per k-step (scale_vec::4X)
E2M1_PLUS_ONE, E2M1_MINUS_ONE = 0x2, 0xA  # the sign kernel's B codes
UE4M3_ONE = 0x38  # the sign kernel's B block scale (float8_e4m3fn 1.0)


def decode_codes(codes: Tensor) -> Tensor:
    """uint8 ``[..., K/2]`` E2M1 pairs -> fp32 ``[..., K]`` element values (even k = low nibble)."""
    return e2m1_decode(unpack_nibbles(codes))


def gather_scales_swizzled(buf: Tensor, base: Tensor | int, rows: Tensor, k: int) -> Tensor:
    """fp32 block scales ``[len(rows), K/16]`` read from a flat swizzled_128x4 byte buffer.

    ``rows`` are row indices inside the swizzled matrix that starts at byte ``base`` (a scalar or a
    per-row tensor). Mirrors the kernel's ``tile_atom_to_shape_SF`` addressing.
    """
    kb = k // NVFP4_BLOCK_SIZE
    nrows = int(rows.max()) + 1 if rows.numel() else 0
    off = swizzle_offsets(max(nrows, 1), kb, device=buf.device)[rows.long()]  # [R, Kb]
    base_t = torch.as_tensor(base, device=buf.device).long()
    idx = off + (base_t.reshape(-1, 1) if base_t.dim() else base_t)
    return buf.view(torch.uint8)[idx].view(torch.float8_e4m3fn).float()


def block_scaled_mma(a_vals: Tensor, a_sf: Tensor, b_vals: Tensor, b_sf: Tensor) -> Tensor:
    """fp32 ``[R, N]`` accumulator of ``A [R, K] x B [N, K]^T`` with block scales, k-step by k-step.

    a_vals/b_vals: fp32 E2M1 values; a_sf ``[R, K/16]``, b_sf ``[N, K/16]``: fp32 UE4M3 values.
    """
    r, k = a_vals.shape
    n = b_vals.shape[0]
    if k % MMA_K:
        raise ValueError(f"K must be a multiple of {MMA_K}, got {k}")
    kb = k // NVFP4_BLOCK_SIZE
    a4 = a_vals.reshape(r, kb, NVFP4_BLOCK_SIZE).double()
    b4 = b_vals.reshape(n, kb, NVFP4_BLOCK_SIZE).double()
    block = torch.einsum("rbi,nbi->rnb", a4, b4)  # exact block sums (integers * 2^-2)
    block = block * a_sf.double().unsqueeze(1) * b_sf.double().unsqueeze(0)  # exact: <= 18 significant bits
    steps = block.reshape(r, n, k // MMA_K, _BLOCKS_PER_STEP).sum(-1).float()  # one rounding per k-step
    acc = torch.zeros(r, n, dtype=torch.float32, device=a_vals.device)
    for s in range(steps.shape[-1]):  # fp32 accumulation in k order, as the MMA chain does
        acc = acc + steps[..., s]
    return acc


def silu_f32(g: Tensor) -> Tensor:
    """``g / (1 + exp(-g))`` in fp32, the kernel's formula (torch's silu agrees to an ulp or so)."""
    g = g.float()
    return g / (1.0 + torch.exp(-g))


def dense_gemm_emulated(a_codes: Tensor, a_sf_swz: Tensor, b_codes: Tensor, b_sf_swz: Tensor, alpha: Tensor,
                        out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The dense kernel: ``C[l] = alpha[l] * A[l] @ B[l]^T``.

    a_codes ``[L, M, K/2]``, b_codes ``[L, N, K/2]`` uint8; a_sf_swz ``[L, Mp*Kbp]``, b_sf_swz
    ``[L, Np*Kbp]`` swizzled UE4M3; alpha ``[L]`` fp32. Returns ``[L, M, N]`` in out_dtype.
    """
    l_, m, k2 = a_codes.shape
    n = b_codes.shape[1]
    k = 2 * k2
    out = []
    for i in range(l_):
        sfa = gather_scales_swizzled(a_sf_swz[i], 0, torch.arange(m), k)
        sfb = gather_scales_swizzled(b_sf_swz[i], 0, torch.arange(n), k)
        acc = block_scaled_mma(decode_codes(a_codes[i]), sfa, decode_codes(b_codes[i]), sfb)
        out.append((acc * alpha[i].float()).to(out_dtype))
    return torch.stack(out) if out else torch.empty(0, m, n, dtype=out_dtype)


def grouped_gemm_emulated(a_codes: Tensor, sfa_buf: Tensor, sfa_offsets: Tensor, b_codes: Tensor, sfb_swz: Tensor,
                          offs: Tensor, tile_expert: Tensor, tile_row: Tensor, tile_m: int, alpha: Tensor, *,
                          epilogue: str = "alpha", ep0: Tensor | None = None, ep1: Tensor | None = None,
                          out_dtype: torch.dtype = torch.bfloat16, m_out: int | None = None) -> Tensor:
    """The grouped kernel, tile by tile, with the kernel's addressing.

    a_codes ``[M_alloc, K/2]``; sfa_buf flat UE4M3 bytes, expert e's swizzled block at
    ``sfa_offsets[e]``; b_codes ``[E, N, K/2]``; sfb_swz ``[E, Np*Kbp]``; offs int32 ``[E]``;
    tile_expert / tile_row: the device tile map (``tsct.emulation.plan.tile_map``); alpha ``[E]``.
    ``epilogue``: "alpha" -> ``[M, N]``; "glu" -> ``[M, N/2]`` (B rows interleaved gate/up, ep0/ep1
    ``[E, N/2]``); "row_weight" -> ``[M, N]`` scaled by ``ep0[row]``. Rows never covered (padding
    past offs[-1]) stay 0, as the kernel leaves a zero-initialised output.
    """
    e_count, n, k2 = b_codes.shape
    k = 2 * k2
    m = m_out if m_out is not None else a_codes.shape[0]
    n_out = n // 2 if epilogue == "glu" else n
    out = torch.zeros(m, n_out, dtype=out_dtype, device=a_codes.device)
    bounds = [0] + offs.tolist()  # the emulation may read on the host; the kernel reads the tile map
    b_vals = decode_codes(b_codes)
    for t, e in enumerate(tile_expert.tolist()):
        if e < 0:
            continue
        row0, lo, hi = int(tile_row[t]), bounds[e], bounds[e + 1]
        rows = torch.arange(row0, row0 + tile_m)
        local = rows - lo  # row inside the expert's swizzled scale block
        sfa = gather_scales_swizzled(sfa_buf, int(sfa_offsets[e]), local, k)
        sfb = gather_scales_swizzled(sfb_swz[e], 0, torch.arange(n), k)
        acc = block_scaled_mma(decode_codes(a_codes[rows]), sfa, b_vals[e], sfb)
        keep = rows < hi
        acc, rows = acc[keep], rows[keep]
        a_e = alpha[e].float()
        if epilogue == "glu":
            g = acc[:, 0::2] * a_e * ep0[e].float()
            u = acc[:, 1::2] * a_e * ep1[e].float()
            y = silu_f32(g) * u
        else:
            y = acc * a_e
            if epilogue == "row_weight":
                y = y * ep0[rows].float().unsqueeze(1)
        out[rows] = y.to(out_dtype)
    return out


def expand_sign_byte(byte: int) -> int:
    """The kernel's register expansion (``_expand_sign_byte`` in the CuTeDSL source), on a Python int:
    8 sign bits -> one 32-bit B register of 8 E2M1 codes (nibble i = 0x2 | bit_i << 3)."""
    x = byte & 0xFF
    x = (x | (x << 12)) & 0x000F000F
    x = (x | (x << 6)) & 0x03030303
    x = (x | (x << 3)) & 0x11111111
    return ((x << 3) | 0x22222222) & 0xFFFFFFFF


def sign_bits_to_codes(bits: Tensor) -> Tensor:
    """uint8 sign bits ``[..., N, K/8]`` (bit j of byte i = element 8i+j, 1 = negative) -> uint8 E2M1
    codes ``[..., N, K/2]`` (even k in the low nibble): +1.0 = 0x2, -1.0 = 0xA.

    The kernel's register expansion, byte for byte: one byte of bits becomes one 32-bit B register,
    ``0x22222222 | spread(bits) << 3`` with bit i at bit 4i (so nibble i = 0x2 | bit_i << 3).
    """
    neg = unpack_bits(bits).to(torch.uint8)  # [..., N, K] 0/1
    nib = E2M1_PLUS_ONE | (neg << 3)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def grouped_sign_gemm_emulated(a_codes: Tensor, sfa_buf: Tensor, sfa_offsets: Tensor, bits: Tensor,
                               col_scale: Tensor, offs: Tensor, tile_expert: Tensor, tile_row: Tensor, tile_m: int,
                               alpha: Tensor, *, epilogue: str = "alpha", ep0: Tensor | None = None,
                               ep1: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                               m_out: int | None = None) -> Tensor:
    """The sign kernel (``Nvfp4GemmSm120(sign=True).grouped_sign``), tile by tile.

    P activations/factors (P = 2 for "glu": gate, up; else 1), P outermost in memory:
    a_codes ``[P, M_alloc, K/2]`` (NVFP4 of ``x * a_p[e]`` per expert); sfa_buf ``[P, bytes]``
    (copy p's expert e block at ``sfa_offsets[e]``); bits ``[P, E, N, K/8]`` (``SignTensor.bits``);
    col_scale ``[P, E, N]`` (``SignTensor.scale_n``); alpha ``[P, E]`` (1 / s_enc of copy p).
    Epilogue, in this order: ``y_p = acc_p * col_scale[p, e, n] * alpha[p, e]``; "alpha": y_0;
    "row_weight": ``y_0 * ep0[row]``; "glu": ``silu(y_0 * ep0[e, n]) * (y_1 * ep1[e, n])`` ->
    ``[M, N]`` (no interleave: gate j and up j are column j of their own factor).
    """
    p_count, e_count, n, k8 = bits.shape
    k = 8 * k8
    want_p = 2 if epilogue == "glu" else 1
    if p_count != want_p:
        raise ValueError(f"epilogue {epilogue!r} takes {want_p} sign factor(s), got {p_count}")
    m = m_out if m_out is not None else a_codes.shape[1]
    out = torch.zeros(m, n, dtype=out_dtype, device=a_codes.device)
    bounds = [0] + offs.tolist()  # the emulation may read on the host; the kernel reads the tile map
    b_vals = decode_codes(sign_bits_to_codes(bits))  # [P, E, N, K] = +-1
    b_sf = torch.full((n, k // NVFP4_BLOCK_SIZE), UE4M3_ONE, dtype=torch.uint8, device=bits.device)
    b_sf = b_sf.view(torch.float8_e4m3fn).float()  # 1.0: no scale buffer exists
    for t, e in enumerate(tile_expert.tolist()):
        if e < 0:
            continue
        row0, lo, hi = int(tile_row[t]), bounds[e], bounds[e + 1]
        rows = torch.arange(row0, row0 + tile_m)
        local = rows - lo
        keep = rows < hi
        ys = []
        for p in range(p_count):
            sfa = gather_scales_swizzled(sfa_buf[p], int(sfa_offsets[e]), local, k)
            acc = block_scaled_mma(decode_codes(a_codes[p][rows]), sfa, b_vals[p, e], b_sf)[keep]
            ys.append(acc * col_scale[p, e].float() * alpha[p, e].float())
        rows = rows[keep]
        if epilogue == "glu":
            y = silu_f32(ys[0] * ep0[e].float()) * (ys[1] * ep1[e].float())
        else:
            y = ys[0]
            if epilogue == "row_weight":
                y = y * ep0[rows].float().unsqueeze(1)
        out[rows] = y.to(out_dtype)
    return out
