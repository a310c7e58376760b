"""Device harness: where the time of one eager b1 expert pass goes, on the host or on the device.

    python3 scripts/pass_profile.py host   --arms bf16,nvfp4 [--n 30] [--top 45]
    python3 scripts/pass_profile.py device --arms bf16,bf16-kmajor,nvfp4 [--iters 10] [--json PATH]
    python3 scripts/pass_profile.py sweep  --arms bf16-kmajor --cfgs "a=1;b=2" --cuda-kernels "none;auto" \
        --aot-dirs DIR1,DIR2
    python3 scripts/pass_profile.py threads --arms nvfp4,sign [--rounds 2] [--json PATH]

Both run tsct-bench's pass (``tsct.bench.arms.tsct_call``: the sort by expert, then the op through
``tsct.ops`` with gather, row weights and the fused combine): the forward with autograd recording (what
tsct-bench's forward times) and forward + backward (autograd.grad of x, router weights, dense factors
and scales). An arm is a format (bf16 / nvfp4 / sign) with an optional "-kmajor" (w_down K-major,
decision 0012).

  host    n calls back to back without syncing (the GPU queue absorbs the device work, so the time
          is the host's), n calls each on an idle GPU (synchronized before; median, min, max of the host
          time to issue one), then the same under cProfile: top functions by own and cumulative time.
  device  torch.profiler: device time per kernel and per pass.
  sweep   device time of the forward, and per tsct kernel of forward + backward, for each tile-config override (the
          TSCT_TRITON_GLU_CFG syntax), each setting of the CUDA rows of the dispatch (TSCT_CUDA_KERNELS: none = the
          Triton kernels where sm_90a takes CUDA ones) and each AOT dir (``scripts/aot_sweep.py`` builds them), cubins
          only (TSCT_TRITON_BACKEND=aot: a variant missing from a dir is an error, not a JIT run).
  threads the eager forward + backward (tsct-bench's timing: 30 calls between CUDA events, median) with autograd's
          backward on its CUDA device thread (torch's default: the calling thread hands the graph over and waits) and
          on the calling thread (``torch.autograd.set_multithreading_enabled(False)``), interleaved over rounds;
          the CUDA-graph time beside them.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch


def passes(arms: str):
    """Yield (arm, fwd(i), fwdbwd(i)) for each arm name, on the b1 preset's inputs (two input sets)."""
    from tsct import config as tsct_config
    from tsct.bench import arms as bench_arms
    from tsct.bench import inputs
    from tsct.bench.config import from_preset

    cfg = from_preset("b1", device="cuda").resolved()
    dense = inputs.make_dense_factors(cfg)
    sets = inputs.make_input_sets(cfg, 2)
    tsct_config.check_values = False  # sync-free calls, as tsct-bench times them
    for arm in arms.split(","):
        fmt, _, layout = arm.partition("-")
        fac = dense if fmt == "bf16" else inputs.quantize_factors(dense, fmt)
        if layout == "kmajor":
            fac = bench_arms.kmajor_factors(fac)
        impl = "triton-bf16" if fmt == "bf16" else "triton-lowbit"

        def fwd(i, fac=fac, impl=impl):
            s = sets[i % 2]
            return bench_arms.tsct_call(s.x, s.ids, s.weights, fac, cfg.experts, impl)

        def fwdbwd(i, fac=fac, fwd=fwd):
            s = sets[i % 2]
            return torch.autograd.grad(fwd(i), [s.x, s.weights] + fac.leaves(), s.grad_out)

        yield arm, fwd, fwdbwd


def host(fn, label: str, n: int, top: int) -> None:
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"== {label}: host {1e3 * (t1 - t0) / n:.3f} ms/call (no profiler), "
          f"wall {1e3 * (time.perf_counter() - t0) / n:.3f} ms/call", flush=True)
    iso = []  # each call issued on an idle GPU (synchronized before): its host time, no queue in front of it
    for i in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(i)
        iso.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    iso.sort()
    print(f"   isolated: median {1e3 * iso[n // 2]:.3f} ms/call, min {1e3 * iso[0]:.3f}, max {1e3 * iso[-1]:.3f}",
          flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for i in range(n):
        fn(i)
    pr.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(top)
        print(f"-- {label} by {key} (totals for {n} calls)")
        print("\n".join(s.getvalue().splitlines()[6:]), flush=True)


def device(fn, label: str, iters: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            fn(i)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", 0) or 0
        if dt > 0:
            rows.append((ev.key[:70], dt / iters / 1e3, ev.count // iters))
    rows.sort(key=lambda t: -t[1])
    total = sum(t for _, t, _ in rows)
    print(f"\n{label}: device {total:.3f} ms per pass")
    for name, t, c in rows[:18]:
        print(f"  {t:8.4f}  x{c:<3d} {name}")
    return {"device_ms": total, "kernels": [dict(name=nm, ms=t, calls=c) for nm, t, c in rows]}


def sweep(arms: str, cfgs: str, aot_dirs: str, iters: int, backend: str, cuda_kernels: str = "auto") -> dict:
    import dataclasses
    import os

    from tsct import config, dispatch
    from tsct.kernels import aot
    from tsct.kernels.triton_common import runtime as C

    os.environ["TSCT_TRITON_BACKEND"] = backend
    base = {a: dataclasses.replace(c) for a, c in C.ARCH_CONFIGS.items()}
    cuda0 = config.cuda_kernels
    for over in cfgs.split(";"):  # a bad override raises ValueError naming it, before the b1 inputs are built
        dataclasses.replace(C.CONFIG).update(over)
    for ck in cuda_kernels.split(";"):  # likewise a bad TSCT_CUDA_KERNELS setting
        config.cuda_kernels = ck
        dispatch.cuda_kernel("glu_bwd_dz", None, "bf16")
    res = {}
    plist = list(passes(arms))  # inputs built once
    for adir in aot_dirs.split(",") if aot_dirs else ["installed"]:
        if aot_dirs:
            os.environ[aot.ENV_DIR] = adir
            aot._reset_for_tests()
        for over, ck in ((o, c) for o in cfgs.split(";") for c in cuda_kernels.split(";")):
            for a, c in base.items():
                C.ARCH_CONFIGS[a] = dataclasses.replace(c).update(over)
            config.cuda_kernels = ck
            for arm, fwd, fwdbwd in plist:
                label = f"{adir} [{over}] [cuda {ck}] {arm}"
                try:
                    r = device(fwdbwd, label, iters)
                    r["fwd_ms"] = device(fwd, label + " fwd", iters)["device_ms"]
                except Exception as e:  # a missing variant: say so, go on
                    print(f"\n{label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                res[label] = r
    for a, c in base.items():
        C.ARCH_CONFIGS[a] = c
    config.cuda_kernels = cuda0
    print("\n== sweep summary (device ms per forward + backward; tsct kernels)")
    names = ("bwd_dz", "bwd_dx_dw", "up_fwd", "combine_rows", "down_fwd", "bwd_epi")
    print("  fwd     fwd+bwd " + "  ".join(f"{n[:12]:>12}" for n in names) + "  label   (glu_* / lowbit_* kernels)")
    for label, r in res.items():
        k = {}
        for e in r["kernels"]:
            # the CUDA dz (tsctk_glu_bwd_dz_bf16) counts as bwd_dz
            n = e["name"].removeprefix("tsctk_").removesuffix("_bf16").removeprefix("glu_").removeprefix("lowbit_").removesuffix("_nvfp4").removesuffix("_sign")
            k[n] = k.get(n, 0) + e["ms"]
        print(f"  {r['fwd_ms']:.3f}   {r['device_ms']:.3f}   " + "  ".join(f"{k.get(n, 0):12.4f}" for n in names) + f"  {label}")
    return res


def threads(arms: str, rounds: int) -> dict:
    from tsct.bench import measure

    dev = torch.device("cuda")
    res = {}
    for arm, _, fwdbwd in passes(arms):
        r = {"graph_ms": measure.time_graph(fwdbwd, dev, n_sets=2, replays=30)["median"],
             "device_thread_ms": [], "calling_thread_ms": []}
        for _ in range(rounds):
            r["device_thread_ms"].append(measure.time_calls(fwdbwd, dev, warmup=3, iters=30, n_sets=2)["median"])
            with torch.autograd.set_multithreading_enabled(False):
                r["calling_thread_ms"].append(measure.time_calls(fwdbwd, dev, warmup=3, iters=30, n_sets=2)["median"])
        print(f"{arm} fwdbwd: graph {r['graph_ms']:.3f} ms; eager, backward on the device thread "
              f"{', '.join(f'{t:.3f}' for t in r['device_thread_ms'])}; on the calling thread "
              f"{', '.join(f'{t:.3f}' for t in r['calling_thread_ms'])}", flush=True)
        res[arm] = r
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("host", "device", "sweep", "threads"))
    ap.add_argument("--cfgs", default="", help='sweep: ";"-separated config overrides ("" = the table)')
    ap.add_argument("--cuda-kernels", default=None,
                    help='sweep: ";"-separated TSCT_CUDA_KERNELS settings (auto, none, kernel lists); default: the '
                         "environment's (tsct.config.cuda_kernels)")
    ap.add_argument("--aot-dirs", default="", help="sweep: comma-separated AOT dirs (default: the installed one)")
    ap.add_argument("--backend", default="aot", choices=("aot", "jit"), help="sweep: TSCT_TRITON_BACKEND")
    ap.add_argument("--arms", default="bf16,bf16-kmajor")
    ap.add_argument("--n", type=int, default=30, help="host: calls per measurement")
    ap.add_argument("--top", type=int, default=45, help="host: rows of each cProfile table")
    ap.add_argument("--iters", type=int, default=10, help="device: profiled passes")
    ap.add_argument("--rounds", type=int, default=2, help="threads: interleaved rounds")
    ap.add_argument("--json", default=None, help="device / sweep / threads: write the results here")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    out = {}
    if a.what == "sweep":
        from tsct import config

        out = sweep(a.arms, a.cfgs, a.aot_dirs, a.iters, a.backend,
                    config.cuda_kernels if a.cuda_kernels is None else a.cuda_kernels)
    elif a.what == "threads":
        import os

        from tsct import config
        out = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("TSCT_BENCH_GIT_COMMIT"),
               "eager_replay": config.eager_replay, "arms": threads(a.arms, a.rounds)}
    else:
        for arm, fwd, fwdbwd in passes(a.arms):
            for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                if a.what == "host":
                    host(fn, f"{arm} {name}", a.n, a.top)
                else:
                    out.setdefault(arm, {})[name] = device(fn, f"{arm} {name}", a.iters)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
