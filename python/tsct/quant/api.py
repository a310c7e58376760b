"""The public face of ``tsct.quant``: quantize, dequantize, inspect, and STE fake-quant for training.

Formats: ``"nvfp4"`` (``nvfp4.py``: NVIDIA NVFP4, TransformerEngine reference recipe, E2M1 per the
OCP MX spec), ``"sign"`` (``sign.py``: LittleBit-style 1-bit with rank-1 scales), ``"fp8"``
(``fp8.py``: E4M3 codes, one scale per output column) and ``"ternary"`` (``ternary.py``: BitNet b1.58
codes {-1, 0, +1}, absmean or rank-1 scales); plain tensors are the reference storage ("bf16", "fp16",
"fp32").

Training keeps fp32/bf16 master factors and quantizes them in the forward pass with
``fake_quantize``, the straight-through estimator (STE; Bengio, Leonard and Courville 2013,
"Estimating or Propagating Gradients Through Stochastic Neurons for Conditional Computation",
arXiv:1308.3432): forward ``dequantize(quantize(w))`` in ``w.dtype``, backward the identity.
The quantize/decode round trip is one ``torch.library`` custom op (``tsct::quant_fake_quantize``), so
``torch.compile(fullgraph=True)`` treats it as opaque: no graph break on the native (ctypes) backend,
and inductor cannot rewrite its divisions (it turns ``x / const`` into ``x * (1/const)`` on GPU and
Triton's default division is approximate), so compiled and eager training see the same bits.
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

from tsct.quant import _backend
from tsct.quant.formats import SIGN_PACK, TERNARY_PACK
from tsct.quant.fp8 import FP8Tensor, quantize_fp8
from tsct.quant.layout import to_layout
from tsct.quant.nvfp4 import NVFP4Tensor, quantize_nvfp4
from tsct.quant.sign import SignTensor, quantize_sign
from tsct.quant.ternary import TernaryTensor, quantize_ternary

__all__ = ["FORMATS", "QuantizedTensor", "quantize", "dequantize", "to_layout", "is_quantized", "storage_format",
           "fake_quantize", "k_multiple"]

#: Packed formats this package quantizes to.
FORMATS = ("nvfp4", "sign", "fp8", "ternary")
QuantizedTensor = Union[NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor]
#: format -> (container class, quantizer, the multiple K must be)
_FORMAT_TABLE = {
    "nvfp4": (NVFP4Tensor, quantize_nvfp4, 16),
    "sign": (SignTensor, quantize_sign, SIGN_PACK),
    "fp8": (FP8Tensor, quantize_fp8, 1),
    "ternary": (TernaryTensor, quantize_ternary, TERNARY_PACK),
}
_CONTAINERS = tuple(c for c, _, _ in _FORMAT_TABLE.values())

_TENSOR_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def check_format(fmt, caller: str) -> str:
    """``fmt`` if it names a format, else ValueError naming ``caller`` (the public function) and the choices."""
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"{caller}: fmt must be one of {list(FORMATS)}, got {fmt!r}")
    return fmt


def k_multiple(fmt: str) -> int:
    """The multiple the contraction dim K of a factor must be to store it as ``fmt``: 16 (nvfp4), 8 (sign),
    1 (fp8), 4 (ternary). ValueError for an unknown format."""
    return _FORMAT_TABLE[check_format(fmt, "tsct.quant.k_multiple")][2]


def quantize(w: Tensor, fmt: str, *, backend: str = "auto", **options) -> QuantizedTensor:
    """``quantize_<fmt>(w, backend=backend, **options)``: ``quantize_nvfp4`` for fmt "nvfp4", ``quantize_sign``
    for "sign", ``quantize_fp8`` for "fp8", ``quantize_ternary`` for "ternary"."""
    check_format(fmt, "tsct.quant.quantize")
    return _FORMAT_TABLE[fmt][1](w, backend=backend, **options)


def dequantize(container, dtype: torch.dtype = torch.bfloat16, backend: str = "auto", *,
               contiguous: bool = True) -> Tensor:
    """Decode a container to a tensor of its logical shape in ``dtype``: contiguous, or with
    ``contiguous=False`` the transposed view of the K-contiguous decode (no transposing copy; for GEMMs
    that take either operand order, e.g. ``torch.bmm``).

    A plain tensor (reference storage) is returned as ``t.to(dtype)``, so callers can decode every
    factor the same way.
    """
    if isinstance(container, _CONTAINERS):
        return container.dequantize(dtype, backend, contiguous=contiguous)
    if isinstance(container, Tensor):
        _backend.check_float_dtype("tsct.quant.dequantize", "dtype", dtype)
        _backend.check_backend("tsct.quant.dequantize", backend)
        return container.to(dtype)
    raise TypeError(f"container must be an NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor or torch.Tensor, "
                    f"got {type(container).__name__}")


def is_quantized(obj) -> bool:
    """True for a packed container (NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor)."""
    return isinstance(obj, _CONTAINERS)


def storage_format(obj) -> str:
    """"nvfp4", "sign", "fp8", "ternary", or for a plain float tensor "bf16" / "fp16" / "fp32"."""
    for fmt, (cls, _, _) in _FORMAT_TABLE.items():
        if isinstance(obj, cls):
            return fmt
    if isinstance(obj, Tensor):
        if obj.dtype in _TENSOR_FORMATS:
            return _TENSOR_FORMATS[obj.dtype]
        raise TypeError(f"obj: a tensor factor must be bfloat16, float16 or float32, got {obj.dtype}")
    raise TypeError(f"obj must be an NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor or torch.Tensor, "
                    f"got {type(obj).__name__}")


# --- STE fake-quant ------------------------------------------------------------------------------

@torch.library.custom_op("tsct::quant_fake_quantize", mutates_args=())
def _fake_quantize_op(w: Tensor, fmt: str, backend: str) -> Tensor:
    """dequantize(quantize(w, fmt), w.dtype): a new contiguous tensor of w's shape."""
    return quantize(w, fmt, backend=backend).dequantize(w.dtype, backend)


@_fake_quantize_op.register_fake
def _(w: Tensor, fmt: str, backend: str) -> Tensor:
    return w.new_empty(w.shape)  # contiguous, like the real output


class _StraightThrough(torch.autograd.Function):
    """Forward: quantize-dequantize. Backward: the incoming gradient unchanged (STE)."""

    @staticmethod
    def forward(ctx, w: Tensor, fmt: str, backend: str) -> Tensor:
        return _fake_quantize_op(w, fmt, backend)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None


def fake_quantize(w: Tensor, fmt: str, *, backend: str = "auto") -> Tensor:
    """Straight-through fake quantization of a master factor ``w`` (``[E, K, N]`` or ``[K, N]``).

    Returns ``dequantize(quantize(w, fmt), w.dtype)`` (contiguous, ``w``'s shape and dtype); its
    gradient with respect to ``w`` is the identity (STE, Bengio et al. 2013). Works under
    ``torch.compile(fullgraph=True)``. ``fmt``: "nvfp4" (K % 16 == 0), "sign" (K % 8 == 0, default
    power-iteration count), "fp8" (any K) or "ternary" (K % 4 == 0, the default absmean scaling).
    ``backend`` as in ``quantize_nvfp4``.
    """
    check_format(fmt, "tsct.quant.fake_quantize")
    _backend.check_factor("tsct.quant.fake_quantize", "w", w, k_multiple(fmt), fmt)
    _backend.check_backend("tsct.quant.fake_quantize", backend)
    return _StraightThrough.apply(w, fmt, backend)

