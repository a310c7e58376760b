"""Device harness: where the HOST time of one eager b1 expert pass goes (cProfile of the Python layer).

    python3 scripts/host_profile.py --fmts bf16,bf16-kmajor,nvfp4 [--n 30]

Runs tsct-bench's pass (tsct.bench.arms.tsct_call) n times back to back without syncing (the GPU queue
absorbs the device work, so the profile is host time), under cProfile; prints the top functions by
own time and by cumulative time, and the host ms per call with and without the profiler.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmts", default="bf16,nvfp4")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    from tsct import config as tsct_config
    from tsct.bench import arms, inputs
    from tsct.bench.config import from_preset

    cfg = from_preset("b1", device="cuda").resolved()
    dense = inputs.make_dense_factors(cfg)
    sets = inputs.make_input_sets(cfg, 2)
    tsct_config.check_values = False
    for fmt in a.fmts.split(","):
        base, _, layout = fmt.partition("-")  # "bf16-kmajor": w_down K-major (decision 0012)
        fac = dense if base == "bf16" else inputs.quantize_factors(dense, base)
        if layout == "kmajor":
            fac = arms.kmajor_factors(fac)
        impl = "triton-bf16" if base == "bf16" else "triton-lowbit"

        def fwd(i, fac=fac, impl=impl):
            s = sets[i % 2]
            return arms.tsct_call(s.x, s.ids, s.weights, fac, cfg.experts, impl)

        def fwdbwd(i, fac=fac, fwd=fwd):
            s = sets[i % 2]
            return torch.autograd.grad(fwd(i), [s.x, s.weights] + fac.leaves(), s.grad_out)

        for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            for i in range(3):
                fn(i)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(a.n):
                fn(i)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            print(f"== {fmt} {name}: host {1e3 * (t1 - t0) / a.n:.3f} ms/call (no profiler), "
                  f"wall {1e3 * (time.perf_counter() - t0) / a.n:.3f} ms/call", flush=True)
            pr = cProfile.Profile()
            pr.enable()
            for i in range(a.n):
                fn(i)
            pr.disable()
            torch.cuda.synchronize()
            for key in ("tottime", "cumulative"):
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats(key).print_stats(a.top)
                print(f"-- {fmt} {name} by {key} (totals for {a.n} calls)")
                print("\n".join(s.getvalue().splitlines()[6:]), flush=True)


if __name__ == "__main__":
    main()
