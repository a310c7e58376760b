"""Triton grouped dual-latent GLU: the "triton-bf16" path (design.md sections 2 and 4, issue 3).

Public functions (the same signatures and semantics as ``tsct.reference``):

    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
    status(capability, fmt) -> (ok, reason)

Kernels live in ``_kernels.py`` (Triton sources), the host side in ``glu.py`` (allocation, the
device-side schedule, launches). Importing this package does not import Triton; the first call does.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

__all__ = ["grouped_glu_forward", "grouped_glu_backward", "status"]

_FORMATS = ("bf16", "fp16")


def status(capability: Optional[tuple[int, int]], fmt: str) -> tuple[bool, str]:
    """Whether this path can run for a compute capability and a storage format, and why (not)."""
    if fmt not in _FORMATS:
        return False, f"storage format {fmt!r} is not dense bf16/fp16"
    if capability is None:
        return False, "needs a CUDA GPU"
    if tuple(capability) < (8, 0):
        return False, f"needs compute capability 8.0 or newer, got {capability[0]}.{capability[1]}"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not importable (JIT path; no ahead-of-time artifacts in this build)"
    return True, "Triton JIT"


def grouped_glu_forward(*args, **kwargs):
    from tsct.kernels.triton_glu import glu
    return glu.grouped_glu_forward(*args, **kwargs)


def grouped_glu_backward(*args, **kwargs):
    from tsct.kernels.triton_glu import glu
    return glu.grouped_glu_backward(*args, **kwargs)
