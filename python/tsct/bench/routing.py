"""Router outputs for the benchmark, and the sync-free index work every arm does inside its timed span.

``route`` makes the INPUT of the expert pass (not timed): top-k expert ids ``[T, k]`` and their
weights ``[T, k]``. ``sort_by_expert`` and ``capacity_slots`` are what the arms do INSIDE the timed
pass; they use no host reads of device values (no ``.item()``, no ``torch.bincount``, which reads the
min and max on the host on CUDA, no boolean-mask indexing), so the pass is sync-free. The tsct arms sort with
``tsct.ops.sort_by_expert`` instead (same result, fewer kernels); the torch arms keep this torch version, what a
user's code without tsct runs.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


def route(tokens: int, experts: int, topk: int, *, routing: str = "softmax", zipf_exponent: float = 1.2,
          generator: torch.Generator, device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Top-k ids (int64 ``[T, k]``) and weights (``dtype`` ``[T, k]``) of a random router.

    softmax: logits ~ N(0, 1) per (token, expert); experts are equally popular on average.
    zipf: logits = log(p_e) + Gumbel noise with p_e ~ (popularity rank of e)^-zipf_exponent over a random
        permutation of the experts; the top-k of such logits is a draw of k distinct experts without
        replacement with probabilities p (the Gumbel-top-k trick), so the expert loads are Zipf-skewed
        and the unpopular experts often get 0 rows.
    Both: probabilities = softmax(logits) over the E experts, the top k are kept and renormalised to sum
    to 1 per token (Mixtral-style), then cast to ``dtype`` (the activation dtype, as HF MoE code does).
    """
    if routing == "softmax":
        logits = torch.randn(tokens, experts, generator=generator, device=device, dtype=torch.float32)
    elif routing == "zipf":
        perm = torch.argsort(torch.rand(experts, generator=generator, device=device, dtype=torch.float32))
        rank = perm.to(torch.float32) + 1.0  # popularity rank of each expert, a random permutation of 1..E
        log_p = -zipf_exponent * torch.log(rank)
        u = torch.rand(tokens, experts, generator=generator, device=device, dtype=torch.float32)
        gumbel = -torch.log(-torch.log(u.clamp_(1e-20, 1.0 - 1e-7)))
        logits = log_p + gumbel
    else:
        raise ValueError(f"routing must be 'softmax' or 'zipf', got {routing!r}")
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, topk, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return ids.to(torch.int64).contiguous(), w.to(dtype).contiguous()


@dataclasses.dataclass
class Sorted:
    """The routed rows sorted by expert (stable: ties keep token order).

    order:   [M] int64, position in the flattened token-major ``ids`` of each sorted row
    offs:    [E] int32 cumulative END offsets (grouped_mm convention)
    token:   [M] int64, token of each sorted row (``gather_idx`` and ``scatter_idx`` of the op)
    expert:  [M] int64, expert of each sorted row (computed on first use: the tsct arms never read it,
             and in the timed pass every kernel counts)
    """

    order: Tensor
    offs: Tensor
    token: Tensor
    flat_ids: Tensor

    @property
    def expert(self) -> Tensor:
        return self.flat_ids[self.order]


def expert_counts(flat_ids: Tensor, experts: int) -> Tensor:
    """int32 ``[E]`` rows per expert; equals ``torch.bincount(flat_ids, minlength=E)`` but sync-free on CUDA."""
    counts = torch.zeros(experts, dtype=torch.int32, device=flat_ids.device)
    return counts.scatter_add_(0, flat_ids, torch.ones_like(flat_ids, dtype=torch.int32))


def sort_key(flat_ids: Tensor, experts: int) -> Tensor:
    """The expert ids in the narrowest integer type that holds them (int16 up to 32767 experts): the
    same stable order, but the radix sort makes 2 passes instead of 8 for int64 ids."""
    return flat_ids.to(torch.int16) if experts <= (1 << 15) - 1 else flat_ids


def sort_by_expert(ids: Tensor, experts: int) -> Sorted:
    """Stable argsort of the flattened ids, offs = int32 cumsum of the per-expert counts. Sync-free."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(sort_key(flat, experts), stable=True)
    offs = torch.cumsum(expert_counts(flat, experts), 0, dtype=torch.int32)
    return Sorted(order=order, offs=offs, token=torch.div(order, k, rounding_mode="floor"), flat_ids=flat)


def inverse_permutation(order: Tensor) -> Tensor:
    """``inv`` with ``inv[order[i]] = i`` (scatter, sync-free)."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


@dataclasses.dataclass
class Capacity:
    """Placement of the routed rows in a capacity-padded ``[E, C]`` grid (token-major row order).

    slot:   [M] int64, e*C + (rank of the row among its expert's rows, in token order); dropped rows
            (rank >= C) point at slot 0 and have ``keep`` 0
    keep:   [M] bool, the row fits in its expert's capacity
    src:    [E*C] int64, token feeding each slot; empty slots read token 0 (their output is never
            combined, so they cost compute but not correctness, like the zero rows of a zero-filled buffer)
    """

    slot: Tensor
    keep: Tensor
    src: Tensor


def capacity_slots(ids: Tensor, experts: int, capacity: int) -> Capacity:
    """Sync-free capacity assignment: rows beyond an expert's capacity are dropped, earlier tokens first."""
    t, k = ids.shape
    m = t * k
    dev = ids.device
    flat = ids.reshape(-1)
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
