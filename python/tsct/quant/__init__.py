"""tsct.quant: low-bit factor formats (NVFP4, 1-bit sign, FP8, ternary) in pure torch, plus STE fake-quant.

Where things are (torchao mx_formats split):
    formats.py   what the formats ARE: E2M1 table and rounding, UE4M3, E4M3 codes, ternary codes, constants,
                 nibble / bit / 2-bit packing
    layout.py    NVFP4 block-scale layouts: "linear" (storage) and "swizzled_128x4" (tensor cores)
    nvfp4.py     NVFP4Tensor + quantize_nvfp4 (TransformerEngine NVFP4 reference recipe)
    sign.py      SignTensor + quantize_sign (LittleBit-style sign bits with a rank-1 scale fit)
    fp8.py       FP8Tensor + quantize_fp8 (E4M3 codes, one fp32 scale per output column; decision 0021)
    ternary.py   TernaryTensor + quantize_ternary (BitNet b1.58 codes, absmean or rank-1 scales; 0022)
    api.py       quantize / dequantize / to_layout / is_quantized / storage_format / fake_quantize
    _backend.py  torch vs native (CUDA, ``tsct.native``) backend choice; native is imported lazily

The exact arithmetic is docs/decisions/0002-nvfp4-recipe.md, 0021 and 0022; a reader's page is docs/formats.md.
Importing this package loads no native library and queries no device.
"""

import torch

from tsct.quant import formats, layout
from tsct.quant._backend import BACKENDS, native_fallback_counts, reset_native_fallback_counts
from tsct.quant.api import (
    FORMATS,
    QuantizedTensor,
    dequantize,
    fake_quantize,
    is_quantized,
    k_multiple,
    quantize,
    storage_format,
)
from tsct.quant.fp8 import FP8Tensor, quantize_fp8
from tsct.quant.layout import LAYOUTS, to_layout
from tsct.quant.nvfp4 import NVFP4Tensor, quantize_nvfp4
from tsct.quant.sign import DEFAULT_SIGN_ITERS, SignTensor, quantize_sign
from tsct.quant.ternary import TERNARY_SCALINGS, TernaryTensor, quantize_ternary

# torch.load's default (weights_only=True) loads the containers too: they hold tensors, ints and strings only
torch.serialization.add_safe_globals([NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor])

__all__ = [
    "BACKENDS",
    "DEFAULT_SIGN_ITERS",
    "FORMATS",
    "FP8Tensor",
    "LAYOUTS",
    "NVFP4Tensor",
    "QuantizedTensor",
    "SignTensor",
    "TERNARY_SCALINGS",
    "TernaryTensor",
    "dequantize",
    "fake_quantize",
    "formats",
    "is_quantized",
    "k_multiple",
    "layout",
    "native_fallback_counts",
    "quantize",
    "quantize_fp8",
    "quantize_nvfp4",
    "quantize_sign",
    "quantize_ternary",
    "reset_native_fallback_counts",
    "storage_format",
    "to_layout",
]
