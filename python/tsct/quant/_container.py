"""What every packed factor container shares: logical shape accessors, storage bytes, moves.

A subclass is a frozen dataclass whose storage tensors are named in ``_STORAGE`` (the first one
defines the device) and whose ``shape`` field is the LOGICAL ``(E, K, N)`` or ``(K, N)``.
"""

from __future__ import annotations

import dataclasses

import torch


class PackedFactor:
    _STORAGE: tuple[str, ...] = ()
    shape: tuple

    @property
    def batch(self) -> int:
        """E (1 for a 2-D factor): the leading dim of every storage tensor."""
        return self.shape[0] if len(self.shape) == 3 else 1

    @property
    def k(self) -> int:
        """The contraction dim K (d for w_gate/w_up, r for w_down)."""
        return self.shape[-2]

    @property
    def n(self) -> int:
        """The output dim N."""
        return self.shape[-1]

    @property
    def device(self) -> torch.device:
        return getattr(self, self._STORAGE[0]).device

    @property
    def nbytes(self) -> int:
        """Bytes of storage, padding and scales included."""
        return sum(getattr(self, f).numel() * getattr(self, f).element_size() for f in self._STORAGE)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to(self, device, non_blocking: bool = False):
        """The same container on ``device`` (tensors moved bit for bit)."""
        return self.replace(**{f: getattr(self, f).to(device, non_blocking=non_blocking) for f in self._STORAGE})
