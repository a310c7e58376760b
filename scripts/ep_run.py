#!/usr/bin/env python3
"""Expert parallelism at the b1 shape: ``tsct.nn.ExpertParallelGLU`` over W processes, checked against the
single-process layer and timed phase by phase, forward and backward.

    python3 scripts/ep_run.py --world 2 --json ep_w2.json              2 GPUs over NCCL, b1 per GPU
    python3 scripts/ep_run.py --world 1 --json ep_w1.json              the same per-rank work on one GPU
    python3 scripts/ep_run.py --device cpu --small --world 2           2 CPU processes over gloo (CI)

Launch: the script starts its W processes itself (``torch.multiprocessing.spawn``, one per GPU, rendezvous through
a file in a temporary directory, so there is no port to pick or race for); no torchrun. NCCL_NVLS_ENABLE=0 (NVLink
SHARP multicast off) is set before any process group starts; the JSON records every NCCL_* variable.

Shape (defaults: the bench's b1 preset, ``tsct.bench.config.PRESETS``; --small: its small preset; each value can be
overridden): T tokens PER RANK routed by the bench's router (``tsct.bench.routing.route``, softmax, top-k), E experts
IN ALL split evenly (rank i holds ``[i*E/W, (i+1)*E/W)``), d, r, f, dtype; dense factors (storage bf16) with scales
drawn from U(0.5, 1.5). Rank j's inputs (x, ids, weights, grad_out) come from seed ``(seed, j)`` on the CPU, so every
rank rebuilds every rank's inputs; the full layer is initialised on the CPU from ``seed``, the same on every rank.

Correctness (with ``tsct.config.check_values`` on): the single-process ``GroupedGLUExperts`` holding all E experts,
run on all ranks' tokens at once, is the reference. Each rank's output, x and router-weight gradients and its
experts' parameter gradients (summed over every rank's tokens) must be within rel. Frobenius TOL (bf16: 1e-2, fp32:
1e-5) of the reference's share; a second step, and the last step timed with the phase marks on, must give the same
bits as the first.

Timing (``check_values`` off, as tsct-bench times; ``warmup`` untimed steps, then ``iters`` timed steps, median,
p10, p90 per rank via ``tsct.bench.measure.stats``): a step is forward plus ``backward(grad_out)``.
  - ``ep_phases``: stamps at the phase boundaries (``ExpertParallelGLU.phase_hook`` with an identity autograd
    Function, so the backward's boundaries are stamped when the gradients pass them): route (sort by expert, count
    exchange, the host read of the split sizes, the send buffer), dispatch (the router weights' and the rows'
    all-to-all; the local sort of the received rows, which needs only the counts, runs meanwhile), experts
    (``grouped_glu``, which applies the weights), combine (return all-to-all), sum (each token's k returned rows);
    the backward in reverse. CUDA: events on the compute stream; a mark first waits for a pending collective, so an
    exchange ends when its rows are usable.
    CPU: the host clock at the same points (CPU work is synchronous).
    Why events and not a profiler's kernel sums: the phases tile the step, so they add up to the step's time and
    every stall is charged to the phase it delays (an all-to-all waiting for a slower rank, the host read, launch
    gaps); kernel sums leave the gaps out, and tell the dispatch exchange from the combine only by their order.
  - ``ep``: forward, backward and step with the hook off; ``ep_marked_step``: with it on (the difference is what
    the marks cost).
  - ``layer``: the single-process layer (all E experts, no exchange) on this rank's T tokens.
Bytes per rank per step: measured from the buffers given to the row exchanges (rows x d for dispatch, rows x f for
combine, x the element size; the backward sends each gradient back the way its value came) plus the [E] int64
counts; the rows to and from other ranks follow from the routing (``rows_sent_to``, ``rows_received_from``).
A run kept under bench/results/ is named by date, device and short commit: ``2026-12-05_h200x2_ep_<sha>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import _functional_collectives as funcol

from tsct import config as tsct_config
from tsct.bench import measure
from tsct.bench.config import DTYPES, PRESETS
from tsct.bench.routing import route
from tsct.nn import GroupedGLUExperts
from tsct.nn.parallel import ExpertParallelGLU

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}  # NVLink SHARP multicast off: the two-GPU machines require it
TOL = {"bf16": 1e-2, "fp32": 1e-5}
SHAPE = ("tokens", "topk", "experts", "d", "r", "f")
PHASES = ("route", "dispatch", "experts", "combine", "sum")  # forward order; the backward runs them reversed


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="processes, one per GPU (default 2)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="the bench's small preset instead of b1")
    for name in SHAPE:
        p.add_argument("--" + name, type=int, help="override the preset (tokens: per rank; experts: in all)")
    p.add_argument("--dtype", choices=tuple(TOL))
    p.add_argument("--warmup", type=int)
    p.add_argument("--iters", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results there")
    a = p.parse_args(argv)
    preset = PRESETS["small" if a.small else "b1"]
    for name in SHAPE + ("dtype", "warmup", "iters"):
        if getattr(a, name) is None:
            setattr(a, name, preset[name])
    for name in SHAPE + ("world", "warmup", "iters"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.experts % a.world:
        p.error(f"--experts {a.experts} must split evenly over --world {a.world} ranks")
    if a.topk > a.experts:
        p.error(f"--topk {a.topk} must not exceed --experts {a.experts}")
    if a.json is not None:  # checked now, not after the run: rank 0 writes it last
        out_dir = os.path.dirname(os.path.abspath(a.json))
        if os.path.isdir(a.json) or not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
            p.error(f"--json {a.json}: not a file in a writable directory")
    if a.device == "cuda" and torch.cuda.device_count() < a.world:
        p.error(f"--world {a.world} needs {a.world} CUDA GPUs, {torch.cuda.device_count()} visible")
    return a


def rank_inputs(j: int, a, device):
    """Rank j's (x [T, d], topk_ids [T, k] int64, topk_weights [T, k], grad_out [T, f]), drawn on the CPU."""
    dt = DTYPES[a.dtype]
    g = torch.Generator().manual_seed((a.seed << 20) + j)
    ids, w = route(a.tokens, a.experts, a.topk, generator=g, device="cpu", dtype=dt)
    x = torch.randn(a.tokens, a.d, generator=g)
    go = torch.randn(a.tokens, a.f, generator=g)
    return x.to(device, dt), ids.to(device), w.to(device), go.to(device, dt)


def full_layer(a, device) -> GroupedGLUExperts:
    torch.manual_seed(a.seed)
    m = GroupedGLUExperts(a.experts, a.d, a.r, a.f, device="cpu", dtype=DTYPES[a.dtype])
    with torch.no_grad():
        m.s_gate.uniform_(0.5, 1.5)
        m.s_up.uniform_(0.5, 1.5)
    return m.to(device)


class Clock:
    """Stamps: CUDA events on the current stream, or the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


class _Mark(torch.autograd.Function):
    """Identity that stamps when its input is ready and again when its gradient arrives."""

    @staticmethod
    def forward(ctx, t, rec, phase):
        if isinstance(t, funcol.AsyncCollectiveTensor):
            t = t.trigger_wait()  # the exchange's end, not its issue (the layer waits at this use anyway)
        ctx.rec, ctx.phase = rec, phase
        rec.marks.append((phase, rec.clock.stamp()))
        rec.nbytes.setdefault(phase, t.numel() * t.element_size())
        return t

    @staticmethod
    def backward(ctx, g):
        ctx.rec.marks.append((ctx.phase, ctx.rec.clock.stamp()))
        return g, None, None


class Recorder:
    """``ExpertParallelGLU.phase_hook``: the marks of the current step, the bytes of the tensors at each mark."""

    def __init__(self, clock):
        self.clock, self.marks, self.nbytes = clock, [], {}

    def __call__(self, phase, t):
        return _Mark.apply(t, self, phase)


def step(layer, inp, clock, rec=None):
    """One forward and backward -> ((start, after forward, end, marks), [y, x.grad, w.grad, parameter grads])."""
    x, ids, w, go = inp
    layer.zero_grad(set_to_none=True)
    x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    if rec is not None:
        rec.marks = []
    t0 = clock.stamp()
    y = layer(x, ids, w)
    t1 = clock.stamp()
    y.backward(go)
    t2 = clock.stamp()
    grads = [y.detach(), x.grad, w.grad] + [p.grad for p in layer.parameters()]
    return (t0, t1, t2, rec.marks if rec else []), grads


def timed(layer, inp, clock, a, rec=None):
    """{"forward", "backward", "step"[, "phases"]} stats in ms over a.iters steps after a.warmup; the last grads."""
    checks, tsct_config.check_values = tsct_config.check_values, False
    try:
        dist.barrier()
        for _ in range(a.warmup):
            step(layer, inp, clock, rec)
        runs = []
        for _ in range(a.iters):
            stamps, last = step(layer, inp, clock, rec)
            runs.append(stamps)
    finally:
        tsct_config.check_values = checks
    if clock.cuda:
        torch.cuda.synchronize()
    ms = clock.ms
    out = {"forward": measure.stats([ms(t0, t1) for t0, t1, _, _ in runs]),
           "backward": measure.stats([ms(t1, t2) for _, t1, t2, _ in runs]),
           "step": measure.stats([ms(t0, t2) for t0, _, t2, _ in runs])}
    if rec is not None:
        fwd, bwd = {p: [] for p in PHASES}, {p: [] for p in PHASES}
        for t0, t1, t2, marks in runs:
            names = [p for p, _ in marks]
            assert names == list(PHASES[1:] + PHASES[:0:-1]), f"phase marks out of order: {names}"
            s = [t0] + [m for _, m in marks[:4]] + [t1] + [m for _, m in marks[4:]] + [t2]
            for i, p in enumerate(PHASES):
                fwd[p].append(ms(s[i], s[i + 1]))
                bwd[p].append(ms(s[9 - i], s[10 - i]))
        out["phases"] = {"forward": {p: measure.stats(v) for p, v in fwd.items()},
                         "backward": {p: measure.stats(v) for p, v in bwd.items()}}
    return out, last


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    n = b.norm()
    return ((a - b).norm() / n).item() if n > 0 else (a - b).norm().item()


def run(rank: int, world: int, device, a) -> dict:
    if not hasattr(ExpertParallelGLU, "phase_hook"):
        raise RuntimeError("this tsct's ExpertParallelGLU has no phase_hook (the timing marks): install a newer tsct")
    t, e_loc = a.tokens, a.experts // world
    inputs = [rank_inputs(j, a, device) for j in range(world)]
    full = full_layer(a, device)
    ep = ExpertParallelGLU.shard(full)
    clock = Clock(device)
    rec = Recorder(clock)
    names = ["y", "x.grad", "topk_weights.grad"] + [n + ".grad" for n, _ in ep.named_parameters()]

    # correctness: two steps, the same bits; the single-process layer on every rank's tokens at once
    got = step(ep, inputs[rank], clock)[1]
    bits = all(torch.equal(u, v) for u, v in zip(got, step(ep, inputs[rank], clock)[1]))
    cat = [torch.cat(c) for c in zip(*inputs)]
    ref = step(full, cat, clock)[1]
    lo = rank * t
    want = [r[lo:lo + t] for r in ref[:3]] + [g[rank * e_loc:(rank + 1) * e_loc] for g in ref[3:]]
    err = {n: rel(u, v) for n, u, v in zip(names, got, want)}
    del ref, want

    # timing: the phases (hook on), the step with the hook off, the single-process layer on this rank's tokens
    ep.phase_hook = rec
    marked, last = timed(ep, inputs[rank], clock, a, rec)
    bits = bits and all(torch.equal(u, v) for u, v in zip(got, last))
    ep.phase_hook = None
    plain = timed(ep, inputs[rank], clock, a)[0]
    layer = timed(full, inputs[rank], clock, a)[0]

    # bytes: measured at the marks (send buffer, received rows, experts' output, returned rows)
    counts = torch.stack([torch.bincount(i.flatten() // e_loc, minlength=world) for _, i, _, _ in inputs]).cpu()
    b = rec.nbytes
    es = DTYPES[a.dtype].itemsize
    # the router weights travel with the rows (fp32, one per row slot), their gradients back
    w_sent, w_recv = 4 * b["dispatch"] // (es * a.d), 4 * b["experts"] // (es * a.d)
    fwd = {"dispatch": {"sent": b["dispatch"], "received": b["experts"]},
           "weights": {"sent": w_sent, "received": w_recv},
           "combine": {"sent": b["combine"], "received": b["sum"]},
           "counts": {"sent": a.experts * 8, "received": a.experts * 8}}
    bwd = {"dispatch": {"sent": b["experts"], "received": b["dispatch"]},
           "weights": {"sent": w_recv, "received": w_sent},
           "combine": {"sent": b["sum"], "received": b["combine"]}}
    off_out, off_in = int(counts[rank].sum() - counts[rank, rank]), int(counts[:, rank].sum() - counts[rank, rank])
    off = (es * (a.d + a.f) + 4) * (off_out + off_in) + (world - 1) * e_loc * 8  # each way, forward + backward
    total = {w: sum(x[w] for ph in (fwd, bwd) for x in ph.values()) for w in ("sent", "received")}
    med = marked["phases"]["forward"]
    return {
        "rank": rank,
        "rows_sent_to": counts[rank].tolist(), "rows_received_from": counts[:, rank].tolist(),
        "bytes": {"forward": fwd, "backward": bwd, "step": total, "step_off_rank": {"sent": off, "received": off}},
        "forward_off_rank_GBps": {  # bytes to the other ranks over the phase's median time
            "dispatch": es * a.d * off_out / max(med["dispatch"]["median"] * 1e6, 1e-3),
            "combine": es * a.f * off_in / max(med["combine"]["median"] * 1e6, 1e-3)},
        "rel_err": err, "correct": all(v < TOL[a.dtype] for v in err.values()), "bits_equal": bits,
        "ep": plain, "ep_phases": marked["phases"], "ep_marked_step": marked["step"], "layer": layer,
    }


def _rank(rank: int, a, init: str, path: str) -> None:
    world, cuda = a.world, a.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world,
                            device_id=device if cuda else None)
    try:
        ranks = [None] * world
        dist.all_gather_object(ranks, run(rank, world, device, a))
        if rank == 0:
            res = {
                "date": measure.utc_now(), "commit": measure.git_commit(), "device": measure.device_info(device),
                "host": measure.host_info(), "backend": dist.get_backend(), "world_size": world,
                "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None},
                "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
                "shape": {"tokens_per_rank": a.tokens, "topk": a.topk, "experts": a.experts,
                          "experts_per_rank": a.experts // world, "d": a.d, "r": a.r, "f": a.f, "dtype": a.dtype,
                          "storage": "bf16", "routing": "softmax", "seed": a.seed,
                          "preset": "small" if a.small else "b1"},
                "timing": {"warmup": a.warmup, "iters": a.iters, "clock": "cuda events" if cuda else "perf_counter",
                           "check_values": False, "unit": "ms"},
                "tolerance": TOL[a.dtype],
                "passed": all(r["correct"] and r["bits_equal"] for r in ranks),
                "ranks": ranks,
            }
            with open(path, "w") as fh:
                json.dump(res, fh, indent=1)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # leave without interpreter finalization, where a gloo worker thread can abort the process (pytorch/pytorch#179291)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report(res: dict) -> str:
    lines = [f"{res['device']['name']} x{res['world_size']} ({res['backend']}), {res['shape']}, "
             f"passed={res['passed']} (tol {res['tolerance']})"]
    for r in res["ranks"]:
        ep, ph = r["ep"], r["ep_phases"]
        cells = "  ".join(f"{p} {ph['forward'][p]['median']:.3f}/{ph['backward'][p]['median']:.3f}" for p in PHASES)
        lines.append(f"rank {r['rank']}: step {ep['step']['median']:.3f} ms "
                     f"(marked {r['ep_marked_step']['median']:.3f}; "
                     f"layer alone {r['layer']['step']['median']:.3f}); fwd/bwd ms: {cells}; "
                     f"off-rank {r['bytes']['step_off_rank']['sent'] / 1e6:.1f} MB each way; "
                     f"max rel err {max(r['rel_err'].values()):.2e}; bits equal {r['bits_equal']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse(argv)
    os.environ.update(NCCL_ENV)  # before any process group starts (the ranks inherit it)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.json or os.path.join(tmp, "ep_run.json")
        mp.spawn(_rank, args=(a, "file://" + os.path.join(tmp, "rendezvous"), path), nprocs=a.world, join=True)
        with open(path) as fh:
            res = json.load(fh)
    print(report(res))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
