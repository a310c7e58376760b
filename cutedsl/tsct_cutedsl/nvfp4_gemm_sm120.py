"""NVFP4 block-scaled GEMMs for sm_120 on the warp-level ``mma.sync`` m16n8k64 block-scaled atom.

One source, all variants (parameters, not copies; style.md):

* ``dense``   ``C[l] = alpha[l] * (A[l] @ B[l]^T)``, batched over l (``A [M, K, L]``, ``B [N, K, L]``).
* ``grouped`` rows of A sorted by expert, ``offs`` = cumulative END offsets (torch grouped_mm
  convention); expert e multiplies its rows by ``B[e]``. A device tile map (``tsct.emulation.plan``)
  gives each CTA ``(expert, first row)``; CTAs past the last tile exit. No host reads.
  Epilogues (``epilogue=``):
    - ``"alpha"``: ``Y = alpha_a * alpha_b[e] * acc`` (one output).
    - ``"glu"``  : the first half of the grouped GLU. B holds ``[w_gate; w_up]`` stacked along N
      (``2r`` rows per expert); a CTA covers the whole ``2r`` so that gate and up of a row meet in
      the same thread: ``g = alpha*acc_g*s_gate[e]``, ``u = alpha*acc_u*s_up[e]``, ``z = silu(g)*u``.
    - ``"row_weight"``: the second half: ``Y = alpha*acc*row_weight[row]``.
* ``sign=True`` (grouped only; entry ``grouped_sign``): the B operand is a 1-bit sign factor
  (design.md section 3, ``tsct.quant.SignTensor``): ``x @ W = ((x * a) @ sign(W)) * b``. B is read as
  packed bits ``[N, K/8]`` (LSB first, 1 = negative) and expanded in registers to E2M1 +-1 codes
  (0x2 = +1.0, 0xA = -1.0), one byte of bits -> one 32-bit B register (8 nibbles); the B block
  scales are the constant UE4M3 1.0 (0x38), no scale buffer is read. The per-column scale ``b`` is
  an fp32 ``col_scale [E, N]`` applied first in the epilogue (``acc * b[e, n] * alpha[e]``, then the
  GLU / row_weight step). The per-K scale ``a`` is NOT in the kernel: the caller quantizes
  ``x * a[e]`` (per expert) to NVFP4 and passes that as A. Because w_gate and w_up carry different
  ``a``, the sign GLU takes TWO activations (``P = 2``: copy 0 = ``x*a_gate``, copy 1 = ``x*a_up``)
  and runs two MMA chains into two accumulators over plain (not interleaved) ``[E, r]`` bits; the
  same fragment index of both accumulators is the same (row, j), so the GLU pairs them in-thread.

Operands (design.md section 3, decision 0002):

* A, B: E2M1 codes, K contiguous, two per byte, even element in the LOW nibble (the order the MMA
  reads: PTX "lower k in the lower nibble").
* SFA, SFB: UE4M3 block scales (one per 16 K elements) in the ``swizzled_128x4`` layout
  (``tsct.quant.layout``); CuTe spells the same layout as ``BlockScaledBasicChunk`` tiled K-first
  (``tile_atom_to_shape_SF``): ``((32,4),(16,4)):((16,4),(0,1))`` per 128 rows x 64 K.
  In the grouped kernel each expert's activation scales start at ``sfa_offsets[e]`` bytes and have
  their rows padded to 128 (the per-group swizzled layout CUTLASS / cuBLAS / torch use).
* alpha: the per-matrix second-level scales, folded in the epilogue: tsct stores the ENCODE scale
  ``s_enc`` (decode divides by it), so ``alpha = 1 / (s_enc_a * s_enc_b)`` is passed in (fp32).

Data movement is deliberately simple in this first version: each warp loads its MMA fragments
straight from global memory into registers (no shared memory, no TMA, no pipelining), and the
epilogue stores element-wise with bounds checks. It is the correctness baseline whose fragment
mapping the emulation mirrors; the TMA/ldmatrix pipeline of the CUTLASS SM120 examples is the next
step (docs/decisions/0006-cutedsl-build.md).

Fragment facts relied on (PTX ISA, mma.m16n8k64 .kind::mxf4nvf4 .scale_vec::4X; CuTe's
``mma_traits_sm120`` / ``blackwell_helpers.thrfrg_SFA/SFB``; docs/sm120.md):
g = lane / 4, q = lane % 4. A: row g (+8), k 8q..8q+7 (+32). B: column g, k 8q..8q+7 (+32).
SFA: lane supplies the 4 scale bytes (k blocks 0..3 of the 64-wide step) of row g + 8*(q % 2).
SFB: lane supplies the 4 scale bytes of column g. C: the SM80 16x8 layout.

This module imports the CuTeDSL: it is build-time only (cutedsl/build.py), never imported by tsct.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm120_helpers
import cutlass.utils.blockscaled_layout as bs_layout

SF_VEC = 16  # E2M1 elements per UE4M3 block scale (NVFP4)
MMA_K = 64  # K of one m16n8k64 block-scaled MMA
EPILOGUES = ("alpha", "glu", "row_weight")
E2M1_PLUS_ONE_X8 = 0x22222222  # eight E2M1 +1.0 codes (0x2) in one B register
UE4M3_ONE_X4 = 0x38383838  # four UE4M3 1.0 block scales in one scale register


def _expand_sign_byte(byte):
    """8 sign bits (LSB first, 1 = negative) -> 8 E2M1 codes in one 32-bit register: bit i goes to
    bit 3 (the sign) of nibble i, every magnitude is 1.0 (0x2): nibble = 0x2 | bit << 3."""
    x = cutlass.Uint32(byte)
    x = (x | (x << 12)) & cutlass.Uint32(0x000F000F)  # bits 0-3 at 0-3, bits 4-7 at 16-19
    x = (x | (x << 6)) & cutlass.Uint32(0x03030303)  # two bits per byte
    x = (x | (x << 3)) & cutlass.Uint32(0x11111111)  # bit i at 4i
    return (x << 3) | cutlass.Uint32(E2M1_PLUS_ONE_X8)


def _partition_sf(sf_tile: cute.Tensor, thr_mma, tidx, which: str) -> cute.Tensor:
    """The global-memory view of one thread's scale-factor fragment (what ``partition_fragment_SF*``
    allocates registers for), so that the scales can be loaded straight from global memory."""
    if which == "A":
        thr_layout = sm120_helpers.thrfrg_SFA(sf_tile.layout, thr_mma)
        vmnk = thr_mma.thr_layout_vmnk.get_flat_coord(tidx)
        coord = (vmnk[0], (vmnk[1], vmnk[3]))
    else:
        thr_layout = sm120_helpers.thrfrg_SFB(sf_tile.layout, thr_mma)
        vmnk = thr_mma.thr_layout_vmnk.get_flat_coord(tidx)
        coord = (vmnk[0], (vmnk[2], vmnk[3]))
    t = cute.make_tensor(sf_tile.iterator, thr_layout)[coord, (None, None)]
    # ((V16, V4), MMA_MN, MMA_K): the 16 K elements of one block share a scale (stride 0)
    t = cute.group_modes(cute.flatten(t), 0, 2)
    if cute.rank(t) > 3:  # wide tiles split MMA_MN in several modes: regroup to (V, MMA_MN, MMA_K)
        t = cute.group_modes(t, 1, cute.rank(t) - 1)
    return t


class Nvfp4GemmSm120:
    """Build-time description of one kernel variant (tile, epilogue, output dtype).

    ``tile_m`` x ``tile_n`` output tile per CTA, K stepped 64 at a time (one MMA k-step).
    Warps: ``tile_m/16`` along M times 2 along N (the SM120 N permutation is 32 wide).
    """

    def __init__(self, *, grouped: bool, epilogue: str = "alpha", tile_m: int = 32, tile_n: int = 32,
                 out_dtype=cutlass.BFloat16, sign: bool = False):
        if epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, got {epilogue!r}")
        if not grouped and epilogue != "alpha":
            raise ValueError("the dense kernel has only the 'alpha' epilogue")
        if sign and not grouped:
            raise ValueError("the sign variant is grouped only")
        if tile_m % 16 or tile_m > 128 or 128 % tile_m:
            raise ValueError(f"tile_m must be 16, 32, 64 or 128, got {tile_m}")
        if tile_n % 32:
            raise ValueError(f"tile_n must be a multiple of 32 (SM120 N permutation), got {tile_n}")
        self.is_grouped = grouped
        self.sign = sign
        # activations (A operands, accumulators) per CTA: the sign GLU needs x*a_gate and x*a_up
        self.operands = 2 if (sign and epilogue == "glu") else 1
        self.epilogue = epilogue
        self.tile_m, self.tile_n, self.tile_k = tile_m, tile_n, MMA_K
        self.out_dtype = out_dtype
        self.warps_m = tile_m // 16
        self.warps_n = 2
        self.threads = 32 * self.warps_m * self.warps_n

    # --- construction of the tiled MMA (host side, at trace time) -----------------------------
    def _tiled_mma(self):
        op = cute.nvgpu.warp.MmaMXF4NVF4Op(cutlass.Float4E2M1FN, cutlass.Float32, cutlass.Float8E4M3FN)
        perm = sm120_helpers.get_permutation_mnk((self.tile_m, self.tile_n, self.tile_k), SF_VEC, False)
        return cute.make_tiled_mma(op, cute.make_layout((self.warps_m, self.warps_n, 1)), permutation_mnk=perm)

    # --- dense / batched ------------------------------------------------------------------------
    @cute.jit
    def dense(self, a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, c: cute.Tensor,
              alpha: cute.Tensor, stream: cuda.CUstream):
        """a [M, K, L] e2m1, b [N, K, L] e2m1, sfa/sfb flat UE4M3 bytes (swizzled per matrix l),
        c [M, N, L] out_dtype, alpha [L] fp32. A rows are read (not stored) up to the next multiple
        of tile_m: allocate A with that padding (B rows past N are never read)."""
        tiled_mma = self._tiled_mma()
        msfa = cute.make_tensor(sfa.iterator, bs_layout.tile_atom_to_shape_SF(a.shape, SF_VEC))
        msfb = cute.make_tensor(sfb.iterator, bs_layout.tile_atom_to_shape_SF(b.shape, SF_VEC))
        m, n, l = c.shape
        grid = (cute.ceil_div(m, self.tile_m), cute.ceil_div(n, self.tile_n), l)
        self.dense_kernel(tiled_mma, a, b, msfa, msfb, c, alpha).launch(
            grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def dense_kernel(self, tiled_mma: cute.TiledMma, ma: cute.Tensor, mb: cute.Tensor, msfa: cute.Tensor,
                     msfb: cute.Tensor, mc: cute.Tensor, alpha: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, bl = cute.arch.block_idx()
        m, n, _ = mc.shape
        acc = self._mainloop(tiled_mma, tidx, ma[None, None, bl], mb[None, None, bl], msfa[None, None, bl],
                             msfb[None, None, bl], bm, bn, n)
        self._store(tiled_mma, tidx, acc, mc[None, None, bl], bm, bn, m, n, alpha[bl])

    # --- grouped over experts ------------------------------------------------------------------
    @cute.jit
    def grouped(self, a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfa_offsets: cute.Tensor,
                sfb: cute.Tensor, c: cute.Tensor, offs: cute.Tensor, tile_expert: cute.Tensor,
                tile_row: cute.Tensor, alpha: cute.Tensor, ep0: cute.Tensor, ep1: cute.Tensor,
                stream: cuda.CUstream):
        """a [M_alloc, K] e2m1, rows sorted by expert (M_alloc >= offs[-1] + tile_m - 1: the last
        tile reads, never stores, up to tile_m - 1 rows past the end);
        b [N, K, E] e2m1 (expert e's factor, K contiguous);
        sfa flat UE4M3, expert e's block at byte sfa_offsets[e] (int32 [E]), rows padded to 128;
        sfb flat UE4M3 [E * Np * Kbp] (swizzled per expert);
        c [M, N_out] out_dtype (N_out = N/2 for "glu"); offs [E] int32 cumulative end offsets;
        tile_expert / tile_row [T] int32: the device tile map (expert or -1, first row of the tile);
        alpha [E] fp32; ep0/ep1 fp32: "glu": s_gate / s_up [E, N/2]; "row_weight": ep0 = row
        weights [M] (ep1 unused); "alpha": both unused."""
        if cutlass.const_expr(self.sign):
            raise TypeError("sign kernels are launched through grouped_sign")
        tiled_mma = self._tiled_mma()
        msfb = cute.make_tensor(sfb.iterator, bs_layout.tile_atom_to_shape_SF(b.shape, SF_VEC))
        grid = (cute.size(tile_expert), cute.ceil_div(b.shape[0], self.tile_n), 1)
        self.grouped_kernel(tiled_mma, a, b, sfa, sfa_offsets, msfb, c, offs, tile_expert, tile_row, alpha,
                            ep0, ep1).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.jit
    def grouped_sign(self, a: cute.Tensor, bits: cute.Tensor, sfa: cute.Tensor, sfa_offsets: cute.Tensor,
                     col_scale: cute.Tensor, c: cute.Tensor, offs: cute.Tensor, tile_expert: cute.Tensor,
                     tile_row: cute.Tensor, alpha: cute.Tensor, ep0: cute.Tensor, ep1: cute.Tensor,
                     stream: cuda.CUstream):
        """The sign variant (``sign=True``); P = ``self.operands`` (2 for "glu": gate, up; else 1).

        a [M_alloc, K, P] e2m1: copy p = NVFP4 of ``x * a_p[e]`` (the factor's per-K scale, per
        expert), rows sorted by expert, M_alloc as for ``grouped``;
        bits [N, K/8, E, P] uint8: factor p of expert e, K contiguous, LSB first, 1 = negative
        (``SignTensor.bits`` [E, N, K/8] stacked over p);
        sfa [bytes, P] flat UE4M3: copy p's expert e block at ``sfa_offsets[e]`` (same rows -> one offset
        table for every copy); col_scale [E, N, P] fp32: ``SignTensor.scale_n`` (b) of factor p;
        c [M, N] out_dtype (GLU: N = r, z[:, j] from gate j and up j); alpha [E, P] fp32 = 1/s_enc of
        copy p; ep0/ep1 as for ``grouped`` ("glu": s_gate / s_up [E, N] without any encode scale --
        sign factors have none; "row_weight": ep0 = row weights [M])."""
        if cutlass.const_expr(not self.sign):
            raise TypeError("grouped_sign needs a kernel built with sign=True")
        tiled_mma = self._tiled_mma()
        grid = (cute.size(tile_expert), cute.ceil_div(bits.shape[0], self.tile_n), 1)
        self.grouped_kernel(tiled_mma, a, bits, sfa, sfa_offsets, col_scale, c, offs, tile_expert, tile_row, alpha,
                            ep0, ep1).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def grouped_kernel(self, tiled_mma: cute.TiledMma, ma: cute.Tensor, mb: cute.Tensor, sfa: cute.Tensor,
                       sfa_offsets: cute.Tensor, msfb: cute.Tensor, mc: cute.Tensor, offs: cute.Tensor,
                       tile_expert: cute.Tensor, tile_row: cute.Tensor, alpha: cute.Tensor,
                       ep0: cute.Tensor, ep1: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bt, bn, _ = cute.arch.block_idx()
        e = tile_expert[bt]
        if e >= 0:
            row0 = tile_row[bt]
            lo = cutlass.Int32(0)
            if e > 0:
                lo = offs[e - 1]
            hi = offs[e]
            local_tile_idx = (row0 - lo) // self.tile_m
            if cutlass.const_expr(self.sign):
                # mb = bits [N, K/8, E, P], msfb = col_scale [E, N, P], sfa [bytes, P], alpha [E, P]
                n = mb.shape[0]
                k = ma.shape[1]
                sfa_layout = bs_layout.tile_atom_to_shape_SF((hi - lo + 128, k, 1), SF_VEC)
                accs = []
                for p in cutlass.range_constexpr(self.operands):
                    ma_e = cute.domain_offset((row0, 0), ma[None, None, p])
                    msfa_e = cute.make_tensor(sfa[None, p].iterator + sfa_offsets[e], sfa_layout)
                    accs.append(self._mainloop_rows(tiled_mma, tidx, ma_e, mb[None, None, e, p],
                                                    msfa_e[None, None, 0], None, local_tile_idx, bn, n, k))
                self._epilogue_sign(tiled_mma, tidx, accs[0], accs[self.operands - 1], mc, e, row0, hi, bn, n, alpha,
                                    msfb, ep0, ep1)
            else:
                n, k, _ = mb.shape
                # this expert's rows, starting at the tile (tile_row is lo + a multiple of tile_m)
                ma_e = cute.domain_offset((row0, 0), ma)
                # this expert's activation scales: a swizzled block of its own, rows padded to 128
                sfa_layout = bs_layout.tile_atom_to_shape_SF((hi - lo + 128, k, 1), SF_VEC)
                msfa_e = cute.make_tensor(sfa.iterator + sfa_offsets[e], sfa_layout)
                acc = self._mainloop_rows(tiled_mma, tidx, ma_e, mb[None, None, e], msfa_e[None, None, 0],
                                          msfb[None, None, e], local_tile_idx, bn, n, k)
                self._epilogue_grouped(tiled_mma, tidx, acc, mc, e, row0, hi, bn, n, alpha[e], ep0, ep1)

    @cute.jit
    def _mainloop_rows(self, tiled_mma, tidx, ma_e, mb, msfa_e, msfb, local_tile_idx, tile_col, n_bound, k_extent):
        """As _mainloop, with A already offset to the tile's first row (tile index 0 of ma_e) and
        the A scales indexed by the tile's index inside its expert. Sign: mb is the expert's bits
        ``[N, K/8]`` (read through coordinates in the K loop) and msfb is None."""
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        ga = cute.local_tile(ma_e, (tm, tk), (0, None))
        gsfa = cute.local_tile(msfa_e, (tm, tk), (local_tile_idx, None))
        if cutlass.const_expr(self.sign):
            return self._mma_k_loop(tiled_mma, tidx, ga, mb, gsfa, None, tile_col, n_bound, k_extent)
        gb = cute.local_tile(mb, (tn, tk), (tile_col, None))
        gsfb = cute.local_tile(msfb, (tn, tk), (tile_col, None))
        return self._mma_k_loop(tiled_mma, tidx, ga, gb, gsfa, gsfb, tile_col, n_bound, k_extent)

    @cute.jit
    def _epilogue_grouped(self, tiled_mma, tidx, acc, mc, e, row0, hi, tile_col, n_bound, alpha_e, ep0, ep1):
        thr_mma = tiled_mma.get_slice(tidx)
        tm, tn = self.tile_m, self.tile_n
        cc = cute.local_tile(cute.make_identity_tensor((hi, n_bound)), (tm, tn), (0, tile_col))
        cc = cute.domain_offset((row0, 0), cc)
        tccc = thr_mma.partition_C(cc)  # global (row, column) of each accumulator element
        if cutlass.const_expr(self.epilogue == "glu"):
            # B rows interleaved (2j = gate j, 2j+1 = up j): c0/c1 of the SM80 C layout are columns
            # (2q, 2q+1) of one row, so each thread holds gate and up of the same (row, j).
            for h in cutlass.range_constexpr(2):
                for mi in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                    for ni in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                        crd = tccc[(0, h), mi, ni]
                        if cute.elem_less(crd, (hi, n_bound)):
                            j = crd[1] // 2
                            g = acc[(0, h), mi, ni] * alpha_e * ep0[e, j]
                            u = acc[(1, h), mi, ni] * alpha_e * ep1[e, j]
                            z = g / (cutlass.Float32(1.0) + cute.math.exp(-g)) * u
                            mc[crd[0], j] = z.to(self.out_dtype)
        else:
            for i in cutlass.range_constexpr(cute.size(acc)):
                crd = tccc[i]
                if cute.elem_less(crd, (hi, n_bound)):
                    y = acc[i] * alpha_e
                    if cutlass.const_expr(self.epilogue == "row_weight"):
                        y = y * ep0[crd[0]]
                    mc[crd] = y.to(self.out_dtype)

    @cute.jit
    def _epilogue_sign(self, tiled_mma, tidx, acc0, acc1, mc, e, row0, hi, tile_col, n_bound, alpha, col_scale,
                       ep0, ep1):
        """Sign epilogue: ``y_p = acc_p * b_p[e, n] * alpha[e, p]`` (the per-column scale first), then
        "alpha": y_0; "row_weight": y_0 * ep0[row]; "glu": ``g = y_0 * ep0[e, n]``,
        ``u = y_1 * ep1[e, n]``, ``z = silu(g) * u``. acc0/acc1 share one C layout, so element i of
        both is the same (row, n)."""
        thr_mma = tiled_mma.get_slice(tidx)
        tm, tn = self.tile_m, self.tile_n
        cc = cute.local_tile(cute.make_identity_tensor((hi, n_bound)), (tm, tn), (0, tile_col))
        cc = cute.domain_offset((row0, 0), cc)
        tccc = thr_mma.partition_C(cc)
        for i in cutlass.range_constexpr(cute.size(acc0)):
            crd = tccc[i]
            if cute.elem_less(crd, (hi, n_bound)):
                col = crd[1]
                y = acc0[i] * col_scale[e, col, 0] * alpha[e, 0]
                if cutlass.const_expr(self.epilogue == "glu"):
                    g = y * ep0[e, col]
                    u = acc1[i] * col_scale[e, col, 1] * alpha[e, 1] * ep1[e, col]
                    z = g / (cutlass.Float32(1.0) + cute.math.exp(-g)) * u
                    mc[crd] = z.to(self.out_dtype)
                else:
                    if cutlass.const_expr(self.epilogue == "row_weight"):
                        y = y * ep0[crd[0]]
                    mc[crd] = y.to(self.out_dtype)

    # --- shared device code ---------------------------------------------------------------------
    @cute.jit
    def _mainloop(self, tiled_mma, tidx, ma, mb, msfa, msfb, tile_row, tile_col, n_bound):
        """fp32 accumulator fragment of the (tile_row, tile_col) output tile of ma @ mb^T."""
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        ga = cute.local_tile(ma, (tm, tk), (tile_row, None))  # (tm, tk, k_tiles)
        gb = cute.local_tile(mb, (tn, tk), (tile_col, None))
        gsfa = cute.local_tile(msfa, (tm, tk), (tile_row, None))
        gsfb = cute.local_tile(msfb, (tn, tk), (tile_col, None))
        return self._mma_k_loop(tiled_mma, tidx, ga, gb, gsfa, gsfb, tile_col, n_bound, ma.shape[1])

    @cute.jit
    def _mma_k_loop(self, tiled_mma, tidx, ga, gb, gsfa, gsfb, tile_col, n_bound, k_extent):
        """The K loop: per 64-wide k-step, load fragments and scales from global, one block-scaled
        MMA per (warp, m16 x n8 atom). fp32 accumulation in registers, in k order."""
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        thr_mma = tiled_mma.get_slice(tidx)
        tcga = thr_mma.partition_A(ga)  # (MMA, MMA_M, MMA_K, k_tiles)
        tcra = tiled_mma.make_fragment_A(tcga[None, None, None, 0])
        tcrsfa = cute.make_fragment_like(_partition_sf(gsfa[None, None, 0], thr_mma, tidx, "A"))
        if cutlass.const_expr(self.sign):
            # gb is the expert's sign bits [N, K/8]; B registers are built from them in the loop.
            # Views over the bits pointer that only supply the NVFP4 fragment layouts (never read):
            # B codes [N, K] and the B scales, which are the constant UE4M3 1.0.
            b_view = cute.make_tensor(cute.recast_ptr(gb.iterator, dtype=cutlass.Float4E2M1FN),
                                      cute.make_layout((n_bound, k_extent), stride=(k_extent, 1)))
            tcrb = tiled_mma.make_fragment_B(
                thr_mma.partition_B(cute.local_tile(b_view, (tn, tk), (tile_col, 0))))
            sf_view = cute.make_tensor(cute.recast_ptr(gb.iterator, dtype=cutlass.Float8E4M3FN),
                                       bs_layout.tile_atom_to_shape_SF((n_bound, k_extent, 1), SF_VEC))
            gsfb_view = cute.local_tile(sf_view[None, None, 0], (tn, tk), (tile_col, None))
            tcrsfb = cute.make_fragment_like(_partition_sf(gsfb_view[None, None, 0], thr_mma, tidx, "B"))
            cute.recast_tensor(cute.filter_zeros(tcrsfb), cutlass.Uint8).fill(UE4M3_ONE_X4 & 0xFF)
            tcrb32 = cute.recast_tensor(tcrb, cutlass.Uint32)  # one register = 8 E2M1 codes (k, k+1, ..)
        else:
            tcgb = thr_mma.partition_B(gb)
            tcrb = tiled_mma.make_fragment_B(tcgb[None, None, None, 0])
            tcrsfb = cute.make_fragment_like(_partition_sf(gsfb[None, None, 0], thr_mma, tidx, "B"))
        # B rows past the matrix (N not a multiple of tile_n, e.g. f = 5461) are not read: their
        # fragments are zero (codes 0 = +0.0), so the products are 0 and the store drops them anyway.
        cb = cute.local_tile(cute.make_identity_tensor((n_bound, k_extent)), (tn, tk), (tile_col, 0))
        tccb = thr_mma.partition_B(cb)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((tm, tn)), cutlass.Float32)
        acc.fill(0.0)
        k_tiles = cute.size(ga, mode=[2])
        for kt in cutlass.range(k_tiles, unroll=1):
            cute.autovec_copy(tcga[None, None, None, kt], tcra)
            if cutlass.const_expr(self.sign):
                # register (w, j, kb) holds 8 consecutive k of one column n: exactly one byte of bits
                # (PTX: b0 = column g, k 8q..8q+7; b1 = k + 32; lower k in the lower nibble).
                for j in cutlass.range_constexpr(cute.size(tcrb32, mode=[1])):
                    for kb in cutlass.range_constexpr(cute.size(tcrb32, mode=[2])):
                        for w in cutlass.range_constexpr(cute.size(tcrb32, mode=[0])):
                            crd = tccb[w * 8, j, kb]  # (n, k inside the k-step) of the register's first code
                            word = cutlass.Uint32(0)  # columns past N: +0.0 codes, as for NVFP4
                            if cute.elem_less(crd[0], n_bound):
                                word = _expand_sign_byte(gb[crd[0], kt * (tk // 8) + crd[1] // 8])
                            tcrb32[w, j, kb] = word
            else:
                for j in cutlass.range_constexpr(cute.size(tcrb, mode=[1])):
                    if cute.elem_less(tccb[0, j, 0][0], n_bound):
                        cute.autovec_copy(tcgb[None, j, None, kt], tcrb[None, j, None])
                    else:
                        cute.recast_tensor(tcrb[None, j, None], cutlass.Int8).fill(0)
                gsfb_k = _partition_sf(gsfb[None, None, kt], thr_mma, tidx, "B")
                cute.autovec_copy(cute.filter_zeros(gsfb_k), cute.filter_zeros(tcrsfb))
            gsfa_k = _partition_sf(gsfa[None, None, kt], thr_mma, tidx, "A")
            cute.autovec_copy(cute.filter_zeros(gsfa_k), cute.filter_zeros(tcrsfa))
            for kb in cutlass.range_constexpr(cute.size(tcra, mode=[2])):
                cute.gemm(tiled_mma, acc, [tcra[None, None, kb], tcrsfa[None, None, kb]],
                          [tcrb[None, None, kb], tcrsfb[None, None, kb]], acc)
        return acc

    @cute.jit
    def _store(self, tiled_mma, tidx, acc, mc, tile_row, tile_col, m_bound, n_bound, scale):
        """Y = scale * acc, bounds-checked element-wise store of one output tile."""
        thr_mma = tiled_mma.get_slice(tidx)
        gc = cute.local_tile(mc, (self.tile_m, self.tile_n), (tile_row, tile_col))
        cc = cute.local_tile(cute.make_identity_tensor((m_bound, n_bound)), (self.tile_m, self.tile_n),
                             (tile_row, tile_col))
        tcgc = thr_mma.partition_C(gc)
        tccc = thr_mma.partition_C(cc)
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(tccc[i], (m_bound, n_bound)):
                tcgc[i] = (acc[i] * scale).to(self.out_dtype)
