"""Capacity placement of routed rows for the padded bmm (``PaddedBmmGLUExperts``, the benchmark's padded-bmm arm).

A capacity-padded expert pass gives every expert C row slots (``[E, C, d]``); the rows of an expert past its
C-th, in token order, are dropped. Everything here is sync-free on CUDA (no ``.item()``, no ``torch.bincount``,
which reads the min and max on the host, no boolean-mask indexing), so the pass can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

__all__ = ["Capacity", "capacity_slots", "expert_counts", "sort_key"]


def expert_counts(flat_ids: Tensor, experts: int) -> Tensor:
    """int32 ``[E]`` rows per expert of ``flat_ids`` (any integer dtype; values in ``[0, E)``); equals
    ``torch.bincount(flat_ids, minlength=E)`` but sync-free on CUDA."""
    counts = torch.zeros(experts, dtype=torch.int32, device=flat_ids.device)
    idx = flat_ids if flat_ids.dtype == torch.int64 else flat_ids.long()  # scatter takes int64 (or int32) indices
    return counts.scatter_add_(0, idx, torch.ones_like(flat_ids, dtype=torch.int32))


def sort_key(flat_ids: Tensor, experts: int) -> Tensor:
    """The expert ids in the narrowest integer type that holds them (int16 up to 32767 experts): the
    same stable order, but the radix sort makes 2 passes instead of 8 for int64 ids."""
    return flat_ids.to(torch.int16) if experts <= (1 << 15) - 1 else flat_ids


@dataclasses.dataclass
class Capacity:
    """Placement of the routed rows in a capacity-padded ``[E, C]`` grid (token-major row order).

    slot:   [M] int64, e*C + (rank of the row among its expert's rows, in token order); dropped rows
            (rank >= C) point at slot 0 and have ``keep`` 0
    keep:   [M] bool, the row fits in its expert's capacity
    src:    [E*C] int64, token feeding each slot; empty slots read token 0 (their output is never
            combined: they cost compute, and a non-finite token 0 reaches the weights' gradients through them
            unless the caller masks them, as ``PaddedBmmGLUExperts`` does)
    """

    slot: Tensor
    keep: Tensor
    src: Tensor


def capacity_slots(ids: Tensor, experts: int, capacity: int) -> Capacity:
    """Sync-free capacity assignment of top-k ids ``[T, k]`` (values in ``[0, experts)``): rows beyond an
    expert's ``capacity`` are dropped, earlier tokens first."""
    t, k = ids.shape
    m = t * k
    dev = ids.device
    flat = ids.reshape(-1).long()  # any integer dtype: slots are int64
    order = torch.argsort(sort_key(flat, experts), stable=True)
    counts = expert_counts(flat, experts).to(torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    sorted_e = flat[order]
    rank_sorted = torch.arange(m, device=dev) - starts[sorted_e]
    rank = torch.empty_like(rank_sorted).scatter_(0, order, rank_sorted)
    keep = rank < capacity
    dump = experts * capacity  # one extra slot that absorbs the dropped rows
    slot = torch.where(keep, flat * capacity + rank, torch.full_like(rank, dump))
    token = torch.div(torch.arange(m, device=dev), k, rounding_mode="floor")
    src = torch.zeros(dump + 1, dtype=torch.int64, device=dev).scatter_(0, slot, token)[:dump]
    return Capacity(slot=torch.where(keep, slot, torch.zeros_like(slot)), keep=keep, src=src)
