"""The host's share of one eager expert pass, measured on a machine without a GPU.

Eager time is the larger of the device time and the host time to issue the pass, so a pass whose kernels take
~1.2 ms (the low-bit b1 forward+backward on an H200) is host-bound once its Python, torch ops and launches cost
more. This tool runs the real host code of ``sort_by_expert`` + ``grouped_glu`` (forward, or forward + backward
through autograd, as ``tsct-bench`` times them) on CPU tensors dressed as a compute capability 9.0 device: every
CUDA query answers as an H200 would, the AOT cubin index of an installed wheel resolves the launches, and the
native library is replaced by a stand-in that returns at once, so no kernel runs and the torch ops compute on the
CPU. Shapes are small (their CPU compute is then negligible; the host's work per pass does not depend on the
shape). It prints, per format:

  * the wall time per pass on this CPU (Python, torch's dispatcher, small CPU ops; no CUDA driver calls),
  * the floor: the same pass's torch ops (as allocations), cubin launches and native calls alone, in a loop
    (``_launch_floor``): what its Python layers cost is the difference,
  * torch ops per pass (top-level ``aten::`` calls: each is a CUDA kernel or an allocator call on a GPU, ~4-10 us of
    host time there), kernel launches per pass (AOT cubins and native entries),
  * with ``--cprofile``, the functions that take the most of it,
  * with ``--layers``, the host time per pass inside each layer of the eager route (``LAYERS``: the public calls, the
    argument checks, the path choice, the records, the replay's key and run, the backward, autograd's engine);
    inclusive, so a layer's time holds the layers it calls, plus ~0.3 us of the timer per call.

It is a model of the GPU host, not a measurement of it: driver calls (cuLaunchKernel ~2-4 us each, stream and
device guards) are missing, and this CPU is not the H200 host's. Compare formats and commits with it; quote eager
figures from ``tsct-bench`` on the GPU. The passes run as the package is configured: with eager replay on (the
default, ``tsct.kernels.replay``) the timed passes are replays of the first; ``TSCT_EAGER_REPLAY=0`` times the paths'
own host code.

    python tools/host_profile.py --aot-dir SITE/tsct/_aot [--fmt bf16 nvfp4 sign] [--passes 200] [--cprofile]
        [--layers]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import sys
import time
import types
from collections import Counter
from typing import Optional

import torch


class _FakeLib:
    """The native library's stand-in: every entry point returns 0 (success) at once and is counted (and, while
    ``log`` is a list, appended to it with its arguments)."""

    def __init__(self):
        self.calls: Counter = Counter()
        self.log: Optional[list] = None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def entry(*args, _name=name):
            self.calls[_name] += 1
            if self.log is not None:
                self.log.append((_name, args))
            return 0

        setattr(self, name, entry)
        return entry


_NULL = contextlib.nullcontext()
_INHERITED = object()  # a patched attribute that was not in the object's own __dict__
#: (label, module, attribute) of the layers ``--layers`` times; the attribute is patched where callers look it up
LAYERS = (
    ("sort_by_expert (public)", "tsct.ops", "sort_by_expert"),
    ("grouped_glu (public)", "tsct.ops", "grouped_glu"),
    ("  argument checks", "tsct.ops.grouped_glu", "validate"),
    ("  path choice", "tsct.ops._select", "select"),
    ("  records (encode)", "tsct.ops._function", "encode"),
    ("  replay's tensor list", "tsct.ops._function", "_replay_tensors"),
    ("torch.autograd.grad", "torch.autograd", "grad"),
    ("  backward (records to gradients)", "tsct.ops._function", "backward"),
    ("replay key (every replayed call)", "tsct.kernels.replay", "_key"),
    ("replay run (every replayed call)", "tsct.kernels.replay", "_Program.run"),
)
#: the formats the harness runs: those with sm_90a cubins (fp8 and ternary run on triton-lowbit through JIT only)
FORMATS = ("bf16", "nvfp4", "sign")


class _FakeStream:
    cuda_stream = 0

    def wait_stream(self, other):
        pass


@contextlib.contextmanager
def as_h200(aot_dir: str):
    """CPU tensors look like tensors of a compute capability 9.0 GPU to tsct's host code within the block; on exit
    every patched attribute, the environment and the caches that saw the stand-ins are as they were. A launch
    without a cubin raises (``TSCT_TRITON_BACKEND=aot``): Triton JIT has no device to compile for here."""
    env = {k: os.environ.get(k) for k in ("TSCT_AOT_DIR", "TSCT_TRITON_BACKEND")}
    os.environ.update(TSCT_AOT_DIR=aot_dir, TSCT_TRITON_BACKEND="aot")
    from tsct import config, dispatch, native
    from tsct.kernels import aot, launch
    from tsct.kernels.triton_common import route
    from tsct.kernels.triton_common import runtime as C
    from tsct.native import _loader, _ops
    from tsct.ops import routing

    lib = _FakeLib()
    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132,
                                  shared_memory_per_block_optin=232448, name="stand-in for an H200")
    saved = []

    def patch(obj, name, value):
        # an inherited attribute (Tensor.is_cuda is TensorBase's) is deleted again, not copied onto obj
        saved.append((obj, name, vars(obj)[name] if name in vars(obj) else _INHERITED))
        setattr(obj, name, value)

    def restore(obj, name, value):
        if value is _INHERITED:
            delattr(obj, name)
        else:
            setattr(obj, name, value)

    patch(torch.Tensor, "is_cuda", property(lambda self: True))
    patch(torch.cuda, "is_current_stream_capturing", lambda: False)
    patch(torch.cuda, "current_device", lambda: 0)
    patch(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    stream = _FakeStream()
    patch(torch.cuda, "current_stream", lambda device=None: stream)
    patch(torch.cuda, "device", lambda device=None: contextlib.nullcontext())
    patch(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
    patch(C, "_side_stream", lambda device: stream)
    patch(C, "device_props", lambda device: props)
    patch(C, "device_capability", lambda device: (9, 0))
    patch(dispatch, "device_capability", lambda device: (9, 0))
    patch(launch, "current_stream", lambda device: 0)
    patch(_ops, "current_stream", lambda index: 0)
    patch(_loader, "get_lib", lambda: lib)
    patch(_ops, "get_lib", lambda: lib)
    patch(native, "available", lambda: True)
    patch(_ops, "_cuda", lambda name, t, device=None: None)  # the tensors are on the CPU
    patch(aot.AotKernel, "handle", lambda self: 1)
    patch(config, "check_values", False)  # as tsct-bench times (the routing here is never computed)
    patch(config, "values_checked", lambda t: False)  # CPU tensors are always checked; these stand for GPU ones
    # the routing kernels do not run: their outputs get torch's values (a later torch op on the CPU indexes with
    # them), copied under a "stand-in" range that the op count leaves out
    real_sort, real_link, links, known = route.sort_by_expert, C.link_csr, [], {}

    def sort_by_expert(ids, num_experts, weights=None, replayed=False):
        patch(C, "link_csr", lambda *args: links.append(args))
        try:
            out = real_sort(ids, num_experts, weights, replayed)
        finally:
            restore(*saved.pop())
        # the range only while counting ops (entering one costs more host time than the copies)
        with torch.profiler.record_function("stand-in") if torch.autograd._profiler_enabled() else _NULL:
            key = (id(ids), ids._version, num_experts)
            if key not in known:  # the harness's ids are fixed: torch's sort once per tensor
                known[key] = routing.sort_by_expert_torch(ids, num_experts)
            order, offs, token = known[key]
            for dst, src in zip(out, (order, offs, token)):
                dst.copy_(src)
            if weights is not None:
                torch.index_select(weights.reshape(-1), 0, order, out=out[3])
        while links:  # linked after the copies, which bump the version counters the link records
            real_link(*links.pop())
        return out

    patch(route, "sort_by_expert", sort_by_expert)
    aot._reset_for_tests()
    _ops.kernel_smem_bytes.cache_clear()
    try:
        yield lib
    finally:
        for obj, name, value in reversed(saved):
            restore(obj, name, value)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        aot._reset_for_tests()
        _ops.kernel_smem_bytes.cache_clear()  # it cached the stand-in library's answers (0 bytes)


def _pass(fmt: str, backward: bool, t: int = 256, e: int = 16, d: int = 256, r: int = 64, f: int = 200, k: int = 2):
    """A closure running one pass as tsct-bench's arms do: sort, op (w_down K-major, both scales), and for a
    backward ``torch.autograd.grad`` w.r.t. x, the router weights, both scales and the dense factors (packed factors
    are frozen, as in the bench's plain low-bit arms)."""
    from tsct import quant
    from tsct.ops import grouped_glu, sort_by_expert

    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, d, generator=g).bfloat16().requires_grad_(backward)
    dense = [(torch.randn(e, d, r, generator=g) / d ** .5).bfloat16(),
             (torch.randn(e, d, r, generator=g) / d ** .5).bfloat16(),
             (torch.randn(e, f, r, generator=g) / r ** .5).bfloat16().transpose(1, 2)]
    if fmt == "bf16":
        facs = [w.requires_grad_(backward) for w in dense]
    else:
        facs = [quant.quantize(w, fmt) for w in dense]
    scales = [(torch.rand(e, r, generator=g) + 0.5).bfloat16().requires_grad_(backward) for _ in range(2)]
    probs, ids = torch.softmax(torch.randn(t, e, generator=g), -1).topk(k)
    probs.requires_grad_(backward)
    dy = torch.randn(t, f, generator=g).bfloat16()
    leaves = [x, probs, *scales] + (facs if fmt == "bf16" else [])
    impl = "triton-bf16" if fmt == "bf16" else "triton-lowbit"

    def step():
        s = sort_by_expert(ids, e, probs)
        y = grouped_glu(x, s.offs, *facs, *scales, row_weight=s.row_weight, gather_idx=s.token,
                        scatter_idx=s.token, num_out_rows=t, impl=impl)
        if backward:
            torch.autograd.grad(y, leaves, dy)

    return step


def _launch_floor(step, lib: _FakeLib, ops: int, passes: int) -> float:
    """Host microseconds per pass of what no Python above the kernels can remove, replayed in a loop: ``ops`` torch
    ops (each as a small allocation, the cheapest kind), the pass's cubin launches with the values they had
    (``AotKernel.launch``: the argument packing and the native call) and its native-library calls. A pass's host time
    minus this is what its Python layers (checks, dispatch, autograd glue, resolving each launch) cost: the most a
    cached launch sequence per call signature could save. Timed as the pass is (``_us_per_pass``)."""
    from tsct.kernels import aot

    launches, natives = [], []
    real = aot.AotKernel.launch
    aot.AotKernel.launch = lambda k, grid, values, stream: launches.append((k, tuple(grid), list(values), stream))
    lib.log = natives
    try:
        step()
    finally:
        aot.AotKernel.launch = real
        lib.log = None
    entries = [(getattr(lib, name), args) for name, args in natives]

    def replay():
        for _ in range(ops):
            torch.empty(64)
        for k, grid, values, stream in launches:
            real(k, grid, values, stream)
        for fn, args in entries:
            fn(*args)

    return _us_per_pass(replay, passes)


def _layer_times(fmt: str, backward: bool, passes: int) -> dict:
    """Host microseconds per pass spent inside each of ``LAYERS`` (inclusive), over ``passes`` passes after five to
    warm up; every patched attribute is restored."""
    import importlib

    spent = dict.fromkeys([label for label, _, _ in LAYERS], 0)
    saved = []

    def timed(fn, label):
        def inner(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter_ns() - t0
        return inner

    try:
        for label, mod, attr in LAYERS:
            # the module itself, also where a package attribute of its name shadows it (tsct.ops.grouped_glu)
            obj = importlib.import_module(mod)
            *owner, name = attr.split(".")
            for part in owner:
                obj = getattr(obj, part)
            saved.append((obj, name, vars(obj)[name]))
            setattr(obj, name, timed(vars(obj)[name], label))
        step = _pass(fmt, backward)  # after the patches: it takes the public calls from tsct.ops
        for _ in range(5):
            step()
        spent.update(dict.fromkeys(spent, 0))
        for _ in range(passes):
            step()
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)
    return {label: ns / passes / 1e3 for label, ns in spent.items()}


def _us_per_pass(fn, passes: int) -> float:
    """Host microseconds per call of ``fn``: five calls to warm up, then ``passes`` calls timed together (the same
    method for the pass and its replay, so the two columns compare)."""
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(passes):
        fn()
    return (time.perf_counter() - t0) / passes * 1e6


def _top_level_ops(step) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    n = 0
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        p = ev.cpu_parent
        while p is not None and not p.name.startswith("aten::") and p.name != "stand-in":
            p = p.cpu_parent
        n += p is None
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aot-dir", required=True, help="tsct/_aot of an installed wheel with sm_90a cubins")
    ap.add_argument("--fmt", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--passes", type=int, default=200, help="timed passes per row (>= 1)")
    ap.add_argument("--cprofile", action="store_true", help="print the 25 functions with the most time (--sort)")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
    ap.add_argument("--layers", action="store_true", help="the host time per pass inside each layer (LAYERS)")
    a = ap.parse_args(argv)
    if a.passes < 1:
        ap.error(f"--passes must be >= 1, got {a.passes}")
    if not os.path.isfile(os.path.join(a.aot_dir, "sm_90a", "index.json")):
        ap.error(f"--aot-dir {a.aot_dir!r} has no sm_90a/index.json (SITE/tsct/_aot of a wheel with sm_90a cubins)")
    rows, layers = [], {}
    with as_h200(a.aot_dir) as lib:
        for fmt in a.fmt:
            for bwd in (False, True):
                step = _pass(fmt, bwd)
                us = _us_per_pass(step, a.passes)
                before = Counter(lib.calls)
                step()  # one more, counted: the same launches every pass
                calls = Counter(lib.calls)
                calls.subtract(before)
                launches = float(calls.pop("tsct_triton_launch", 0))
                native_calls = float(sum(calls.values()))
                ops = _top_level_ops(step)
                floor = _launch_floor(step, lib, ops, a.passes)
                name = f"{fmt} {'forward+backward' if bwd else 'forward'}"
                rows.append((name, us, floor, ops, launches, native_calls))
                if a.layers:
                    layers[name] = _layer_times(fmt, bwd, a.passes)
                if a.cprofile:
                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(50):
                        step()
                    pr.disable()
                    print(f"== {name}: 50 passes")
                    pstats.Stats(pr, stream=sys.stdout).sort_stats(a.sort).print_stats(int(os.environ.get("HP_ROWS", "25")))
    print(f"{'pass':<26}{'host us':>10}{'floor us':>11}{'torch ops':>11}{'AOT launches':>14}{'native calls':>14}")
    for name, us, floor, ops, launches, native_calls in rows:
        print(f"{name:<26}{us:>10.0f}{floor:>11.0f}{ops:>11d}{launches:>14.1f}{native_calls:>14.1f}")
    if layers:
        print("\nhost us per pass inside each layer (inclusive; indented: called by the layer above)")
        print(f"{'layer':<36}" + "".join(f"{n:>24}" for n in layers))
        for label, _, _ in LAYERS:
            print(f"{label:<36}" + "".join(f"{t[label]:>24.1f}" for t in layers.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
