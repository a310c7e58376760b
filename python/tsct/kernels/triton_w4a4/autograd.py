"""Differentiable entry of the W4A4 path: NVFP4 x NVFP4 forward, straight-through backward.

``grouped_glu(x, offs, w_gate, w_up, w_down, s_gate, s_up, *, row_weight, gather_idx, scatter_idx,
num_out_rows, masters=None)``: a ``torch.autograd.Function`` with the signature and semantics of
``tsct.kernels.triton_lowbit.grouped_glu`` (same ``masters`` contract), except that every factor must be an
``NVFP4Tensor`` (``tl.dot_scaled`` multiplies NVFP4 codes on both sides).

Forward: ``w4a4.grouped_glu_forward_saved`` (W4A4 down -> z quantized per row -> W4A4 up -> combine); it
keeps hg, hu (fp32) and z*rw ([M, r] each, 20 MB at b1) for the backward, so nothing is recomputed.
Backward: ``w4a4.grouped_glu_backward``: the low-bit path's kernels at the W4A4 forward's point, with both
activation quantizers passed straight through (dX = dh W_hat^T through the decoded factors; dW_hat = X^T dh
with the bf16 x; the master of a packed factor gets dW_hat: STE, design.md section 3, decision 0008).

Containers ride on ``ctx`` (their storage is never modified); tensors are ordinary autograd inputs. Not a
``torch.library`` custom op: ``torch.compile`` graph-breaks around a direct call; ``tsct.ops.grouped_glu(...,
impl="triton-w4a4")`` reaches the same forward and backward through ``tsct::grouped_glu_q``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from tsct.kernels.triton_w4a4 import w4a4

__all__ = ["grouped_glu"]


class _W4A4GLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offs, s_gate, s_up, row_weight, gather_idx, scatter_idx, mg, mu, md, packed, num_out_rows):
        want = any(ctx.needs_input_grad)  # keep hg, hu, z*rw only when a backward can follow
        out, saved = w4a4.grouped_glu_forward_saved(x, offs, *packed, s_gate, s_up, row_weight, gather_idx,
                                                    scatter_idx, num_out_rows, save=want)
        ctx.packed = packed
        ctx.num_out_rows = num_out_rows
        ctx.save_for_backward(x, offs, s_gate, s_up, row_weight, gather_idx, scatter_idx, *saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, offs, s_gate, s_up, row_weight, gather_idx, scatter_idx, *saved = ctx.saved_tensors
        n = ctx.needs_input_grad
        needs = [n[0], n[7], n[8], n[9], n[2], n[3], n[4]]
        g = w4a4.grouped_glu_backward(grad_out.contiguous(), x, offs, *ctx.packed, s_gate, s_up, row_weight,
                                      gather_idx, scatter_idx, ctx.num_out_rows, needs, saved or None)
        return (g[0], None, g[4], g[5], g[6], None, None, g[1], g[2], g[3], None, None)


def grouped_glu(
    x: Tensor,
    offs: Tensor,
    w_gate,
    w_up,
    w_down,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    *,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
    masters: Optional[Sequence[Optional[Tensor]]] = None,
) -> Tensor:
    """The W4A4 grouped GLU with autograd (inputs as ``tsct.ops.grouped_glu``; the W4A4-specific checks here).

    Args: x [T, d] (with gather_idx) or [M, d], bf16 / fp16 / fp32 (the backward's AOT cubins: bf16);
        offs [E] int32 cumulative END offsets; w_gate, w_up: NVFP4Tensor [E, d, r]; w_down: NVFP4Tensor [E, r, f];
        s_gate, s_up [E, r] or None; row_weight [M] or None; gather_idx [M], scatter_idx [M] + num_out_rows;
        masters: optional (w_gate, w_up, w_down) master tensors of the factors' logical shapes (None entries
        allowed); each receives the STE gradient of its packed factor (the gradient w.r.t. the decoded factor).
    Returns: [num_out_rows, f] with scatter_idx, else [M, f]; x.dtype.
    Raises: TypeError if a factor is not an NVFP4Tensor (naming it); ValueError for shapes or masters.
    """
    facs = (w_gate, w_up, w_down)
    w4a4._validate(x, w_gate, w_up, w_down, gather_idx)
    ms = tuple(masters) if masters is not None else (None, None, None)
    if len(ms) != 3:
        raise ValueError("masters must be (w_gate, w_up, w_down), None entries allowed")
    for name, mt, w in zip(("w_gate", "w_up", "w_down"), ms, facs):
        if mt is not None and tuple(mt.shape) != tuple(w.shape):
            raise ValueError(f"masters: {name} master has shape {list(mt.shape)}, its factor {list(w.shape)}")
    return _W4A4GLU.apply(x, offs, s_gate, s_up, row_weight, gather_idx, scatter_idx, *ms, facs, num_out_rows)
