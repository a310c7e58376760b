"""Where the bmm path's time goes at b1 (T 16384, top-2, E 1024, d 2048, r 64, f 5461; bf16 w_down K-major).

Prints, for the forward and the forward+backward of the whole pass (sort_by_expert + grouped_glu, impl="bmm"):
the eager time per call (back-to-back calls between two CUDA events, as tsct-bench times them), the host time to
issue one call on an idle GPU, the device time of its kernels (torch.profiler, summed) and the kernel count, then
the heaviest kernels; and the decode of packed factors (NVFP4, sign) to bf16, in storage order and contiguous.

    python tools/bmm_profile.py [--routing zipf] [--rows 12]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from tsct import quant
from tsct.ops import grouped_glu, sort_by_expert


def _events_ms(fn, n: int) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--routing", default="softmax", choices=("softmax", "zipf"))
    ap.add_argument("--rows", type=int, default=12)
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
    dy = torch.randn(T, f, device="cuda", dtype=torch.bfloat16, generator=g)

    def step(bwd):
        s = sort_by_expert(ids, E, probs)
        y = grouped_glu(x, s.offs, wg, wu, wd.transpose(1, 2), row_weight=s.row_weight, gather_idx=s.token,
                        scatter_idx=s.token, num_out_rows=T, impl="bmm")
        if bwd:
            torch.autograd.grad(y, (x, wg, wu, wd), dy)

    for bwd in (False, True):
        name = "forward+backward" if bwd else "forward"
        eager = _events_ms(lambda: step(bwd), 20)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(bwd)
        host = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(bwd)
            torch.cuda.synchronize()
        kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        dev = sum(e.device_time for e in kern) / 1e3
        print(f"== {name}: eager {eager:.3f} ms/call, host issue {host:.3f} ms, device {dev:.3f} ms "
              f"in {len(kern)} kernels")
        tot = {}
        for e in kern:
            c, t = tot.get(e.name, (0, 0.0))
            tot[e.name] = (c + 1, t + e.device_time / 1e3)
        for kname, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:a.rows]:
            print(f"  {t:8.3f} ms  x{c:<3d} {kname[:110]}")

    print("== decode to bf16 (ms per factor; storage order / contiguous)")
    for fmt in ("nvfp4", "sign"):
        for name, w in (("w_gate", wg), ("w_down K-major", wd.transpose(1, 2))):
            q = quant.quantize(w.detach(), fmt)
            ms = [_events_ms(lambda c=c: quant.dequantize(q, torch.bfloat16, contiguous=c), 5) for c in (False, True)]
            print(f"  {fmt:6s} {name:15s} {ms[0]:.3f} / {ms[1]:.3f}")


if __name__ == "__main__":
    main()
