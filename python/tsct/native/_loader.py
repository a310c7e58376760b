"""Finding and loading ``libtsct_kernels.so`` with ctypes, lazily (docs/decisions/0001).

Nothing here runs at import: the library is opened on the first call that needs it, once per
process, under a lock. Opening it queries no device (the CUDA runtime inside is linked statically
and initialises itself on the first CUDA call).

Where the library is looked for, in order:
  1. ``$TSCT_NATIVE_LIB``: a path to the .so, or to a directory holding it;
  2. ``tsct/_lib/libtsct_kernels.so`` inside the installed package (what the wheel ships).
``manifest.json`` is read from the same directory as the library.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from ctypes import c_char_p, c_int, c_int32, c_int64, c_void_p
from pathlib import Path
from typing import Any

from tsct import config

LIB_NAME = "libtsct_kernels.so"
MANIFEST_NAME = "manifest.json"
ABI_VERSION = 14  # 2: the Triton AOT launcher (tsct_triton_*); 3: tsct_nvfp4_quantize_rows_grouped, tsct_sm120_*;
#                   4: the CUTLASS C++ sm_120 grouped NVFP4 GEMM entries; 5: tsct_glu_bwd_dz_bf16;
#                   6: tsct_glu_{down,up}_fwd_{nvfp4,sign}, tsct_kernel_smem_bytes; 7: bf16 s_gate / s_up for
#                   tsct_glu_down_fwd_{nvfp4,sign} (scales_bf16); tsct_stream_capture_id; 8: 4's entries removed;
#                   9: tsct_glu_bwd_dz_bf16 on the row tiles of a tile map (tile_cum, max_tiles; dW only for experts
#                   of <= 64 rows);
#                   10: tsct_fp8_{quantize,dequantize}, tsct_ternary_{pack,dequantize};
#                   11: tsct_glu_bwd_dz_bf16 on expert-major row tiles (xtile_cum), dW also for empty experts;
#                   12: tsct_glu_{down,up}_fwd_{fp8,ternary}; 13: tsct_glu_bwd_dz_bf16 takes its stages (3 or 4)
#                   14: tsct_glu_bwd_dz_bf16 without stages (one build)
ENV_VAR = "TSCT_NATIVE_LIB"

# Name -> (restype, argtypes) of every entry point in csrc/include/tsct/tsct.h.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "tsct_abi_version": (c_int, []),
    "tsct_error_string": (c_char_p, [c_int]),
    "tsct_last_error_detail": (c_char_p, []),
    "tsct_build_info": (c_char_p, []),
    "tsct_kernel_available": (c_int, [c_char_p, ctypes.POINTER(c_int)]),
    "tsct_kernel_smem_bytes": (c_int, [c_char_p, ctypes.POINTER(c_int)]),
    "tsct_stream_capture_id": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]),
    # x, x_dtype, batch, n, k, s_enc, codes, block_scale, layout, stream
    "tsct_nvfp4_quantize": (c_int, [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_void_p, c_int, c_void_p]),
    # codes, block_scale, layout, s_enc, batch, n, k, out, out_dtype, stream
    "tsct_nvfp4_dequantize": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int, c_void_p]),
    # x, x_dtype, x_rows, k, gather_idx, offs, num_experts, m, col_scale, m_alloc, codes, sfa, sfa_bytes,
    # sfa_offsets, s_enc, stream
    "tsct_nvfp4_quantize_rows_grouped": (c_int, [c_void_p, c_int, c_int64, c_int64, c_void_p, c_void_p, c_int64, c_int64,
                                                 c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_void_p, c_void_p,
                                                 c_void_p]),
    # grad_out, grad_rows, f, scatter_idx, offs, xtile_cum, num_experts, m, max_tiles, w_down_t, zw, r, slices,
    # dz_part, dw_down_t, stream
    "tsct_glu_bwd_dz_bf16": (c_int, [c_void_p, c_int64, c_int64, c_void_p, c_void_p, c_void_p, c_int64, c_int64,
                                     c_int64, c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_void_p, c_void_p]),
    # x, x_rows, stride_x, gather_idx, offs, tile_cum, num_experts, m, d, r, gate codes, scales, s_enc, up codes,
    # scales, s_enc, s_gate, s_up, scales_bf16, row_weight, z, hg, hu, max_tiles, stream
    **{f"tsct_glu_down_fwd_{fmt}": (c_int, [c_void_p, c_int64, c_int64, c_void_p, c_void_p, c_void_p, c_int64,
                                            c_int64, c_int64, c_int64] + [c_void_p] * 8 + [c_int32] + [c_void_p] * 4
                                    + [c_int64, c_void_p]) for fmt in ("nvfp4", "sign", "fp8", "ternary")},
    # z, m, offs, tile_cum, num_experts, f, r, codes, scales, s_enc, row_weight, y, ldy, max_tiles, stream
    **{f"tsct_glu_up_fwd_{fmt}": (c_int, [c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p,
                                          c_void_p, c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_void_p])
       for fmt in ("nvfp4", "sign", "fp8", "ternary")},
    # built*
    "tsct_sm120_built": (c_int, [ctypes.POINTER(c_int)]),
    # variant, a, m_alloc, k, b, n, num_experts, sfa, sfa_bytes, sfa_offsets, sfb, sfb_bytes, c, c_rows, c_cols, ldc,
    # offs, tile_expert, tile_row, num_tiles, alpha, ep0, ep_rows, ep_cols, ep_ld, ep1, stream
    "tsct_sm120_nvfp4_grouped": (c_int, [c_int, c_void_p, c_int64, c_int64, c_void_p, c_int64, c_int64, c_void_p, c_int64,
                                         c_void_p, c_void_p, c_int64, c_void_p, c_int64, c_int64, c_int64, c_void_p,
                                         c_void_p, c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_int64, c_int64,
                                         c_void_p, c_void_p]),
    # variant, a, m_alloc, k, bits, n, num_experts, sfa, sfa_bytes, sfa_offsets, col_scale, c, c_rows, c_cols, ldc,
    # offs, tile_expert, tile_row, num_tiles, alpha, ep0, ep_rows, ep_cols, ep_ld, ep1, stream
    "tsct_sm120_sign_grouped": (c_int, [c_int, c_void_p, c_int64, c_int64, c_void_p, c_int64, c_int64, c_void_p, c_int64,
                                        c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_void_p,
                                        c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p,
                                        c_void_p]),
    # w, w_dtype, batch, n, k, bits, stream
    "tsct_sign_pack": (c_int, [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p]),
    # bits, a, scale_n, batch, n, k, out, out_dtype, stream
    "tsct_sign_dequantize": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int, c_void_p]),
    # x, x_dtype, batch, n, k, scale_n, codes, stream
    "tsct_fp8_quantize": (c_int, [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_void_p]),
    # codes, scale_n, batch, n, k, out, out_dtype, stream
    "tsct_fp8_dequantize": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int, c_void_p]),
    # x, x_dtype, batch, n, k, scale_k (nullable), scale_n, codes, stream
    "tsct_ternary_pack": (c_int, [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_void_p, c_void_p]),
    # codes, scale_k (nullable), scale_n, batch, n, k, out, out_dtype, stream
    "tsct_ternary_dequantize": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int,
                                        c_void_p]),
    # Triton AOT (tsct.kernels.aot): cache_key, image, image_size, function, num_params, shared_bytes, block_x, handle*
    "tsct_triton_load": (c_int, [c_char_p, c_char_p, ctypes.c_uint64, c_char_p, c_int, ctypes.c_uint, ctypes.c_uint,
                                 ctypes.POINTER(c_void_p)]),
    # handle, grid_x, grid_y, grid_z, stream, args (void**), num_args
    "tsct_triton_launch": (c_int, [c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, c_void_p, c_void_p, c_int]),
    # handle, num_regs*, max_threads_per_block*, local_bytes*
    "tsct_triton_kernel_info": (c_int, [c_void_p, ctypes.POINTER(c_int), ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
}


class NativeUnavailableError(RuntimeError):
    """The native library is missing or could not be loaded; the message says why."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None
_tried = False
_lib_path_loaded: str | None = None


def _package_lib_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "_lib"


def _candidate() -> Path:
    """The library file that would be loaded (it may not exist)."""
    env = config.native_lib()
    if env:
        p = Path(env).expanduser()
        return p / LIB_NAME if p.is_dir() else p
    return _package_lib_dir() / LIB_NAME


def library_path() -> str | None:
    """Path of the native library that is (or would be) loaded, or None if there is no such file."""
    p = _lib_path_loaded or _candidate()
    return str(p) if Path(p).is_file() else None


def _open() -> ctypes.CDLL:
    global _lib_path_loaded
    path = _candidate()
    if not path.is_file():
        if config.native_lib():  # the override points nowhere: say so, not that the install lacks the library
            raise NativeUnavailableError(f"{LIB_NAME} not found at {path} (${ENV_VAR}={config.native_lib()!r}; "
                                         f"unset it to load the installed library)")
        raise NativeUnavailableError(
            f"{LIB_NAME} not found at {path} (looked in the tsct package); this tsct install has no native kernels "
            "(built with TSCT_BUILD_CUDA=OFF, or from a source tree without pip install)")
    try:
        lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
    except OSError as e:
        raise NativeUnavailableError(f"cannot load {path}: {e}") from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise NativeUnavailableError(f"{path} does not export {name}: a stale or foreign library") from None
        fn.restype, fn.argtypes = restype, argtypes
    abi = lib.tsct_abi_version()
    if abi != ABI_VERSION:
        raise NativeUnavailableError(f"{path} has C ABI version {abi}, this tsct expects {ABI_VERSION}")
    _lib_path_loaded = str(path)
    return lib


def get_lib() -> ctypes.CDLL:
    """The loaded library (loading it on the first call). Raises NativeUnavailableError."""
    global _lib, _error, _tried
    if _lib is not None:
        return _lib
    with _lock:
        if not _tried:
            _tried = True
            try:
                _lib = _open()
            except NativeUnavailableError as e:
                _error = str(e)
        if _lib is None:
            raise NativeUnavailableError(_error)
        return _lib


def available() -> bool:
    """True if the native library is present and loads. Never raises; queries no device."""
    try:
        get_lib()
        return True
    except Exception:  # noqa: BLE001  (documented: never raises)
        return False


def load_error() -> str | None:
    """Why the library is unavailable (tries to load it first), or None if it loaded."""
    return None if available() else _error


def _reset_for_tests() -> None:
    """Forget the loaded library so the next call looks again (tests changing $TSCT_NATIVE_LIB)."""
    global _lib, _error, _tried, _lib_path_loaded
    with _lock:
        _lib, _error, _tried, _lib_path_loaded = None, None, False, None


def build_info() -> dict:
    """The JSON the library was built with (``tsct_build_info()``): version, nvcc, targets, kernels.

    Raises NativeUnavailableError if the library cannot be loaded.
    """
    return json.loads(get_lib().tsct_build_info().decode())


def manifest() -> dict | None:
    """``manifest.json`` next to the library, read from disk without loading the library; None if absent."""
    p = Path(library_path() or _candidate()).parent / MANIFEST_NAME
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def error_message(fn: str, rc: int) -> str:
    """'fn: <error string>: <detail>' for a non-zero return code of entry point `fn`."""
    lib = get_lib()
    what = (lib.tsct_error_string(rc) or b"").decode(errors="replace")
    detail = (lib.tsct_last_error_detail() or b"").decode(errors="replace")
    return f"{fn} returned {rc} ({what})" + (f": {detail}" if detail else "")
