"""Triton grouped dual-latent GLU with low-bit factors: the "triton-lowbit" path (W4A16 / sign-A16 / W8A16 /
ternary-A16).

Each factor (``w_gate``, ``w_up`` ``[E, d, r]``; ``w_down`` ``[E, r, f]``) may be an ``NVFP4Tensor``, a
``SignTensor``, an ``FP8Tensor``, a ``TernaryTensor`` or a dense tensor, in any mix; packed factors are read as
packed bytes and decoded in registers (``_kernels.py``), activations stay in x.dtype (bf16). Same schedule, tiles,
determinism, sync-freedom and padding/empty-expert rules as the bf16 path (``tsct.kernels.triton_glu``): both run on
the shared Triton runtime ``tsct.kernels.triton_common`` (tile configs, tile map, combines, padding zeroing, the
backward's plan, chunked dW and GLU epilogue kernels).

Public functions:

    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
    status(capability, fmt, x_dtype="bf16") -> (ok, reason)

The differentiable entry (STE to master factors included) is ``tsct.ops.grouped_glu(..., impl="triton-lowbit",
masters=...)``: one ``torch.autograd.Function`` over the ``tsct::grouped_glu`` custom op (``tsct/ops/_function.py``).

Dispatch: ``impl="auto"`` takes this path for NVFP4 / sign / mixed factors on sm_80, sm_90, sm_100 and
sm_120 (before the reference path; on sm_120 after "sm120-fp4" when that is built). Executed on an
H200 (sm_90); elsewhere the first use in a process runs ``tsct.selftest`` against float64. FP8 and ternary
factors (and mixes with them) only when forced (``impl="triton-lowbit"``; ``dispatch.FORCED_ONLY``): auto sends
them to bmm until these kernels have run on a GPU.

Build state: AOT cubins (family "lowbit", ``specs.py``) for sm_90a and sm_120 (sm_100a when built), bf16
activations, uniform NVFP4 / sign factors and the NVFP4-sign-NVFP4 mix; anything else (fp16 activations, fp8 and
ternary factors, other mixes, other arches) runs through Triton JIT when it is importable.
Importing this package imports neither Triton nor torch's CUDA.
"""

from __future__ import annotations

from typing import Optional

#: sync-free, and its launches depend on the call's signature only: its eager calls may be replayed
#: (tsct.kernels.replay)
REPLAYABLE = True

__all__ = ["grouped_glu_forward", "grouped_glu_forward_saved", "saved_like", "grouped_glu_backward", "status",
           "FORMATS"]

#: storage formats this path serves ("mixed": packed and dense factors together; "mixed-decoded": a mix with an fp8
#: or ternary factor, ``dispatch.MIXED_DECODED``)
FORMATS = ("nvfp4", "sign", "mixed", "bf16", "fp16", "fp8", "ternary", "mixed-decoded")


def status(capability: Optional[tuple[int, int]], fmt: str, x_dtype: str = "bf16") -> tuple[bool, str]:
    """Whether this path can run for a compute capability, a storage format and the activations' dtype
    (``x_dtype``: "bf16", "fp16" or "fp32"), and why (not). The cubins serve uniform NVFP4 and sign factors with
    bf16 activations (``AOT_FORMATS``, ``specs.AOT_DTYPES``); anything else runs through Triton JIT, and without it
    this path cannot run (``auto`` then takes bmm; the forced-only fp8 / ternary factors: ``impl=`` raises)."""
    if fmt not in FORMATS:
        return False, f"storage format {fmt!r} is not served by the Triton low-bit path"
    if capability is None:
        return False, "needs a CUDA GPU"
    if tuple(capability) < (8, 0):
        return False, f"needs compute capability 8.0 or newer, got {capability[0]}.{capability[1]}"
    from tsct import config
    from tsct.kernels import launch
    from tsct.kernels.triton_lowbit import specs

    arch = aot_arch(capability)
    uncovered = (f"{fmt} factors" if fmt not in AOT_FORMATS else
                 f"{x_dtype} activations" if x_dtype not in specs.AOT_DTYPES else None)
    if config.triton_backend() != "jit" and arch is not None and uncovered is None:
        return True, f"AOT cubins for {arch}"
    return launch.without_cubins(capability, arch, uncovered)


#: storage formats the AOT cubins serve (the uniform format triples of ``specs.AOT_FORMATS``; the NVFP4-sign-NVFP4 mix
#: has cubins too, but "mixed" stands for any mix, so its status is JIT's)
AOT_FORMATS = ("nvfp4", "sign")


def aot_arch(capability: Optional[tuple[int, int]]) -> Optional[str]:
    """The artifact arch whose index holds the "lowbit" family for this capability, else None (reads the
    index files only; no GPU touched)."""
    from tsct.kernels import aot

    arch = aot.artifact_arch(capability)
    idx = aot.index(arch) if arch else None
    if not idx or "lowbit" not in (idx.get("families") or {}):
        return None
    return arch


def grouped_glu_forward(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.grouped_glu_forward(*args, **kwargs)


def grouped_glu_forward_saved(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.grouped_glu_forward_saved(*args, **kwargs)


def saved_like(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.saved_like(*args, **kwargs)


def grouped_glu_backward(*args, **kwargs):
    from tsct.kernels.triton_lowbit import glu
    return glu.grouped_glu_backward(*args, **kwargs)
