"""Torch-facing wrappers of the C entry points: check, allocate, call on the caller's stream.

Every wrapper validates its inputs (TypeError / ValueError naming the argument), makes them
contiguous, allocates the outputs with torch on the inputs' device, and calls the library with
``device`` current on its current stream. A non-zero return becomes a
RuntimeError naming the C function, its error string and detail. Formats:
docs/decisions/0002-nvfp4-recipe.md, 0021-fp8-format.md, 0022-ternary-format.md.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from tsct.kernels import record as _record
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


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # looked up once: the query runs per launch


def current_stream(index: int) -> int:
    """The current CUDA stream of device ``index`` as an int (cudaStream_t), without a Stream object where torch
    has the raw query. The one stream query of the package's launches (``tsct.kernels.launch`` too)."""
    if _RAW_STREAM is None:  # pragma: no cover - older torch
        return torch.cuda.current_stream(index).cuda_stream
    return _RAW_STREAM(index)


def _call(fn: str, device: torch.device, *args: object) -> None:
    """``fn(*args, stream)`` on the current stream of ``device``, with ``device`` current during the call (a guard only
    when it is not already: the guard's two device switches cost more host time than the call)."""
    lib = get_lib()
    current = torch.cuda.current_device()
    index = device.index if device.index is not None else current
    if _record.log is not None and _record.active() is not None:  # tsct.kernels.replay
        _record.log.append(("native", fn, device, args, current_stream(index)))
    if index == current:
        rc = getattr(lib, fn)(*args, ctypes.c_void_p(current_stream(index)))
    else:
        with torch.cuda.device(index):
            rc = getattr(lib, fn)(*args, ctypes.c_void_p(current_stream(index)))
    if rc != 0:
        raise RuntimeError(error_message(fn, rc))


def stream_capture_id(stream: "torch.cuda.Stream") -> int:
    """The id of the CUDA graph capture underway on ``stream`` (``tsct_stream_capture_id``: cudaStreamGetCaptureInfo),
    0 when none. Torch does not expose it; ``tsct.kernels.triton_common.runtime.link_csr`` tells captures apart with it.
    Raises TypeError for anything but a torch.cuda.Stream, NativeUnavailableError without the library,
    RuntimeError if the query fails."""
    if not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"stream must be a torch.cuda.Stream, got {type(stream).__name__}")
    lib = get_lib()
    out = ctypes.c_ulonglong(0)
    rc = lib.tsct_stream_capture_id(ctypes.c_void_p(stream.cuda_stream), ctypes.byref(out))
    if rc != 0:
        raise RuntimeError(error_message("tsct_stream_capture_id", rc))
    return out.value


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


def fp8_quantize(x: Tensor, scale_n: Tensor) -> Tensor:
    """FP8-quantize with given per-row decode scales (``tsct_fp8_quantize``; docs/decisions/0021-fp8-format.md).

    Args:
        x: [B, N, K] float32 / bfloat16 / float16, CUDA; any K.
        scale_n: float32 [B, N] on x's device: the decode scale of each row (amax / 448, or 1).
    Returns:
        uint8 [B, N, K]: E4M3 bytes of x / scale_n (RNE, saturating at +-448; 0x7F for nan / inf).
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    x = _tensor("x", x)
    scale_n = _tensor("scale_n", scale_n)
    _dtype("x", x, tuple(DTYPES))
    if x.dim() != 3:
        raise ValueError(f"x must be [B, N, K], got shape {list(x.shape)}")
    b, n, k = x.shape
    _dtype("scale_n", scale_n, (torch.float32,))
    _shape("scale_n", scale_n, (b, n), "one fp32 decode scale per row")
    _cuda("x", x)
    _cuda("scale_n", scale_n, x.device)
    x, scale_n = x.contiguous(), scale_n.contiguous()
    codes = _empty((b, n, k), torch.uint8, x.device)
    _call("tsct_fp8_quantize", x.device, _ptr(x), DTYPES[x.dtype], b, n, k, _ptr(scale_n), _ptr(codes))
    return codes


def fp8_dequantize(codes: Tensor, scale_n: Tensor, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Decode FP8 (``tsct_fp8_dequantize``): out[i, n, k] = e4m3(codes[i, n, k]) * scale_n[i, n], then RNE.

    Args:
        codes: uint8 (or float8_e4m3fn) [B, N, K], CUDA.
        scale_n: float32 [B, N], same device.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
    Returns:
        [B, N, K] of out_dtype (NaN where the code is 0x7F / 0xFF).
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    codes = _tensor("codes", codes)
    scale_n = _tensor("scale_n", scale_n)
    odt = _out_dtype(out_dtype)
    _dtype("codes", codes, (torch.uint8, torch.float8_e4m3fn))
    if codes.dim() != 3:
        raise ValueError(f"codes must be [B, N, K], got shape {list(codes.shape)}")
    b, n, k = codes.shape
    _dtype("scale_n", scale_n, (torch.float32,))
    _shape("scale_n", scale_n, (b, n), "one fp32 decode scale per row")
    _cuda("codes", codes)
    _cuda("scale_n", scale_n, codes.device)
    codes, scale_n = codes.contiguous().view(torch.uint8), scale_n.contiguous()
    out = _empty((b, n, k), out_dtype, codes.device)
    _call("tsct_fp8_dequantize", codes.device, _ptr(codes), _ptr(scale_n), b, n, k, _ptr(out), odt)
    return out


def _ternary_scales(first: str, t: Tensor, scale_k, scale_n, b: int, n: int, k: int) -> tuple:
    """Check the scales (types, dtypes, shapes, then devices: ``t``, named ``first``, on CUDA and the scales with
    it); returns them contiguous."""
    scale_n = _tensor("scale_n", scale_n)
    _dtype("scale_n", scale_n, (torch.float32,))
    _shape("scale_n", scale_n, (b, n), "fp32 scale over N per matrix")
    if scale_k is not None:
        scale_k = _tensor("scale_k", scale_k)
        _dtype("scale_k", scale_k, (torch.float32,))
        _shape("scale_k", scale_k, (b, k), "fp32 scale over K per matrix, or None")
    _cuda(first, t)
    _cuda("scale_n", scale_n, t.device)
    if scale_k is not None:
        _cuda("scale_k", scale_k, t.device)
        scale_k = scale_k.contiguous()
    return scale_k, scale_n.contiguous()


def ternary_pack(x: Tensor, scale_k: Tensor | None, scale_n: Tensor) -> Tensor:
    """Encode and pack ternary codes (``tsct_ternary_pack``; docs/decisions/0022-ternary-format.md).

    Args:
        x: [B, N, K] float32 / bfloat16 / float16, CUDA; K % 4 == 0.
        scale_k: float32 [B, K] (the rank-1 scaling's a) or None (absmean scaling), same device.
        scale_n: float32 [B, N], same device. gamma = scale_k[k] * scale_n[n] (or scale_n[n]).
    Returns:
        uint8 [B, N, K // 4]: element 4i+j in bits 2j..2j+1 of byte i; 0b00 = 0, 0b01 = +1, 0b11 = -1
        (|x / gamma| > 1/2 and gamma != 0), 0b10 = a nan / inf input.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    x = _tensor("x", x)
    _dtype("x", x, tuple(DTYPES))
    if x.dim() != 3:
        raise ValueError(f"x must be [B, N, K], got shape {list(x.shape)}")
    b, n, k = x.shape
    if k % 4:
        raise ValueError(f"x: K={k} (last dimension) must be a multiple of 4 for ternary packing")
    scale_k, scale_n = _ternary_scales("x", x, scale_k, scale_n, b, n, k)
    x = x.contiguous()
    codes = _empty((b, n, k // 4), torch.uint8, x.device)
    _call("tsct_ternary_pack", x.device, _ptr(x), DTYPES[x.dtype], b, n, k,
          None if scale_k is None else _ptr(scale_k), _ptr(scale_n), _ptr(codes))
    return codes


def ternary_dequantize(codes: Tensor, scale_k: Tensor | None, scale_n: Tensor,
                       out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Decode ternary codes (``tsct_ternary_dequantize``): out[i, n, k] = (q * scale_k[i, k]) * scale_n[i, n]
    (scale_k None: q * scale_n[i, n]), q = 0 / +1 / -1 / NaN, then RNE.

    Args:
        codes: uint8 [B, N, K // 4], CUDA.
        scale_k: float32 [B, K] or None, same device.
        scale_n: float32 [B, N], same device.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
    Returns:
        [B, N, K] of out_dtype.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or loader.
    """
    codes = _tensor("codes", codes)
    odt = _out_dtype(out_dtype)
    _dtype("codes", codes, (torch.uint8,))
    if codes.dim() != 3:
        raise ValueError(f"codes must be [B, N, K // 4], got shape {list(codes.shape)}")
    b, n, kbytes = codes.shape
    k = kbytes * 4
    scale_k, scale_n = _ternary_scales("codes", codes, scale_k, scale_n, b, n, k)
    codes = codes.contiguous()
    out = _empty((b, n, k), out_dtype, codes.device)
    _call("tsct_ternary_dequantize", codes.device, _ptr(codes), None if scale_k is None else _ptr(scale_k),
          _ptr(scale_n), b, n, k, _ptr(out), odt)
    return out


@functools.lru_cache(maxsize=None)
def kernel_smem_bytes(name: str) -> int:
    """Dynamic shared memory per block (bytes) the library launches kernel `name` with: what a device must
    allow (its opt-in maximum) for that kernel's entry point to run; 0 for the grid-stride quant kernels.
    Host only (``tsct_kernel_smem_bytes``: a table in the library, no CUDA call); cached per name.

    Raises:
        TypeError if name is not a str; ValueError for a name the library does not have; RuntimeError
        (NativeUnavailableError) if the library is unavailable.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    out = ctypes.c_int(0)
    rc = get_lib().tsct_kernel_smem_bytes(name.encode(), ctypes.byref(out))
    if rc != 0:
        raise ValueError(error_message("tsct_kernel_smem_bytes", rc))
    return out.value


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


def nvfp4_quantize_rows_grouped(
    x: Tensor,
    offs: Tensor,
    *,
    gather_idx: Tensor | None = None,
    col_scale: Tensor | None = None,
    m: int | None = None,
    m_alloc: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """NVFP4-quantize routed rows grouped by expert (``tsct_nvfp4_quantize_rows_grouped``).

    The A operand of the sm_120 grouped block-scaled GEMMs (docs/sm120.md, "activation quantizer"):
    each expert's rows are one NVFP4 matrix (recipe docs/decisions/0002) with ONE fp32 encode scale
    per expert, ``s_enc[e] = min(2688 / amax_e, FLT_MAX)`` (amax over the expert's finite values;
    1 for an empty expert or amax 0); the GEMM epilogue folds ``1 / (s_enc[e] * s_enc_factor[e])``.
    No host synchronisation: ``offs`` is never read on the host.

    Args:
        x: [M, K] (routed rows, sorted by expert) or, with ``gather_idx``, [T, K] token-major rows;
            float32 / bfloat16 / float16, CUDA; K % 16 == 0.
        offs: int32 [E] cumulative END offsets of the routed rows (torch grouped_mm), same device;
            non-decreasing with offs[-1] <= M (not checked here: the op validates it; bad values
            never cause out-of-bounds accesses). Rows at or past offs[-1] are padding.
        gather_idx: optional int32/int64 [M]: routed row i reads ``x[gather_idx[i]]`` (an index out of
            range gives a NaN block scale, 0x7F, and zero codes for that row).
        col_scale: optional float32 [E, K]: row i of expert e is multiplied by ``col_scale[e]`` (fp32)
            before quantizing (sign factors: ``x * a[e]``).
        m: routed rows M (default: gather_idx's length, else x's rows).
        m_alloc: rows of ``codes`` (default M; the grouped GEMMs need ``M + tile_m - 1``, see
            ``tsct.emulation.plan.a_rows_alloc``); rows past offs[-1] are written 0.
    Returns:
        codes: uint8 [m_alloc, K // 2] (two E2M1 codes per byte, even element in the low nibble);
        sfa: float8_e4m3fn [plan.sfa_bytes_bound(M, E, K)]: expert e's block scales from byte
            ``sfa_offsets[e]``, swizzled_128x4 with its rows padded to 128, every other byte 0;
        sfa_offsets: int32 [E] (== ``tsct.emulation.plan.sfa_layout(offs, K)[0]``);
        s_enc: float32 [E].
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or the loader.
    """
    from tsct.emulation.plan import sfa_bytes_bound

    x = _tensor("x", x)
    offs = _tensor("offs", offs)
    _dtype("x", x, tuple(DTYPES))
    if x.dim() != 2:
        raise ValueError(f"x must be [rows, K], got shape {list(x.shape)}")
    x_rows, k = x.shape
    if k % 16:
        raise ValueError(f"x: K={k} (last dimension) must be a multiple of 16 for NVFP4")
    _dtype("offs", offs, (torch.int32,))
    if offs.dim() != 1:
        raise ValueError(f"offs must be 1-D [E] (cumulative end offsets), got shape {list(offs.shape)}")
    e = offs.shape[0]
    _cuda("x", x)
    _cuda("offs", offs, x.device)
    if gather_idx is not None:
        gather_idx = _tensor("gather_idx", gather_idx)
        _dtype("gather_idx", gather_idx, (torch.int32, torch.int64))
        if gather_idx.dim() != 1:
            raise ValueError(f"gather_idx must be 1-D [M], got shape {list(gather_idx.shape)}")
        _cuda("gather_idx", gather_idx, x.device)
        gather_idx = gather_idx.to(torch.int64).contiguous()
    rows = gather_idx.shape[0] if gather_idx is not None else x_rows
    if m is None:
        m = rows
    if not isinstance(m, int) or isinstance(m, bool) or m < 0 or m > rows:
        raise ValueError(f"m must be an int in [0, {rows}] (rows available), got {m!r}")
    if m_alloc is None:
        m_alloc = m
    if not isinstance(m_alloc, int) or isinstance(m_alloc, bool) or m_alloc < m:
        raise ValueError(f"m_alloc must be an int >= m={m}, got {m_alloc!r}")
    if col_scale is not None:
        col_scale = _tensor("col_scale", col_scale)
        _dtype("col_scale", col_scale, (torch.float32,))
        _shape("col_scale", col_scale, (e, k), "fp32 per-expert scale over K")
        _cuda("col_scale", col_scale, x.device)
        col_scale = col_scale.contiguous()
    x, offs = x.contiguous(), offs.contiguous()
    sfa_bytes = sfa_bytes_bound(m, e, k)
    codes = _empty((m_alloc, k // 2), torch.uint8, x.device)
    sfa = _empty((sfa_bytes,), torch.uint8, x.device)
    sfa_offsets = _empty((e,), torch.int32, x.device)
    s_enc = _empty((e,), torch.float32, x.device)
    null = ctypes.c_void_p(None)
    _call("tsct_nvfp4_quantize_rows_grouped", x.device, _ptr(x), DTYPES[x.dtype], x_rows, k,
          _ptr(gather_idx) if gather_idx is not None else null, _ptr(offs), e, m,
          _ptr(col_scale) if col_scale is not None else null, m_alloc, _ptr(codes), _ptr(sfa), sfa_bytes,
          _ptr(sfa_offsets), _ptr(s_enc))
    return codes, sfa.view(torch.float8_e4m3fn), sfa_offsets, s_enc


GLU_DZ_RANK = 64  # the only rank tsct_glu_bwd_dz_bf16 is built for
GLU_DZ_TILE = 64  # rows per row tile (xtile_cum counts tiles of this many rows)
GLU_DZ_MAX_SLICES = 16
#: the kernel of tsct_glu_bwd_dz_bf16 (csrc/glu/dz_bf16.cu; 99 KB of shared memory per block)
GLU_DZ_KERNEL = "tsctk_glu_bwd_dz_bf16"


def glu_bwd_dz_bf16(
    grad_out: Tensor,
    offs: Tensor,
    w_down_t: Tensor,
    zw: Tensor,
    *,
    slices: int,
    xtile_cum: Tensor,
    max_tiles: int,
    scatter_idx: Tensor | None = None,
    dw_out: Tensor | None = None,
) -> Tensor:
    """The grouped GLU's up-projection gradients on the row tiles (``tsct_glu_bwd_dz_bf16``, csrc/glu/dz_bf16.cu).

    For routed row i of expert e (rows sorted by expert, ``offs`` as in ``tsct.ops.grouped_glu``) and
    dY_i = ``grad_out[scatter_idx[i]]`` (or ``grad_out[i]`` without ``scatter_idx``)::

        dz_part[s, i, :] = dY_i[cols of slice s] @ w_down_t[e][cols of slice s]   (fp32; dz = dz_part.sum(0))
        dw_out[e]        = sum_i dY_i^T zw[i]            (fp32 sum, rounded once; experts of 0 to 64 rows only)

    One CTA per (row tile of ``GLU_DZ_TILE`` rows, f slice), the tiles numbered expert-major (the Triton backward's
    schedule): tile e < E is expert e's first, found without a search; tile E + j the j-th tile past the experts'
    first ones (``xtile_cum``): an expert's rows spread over the GPU whatever their number. The f columns are cut
    into ``slices`` contiguous runs of 64-column steps; summing the slices in index order gives the same bits on
    every run (no atomics). dW needs all of an expert's rows, so only an expert whose first tile holds them all
    (0 to 64 rows: zeros for an empty one, whose w_down is not read) gets it here; the blocks of the other experts
    (more than 64 rows) are left untouched for the caller (``triton_common.runtime.dwd_chunks``). bf16 mma.sync, fp32
    accumulation.

    Args:
        grad_out: bfloat16 [T, f], contiguous, CUDA, 16-byte aligned (the op's output gradient).
        offs: int32 [E] cumulative END offsets of the routed rows; offs[-1] <= M (not checked here:
            the op validates it).
        w_down_t: bfloat16 [E, f, 64] contiguous (the K-major w_down ``[E, 64, f]`` transposed back).
        zw: bfloat16 [M, 64] contiguous: the latent z times the row weight.
        slices: 1 <= slices <= min(16, ceil(f / 64)).
        xtile_cum: int32 [E] contiguous: inclusive counts per expert of its ``GLU_DZ_TILE``-row tiles past the first
            (max(ceil(rows / 64) - 1, 0); row 3 of the backward's maps). max_tiles: an upper bound of E plus its
            last entry (ceil(M / 64) + E).
        scatter_idx: optional int64 [M]; an index outside [0, T) reads a zero row.
        dw_out: optional bfloat16 [E, f, 64], contiguous, 16-byte aligned (``dw_out.transpose(1, 2)`` is the
            K-major gradient of w_down): receives dW of the experts of 0 to 64 rows; None skips dW.
    Returns:
        dz_part: float32 [slices, M, 64]; rows at or past offs[-1] are not written.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel (e.g. a device with
        less shared memory per block than the kernel needs) or the loader.
    """
    named = [("grad_out", grad_out), ("offs", offs), ("w_down_t", w_down_t), ("zw", zw), ("xtile_cum", xtile_cum)]
    if scatter_idx is not None:
        named.append(("scatter_idx", scatter_idx))
    if dw_out is not None:
        named.append(("dw_out", dw_out))
    for name, t in named:
        _tensor(name, t)
    for name, t in (("grad_out", grad_out), ("w_down_t", w_down_t), ("zw", zw)):
        _dtype(name, t, (torch.bfloat16,))
    _dtype("offs", offs, (torch.int32,))
    _dtype("xtile_cum", xtile_cum, (torch.int32,))
    if grad_out.dim() != 2 or w_down_t.dim() != 3 or zw.dim() != 2 or offs.dim() != 1:
        raise ValueError(f"expected grad_out [T, f], w_down_t [E, f, 64], zw [M, 64], offs [E]; got "
                         f"{list(grad_out.shape)}, {list(w_down_t.shape)}, {list(zw.shape)}, {list(offs.shape)}")
    t_rows, f = grad_out.shape
    e, m = offs.shape[0], zw.shape[0]
    _shape("w_down_t", w_down_t, (e, f, GLU_DZ_RANK), "[E, f, 64]: E from offs, f from grad_out")
    _shape("zw", zw, (m, GLU_DZ_RANK), "[M, 64]")
    _shape("xtile_cum", xtile_cum, (e,), "[E]: one count per expert")
    if dw_out is not None:
        _dtype("dw_out", dw_out, (torch.bfloat16,))
        _shape("dw_out", dw_out, (e, f, GLU_DZ_RANK), "[E, f, 64], as w_down_t")
    nsteps = -(-f // 64)
    if not isinstance(slices, int) or not 1 <= slices <= min(GLU_DZ_MAX_SLICES, max(nsteps, 1)):
        raise ValueError(f"slices must be an int in [1, min(16, ceil(f/64) = {nsteps})], got {slices!r}")
    if not isinstance(max_tiles, int) or max_tiles < 0:
        raise ValueError(f"max_tiles must be an int >= 0 (an upper bound of E + xtile_cum[-1]), got {max_tiles!r}")
    if scatter_idx is not None:
        _dtype("scatter_idx", scatter_idx, (torch.int64,))
        _shape("scatter_idx", scatter_idx, (m,), "one target row per routed row")
    elif t_rows < m:
        raise ValueError(f"grad_out has {t_rows} rows < M={m} and no scatter_idx")
    for name, t in named:
        _cuda(name, t, grad_out.device)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if name not in ("offs", "scatter_idx", "xtile_cum") and t.data_ptr() % 16:
            raise ValueError(f"{name} must be 16-byte aligned (data_ptr % 16 == 0)")
    dz_part = _empty((slices, m, GLU_DZ_RANK), torch.float32, grad_out.device)
    if e == 0 or m == 0 or f == 0 or max_tiles == 0:
        return dz_part
    null = ctypes.c_void_p(None)
    _call("tsct_glu_bwd_dz_bf16", grad_out.device, _ptr(grad_out), t_rows, f,
          _ptr(scatter_idx) if scatter_idx is not None else null, _ptr(offs), _ptr(xtile_cum), e, m, max_tiles,
          _ptr(w_down_t), _ptr(zw), GLU_DZ_RANK, slices, _ptr(dz_part),
          _ptr(dw_out) if dw_out is not None else null)
    return dz_part


GLU_DOWN_TILE = 64  # rows per tile of the low-bit GLU kernels (their tile_cum counts tiles of this many rows)


# Packed storage the low-bit GLU kernels take per factor, by format: (dtype, shape(E, K, N), what) of each of the
# three tensors (tsct.kernels.triton_lowbit.glu._factor_args gives them in this order; None: a slot the format does
# not use, which must be None), the first one's alignment; the formats whose second tensor may be None.
_LOWBIT_STORAGE = {
    "nvfp4": (((torch.uint8, lambda e, k, n: (e, n, k // 2), "codes [E, N, K/2]"),
               (torch.uint8, lambda e, k, n: (e, n, k // 16), "UE4M3 block scale bytes [E, N, K/16], linear"),
               (torch.float32, lambda e, k, n: (e,), "s_enc [E]")), 16),
    "sign": (((torch.uint8, lambda e, k, n: (e, n, k // 8), "bits [E, N, K/8]"),
              (torch.float32, lambda e, k, n: (e, k), "a (scale_k) [E, K]"),
              (torch.float32, lambda e, k, n: (e, n), "b (scale_n) [E, N]")), 8),
    "fp8": (((torch.uint8, lambda e, k, n: (e, n, k), "E4M3 code bytes [E, N, K]"),
             None,
             (torch.float32, lambda e, k, n: (e, n), "scale_n [E, N]")), 16),
    "ternary": (((torch.uint8, lambda e, k, n: (e, n, k // 4), "2-bit codes [E, N, K/4]"),
                 (torch.float32, lambda e, k, n: (e, k), "scale_k [E, K] (rank-1 scaling) or None"),
                 (torch.float32, lambda e, k, n: (e, n), "scale_n [E, N]")), 16),
}
_LOWBIT_OPTIONAL_K = ("ternary",)  # the absmean scaling has no scale_k
LOWBIT_FORMATS = tuple(_LOWBIT_STORAGE)


def _storage_tensors(name: str, w: object) -> list:
    """The tensors of a factor's packed storage ``w`` (a tuple of the format's three slots; None slots left out);
    TypeError naming ``name`` unless it is such a tuple."""
    if not isinstance(w, (tuple, list)) or len(w) != 3:
        raise TypeError(f"{name} must be a tuple of the format's three storage tensors")
    return [(f"{name}[{i}]", t) for i, t in enumerate(w) if t is not None]


def _lowbit_factor(name: str, fmt: str, w: tuple, e: int, k: int, n: int) -> None:
    _lowbit_fmt(fmt)
    _storage_tensors(name, w)
    specs, align = _LOWBIT_STORAGE[fmt]
    for i, (t, spec) in enumerate(zip(w, specs)):
        if spec is None or (t is None and i == 1 and fmt in _LOWBIT_OPTIONAL_K):
            if t is not None:
                raise ValueError(f"{name}[{i}] must be None ({fmt} has no second storage tensor)")
            continue
        dt, shape, what = spec
        _tensor(f"{name}[{i}]", t)
        _dtype(f"{name}[{i}]", t, (dt,))
        _shape(f"{name}[{i}]", t, shape(e, k, n), what)
    if w[0].data_ptr() % align:
        raise ValueError(f"{name}[0] must be {align}-byte aligned")
    if fmt in ("sign", "ternary") and w[1] is not None and w[1].data_ptr() % 16:
        raise ValueError(f"{name}[1] ({'a' if fmt == 'sign' else 'scale_k'}) must be 16-byte aligned")


def _lowbit_fmt(fmt: str) -> None:
    if not isinstance(fmt, str) or fmt not in _LOWBIT_STORAGE:
        raise ValueError(f"fmt must be one of {LOWBIT_FORMATS}, got {fmt!r}")


def _lowbit_sizes(offs: Tensor, max_tiles: object, **counts: object) -> None:
    """The sizes the low-bit wrappers take from the caller: ints >= 0 (bool refused), offs 1-D."""
    for name, v in {**counts, "max_tiles": max_tiles}.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if offs.dim() != 1:
        raise ValueError(f"offs must be 1-D [E] (cumulative end offsets), got shape {list(offs.shape)}")


def _check_down_lowbit(x, offs, tile_cum, gate, up, fmt, m, max_tiles, gather_idx, s_gate, s_up, row_weight, save,
                       out) -> None:
    """glu_down_fwd_lowbit's argument checks (its docstring says what they require)."""
    named = [("x", x), ("offs", offs), ("tile_cum", tile_cum)]
    named += _storage_tensors("gate", gate) + _storage_tensors("up", up)
    for name, t in (("gather_idx", gather_idx), ("s_gate", s_gate), ("s_up", s_up), ("row_weight", row_weight)):
        if t is not None:
            named.append((name, t))
    for name, t in named:
        _tensor(name, t)
        _cuda(name, t, x.device)
    _dtype("x", x, (torch.bfloat16,))
    _dtype("offs", offs, (torch.int32,))
    _dtype("tile_cum", tile_cum, (torch.int32,))
    _lowbit_sizes(offs, max_tiles, m=m)
    if x.dim() != 2 or x.stride(1) != 1 or x.stride(0) % 8 or x.stride(0) < x.shape[1] or x.data_ptr() % 16:
        raise ValueError(f"x must be [rows, d] with unit column stride, a row stride >= d that is a multiple of 8 and "
                         f"a 16-byte aligned start; got shape {list(x.shape)}, strides {list(x.stride())}")
    e, d = offs.shape[0], x.shape[1]
    if d % 64 or d == 0:
        raise ValueError(f"x's d = {d} must be a positive multiple of 64")
    _shape("tile_cum", tile_cum, (e,), "[E]: E from offs")
    for fname, w in (("gate", gate), ("up", up)):
        _lowbit_factor(fname, fmt, w, e, d, 64)
    if (gate[1] is None) != (up[1] is None):
        raise ValueError("gate[1] and up[1] (ternary scale_k) must be both given (rank-1 scaling) or both None: one "
                         "kernel takes one scaling")
    if gather_idx is not None:
        _dtype("gather_idx", gather_idx, (torch.int64,))
        _shape("gather_idx", gather_idx, (m,), "one x row per routed row")
    elif x.shape[0] < m:
        raise ValueError(f"x has {x.shape[0]} rows < m={m} and no gather_idx")
    for name, t, shape in (("s_gate", s_gate, (e, 64)), ("s_up", s_up, (e, 64)), ("row_weight", row_weight, (m,))):
        if t is not None:
            _dtype(name, t, (torch.float32,) if name == "row_weight" else (torch.float32, torch.bfloat16))
            _shape(name, t, shape, "one per rank" if name != "row_weight" else "one per routed row")
    if s_gate is not None and s_up is not None and s_gate.dtype != s_up.dtype:
        raise TypeError(f"s_gate and s_up must share a dtype, got {s_gate.dtype} and {s_up.dtype}")
    for name, t in named:
        if name != "x" and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise TypeError("out must be a tuple (z, hg, hu) (hg, hu None unless save)")
        z, hg, hu = out
        for name, t, dt in (("out[0]", z, torch.bfloat16), ("out[1]", hg, torch.float32),
                            ("out[2]", hu, torch.float32)):
            if name == "out[0]" and t is None:
                raise ValueError("out[0] (z) must be a tensor")
            if name != "out[0]" and (t is None) == save:
                raise ValueError(f"{name} must be {'a tensor' if save else 'None'} with save={save}")
            if t is not None:
                _tensor(name, t)
                _cuda(name, t, x.device)
                _dtype(name, t, (dt,))
                _shape(name, t, (m, 64), "[m, 64]")
                if not t.is_contiguous():
                    raise ValueError(f"{name} must be contiguous")


def glu_down_fwd_lowbit(
    x: Tensor,
    offs: Tensor,
    tile_cum: Tensor,
    gate: tuple[Tensor, Tensor, Tensor],
    up: tuple[Tensor, Tensor, Tensor],
    *,
    fmt: str,
    m: int,
    max_tiles: int,
    gather_idx: Tensor | None = None,
    s_gate: Tensor | None = None,
    s_up: Tensor | None = None,
    row_weight: Tensor | None = None,
    save: bool = False,
    out: tuple[Tensor, Tensor | None, Tensor | None] | None = None,
    validate: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The low-bit grouped GLU's down projection with NVFP4, sign, FP8 or ternary w_gate / w_up
    (``tsct_glu_down_fwd_<fmt>``, csrc/glu/down_nvfp4.cu): for routed row i of expert e and x_i =
    ``x[gather_idx[i]]`` (or ``x[i]``)::

        hg[i] = x_i @ W_gate_hat[e],  hu[i] = x_i @ W_up_hat[e]           (fp32)
        z[i]  = silu(hg[i] * s_gate[e]) * (hu[i] * s_up[e]) * row_weight[i]

    W_hat: NVFP4 e2m1 * sf / s_enc (docs/decisions/0002-nvfp4-recipe.md), exact in the product; sign
    (+-bf16(a[k])) * b[n] (docs/formats.md; a rounded to bf16 as on the Triton path); fp8 e4m3 * scale_n[n]
    (docs/decisions/0021-fp8-format.md; exact in the product, NaN for the codes 0x7F / 0xFF); ternary q * scale_n[n]
    or bf16(q * scale_k[k]) * scale_n[n] (docs/decisions/0022-ternary-format.md; the code 0b10 is NaN), the
    rounding of the Triton path. bf16 MMA (wgmma with the decoded factors in registers on sm_90a, mma.sync
    elsewhere), fp32 accumulation.

    Args:
        x: bfloat16 [rows, d], rows 16-byte aligned (x.stride(0) % 8 == 0, stride(1) == 1), d % 64 == 0.
        offs: int32 [E] cumulative END offsets of the routed rows (not checked here: the op validates them).
        tile_cum: int32 [E] inclusive counts of ``GLU_DOWN_TILE``-row tiles per expert; ``max_tiles`` >= its
            last entry (an upper bound such as ceil(m / 64) + E: the grid).
        gate, up: the packed storage of w_gate / w_up ([E, d, 64] factors stored K-contiguous), by ``fmt``:
            "nvfp4": (codes uint8 [E, 64, d/2] 16-byte aligned, block scales uint8 [E, 64, d/16] (raw UE4M3,
            linear layout), s_enc float32 [E]); "sign": (bits uint8 [E, 64, d/8] 8-byte aligned, a float32
            [E, d] 16-byte aligned, b float32 [E, 64]); "fp8": (E4M3 codes as uint8 [E, 64, d] 16-byte aligned,
            None, scale_n float32 [E, 64]); "ternary": (codes uint8 [E, 64, d/4] 16-byte aligned, scale_k float32
            [E, d] 16-byte aligned or None (absmean scaling; both factors alike), scale_n float32 [E, 64]).
        m: routed rows (z's rows); gather_idx: optional int64 [m] (entries not checked).
        s_gate, s_up: optional [E, 64], both float32 or both bfloat16 (read as they are, widened exactly).
        row_weight: optional float32 [m].
        save: also return hg and hu (float32 [m, 64]).
        out: optional (z, hg, hu) to write into (contiguous, the shapes and dtypes returned; hg, hu None
            unless ``save``).
        validate: False skips this wrapper's argument checks (~0.1 ms of host time per call) for a caller that
            has made them already (the op's dispatch, ``tsct.kernels.triton_lowbit.glu``); ``fmt`` is still
            checked, and the C entry still rejects bad sizes, alignment and null pointers.
    Returns:
        (z bfloat16 [m, 64], hg, hu) with hg, hu None unless ``save``. Rows at or past offs[-1] are not
        written (torch.empty contents).
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel (e.g. less than the 66-74
        KB of shared memory per block it needs: ``kernel_smem_bytes``) or the loader.
    """
    _lowbit_fmt(fmt)
    if validate:
        _check_down_lowbit(x, offs, tile_cum, gate, up, fmt, m, max_tiles, gather_idx, s_gate, s_up, row_weight,
                           save, out)
    e, d = offs.shape[0], x.shape[1]
    if out is None:
        z = _empty((m, 64), torch.bfloat16, x.device)
        hg = _empty((m, 64), torch.float32, x.device) if save else None
        hu = _empty((m, 64), torch.float32, x.device) if save else None
    else:
        z, hg, hu = out
    if e == 0 or m == 0 or max_tiles == 0:
        return z, hg, hu
    null = ctypes.c_void_p(None)
    opt = lambda t: _ptr(t) if t is not None else null  # noqa: E731
    _call(f"tsct_glu_down_fwd_{fmt}", x.device, _ptr(x), x.shape[0], x.stride(0), opt(gather_idx), _ptr(offs),
          _ptr(tile_cum), e, m, d, 64, *[opt(t) for t in gate], *[opt(t) for t in up], opt(s_gate), opt(s_up),
          int(any(t is not None and t.dtype == torch.bfloat16 for t in (s_gate, s_up))), opt(row_weight), _ptr(z),
          opt(hg), opt(hu), max_tiles)
    return z, hg, hu


def _check_up_lowbit(z, offs, tile_cum, w_down, y, fmt, f, max_tiles, row_weight) -> None:
    """glu_up_fwd_lowbit's argument checks (its docstring says what they require)."""
    named = [("z", z), ("offs", offs), ("tile_cum", tile_cum), ("y", y)]
    named += _storage_tensors("w_down", w_down)
    if row_weight is not None:
        named.append(("row_weight", row_weight))
    for name, t in named:
        _tensor(name, t)
        _cuda(name, t, z.device)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    _dtype("z", z, (torch.bfloat16,))
    _dtype("y", y, (torch.bfloat16,))
    _dtype("offs", offs, (torch.int32,))
    _dtype("tile_cum", tile_cum, (torch.int32,))
    _lowbit_sizes(offs, max_tiles)
    e = offs.shape[0]
    if z.dim() != 2 or z.shape[1] != 64:
        raise ValueError(f"z must be [m, 64], got {list(z.shape)}")
    m = z.shape[0]
    _shape("tile_cum", tile_cum, (e,), "[E]: E from offs")
    if not isinstance(f, int) or isinstance(f, bool) or f < 1:
        raise ValueError(f"f must be a positive int, got {f!r}")
    if y.dim() != 2 or y.shape[0] != m or y.shape[1] < f or y.shape[1] % 8:
        raise ValueError(f"y must be [m={m}, ldy] with ldy >= f={f} and a multiple of 8, got {list(y.shape)}")
    _lowbit_factor("w_down", fmt, w_down, e, 64, f)
    if row_weight is not None:
        _dtype("row_weight", row_weight, (torch.float32,))
        _shape("row_weight", row_weight, (m,), "one per routed row")
    for name, t in (("z", z), ("y", y)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must be 16-byte aligned")


def glu_up_fwd_lowbit(
    z: Tensor,
    offs: Tensor,
    tile_cum: Tensor,
    w_down: tuple[Tensor, Tensor, Tensor],
    y: Tensor,
    *,
    fmt: str,
    f: int,
    max_tiles: int,
    row_weight: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """The low-bit grouped GLU's up projection with an NVFP4, sign, FP8 or ternary w_down
    (``tsct_glu_up_fwd_<fmt>``, csrc/glu/up_nvfp4.cu): for routed row i of expert e,
    ``y[i, :f] = (z[i] @ W_down_hat[e]) * row_weight[i]`` with W_hat as for ``glu_down_fwd_lowbit`` (sign, fp8,
    ternary: the product with the decoded codes times b[n] / scale_n[n], then the row weight); bf16 MMA (wgmma on
    sm_90a, mma.sync elsewhere), fp32 accumulation, one bf16 rounding. Columns [f, ldy) of y get the product with
    zero weights, ``(z[i] . 0) * row_weight[i]`` (zeros unless z[i] or row_weight[i] holds an inf or NaN).

    Args:
        z: bfloat16 [m, 64] contiguous, 16-byte aligned (rows sorted by expert).
        offs, tile_cum, max_tiles: as for ``glu_down_fwd_lowbit`` (``GLU_DOWN_TILE``-row tiles).
        w_down: the packed storage of w_down ([E, 64, f] stored K-contiguous), by ``fmt``: "nvfp4": (codes uint8
            [E, f, 32] 16-byte aligned, block scales uint8 [E, f, 4], s_enc float32 [E]); "sign": (bits uint8
            [E, f, 8] 8-byte aligned, a float32 [E, 64] 16-byte aligned, b float32 [E, f]); "fp8": (E4M3 codes as
            uint8 [E, f, 64] 16-byte aligned, None, scale_n float32 [E, f]); "ternary": (codes uint8 [E, f, 16]
            16-byte aligned, scale_k float32 [E, 64] 16-byte aligned or None, scale_n float32 [E, f]).
        y: bfloat16 [m, ldy] contiguous, 16-byte aligned, ldy >= f a multiple of 8 (written in place).
        f: the output width; row_weight: optional float32 [m].
        validate: False skips this wrapper's argument checks, as for ``glu_down_fwd_lowbit``.
    Returns:
        ``y``; rows at or past offs[-1] are not written.
    Raises:
        TypeError / ValueError naming the bad argument; RuntimeError from the kernel or the loader.
    """
    _lowbit_fmt(fmt)
    if validate:
        _check_up_lowbit(z, offs, tile_cum, w_down, y, fmt, f, max_tiles, row_weight)
    e, m = offs.shape[0], z.shape[0]
    codes, scales, s_enc = w_down
    if e == 0 or m == 0 or max_tiles == 0:
        return y
    null = ctypes.c_void_p(None)
    _call(f"tsct_glu_up_fwd_{fmt}", z.device, _ptr(z), m, _ptr(offs), _ptr(tile_cum), e, f, 64, _ptr(codes),
          _ptr(scales) if scales is not None else null, _ptr(s_enc),
          _ptr(row_weight) if row_weight is not None else null, _ptr(y), y.shape[1], max_tiles)
    return y


SM120_VARIANTS = {"alpha": 0, "glu": 1, "row_weight": 2}


def sm120_built() -> bool:
    """Whether the loaded library has the CuTeDSL sm_120 kernels linked in (``tsct_sm120_built``).

    Host only (no CUDA call). Raises RuntimeError (NativeUnavailableError) if the library is unavailable.
    """
    flag = ctypes.c_int(0)
    rc = get_lib().tsct_sm120_built(ctypes.byref(flag))
    if rc != 0:
        raise RuntimeError(error_message("tsct_sm120_built", rc))
    return bool(flag.value)


def sm120_nvfp4_grouped(variant: str, a: Tensor, b: Tensor, sfa: Tensor, sfa_offsets: Tensor, sfb: Tensor,
                        c: Tensor, offs: Tensor, tile_expert: Tensor, tile_row: Tensor, alpha: Tensor,
                        ep0: Tensor, ep1: Tensor) -> Tensor:
    """One CuTeDSL sm_120 NVFP4 grouped GEMM into ``c`` (``tsct_sm120_nvfp4_grouped``; decision 0009).

    Runs only on compute capability 12.0 with a library built with TSCT_CUTEDSL=ON; NOT executed on any
    GPU yet (docs/sm120.md). Operands as ``tsct.kernels.sm120_fp4`` prepares them:

    Args:
        variant: "alpha", "glu" or "row_weight" (the epilogue).
        a: uint8 [m_alloc, K/2] E2M1 codes of the routed rows (``quantize_rows_grouped``).
        b: uint8 [E, N, K/2] E2M1 codes of the factor (glu: N = 2r, gate/up rows interleaved).
        sfa: float8_e4m3fn / uint8 flat per-expert swizzled activation scales; sfa_offsets int32 [E].
        sfb: float8_e4m3fn / uint8 [E, pad128(N) * Kbp] (or flat) swizzled factor scales.
        c: bfloat16 [rows, N_out] (row stride c.stride(0), unit column stride), written in place for the
            rows of every expert (other rows untouched); glu: N_out = N / 2.
        offs: int32 [E]; tile_expert / tile_row: int32 [T] (``tsct.emulation.plan.tile_map``).
        alpha: float32 [E]; ep0 / ep1: float32 2-D (glu: [E, N/2]; row_weight: [rows, 1] row weights).
    Returns:
        c.
    Raises:
        ValueError naming the argument; RuntimeError from the library (TSCT_ERR_NOT_BUILT without the kernels).
    """
    if variant not in SM120_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(SM120_VARIANTS)}, got {variant!r}")
    for name, t, dts in (("a", a, (torch.uint8,)), ("b", b, (torch.uint8,)),
                         ("sfa", sfa, (torch.uint8, torch.float8_e4m3fn)),
                         ("sfb", sfb, (torch.uint8, torch.float8_e4m3fn)), ("c", c, (torch.bfloat16,)),
                         ("sfa_offsets", sfa_offsets, (torch.int32,)), ("offs", offs, (torch.int32,)),
                         ("tile_expert", tile_expert, (torch.int32,)), ("tile_row", tile_row, (torch.int32,)),
                         ("alpha", alpha, (torch.float32,)), ("ep0", ep0, (torch.float32,)),
                         ("ep1", ep1, (torch.float32,))):
        _dtype(name, _tensor(name, t), dts)
        _cuda(name, t, a.device)
        if name != "c" and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if a.dim() != 2 or b.dim() != 3 or c.dim() != 2 or ep0.dim() != 2 or ep0.shape != ep1.shape:
        raise ValueError(f"need a [m_alloc, K/2], b [E, N, K/2], c [rows, N_out], ep0/ep1 2-D of one shape; got "
                         f"a {list(a.shape)}, b {list(b.shape)}, c {list(c.shape)}, ep0 {list(ep0.shape)}, "
                         f"ep1 {list(ep1.shape)}")
    if c.stride(1) != 1:
        raise ValueError("c must have unit column stride")
    e, n, half_k = b.shape
    k = 2 * half_k
    if a.shape[1] != half_k:
        raise ValueError(f"a has {a.shape[1]} bytes per row, b has {half_k} (K/2 must agree)")
    _shape("offs", offs, (e,), "one end offset per expert")
    _shape("alpha", alpha, (e,), "one fp32 scale per expert")
    _shape("sfa_offsets", sfa_offsets, (e,), "one byte offset per expert")
    _shape("tile_row", tile_row, tuple(tile_expert.shape), "same length as tile_expert")
    _call("tsct_sm120_nvfp4_grouped", a.device, SM120_VARIANTS[variant], _ptr(a), a.shape[0], k, _ptr(b), n, e,
          _ptr(sfa), sfa.numel(), _ptr(sfa_offsets), _ptr(sfb), sfb.numel(), _ptr(c), c.shape[0], c.shape[1],
          c.stride(0), _ptr(offs), _ptr(tile_expert), _ptr(tile_row), tile_expert.numel(), _ptr(alpha), _ptr(ep0),
          ep0.shape[0], ep0.shape[1], ep0.stride(0), _ptr(ep1))
    return c


def sm120_sign_grouped(variant: str, a: Tensor, bits: Tensor, sfa: Tensor, sfa_offsets: Tensor, col_scale: Tensor,
                       c: Tensor, offs: Tensor, tile_expert: Tensor, tile_row: Tensor, alpha: Tensor, ep0: Tensor,
                       ep1: Tensor) -> Tensor:
    """One CuTeDSL sm_120 grouped SIGN GEMM into ``c`` (``tsct_sm120_sign_grouped``; decision 0009).

    Compute capability 12.0 only, library built with TSCT_CUTEDSL=ON; NOT executed on any GPU yet.
    P = 2 copies for "glu" (gate, up), else 1; P outermost:

    Args:
        variant: "alpha", "glu" or "row_weight".
        a: uint8 [P, m_alloc, K/2]: NVFP4 codes of x * a_p[e] (``quantize_rows_grouped(col_scale=...)``).
        bits: uint8 [P, E, N, K/8] (``SignTensor.bits`` stacked).
        sfa: uint8 / float8_e4m3fn [P, bytes] (bytes % 16 == 0); sfa_offsets: int32 [E] (shared by the copies).
        col_scale: float32 [P, E, N] (``SignTensor.scale_n`` stacked).
        c: bfloat16 [rows, N] written for the rows of every expert; offs / tile map as ``sm120_nvfp4_grouped``.
        alpha: float32 [E, P] (P contiguous): 1 / s_enc of copy p.
        ep0 / ep1: float32 2-D ("glu": s_gate / s_up [E, N]; "row_weight": row weights [rows, 1]).
    Returns:
        c.
    Raises:
        ValueError naming the argument; RuntimeError from the library (TSCT_ERR_NOT_BUILT without the kernels).
    """
    if variant not in SM120_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(SM120_VARIANTS)}, got {variant!r}")
    p = 2 if variant == "glu" else 1
    for name, t, dts in (("a", a, (torch.uint8,)), ("bits", bits, (torch.uint8,)),
                         ("sfa", sfa, (torch.uint8, torch.float8_e4m3fn)), ("col_scale", col_scale, (torch.float32,)),
                         ("c", c, (torch.bfloat16,)), ("sfa_offsets", sfa_offsets, (torch.int32,)),
                         ("offs", offs, (torch.int32,)), ("tile_expert", tile_expert, (torch.int32,)),
                         ("tile_row", tile_row, (torch.int32,)), ("alpha", alpha, (torch.float32,)),
                         ("ep0", ep0, (torch.float32,)), ("ep1", ep1, (torch.float32,))):
        _dtype(name, _tensor(name, t), dts)
        _cuda(name, t, a.device)
        if name != "c" and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if a.dim() != 3 or bits.dim() != 4 or sfa.dim() != 2 or col_scale.dim() != 3:
        raise ValueError(f"need a [P, m_alloc, K/2], bits [P, E, N, K/8], sfa [P, bytes], col_scale [P, E, N]; got "
                         f"{list(a.shape)}, {list(bits.shape)}, {list(sfa.shape)}, {list(col_scale.shape)}")
    _, e, n, k8 = bits.shape
    k = 8 * k8
    _shape("a", a, (p, a.shape[1], k // 2), f"{p} copies of the codes for variant {variant!r}")
    _shape("bits", bits, (p, e, n, k8), f"{p} sign factors")
    _shape("sfa", sfa, (p, sfa.shape[1]), f"{p} scale copies")
    _shape("col_scale", col_scale, (p, e, n), "scale_n per copy")
    _shape("alpha", alpha, (e, p), "[E, P], P contiguous")
    _shape("offs", offs, (e,), "one end offset per expert")
    _shape("sfa_offsets", sfa_offsets, (e,), "one byte offset per expert")
    _shape("tile_row", tile_row, tuple(tile_expert.shape), "same length as tile_expert")
    if c.dim() != 2 or c.stride(1) != 1 or ep0.dim() != 2 or ep0.shape != ep1.shape:
        raise ValueError("c must be 2-D with unit column stride; ep0/ep1 2-D of one shape")
    _call("tsct_sm120_sign_grouped", a.device, SM120_VARIANTS[variant], _ptr(a), a.shape[1], k, _ptr(bits), n, e,
          _ptr(sfa), sfa.shape[1], _ptr(sfa_offsets), _ptr(col_scale), _ptr(c), c.shape[0], c.shape[1], c.stride(0),
          _ptr(offs), _ptr(tile_expert), _ptr(tile_row), tile_expert.numel(), _ptr(alpha), _ptr(ep0), ep0.shape[0],
          ep0.shape[1], ep0.stride(0), _ptr(ep1))
    return c
