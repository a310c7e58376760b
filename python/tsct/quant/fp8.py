"""FP8 factors: the ``FP8Tensor`` container and its quantizer / decoder.

Format (``formats.py``; decision ``docs/decisions/0021-fp8-format.md``): one OCP E4M3 ("fn") code per
element, stored K-contiguous (``[E, N, K]``, one byte each), and one fp32 scale per output column per
expert, ``scale_n = amax / 448`` over the column's K elements. Per-column scaling was measured against
MX-style blocks of 32 along K with E8M0 scales and kept (0021): equal or lower error on every factor
tried, and the scale sits on the GEMM's output (``x @ W = (x @ E4M3) * scale_n``) as the sign format's
``b`` does, so an FP8 or bf16 tensor-core kernel reads the codes unscaled.

Orientation: a factor of LOGICAL shape ``[E, K, N]`` (``w_gate``/``w_up``: ``[E, d, r]``; ``w_down``:
``[E, r, f]``; K = dim -2 is the contraction dim) is stored like ``nn.Linear.weight``: codes
``[E, N, K]``. A 2-D ``[K, N]`` factor is a batch of one; ``shape`` stays the logical shape.

The recipe, per column n of matrix e (the storage row ``x[e, n, :]``), in IEEE fp32:
  1. ``amax`` = max |x| over the column's finite elements (0 if none).
  2. ``scale`` = amax / 448 (a true division); 1 if that is 0 (an all-zero column, or an amax so small
     that amax / 448 underflows).
  3. code = E4M3 of ``x / scale``, round to nearest even, saturating at +-448 (``x / scale`` can round
     just above 448), signed zeros kept; a nan or +-inf element gets the NaN code 0x7F.
  Decode: ``x_hat = e4m3(code) * scale`` in fp32, then the output dtype (round to nearest even).
A non-finite input therefore decodes to NaN at its own position and changes nothing else. Values that
are E4M3 values times the column's scale (e.g. a column whose amax is 448 * 2^j) round-trip exactly.
``backend="native"`` runs step 3 and the decode in the CUDA kernels of ``csrc/quant/fp8.cu`` (same
bits); steps 1-2 are torch on the tensor's device (a max and one division: the same bits everywhere).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from tsct.quant import _backend
from tsct.quant._container import PackedFactor
from tsct.quant.formats import E4M3_DTYPE, E4M3_MAX, e4m3_decode, e4m3_encode

__all__ = ["FP8Tensor", "quantize_fp8", "fp8_column_scale"]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class FP8Tensor(PackedFactor):
    """An FP8 (E4M3, per-column scale) factor bank: ``W[e, k, n] ~ e4m3(codes[e, n, k]) * scale_n[e, n]``.

    Attributes:
        codes: float8_e4m3fn ``[E, N, K]`` (K contiguous); 0x7F marks a non-finite input (NaN).
        scale_n: float32 ``[E, N]``, the DECODE scale of each output column (amax / 448, or 1).
        shape: the LOGICAL shape, ``(E, K, N)`` or ``(K, N)`` (stored as a batch of one).
    """

    _STORAGE = ("codes", "scale_n")

    codes: Tensor
    scale_n: Tensor
    shape: tuple

    def __post_init__(self):
        self._check_storage(1, lambda: [
            ("codes", self.codes, E4M3_DTYPE, (self.batch, self.n, self.k)),
            ("scale_n", self.scale_n, torch.float32, (self.batch, self.n)),
        ])

    def _decode_native(self, lib, dtype: torch.dtype) -> Tensor:
        """``e4m3(code) * scale_n[n]`` in fp32, then ``dtype`` (``PackedFactor.dequantize``)."""
        return lib.fp8_dequantize(self.codes.view(torch.uint8), self.scale_n, dtype)

    def _decode_torch(self, e0: int, e1: int) -> Tensor:
        return e4m3_decode(self.codes[e0:e1]) * self.scale_n[e0:e1].unsqueeze(2)

    def __repr__(self) -> str:
        return (f"FP8Tensor(shape={list(self.shape)}, device={self.device}, "
                f"storage=[{self.batch}, {self.n}, {self.k}] K-contiguous, nbytes={self.nbytes})")


def fp8_column_scale(x: Tensor) -> Tensor:
    """Decode scale per column (steps 1-2 of the recipe): x ``[B, N, K]`` (any float dtype) -> fp32 ``[B, N]``."""
    if x.shape[-1] == 0:
        return torch.ones(x.shape[:-1], dtype=torch.float32, device=x.device)
    amax = torch.where(torch.isfinite(x), x.abs(), 0).amax(dim=-1).float()  # abs/max exact in any dtype
    s = torch.div(amax, torch.full_like(amax, E4M3_MAX))  # tensor / tensor: a true division on every device
    return torch.where(s == 0, torch.ones_like(s), s)


def quantize_fp8(w: Tensor, *, backend: str = "auto") -> FP8Tensor:
    """Quantize a factor ``w`` (logical ``[E, K, N]`` or ``[K, N]``; float32/bfloat16/float16) to FP8.

    One E4M3 code per element and one fp32 decode scale per output column per expert (the recipe in the
    module docstring; decision 0021). K may be any size. ``backend``: "torch" (pure torch, any device),
    "native" (CUDA kernels; RuntimeError if they cannot run) or "auto" (native on CUDA when available).
    Both give the same bytes.

    Non-finite inputs: nan/inf are left out of the column's amax and get the NaN code, so they decode to
    NaN in place and nothing else changes. An all-zero column gets scale 1 and zero codes (signed zeros
    kept). Not differentiable (``tsct.quant.fake_quantize`` for STE).
    """
    _backend.check_factor("quantize_fp8", "w", w, 1, "fp8")
    which = _backend.resolve(backend, w.device, "quantize_fp8")
    shape = tuple(w.shape)
    w = w.detach()
    x = (w if w.dim() == 3 else w.unsqueeze(0)).transpose(-1, -2)  # [B, N, K] view
    b, n, k = x.shape
    step = _backend.chunk_rows(b, n * k)  # experts per chunk: bounds the fp32 temporaries
    scale = torch.empty((b, n), dtype=torch.float32, device=w.device)
    for e0 in range(0, b, step):
        scale[e0:e0 + step] = fp8_column_scale(x[e0:e0 + step])
    if which == "native":
        codes = _backend.native().fp8_quantize(x.contiguous(), scale)
    else:
        codes = torch.empty((b, n, k), dtype=torch.uint8, device=w.device)
        for e0 in range(0, b, step):
            e1 = min(e0 + step, b)
            y = torch.div(x[e0:e1].float(), scale[e0:e1].unsqueeze(2))
            codes[e0:e1] = e4m3_encode(y)
    return FP8Tensor(codes=codes.view(E4M3_DTYPE), scale_n=scale, shape=shape)
