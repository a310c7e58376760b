"""Ternary factors {-1, 0, +1}: the ``TernaryTensor`` container and its quantizer / decoder.

Source: BitNet b1.58 (Ma et al., "The Era of 1-bit LLMs: All Large Language Models are in 1.58 Bits",
arXiv:2402.17764): ``W_q = RoundClip(W / gamma, -1, 1)`` with ``gamma`` the absmean of ``|W|`` and
``RoundClip(y) = max(-1, min(1, round(y)))``; decoded as ``W_q * gamma``. The paper takes one gamma per
matrix; here, per output column per expert. The exact arithmetic, the 2-bit code and the packing are
``docs/decisions/0022-ternary-format.md``.

Two scalings (``scaling=``):
  * "absmean" (default; BitNet b1.58): ``gamma[n]`` = mean of |W[:, n]| over the column's finite
    elements, stored as ``scale_n [E, N]``; decode ``q * scale_n[n]``.
  * "rank1": ``gamma[k, n] = a[k] * b[n]``, the rank-1 fit of |W| the sign format uses
    (``tsct.quant.sign.rank1_magnitude_fit``), stored as ``scale_k [E, K]`` and ``scale_n [E, N]``;
    decode ``(q * a[k]) * b[n]``. It cuts the relative error by a third or more on factors whose K
    rows differ in magnitude (outlier rows, low-rank factors), at 4 bytes per K row (0022).

Codes (``formats.py``): 2 bits, two's complement ``0b00 = 0``, ``0b01 = +1``, ``0b11 = -1``;
``0b10`` marks a non-finite input and decodes to NaN. Four per byte along K: element 4i+j in bits
2j..2j+1 of byte i. Stored K-contiguous like ``nn.Linear.weight``: codes ``[E, N, K/4]``.

Quantization, per element, in IEEE fp32: ``y = x / gamma`` (a true division); code = NaN code if x is
nan or +-inf; else 0 if gamma == 0 (a zero column, BitNet's epsilon case) or |y| <= 1/2 (round half to
even: 0.5 rounds to 0); else the sign of y. The scales are computed by torch on the tensor's device (the
absmean as a float64 sum rounded once to fp32, so CPU and GPU agree except where the float64 sums
round differently to fp32, which is rare); ``backend="native"`` packs and decodes in the CUDA kernels
of ``csrc/quant/ternary.cu`` (the same bits for the same scales).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from tsct.quant import _backend
from tsct.quant._container import PackedFactor
from tsct.quant.formats import (
    TERNARY_MINUS,
    TERNARY_NAN,
    TERNARY_PACK,
    TERNARY_PLUS,
    TERNARY_ZERO,
    pack_2bit,
    ternary_decode,
    unpack_2bit,
)
from tsct.quant.sign import DEFAULT_SIGN_ITERS, _check_iters, rank1_magnitude_fit

__all__ = ["TernaryTensor", "quantize_ternary", "ternary_absmean", "TERNARY_SCALINGS"]

#: ``scaling=`` choices of quantize_ternary
TERNARY_SCALINGS = ("absmean", "rank1")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TernaryTensor(PackedFactor):
    """A ternary factor bank: ``W[e, k, n] ~ q * scale_k[e, k] * scale_n[e, n]``, q in {-1, 0, +1}.

    Attributes:
        codes: uint8 ``[E, N, K/4]``; element k of row n is bits 2(k%4)..2(k%4)+1 of byte k//4;
            0b00 = 0, 0b01 = +1, 0b11 = -1, 0b10 = NaN (a non-finite input).
        scale_k: float32 ``[E, K]`` (the rank-1 scaling's ``a``), or None (absmean scaling).
        scale_n: float32 ``[E, N]``: the column absmean, or the rank-1 scaling's ``b``.
        shape: the LOGICAL shape, ``(E, K, N)`` or ``(K, N)`` (stored as a batch of one).
    """

    _STORAGE = ("codes", "scale_n", "scale_k")

    codes: Tensor
    scale_k: Optional[Tensor]
    scale_n: Tensor
    shape: tuple

    def __post_init__(self):
        def specs():
            out = [("codes", self.codes, torch.uint8, (self.batch, self.n, self.k // TERNARY_PACK)),
                   ("scale_n", self.scale_n, torch.float32, (self.batch, self.n))]
            if self.scale_k is not None:
                out.append(("scale_k", self.scale_k, torch.float32, (self.batch, self.k)))
            return out

        self._check_storage(TERNARY_PACK, specs)

    @property
    def scaling(self) -> str:
        """"rank1" when it carries ``scale_k``, else "absmean"."""
        return "absmean" if self.scale_k is None else "rank1"

    def _decode_native(self, lib, dtype: torch.dtype) -> Tensor:
        """``q * scale_n[n]`` (absmean) or ``(q * scale_k[k]) * scale_n[n]`` (rank1) in fp32, then ``dtype``; NaN
        codes give NaN (``PackedFactor.dequantize``)."""
        return lib.ternary_dequantize(self.codes, self.scale_k, self.scale_n, dtype)

    def _decode_torch(self, e0: int, e1: int) -> Tensor:
        x = ternary_decode(unpack_2bit(self.codes[e0:e1]))
        if self.scale_k is not None:
            x = x * self.scale_k[e0:e1].unsqueeze(1)
        return x * self.scale_n[e0:e1].unsqueeze(2)

    def __repr__(self) -> str:
        return (f"TernaryTensor(shape={list(self.shape)}, scaling={self.scaling!r}, device={self.device}, "
                f"storage=[{self.batch}, {self.n}, {self.k}] K-contiguous, nbytes={self.nbytes})")


def ternary_absmean(x: Tensor) -> Tensor:
    """BitNet b1.58's gamma per column: x ``[B, N, K]`` (storage orientation, any float dtype) -> fp32 ``[B, N]``,
    the mean of |x| over each row's finite elements (0 if none), summed in float64 and rounded once to fp32."""
    finite = torch.isfinite(x)
    total = torch.where(finite, x.abs().double(), 0).sum(dim=-1)
    count = finite.sum(dim=-1).clamp_min(1).double()
    return (total / count).float()


def ternary_encode(x: Tensor, gamma: Tensor) -> Tensor:
    """2-bit codes (uint8, unpacked) of x ``[B, N, K]`` for per-element scales ``gamma`` (broadcast to x, fp32)."""
    y = torch.div(x.float(), gamma)
    nz = (gamma != 0) & (y.abs() > 0.5)  # round half to even, then clip: |y| <= 1/2 -> 0, else sign(y)
    code = torch.where(y < 0, TERNARY_MINUS, TERNARY_PLUS).to(torch.uint8)
    code = code.masked_fill(~nz, TERNARY_ZERO)
    return code.masked_fill(~torch.isfinite(x), TERNARY_NAN)


def _check_scaling(scaling) -> str:
    if not isinstance(scaling, str) or scaling not in TERNARY_SCALINGS:
        raise ValueError(f"scaling must be one of {list(TERNARY_SCALINGS)}, got {scaling!r}")
    return scaling


def quantize_ternary(w: Tensor, *, scaling: str = "absmean", iters: int = DEFAULT_SIGN_ITERS,
                     backend: str = "auto") -> TernaryTensor:
    """Quantize a factor ``w`` (logical ``[E, K, N]`` or ``[K, N]``; float32/bfloat16/float16) to ternary codes.

    K = ``w.shape[-2]`` must be a multiple of 4. ``scaling``: "absmean" (BitNet b1.58: one fp32 scale per
    output column per expert) or "rank1" (the sign format's rank-1 fit of |w|, ``iters`` power-iteration
    rounds; ``iters`` is not used by "absmean"). The scales are always computed by torch on ``w``'s
    device; ``backend`` ("torch", "native" or "auto", as for ``quantize_nvfp4``) picks who encodes and
    packs the codes.

    Non-finite inputs: a nan or +-inf is left out of the scales and gets the NaN code, so it decodes to NaN
    in place and nothing else changes. A zero column (absmean 0) gets zero codes. Not differentiable
    (``tsct.quant.fake_quantize`` for STE).
    """
    _backend.check_factor("quantize_ternary", "w", w, TERNARY_PACK, "ternary")
    _check_scaling(scaling)
    _check_iters(iters)
    which = _backend.resolve(backend, w.device, "quantize_ternary")
    shape = tuple(w.shape)
    w = w.detach()
    x = (w if w.dim() == 3 else w.unsqueeze(0)).transpose(-1, -2)  # [B, N, K] view
    bsz, n, k = x.shape
    scale_n = torch.empty((bsz, n), dtype=torch.float32, device=w.device)
    scale_k = torch.empty((bsz, k), dtype=torch.float32, device=w.device) if scaling == "rank1" else None
    step = _backend.chunk_rows(bsz, n * k, budget=1 << 24)  # float64 temporaries
    for e0 in range(0, bsz, step):
        e1 = min(e0 + step, bsz)
        if scale_k is None:
            scale_n[e0:e1] = ternary_absmean(x[e0:e1])
        else:
            scale_k[e0:e1], scale_n[e0:e1] = rank1_magnitude_fit(x[e0:e1], iters, poison=False)
    if which == "native":
        codes = _backend.native().ternary_pack(x.contiguous(), scale_k, scale_n)
    else:
        codes = torch.empty((bsz, n, k // TERNARY_PACK), dtype=torch.uint8, device=w.device)
        for e0 in range(0, bsz, step):
            e1 = min(e0 + step, bsz)
            gamma = scale_n[e0:e1].unsqueeze(2)
            if scale_k is not None:
                gamma = scale_k[e0:e1].unsqueeze(1) * gamma
            codes[e0:e1] = pack_2bit(ternary_encode(x[e0:e1], gamma))
    return TernaryTensor(codes=codes, scale_k=scale_k, scale_n=scale_n, shape=shape)
