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
Kernels (CUDA tensors; see each docstring for shapes, dtypes and errors):
    nvfp4_quantize(x, s_enc, layout) -> (codes, block_scale)
    nvfp4_dequantize(codes, block_scale, layout, s_enc, k, out_dtype=torch.bfloat16) -> Tensor
    sign_pack(w) -> bits
    sign_dequantize(bits, a, b, out_dtype=torch.bfloat16) -> Tensor
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
    kernel_available,
    nvfp4_dequantize,
    nvfp4_quantize,
    sign_dequantize,
    sign_pack,
    swizzled_scale_numel,
)

__all__ = [
    "NativeUnavailableError",
    "available",
    "build_info",
    "kernel_available",
    "library_path",
    "load_error",
    "manifest",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "sign_dequantize",
    "sign_pack",
    "swizzled_scale_numel",
]
