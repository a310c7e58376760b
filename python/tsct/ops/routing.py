"""``tsct.ops.sort_by_expert``: the routed rows of a top-k router sorted by expert, as ``grouped_glu`` takes them.

One custom op, ``tsct::sort_by_expert`` (so torch.compile(fullgraph=True) sees it), with a fake implementation
that gives shapes only. On a GPU that the Triton kernels serve it is a stable counting sort in three launches
(``tsct.kernels.triton_common.route``); elsewhere the same result from torch (``argsort`` and a sync-free count).

First use (decision 0010): the kernels (``route_rank``, ``route_place``; the forward only: the backward of
``row_weight`` is a torch scatter) have executed on sm90 only (``tsct.dispatch.EXECUTED_ON[ROUTING]``). On any other
arch class the first call that would launch them asks ``tsct.firstuse.gate`` for the verdict of their self-test
(``tsct.selftest.sort_by_expert``) in a CHILD process, as the Triton paths and the native quantizers do; this process
never launches them before the child said "pass". Otherwise torch's sort serves: the same ``order``, ``offs``,
``token`` and ``row_weight``, bit for bit; only the combine's CSR that ``route_place`` links to ``token`` is absent,
so a ``grouped_glu`` through that token builds its own (the same bits).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from tsct import config, dispatch, firstuse
from tsct.kernels.triton_common import specs as _route_specs
from tsct.ops import _eager, _validate

MAX_EXPERTS = 1 << 20
# the kernels sort (key, row in chunk) pairs packed in int32, keys up to E + 1, specs.ROUTE_B rows a chunk
assert (MAX_EXPERTS + 2) * _route_specs.ROUTE_B <= 1 << 31, "MAX_EXPERTS too large for specs.ROUTE_B"


#: the router weights sort_by_expert takes (the layers cast others to fp32)
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class ExpertOrder(NamedTuple):
    """The routed rows sorted by expert (``sort_by_expert``). M = T * k rows.

    order: ``[M]`` int64, index into ``topk_ids.reshape(-1)`` of each sorted row.
    offs: ``[E]`` int32 cumulative END offsets (``grouped_glu``'s ``offs``).
    token: ``[M]`` int64, ``order // k``: the token of each sorted row (``grouped_glu``'s ``gather_idx`` and
        ``scatter_idx``).
    row_weight: ``[M]`` float32, ``topk_weights.reshape(-1)[order]`` (exact: the weights' dtype widened),
        differentiable w.r.t. ``topk_weights`` (``grouped_glu``'s ``row_weight``); None without ``topk_weights``.
    """

    order: Tensor
    offs: Tensor
    token: Tensor
    row_weight: Optional[Tensor]


def sort_by_expert(topk_ids: Tensor, num_experts: int, topk_weights: Optional[Tensor] = None) -> ExpertOrder:
    """Sort the routed rows of a top-k router by expert, stably, without host synchronisation.

    Row ``i`` of the flattened ``topk_ids`` (token ``i // k``, choice ``i % k``) is routed to expert
    ``topk_ids.reshape(-1)[i]``. The rows come out grouped by expert in increasing expert order and, within an
    expert, in increasing ``i`` (the order of ``torch.argsort(ids.reshape(-1), stable=True)``). An id outside
    ``[0, num_experts)`` (for example -1 for a dropped choice) makes its row a padding row: such rows come last,
    after ``offs[-1]``, where ``grouped_glu`` gives them zero output and zero gradient.

    Typical use (design.md section 2)::

        w, ids = router_probs.topk(k)                               # [T, k] each
        s = tsct.ops.sort_by_expert(ids, E, w)
        out = grouped_glu(x, s.offs, w_gate, w_up, w_down, row_weight=s.row_weight,
                          gather_idx=s.token, scatter_idx=s.token, num_out_rows=x.shape[0])

    Args:
        topk_ids: ``[T, k]`` integer tensor (any integer dtype) on any device.
        num_experts: E >= 1, at most 2**20.
        topk_weights: optional ``[T, k]`` router weights (bfloat16, float16 or float32) on the same device; the
            sorted copy comes back as ``row_weight`` (float32), and gradients reach ``topk_weights`` through it.

    Returns:
        ``ExpertOrder(order, offs, token, row_weight)``: int64 ``[T*k]``, int32 ``[E]``, int64 ``[T*k]``,
        float32 ``[T*k]`` or None, on ``topk_ids.device``.

    Raises:
        TypeError: ``topk_ids`` is not an integer tensor, ``num_experts`` not an int, ``topk_weights`` not a
            bfloat16 / float16 / float32 tensor.
        ValueError: ``topk_ids`` is not 2-D, ``num_experts`` is out of range, ``topk_weights`` has another shape
            or device than ``topk_ids``.

    On CUDA: three kernel launches (Triton, from the wheel's cubins or JIT) where the Triton kernels serve the
    device and E is not large against M / 512 (``route.fits``), else torch's ``argsort`` and a ``scatter_add``
    count (the same result). Sync-free and CUDA-graph safe either way. On a GPU of an arch class the kernels never
    executed on (all but sm90: 12.x too) the first call asks for the verdict of their self-test run in a child
    process (``tsct.firstuse``; seconds, once per GPU and install, cached on disk): the kernels run in this process
    only after it passed, else torch's sort serves (warned once). During a CUDA graph capture no child starts: until
    the verdict is known, a captured call takes torch's sort. A torch.library custom op (``tsct::sort_by_expert``)
    under torch.compile (the verdict is asked when the compiled code first runs the op, not while tracing).

    With the kernels, the returned ``token`` tensor also carries the combine's index (each token's rows in sorted
    order, written by the same kernels): a ``grouped_glu`` that scatters through this very tensor with these
    ``offs`` uses it instead of sorting the targets itself (same result, ~0.25 ms less host time and a few
    microseconds of GPU time per forward at b1). A copy, an in-place change of either tensor, an inference-mode
    sort or a CUDA graph that did not capture this sort itself drops back to the sort; a write that bypasses the
    version counter (``.data``, DLPack) is not seen (docs/decisions/0015-routing-and-side-stream.md).
    """
    if not isinstance(topk_ids, Tensor):
        raise TypeError(f"sort_by_expert: topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise TypeError(f"sort_by_expert: topk_ids must be an integer tensor, got dtype {topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"sort_by_expert: topk_ids must be 2-D [T, k], got shape {tuple(topk_ids.shape)}")
    num_experts = _validate.as_int("sort_by_expert", "num_experts", num_experts)
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"sort_by_expert: num_experts must be in [1, {MAX_EXPERTS}], got {num_experts}")
    if topk_weights is not None:
        if not isinstance(topk_weights, Tensor) or topk_weights.dtype not in WEIGHT_DTYPES:
            what = topk_weights.dtype if isinstance(topk_weights, Tensor) else type(topk_weights).__name__
            raise TypeError(f"sort_by_expert: topk_weights must be a bfloat16, float16 or float32 tensor, got {what}")
        if topk_weights.shape != topk_ids.shape or topk_weights.device != topk_ids.device:
            raise ValueError(f"sort_by_expert: topk_weights must match topk_ids ({tuple(topk_ids.shape)} on "
                             f"{topk_ids.device}), got {tuple(topk_weights.shape)} on {topk_weights.device}")
    if _eager.direct_ok(topk_ids, topk_weights):  # a plain eager CUDA call skips the dispatcher's host time
        if topk_weights is not None and topk_weights.requires_grad and torch.is_grad_enabled():
            out = _SortByExpert.apply(topk_ids, num_experts, topk_weights)
        else:
            out = _eager.run("tsct::sort_by_expert", _impl, topk_ids, num_experts, topk_weights, True)
    else:
        out = _sort_by_expert_op(topk_ids, num_experts, topk_weights)
    order, offs, token, rw = out
    _validate.remember_sorted(token, offs, topk_ids.shape[0])  # grouped_glu then skips its host read of them
    return ExpertOrder(order, offs, token, rw if topk_weights is not None else None)


@torch.library.custom_op("tsct::sort_by_expert", mutates_args=())
def _sort_by_expert_op(topk_ids: Tensor, num_experts: int,
                       topk_weights: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(order, offs, token, row_weight); row_weight is an empty float32 tensor without topk_weights (an op
    returns tensors, not None)."""
    return _impl(topk_ids, num_experts, topk_weights)


@_sort_by_expert_op.register_fake
def _(topk_ids: Tensor, num_experts: int, topk_weights: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    m = topk_ids.shape[0] * topk_ids.shape[1]
    return (topk_ids.new_empty(m, dtype=torch.int64), topk_ids.new_empty(num_experts, dtype=torch.int32),
            topk_ids.new_empty(m, dtype=torch.int64),
            topk_ids.new_empty(m if topk_weights is not None else 0, dtype=torch.float32))


def _weights_grad(order: Tensor, grad_rw: Tensor, shape, dtype: torch.dtype) -> Tensor:
    """d topk_weights from d row_weight: row ``order[j]`` of the flattened weights got ``row_weight[j]``. order is a
    permutation of all T*k rows (padding rows included), so every entry is written once (deterministic)."""
    return grad_rw.new_empty(order.shape[0]).scatter_(0, order, grad_rw).reshape(shape).to(dtype)


def _setup_context(ctx, inputs, output) -> None:
    topk_ids, _, topk_weights = inputs
    ctx.set_materialize_grads(False)  # the index outputs get no gradient: no zero tensors made for them
    ctx.save_for_backward(output[0])
    ctx.weights = (topk_ids.shape, topk_weights.dtype) if topk_weights is not None else None


def _backward(ctx, g_order, g_offs, g_token, g_rw):
    if ctx.weights is None or g_rw is None:
        return None, None, None
    (order,) = ctx.saved_tensors
    return None, None, _weights_grad(order, g_rw, *ctx.weights)


_sort_by_expert_op.register_autograd(_backward, setup_context=_setup_context)


class _SortByExpert(torch.autograd.Function):
    """The eager direct route's autograd (the op's formula, without the dispatcher)."""

    @staticmethod
    def forward(ctx, topk_ids, num_experts, topk_weights):
        out = _impl(topk_ids, num_experts, topk_weights, True)
        ctx.mark_non_differentiable(out[0], out[1], out[2])
        ctx.set_materialize_grads(False)  # no zero tensors made for the index outputs' absent gradients
        ctx.save_for_backward(out[0])
        ctx.weights = (topk_ids.shape, topk_weights.dtype)
        return out

    backward = staticmethod(_backward)


def uses_kernels(topk_ids: Tensor, num_experts: int) -> bool:
    """Whether ``sort_by_expert`` runs the Triton kernels for these arguments (else torch's sort)."""
    from tsct.kernels.triton_common import route
    return topk_ids.is_cuda and route.fits(topk_ids.numel(), num_experts) and _kernels_serve(topk_ids.device)


def _impl(topk_ids: Tensor, num_experts: int, topk_weights: Optional[Tensor],
          direct: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``direct``: a plain eager call (``_eager.direct_ok``), which may replay (``tsct.config.eager_replay``)."""
    if uses_kernels(topk_ids, num_experts):
        from tsct.kernels.triton_common import route
        with _eager.on_device(topk_ids.device):
            order, offs, token, rw = route.sort_by_expert(topk_ids, num_experts, topk_weights,
                                                          replayed=direct and config.eager_replay)
    else:
        order, offs, token = sort_by_expert_torch(topk_ids, num_experts)
        rw = topk_weights.reshape(-1)[order].float() if topk_weights is not None else None
    return order, offs, token, rw if rw is not None else topk_ids.new_empty(0, dtype=torch.float32)


def sort_by_expert_torch(topk_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """(order, offs, token) in torch: the reference of the kernels, and the path where they do not run."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, device=flat.device, dtype=torch.int32)
    counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))  # bincount reads min / max on the host
    offs = torch.cumsum(counts[:num_experts], 0, dtype=torch.int32)
    return order, offs, torch.div(order, k, rounding_mode="floor")


def kernels_status(capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether the routing kernels can be launched on a GPU of ``capability`` (the triton-bf16 path's status: AOT
    cubins, or Triton JIT allowed and importable), and why (not). Says nothing about their first use there
    (``_first_use_ok``); the self-test child asks it before it runs them."""
    from tsct.kernels import triton_glu
    return triton_glu.status(capability, "bf16")


@functools.lru_cache(maxsize=None)
def _serves(capability: tuple[int, int], backend: str) -> bool:
    return kernels_status(capability)[0]


def _kernels_serve(device: torch.device) -> bool:
    """The Triton kernels run on this device: the triton-bf16 path's status says they can (AOT cubins, or JIT
    allowed and importable; cached per capability and ``TSCT_TRITON_BACKEND``), and they may run in this process
    (``_first_use_ok``: they executed on this arch class, or their self-test passed in a child process)."""
    cap = dispatch.device_capability(device)
    if cap is None or not _serves(tuple(cap), config.triton_backend()):
        return False
    return _first_use_ok(device, tuple(cap))


_NOT_YET = "no first-use verdict of the Triton routing kernels yet, and none is asked during a CUDA graph capture"


def _first_use_ok(device: torch.device, cap: tuple[int, int]) -> bool:
    """Whether the routing kernels may run on CUDA ``device`` (compute capability ``cap``) in this process.

    True without asking where they executed (``dispatch.EXECUTED_ON[dispatch.ROUTING]``: sm90) and inside a
    self-test child. Elsewhere (12.x included) the first call asks ``firstuse.gate`` for the verdict of their
    self-test (``tsct.selftest.sort_by_expert``) run in a CHILD process (cached in the process and on disk): this
    process never launches them before the child said "pass". Any other verdict: False (torch's sort serves, the
    same result), counted in ``dispatch.fallback_counts()`` and warned once per reason. While a CUDA graph is being
    captured no child is started: a verdict not known yet (in the process or on disk, ``firstuse.peek``) makes that
    call take torch's sort (the graph then replays torch's sort; counted and warned), and the next call outside a
    capture asks. Raises what torch raises for a bad device."""
    if not dispatch.needs_first_use(dispatch.ROUTING, cap) or firstuse.in_child(dispatch.ROUTING):
        return True
    if firstuse.in_child():  # another path's child: the gate says no without asking
        return firstuse.gate(dispatch.ROUTING, cap, firstuse.FAMILY_FMT, device.index).ok
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing() and firstuse.peek(index, dispatch.ROUTING, firstuse.FAMILY_FMT) is None:
        dispatch.note_fallback(dispatch.ROUTING, "torch", _NOT_YET,
                               f"tsct.ops.sort_by_expert: {_NOT_YET}: this capture holds torch's sort (the same "
                               "result); a call outside a capture asks. Counted in tsct.dispatch.fallback_counts().")
        return False
    st = firstuse.gate(dispatch.ROUTING, cap, firstuse.FAMILY_FMT, index)
    if not st.ok:
        dispatch.note_fallback(dispatch.ROUTING, "torch", st.reason,
                               f"tsct.ops.sort_by_expert: its Triton kernels do not run on this GPU ({st.reason}); "
                               "torch's sort serves instead (the same result). Counted in "
                               "tsct.dispatch.fallback_counts().")
    return st.ok
