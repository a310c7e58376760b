"""Public entry point of the expert pass: validate, pick a path, call the custom op."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from tsct import dispatch
from tsct.ops._library import grouped_glu_op
from tsct.ops._validate import validate

Factor = Union[Tensor, "tsct.quant.NVFP4Tensor", "tsct.quant.SignTensor"]  # noqa: F821


def _storage_format(factors) -> str:
    from tsct import quant
    fmts = {quant.storage_format(w) for w in factors}
    return fmts.pop() if len(fmts) == 1 else "mixed"


def grouped_glu(
    x: Tensor,
    offs: Tensor,
    w_gate: Factor,
    w_up: Factor,
    w_down: Factor,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    *,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
    impl: str = "auto",
) -> Tensor:
    """Dual-latent GLU over experts (design.md section 2), differentiable in every float input.

    For expert ``e`` and its routed rows ``X_e`` (rows ``offs[e-1]:offs[e]`` of ``x[gather_idx]``)::

        g = (X_e @ w_gate[e]) * s_gate[e]        # [m_e, r]
        u = (X_e @ w_up[e])   * s_up[e]          # [m_e, r]
        Y_e = ((silu(g) * u) @ w_down[e]) * row_weight[rows]   # [m_e, f]

    Args:
        x: ``[M, d]`` routed rows sorted by expert, or with ``gather_idx`` the token-major ``[T, d]``
            input. float32, bfloat16 or float16; sets the compute and output dtype.
        offs: ``[E]`` int32 cumulative END offsets into the M routed rows (as
            ``torch.nn.functional.grouped_mm``); non-decreasing, ``offs[-1] <= M``. Rows at or past
            ``offs[-1]`` are padding: zero output and zero gradient, and their entries of
            ``gather_idx``/``scatter_idx``/``row_weight`` are never read. Empty experts are fine.
        w_gate, w_up: ``[E, d, r]`` down-projections, ``x.dtype``, or a ``tsct.quant`` container
            (NVFP4Tensor / SignTensor) of that logical shape.
        w_down: ``[E, r, f]`` up-projection, likewise. ``f`` may be any size (e.g. 5461).
        s_gate, s_up: optional ``[E, r]`` per-rank scales (``x.dtype`` or float32); default 1.
        row_weight: optional ``[M]`` router probability of each routed row (``x.dtype`` or float32).
        gather_idx: optional ``[M]`` int32/int64: routed row i reads ``x[gather_idx[i]]``.
        scatter_idx: optional ``[M]`` int32/int64 with ``num_out_rows``: routed row i is summed into
            ``out[scatter_idx[i]]``; the sum is deterministic (same bits every run).
        num_out_rows: number of output rows with ``scatter_idx`` (T, the token count).
        impl: ``"auto"`` (pick by compute capability, storage format and built artifacts, see
            ``tsct.dispatch``) or a path name from ``tsct.dispatch.PATHS`` to force it.

    Returns:
        ``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; dtype ``x.dtype``.

    Raises:
        TypeError: an argument of the wrong type or dtype (the message names it).
        ValueError: a wrong shape or device, or (with ``tsct.config.check_values``) offsets that
            decrease or exceed M, or indices out of range.
        RuntimeError: a forced ``impl`` that cannot run here, with the reason.

    Quantized factors are decoded to ``x.dtype`` on the reference path (their gradient does not
    flow: packed storage holds no master weights; train with ``tsct.quant.fake_quantize`` on the
    master factors instead, which is the straight-through estimator).
    """
    m, e, d, r, f = validate(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                             num_out_rows)
    fmt = _storage_format((w_gate, w_up, w_down))
    path = dispatch.select(impl, dispatch.device_capability(x.device), fmt)
    if path == dispatch.REFERENCE:
        from tsct import quant
        w_gate, w_up, w_down = (quant.dequantize(w, dtype=x.dtype) if quant.is_quantized(w) else w
                                for w in (w_gate, w_up, w_down))
    return grouped_glu_op(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                          num_out_rows, path)
