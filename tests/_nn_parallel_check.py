"""Multi-process checks of tsct.nn on torch.distributed, shared by the CPU (gloo) and GPU (NCCL) tests.

``spawn(check, world, backend)`` runs ``check(rank, world, device)`` in ``world`` fresh processes joined by a
file rendezvous (no port to race for); an assertion in any rank fails the caller with that rank's traceback.
Every rank rebuilds every rank's inputs from seeds, so each can compute the single-process reference of the whole
step by itself.
"""

from __future__ import annotations

import copy
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tsct.nn import GroupedGLUExperts
from tsct.nn.parallel import ExpertParallelGLU

D, R, F, K = 64, 16, 63, 2


def _entry(rank, world, backend, init, check):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        check(rank, world, device)
        # every rank done before any tears down: a gloo rank that exits while a peer still reads from it makes the
        # peer's transport thread throw (Connection closed by peer) and abort its process
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # every rank passed and the group is gone: leave without interpreter finalization, where a gloo worker thread
    # that still holds tensors can abort the process (SIGABRT, "terminate called without an active exception"; seen
    # under load; pytorch/pytorch#179291 describes the finalization race). Exit code 0 is what spawn checks.
    os._exit(0)


def spawn(check, world: int, backend: str = "gloo") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_entry, args=(world, backend, init, check), nprocs=world, join=True)


def run_cases(rank, world, device, cases):
    """Run ``fn(rank, world, device, **kw)`` for each ``(fn, kw)`` of ``cases`` in turn (a spawn target)."""
    for fn, kw in cases:
        if isinstance(kw.get("dtype"), str):
            kw = dict(kw, dtype=getattr(torch, kw["dtype"]))
        fn(rank, world, device, **kw)


def full_layer(e, device, storage="bf16", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = GroupedGLUExperts(e, D, R, F, storage=storage, device=device, dtype=dtype)
    with torch.no_grad():
        m.s_gate.uniform_(0.5, 1.5)
        m.s_up.uniform_(0.5, 1.5)
    return m


def tokens(j, e, device, dtype=torch.float32):
    """Rank j's inputs: (x [T_j, d], ids [T_j, k], weights [T_j, k], grad_out [T_j, f]); T_j differs per rank
    and is 0 for rank 3; one choice is dropped (id -1)."""
    t = 0 if j == 3 else 37 + 11 * j
    g = torch.Generator().manual_seed(100 + j)
    x = torch.randn(t, D, generator=g)
    p = torch.softmax(torch.randn(t, e, generator=g), -1)
    w, ids = p.topk(K)
    if t:
        ids[0, 1] = -1
    go = torch.randn(t, F, generator=g)
    return x.to(device, dtype), ids.to(device), w.to(device, dtype), go.to(device, dtype)


def rel(a, b):
    a, b = a.double(), b.double()
    n = b.norm()
    return ((a - b).norm() / n).item() if n > 0 else (a - b).norm().item()


def reference(full, inputs, masks=None):
    """The single-process layer on every rank's tokens: (outputs, x grads, weight grads, parameter grads) of
    sum_j <y_j, grad_out_j>; ``masks[j]`` ([T_j, k] bool) drops routed rows (id -1)."""
    ref = copy.deepcopy(full)
    ys, gx, gw = [], [], []
    for j, (x, ids, w, go) in enumerate(inputs):
        x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if masks is not None:
            ids = torch.where(masks[j], ids, -1)
        y = ref(x, ids, w)
        (y.float() * go.float()).sum().backward()
        ys.append(y.detach())
        gx.append(x.grad)
        gw.append(w.grad)
    return ys, gx, gw, {n: p.grad for n, p in ref.named_parameters()}


def _ep_step(ep, x, ids, w, go):
    ep.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True) if w is not None else None
    y = ep(x, ids, w)
    (y.float() * go.float()).sum().backward()
    return [y.detach(), x.grad, w.grad if w is not None else None] + [p.grad.clone() for p in ep.experts.parameters()]


def check_expert_parallel(rank, world, device, *, storage="bf16", dtype=torch.float32, capacity="exact",
                          frozen=False, tol=1e-5, sync_free=False, unweighted=-1):
    """ExpertParallelGLU against the single-process layer: outputs, x and router-weight gradients of this rank's
    tokens, and this rank's expert-parameter gradients (summed over every rank's tokens); twice, same bits.

    capacity: "exact" (host-read split sizes), "static" (max T*k slots: nothing can drop) or "tight" (a capacity that
    drops rows; the reference drops the same rows, as ``ep.kept`` reports them). sync_free (CUDA, static capacity):
    a third step, with the op's value checks off, runs under ``torch.cuda.set_sync_debug_mode("error")``.
    unweighted: the rank that passes no router weights (its reference: weights of one; its exchanges are the same)."""
    e = 4 * world
    full = full_layer(e, device, storage, dtype)
    if frozen:
        full.freeze()
    inputs = [tokens(j, e, device, dtype) for j in range(world)]
    if 0 <= unweighted < world:  # every rank's reference gives that rank's tokens weights of one
        xu, iu, wu, gu = inputs[unweighted]
        inputs[unweighted] = (xu, iu, torch.ones_like(wu), gu)
    x, ids, w, go = inputs[rank]
    if rank == unweighted:
        w = None
    # a static capacity is one number for the whole group: the largest T * k can never drop
    cap = {"exact": None, "static": max(i[1].numel() for i in inputs), "tight": 6}[capacity]
    ep = ExpertParallelGLU.shard(full, capacity=cap)
    assert ep.num_experts == e and ep.experts.num_experts == 4
    got = _ep_step(ep, x, ids, w, go)
    again = _ep_step(ep, x, ids, w, go)
    for a, b in zip(got, again):  # deterministic
        assert (a is None and b is None) or torch.equal(a, b)
    if sync_free:
        from tsct import config

        assert device.type == "cuda" and cap is not None
        checks, config.check_values = config.check_values, False
        torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
        try:
            third = _ep_step(ep, x, ids, w, go)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            config.check_values = checks
        for a, b in zip(got, third):
            assert (a is None and b is None) or torch.equal(a, b)
    masks = None
    if capacity == "tight":
        masks = [None] * world
        dist.all_gather_object(masks, ep.kept.cpu())
        masks = [mk.to(device) for mk in masks]
        assert sum(int((~mk).sum()) for mk in masks) > world - 1  # rows beyond the -1 ids were dropped
        assert int(ep.dropped) == int((~ep.kept).sum()) - (1 if ids.numel() else 0)
    else:
        assert int(ep.dropped) == 0
    ys, gx, gw, gp = reference(full, inputs, masks)
    assert got[0].shape == ys[rank].shape and got[0].dtype == ys[rank].dtype
    checks = {"y": (got[0], ys[rank]), "x.grad": (got[1], gx[rank])}
    if rank != unweighted:
        checks["w.grad"] = (got[2], gw[rank])
    lo = rank * 4
    for (name, p), g in zip(ep.experts.named_parameters(), got[3:]):
        checks[name + ".grad"] = (g, gp[name][lo:lo + 4])
    for name, (a, b) in checks.items():
        assert a.shape == b.shape, name
        if b.numel():
            assert rel(a, b) < tol, (name, rel(a, b))


def check_ranks_must_agree(rank, world, device):
    """Ranks whose expert banks differ (L experts here, L + 1 on rank 0: E split unevenly by hand) get a ValueError
    naming every rank's (L, d, r, f) on the first forward, before any exchange (gloo aborted the process on the
    mismatched buffer sizes; NCCL may hang)."""
    import re

    import pytest

    torch.manual_seed(0)
    ep = ExpertParallelGLU(GroupedGLUExperts(2 + (rank == 0), D, R, F, device=device))
    x, ids, w, _ = tokens(rank, 2 * world + 1, device, torch.float32)
    held = [(3 if j == 0 else 2, D, R, F) for j in range(world)]
    with pytest.raises(ValueError, match="every rank must hold the same number of experts .* the ranks hold "
                                         + re.escape(str(held))):
        ep(x, ids, w)


def check_fsdp2(rank, world, device, *, storage="bf16", steps=2, tol=1e-5):
    """FSDP2 ``fully_shard`` of the layer's parameters along E (E = 6: uneven shards at 4 ranks): outputs, the
    averaged gradients and the parameters after ``steps`` SGD steps match single-process training on all ranks'
    tokens (for low-bit storage this also shows the straight-through masters re-quantized after each step)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    e = 6
    full = full_layer(e, device, storage)
    ref = copy.deepcopy(full)
    mesh = init_device_mesh(device.type, (world,))
    fully_shard(full, mesh=mesh)
    for p in full.parameters():
        assert isinstance(p, DTensor) and p.placements[0].dim == 0  # sharded along E
    opt = torch.optim.SGD(full.parameters(), lr=0.5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(steps):
        inputs = [tokens(j + 7 * step, e, device) for j in range(world)]
        x, ids, w, go = inputs[rank]
        y = full(x, ids, w)
        (y * go).sum().backward()
        ref_loss = 0
        ys = []
        for xj, idsj, wj, goj in inputs:
            yj = ref(xj, idsj, wj)
            ys.append(yj.detach())
            ref_loss = ref_loss + (yj * goj).sum()
        (ref_loss / world).backward()  # FSDP2 averages the gradients over the ranks
        if ys[rank].numel():
            assert rel(y.detach(), ys[rank]) < tol, ("y", step, storage, rel(y.detach(), ys[rank]))
        for (name, p), q in zip(full.named_parameters(), ref.parameters()):
            assert rel(p.grad.full_tensor(), q.grad) < tol, (name, step)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for (name, p), q in zip(full.named_parameters(), ref.parameters()):
        assert rel(p.full_tensor(), q.detach()) < tol, (name, "after the steps")
