"""Triton grouped dual-latent GLU with low-bit factors: the "triton-lowbit" path (issue 4, W4A16 / sign-A16).

Each factor (``w_gate``, ``w_up`` ``[E, d, r]``; ``w_down`` ``[E, r, f]``) may be an ``NVFP4Tensor``, a
``SignTensor`` or a dense tensor, in any mix; packed factors are read as packed bytes and decoded in
registers (``_kernels.py``), activations stay in x.dtype (bf16). Same schedule, tiles, determinism,
sync-freedom and padding/empty-expert rules as ``tsct.kernels.triton_glu``, whose weight-free kernels
(combines, padding zeroing, the GLU backward epilogue) are reused unchanged.

Public functions:

    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
    grouped_glu(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, *, row_weight=None,
                gather_idx=None, scatter_idx=None, num_out_rows=None, masters=None) -> Tensor
        differentiable wrapper (torch.autograd.Function): gradients for x, dense factors, scales,
        row_weight, and (STE) for the ``masters`` of packed factors; see ``glu.py``'s docstring.
    status(capability, fmt) -> (ok, reason)

Build state: Triton JIT only (no AOT cubins for these four kernels yet: the variant table would be
``triton_glu.specs`` extended by FMT_G/FMT_U/FMT_D in {dense, nvfp4, sign} and the factor pointer
types; at b1 only the aligned, scatter+gather, scales+rw variants of 3 uniform formats are hot).
Importing this package imports neither Triton nor torch's CUDA.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

__all__ = ["grouped_glu_forward", "grouped_glu_backward", "grouped_glu", "status", "FORMATS"]

#: storage formats this path serves ("mixed": packed and dense factors together)
FORMATS = ("nvfp4", "sign", "mixed", "bf16", "fp16")


def status(capability: Optional[tuple[int, int]], fmt: str) -> tuple[bool, str]:
    """Whether this path can run for a compute capability and a storage format, and why (not)."""
    if fmt not in FORMATS:
        return False, f"storage format {fmt!r} is not served by the Triton low-bit path"
    if capability is None:
        return False, "needs a CUDA GPU"
    if tuple(capability) < (8, 0):
        return False, f"needs compute capability 8.0 or newer, got {capability[0]}.{capability[1]}"
    mode = os.environ.get("TSCT_TRITON_BACKEND", "auto").strip().lower() or "auto"
    if mode == "aot":
        return False, "TSCT_TRITON_BACKEND=aot but the Triton low-bit kernels have no AOT cubins yet (JIT only)"
    if importlib.util.find_spec("triton") is None:
        return False, "the Triton low-bit kernels have no AOT cubins yet and Triton is not importable (JIT)"
    return True, "Triton JIT (no AOT cubins for the low-bit kernels yet)"


def grouped_glu_forward(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.grouped_glu_forward(*args, **kwargs)


def grouped_glu_backward(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.grouped_glu_backward(*args, **kwargs)


def grouped_glu(*args, **kwargs):
    from tsct.kernels.triton_lowbit import autograd
    return autograd.grouped_glu(*args, **kwargs)
