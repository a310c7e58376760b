"""Expert parallelism for ``GroupedGLUExperts`` on torch.distributed: experts sharded over the ranks of a process
group, tokens dispatched to their experts' ranks and the results combined back with ``all_to_all_single``.

No communication layer of tsct's own: the exchanges are torch's functional collectives
(``torch.distributed._functional_collectives.all_to_all_single[_autograd]``, what torchtitan's expert
parallelism uses), so NCCL on GPUs and gloo on CPUs serve it, and autograd runs the reverse exchanges in the
backward. How this fits FSDP2, torchtitan and Megatron: docs/distributed.md.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import _functional_collectives as funcol

from tsct.nn.experts import GroupedGLUExperts, compute_dtype

__all__ = ["ExpertParallelGLU"]


def _wait(t: Tensor) -> Tensor:
    """A collective's result as a plain tensor (no autograd involved: counts)."""
    return torch.ops._c10d_functional.wait_tensor(t)


class ExpertParallelGLU(nn.Module):
    """E = W * L dual-latent GLU experts sharded over the W ranks of ``group``: rank i holds experts
    ``[i*L, (i+1)*L)`` as a ``GroupedGLUExperts`` of L experts.

    ``forward(x, topk_ids, topk_weights)`` has the single-process layer's signature and result: every rank passes
    its own tokens and router output (global expert ids) and gets its tokens' combined ``[T, f]`` output. In it:

    1. sort the routed rows by global expert (``tsct.ops.sort_by_expert``); the rows for rank j are one
       contiguous block;
    2. exchange the per-expert row counts with ``all_to_all_single`` (on the device);
    3. exchange the rows with ``all_to_all_single`` (autograd: the backward sends the gradients back);
    4. run the local experts with ``grouped_glu`` straight on the receive buffer: a second ``sort_by_expert`` of
       the received rows' local expert ids gives the op its gather/scatter order and the rows' router weights
       (sent along with the rows, ``all_to_all_single``), which the op applies in its epilogue as the
       single-process layer's does; unused slots of the buffer are padding rows (zero output, zero gradient);
    5. send the weighted results back with ``all_to_all_single`` and sum each token's k rows (fp32 accumulation,
       one rounding), as the single-process layer's combine does.

    Args:
        experts: this rank's L experts (any storage; ``shard`` makes them from a full layer).
        group: the expert-parallel process group (default: the world).
        capacity: None: exact exchange, every routed row is sent; the split sizes of the row exchange are read on
            the host once per forward (one device-to-host copy, as torchtitan's ``ExpertParallel`` does).
            An int C: a static receive capacity; every rank sends exactly C row slots to every rank (rows past
            the C-th for one destination are DROPPED: zero output, like a capacity factor; unused slots carry
            zeros), so the split sizes are static and the step reads nothing on the host. ``T * k`` can never
            drop; ``ceil(cf * T * k / W)`` is the usual capacity-factor sizing.

    Attributes set by each forward (device tensors, read only when the caller reads them):
        kept: ``[T, k]`` bool, the routed rows that reached their expert (an id outside ``[0, E)``, or a row past
            the capacity, did not).
        dropped: 0-d int64, rows dropped for capacity on this rank.

    Timing hook (off by default): ``phase_hook``, when not None, is called as ``t = phase_hook(phase, t)`` where
    each phase of the forward starts, with the tensor the phase begins on: ``"dispatch"`` (the send buffer, before
    the exchanges of the router weights and the rows), ``"experts"`` (the received rows, before ``grouped_glu``),
    ``"combine"`` (the experts' output, before the return exchange), ``"sum"`` (the returned rows, before the k-row
    sum). It must return a tensor with t's values (an identity autograd Function that records a CUDA event in its
    forward and backward marks the backward's phases too; scripts/ep_run.py times the phases so). Off, it costs one
    ``is None`` test per phase.

    The ranks may differ in whether they pass ``topk_weights`` (none: weights of one, exact), not in which of ``x``
    and ``topk_weights`` require gradients: the backward's exchanges run where a gradient flows, and every rank must
    run them.

    Deterministic: the same inputs give the same bits on every run (the exchanges move data, every sum runs in
    a fixed order). Every rank of the group must call forward (and backward) together, as with any collective. The
    first eager forward (not one under torch.compile or CUDA-graph capture) checks that every rank holds the same
    number of experts of the same shape (one ``all_gather_object``): a ValueError naming each rank's (L, d, r, f)
    otherwise.
    """

    phase_hook: Optional[Callable[[str, Tensor], Tensor]] = None

    def __init__(self, experts: GroupedGLUExperts, group: Optional[dist.ProcessGroup] = None,
                 capacity: Optional[int] = None):
        super().__init__()
        if not isinstance(experts, GroupedGLUExperts):
            raise TypeError(f"ExpertParallelGLU: experts must be a GroupedGLUExperts, got {type(experts).__name__}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"ExpertParallelGLU: capacity must be a positive int or None, got {capacity!r}")
        self.experts = experts
        self.group = group if group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.num_experts = experts.num_experts * self.world_size
        self.capacity = capacity
        self.kept: Optional[Tensor] = None
        self.dropped: Optional[Tensor] = None
        self._agreed = False  # the ranks' expert banks checked against each other (the first forward)

    def _check_ranks_agree(self) -> None:
        """Every rank holds L experts of the same d, r, f (one small all-gather, on the first forward): ranks whose
        banks differ would exchange buffers of different sizes, which gloo aborts on and NCCL may hang on.
        ValueError naming what differs."""
        e = self.experts
        mine = (e.num_experts, e.d, e.r, e.f)
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.group)
        if any(tuple(o) != mine for o in everyone):
            raise ValueError(f"ExpertParallelGLU: every rank must hold the same number of experts of the same shape "
                             f"(L, d, r, f); the ranks hold {[tuple(o) for o in everyone]} (shard a full layer with "
                             f"ExpertParallelGLU.shard, which needs E divisible by the ranks)")
        self._agreed = True

    @classmethod
    def shard(cls, full: GroupedGLUExperts, group: Optional[dist.ProcessGroup] = None,
              capacity: Optional[int] = None) -> "ExpertParallelGLU":
        """This rank's share of a full layer (same E, storage, impl, activations, frozen form): experts
        ``[rank*L, (rank+1)*L)``, every parameter and packed buffer sliced along E (copied).

        Raises:
            ValueError: E is not a multiple of the group's size.
        """
        group = group if group is not None else dist.group.WORLD
        w, i = dist.get_world_size(group), dist.get_rank(group)
        if full.num_experts % w:
            raise ValueError(f"ExpertParallelGLU.shard: E = {full.num_experts} experts do not split evenly over "
                             f"{w} ranks")
        n = full.num_experts // w
        params = list(full.parameters())  # none in a frozen layer without scales: its buffers give the device
        device = params[0].device if params else next(full.buffers()).device
        local = GroupedGLUExperts(n, full.d, full.r, full.f, storage=full.storage, frozen=full.frozen,
                                  scales=full.s_gate is not None, impl=full.impl, activations=full.activations,
                                  device=device, dtype=params[0].dtype if params else None)
        with torch.no_grad():
            local.load_state_dict({k: v[i * n:(i + 1) * n].clone() for k, v in full.state_dict().items()})
        return cls(local, group, capacity)

    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Optional[Tensor] = None) -> Tensor:
        """``[T, d]`` tokens and their ``[T, k]`` global expert ids and router weights in, ``[T, f]`` out (the
        compute dtype); as ``GroupedGLUExperts.forward`` over all E experts, less the dropped rows."""
        from tsct.ops import sort_by_expert

        local, hook = self.experts, self.phase_hook
        local._check_routing(x, topk_ids, topk_weights)
        if not self._agreed and not torch.compiler.is_compiling() and not (
                x.is_cuda and torch.cuda.is_current_stream_capturing()):  # (then on the first eager forward)
            self._check_ranks_agree()
        w_, n_local, e_all = self.world_size, local.num_experts, self.num_experts
        t, k = topk_ids.shape
        m, d, dev = t * k, local.d, x.device
        x = x.to(compute_dtype(x))

        # 1. the routed rows by global expert; rank j's rows are sorted rows [rank_start[j], rank_end[j])
        s = sort_by_expert(topk_ids, e_all)
        offs = s.offs.to(torch.int64)
        counts = torch.diff(offs, prepend=offs.new_zeros(1))
        rank_end = offs.view(w_, n_local)[:, -1]
        rank_start = rank_end - counts.view(w_, n_local).sum(1)
        row = torch.arange(m, device=dev)
        expert = torch.searchsorted(offs, row, right=True)  # E for the rows of ids outside [0, E)
        valid = expert < e_all
        dest = torch.clamp(expert // n_local, max=w_ - 1)
        rank_in_dest = row - rank_start[dest]
        cap = self.capacity
        if cap is not None:
            kept = valid & (rank_in_dest < cap)
            # rows of each expert that fit in its rank's first C slots
            first = (offs - counts)
            limit = rank_start.repeat_interleave(n_local) + cap
            sent_counts = torch.clamp(torch.minimum(offs, limit) - first, min=0)
            slot_sorted = torch.where(kept, dest * cap + rank_in_dest, w_ * cap)
        else:
            kept = valid
            sent_counts = counts
            slot_sorted = torch.where(valid, row, offs[-1])  # dump: the slot past the sent rows

        # 2. counts: recv_counts[j, l] = rows rank j sends to local expert l
        recv_counts = _wait(funcol.all_to_all_single(sent_counts, None, None, self.group)).view(w_, n_local)
        if cap is not None:
            send_sizes = recv_sizes = [cap] * w_
            block_size = torch.full((w_,), cap, dtype=torch.int64, device=dev)
        else:
            sizes = torch.cat([rank_end - rank_start, recv_counts.sum(1)]).tolist()  # the one host read
            send_sizes, recv_sizes = sizes[:w_], sizes[w_:]
            block_size = recv_counts.sum(1)
        n_send = sum(send_sizes)

        # 3. rows (and their router weights) to their experts' ranks: token-major routed row i goes to slot
        # slot_of[i] (dropped: a dump slot); index_copy, whose backward is a gather: deterministic
        slot_of = torch.empty_like(slot_sorted).scatter_(0, s.order, slot_sorted)

        def to_slots(rows: Tensor) -> Tensor:  # [m, c] token-major -> [n_send, c] send buffer (unused slots: 0)
            return rows.new_zeros(n_send + 1, rows.shape[1]).index_copy(0, slot_of, rows)[:n_send]

        send = to_slots(x.unsqueeze(1).expand(t, k, d).reshape(m, d))
        if hook is not None:
            send = hook("dispatch", send)
        # ones without router weights (exact), with a gradient like the others' (discarded): every rank runs the
        # same collectives, forward and backward, whether its caller passed weights or not
        w_send = to_slots(topk_weights.reshape(m, 1).float() if topk_weights is not None
                          else torch.ones(m, 1, device=dev, dtype=torch.float32, requires_grad=torch.is_grad_enabled()))
        w_recv = funcol.all_to_all_single_autograd(w_send, recv_sizes, send_sizes, self.group)
        recv = funcol.all_to_all_single_autograd(send, recv_sizes, send_sizes, self.group)

        # 4. local experts on the receive buffer: received row p of source block j belongs to local expert l if it
        # lies in segment (j, l); segment (j, L) is the block's unused tail (padding rows, id L)
        n_recv = sum(recv_sizes)
        block_start = torch.cumsum(block_size, 0) - block_size
        seg_end = torch.cat([block_start.unsqueeze(1) + torch.cumsum(recv_counts, 1),
                             (block_start + block_size).unsqueeze(1)], 1).reshape(-1)
        seg = torch.searchsorted(seg_end, torch.arange(n_recv, device=dev), right=True)
        key = torch.remainder(seg, n_local + 1).unsqueeze(1)
        so = sort_by_expert(key, n_local, w_recv)
        if hook is not None:
            recv = hook("experts", recv)
        y = local.grouped_glu(recv, so.offs, row_weight=so.row_weight, gather_idx=so.token, scatter_idx=so.token,
                              num_out_rows=n_recv)
        if hook is not None:
            y = hook("combine", y)

        # 5. the weighted rows back; each token's k rows summed (fp32 accumulation, one rounding; dropped rows read
        # the zero row)
        back = funcol.all_to_all_single_autograd(y, send_sizes, recv_sizes, self.group)
        if hook is not None:
            back = hook("sum", back)
        back = torch.cat([back, back.new_zeros(1, back.shape[1])])
        kept_tok = torch.empty_like(kept).scatter_(0, s.order, kept)
        self.kept = kept_tok.view(t, k)
        self.dropped = (valid & ~kept).sum()
        return back.index_select(0, slot_of).view(t, k, local.f).sum(1).to(x.dtype)  # bf16: fp32 accumulation

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, world_size={self.world_size}, rank={self.rank}, "
                f"capacity={self.capacity}")
