"""Triton grouped dual-latent GLU: the "triton-bf16" path (design.md sections 2 and 4).

Public functions (the same signatures and semantics as ``tsct.reference``):

    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad, saved=None) -> list of 7
    grouped_glu_forward_saved(same as the forward) -> (Tensor, [hg, hu, z*rw (, combine CSR)])  (custom op: no recompute)
    status(capability, fmt, x_dtype="bf16") -> (ok, reason)

Kernels live in ``_kernels.py`` (Triton sources), the host side in ``glu.py`` (allocation, launches), the table of
launched specializations in ``specs.py``; the schedule, the combines, the weight-free backward kernels, the per-arch
tiles and the wheel-build AOT compiler are the shared Triton runtime's (``tsct.kernels.triton_common``, which the
low-bit family uses too). At run time the kernels come from the ahead-of-time cubins shipped for sm_90a / sm_120
(``tsct.kernels.aot``, no Triton needed; sm_100a when built), else from Triton JIT when it is importable
(``TSCT_TRITON_BACKEND=aot|jit|auto`` forces one).
Importing this package imports neither Triton nor torch's CUDA; nothing touches a GPU.
"""

from __future__ import annotations

from typing import Optional

#: sync-free, and its launches depend on the call's signature only: its eager calls may be replayed
#: (tsct.kernels.replay)
REPLAYABLE = True

__all__ = ["grouped_glu_forward", "grouped_glu_forward_saved", "grouped_glu_backward", "saved_like", "status"]

_FORMATS = ("bf16", "fp16")


def status(capability: Optional[tuple[int, int]], fmt: str, x_dtype: str = "bf16") -> tuple[bool, str]:
    """Whether this path can run for a compute capability, a storage format and the activations' dtype
    (``x_dtype``: "bf16", "fp16" or "fp32"; dense factors come in x's dtype), and why (not). The cubins serve bf16
    only (``specs.AOT_DTYPES``): fp16 runs through Triton JIT, and without it this path cannot run (``auto`` then
    takes bmm)."""
    if fmt not in _FORMATS:
        return False, f"storage format {fmt!r} is not dense bf16/fp16"
    if capability is None:
        return False, "needs a CUDA GPU"
    if tuple(capability) < (8, 0):
        return False, f"needs compute capability 8.0 or newer, got {capability[0]}.{capability[1]}"
    from tsct import config
    from tsct.kernels import aot, launch
    from tsct.kernels.triton_glu import specs

    arch = aot.artifact_arch(capability)
    shipped = arch is not None and aot.available(capability)
    uncovered = next((f"{dt} activations" for dt in (fmt, x_dtype) if dt not in specs.AOT_DTYPES), None)
    if config.triton_backend() != "jit" and shipped and uncovered is None:
        return True, f"AOT cubins for {arch}{_native_dz_note(capability)}"
    return launch.without_cubins(capability, arch if shipped else None, uncovered)


def _native_dz_note(capability: tuple[int, int]) -> str:
    """Where the backward's dz runs in CUDA C++ (decision 0013), say so: the probe names what will run."""
    from tsct.kernels.triton_common import runtime as C

    if not C.cuda_kernel("glu_bwd_dz", tuple(capability), "bf16"):
        return ""
    from tsct import native

    if not native.available():
        return "; backward dz: Triton (the native library for the CUDA dz is not loadable)"
    return "; backward dz: CUDA (bf16, r = 64, K-major w_down)"


def grouped_glu_forward(*args, **kwargs):
    from tsct.kernels.triton_glu import glu
    return glu.grouped_glu_forward(*args, **kwargs)


def grouped_glu_forward_saved(*args, **kwargs):
    """The forward plus [hg, hu, z*rw] (and with scatter_idx the combine's CSR) for
    ``grouped_glu_backward(..., saved=)`` (skips its recompute; reuses the CSR for dX where it is the same)."""
    from tsct.kernels.triton_glu import glu
    return glu.grouped_glu_forward_saved(*args, **kwargs)


def saved_like(x, w_gate, gather_idx, scatter_idx=None, num_out_rows=None):
    from tsct.kernels.triton_glu import glu
    return glu.saved_like(x, w_gate, gather_idx, scatter_idx, num_out_rows)


def grouped_glu_backward(*args, **kwargs):
    from tsct.kernels.triton_glu import glu
    return glu.grouped_glu_backward(*args, **kwargs)
