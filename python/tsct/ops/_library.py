"""torch.library registration of the grouped GLU, so torch.compile(fullgraph=True) sees one op.

Two custom ops: ``tsct::grouped_glu`` (forward: the output and the tensors the path's backward needs,
an empty list for a path that saves nothing) and ``tsct::grouped_glu_backward`` (all seven gradients);
``grouped_glu_op`` returns the output alone. The autograd formula registered for the forward just
calls the backward op, so a compiled graph holds two opaque nodes and never traces into a path's
Python (the reference path loops over experts on the host; a kernel path launches compiled code).
Both have fake implementations that give shapes and dtypes only. ``impl`` is resolved before the op
is called and travels as a string argument, so the graph records which path it used.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tsct import dispatch
from tsct.kernels.layout import is_kmajor
from tsct.ops import _eager, _select

_N_GRADS = 7  # x, w_gate, w_up, w_down, s_gate, s_up, row_weight


@torch.library.custom_op("tsct::grouped_glu", mutates_args=())
def grouped_glu_saving_op(
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
) -> tuple[Tensor, list[Tensor]]:
    """(out, saved): ``saved`` holds what the path's backward would otherwise recompute (empty for a
    path without ``grouped_glu_forward_saved``); it travels to the backward op unchanged."""
    return _forward_impl(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                         num_out_rows, impl)


def _forward_impl(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                  impl) -> tuple[Tensor, list[Tensor]]:
    return path_forward(impl, (x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                               num_out_rows))


def path_forward(impl: str, args: tuple, save: bool = True) -> tuple[Tensor, list[Tensor]]:
    """``(out, saved)`` of path ``impl``'s forward on ``args`` (x, offs, the three factors, s_gate, s_up,
    row_weight, gather_idx, scatter_idx, num_out_rows). With ``save`` and a path that has
    ``grouped_glu_forward_saved``, ``saved`` is what its backward would otherwise recompute; else []."""
    mod = dispatch.implementation(impl)
    fwd_saved = getattr(mod, "grouped_glu_forward_saved", None) if save else None
    if fwd_saved is None:
        return mod.grouped_glu_forward(*args), []
    out, saved = fwd_saved(*args)
    return out, list(saved)


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
    """The forward's output (``tsct::grouped_glu`` without its saved tensors). A plain eager CUDA call
    runs the same functions through ``_EagerGlu`` instead of the dispatcher (``tsct.ops._eager``)."""
    if _eager.direct_ok(x, w_gate, w_up, w_down):
        args = (x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows)
        if _eager.needs_grad(x, w_gate, w_up, w_down, s_gate, s_up, row_weight):
            return _eager.run("tsct::grouped_glu", _EagerGlu.apply, *args, impl)
        # inference: the plain forward (saves nothing)
        return _eager.run("tsct::grouped_glu", path_forward, impl, args, False)[0]
    return grouped_glu_saving_op(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                                 num_out_rows, impl)[0]


def _out_shape(x, w_down, gather_idx, num_out_rows):
    f = w_down.shape[2]
    if num_out_rows is not None:
        return (num_out_rows, f)
    return (gather_idx.shape[0] if gather_idx is not None else x.shape[0], f)


@grouped_glu_saving_op.register_fake
def _(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl):
    mod = dispatch.implementation(impl)
    like = getattr(mod, "saved_like", None)
    saved = like(x, w_gate, gather_idx, scatter_idx, num_out_rows) if like is not None else []
    return x.new_empty(_out_shape(x, w_down, gather_idx, num_out_rows)), saved


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
    saved: list[Tensor],
) -> list[Tensor]:
    return _backward_impl(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                          scatter_idx, num_out_rows, impl, needs_grad, saved)


def grad_like(t: Tensor) -> Tensor:
    """A fresh tensor shaped like input ``t`` in the layout the backward op returns t's gradient in:
    K-major for a K-major t, contiguous otherwise. One rule for the real op and its fake, decided
    from t alone (so it also holds with symbolic shapes under torch.compile)."""
    if is_kmajor(t):
        return torch.empty_like(t.transpose(-1, -2), memory_format=torch.contiguous_format).transpose(-1, -2)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def like_input(g: Tensor, t: Tensor) -> Tensor:
    """Gradient ``g`` of input ``t`` in ``grad_like(t)``'s layout, whatever layout a path's kernels
    wrote (a copy only when they differ, e.g. a K-major w_down on a launch that is not aligned)."""
    if is_kmajor(t):
        return g if g.transpose(-1, -2).is_contiguous() else grad_like(t).copy_(g)
    return g if g.is_contiguous() else g.contiguous()


def backward_outputs(grads, inputs, x: Tensor) -> list[Tensor]:
    """The backward op's outputs: each gradient in its input's layout (``like_input``); custom ops
    cannot return None, so an absent gradient travels as an empty tensor."""
    return [like_input(g, t) if g is not None else x.new_empty(0) for g, t in zip(grads, inputs)]


def fake_grads(inputs, needs_grad, x: Tensor) -> list[Tensor]:
    """What ``backward_outputs`` returns, as fakes (``grad_like`` of each needed input)."""
    return [grad_like(t) if (t is not None and need) else x.new_empty(0) for t, need in zip(inputs, needs_grad)]


def _backward_impl(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                   num_out_rows, impl, needs_grad, saved) -> list[Tensor]:
    _select.before_backward(impl, x.device)
    mod = dispatch.implementation(impl)
    args = (grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
            num_out_rows, needs_grad)
    grads = mod.grouped_glu_backward(*args, saved=saved) if saved else mod.grouped_glu_backward(*args)
    return backward_outputs(grads, (x, w_gate, w_up, w_down, s_gate, s_up, row_weight), x)


@grouped_glu_backward_op.register_fake
def _(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
      num_out_rows, impl, needs_grad, saved):
    return fake_grads((x, w_gate, w_up, w_down, s_gate, s_up, row_weight), needs_grad, x)


def _setup_context(ctx, inputs, output):
    (x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl) = inputs
    saved = output[1]
    ctx.save_for_backward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, *saved)
    ctx.num_out_rows = num_out_rows
    ctx.impl = impl


def _backward(ctx, grad_out, _grad_saved=None):
    x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, *saved = ctx.saved_tensors
    # ctx.needs_input_grad follows the forward's 12 inputs; keep the 7 differentiable ones
    n = ctx.needs_input_grad
    needs = [n[0], n[2], n[3], n[4], n[5], n[6], n[7]]
    if not any(needs):
        return (None,) * 12
    # the eager Function calls the implementation directly, except under create_graph (the op's
    # registered formula then fails a second derivative by name)
    bwd = _backward_impl if (getattr(ctx, "direct", False) and not torch.is_grad_enabled()) else grouped_glu_backward_op
    grads = bwd(
        grad_out.contiguous(), x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
        scatter_idx, ctx.num_out_rows, ctx.impl, needs, list(saved),
    )
    g = [gr if need else None for gr, need in zip(grads, needs)]
    return (g[0], None, g[1], g[2], g[3], g[4], g[5], g[6], None, None, None, None)


grouped_glu_saving_op.register_autograd(_backward, setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("tsct.ops.grouped_glu: double backward (gradients of gradients, create_graph=True) is "
                       "not supported; only first derivatives are implemented")


# Registered so a second derivative fails with that message instead of torch's generic "no autograd formula".
grouped_glu_backward_op.register_autograd(_no_double_backward)


class _EagerGlu(torch.autograd.Function):
    """``tsct::grouped_glu`` and its autograd formula without the dispatcher (plain eager CUDA calls)."""

    @staticmethod
    def forward(ctx, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                impl):
        inputs = (x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl)
        out, saved = _forward_impl(*inputs)
        _setup_context(ctx, inputs, (out, saved))
        ctx.direct = True
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _backward(ctx, grad_out)
