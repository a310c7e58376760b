"""Public entry point of the expert pass: validate, pick a path, call the one Function (``tsct.ops._function``).

Every factor format (dense, NVFP4, sign, FP8, ternary) and every path go through the same
``torch.autograd.Function`` and, where the dispatcher must see the call (torch.compile, FakeTensor, the
CPU), the same custom-op pair ``tsct::grouped_glu`` / ``tsct::grouped_glu_backward``; both work under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

import torch
from torch import Tensor

from tsct import dispatch
from tsct.ops import _function, _masters, _select
from tsct.ops._validate import as_int, check_index_values, validate

if TYPE_CHECKING:
    from tsct.quant import FP8Tensor, NVFP4Tensor, SignTensor, TernaryTensor

Factor = Union[Tensor, "NVFP4Tensor", "SignTensor", "FP8Tensor", "TernaryTensor"]


def _storage_format(factors) -> str:
    """The one format of the three factors; "mixed" for a mix of dense, NVFP4 and sign factors,
    ``dispatch.MIXED_DECODED`` for a mix with an FP8 or ternary factor (auto decodes it for bmm)."""
    from tsct import quant
    fmts = {quant.storage_format(w) for w in factors}
    if len(fmts) == 1:
        return fmts.pop()
    return dispatch.MIXED_DECODED if fmts & set(dispatch.DECODED_FORMATS) else "mixed"


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
    activations: str = "bf16",
    masters: Optional[Sequence[Optional[Tensor]]] = None,
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
            (NVFP4Tensor / SignTensor / FP8Tensor / TernaryTensor) of that logical shape.
        w_down: ``[E, r, f]`` up-projection, likewise. ``f`` may be any size (e.g. 5461). Any strides;
            a K-major ``w_down`` (``w_down.transpose(1, 2).is_contiguous()``: stored as ``[E, f, r]``
            like ``nn.Linear.weight``) is read in place by triton-bf16 and is its fast layout when f is
            not a multiple of 8 (aligned 16-byte tiles; docs/decisions/0012). Every path returns each
            factor's gradient in a fixed layout: K-major for a K-major input, contiguous otherwise
            (also what the compiled op's fake promises).
        s_gate, s_up: optional ``[E, r]`` per-rank scales (``x.dtype`` or float32); default 1.
        row_weight: optional ``[M]`` router probability of each routed row (``x.dtype`` or float32).
        gather_idx: optional ``[M]`` int32/int64: routed row i reads ``x[gather_idx[i]]``.
        scatter_idx: optional ``[M]`` int32/int64 with ``num_out_rows``: routed row i is summed into
            ``out[scatter_idx[i]]``; the sum is deterministic (same bits every run).
        num_out_rows: number of output rows with ``scatter_idx`` (T, the token count); an int (numpy
            and 0-dim torch integers are accepted).
        impl: ``"auto"`` (pick by compute capability, storage format, activation precision and built
            artifacts, see ``tsct.dispatch``) or a path name from ``tsct.dispatch.PATHS`` to force it:
            "bmm" (factors decoded to ``x.dtype``, ``torch.bmm``; CPU and any GPU: what auto falls back to),
            "reference" (the per-expert float oracle; slow), "triton-bf16", "triton-lowbit",
            "sm120-fp4" (12.0 / 12.1 GPUs, NVFP4 or sign factors, ``activations="nvfp4"`` only).
        activations: the precision of the activations in the products: ``"bf16"`` (default; x and z
            as given) or ``"nvfp4"`` (x and z quantized to NVFP4 per expert with one encode scale per
            expert, UE4M3 block scales per 16 along K: the recipe of the sm_120 FP4 tensor-core path,
            docs/decisions/0019; d and r multiples of 16). The choice is the caller's, never the GPU's:
            on 12.x GPUs ``auto`` runs NVFP4 activations on the tensor cores, everywhere else the same
            quantization followed by bf16 products (``bmm``); the backward is straight-through.
        masters: optional ``(w_gate, w_up, w_down)`` master factors for training packed factors with
            the straight-through estimator (None entries allowed; a master only for a packed factor).
            Each master is a float tensor of its factor's logical shape; the forward reads the packed
            factor only, dX flows through the decoded factor, and the master receives the gradient
            w.r.t. the decoded factor (cast to the master's dtype), as if ``dequantize(w)`` had been
            the leaf. Make the containers with ``tsct.ops.quantize_master(master, fmt)``: it caches
            one per master version, so they are re-quantized once per optimizer step, and a stale one
            (or one made from another tensor) is refused here. A container made otherwise
            (``tsct.quant.quantize``) has no record of its master and is taken as given: keeping it the
            quantization of its master is then the caller's job (docs/decisions/0008-lowbit-training.md).

    Returns:
        ``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; dtype ``x.dtype``.

    Raises:
        TypeError: an argument of the wrong type or dtype (the message names it), a master that is not a float
            tensor.
        ValueError: a wrong shape or device; ``scatter_idx`` without ``num_out_rows`` or the reverse; an unknown
            ``impl`` or ``activations``; ``activations="nvfp4"`` with d or r not a multiple of 16; a master for a
            dense factor, of another shape or device than its factor, or a container that ``quantize_master``
            made from another tensor or an older state of it; with ``tsct.config.check_values`` (``offs`` also
            without it on the reference path) negative or decreasing ``offs``, ``offs[-1] > M``, or ``gather_idx`` /
            ``scatter_idx`` entries of routed rows outside ``[0, x.shape[0])`` / ``[0, num_out_rows)``. While
            torch.compile traces or a CUDA graph is captured those value checks are device-side asserts (a
            RuntimeError on the CPU). ``tsct.ops.sort_by_expert``'s own outputs (its ``offs`` and ``token`` as
            ``gather_idx`` / ``scatter_idx``, unchanged, within its T) are valid by construction: an eager call does
            not read them back (no host synchronization); a write that does not move their version counters (an
            in-place torch.distributed collective, ``.data``, DLPack) is not seen.
        RuntimeError: a forced ``impl`` that cannot run here, with the reason; a second derivative
            (``create_graph=True`` through the backward).

    Packed factors: the reference path decodes them to ``x.dtype``; the "triton-lowbit" path (sm_80+
    GPUs; ``impl="auto"`` takes it for NVFP4 / sign / mixed factors) reads the packed bytes and decodes
    in registers. FP8 and ternary factors (and mixes with them): ``auto`` decodes them to ``x.dtype`` once per
    call and runs ``bmm`` on every device; ``impl="triton-lowbit"`` reads them packed and decodes in registers
    (``dispatch.FORCED_ONLY``: opt-in until they pass the whole GPU suite). Without ``masters`` a packed factor
    gets no gradient (frozen low-bit weights; dX,
    scales and row weights still get theirs). Two ways to train low-bit factors (decision 0008):
    ``masters=`` with containers from ``quantize_master`` (packed bytes in the forward and dX), or
    dense factors from ``tsct.quant.fake_quantize(master, fmt)`` (bf16 bytes, any path).
    """
    num_out_rows = None if num_out_rows is None else as_int("grouped_glu", "num_out_rows", num_out_rows)
    m, e, d, r, f = validate(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                             num_out_rows)
    facs = (w_gate, w_up, w_down)
    ms = _check_masters(facs, masters)
    fmt = _storage_format(facs)
    if not isinstance(activations, str):
        raise TypeError(f"grouped_glu: activations must be a str ('bf16' or 'nvfp4'), got {type(activations).__name__}")
    if activations == "nvfp4" and (d % 16 or r % 16):
        raise ValueError(f"grouped_glu: activations='nvfp4' quantizes rows in blocks of 16 along K: d = {d} and "
                         f"r = {r} must be multiples of 16")
    x_dtype = dispatch.DTYPE_NAMES[x.dtype]  # validate() allowed only these
    path = _select.select(impl, dispatch.device_capability(x.device), fmt, activations, x_dtype, x.device.index)
    static = path == dispatch.BMM and _static_shapes_needed(x)
    # an eager bmm call reads its layout plan on the host anyway: the values are checked in that one read
    check_index_values(offs, m, gather_idx, x.shape[0], scatter_idx, num_out_rows,
                       deferred=path == dispatch.BMM and not static)
    key = dispatch.impl_key(path, activations, static=static)
    routing = _function.Routing(offs, gather_idx, scatter_idx, num_out_rows, row_weight)
    return _function.grouped_glu(x, facs, ms, s_gate, s_up, routing, key)


def _static_shapes_needed(x: Tensor) -> bool:
    """A CUDA graph is being captured or torch.compile traces: no host read is possible, so the bmm
    path lays rows out by its static bound (``tsct.bmm.static_plan``)."""
    return torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_masters(facs, masters) -> tuple:
    if masters is None:
        return (None, None, None)
    if not isinstance(masters, (list, tuple)):
        raise TypeError(f"grouped_glu: masters must be a sequence (w_gate, w_up, w_down) of tensors or None, got "
                        f"{type(masters).__name__}")
    if len(masters) != 3:
        raise ValueError(f"grouped_glu: masters must be a sequence (w_gate, w_up, w_down) of tensors or None, got "
                         f"{len(masters)} entries")
    for name, w, mt in zip(("w_gate", "w_up", "w_down"), facs, masters):
        if mt is not None:
            _masters.check_master(name, w, mt)
    return tuple(masters)

