"""Where the bmm path's time goes at one shape: torch profiler, CUDA kernel totals of a forward and a
forward+backward, beside the padded bmm the benchmark runs. Usage: python tools/bmm_profile.py [--routing zipf]"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from tsct.bench import config as cfgmod
from tsct.bench import inputs, routing
from tsct.ops import grouped_glu, sort_by_expert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--routing", default="softmax")
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()
    T, k, E, d, r, f = 16384, 2, 1024, 2048, 64, 5461
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    wg = (torch.randn(E, d, r, device="cuda", generator=g) / d ** .5).bfloat16().requires_grad_(True)
    wu = (torch.randn(E, d, r, device="cuda", generator=g) / d ** .5).bfloat16().requires_grad_(True)
    wd = (torch.randn(E, f, r, device="cuda", generator=g) / r ** .5).bfloat16().requires_grad_(True)
    logits = torch.randn(T, E, device="cuda", generator=g)
    if a.routing == "zipf":
        logits = logits + 8 * torch.log(1 / torch.arange(1, E + 1, device="cuda").float()) * 1.2
    probs, ids = torch.softmax(logits, -1).topk(k)

    def step(bwd):
        s = sort_by_expert(ids, E, probs)
        y = grouped_glu(x, s.offs, wg, wu, wd.transpose(1, 2), row_weight=s.row_weight, gather_idx=s.token,
                        scatter_idx=s.token, num_out_rows=T, impl="bmm")
        if bwd:
            y.backward(torch.ones_like(y))

    for bwd in (False, True):
        for _ in range(3):
            step(bwd)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            step(bwd)
            torch.cuda.synchronize()
        print(f"== {'forward+backward' if bwd else 'forward'}")
        ka = prof.key_averages(group_by_input_shape=True)
        for e in sorted(ka, key=lambda e: -e.device_time_total)[:a.rows]:
            if e.key.startswith("aten::"):
                print(f"{e.device_time_total / 1e3:8.3f} ms  x{e.count:<3d} {e.key:32s} {str(e.input_shapes)[:110]}")


if __name__ == "__main__":
    main()
