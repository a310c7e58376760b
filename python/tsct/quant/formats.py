"""The number formats, as data: E2M1 (FP4), UE4M3 block scales, NVFP4 constants, sign bits, E4M3 (FP8)
codes, ternary codes.

What each format *is* lives here; the containers and quantizers live in ``nvfp4.py`` / ``sign.py`` /
``fp8.py`` / ``ternary.py``, the block-scale layouts in ``layout.py``. The exact arithmetic (rounding,
clamping, non-finite inputs) is ``docs/decisions/0002-nvfp4-recipe.md`` (NVFP4, sign),
``0021-fp8-format.md`` and ``0022-ternary-format.md``; the CUDA kernels in ``csrc/quant/`` match it bit
for bit.

Sources:
  * E2M1: OCP Microscaling Formats (MX) Specification v1.0, the FP4 (E2M1) element type: 1 sign
    bit, 2 exponent bits, 1 mantissa bit, bias 1, no inf/nan, max normal 6.0.
  * UE4M3 block scale and the 16-element block: NVIDIA NVFP4 (Blackwell block-scaled MMA, PTX
    ``kind::mxf4nvf4 ... .ue4m3``); the scale byte is an OCP E4M3 (``torch.float8_e4m3fn``:
    bias 7, no inf, 0x7F / 0xFF are NaN, max 448) with the sign bit 0.
  * The second-level fp32 scale and its 448 * 6 constant: TransformerEngine's NVFP4 reference
    quantizer (not torchao's nvfp4, which also clamps the block scale to >= 2**-6).
  * Sign bits: LittleBit (1-bit factors, W ~ diag(a) sign(W) diag(b)); bit layout is ours (0002).
  * E4M3 codes of the fp8 format: the same OCP E4M3 ("fn") as the UE4M3 scale, with its sign bit;
    the encoder is torch's ``.to(torch.float8_e4m3fn)`` (round to nearest even) after a clamp to +-448
    (``e4m3_encode``: saturating on every device).
  * Ternary codes {-1, 0, +1}: BitNet b1.58 (Ma et al. 2024, arXiv:2402.17764); the 2-bit code and
    its packing are ours (0022).

Codes and bits are plain ``torch.uint8`` tensors; everything here is pure torch and runs on any
device.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "E2M1_MAGNITUDES",
    "E2M1_MAX",
    "E2M1_SIGN_BIT",
    "E2M1_MAGNITUDE_MASK",
    "E2M1_MIDPOINTS",
    "NIBBLE_LOW_IS_EVEN",
    "UE4M3_DTYPE",
    "UE4M3_MAX",
    "UE4M3_NAN_BYTE",
    "NVFP4_BLOCK_SIZE",
    "NVFP4_S_ENC_NUMERATOR",
    "SIGN_PACK",
    "FLOAT32_MAX",
    "e2m1_encode_rne",
    "e2m1_decode",
    "pack_nibbles",
    "unpack_nibbles",
    "pack_bits",
    "unpack_bits",
    "E4M3_DTYPE",
    "E4M3_MAX",
    "FP8_NAN_CODE",
    "e4m3_encode",
    "e4m3_decode",
    "TERNARY_PACK",
    "TERNARY_ZERO",
    "TERNARY_PLUS",
    "TERNARY_MINUS",
    "TERNARY_NAN",
    "ternary_decode",
    "pack_2bit",
    "unpack_2bit",
]

# --- E2M1 (FP4) -------------------------------------------------------------------------------
#: Magnitude of each 3-bit magnitude index 0..7 (exponent bits 2..1, mantissa bit 0).
E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX: float = 6.0
#: Bit 3 of a 4-bit code is the sign (1 = negative); bits 2..0 index E2M1_MAGNITUDES.
E2M1_SIGN_BIT: int = 0x8
E2M1_MAGNITUDE_MASK: int = 0x7
#: Midpoints between consecutive magnitudes. A tie goes to the EVEN magnitude index, so a value
#: equal to midpoint i rounds up (to index i+1) exactly when i is odd.
E2M1_MIDPOINTS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
#: Two codes per byte: element 2i in the LOW nibble, element 2i+1 in the high nibble.
NIBBLE_LOW_IS_EVEN: bool = True

# --- UE4M3 block scale and NVFP4 --------------------------------------------------------------
UE4M3_DTYPE: torch.dtype = torch.float8_e4m3fn
UE4M3_MAX: float = 448.0
#: Block-scale byte marking a block that held nan or +-inf (E4M3 NaN, sign 0).
UE4M3_NAN_BYTE: int = 0x7F
#: Consecutive K elements sharing one UE4M3 scale.
NVFP4_BLOCK_SIZE: int = 16
#: s_enc = NVFP4_S_ENC_NUMERATOR / amax: maps the matrix amax to the largest block scale (448)
#: times the largest E2M1 magnitude (6).
NVFP4_S_ENC_NUMERATOR: float = UE4M3_MAX * E2M1_MAX  # 2688.0
FLOAT32_MAX: float = torch.finfo(torch.float32).max

# --- sign -------------------------------------------------------------------------------------
#: Sign bits per byte, along K: element 8i+j is bit j of byte i (LSB first); 1 = negative.
SIGN_PACK: int = 8

# --- E4M3 codes (fp8 format) -------------------------------------------------------------------
#: The code dtype: OCP E4M3 "fn" (bias 7, no inf, S.1111.111 is NaN, max normal 448).
E4M3_DTYPE: torch.dtype = torch.float8_e4m3fn
E4M3_MAX: float = 448.0
#: The code of a non-finite input (E4M3 NaN, sign 0): E4M3 has no inf, and saturating an inf to 448
#: would hide it.
FP8_NAN_CODE: int = 0x7F

# --- ternary codes ----------------------------------------------------------------------------
#: Ternary codes per byte, along K: element 4i+j is bits 2j..2j+1 of byte i (the lowest pair first).
TERNARY_PACK: int = 4
#: The 2-bit codes: two's complement for -1, 0, +1; the pattern two's complement reads as -2 marks a
#: non-finite input (decodes to NaN). An all-zero byte is four zeros.
TERNARY_ZERO: int = 0b00
TERNARY_PLUS: int = 0b01
TERNARY_MINUS: int = 0b11
TERNARY_NAN: int = 0b10


def _check_uint8(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.uint8:
        raise TypeError(f"{name} must have dtype torch.uint8, got {t.dtype}")


def e2m1_encode_rne(y: Tensor) -> Tensor:
    """E2M1 code (uint8 in 0..15) of each element of ``y``, round to nearest, ties to even.

    The magnitude is the nearest of E2M1_MAGNITUDES to ``|y|``; a tie goes to the even magnitude
    index (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4); ``|y| > 6`` (inf included)
    saturates to 6. The sign bit is ``signbit(y)``: -0.0 and negatives that round to 0 give 0x8.
    NaN has no E2M1 value: it encodes to magnitude 0 with its sign bit (the NVFP4 quantizer never
    passes NaN here; it zeroes the codes of a non-finite block, 0002 step 5).

    ``y`` is compared in its own dtype (the midpoints are exact in every float dtype); pass fp32.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if not y.is_floating_point():
        raise TypeError(f"y must be a floating-point tensor, got {y.dtype}")
    a = y.abs()
    idx = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for i, mid in enumerate(E2M1_MIDPOINTS):
        # i odd: the tie goes up to the even index i+1 (>=); i even: it stays at i (>).
        idx += (a >= mid) if i % 2 == 1 else (a > mid)
    return idx | (torch.signbit(y).to(torch.uint8) << 3)


def e2m1_decode(codes: Tensor) -> Tensor:
    """Float32 value of each 4-bit E2M1 code (uint8 in 0..15; bits above 3 are ignored)."""
    _check_uint8("codes", codes)
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=torch.float32,
                         device=codes.device)
    return table[(codes & 0xF).long()]


def pack_nibbles(codes: Tensor) -> Tensor:
    """Pack 4-bit codes ``[..., K]`` (K even) two per byte into ``[..., K/2]``, element 2i low."""
    _check_uint8("codes", codes)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes: the last dim must be even, got shape {list(codes.shape)}")
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed: Tensor) -> Tensor:
    """Inverse of pack_nibbles: ``[..., K/2]`` bytes to ``[..., K]`` 4-bit codes."""
    _check_uint8("packed", packed)
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dim")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def pack_bits(negative: Tensor) -> Tensor:
    """Pack booleans ``[..., K]`` (K % 8 == 0) into ``[..., K/8]`` bytes: element 8i+j is bit j of byte i."""
    if not isinstance(negative, Tensor):
        raise TypeError(f"negative must be a torch.Tensor, got {type(negative).__name__}")
    if negative.dtype != torch.bool:
        raise TypeError(f"negative must have dtype torch.bool, got {negative.dtype}")
    if negative.dim() == 0 or negative.shape[-1] % SIGN_PACK:
        raise ValueError(f"negative: the last dim must be a multiple of 8, got shape {list(negative.shape)}")
    b = negative.unflatten(-1, (-1, SIGN_PACK)).to(torch.uint8)
    out = b[..., 0].contiguous()  # row-major whatever the input strides (kernels read bits K-contiguous)
    for j in range(1, SIGN_PACK):
        out |= b[..., j] << j
    return out


def unpack_bits(packed: Tensor) -> Tensor:
    """Inverse of pack_bits: ``[..., K/8]`` bytes to ``[..., K]`` booleans (True = negative)."""
    _check_uint8("packed", packed)
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dim")
    shifts = torch.arange(SIGN_PACK, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 1).to(torch.bool).flatten(-2)


def e4m3_encode(y: Tensor) -> Tensor:
    """E4M3 code bytes (uint8) of ``y``: round to nearest even, subnormals kept, ``|y| > 448`` saturating
    to +-448 (0x7E | sign), signed zeros kept; a non-finite element (nan, +-inf) gives FP8_NAN_CODE.

    The finite part is torch's cast ``y.to(torch.float8_e4m3fn)`` (RNE) of ``y`` clamped to +-448 first:
    torch's own cast saturates on the CPU but gives NaN past 448 on CUDA (torch 2.11, measured on the
    H200), so the clamp makes the encoding the same on every device. The CUDA encoder
    (``csrc/common/formats.cuh``, ``e4m3_from_f32``) is checked against it on every fp32 input. Pass fp32
    (a wider dtype would round twice).
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if not y.is_floating_point():
        raise TypeError(f"y must be a floating-point tensor, got {y.dtype}")
    codes = y.clamp(-448.0, 448.0).to(E4M3_DTYPE).view(torch.uint8)
    return codes.masked_fill(~torch.isfinite(y), FP8_NAN_CODE)


def e4m3_decode(codes: Tensor) -> Tensor:
    """Float32 value of each E4M3 code (uint8 or float8_e4m3fn); 0x7F / 0xFF are NaN."""
    if isinstance(codes, Tensor) and codes.dtype == E4M3_DTYPE:
        return codes.float()
    _check_uint8("codes", codes)
    return codes.view(E4M3_DTYPE).float()


def ternary_decode(codes: Tensor) -> Tensor:
    """Float32 value of each 2-bit ternary code (uint8, bits above 1 ignored): 0b00 -> 0, 0b01 -> +1,
    0b11 -> -1, 0b10 -> NaN."""
    _check_uint8("codes", codes)
    table = torch.tensor([0.0, 1.0, float("nan"), -1.0], dtype=torch.float32, device=codes.device)
    return table[(codes & 0x3).long()]


def pack_2bit(codes: Tensor) -> Tensor:
    """Pack 2-bit codes ``[..., K]`` (K % 4 == 0) four per byte into ``[..., K/4]``: element 4i+j in bits
    2j..2j+1 of byte i."""
    _check_uint8("codes", codes)
    if codes.dim() == 0 or codes.shape[-1] % TERNARY_PACK:
        raise ValueError(f"codes: the last dim must be a multiple of 4, got shape {list(codes.shape)}")
    c = codes.unflatten(-1, (-1, TERNARY_PACK)) & 0x3
    out = c[..., 0].contiguous()  # row-major whatever the input strides (kernels read codes K-contiguous)
    for j in range(1, TERNARY_PACK):
        out |= c[..., j] << (2 * j)
    return out


def unpack_2bit(packed: Tensor) -> Tensor:
    """Inverse of pack_2bit: ``[..., K/4]`` bytes to ``[..., K]`` 2-bit codes."""
    _check_uint8("packed", packed)
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dim")
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 0x3).flatten(-2)
