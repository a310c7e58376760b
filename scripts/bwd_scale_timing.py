"""Device time of the whole expert pass, forward and forward+backward, on the backward's edge shapes (CUDA graph
replay, as tsct-bench's "graph" column), for whichever tsct is on the path: run it once per tree / native library /
config to compare schedules (`scripts/gpu_suite.sh bwd-ab` for source trees, `wheel-ab` for built wheels).

The pass is tsct-bench's tsct arm (``tsct.ops.sort_by_expert``, then one ``tsct.ops.grouped_glu`` with gather and
combine fused; forward+backward adds ``torch.autograd.grad`` w.r.t. x, the router weights, the dense factors and both
scales; packed NVFP4 or sign factors: x, router weights and scales), on tsct-bench's inputs
(``tsct.bench.routing.route``, factors N(0, 1/K), scales U(0.5, 1.5)). Only APIs that every tsct version since the
sort kernels has are used, so an older tree runs it unchanged.

    PYTHONPATH=<tree>/python python3 scripts/bwd_scale_timing.py --label new --json OUT.json [--shapes b1,b1_zipf12]
        [--arms bf16,bf16-kmajor,nvfp4,sign]

Prints one line per (shape, arm): forward / forward+backward ms (median of 20 replays) and the expert rows
(max, empty experts). ``--profile``: also the device time per kernel of one eager forward+backward
(``scripts/pass_profile.py``'s torch.profiler table, mean of 5 passes), printed and kept in the JSON (where the time of
an edge shape goes). ``--timeline``: the kernels of one CUDA-graph replay of forward+backward in start order (start,
duration and gap to the latest end before it, in us; stream), printed and kept (what lies between the kernels, and
which overlap). ``--side-stream off``: ``tsct.config.side_stream = False`` (a tree that predates it ignores it).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

SHAPES = {  # name: (T, E, routing, zipf exponent, r); k = 2, d = 2048, f = 5461 (b1); tsct-bench --sweep's points
    "b1": (16384, 1024, "softmax", None, 64),
    "b1_zipf10": (16384, 1024, "zipf", 1.0, 64),
    "b1_zipf12": (16384, 1024, "zipf", 1.2, 64),
    "b1_zipf15": (16384, 1024, "zipf", 1.5, 64),
    "e256": (16384, 256, "softmax", None, 64),
    "e4096": (16384, 4096, "softmax", None, 64),
    "e16384": (16384, 16384, "softmax", None, 64),
    "t4096": (4096, 1024, "softmax", None, 64),
    "t65536": (65536, 1024, "softmax", None, 64),
    "r16": (16384, 1024, "softmax", None, 16),
    "r32": (16384, 1024, "softmax", None, 32),
    "r128": (16384, 1024, "softmax", None, 128),
}
ARMS = ("bf16", "bf16-kmajor", "nvfp4", "sign")
K, D, F = 2, 2048, 5461


def make(shape: str, dev: torch.device, seed: int = 0):
    from tsct.bench import routing

    T, E, rt, a, R = SHAPES[shape]
    g = torch.Generator(device=dev).manual_seed(seed)
    ids, w = routing.route(T, E, K, routing=rt, zipf_exponent=a or 1.2, generator=g, device=dev,
                           dtype=torch.bfloat16)
    x = torch.randn(T, D, generator=g, device=dev).bfloat16()
    wg = (torch.randn(E, D, R, generator=g, device=dev) * D ** -0.5).bfloat16()
    wu = (torch.randn(E, D, R, generator=g, device=dev) * D ** -0.5).bfloat16()
    wd = (torch.randn(E, R, F, generator=g, device=dev) * R ** -0.5).bfloat16()
    sg = (0.5 + torch.rand(E, R, generator=g, device=dev)).bfloat16()
    su = (0.5 + torch.rand(E, R, generator=g, device=dev)).bfloat16()
    go = torch.randn(T, F, generator=g, device=dev).bfloat16()
    counts = torch.bincount(ids.flatten(), minlength=E)
    rows = {"max": int(counts.max()), "empty": int((counts == 0).sum()), "mean": float(counts.float().mean())}
    return x, ids, w, (wg, wu, wd, sg, su), go, rows


def factors(arm: str, dense):
    from tsct import quant
    from tsct.kernels.layout import to_kmajor

    wg, wu, wd, sg, su = dense
    if arm == "bf16":  # row-major w_down
        return [t.clone().requires_grad_() for t in dense], "triton-bf16"
    if arm == "bf16-kmajor":
        return [wg.clone().requires_grad_(), wu.clone().requires_grad_(), to_kmajor(wd).requires_grad_(),
                sg.clone().requires_grad_(), su.clone().requires_grad_()], "triton-bf16"
    if arm in ("nvfp4", "sign"):
        q = [quant.quantize(t, arm, backend="torch") for t in (wg, wu, wd)]  # as tsct-bench: linear scales
        return q + [sg.clone().requires_grad_(), su.clone().requires_grad_()], "triton-lowbit"
    raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")


def time_arm(shape: str, arm: str, inputs, dev: torch.device, replays: int, profile: bool = False,
             timeline: bool = False) -> dict:
    from tsct.bench import measure
    from tsct.ops import grouped_glu, sort_by_expert

    x0, ids, w0, dense, go, rows = inputs
    fac, impl = factors(arm, dense)
    x = x0.clone().requires_grad_()
    w = w0.clone().requires_grad_()
    leaves = [x, w] + [t for t in fac if isinstance(t, torch.Tensor) and t.requires_grad]
    E = dense[0].shape[0]

    def fwd(_i=0):
        s = sort_by_expert(ids, E, w)
        return grouped_glu(x, s.offs, fac[0], fac[1], fac[2], fac[3], fac[4], row_weight=s.row_weight,
                           gather_idx=s.token, scatter_idx=s.token, num_out_rows=x.shape[0], impl=impl)

    def fwdbwd(_i=0):
        return torch.autograd.grad(fwd(), leaves, go)

    res = {"shape": shape, "arm": arm, "impl": impl, "rows": rows}
    t0 = time.time()
    res["fwd_ms"] = measure.time_graph(fwd, dev, replays=replays)["median"]
    res["fwdbwd_ms"] = measure.time_graph(fwdbwd, dev, replays=replays)["median"]
    if profile:  # pass_profile (this script's folder) prints the table too
        import pass_profile

        res["kernels"] = pass_profile.device(fwdbwd, f"{shape} {arm} fwd+bwd", 5)["kernels"]
    if timeline:
        res["timeline"] = graph_timeline(fwdbwd, dev)
        print_timeline(res["timeline"], f"{shape} {arm} fwd+bwd")
    res["seconds"] = round(time.time() - t0, 1)
    return res


def graph_timeline(fn, dev: torch.device, replays: int = 3) -> list[dict]:
    """The device work (kernels, copies, sets) of the last of ``replays`` replays of ``fn`` captured in a CUDA graph,
    from torch.profiler's trace: [{name, stream, start, dur, gap}] in start order, us from the replay's first start;
    gap: start minus the latest end before it (negative: overlapping another stream's work)."""
    import contextlib
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    from tsct.bench import measure

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with getattr(measure, "gc_paused", contextlib.nullcontext)(), torch.cuda.graph(g):  # older trees: no gc_paused
        fn()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            torch.cuda.synchronize(dev)
            g.replay()
        torch.cuda.synchronize(dev)
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        with open(fh.name) as f:
            events = json.load(f)["traceEvents"]
    work = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    n = len(work) // replays  # every replay runs the same graph nodes: the last replay is the last n of them
    last = work[-n:] if n else []
    out, end = [], None
    t0 = last[0]["ts"] if last else 0
    for e in last:
        out.append({"name": e["name"], "stream": e.get("args", {}).get("stream"), "start": round(e["ts"] - t0, 1),
                    "dur": round(e["dur"], 1), "gap": round(e["ts"] - end, 1) if end is not None else 0.0})
        end = max(end, e["ts"] + e["dur"]) if end is not None else e["ts"] + e["dur"]
    del g
    return out


def print_timeline(rows: list[dict], label: str) -> None:
    if not rows:
        print(f"== {label}: no device work recorded", flush=True)
        return
    span = max(r["start"] + r["dur"] for r in rows)
    busy = sum(r["dur"] for r in rows)
    print(f"== {label}: {len(rows)} kernels and copies, span {span:.1f} us, their sum {busy:.1f} us", flush=True)
    for r in rows:
        print(f"  {r['start']:9.1f} {r['dur']:8.1f}  gap {r['gap']:6.1f}  s{r['stream']}  {r['name'][:80]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", required=True)
    p.add_argument("--json")
    p.add_argument("--shapes", default="b1,b1_zipf12,e256,t65536")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--profile", action="store_true", help="also the device time per kernel of forward+backward")
    p.add_argument("--timeline", action="store_true", help="also the kernels of one graph replay of forward+backward")
    p.add_argument("--side-stream", choices=("on", "off"), default="on", help="tsct.config.side_stream")
    a = p.parse_args()
    import tsct
    from tsct import config, native

    config.side_stream = a.side_stream == "on"

    dev = torch.device("cuda")
    out = {"label": a.label, "tsct_file": tsct.__file__, "native": native.available(),
           "native_error": None if native.available() else str(native.load_error()),
           "cfg": os.environ.get("TSCT_TRITON_GLU_CFG", ""),
           "cuda_kernels": os.environ.get("TSCT_CUDA_KERNELS", "auto"), "backend": os.environ.get("TSCT_TRITON_BACKEND", "auto"),
           "side_stream": a.side_stream, "device": torch.cuda.get_device_name(dev), "results": []}
    print(f"[{a.label}] tsct {tsct.__file__} native={out['native']} cfg={out['cfg']!r}", flush=True)
    for shape in a.shapes.split(","):
        inputs = make(shape, dev)
        for arm in a.arms.split(","):
            try:
                r = time_arm(shape, arm, inputs, dev, a.replays, a.profile, a.timeline)
            except Exception as e:  # noqa: BLE001  (recorded; the other points still run)
                r = {"shape": shape, "arm": arm, "error": f"{type(e).__name__}: {e}"[:400]}
            out["results"].append(r)
            if "error" in r:
                print(f"[{a.label}] {shape:10s} {arm:12s} ERROR {r['error']}", flush=True)
            else:
                print(f"[{a.label}] {shape:10s} {arm:12s} fwd {r['fwd_ms']:7.3f} ms  fwd+bwd {r['fwdbwd_ms']:7.3f} ms  "
                      f"(max rows {r['rows']['max']}, empty {r['rows']['empty']}; {r['seconds']} s)", flush=True)
        del inputs
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
