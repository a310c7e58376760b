"""torch.library registration of the grouped GLU, so torch.compile(fullgraph=True) sees one op.

Two custom ops: ``tsct::grouped_glu`` (forward) and ``tsct::grouped_glu_backward`` (all seven
gradients). The autograd formula registered for the forward just calls the backward op, so a
compiled graph holds two opaque nodes and never traces into a path's Python (the reference path
loops over experts on the host; a kernel path launches compiled code). Both have fake
implementations that give shapes and dtypes only. ``impl`` is resolved before the op is called and
travels as a string argument, so the graph records which path it used.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tsct import dispatch

_N_GRADS = 7  # x, w_gate, w_up, w_down, s_gate, s_up, row_weight


@torch.library.custom_op("tsct::grouped_glu", mutates_args=())
def grouped_glu_op(
    x: Tensor,
    offs: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    impl: str,
) -> Tensor:
    mod = dispatch.implementation(impl)
    return mod.grouped_glu_forward(
        x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows
    )


def _out_shape(x, w_down, gather_idx, num_out_rows):
    f = w_down.shape[2]
    if num_out_rows is not None:
        return (num_out_rows, f)
    return (gather_idx.shape[0] if gather_idx is not None else x.shape[0], f)


@grouped_glu_op.register_fake
def _(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl):
    return x.new_empty(_out_shape(x, w_down, gather_idx, num_out_rows))


@torch.library.custom_op("tsct::grouped_glu_backward", mutates_args=())
def grouped_glu_backward_op(
    grad_out: Tensor,
    x: Tensor,
    offs: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    impl: str,
    needs_grad: list[bool],
) -> list[Tensor]:
    mod = dispatch.implementation(impl)
    grads = mod.grouped_glu_backward(
        grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
        num_out_rows, needs_grad,
    )
    # custom ops cannot return None: an absent gradient travels as an empty tensor
    return [g if g is not None else x.new_empty(0) for g in grads]


@grouped_glu_backward_op.register_fake
def _(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
      num_out_rows, impl, needs_grad):
    inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
    return [t.new_empty(t.shape) if (t is not None and need) else x.new_empty(0)
            for t, need in zip(inputs, needs_grad)]


def _setup_context(ctx, inputs, output):
    (x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl) = inputs
    ctx.save_for_backward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx)
    ctx.num_out_rows = num_out_rows
    ctx.impl = impl


def _backward(ctx, grad_out):
    x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx = ctx.saved_tensors
    # ctx.needs_input_grad follows the forward's 12 inputs; keep the 7 differentiable ones
    n = ctx.needs_input_grad
    needs = [n[0], n[2], n[3], n[4], n[5], n[6], n[7]]
    if not any(needs):
        return (None,) * 12
    grads = grouped_glu_backward_op(
        grad_out.contiguous(), x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
        scatter_idx, ctx.num_out_rows, ctx.impl, needs,
    )
    g = [gr if need else None for gr, need in zip(grads, needs)]
    return (g[0], None, g[1], g[2], g[3], g[4], g[5], g[6], None, None, None, None)


grouped_glu_op.register_autograd(_backward, setup_context=_setup_context)
