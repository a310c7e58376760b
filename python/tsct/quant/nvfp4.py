"""NVFP4 factors: the ``NVFP4Tensor`` container and its quantizer / decoder.

Format (``formats.py``; source: NVIDIA NVFP4, quantized with TransformerEngine's NVFP4 reference
recipe, E2M1 per the OCP MX spec): E2M1 codes two per byte, one UE4M3 scale per 16 consecutive K
elements, one fp32 encode scale ``s_enc`` per matrix (per expert). The arithmetic is
``docs/decisions/0002-nvfp4-recipe.md``, step by step; ``backend="native"`` runs the CUDA kernels of
``csrc/quant/``, which match the torch code here bit for bit.

Orientation: a factor of LOGICAL shape ``[E, K, N]`` (``w_gate``/``w_up``: ``[E, d, r]``;
``w_down``: ``[E, r, f]``; K = dim -2 is the contraction dim) is stored K-contiguous like
``nn.Linear.weight``: codes ``[E, N, K/2]``. A 2-D ``[K, N]`` factor is stored as a batch of one
(``E = 1`` in every storage tensor); ``shape`` stays the logical shape and ``dequantize`` returns it.

Division note: every quotient is tensor / tensor on the tensor's device. ``scalar / tensor`` in torch
is ``reciprocal(t) * scalar`` and a CUDA ``tensor / python_float`` multiplies by a rounded reciprocal;
either would break bit-exactness with the kernels. Likewise the sign of a code comes from x, never
from y = (x * s_enc) / sf (y is 0/0 = NaN, sign bit set, for x = +0 in a zero-scale block).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from tsct.quant import _backend
from tsct.quant._container import PackedFactor
from tsct.quant.formats import (
    E2M1_MAGNITUDE_MASK,
    E2M1_MAX,
    FLOAT32_MAX,
    NVFP4_BLOCK_SIZE,
    NVFP4_S_ENC_NUMERATOR,
    UE4M3_DTYPE,
    UE4M3_MAX,
    UE4M3_NAN_BYTE,
    e2m1_decode,
    e2m1_encode_rne,
    pack_nibbles,
    unpack_nibbles,
)
from tsct.quant.layout import LINEAR, SWIZZLED_128X4, check_layout, swizzled_shape, to_linear, to_swizzled

__all__ = ["NVFP4Tensor", "quantize_nvfp4", "nvfp4_encode_scale"]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class NVFP4Tensor(PackedFactor):
    """An NVFP4-quantized factor bank (a plain container, not a Tensor subclass).

    Attributes:
        codes: uint8 ``[E, N, K/2]``; element k of row n is nibble k%2 (even k low) of byte k//2;
            bit 3 of a nibble is the sign, bits 2..0 index {0, .5, 1, 1.5, 2, 3, 4, 6}.
        block_scale: float8_e4m3fn. ``layout == "linear"``: ``[E, N, K/16]``;
            ``"swizzled_128x4"``: ``[E, Np*Kbp]`` (``tsct.quant.layout``). 0x7F = NaN block.
        global_scale: float32 ``[E]``, the ENCODE scale ``s_enc = 2688 / amax`` (clamped, 0002);
            decode divides by it: ``x_hat = e2m1 * block_scale / global_scale``.
        layout: the block-scale layout name.
        shape: the LOGICAL shape, ``(E, K, N)`` or ``(K, N)``.
    """

    _STORAGE = ("codes", "block_scale", "global_scale")

    codes: Tensor
    block_scale: Tensor
    global_scale: Tensor
    layout: str
    shape: tuple

    def __post_init__(self):
        check_layout(self.layout)
        self._check_storage(NVFP4_BLOCK_SIZE, lambda: [
            ("codes", self.codes, torch.uint8, (self.batch, self.n, self.k // 2)),
            ("block_scale", self.block_scale, UE4M3_DTYPE, self._scale_shape(self.layout)),
            ("global_scale", self.global_scale, torch.float32, (self.batch,)),
        ], f" and layout {self.layout!r}")

    def _scale_shape(self, layout: str) -> tuple:
        kb = self.k // NVFP4_BLOCK_SIZE
        if layout == LINEAR:
            return (self.batch, self.n, kb)
        np_, kbp = swizzled_shape(self.n, kb)
        return (self.batch, np_ * kbp)

    def _decode_native(self, lib, dtype: torch.dtype) -> Tensor:
        """``(e2m1 * sf) / s_enc`` in fp32, then ``dtype`` (``PackedFactor.dequantize``)."""
        return lib.nvfp4_dequantize(self.codes, self.block_scale, self.layout, self.global_scale, self.k, dtype)

    def _decode_torch(self, e0: int, e1: int) -> Tensor:
        scales = self.block_scale[e0:e1]
        if self.layout == SWIZZLED_128X4:
            scales = to_linear(scales, self.n, self.k // NVFP4_BLOCK_SIZE)
        return _dequantize_blocks_torch(self.codes[e0:e1], scales, self.global_scale[e0:e1])

    def __repr__(self) -> str:
        return (f"NVFP4Tensor(shape={list(self.shape)}, layout={self.layout!r}, device={self.device}, "
                f"storage=[{self.batch}, {self.n}, {self.k}] K-contiguous, nbytes={self.nbytes})")


# --- the recipe (decision 0002), pure torch ----------------------------------------------------

def nvfp4_encode_scale(x: Tensor) -> Tensor:
    """Per-matrix encode scale ``s_enc`` [B] (fp32) of ``x`` [B, N, K] (any float dtype; 0002 steps 1-2).

    amax = max |x| over the finite elements (0 if none); s_enc = 1 if amax == 0, else
    min(2688 / amax, FLT_MAX).
    """
    b = x.shape[0]
    if x.numel() == 0:
        return torch.ones(b, dtype=torch.float32, device=x.device)
    amax = torch.where(torch.isfinite(x), x.abs(), 0).amax(dim=(1, 2)).float()  # abs/max exact in any dtype
    s = torch.div(torch.full_like(amax, NVFP4_S_ENC_NUMERATOR), amax)  # amax 0 -> inf, replaced below
    s = torch.clamp_max(s, FLOAT32_MAX)
    return torch.where(amax == 0, torch.ones_like(s), s)


def _quantize_blocks_torch(x: Tensor, s_enc: Tensor) -> tuple[Tensor, Tensor]:
    """0002 steps 3-6 for x [B, N, K] (any float dtype) and s_enc [B] fp32 -> (codes, linear block scales)."""
    b, n, k = x.shape
    xb = x.float().reshape(b, n, k // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    finite = torch.isfinite(xb)
    bad = ~finite.all(dim=-1)  # [B, N, Kb]: the block holds a nan or +-inf
    bamax = torch.where(finite, xb.abs(), 0).amax(dim=-1)
    s = s_enc.reshape(b, 1, 1)
    six = torch.full((), E2M1_MAX, dtype=torch.float32, device=x.device)
    sf = torch.clamp_max(torch.div(bamax * s, six), UE4M3_MAX).to(UE4M3_DTYPE)  # RNE, subnormals kept
    sfv = sf.float().unsqueeze(-1)
    y = torch.div(xb * s.unsqueeze(-1), sfv)
    mag = e2m1_encode_rne(y) & E2M1_MAGNITUDE_MASK
    mag = mag.masked_fill(sfv == 0, 0)  # zero block scale: sign-only codes
    # The sign comes from x, not y: for x = +0 in a zero-scale block y = 0/0 is a NaN whose sign bit
    # is set on common hardware.
    codes = mag | (torch.signbit(xb).to(torch.uint8) << 3)
    codes = codes.masked_fill(bad.unsqueeze(-1), 0)
    sf_bytes = sf.view(torch.uint8).masked_fill(bad, UE4M3_NAN_BYTE)
    return pack_nibbles(codes.reshape(b, n, k)), sf_bytes.view(UE4M3_DTYPE)


def _dequantize_blocks_torch(codes: Tensor, scales: Tensor, s_enc: Tensor) -> Tensor:
    """codes [B, N, K/2], linear scales [B, N, K/16], s_enc [B] -> fp32 [B, N, K]: (e2m1 * sf) / s_enc."""
    b, n, k2 = codes.shape
    vals = e2m1_decode(unpack_nibbles(codes)).reshape(b, n, k2 // 8, NVFP4_BLOCK_SIZE)
    x = torch.div(vals * scales.float().unsqueeze(-1), s_enc.reshape(b, 1, 1, 1))
    return x.reshape(b, n, 2 * k2)


def quantize_nvfp4(w: Tensor, *, layout: str = "linear", backend: str = "auto") -> NVFP4Tensor:
    """Quantize a factor ``w`` (logical ``[E, K, N]`` or ``[K, N]``; float32/bfloat16/float16) to NVFP4.

    K = ``w.shape[-2]`` is the contraction dim and must be a multiple of 16. One ``s_enc`` per
    matrix (per expert). ``layout`` picks the block-scale layout ("linear" or "swizzled_128x4").
    ``backend``: "torch" (pure torch, any device), "native" (CUDA kernels; RuntimeError if they
    cannot run) or "auto" (native on CUDA when available). Both backends give the same bytes.

    Non-finite inputs: nan/inf are ignored by the amax; the block holding them gets the NaN scale
    0x7F and zero codes, so it decodes to NaN and nothing else changes. An all-zero (or all
    non-finite) matrix gets ``s_enc = 1``. Not differentiable (see ``fake_quantize`` for STE).
    """
    _backend.check_factor("quantize_nvfp4", "w", w, NVFP4_BLOCK_SIZE, "nvfp4")
    check_layout(layout)
    which = _backend.resolve(backend, w.device, "quantize_nvfp4")
    shape = tuple(w.shape)
    w = w.detach()
    x = (w if w.dim() == 3 else w.unsqueeze(0)).transpose(-1, -2)  # [B, N, K] view
    b, n, k = x.shape
    step = _backend.chunk_rows(b, n * k)  # experts per chunk: bounds the fp32 temporaries
    s_enc = torch.empty((b,), dtype=torch.float32, device=w.device)
    for e0 in range(0, b, step):
        s_enc[e0:e0 + step] = nvfp4_encode_scale(x[e0:e0 + step])
    if which == "native":
        codes, scales = _backend.native().nvfp4_quantize(x.contiguous(), s_enc, layout)
        if scales.dtype == torch.uint8:  # raw bytes from the C ABI: same bits, labelled as UE4M3
            scales = scales.view(UE4M3_DTYPE)
    else:
        codes = torch.empty((b, n, k // 2), dtype=torch.uint8, device=w.device)
        scales = torch.empty((b, n, k // NVFP4_BLOCK_SIZE), dtype=UE4M3_DTYPE, device=w.device)
        for e0 in range(0, b, step):
            e1 = min(e0 + step, b)
            c, sc = _quantize_blocks_torch(x[e0:e1], s_enc[e0:e1])
            codes[e0:e1] = c
            scales.view(torch.uint8)[e0:e1] = sc.view(torch.uint8)
        if layout == SWIZZLED_128X4:
            scales = to_swizzled(scales)
    return NVFP4Tensor(codes=codes, block_scale=scales, global_scale=s_enc, layout=layout, shape=shape)

