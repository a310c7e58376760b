"""Host-side preparation for the CUTLASS sm_120 grouped NVFP4 GEMM (csrc/cutlass/tsct_cutlass.h).

Self-contained (torch only) so that it can move into the package once the kernel is wired
(decision 0007). Nothing here reads a device value on the host: per-group arrays are built with
torch ops on ``offs``'s device (the tests run them on ``meta``), sizes known before launch come from
host integers (M, E, N, K).

The call computes, per expert e with rows [start_e, end_e) of the routed activation:

    out[start_e:end_e, :N] = alpha[e] * dequant(x[start_e:end_e]) @ dequant(w[e])^T

and CUTLASS sees it transposed ("swap AB"): problem (M', N', K) = (N, M_e, K), CUTLASS A = w[e],
CUTLASS B = x rows of e, D = out rows of e read column-major. So SFA = the factor's scales and SFB =
the activation's, both in CUTLASS's Sm1xxBlockScaledConfig layout = tsct's swizzled_128x4:

    offset(r, kb) = (r//128)*ceil(Kb/4)*512 + (kb//4)*512 + (r%32)*16 + ((r%128)//32)*4 + kb%4

(design.md section 3, ``tsct.quant.layout.swizzle_offsets``), one such block per group, rows padded
to 128 PER GROUP (CUTLASS builds each group's layout from that group's own (M', N', K)).
"""

from __future__ import annotations

import torch
from torch import Tensor

TILE_M, TILE_N, TILE_K = 128, 32, 128  # CUTLASS tile: M' = factor rows, N' = expert rows
SF_VEC = 16
SF_ROWS = 128  # rows of one swizzled scale tile
SF_COLS = 4  # scale columns of one swizzled tile
ALIGN = 256  # workspace sub-buffer alignment (grouped_nvfp4_sm120.cu)


def ceil_div(a, b):
    return -(-a // b)


def check_shapes(n: int, k: int) -> None:
    """The kernel's shape rules: K % 128 (whole K tiles and scale columns), N % 8 (16-byte rows of bf16 out)."""
    if k <= 0 or k % TILE_K:
        raise ValueError(f"K must be a positive multiple of {TILE_K}, got {k}")
    if n <= 0 or n % 8:
        raise ValueError(f"N must be a positive multiple of 8, got {n}")


def _check_offs(offs: Tensor) -> None:
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError("offs must be a 1-D int32 tensor of cumulative end offsets")


def counts_starts(offs: Tensor) -> tuple[Tensor, Tensor]:
    """(rows per expert, first row per expert), int64, from cumulative end offsets."""
    _check_offs(offs)
    o = offs.long()
    starts = torch.cat([o.new_zeros(1), o[:-1]])
    return o - starts, starts


def sf_cols_padded(k: int) -> int:
    """Kbp: scale columns per row in the swizzled layout (K/16 rounded up to 4)."""
    return ceil_div(k // SF_VEC, SF_COLS) * SF_COLS


def sf_block_bytes(rows, k: int):
    """Bytes of one group's swizzled scale block: pad128(rows) * Kbp (ints or int64 tensors)."""
    return ceil_div(rows, SF_ROWS) * SF_ROWS * sf_cols_padded(k)


def sf_offset(r, kb, k: int):
    """Byte offset of scale (row r, column kb) inside one group's block (ints or tensors)."""
    kbp = sf_cols_padded(k)
    return ((r // 128) * (kbp // 4) * 512 + (kb // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + kb % 4)


def problem_nmk(offs: Tensor, n: int, k: int) -> Tensor:
    """int32 [E, 3]: CUTLASS's per-group (M', N', K) = (N, M_e, K). Empty experts keep M_e = 0 (no tile)."""
    check_shapes(n, k)
    cnt, _ = counts_starts(offs)
    e = cnt.numel()
    return torch.stack([cnt.new_full((e,), n), cnt, cnt.new_full((e,), k)], 1).to(torch.int32)


def x_sf_offsets(offs: Tensor, k: int) -> Tensor:
    """int64 [E]: start byte of expert e's activation-scale block (blocks back to back, each 512-aligned)."""
    cnt, _ = counts_starts(offs)
    sizes = sf_block_bytes(cnt, k)
    return torch.cumsum(sizes, 0) - sizes


def x_sf_bytes_bound(m: int, num_experts: int, k: int) -> int:
    """Bytes to allocate for the activation scales, for any split of m rows over the experts (host ints)."""
    if m == 0:
        return 0
    busy = min(num_experts, m)  # at most this many non-empty groups, each wasting < 128 rows
    return ceil_div(m + busy * (SF_ROWS - 1), SF_ROWS) * SF_ROWS * sf_cols_padded(k)


def w_sf_bytes(n: int, k: int) -> int:
    """Bytes of one expert's factor-scale block (the layout tsct.quant writes for [E, N, K] factors)."""
    return sf_block_bytes(n, k)


def pointer_arrays(offs: Tensor, n: int, k: int, *, w: int, w_sf: int, x: int, x_sf: int, out: int,
                   ) -> dict[str, Tensor]:
    """int64 [E] device addresses per group from the base addresses (host ints, e.g. ``t.data_ptr()``).

    w: [E, N, K/2] codes; w_sf: [E, w_sf_bytes(N, K)]; x: [M, K/2] codes (routed rows, grouped by
    expert); x_sf: per-expert blocks at ``x_sf_offsets``; out: bf16 [M, N]. Empty experts get valid
    (never dereferenced) addresses inside their neighbours' buffers.
    """
    check_shapes(n, k)
    cnt, starts = counts_starts(offs)
    e = torch.arange(cnt.numel(), dtype=torch.int64, device=offs.device)
    return {
        "ptr_w": w + e * (n * k // 2),
        "ptr_w_sf": w_sf + e * w_sf_bytes(n, k),
        "ptr_x": x + starts * (k // 2),
        "ptr_x_sf": x_sf + x_sf_offsets(offs, k),
        "ptr_out": out + starts * (n * 2),
    }


def check_alignment(ptrs: dict[str, Tensor]) -> Tensor:
    """Device bool: every operand address 16-byte aligned and every scale address 128-byte aligned (TMA)."""
    ok = torch.ones((), dtype=torch.bool, device=ptrs["ptr_w"].device)
    for name, a in ptrs.items():
        ok = ok & ((a % (128 if name.endswith("_sf") else 16)) == 0).all()
    return ok


def align_up(x: int, a: int = ALIGN) -> int:
    return ceil_div(x, a) * a


def prep_bytes(groups: int, elem_bytes: tuple[int, ...]) -> int:
    """The prep part of the workspace: one 256-aligned array per per-group CUTLASS type
    (StrideA, StrideB, StrideD, LayoutSFA, LayoutSFB; their sizes come from the compiled object)."""
    return sum(align_up(groups * s) for s in elem_bytes) if groups else 0


def grouped_reference(xq: Tensor, wq: Tensor, offs: Tensor, alpha: Tensor) -> Tensor:
    """fp32 oracle of the call on dequantized operands: x [M, K], w [E, N, K] (already decoded)."""
    cnt, starts = counts_starts(offs)
    out = xq.new_zeros(xq.shape[0], wq.shape[1], dtype=torch.float32)
    for e in range(wq.shape[0]):  # CPU tests only (host loop)
        s, c = int(starts[e]), int(cnt[e])
        if c:
            out[s:s + c] = alpha[e].float() * (xq[s:s + c].float() @ wq[e].float().T)
    return out
