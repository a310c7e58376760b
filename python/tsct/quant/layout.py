"""Block-scale layouts of NVFP4: ``linear`` (storage) and ``swizzled_128x4`` (tensor-core operand).

``linear``: the UE4M3 block scales of each ``[N, K]`` matrix as a row-major ``[N, Kb]`` array,
Kb = K / 16.

``swizzled_128x4``: the layout block-scaled tensor cores read on sm_100/sm_120, shared by CUTLASS
(``Sm1xxBlockScaledConfig``), cuBLAS ("block scaling factors layout") and torchao (``to_blocked``).
Rows are padded to Np = ceil(N/128)*128, scale columns to Kbp = ceil(Kb/4)*4, and each 128x4 tile
is stored as 512 contiguous bytes, tiles row-major::

    offset(m, kb) = (m // 128) * (Kbp / 4) * 512 + (kb // 4) * 512
                    + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4

Padding bytes are 0. A swizzled matrix is a flat ``[Np * Kbp]`` buffer; a batch is ``[E, Np * Kbp]``.
Containers always carry their layout name and conversion is explicit (``to_layout``): two layouts
never meet unlabelled (design.md section 3, decision 0002).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "LINEAR", "SWIZZLED_128X4", "check_layout", "swizzled_shape", "swizzle_offsets",
           "to_swizzled", "to_linear", "to_layout"]

LINEAR = "linear"
SWIZZLED_128X4 = "swizzled_128x4"
LAYOUTS = (LINEAR, SWIZZLED_128X4)

_TILE_ROWS = 128  # rows of one swizzled tile
_TILE_COLS = 4  # scale columns of one swizzled tile
_TILE_BYTES = _TILE_ROWS * _TILE_COLS  # 512


def check_layout(layout) -> str:
    """Return ``layout`` if it names a block-scale layout, else raise ValueError naming it."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def swizzled_shape(n: int, kb: int) -> tuple[int, int]:
    """(Np, Kbp): rows padded to a multiple of 128, scale columns to a multiple of 4."""
    if n < 0 or kb < 0:
        raise ValueError(f"n and kb must be >= 0, got n={n}, kb={kb}")
    return _ceil_to(n, _TILE_ROWS), _ceil_to(kb, _TILE_COLS)


def swizzle_offsets(n: int, kb: int, device=None) -> Tensor:
    """int64 ``[n, kb]``: the byte offset of scale (m, kb) in the swizzled buffer (formula above)."""
    _, kbp = swizzled_shape(n, kb)
    m = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(1)
    k = torch.arange(kb, dtype=torch.int64, device=device).unsqueeze(0)
    return ((m // 128) * (kbp // 4) * 512 + (k // 4) * 512
            + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4)


def _as_bytes(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def to_swizzled(scales: Tensor) -> Tensor:
    """Linear block scales ``[..., N, Kb]`` -> swizzled ``[..., Np * Kbp]`` (same dtype, padding 0).

    Any 1-byte dtype (``float8_e4m3fn`` or ``uint8``) is moved bit for bit.
    """
    if not isinstance(scales, Tensor):
        raise TypeError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    if scales.element_size() != 1:
        raise TypeError(f"scales must have a 1-byte dtype (float8_e4m3fn or uint8), got {scales.dtype}")
    if scales.dim() < 2:
        raise ValueError(f"scales must be [..., N, Kb], got shape {list(scales.shape)}")
    *batch, n, kb = scales.shape
    np_, kbp = swizzled_shape(n, kb)
    src = _as_bytes(scales)
    padded = src.new_zeros((*batch, np_, kbp))
    padded[..., :n, :kb] = src
    # m = 128*a + 32*b + c, kb = 4*d + f  ->  offset = a*(Kbp/4)*512 + d*512 + c*16 + b*4 + f
    t = padded.reshape(*batch, np_ // 128, 4, 32, kbp // 4, 4)
    nb = len(batch)
    t = t.permute(*range(nb), nb + 0, nb + 3, nb + 2, nb + 1, nb + 4)
    return t.reshape(*batch, np_ * kbp).view(scales.dtype)


def to_linear(swizzled: Tensor, n: int, kb: int) -> Tensor:
    """Swizzled block scales ``[..., Np * Kbp]`` of an ``[N, Kb]`` scale matrix -> linear ``[..., N, Kb]``."""
    if not isinstance(swizzled, Tensor):
        raise TypeError(f"swizzled must be a torch.Tensor, got {type(swizzled).__name__}")
    if swizzled.element_size() != 1:
        raise TypeError(f"swizzled must have a 1-byte dtype (float8_e4m3fn or uint8), got {swizzled.dtype}")
    np_, kbp = swizzled_shape(n, kb)
    if swizzled.dim() < 1 or swizzled.shape[-1] != np_ * kbp:
        raise ValueError(f"swizzled: expected last dim Np*Kbp = {np_}*{kbp} = {np_ * kbp} for n={n}, kb={kb}, "
                         f"got shape {list(swizzled.shape)}")
    *batch, _ = swizzled.shape
    nb = len(batch)
    t = _as_bytes(swizzled).reshape(*batch, np_ // 128, kbp // 4, 32, 4, 4)  # (a, d, c, b, f)
    t = t.permute(*range(nb), nb + 0, nb + 3, nb + 2, nb + 1, nb + 4)  # (a, b, c, d, f)
    t = t.reshape(*batch, np_, kbp)[..., :n, :kb].contiguous()
    return t.view(swizzled.dtype)


def to_layout(container, layout: str):
    """The same NVFP4Tensor with its block scales in ``layout`` (returned as is if already there).

    Only NVFP4Tensor has block scales; anything else is a TypeError.
    """
    from tsct.quant.nvfp4 import NVFP4Tensor

    check_layout(layout)
    if not isinstance(container, NVFP4Tensor):
        raise TypeError(f"container must be an NVFP4Tensor (the only format with block scales), "
                        f"got {type(container).__name__}")
    if container.layout == layout:
        return container
    n, kb = container.n, container.k // 16
    if layout == SWIZZLED_128X4:
        scales = to_swizzled(container.block_scale)
    else:
        scales = to_linear(container.block_scale, n, kb)
    return container.replace(block_scale=scales, layout=layout)
