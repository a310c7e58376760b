"""Device harness: where the DEVICE time of one eager b1 expert pass goes, per kernel (torch.profiler).

    python3 scripts/device_profile.py --arms bf16,bf16-kmajor,nvfp4 [--iters 10] [--json PATH]

Runs tsct-bench's pass (tsct.bench.arms.tsct_call, the op through tsct.ops) for each arm: the forward
with autograd recording (what tsct-bench's forward times) and forward + backward (autograd.grad of
x, router weights, dense factors and scales), and prints the device time per kernel and per pass. An
arm is a format (bf16 / nvfp4 / sign) with an optional "-kmajor" (w_down K-major, decision 0012).
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile


def kernels(fn, iters: int) -> list[tuple[str, float, int]]:
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
    return sorted(rows, key=lambda t: -t[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default="bf16,bf16-kmajor")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from tsct import config as tsct_config
    from tsct.bench import arms, inputs
    from tsct.bench.config import from_preset

    cfg = from_preset("b1", device="cuda").resolved()
    dense = inputs.make_dense_factors(cfg)
    sets = inputs.make_input_sets(cfg, 2)
    tsct_config.check_values = False
    out = {}
    for arm in a.arms.split(","):
        fmt, _, layout = arm.partition("-")
        fac = dense if fmt == "bf16" else inputs.quantize_factors(dense, fmt)
        if layout == "kmajor":
            fac = arms.kmajor_factors(fac)
        impl = "triton-bf16" if fmt == "bf16" else "triton-lowbit"

        def fwd(i, fac=fac, impl=impl):
            s = sets[i % 2]
            return arms.tsct_call(s.x, s.ids, s.weights, fac, cfg.experts, impl)

        def fwdbwd(i, fac=fac, fwd=fwd):
            s = sets[i % 2]
            return torch.autograd.grad(fwd(i), [s.x, s.weights] + fac.leaves(), s.grad_out)

        out[arm] = {}
        for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            rows = kernels(fn, a.iters)
            total = sum(t for _, t, _ in rows)
            out[arm][name] = {"device_ms": total, "kernels": [dict(name=n, ms=t, calls=c) for n, t, c in rows]}
            print(f"\n{arm} {name}: device {total:.3f} ms per pass")
            for n, t, c in rows[:18]:
                print(f"  {t:8.4f}  x{c:<3d} {n}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
