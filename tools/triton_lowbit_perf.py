"""Device harness: the b1 whole pass of the low-bit path (and bf16 for comparison), timed and profiled per
kernel, for docs/performance.md. Needs a CUDA GPU; not part of the test suite.

    python3 tools/triton_lowbit_perf.py --label new --fmts nvfp4,sign,bf16 --json out.json

The pass is tsct-bench's (``tsct.bench.arms.tsct_call``: sort by expert, ``tsct.ops.grouped_glu`` with
gather, row weights and the fused combine; fwd+bwd = that plus autograd.grad of x, router weights and the
scales, as the bench's non-STE arms). Per format it reports:
  * ``call_ms``: median of per-call CUDA events with a sync after each call (what tsct-bench reports);
  * ``queued_ms``: wall time of 20 calls issued back to back / 20 (host and device overlapped);
  * ``host_ms``: host time to issue one call (the same 20 calls, clock read before the sync);
  * ``graph_ms``: forward replayed from a CUDA graph (device time with no launch gaps);
  * per-kernel device time per pass (torch.profiler, 5 passes).
It also prints a checksum of the forward output of input set 0 (to compare two versions' results).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time

import torch


def _events(fn, n):
    ts = []
    for i in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i % 2)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def _queued(fn, n=20):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        fn(i % 2)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) * 1e3 / n, (t1 - t0) * 1e3 / n


def _profile(fn, n=5):
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            fn(i % 2)
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name if len(ev.name) < 60 else ev.name[:57] + "..."
            per[name] += ev.device_time_total / 1e3 / n
            cnt[name] += 1
    return {k: (round(v, 4), cnt[k] // n) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="run")
    ap.add_argument("--fmts", default="nvfp4,sign,bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)

    import tsct
    from tsct import config as tsct_config
    from tsct.bench import arms, inputs
    from tsct.bench.config import from_preset

    cfg = from_preset("b1", device="cuda").resolved()
    dense = inputs.make_dense_factors(cfg)
    sets = inputs.make_input_sets(cfg, 2)
    results = {"label": a.label, "tsct": tsct.__file__, "device": torch.cuda.get_device_name()}
    for fmt in a.fmts.split(","):
        fac = dense if fmt == "bf16" else inputs.quantize_factors(dense, fmt)
        impl = "triton-bf16" if fmt == "bf16" else "triton-lowbit"

        def fwd(i, fac=fac, impl=impl):
            s = sets[i]
            return arms.tsct_call(s.x, s.ids, s.weights, fac, cfg.experts, impl)

        def fwdbwd(i, fac=fac, fwd=fwd):
            s = sets[i]
            return torch.autograd.grad(fwd(i), [s.x, s.weights] + fac.leaves(), s.grad_out)

        t0 = time.perf_counter()
        out = fwd(0)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        o = out.float()
        chk = [float(o.norm()), float(o[:64, :64].sum()), float(o[-64:, -64:].abs().sum())]
        del out, o
        saved = tsct_config.check_values
        tsct_config.check_values = False
        r = {"first_call_s": round(first_s, 2), "checksum": chk}
        try:
            if not a.no_bwd:
                fwdbwd(0)
                torch.cuda.synchronize()
            for _ in range(3):
                fwd(0)
            r["fwd_call_ms"] = _events(fwd, a.iters)
            r["fwd_queued_ms"], r["fwd_host_ms"] = _queued(fwd)
            if not a.no_bwd:
                r["fwdbwd_call_ms"] = _events(fwdbwd, a.iters)
                r["fwdbwd_queued_ms"], r["fwdbwd_host_ms"] = _queued(fwdbwd)
            try:
                g = torch.cuda.CUDAGraph()
                st = torch.cuda.Stream()
                st.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(st):
                    fwd(0)
                torch.cuda.current_stream().wait_stream(st)
                with torch.cuda.graph(g):
                    fwd(0)
                g.replay()
                torch.cuda.synchronize()
                ts = []
                for _ in range(a.iters):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    g.replay()
                    e.record()
                    e.synchronize()
                    ts.append(s.elapsed_time(e))
                r["fwd_graph_ms"] = statistics.median(ts)
                del g
            except Exception as e:  # noqa: BLE001
                r["fwd_graph_ms"] = f"graph failed: {type(e).__name__}: {e}"[:200]
            if not a.no_profile:
                r["kernels_fwd"] = _profile(fwd)
                if not a.no_bwd:
                    r["kernels_fwdbwd"] = _profile(fwdbwd)
        finally:
            tsct_config.check_values = saved
        results[fmt] = r
        print(f"[{a.label}] {fmt}: " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in r.items() if not k.startswith("kernels")), flush=True)
        for key in ("kernels_fwd", "kernels_fwdbwd"):
            if key in r:
                print(f"  {key} (device ms per pass, launches):")
                for name, (ms, c) in list(r[key].items())[:14]:
                    print(f"    {ms:8.4f} x{c:<3d} {name}")
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
