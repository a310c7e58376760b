"""Host-side preparation for the sm_120 NVFP4 grouped GEMMs (cutedsl/tsct_cutedsl/nvfp4_gemm_sm120.py).

Everything here is torch on the tensors' own device and never reads a device value on the host
(no ``.item()``, ``.tolist()``, ``int(t)``): sizes that must be known before launch are upper
bounds computed from host integers (M, E, K, the tile), the rest are device tensors. The tests run
these functions on the ``meta`` device to prove it (a host read there raises).

What the kernels take, and where it comes from:

* ``tile_map``: the device tile map. Grid x covers ``max_tiles`` CTAs; CTA t works on rows
  ``[tile_row[t], tile_row[t] + tile_m)`` of expert ``tile_expert[t]`` (rows past the expert's end
  are computed and dropped), or exits when ``tile_expert[t] == -1``. Empty experts get no tile.
* ``sfa_layout``: activation block scales, one ``swizzled_128x4`` block per expert with its rows
  padded to 128 (the per-group layout of CUTLASS' grouped block-scaled GEMMs, cuBLAS and torch),
  starting at ``sfa_offsets[e]`` bytes; ``sfa_bytes`` bounds the whole buffer.
* ``a_rows_alloc``: the activation codes buffer needs ``tile_m - 1`` rows past ``M``: the last tile
  of the last expert reads (never stores) that far.
* ``interleave_rows``: the GLU kernel reads w_gate and w_up as one ``[E, 2r, K]`` factor whose row
  2j is gate rank j and row 2j+1 up rank j, so that gate and up of one (row, j) land in one thread
  (the c0/c1 pair of the MMA's C fragment).
* ``glu_scales`` / ``alpha``: per-expert second-level scales folded into the epilogue. tsct stores
  the ENCODE scale s_enc (decode divides by it), so ``alpha[e] = 1 / s_enc_x[e]`` and the per-rank
  vectors carry the factor's: ``ep0[e, j] = s_gate[e, j] / s_enc_gate[e]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SF_TILE_ROWS", "max_tiles", "tile_map", "a_rows_alloc", "sfa_layout", "sfa_bytes_bound",
           "sfb_bytes", "interleave_rows", "alpha_from_encode_scales", "glu_scales", "GroupedPlan",
           "make_plan"]

SF_TILE_ROWS = 128  # rows of one swizzled_128x4 scale tile
_SF_TILE_COLS = 4


def _ceil_div(a, b):
    return -(-a // b)


def _check_offs(offs: Tensor) -> None:
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError(f"offs must be a 1-D int32 tensor (cumulative end offsets), got "
                        f"{getattr(offs, 'dtype', type(offs))} {list(getattr(offs, 'shape', []))}")


def _counts(offs: Tensor) -> Tensor:
    """Rows per expert (int64), from cumulative end offsets."""
    o = offs.long()
    return torch.diff(o, prepend=o.new_zeros(1))


def max_tiles(m: int, num_experts: int, tile_m: int) -> int:
    """Upper bound on sum_e ceil(m_e / tile_m) over every split of m rows among E experts.

    sum_e ceil(m_e / t) <= sum_e (m_e + t - 1) / t, and at most min(E, m) experts are non-empty.
    """
    if m < 0 or num_experts < 0 or tile_m <= 0:
        raise ValueError(f"need m >= 0, num_experts >= 0, tile_m > 0; got {m}, {num_experts}, {tile_m}")
    busy = min(num_experts, m)
    return (m + busy * (tile_m - 1)) // tile_m


def tile_map(offs: Tensor, tile_m: int, num_tiles: int) -> tuple[Tensor, Tensor]:
    """Device tile map: (tile_expert, tile_row), both int32 ``[num_tiles]``.

    Tiles are expert-major, in row order. ``tile_expert[t] = -1`` (and ``tile_row[t] = 0``) for
    t past the last tile. ``num_tiles`` must be at least ``max_tiles(M, E, tile_m)``; it is the
    grid size, a host integer.
    """
    _check_offs(offs)
    counts = _counts(offs).clamp_min(0)
    tiles = _ceil_div(counts, tile_m)  # int64 [E]
    cum = torch.cumsum(tiles, 0)
    t = torch.arange(num_tiles, device=offs.device, dtype=torch.int64)
    if offs.numel() == 0:
        return (torch.full((num_tiles,), -1, dtype=torch.int32, device=offs.device),
                torch.zeros(num_tiles, dtype=torch.int32, device=offs.device))
    e = torch.searchsorted(cum, t, right=True)  # first expert whose cumulative tiles exceed t
    valid = e < offs.numel()
    e_c = e.clamp_max(offs.numel() - 1)
    lo = offs.long() - counts
    row = lo[e_c] + (t - (cum - tiles)[e_c]) * tile_m
    tile_expert = torch.where(valid, e_c, torch.full_like(e_c, -1)).to(torch.int32)
    tile_row = torch.where(valid, row, torch.zeros_like(row)).to(torch.int32)
    return tile_expert, tile_row


def a_rows_alloc(m: int, tile_m: int) -> int:
    """Rows to allocate for the activation codes ``[rows, K/2]``: the last tile may read tile_m - 1 past M."""
    return m + tile_m - 1


def sfa_layout(offs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(sfa_offsets int32 [E] in bytes, padded rows int64 [E]) of the per-expert swizzled A scales.

    Expert e's scales occupy ``pad128(m_e) * Kbp`` bytes (Kbp = ceil(K/16/4)*4) from
    ``sfa_offsets[e]``; inside, scale (i, kb) of its i-th row is at the swizzled_128x4 offset.
    """
    _check_offs(offs)
    if k % 16:
        raise ValueError(f"K must be a multiple of 16, got {k}")
    kbp = _ceil_div(k // 16, _SF_TILE_COLS) * _SF_TILE_COLS
    padded = _ceil_div(_counts(offs).clamp_min(0), SF_TILE_ROWS) * SF_TILE_ROWS
    sizes = padded * kbp
    offsets = torch.cumsum(sizes, 0) - sizes
    return offsets.to(torch.int32), padded


def sfa_bytes_bound(m: int, num_experts: int, k: int) -> int:
    """Bytes to allocate for the per-expert swizzled A scales, for any split of m rows (host ints only)."""
    kbp = _ceil_div(k // 16, _SF_TILE_COLS) * _SF_TILE_COLS
    busy = min(num_experts, m)
    return _ceil_div(m + busy * (SF_TILE_ROWS - 1), SF_TILE_ROWS) * SF_TILE_ROWS * kbp if m else 0


def sfb_bytes(num_experts: int, n: int, k: int) -> int:
    """Bytes of a factor's swizzled block scales ``[E, Np * Kbp]`` (the layout tsct.quant writes)."""
    np_ = _ceil_div(n, SF_TILE_ROWS) * SF_TILE_ROWS
    kbp = _ceil_div(k // 16, _SF_TILE_COLS) * _SF_TILE_COLS
    return num_experts * np_ * kbp


def interleave_rows(first: Tensor, second: Tensor) -> Tensor:
    """``[E, N, X]`` and ``[E, N, X]`` -> ``[E, 2N, X]`` with row 2j = first[j], row 2j+1 = second[j].

    Applied to NVFP4 codes ``[E, r, K/2]`` and LINEAR block scales ``[E, r, K/16]`` of w_gate / w_up
    (swizzle after interleaving: ``tsct.quant.layout.to_swizzled``).
    """
    if first.shape != second.shape or first.dtype != second.dtype or first.dim() != 3:
        raise ValueError(f"need two [E, N, X] tensors of one dtype, got {list(first.shape)} {first.dtype} and "
                         f"{list(second.shape)} {second.dtype}")
    return torch.stack((first, second), dim=2).reshape(first.shape[0], 2 * first.shape[1], first.shape[2])


def alpha_from_encode_scales(s_enc_a: Tensor, s_enc_b: Tensor | None = None) -> Tensor:
    """fp32 ``1 / (s_enc_a * s_enc_b)`` per expert (true division; s_enc_b omitted = 1)."""
    den = s_enc_a.float() if s_enc_b is None else s_enc_a.float() * s_enc_b.float()
    return torch.div(torch.ones_like(den), den)


def glu_scales(s_enc_gate: Tensor, s_enc_up: Tensor, s_gate: Tensor | None, s_up: Tensor | None,
               r: int) -> tuple[Tensor, Tensor]:
    """ep0 / ep1 ``[E, r]`` fp32 for the GLU epilogue: per-rank scale / the factor's encode scale."""
    e = s_enc_gate.shape[0]
    ones = torch.ones(e, r, dtype=torch.float32, device=s_enc_gate.device)
    sg = ones if s_gate is None else s_gate.float()
    su = ones if s_up is None else s_up.float()
    return (torch.div(sg, s_enc_gate.float().unsqueeze(1)), torch.div(su, s_enc_up.float().unsqueeze(1)))


class GroupedPlan:
    """Everything the grouped kernel launch needs besides the operands (all device tensors or host ints)."""

    def __init__(self, *, tile_m: int, tile_n: int, num_tiles: int, n: int, k: int, tile_expert: Tensor,
                 tile_row: Tensor, sfa_offsets: Tensor, sfa_padded_rows: Tensor, a_rows: int, sfa_bytes: int):
        self.tile_m, self.tile_n, self.num_tiles, self.n, self.k = tile_m, tile_n, num_tiles, n, k
        self.tile_expert, self.tile_row = tile_expert, tile_row
        self.sfa_offsets, self.sfa_padded_rows = sfa_offsets, sfa_padded_rows
        self.a_rows, self.sfa_bytes = a_rows, sfa_bytes

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.num_tiles, _ceil_div(self.n, self.tile_n), 1)


def make_plan(offs: Tensor, m: int, n: int, k: int, *, tile_m: int = 32, tile_n: int = 32) -> GroupedPlan:
    """The launch plan of one grouped GEMM ``[M, K] x [E, N, K]`` (host ints m, n, k; device offs)."""
    _check_offs(offs)
    if k % 64:
        raise ValueError(f"K must be a multiple of 64 (one MMA k-step), got {k}")
    num_experts = offs.shape[0]
    num_tiles = max(1, max_tiles(m, num_experts, tile_m))
    tile_expert, tile_row = tile_map(offs, tile_m, num_tiles)
    sfa_offsets, padded = sfa_layout(offs, k)
    return GroupedPlan(tile_m=tile_m, tile_n=tile_n, num_tiles=num_tiles, n=n, k=k, tile_expert=tile_expert,
                       tile_row=tile_row, sfa_offsets=sfa_offsets, sfa_padded_rows=padded,
                       a_rows=a_rows_alloc(m, tile_m), sfa_bytes=sfa_bytes_bound(m, num_experts, k))
