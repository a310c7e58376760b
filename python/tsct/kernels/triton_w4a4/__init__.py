"""W4A4 grouped GLU kernels on Triton's ``tl.dot_scaled``: NVFP4 activations x NVFP4
factors, UE4M3 block scales per 16 elements, fp32 accumulation; both projections in W4A4.

    grouped_glu(x, offs, w_gate, w_up, w_down, s_gate, s_up, *, row_weight, gather_idx, scatter_idx,
                num_out_rows, masters)    differentiable entry (autograd.py; STE backward on triton_lowbit's
                                          kernels), signature and semantics of triton_lowbit.grouped_glu
    grouped_glu_forward / grouped_glu_forward_saved / grouped_glu_backward    (w4a4.py) the host passes
    saved_like(x, w_gate, gather_idx, ...)        the custom op's fake of what the saving forward keeps
    w4a4.quantize_rows(x)                         NVFP4 rows, per-row second-level scale (Triton kernel)
    w4a4.down_forward(x, offs, w_gate, w_up, ...) grouped W4A4 down-projection + SiLU-GLU -> z [M, r]
    w4a4.up_forward(z_q, offs, w_down, rw)        grouped NVFP4 x NVFP4 up-projection [M, f]
    w4a4.runnable(capability)                     whether (and how: "emulated (sm_90)" / native) it can run
    emulation.*                                   the same math in torch (CPU oracle), the interpreter patch
    specs.enumerate_specs(arch)                   the one variant table (JIT and AOT)
    aot_build.py                                  cubins for sm_90a (emulation) and sm_120 (built as sm_120f: OMMA)

``tsct.ops.grouped_glu(impl="triton-w4a4")`` runs it (``tsct.dispatch``; never chosen by ``auto``). Importing this
package imports neither Triton nor torch.
"""

__all__ = ["grouped_glu", "grouped_glu_forward", "grouped_glu_forward_saved", "saved_like", "grouped_glu_backward", "runnable",
           "status", "FORMATS"]

#: storage formats this path serves: all three factors NVFP4 (tl.dot_scaled multiplies codes on both sides)
FORMATS = ("nvfp4",)


def status(capability, fmt: str) -> tuple:
    """(ok, reason) in ``tsct.dispatch``'s form: NVFP4 factors only, and only from this install's W4A4 cubins
    (``w4a4.runnable``: sm_90a emulated, sm_120 native and never executed on an sm_120 card; no JIT)."""
    if fmt not in FORMATS:
        return False, f"storage format {fmt!r} is not served by the W4A4 path (all three factors must be NVFP4)"
    from tsct.kernels.triton_w4a4 import w4a4
    ok, why = w4a4.runnable(None if capability is None else tuple(capability))
    return ok, why.replace("not runnable: ", "")


def grouped_glu(*args, **kwargs):
    from tsct.kernels.triton_w4a4 import autograd
    return autograd.grouped_glu(*args, **kwargs)


def grouped_glu_forward(*args, **kwargs):
    from tsct.kernels.triton_w4a4 import w4a4
    return w4a4.grouped_glu_forward(*args, **kwargs)


def grouped_glu_forward_saved(*args, **kwargs):
    from tsct.kernels.triton_w4a4 import w4a4
    return w4a4.grouped_glu_forward_saved(*args, **kwargs)


def saved_like(x, w_gate, gather_idx, scatter_idx=None, num_out_rows=None):
    """Empty tensors shaped like what ``grouped_glu_forward_saved`` saves (the custom op's fake): hg, hu fp32
    [M, r] and z * row_weight [M, r] in x.dtype (no combine CSR: this path's backward builds its own)."""
    from tsct.kernels.triton_glu import glu as G
    return G.saved_like_r(x, w_gate.shape[-1], gather_idx, None, None)


def grouped_glu_backward(*args, **kwargs):
    from tsct.kernels.triton_w4a4 import w4a4
    return w4a4.grouped_glu_backward(*args, **kwargs)


def runnable(capability):
    from tsct.kernels.triton_w4a4 import w4a4
    return w4a4.runnable(capability)
