"""Factor layouts the Triton kernels read in place (docs/decisions/0012). Imports torch only."""

from __future__ import annotations

from torch import Tensor


def is_kmajor(t: Tensor) -> bool:
    """``t`` is the transpose of a contiguous tensor in its last two dims (not contiguous itself): a
    K-major w_down ``[E, r, f]`` stored as a contiguous ``[E, f, r]``, nn.Linear's layout per expert."""
    return t.dim() >= 2 and not t.is_contiguous() and t.transpose(-1, -2).is_contiguous()


def to_kmajor(t: Tensor) -> Tensor:
    """A K-major copy of ``t`` (same shape and values; ``is_kmajor`` of the result holds when its last two
    dims are > 1): the transpose of a contiguous copy of ``t.transpose(-1, -2)``."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)
