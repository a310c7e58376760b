"""Torch-facing wrappers of the C entry points: check, allocate, call on the caller's stream.

Every wrapper validates its inputs (TypeError / ValueError naming the argument), makes them
contiguous, allocates the outputs with torch on the inputs' device, and calls the library under
``torch.cuda.device(device)`` on ``torch.cuda.current_stream(device)``. A non-zero return becomes a
RuntimeError naming the C function, its error string and detail. Formats:
docs/decisions/0002-nvfp4-recipe.md.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from tsct.native._loader import error_message, get_lib

LAYOUTS = {"linear": 0, "swizzled_128x4": 1}
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# Tests set this to fill every output with a poison pattern before the kernel runs, so a byte the
# kernel fails to write cannot pass as correct by accident (torch.empty may hold zeros).
_POISON_OUTPUTS = False


def swizzled_scale_numel(n: int, k: int) -> int:
    """Bytes per matrix of a swizzled_128x4 block-scale buffer: ceil(n/128)*128 * ceil(k/64)*4."""
    return -(-n // 128) * 128 * (-(-(k // 16) // 4) * 4)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if _POISON_OUTPUTS and t.numel():
        t.view(torch.uint8).fill_(0xA5)  # finite in every float dtype, a negative UE4M3 scale
    return t


def _tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _cuda(name: str, t: Tensor, device: torch.device | None = None) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all tensors on one CUDA device)")


def _dtype(name: str, t: Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in allowed]}, got {t.dtype}")


def _shape(name: str, t: Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {list(expected)} ({what}), got {list(t.shape)}")


def _out_dtype(out_dtype: object) -> int:
    if out_dtype not in DTYPES:
        raise TypeError(f"out_dtype must be one of {[str(d) for d in DTYPES]}, got {out_dtype}")
    return DTYPES[out_dtype]


def _layout(layout: object) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    return LAYOUTS[layout]


def _ptr(t: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _call(fn: str, device: torch.device, *args: object) -> None:
    lib = get_lib()
    with torch.cuda.device(device):
        stream = ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
        rc = getattr(lib, fn)(*args, stream)
    if rc != 0:
        raise RuntimeError(error_message(fn, rc))


def nvfp4_quantize(x: Tensor, s_enc: Tensor, layout: str = "linear") -> tuple[Tensor, Tensor]:
    """NVFP4-quantize each matrix of x with its encode scale (``tsct_nvfp4_quantize``).

    Args:
        x: [B, N, K] float32 / bfloat16 / float16, CUDA; K % 16 == 0.
        s_enc: [B] float32 on x's device: per-matrix encode scale (2688 / finite amax, see 0002).
        layout: "linear" or "swizzled_128x4" for the block scales.
    Returns:
        codes: uint8 [B, N, K // 2] (two E2M1 codes per byte, even element in the low nibble);
        block_scale: torch.float8_e4m3fn, [B, N, K // 16] (linear) or
        [B, ceil(N/128)*128 * ceil(K/64)*4] (swizzled_128x4, padding 0).
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError if the kernel fails or the
        native library is unavailable.
    """
    x = _tensor("x", x)
    s_enc = _tensor("s_enc", s_enc)
    lay = _layout(layout)
    _dtype("x", x, tuple(DTYPES))
    if x.dim() != 3:
        raise ValueError(f"x must be [B, N, K], got shape {list(x.shape)}")
    b, n, k = x.shape
    if k % 16:
        raise ValueError(f"x: K={k} (last dimension) must be a multiple of 16 for NVFP4")
    _dtype("s_enc", s_enc, (torch.float32,))
    _shape("s_enc", s_enc, (b,), "one fp32 encode scale per matrix")
    _cuda("x", x)
    _cuda("s_enc", s_enc, x.device)
    x, s_enc = x.contiguous(), s_enc.contiguous()
    codes = _empty((b, n, k // 2), torch.uint8, x.device)
    if lay:
        scale = _empty((b, swizzled_scale_numel(n, k)), torch.float8_e4m3fn, x.device)
    else:
        scale = _empty((b, n, k // 16), torch.float8_e4m3fn, x.device)
    _call("tsct_nvfp4_quantize", x.device, _ptr(x), DTYPES[x.dtype], b, n, k, _ptr(s_enc), _ptr(codes), _ptr(scale), lay)
    return codes, scale


def nvfp4_dequantize(
    codes: Tensor,
    block_scale: Tensor,
    layout: str,
    s_enc: Tensor,
    k: int,
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Decode NVFP4 to ``out_dtype`` (``tsct_nvfp4_dequantize``): (e2m1 * scale) / s_enc, then RNE.

    Args:
        codes: uint8 [B, N, K // 2], CUDA.
        block_scale: torch.float8_e4m3fn (or uint8 bytes), [B, N, K // 16] (linear) or
            [B, ceil(N/128)*128 * ceil(K/64)*4] (swizzled_128x4), same device.
        layout: "linear" or "swizzled_128x4" (what block_scale holds).
        s_enc: [B] float32, same device.
        k: K, a multiple of 16 (codes' last dimension is k // 2).
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
    Returns:
        [B, N, K] of out_dtype; a block whose scale is NaN decodes to NaN.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    codes = _tensor("codes", codes)
    block_scale = _tensor("block_scale", block_scale)
    s_enc = _tensor("s_enc", s_enc)
    lay = _layout(layout)
    odt = _out_dtype(out_dtype)
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 0 or k % 16:
        raise ValueError(f"k={k} must be a non-negative multiple of 16 for NVFP4")
    _dtype("codes", codes, (torch.uint8,))
    if codes.dim() != 3:
        raise ValueError(f"codes must be [B, N, K // 2], got shape {list(codes.shape)}")
    b, n, half = codes.shape
    if half != k // 2:
        raise ValueError(f"codes has last dimension {half}, expected k // 2 = {k // 2} for k={k}")
    _dtype("block_scale", block_scale, (torch.float8_e4m3fn, torch.uint8))
    if lay:
        _shape("block_scale", block_scale, (b, swizzled_scale_numel(n, k)), "swizzled_128x4")
    else:
        _shape("block_scale", block_scale, (b, n, k // 16), "linear")
    _dtype("s_enc", s_enc, (torch.float32,))
    _shape("s_enc", s_enc, (b,), "one fp32 encode scale per matrix")
    _cuda("codes", codes)
    _cuda("block_scale", block_scale, codes.device)
    _cuda("s_enc", s_enc, codes.device)
    codes, block_scale, s_enc = codes.contiguous(), block_scale.contiguous(), s_enc.contiguous()
    out = _empty((b, n, k), out_dtype, codes.device)
    _call("tsct_nvfp4_dequantize", codes.device, _ptr(codes), _ptr(block_scale), lay, _ptr(s_enc), b, n, k, _ptr(out), odt)
    return out


def sign_pack(w: Tensor) -> Tensor:
    """Pack sign bits (``tsct_sign_pack``): bit j of byte i = signbit(w[..., 8i + j]) (-0.0 -> 1).

    Args:
        w: [B, N, K] float32 / bfloat16 / float16, CUDA; K % 8 == 0.
    Returns:
        uint8 [B, N, K // 8].
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    w = _tensor("w", w)
    _dtype("w", w, tuple(DTYPES))
    if w.dim() != 3:
        raise ValueError(f"w must be [B, N, K], got shape {list(w.shape)}")
    b, n, k = w.shape
    if k % 8:
        raise ValueError(f"w: K={k} (last dimension) must be a multiple of 8 for sign packing")
    _cuda("w", w)
    w = w.contiguous()
    bits = _empty((b, n, k // 8), torch.uint8, w.device)
    _call("tsct_sign_pack", w.device, _ptr(w), DTYPES[w.dtype], b, n, k, _ptr(bits))
    return bits


def sign_dequantize(bits: Tensor, a: Tensor, b: Tensor, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Decode sign bits (``tsct_sign_dequantize``): out[i, n, k] = ((+-1) * a[i, k]) * b[i, n], then RNE.

    Args:
        bits: uint8 [B, N, K // 8], CUDA (bit set = negative).
        a: float32 [B, K] (scale over K), same device.
        b: float32 [B, N] (scale over N), same device.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
    Returns:
        [B, N, K] of out_dtype.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    bits = _tensor("bits", bits)
    a = _tensor("a", a)
    b = _tensor("b", b)
    odt = _out_dtype(out_dtype)
    _dtype("bits", bits, (torch.uint8,))
    if bits.dim() != 3:
        raise ValueError(f"bits must be [B, N, K // 8], got shape {list(bits.shape)}")
    nb, n, kbytes = bits.shape
    k = kbytes * 8
    _dtype("a", a, (torch.float32,))
    _shape("a", a, (nb, k), "fp32 scale over K per matrix")
    _dtype("b", b, (torch.float32,))
    _shape("b", b, (nb, n), "fp32 scale over N per matrix")
    _cuda("bits", bits)
    _cuda("a", a, bits.device)
    _cuda("b", b, bits.device)
    bits, a, b = bits.contiguous(), a.contiguous(), b.contiguous()
    out = _empty((nb, n, k), out_dtype, bits.device)
    _call("tsct_sign_dequantize", bits.device, _ptr(bits), _ptr(a), _ptr(b), nb, n, k, _ptr(out), odt)
    return out


def kernel_available(name: str, device: torch.device | int | None = None) -> bool:
    """Whether `device` (default: the current CUDA device) can load kernel `name` (cudaFuncGetAttributes).

    Names are those in ``build_info()["kernels"]``, e.g. "tsctk_nvfp4_quantize_bf16".
    Raises:
        TypeError if name is not a str; ValueError for a name the library does not have;
        RuntimeError if the library is unavailable or CUDA reports an error (e.g. no device).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    lib = get_lib()
    avail = ctypes.c_int(0)
    if device is None:
        device = torch.cuda.current_device()
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {dev}")
    with torch.cuda.device(dev):
        rc = lib.tsct_kernel_available(name.encode(), ctypes.byref(avail))
    if rc == -1:
        raise ValueError(error_message("tsct_kernel_available", rc))
    if rc != 0:
        raise RuntimeError(error_message("tsct_kernel_available", rc))
    return bool(avail.value)
