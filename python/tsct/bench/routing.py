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

# the padded bmm's placement lives with the layer that runs it; the benchmark times the same code
from tsct.nn.capacity import Capacity, capacity_slots, expert_counts, sort_key  # noqa: F401


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
