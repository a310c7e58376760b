"""The "sm120-fp4" path: NVFP4 block-scaled tensor-core grouped GLU on sm_120 (issue 5).

    status(capability, fmt) -> (ok, reason)       can it run here, and why (not); no device query
    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
    quantize_rows_grouped(...)                    the activation quantizer (quant_rows.py)
    VERIFICATION                                  per sm_120 kernel: how it is verified (design.md section 6)

Signatures are those of ``tsct.ops._library_q`` (the custom op for quantized factors): factors are
``tsct.quant`` containers of logical shape ``[E, d, r]`` / ``[E, r, f]``; this path serves NVFP4
factors (any block-scale layout; converted to what the kernels read) or sign factors (all three of one
format; d and r multiples of 64). Forward: the grouped activation
quantizer (CUDA, every arch) + the CuTeDSL sm_120a GEMMs linked into libtsct_kernels.so
(``glu.py``). Backward: the triton-lowbit backward (decoded factors, STE; needs Triton JIT).

NOT executed on any GPU: no sm_120 card exists here (docs/sm120.md). So the path is off unless
``TSCT_SM120_FP4=1`` is set, and even then dispatch runs its first-use self-test against float64
before the first use in a process and disables it (counted, warned) if it disagrees. sm_120a cubins
run on compute capability 12.0 only (12.1 needs an sm_121a export, not built).
Importing this package loads no library and imports no Triton.
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["status", "grouped_glu_forward", "grouped_glu_backward", "quantize_rows_grouped", "FORMATS",
           "KERNELS", "ENV_ENABLE", "VERIFICATION", "kernels_linked"]

FORMATS = ("nvfp4", "sign")
#: CuTeDSL exports the forward needs (cutedsl/build.py names)
KERNELS = ("tsct_nvfp4_grouped_glu_sm120", "tsct_nvfp4_grouped_rowweight_sm120", "tsct_sign_grouped_glu_sm120",
           "tsct_sign_grouped_rowweight_sm120")
ENV_ENABLE = "TSCT_SM120_FP4"

#: design.md section 6: per kernel, how each claim was shown (details: docs/sm120.md). "ran_on_sm120" is "no"
#: for every one: no sm_120 GPU was available.
VERIFICATION: tuple[dict, ...] = tuple(
    {"kernel": name, "role": role, "compiled": "sm_120a cubin, OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X in SASS",
     "host_prep": prep, "emulated": "CPU (tsct.emulation)", "proxy_on_sm90": "no", "ran_on_sm120": "no",
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


def kernels_linked() -> tuple[bool, str]:
    """Whether the installed library's manifest lists the CuTeDSL kernels this path needs (a file read:
    the library is not loaded, no device is queried)."""
    from tsct import native

    man = native.manifest()
    if man is None:
        return False, "no native library (manifest.json) in this install"
    cd = man.get("cutedsl")
    if not cd or not cd.get("linked"):
        return False, ("the native library was built without the CuTeDSL sm_120 kernels (TSCT_CUTEDSL=OFF, or AUTO "
                       "without nvidia-cutlass-dsl in the build environment; docs/decisions/0009)")
    have = {k["name"] for k in cd.get("kernels", [])}
    missing = [k for k in KERNELS if k not in have]
    if missing:
        return False, f"the native library lacks the CuTeDSL kernels {missing}"
    return True, f"CuTeDSL {cd['dsl'].get('version')} {cd.get('arch')} kernels linked"


def status(capability: Optional[tuple[int, int]], fmt: str) -> tuple[bool, str]:
    """Whether this path can run for a compute capability and a storage format, and why (not)."""
    if fmt not in FORMATS:
        return False, f"storage format {fmt!r} is not served by sm120-fp4 (NVFP4 or sign factors, all three alike)"
    if capability is None:
        return False, "needs a CUDA GPU of compute capability 12.0"
    cap = tuple(capability)
    if cap == (12, 1):
        return False, ("compute capability 12.1: the CuTeDSL kernels are built for sm_120a, which loads on 12.0 only "
                       "(an sm_121a export is not built)")
    if cap != (12, 0):
        return False, (f"compute capability {cap[0]}.{cap[1]}: the NVFP4 block-scaled mma.sync kernels are sm_120a "
                       "(12.0) only")
    ok, why = kernels_linked()
    if not ok:
        return False, why
    if os.environ.get(ENV_ENABLE, "").strip() != "1":
        return False, (f"never executed on any GPU (no sm_120 card was available; docs/sm120.md): set {ENV_ENABLE}=1 "
                       "to enable it behind the first-use self-test")
    return True, f"{why}; forward W4A4 on sm_120a, backward via triton-lowbit (Triton JIT)"


def grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None, gather_idx=None,
                        scatter_idx=None, num_out_rows=None):
    """W4A4 forward (``glu.forward``): ``[num_out_rows, f]`` with scatter_idx, else ``[M, f]``, x.dtype."""
    from tsct.kernels.sm120_fp4 import glu
    return glu.forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                       num_out_rows)


def grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                         scatter_idx, num_out_rows, needs_grad):
    """Gradients of (x, w_gate, w_up, w_down, s_gate, s_up, row_weight) by the triton-lowbit backward:
    through the DECODED factors with bf16 activations (straight-through for the fp4 quantization of
    x and z in the forward; STE for the factors, docs/decisions/0008). Needs Triton (JIT)."""
    from tsct import dispatch
    from tsct.kernels import triton_lowbit

    cap = dispatch.device_capability(x.device)
    st = dispatch.status(dispatch.TRITON_LOWBIT, cap, "nvfp4")
    if st.ok and cap is not None:  # triton-lowbit never ran on sm_120 either: its own first-use self-test
        st = dispatch._first_use_check(dispatch.TRITON_LOWBIT, cap, "nvfp4")
    if not st.ok:
        raise RuntimeError(f"sm120-fp4 backward: it runs the triton-lowbit backward, which cannot run here: {st.reason}")
    return triton_lowbit.grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                                              gather_idx, scatter_idx, num_out_rows, needs_grad)


def quantize_rows_grouped(*args, **kwargs):
    """``quant_rows.quantize_rows_grouped`` (lazy import)."""
    from tsct.kernels.sm120_fp4 import quant_rows
    return quant_rows.quantize_rows_grouped(*args, **kwargs)
