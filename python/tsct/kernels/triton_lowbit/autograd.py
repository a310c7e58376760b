"""Differentiable entry of the low-bit path: packed factors in the forward, STE to master factors.

``grouped_glu(x, offs, w_gate, w_up, w_down, s_gate, s_up, *, row_weight, gather_idx, scatter_idx,
num_out_rows, masters=None)``: a ``torch.autograd.Function``. Packed containers are not tensors, so
they ride on ``ctx`` (their storage tensors are never modified); tensors (x, dense factors, scales,
row_weight, masters) are ordinary autograd inputs.

* dX, d s_gate, d s_up, d row_weight, and dW of a dense factor: as the bf16 path.
* A packed factor with a master (``masters[i]`` a tensor of the factor's logical shape): the master's
  gradient is the gradient w.r.t. the decoded factor (straight-through estimator: d master = d W_hat).
  The caller re-quantizes the master once per optimizer step (``tsct.quant.quantize``) and must not
  reuse containers across a step; nothing here caches them.
* A packed factor without a master gets no gradient (frozen low-bit weights).

Not a ``torch.library`` custom op: ``torch.compile`` graph-breaks around it. ``tsct.ops.grouped_glu``
reaches the same kernels through the ``tsct::grouped_glu`` custom op (``tsct/ops/_function.py``: the
containers' storage tensors plus format tags, masters as gradient carriers), which
traces; prefer it. This wrapper stays for direct use of the kernels and their tests.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from tsct.kernels.triton_lowbit import glu as L

__all__ = ["grouped_glu"]


class _LowbitGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offs, wg_t, wu_t, wd_t, s_gate, s_up, row_weight, gather_idx, scatter_idx, mg, mu, md,
                packed, num_out_rows):
        w = [p if p is not None else t for p, t in zip(packed, (wg_t, wu_t, wd_t))]
        ctx.packed = packed
        ctx.num_out_rows = num_out_rows
        ctx.save_for_backward(x, offs, wg_t, wu_t, wd_t, s_gate, s_up, row_weight, gather_idx, scatter_idx)
        ctx.has_master = (mg is not None, mu is not None, md is not None)
        return L.grouped_glu_forward(x, offs, *w, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows)

    @staticmethod
    def backward(ctx, grad_out):
        x, offs, wg_t, wu_t, wd_t, s_gate, s_up, row_weight, gather_idx, scatter_idx = ctx.saved_tensors
        w = [p if p is not None else t for p, t in zip(ctx.packed, (wg_t, wu_t, wd_t))]
        n = ctx.needs_input_grad
        # a factor slot is wanted for a dense factor that needs grad, or a packed one whose master does
        wf = [n[2 + i] if ctx.packed[i] is None else n[10 + i] for i in range(3)]
        needs = [n[0], *wf, n[5], n[6], n[7]]
        g = L.grouped_glu_backward(grad_out.contiguous(), x, offs, *w, s_gate, s_up, row_weight, gather_idx,
                                   scatter_idx, ctx.num_out_rows, needs)
        dense = [g[1 + i] if ctx.packed[i] is None else None for i in range(3)]
        master = [g[1 + i] if ctx.packed[i] is not None else None for i in range(3)]
        return (g[0], None, *dense, g[4], g[5], g[6], None, None, *master, None, None)


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
    """The low-bit grouped GLU with autograd (inputs as ``tsct.ops.grouped_glu``, not re-validated here).

    ``masters``: optional ``(w_gate, w_up, w_down)`` master tensors for packed factors (None entries
    allowed); each receives the STE gradient of its packed factor. A master given for a dense factor
    is an error (the dense factor is its own leaf).
    """
    facs = (w_gate, w_up, w_down)
    packed = tuple(None if isinstance(w, Tensor) else w for w in facs)
    for w in facs:
        L.factor_format(w)  # TypeError for anything else
    tens = tuple(w if isinstance(w, Tensor) else None for w in facs)
    ms = tuple(masters) if masters is not None else (None, None, None)
    if len(ms) != 3:
        raise ValueError("masters must be (w_gate, w_up, w_down), None entries allowed")
    for name, p, mt, w in zip(("w_gate", "w_up", "w_down"), packed, ms, facs):
        if mt is None:
            continue
        if p is None:
            raise ValueError(f"masters: {name} is dense; it is its own leaf, pass no master for it")
        if tuple(mt.shape) != tuple(p.shape):
            raise ValueError(f"masters: {name} master has shape {list(mt.shape)}, its factor {list(p.shape)}")
    return _LowbitGLU.apply(x, offs, *tens, s_gate, s_up, row_weight, gather_idx, scatter_idx, *ms, packed,
                            num_out_rows)
