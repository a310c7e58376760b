"""Measuring: call timing, copy bandwidth, peak memory, and the facts about the machine and the code.

Timing (``time_calls``), following the workplace method (warm up, time each call, take the median):
    - ``warmup`` untimed calls, then one more untimed call whose host-clock time ``t_warm`` (synchronized)
      sizes the measurement: the number of timed calls is ``clamp(max_seconds / t_warm, min_iters, iters)``.
    - CUDA: one pair of ``torch.cuda.Event(enable_timing=True)`` recorded around every call on the
      current stream, no synchronization between calls, one ``synchronize`` at the end; a call's time is
      ``start.elapsed_time(end)``. If the host is slower than the GPU (a path that syncs, many small
      launches) the GPU waits and the wait is part of the time, as it is in training.
    - CPU: ``time.perf_counter`` around every call (CPU work is synchronous).
    - Statistics over the per-call times: median, 10th and 90th percentile (numpy, linear interpolation).
    - Call i gets input set ``i % n_sets``, so consecutive calls do not reuse inputs from the cache.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stats(times_ms) -> dict:
    a = np.asarray(times_ms, dtype=np.float64)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "n": int(a.size)}


def time_calls(fn: Callable[[int], object], device: torch.device, *, warmup: int, iters: int, min_iters: int = 1,
               max_seconds: float = float("inf"), n_sets: int = 1) -> dict:
    """Time ``fn(i)`` (i = input-set index) -> {"median", "p10", "p90", "n"} in milliseconds."""
    for i in range(warmup):
        fn(i % n_sets)
    _sync(device)
    t0 = time.perf_counter()  # one more untimed call, after the warm-up, sizes the measurement
    fn(warmup % n_sets)
    _sync(device)
    per_call = time.perf_counter() - t0
    fit = max_seconds / max(per_call, 1e-9)  # calls that fit in max_seconds (inf when unbounded)
    n = max(1, min(iters, max(min_iters, int(fit) if math.isfinite(fit) else iters)))
    times = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            fn((warmup + 1 + i) % n_sets)
            ends[i].record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        for i in range(n):
            t = time.perf_counter()
            fn((warmup + 1 + i) % n_sets)
            times.append((time.perf_counter() - t) * 1e3)
    return stats(times)


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector paused for a CUDA graph capture (one collection first). A dead reference
    cycle that holds a ``torch.cuda.CUDAGraph`` (``torch.cuda.make_graphed_callables`` leaves such cycles,
    pytorch/pytorch#161037) freed by the collector in the middle of another capture destroys that graph while a
    stream captures, which CUDA forbids: the capture is invalidated and a later launch in it fails with
    cudaErrorStreamCaptureInvalidated. ``torch.cuda.graph`` no longer collects before each capture
    (pytorch/pytorch#158193; ``TORCH_CUDAGRAPH_GC=1`` restores that)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def time_graph(fn: Callable[[int], object], device: torch.device, *, n_sets: int = 1, warmup: int = 3,
               replays: int = 20) -> Optional[dict]:
    """Time the replay of ``fn(i)`` captured in a CUDA graph, one graph per input set, replayed in turn ->
    {"median", "p10", "p90", "n"} in milliseconds; None off CUDA. The device time of the same work with
    no host cost: the eager timing (``time_calls``) includes whatever the host adds when it cannot keep
    the GPU queue ahead (a slow CPU makes a short pass host-bound). Warm-up runs on a side stream, as
    torch.cuda.graph requires; an exception (a host sync, an op that cannot be captured) propagates."""
    if device.type != "cuda":
        return None
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for i in range(warmup):
            fn(i % n_sets)
    torch.cuda.current_stream(device).wait_stream(side)
    graphs: list = []
    g = None
    try:
        for i in range(n_sets):
            g = torch.cuda.CUDAGraph()
            # one memory pool for all: the replays run one after another on one stream
            with gc_paused(), torch.cuda.graph(g, pool=graphs[0].pool() if graphs else None):
                fn(i)
            graphs.append(g)
        for i in range(warmup):
            graphs[i % n_sets].replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for i in range(replays):
            starts[i].record()
            graphs[i % n_sets].replay()
            ends[i].record()
        torch.cuda.synchronize(device)
        return stats([a.elapsed_time(b) for a, b in zip(starts, ends)])
    finally:
        graphs.clear()  # the graphs own their pool's memory: drop every reference, a failed capture's too
        g = None  # noqa: F841
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int, *, warmup: int = 3, iters: int = 20) -> dict:
    """Device-to-device (on CPU: memory-to-memory) copy bandwidth of a ``nbytes`` buffer, measured now.

    GB/s = (bytes read + bytes written) / median time = 2 * nbytes / t. The source is random bytes.
    """
    nbytes = int(nbytes)
    g = torch.Generator(device=device).manual_seed(1234)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=g)
    dst = torch.empty_like(src)
    st = time_calls(lambda _i: dst.copy_(src), device, warmup=warmup, iters=iters, min_iters=iters)
    return {"GBps": 2 * nbytes / (st["median"] * 1e-3) / 1e9, "bytes": nbytes, "ms": st}


def peak_memory(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Peak bytes allocated by torch during ``fn()`` above what was allocated before it (CUDA); None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def sync_check(fn: Callable[[], object], device: torch.device) -> tuple[Optional[bool], list]:
    """(sync_free, messages): run ``fn()`` once under ``torch.cuda.set_sync_debug_mode("warn")``.

    torch then warns at every operation that blocks the host on the GPU (``.item()``, ``.tolist()``,
    ``nonzero``, ``torch.bincount``, a device-to-host copy, ...). Syncs made outside torch (a native library
    called through ctypes) are not seen. CPU: (None, []).
    """
    if device.type != "cuda":
        return None, []
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    torch.cuda.synchronize(device)
    # torch's one-time notice that the debug mode itself is a prototype is not a sync
    msgs = sorted({str(w.message).strip().splitlines()[0] for w in caught
                   if "synchroniz" in str(w.message).lower() and "prototype feature" not in str(w.message)})
    return not msgs, msgs


# ---- facts about the machine and the code ---------------------------------------------------------

def _driver_release() -> Optional[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[0].strip() if lines else None


def device_info(device: torch.device) -> dict:
    info = {"type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                    memory_bytes=int(p.total_memory), l2_cache_bytes=getattr(p, "L2_cache_size", None),
                    driver=_driver_release())
    else:
        info.update(name=platform.processor() or platform.machine(), capability=None, sm_count=None,
                    memory_bytes=None, driver=None, cpu_threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
                    load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    return info


def gpu_tag(name: Optional[str]) -> str:
    """The short GPU name in result file names (``<date>_<gpu>_<what>_<commit>``): "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA GeForce RTX 5060 Ti" -> "rtx5060" (the first word after the vendor, joined to the next when it has no
    digit); "gpu" for an empty or missing name."""
    words = [w for w in re.sub(r"[^a-z0-9 ]", "", (name or "").lower()).split() if w not in ("nvidia", "geforce")]
    if not words:
        return "gpu"
    return words[0] if any(c.isdigit() for c in words[0]) else "".join(words[:2])


def host_info() -> dict:
    return {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count()}


def host_speed(device: torch.device, *, ops: int = 2000, rounds: int = 5) -> dict:
    """How fast this host issues work, to read eager times by (an eager pass that the host cannot keep ahead of the
    GPU takes the host's time, which moves between machines and runs; docs/performance.md):

    - ``python_us``: a fixed pure-Python loop (100,000 additions), microseconds;
    - ``op_issue_us``: the host time to issue one tiny torch op on ``device`` (``t.add_(1)`` on a 1-element tensor,
      ``ops`` of them back to back, no synchronisation inside the timing: the dispatcher plus, on CUDA, the kernel
      launch), microseconds.

    Each is the best of ``rounds`` rounds (the machine's speed, not its disturbances)."""
    def loop() -> None:
        acc = 0
        for i in range(100_000):
            acc += i

    py = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        loop()
        py.append(time.perf_counter() - t0)
    t = torch.zeros(1, device=device)
    for _ in range(50):  # warm-up: the op's kernel loaded, the allocator and the launch queue settled
        t.add_(1)
    _sync(device)
    issue = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(ops):
            t.add_(1)
        issue.append(time.perf_counter() - t0)
        _sync(device)  # the queue drained between rounds: each round's issue time is the host's alone
    return {"python_us": round(min(py) * 1e6, 1), "op_issue_us": round(min(issue) / ops * 1e6, 3)}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> dict:
    """{"commit", "dirty", "source"}: ``$TSCT_BENCH_GIT_COMMIT`` if set (for a copied tree without .git),
    else ``git rev-parse HEAD`` of the checkout holding this tsct, else the commit the installer recorded
    (``tsct.__git_commit__`` or pip's direct_url.json vcs_info), else "unknown"."""
    import tsct

    env = os.environ.get("TSCT_BENCH_GIT_COMMIT", "").strip()
    if env:
        return {"commit": env, "dirty": None, "source": "TSCT_BENCH_GIT_COMMIT"}

    root = Path(tsct.__file__).resolve().parent.parent.parent  # python/tsct/__init__.py -> repo root
    git = shutil.which("git")
    if git and (root / ".git").exists():
        try:
            head = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=20)
            if head.returncode == 0 and head.stdout.strip():
                st = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=20)
                dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
                return {"commit": head.stdout.strip(), "dirty": dirty, "source": "git"}
        except (OSError, subprocess.SubprocessError):
            pass
    recorded = getattr(tsct, "__git_commit__", None)
    if recorded and recorded != "unknown":
        return {"commit": str(recorded), "dirty": getattr(tsct, "_build_dirty", None), "source": "tsct.__git_commit__"}
    try:
        text = importlib.metadata.distribution("tsct").read_text("direct_url.json")
        commit = (json.loads(text).get("vcs_info") or {}).get("commit_id") if text else None
        if commit:
            return {"commit": commit, "dirty": None, "source": "direct_url.json"}
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        pass
    return {"commit": "unknown", "dirty": None, "source": None}
