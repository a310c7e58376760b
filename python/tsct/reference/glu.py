"""Reference dual-latent GLU over experts, in pure torch with fp32 accumulation.

Math (design.md section 2), for expert e and its rows X_e = x[gather_idx][offs[e-1]:offs[e]]:

    g = (X_e @ w_gate[e]) * s_gate[e]
    u = (X_e @ w_up[e])   * s_up[e]
    z = silu(g) * u
    Y_e = (z @ w_down[e]) * row_weight[rows]

Rows at or past offs[-1] are padding: zero output, zero gradient. With ``scatter_idx`` each routed row
is summed into ``out[scatter_idx[i]]`` in a fixed order (see ``_deterministic_combine``).

This path reads ``offs`` on the host once per call (it loops over experts in Python), so it is not
sync-free and cannot be captured in a CUDA graph; the fast paths are. Since it has the offsets on
the host anyway, it always checks them (also under torch.compile and with value checks off). Its
backward is the chain rule written out per expert; the tests check it against torch autograd on
an independent float64 per-row implementation (tests/_glu_oracle.py).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["grouped_glu_forward", "grouped_glu_backward"]


def _fp32_whatever_autocast(fn):
    """Run ``fn`` with autocast off on its first argument's device: the oracle computes in fp32 whatever the
    caller's autocast says (a bf16 autocast would otherwise run its fp32 matmuls in bf16)."""
    @functools.wraps(fn)
    def wrapped(first: Tensor, *args, **kwargs):
        dev = first.device.type
        with torch.autocast(dev, enabled=False) if dev in ("cpu", "cuda") else contextlib.nullcontext():
            return fn(first, *args, **kwargs)
    return wrapped


def _deterministic_combine(y: Tensor, scatter_idx: Tensor, num_out_rows: int) -> Tensor:
    """Sum rows of ``y`` [M, f] into ``[num_out_rows, f]`` at ``scatter_idx`` with a fixed order.

    Rows that share a target are ranked by their position in ``y`` (stable sort); slot s of every
    target is added in increasing s, so the fp32 sum has the same bits on every run (unlike
    ``index_add_`` on CUDA, which uses atomics).
    """
    m, f = y.shape
    out = y.new_zeros(num_out_rows, f)
    if m == 0:
        return out
    order = torch.sort(scatter_idx, stable=True).indices
    sorted_tgt = scatter_idx[order]
    # rank of each row among the rows with the same target
    first = torch.ones_like(sorted_tgt, dtype=torch.bool)
    first[1:] = sorted_tgt[1:] != sorted_tgt[:-1]
    pos = torch.arange(m, device=y.device)
    start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    rank = pos - start
    n_slots = int(rank.max()) + 1  # host read; the reference already syncs on offs
    for s in range(n_slots):
        sel = order[rank == s]
        out = out.index_add(0, scatter_idx[sel], y[sel])  # targets are unique within a slot
    return out


def _host_bounds(offs: Tensor, m: int) -> list[int]:
    """[0] + offs as Python ints, checked: non-negative, non-decreasing, last <= m (free here)."""
    bounds = [0] + offs.tolist()
    for e in range(1, len(bounds)):
        if bounds[e] < bounds[e - 1]:
            prev = f"offs[{e - 2}] = {bounds[e - 1]}" if e > 1 else "0"
            raise ValueError(f"grouped_glu: offs must be non-negative and non-decreasing, offs[{e - 1}] = "
                             f"{bounds[e]} < {prev}")
    if bounds[-1] > m:
        raise ValueError(f"grouped_glu: offs[-1] = {bounds[-1]} exceeds M = {m} routed rows "
                         "(len(gather_idx) when it is given, else x.shape[0])")
    return bounds


@_fp32_whatever_autocast
def grouped_glu_forward(
    x: Tensor,
    offs: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
) -> Tensor:
    """Reference forward. Inputs are already validated (``tsct.ops``); factors are dense tensors.

    Computes in fp32 whatever the input dtype (and autocast) and returns ``x.dtype``: ``[num_out_rows, f]`` with
    ``scatter_idx``, else ``[M, f]`` (M = len(gather_idx) or x.shape[0]). Differentiable by torch
    autograd in every tensor argument.
    """
    out_dtype = x.dtype
    e_count, _, r = w_gate.shape
    f = w_down.shape[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    bounds = _host_bounds(offs, m)  # the one host read of this path
    valid = bounds[-1]
    # Entries of gather_idx / scatter_idx / row_weight past offs[-1] are padding: never read.
    xf = x.float()
    xr = xf.index_select(0, gather_idx[:valid]) if gather_idx is not None else xf[:valid]
    pieces = []
    for e in range(e_count):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        xe = xr[lo:hi]
        g = xe @ w_gate[e].float()
        u = xe @ w_up[e].float()
        if s_gate is not None:
            g = g * s_gate[e].float()
        if s_up is not None:
            u = u * s_up[e].float()
        z = torch.nn.functional.silu(g) * u
        pieces.append(z @ w_down[e].float())
    y = torch.cat(pieces, 0) if pieces else xf.new_zeros(0, f)
    if row_weight is not None:
        y = y * row_weight[:valid].float().unsqueeze(1)
    if scatter_idx is not None:
        assert num_out_rows is not None
        y = _deterministic_combine(y, scatter_idx[:valid], num_out_rows)
    elif valid < m:  # padding rows: exact zeros, outside the autograd graph of every input
        y = torch.cat([y, y.new_zeros(m - valid, f)], 0)
    return y.to(out_dtype)


@_fp32_whatever_autocast
def grouped_glu_backward(
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
    needs_grad: Sequence[bool],
) -> list[Optional[Tensor]]:
    """Gradients of ``grouped_glu_forward`` w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight).

    The chain rule written out per expert in fp32 (a = X_e W_g, b = X_e W_u, g = a s_g, u = b s_u,
    z = silu(g) u, y0 = z W_d, y = y0 w_row)::

        d w_row = rowsum(dy * y0)        dy0 = dy * w_row
        dW_d = z^T dy0                   dz  = dy0 W_d^T
        du = dz silu(g)                  dg  = dz u silu'(g),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
        d s_g = colsum(dg a)             da  = dg s_g          (likewise b, s_u)
        dW_g = X_e^T da    dW_u = X_e^T db    dX_e = da W_g^T + db W_u^T

    dX is summed over each token's routed rows in a fixed order (deterministic). The tests check
    these formulas against torch autograd on an independent per-row implementation.
    ``needs_grad`` has 7 flags in that order; an entry is None where its flag is False or its input
    is None. Gradients come back in each input's dtype; experts with no rows get exact zeros.
    """
    e_count, d, r = w_gate.shape
    f = w_down.shape[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    bounds = _host_bounds(offs, m)
    valid = bounds[-1]
    go = grad_out.float()
    dy = go.index_select(0, scatter_idx[:valid]) if scatter_idx is not None else go[:valid]
    xf = x.float()
    xr = xf.index_select(0, gather_idx[:valid]) if gather_idx is not None else xf[:valid]
    rw = row_weight[:valid].float() if row_weight is not None else None
    dy0 = dy * rw.unsqueeze(1) if rw is not None else dy

    f32 = dict(dtype=torch.float32, device=x.device)
    dxr = torch.zeros(valid, d, **f32)
    dwg = torch.zeros(e_count, d, r, **f32)
    dwu = torch.zeros(e_count, d, r, **f32)
    dwd = torch.zeros(e_count, r, f, **f32)
    dsg = torch.zeros(e_count, r, **f32)
    dsu = torch.zeros(e_count, r, **f32)
    drw = torch.zeros(valid, **f32)
    for e in range(e_count):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        xe, wg, wu, wd = xr[lo:hi], w_gate[e].float(), w_up[e].float(), w_down[e].float()
        a, b = xe @ wg, xe @ wu
        sg = s_gate[e].float() if s_gate is not None else None
        su = s_up[e].float() if s_up is not None else None
        g = a * sg if sg is not None else a
        u = b * su if su is not None else b
        sig = torch.sigmoid(g)
        silu = g * sig
        z = silu * u
        if rw is not None:
            drw[lo:hi] = (dy[lo:hi] * (z @ wd)).sum(1)
        dwd[e] = z.t() @ dy0[lo:hi]
        dz = dy0[lo:hi] @ wd.t()
        du = dz * silu
        dg = dz * u * (sig * (1 + g * (1 - sig)))
        dsg[e] = (dg * a).sum(0)
        dsu[e] = (du * b).sum(0)
        da = dg * sg if sg is not None else dg
        db = du * su if su is not None else du
        dwg[e] = xe.t() @ da
        dwu[e] = xe.t() @ db
        dxr[lo:hi] = da @ wg.t() + db @ wu.t()

    if gather_idx is not None:
        dx = _deterministic_combine(dxr, gather_idx[:valid], x.shape[0])
    else:
        dx = torch.cat([dxr, dxr.new_zeros(m - valid, d)], 0)
    if row_weight is not None:
        drw = torch.cat([drw, drw.new_zeros(m - valid)], 0)
    grads = [dx, dwg, dwu, dwd, dsg, dsu, drw]
    inputs = [x, w_gate, w_up, w_down, s_gate, s_up, row_weight]
    return [g.to(t.dtype) if (t is not None and need) else None for g, t, need in zip(grads, inputs, needs_grad)]
