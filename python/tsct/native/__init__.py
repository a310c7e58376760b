"""tsct.native: the ahead-of-time compiled CUDA kernels (``tsct/_lib/libtsct_kernels.so``) via ctypes.

Importing this module loads nothing and touches no GPU: the library is opened on the first call
that needs it (``available()``, ``build_info()``, a kernel wrapper). ``$TSCT_NATIVE_LIB`` overrides
where it is found (a .so path or a directory). The C ABI is ``csrc/include/tsct/tsct.h``
(docs/decisions/0001); the formats are docs/decisions/0002-nvfp4-recipe.md.

Introspection:
    available() -> bool              the library is present and loads (never raises)
    load_error() -> str | None       why not
    library_path() -> str | None     the .so in use (or that would be)
    manifest() -> dict | None        manifest.json beside it, read without loading the library
    build_info() -> dict             the same JSON, as compiled into the library
    kernel_available(name) -> bool   the current CUDA device can load that kernel
    kernel_smem_bytes(name) -> int   the dynamic shared memory per block the library launches it with
Kernels (CUDA tensors; see each docstring for shapes, dtypes and errors):
    nvfp4_quantize(x, s_enc, layout) -> (codes, block_scale)
    nvfp4_dequantize(codes, block_scale, layout, s_enc, k, out_dtype=torch.bfloat16) -> Tensor
    nvfp4_quantize_rows_grouped(x, offs, *, gather_idx, col_scale, m, m_alloc)
        -> (codes, sfa, sfa_offsets, s_enc)   routed rows per expert, swizzled scales (sm_120 GEMMs' A)
    glu_bwd_dz_bf16(grad_out, offs, w_down_t, zw, *, slices, xtile_cum, max_tiles, scatter_idx, dw_out, stages)
        -> dz_part
                                     the grouped GLU's up-projection gradients (bf16, r = 64, sm_80/90/100)
    glu_down_fwd_lowbit(x, offs, tile_cum, gate, up, *, fmt, m, max_tiles, gather_idx, s_gate, s_up, row_weight,
        save, out) -> (z, hg, hu)    the low-bit grouped GLU's down projection + GLU (NVFP4 or sign factors, r = 64)
    glu_up_fwd_lowbit(z, offs, tile_cum, w_down, y, *, fmt, f, max_tiles, row_weight) -> y
                                     its up projection into a padded y (NVFP4 or sign w_down, r = 64)
    sm120_built() -> bool            the CuTeDSL sm_120 kernels are linked in (decision 0009)
    sm120_nvfp4_grouped(variant, a, b, sfa, sfa_offsets, sfb, c, offs, tile_expert, tile_row, alpha, ep0, ep1)
        one CuTeDSL sm_120a grouped NVFP4 GEMM (compute capability 12.0 only; never executed yet)
    sm120_sign_grouped(variant, a, bits, sfa, sfa_offsets, col_scale, c, offs, tile_expert, tile_row, alpha, ep0, ep1)
        the same with 1-bit sign factors
    sign_pack(w) -> bits
    sign_dequantize(bits, a, b, out_dtype=torch.bfloat16) -> Tensor
    fp8_quantize(x, scale_n) -> codes
    fp8_dequantize(codes, scale_n, out_dtype=torch.bfloat16) -> Tensor
    ternary_pack(x, scale_k, scale_n) -> codes
    ternary_dequantize(codes, scale_k, scale_n, out_dtype=torch.bfloat16) -> Tensor
    stream_capture_id(stream) -> int the CUDA graph capture underway on a stream (0: none)
"""

from tsct.native._loader import (
    NativeUnavailableError,
    available,
    build_info,
    library_path,
    load_error,
    manifest,
)
from tsct.native._ops import (
    GLU_DOWN_TILE,
    fp8_dequantize,
    fp8_quantize,
    GLU_DZ_KERNEL,
    GLU_DZ_TILE,
    glu_bwd_dz_bf16,
    glu_down_fwd_lowbit,
    glu_up_fwd_lowbit,
    kernel_available,
    kernel_smem_bytes,
    nvfp4_dequantize,
    nvfp4_quantize,
    nvfp4_quantize_rows_grouped,
    sign_dequantize,
    sign_pack,
    sm120_built,
    sm120_nvfp4_grouped,
    sm120_sign_grouped,
    stream_capture_id,
    swizzled_scale_numel,
    ternary_dequantize,
    ternary_pack,
)

__all__ = [
    "GLU_DOWN_TILE",
    "GLU_DZ_KERNEL",
    "GLU_DZ_TILE",
    "NativeUnavailableError",
    "available",
    "build_info",
    "fp8_dequantize",
    "fp8_quantize",
    "glu_bwd_dz_bf16",
    "glu_down_fwd_lowbit",
    "glu_up_fwd_lowbit",
    "kernel_available",
    "kernel_smem_bytes",
    "library_path",
    "load_error",
    "manifest",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "nvfp4_quantize_rows_grouped",
    "sign_dequantize",
    "sign_pack",
    "sm120_built",
    "sm120_nvfp4_grouped",
    "sm120_sign_grouped",
    "stream_capture_id",
    "swizzled_scale_numel",
    "ternary_dequantize",
    "ternary_pack",
]
