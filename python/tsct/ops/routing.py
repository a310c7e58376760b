"""``tsct.ops.sort_by_expert``: the routed rows of a top-k router sorted by expert, as ``grouped_glu`` takes them.

One custom op, ``tsct::sort_by_expert`` (so torch.compile(fullgraph=True) sees it), with a fake implementation
that gives shapes only. On a GPU that the Triton kernels serve it is a stable counting sort in three launches
(``tsct.kernels.triton_glu.route``); elsewhere the same result from torch (``argsort`` and a sync-free count).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
from torch import Tensor

from tsct.ops import _eager

MAX_EXPERTS = 1 << 20  # the kernels sort (expert, row in chunk) pairs packed in int32 (specs.ROUTE_B rows a chunk)


class ExpertOrder(NamedTuple):
    """The routed rows sorted by expert (``sort_by_expert``). M = T * k rows.

    order: ``[M]`` int64, index into ``topk_ids.reshape(-1)`` of each sorted row (the router weights of the
        sorted rows are ``topk_weights.reshape(-1)[order]``, differentiable).
    offs: ``[E]`` int32 cumulative END offsets (``grouped_glu``'s ``offs``).
    token: ``[M]`` int64, ``order // k``: the token of each sorted row (``grouped_glu``'s ``gather_idx`` and
        ``scatter_idx``).
    """

    order: Tensor
    offs: Tensor
    token: Tensor


def sort_by_expert(topk_ids: Tensor, num_experts: int) -> ExpertOrder:
    """Sort the routed rows of a top-k router by expert, stably, without host synchronisation.

    Row ``i`` of the flattened ``topk_ids`` (token ``i // k``, choice ``i % k``) is routed to expert
    ``topk_ids.reshape(-1)[i]``. The rows come out grouped by expert in increasing expert order and, within an
    expert, in increasing ``i`` (the order of ``torch.argsort(ids.reshape(-1), stable=True)``). An id outside
    ``[0, num_experts)`` (for example -1 for a dropped choice) makes its row a padding row: such rows come last,
    after ``offs[-1]``, where ``grouped_glu`` gives them zero output and zero gradient.

    Typical use (design.md section 2)::

        s = tsct.ops.sort_by_expert(ids, E)                       # ids [T, k] from the router's top-k
        out = grouped_glu(x, s.offs, w_gate, w_up, w_down, row_weight=weights.reshape(-1)[s.order],
                          gather_idx=s.token, scatter_idx=s.token, num_out_rows=x.shape[0])

    Args:
        topk_ids: ``[T, k]`` integer tensor (any integer dtype) on any device.
        num_experts: E >= 1, at most 2**20.

    Returns:
        ``ExpertOrder(order, offs, token)``: int64 ``[T*k]``, int32 ``[E]``, int64 ``[T*k]``, on
        ``topk_ids.device``.

    Raises:
        TypeError: ``topk_ids`` is not an integer tensor, or ``num_experts`` not an int.
        ValueError: ``topk_ids`` is not 2-D, or ``num_experts`` is out of range.

    On CUDA: three kernel launches (Triton, from the wheel's cubins or JIT) where the Triton kernels serve the
    device (on an arch our tests have not run them on, after a first-use self-test against torch), else
    torch's ``argsort`` and a ``scatter_add`` count (the same result). Sync-free and CUDA-graph safe either
    way. Not differentiable (integer outputs).
    """
    if not isinstance(topk_ids, Tensor):
        raise TypeError(f"topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids must be an integer tensor, got dtype {topk_ids.dtype}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [T, k], got shape {tuple(topk_ids.shape)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise TypeError(f"num_experts must be an int, got {type(num_experts).__name__}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts must be in [1, {MAX_EXPERTS}], got {num_experts}")
    if _eager.direct_ok(topk_ids):  # a plain eager CUDA call skips the dispatcher's host time (ops/_eager.py)
        return ExpertOrder(*_eager.run("tsct::sort_by_expert", _impl, topk_ids, num_experts))
    return ExpertOrder(*_sort_by_expert_op(topk_ids, num_experts))


@torch.library.custom_op("tsct::sort_by_expert", mutates_args=())
def _sort_by_expert_op(topk_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    return _impl(topk_ids, num_experts)


def _impl(topk_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    if topk_ids.is_cuda and _kernels_serve(topk_ids.device):
        from tsct.kernels.triton_glu import route
        return route.sort_by_expert(topk_ids, num_experts)
    return sort_by_expert_torch(topk_ids, num_experts)


@_sort_by_expert_op.register_fake
def _(topk_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    m = topk_ids.shape[0] * topk_ids.shape[1]
    return (topk_ids.new_empty(m, dtype=torch.int64), topk_ids.new_empty(num_experts, dtype=torch.int32),
            topk_ids.new_empty(m, dtype=torch.int64))


def sort_by_expert_torch(topk_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """The same result in torch: the reference of the kernels, and the path where they do not run."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, device=flat.device, dtype=torch.int32)
    counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))  # bincount reads min / max on the host
    offs = torch.cumsum(counts[:num_experts], 0, dtype=torch.int32)
    return order, offs, torch.div(order, k, rounding_mode="floor")


@functools.lru_cache(maxsize=None)
def _serves(capability: tuple[int, int], backend: str) -> bool:
    from tsct.kernels import triton_glu
    return triton_glu.status(capability, "bf16")[0]


_self_tested: dict[str, bool] = {}  # arch class -> the kernels agreed with torch in this process


def _kernels_serve(device: torch.device) -> bool:
    """The Triton kernels run on this device: the triton-bf16 path's status says they can (AOT cubins, or JIT
    allowed and importable; cached per capability and ``TSCT_TRITON_BACKEND``), and either they have been
    executed on this arch class by our tests (``dispatch.EXECUTED_ON``) or a first-use self-test against the
    torch path passed in this process. While a CUDA graph is captured an untested arch takes the torch path
    (a self-test reads results on the host)."""
    from tsct import dispatch
    cap = dispatch.device_capability(device)
    if cap is None or not _serves(tuple(cap), os.environ.get("TSCT_TRITON_BACKEND", "")):
        return False
    cls = dispatch.arch_class(tuple(cap))
    if cls in dispatch.EXECUTED_ON[dispatch.TRITON_BF16]:
        return True
    if cls not in _self_tested:
        if torch.cuda.is_current_stream_capturing():
            return False
        _self_tested[cls] = _self_test(device)
    return _self_tested[cls]


def _self_test(device: torch.device) -> bool:
    from tsct.kernels.triton_glu import route
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(-1, 37, (3001, 2), generator=g, device=device)
    try:
        got = route.sort_by_expert(ids, 35)
    except Exception:  # a kernel that does not load or launch here: the torch path
        return False
    return all(torch.equal(a, b) for a, b in zip(got, sort_by_expert_torch(ids, 35)))
