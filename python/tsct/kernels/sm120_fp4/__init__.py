"""The "sm120-fp4" path: NVFP4 block-scaled tensor-core grouped GLU on sm_120.

    status(capability, fmt) -> (ok, reason)       can it run here, and why (not); no device query
    kernel_status(capability) -> (ok, reason)     are kernels for this GPU linked (ignores the env / self-test)
    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
    quantize_rows_grouped(...)                    the activation quantizer (quant_rows.py)
    VERIFICATION                                  per sm_120 kernel: how it is verified (design.md section 6)

Signatures are the path interface of ``tsct.ops._function`` (packed factors rebuilt as containers): factors are
``tsct.quant`` containers of logical shape ``[E, d, r]`` / ``[E, r, f]``; this path serves NVFP4
factors (any block-scale layout; converted to what the kernels read) or sign factors (all three of one
format; d and r multiples of 64). Forward: the grouped activation
quantizer (CUDA, every arch) + the CuTeDSL sm_120a GEMMs linked into libtsct_kernels.so
(``glu.py``). Backward: the triton-lowbit backward (decoded factors, STE), else the bmm one.

NOT executed on any GPU: no sm_120 card exists here (docs/sm120.md). A kernel that faults would kill the
caller's CUDA context, so the first use in a process runs the self-test (``tsct.selftest.sm120_fp4_forward``)
in a CHILD process (``tsct.firstuse``; the child is ``tsct.selftest_child``), caches the verdict in the process
and on disk, and dispatch disables the path (counted, warned) on a numerical failure, a crash or a timeout.
``TSCT_SM120_FP4``: unset = that; "0" = off; "1" = on without the self-test (kernel developers only).
Kernels per compute capability: 12.0 -> the sm_120a exports, 12.1 -> the sm_121a exports (``..._sm121``;
an sm_120a cubin does not load on 12.1), picked by the C entry (docs/decisions/0010).
Importing this package loads no library and imports no Triton.
"""

from __future__ import annotations

from typing import Optional

from tsct.kernels import sm120_proxy

__all__ = ["status", "kernel_status", "grouped_glu_forward", "grouped_glu_backward", "quantize_rows_grouped",
           "FORMATS", "KERNELS", "ENV_ENABLE", "VERIFICATION", "ARCH_FOR_CAPABILITY", "kernel_names", "kernels_linked"]

FORMATS = ("nvfp4", "sign")
#: CuTeDSL exports the forward needs (cutedsl/build.py names)
KERNELS = ("tsct_nvfp4_grouped_glu_sm120", "tsct_nvfp4_grouped_rowweight_sm120", "tsct_sign_grouped_glu_sm120",
           "tsct_sign_grouped_rowweight_sm120")
ENV_ENABLE = "TSCT_SM120_FP4"

#: design.md section 6: per kernel, how each claim was shown in the project's CI (details: docs/sm120.md), not
#: what this install holds (the probe says that). "ran_on_sm120" is "no" for every one: no sm_120 GPU was
#: available; "proxy_on_sm90" comes from the one table of sm_90-proxy verdicts (``tsct.kernels.sm120_proxy``).
VERIFICATION: tuple[dict, ...] = tuple(
    {"kernel": name, "role": role,
     "compiled_in_ci": "sm_120a and sm_121a cubins, OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X in SASS",
     "host_prep": prep, "emulated": "CPU (tsct.emulation)", "proxy_on_sm90": sm120_proxy.verdict(name, "cutedsl"),
     "ran_on_sm120": "no",
     "first_use_selftest": "yes" if name in KERNELS else "n/a (not dispatched)"}
    for name, role, prep in (
        ("tsct_nvfp4_grouped_glu_sm120", "fwd gate/up + GLU", "CPU tests"),
        ("tsct_nvfp4_grouped_rowweight_sm120", "fwd down * row_weight", "CPU tests"),
        ("tsct_nvfp4_grouped_alpha_sm120", "grouped GEMM (unused)", "CPU tests"),
        ("tsct_nvfp4_gemm_dense_sm120", "dense GEMM (unused)", "n/a"),
        ("tsct_sign_grouped_glu_sm120", "fwd sign gate/up + GLU", "CPU tests"),
        ("tsct_sign_grouped_rowweight_sm120", "fwd sign down * row_weight", "CPU tests"),
        ("tsct_sign_grouped_alpha_sm120", "sign grouped GEMM (unused)", "CPU tests"),
    ))


#: compute capability -> the CuTeDSL arch whose cubins load on it (an sm_120a cubin does not load on 12.1)
ARCH_FOR_CAPABILITY: dict[tuple[int, int], str] = {(12, 0): "sm_120a", (12, 1): "sm_121a"}


def kernel_names(arch: str = "sm_120a") -> tuple[str, ...]:
    """The exported names of the kernels this path needs for ``arch`` ("sm_120a" or "sm_121a"):
    cutedsl/build.py names the sm_121a exports ``..._sm121`` (ValueError for another arch)."""
    if arch == "sm_120a":
        return KERNELS
    if arch == "sm_121a":
        return tuple(k[: -len("_sm120")] + "_sm121" for k in KERNELS)
    raise ValueError(f"arch must be 'sm_120a' or 'sm_121a', got {arch!r}")


def kernels_linked(arch: str = "sm_120a") -> tuple[bool, str]:
    """Whether the installed library's manifest lists the CuTeDSL kernels this path needs for ``arch``
    (a file read: the library is not loaded, no device is queried)."""
    from tsct import native

    man = native.manifest()
    if man is None:
        return False, "no native library (manifest.json) in this install"
    cd = man.get("cutedsl")
    if not cd or not cd.get("linked"):
        return False, ("the native library was built without the CuTeDSL sm_120 kernels (TSCT_CUTEDSL=OFF, or AUTO "
                       "without nvidia-cutlass-dsl in the build environment; docs/decisions/0009)")
    have = {k["name"] for k in cd.get("kernels", [])}
    missing = [k for k in kernel_names(arch) if k not in have]
    if missing:
        if arch != "sm_120a" and len(missing) == len(KERNELS):
            return False, (f"the native library has no {arch} exports of the CuTeDSL kernels (built before they "
                           "were added, docs/decisions/0010); sm_120a cubins do not load on this GPU")
        return False, f"the native library lacks the CuTeDSL kernels {missing}"
    return True, f"CuTeDSL {cd['dsl'].get('version')} {arch} kernels linked"


def kernel_status(capability: Optional[tuple[int, int]]) -> tuple[bool, str]:
    """Whether this library has sm120-fp4 kernels that load on a GPU of ``capability`` (exact table:
    12.0 -> sm_120a, 12.1 -> sm_121a exports), ignoring ``TSCT_SM120_FP4`` and the self-test."""
    if capability is None:
        return False, "needs a CUDA GPU of compute capability 12.0 or 12.1"
    cap = tuple(capability)
    arch = ARCH_FOR_CAPABILITY.get(cap)
    if arch is None:
        return False, (f"compute capability {cap[0]}.{cap[1]}: the NVFP4 block-scaled mma.sync kernels are built "
                       "for sm_120a (12.0) and sm_121a (12.1) only")
    ok, why = kernels_linked(arch)
    if not ok:
        return False, f"compute capability {cap[0]}.{cap[1]}: {why}"
    return True, why


def env_mode() -> tuple[str, str]:
    """How ``TSCT_SM120_FP4`` (``tsct.config.sm120_fp4``, read on every call) sets this path's first use, as
    (mode, why): "auto" (unset or "auto": the self-test in a child process decides), "off" ("0"), "on" ("1": no
    self-test; for developers of its kernels) or "invalid" (another value: the path stays off and ``why`` names
    the accepted values)."""
    from tsct import config

    raw = config.sm120_fp4()
    v = (raw or "").strip().lower()
    if v == "0":
        return "off", f"disabled by {ENV_ENABLE}=0"
    if v not in ("", "auto", "1"):
        return "invalid", f"{ENV_ENABLE}={raw!r} is not one of 0, 1, auto or unset: the path stays off"
    if v == "1":
        return "on", f"forced on by {ENV_ENABLE}=1 (no self-test; for kernel developers)"
    shown = f"{ENV_ENABLE}={raw.strip()}" if v else f"{ENV_ENABLE} unset"
    return "auto", f"{shown}: first-use self-test in a child process"


def status(capability: Optional[tuple[int, int]], fmt: str) -> tuple[bool, str]:
    """Whether this path can run for a compute capability and a storage format, and why (not).

    Runnable = NVFP4 or sign factors, a 12.0 / 12.1 GPU with its kernels linked, and ``TSCT_SM120_FP4``
    not "0". "Runnable" is before the first-use self-test (``firstuse.verdict``, asked for by tsct.ops),
    which may still disable the path. No device query.
    """
    if fmt not in FORMATS:
        return False, f"storage format {fmt!r} is not served by sm120-fp4 (NVFP4 or sign factors, all three alike)"
    ok, why = kernel_status(capability)
    if not ok:
        return False, why
    mode, mode_why = env_mode()
    if mode in ("off", "invalid"):
        return False, mode_why
    gate = mode_why if mode == "on" else ("never executed on an sm_120/sm_121 card before (docs/sm120.md): a "
                                          "first-use self-test in a child process decides")
    return True, f"{why}; forward W4A4 (NVFP4 activations), backward via triton-lowbit or bmm; {gate}"


def grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None, gather_idx=None,
                        scatter_idx=None, num_out_rows=None):
    """W4A4 forward (``glu.forward``): ``[num_out_rows, f]`` with scatter_idx, else ``[M, f]``, x.dtype."""
    from tsct.kernels.sm120_fp4 import glu
    return glu.forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                       num_out_rows)


def grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                         scatter_idx, num_out_rows, needs_grad):
    """Gradients of (x, w_gate, w_up, w_down, s_gate, s_up, row_weight) through the DECODED factors with
    bf16 activations (straight-through for the fp4 quantization of x and z in the forward; STE for the
    factors, docs/decisions/0008): by the triton-lowbit backward where it can run (after its own
    first-use verdict), else by the bmm path's backward on the decoded factors (the same math)."""
    import torch

    from tsct import bmm, dispatch, quant
    from tsct.kernels import triton_lowbit

    cap = dispatch.device_capability(x.device)
    ok = dispatch.status(dispatch.TRITON_LOWBIT, cap, "nvfp4", dispatch.DTYPE_NAMES[x.dtype]).ok
    if ok and dispatch.needs_first_use(dispatch.TRITON_LOWBIT, cap):
        # triton-lowbit never ran on sm_120 either: its own first-use verdict on x's GPU (asked for by tsct.ops
        # before this backward runs, dispatch.BACKWARD_VIA; not another GPU's, which may be another model); none
        # asked for (a direct call): the bmm backward
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        st = dispatch.first_use_status(dispatch.TRITON_LOWBIT, cap, "nvfp4", index)
        ok = st is not None and st.ok
    if ok:
        return triton_lowbit.grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                                                  gather_idx, scatter_idx, num_out_rows, needs_grad)
    dense = [quant.dequantize(w, dtype=x.dtype) for w in (w_gate, w_up, w_down)]
    return bmm.grouped_glu_backward(grad_out, x, offs, *dense, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                                    num_out_rows, needs_grad)


def quantize_rows_grouped(*args, **kwargs):
    """``quant_rows.quantize_rows_grouped`` (lazy import)."""
    from tsct.kernels.sm120_fp4 import quant_rows
    return quant_rows.quantize_rows_grouped(*args, **kwargs)
