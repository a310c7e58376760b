"""tsct.quant: low-bit factor formats (NVFP4, 1-bit sign) in pure torch, plus STE fake-quant.

Where things are (torchao mx_formats split):
    formats.py   what the formats ARE: E2M1 table and rounding, UE4M3, constants, nibble/bit packing
    layout.py    NVFP4 block-scale layouts: "linear" (storage) and "swizzled_128x4" (tensor cores)
    nvfp4.py     NVFP4Tensor + quantize_nvfp4 (TransformerEngine NVFP4 reference recipe)
    sign.py      SignTensor + quantize_sign (LittleBit-style sign bits with a rank-1 scale fit)
    api.py       quantize / dequantize / to_layout / is_quantized / storage_format / fake_quantize
    _backend.py  torch vs native (CUDA, ``tsct.native``) backend choice; native is imported lazily

The exact arithmetic is docs/decisions/0002-nvfp4-recipe.md; a reader's page is docs/formats.md.
Importing this package loads no native library and queries no device.
"""

from tsct.quant import formats, layout
from tsct.quant._backend import BACKENDS, native_fallback_counts, reset_native_fallback_counts
from tsct.quant.api import (
    FORMATS,
    QuantizedTensor,
    dequantize,
    fake_quantize,
    is_quantized,
    quantize,
    storage_format,
)
from tsct.quant.layout import LAYOUTS, to_layout
from tsct.quant.nvfp4 import NVFP4Tensor, quantize_nvfp4
from tsct.quant.sign import DEFAULT_SIGN_ITERS, SignTensor, quantize_sign

__all__ = [
    "BACKENDS",
    "DEFAULT_SIGN_ITERS",
    "FORMATS",
    "LAYOUTS",
    "NVFP4Tensor",
    "QuantizedTensor",
    "SignTensor",
    "dequantize",
    "fake_quantize",
    "formats",
    "is_quantized",
    "layout",
    "native_fallback_counts",
    "quantize",
    "quantize_nvfp4",
    "quantize_sign",
    "reset_native_fallback_counts",
    "storage_format",
    "to_layout",
]
