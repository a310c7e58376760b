"""Kernel-side timing harness for the Triton grouped GLU at the b1 shape (until tsct-bench lands).

Times the whole expert pass as design.md section 2 defines it: token-major x [T, d] plus router
top-k ids and weights in, token-major [T, f] out, including the sort by expert, the offsets, the
gather (fused) and the combine (fused). Forward, and forward+backward through autograd (grad of x,
all factors, both scales and the router weights). Medians of triton.testing.do_bench (which clears
the L2 between runs), eager and CUDA-graph replay, plus the padded bmm (capacity 64) baseline and
a per-kernel breakdown from torch.profiler.

    PYTHONPATH=python python3 tools/triton_glu_bench.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.testing

from tsct.kernels import triton_glu as TG
from tsct.kernels.layout import to_kmajor

T, K, E, D, R, F = 16384, 2, 1024, 2048, 64, 5461


class _Op(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out):
        # as the custom op (ops/_function.py) does: the forward saves hg, hu, z*rw for the backward
        out, saved = TG.grouped_glu_forward_saved(x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out)
        ctx.save_for_backward(x, offs, wg, wu, wd, sg, su, rw, gi, si, *saved)
        ctx.n_out = n_out
        return out

    @staticmethod
    def backward(ctx, go):
        x, offs, wg, wu, wd, sg, su, rw, gi, si, *saved = ctx.saved_tensors
        n = ctx.needs_input_grad
        needs = [n[0], n[2], n[3], n[4], n[5], n[6], n[7]]
        g = TG.grouped_glu_backward(go.contiguous(), x, offs, wg, wu, wd, sg, su, rw, gi, si, ctx.n_out, needs,
                                    saved=saved)
        return g[0], None, g[1], g[2], g[3], g[4], g[5], g[6], None, None, None


def route(ids: torch.Tensor, wts: torch.Tensor, n_exp: int):
    """Sort routed rows by expert (sync-free): offs, gather_idx (= token of each row), row weights."""
    flat = ids.flatten().to(torch.int32)
    sorted_e, perm = torch.sort(flat, stable=True)
    offs = torch.searchsorted(sorted_e, torch.arange(n_exp, device=ids.device, dtype=torch.int32),
                              right=True).to(torch.int32)
    token = perm // ids.shape[1]
    rw = wts.flatten()[perm]
    return offs, token, rw, sorted_e, perm


def expert_pass(x, ids, wts, p):
    offs, token, rw, _, _ = route(ids, wts, p["wg"].shape[0])
    return _Op.apply(x, offs, p["wg"], p["wu"], p["wd"], p["sg"], p["su"], rw, token, token, x.shape[0])


def padded_bmm_pass(x, ids, wts, p, cap=64):
    """The user's baseline: capacity-padded torch.bmm (rows past the capacity are dropped)."""
    n_exp = p["wg"].shape[0]
    offs, token, rw, sorted_e, _ = route(ids, wts, n_exp)
    m = token.shape[0]
    start = offs.long() - torch.bincount(sorted_e, minlength=n_exp)[: n_exp]
    pos = torch.arange(m, device=x.device) - start[sorted_e]
    keep = pos < cap
    slot = torch.where(keep, sorted_e * cap + pos, n_exp * cap)
    xp = x.new_zeros(n_exp * cap + 1, x.shape[1]).index_copy(0, slot, x[token])[:-1].view(n_exp, cap, -1)
    g = torch.bmm(xp, p["wg"]) * p["sg"][:, None, :]
    u = torch.bmm(xp, p["wu"]) * p["su"][:, None, :]
    y = torch.bmm(torch.nn.functional.silu(g) * u, p["wd"]).view(n_exp * cap, -1)
    yr = y[slot.clamp(max=n_exp * cap - 1)] * (rw * keep)[:, None]
    return x.new_zeros(x.shape[0], y.shape[1]).index_add(0, token, yr)


def make(dtype=torch.bfloat16, seed=0, kmajor=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    x = torch.randn(T, D, device=dev, generator=g).to(dtype)
    logits = torch.randn(T, E, device=dev, generator=g)
    top = logits.topk(K, dim=1)
    ids, wts = top.indices, torch.softmax(top.values, dim=1).to(dtype)
    p = dict(
        wg=(torch.randn(E, D, R, device=dev, generator=g) * D ** -0.5).to(dtype),
        wu=(torch.randn(E, D, R, device=dev, generator=g) * D ** -0.5).to(dtype),
        wd=(torch.randn(E, R, F, device=dev, generator=g) * R ** -0.5).to(dtype),
        sg=(1 + 0.1 * torch.randn(E, R, device=dev, generator=g)).to(dtype),
        su=(1 + 0.1 * torch.randn(E, R, device=dev, generator=g)).to(dtype),
    )
    if kmajor:  # w_down as the transpose of a contiguous [E, f, r] (decision 0012)
        p["wd"] = to_kmajor(p["wd"])
    return x, ids, wts, p


def bench(fn, grad_to_none=None):
    return triton.testing.do_bench(fn, warmup=50, rep=300, grad_to_none=grad_to_none, return_mode="median")


def host_ms(fn, n=8, zero=None):
    """Host (CPU) time per call, ms: n calls queued without a sync. Meaningful only while n times the
    launches per call stay well under the launch queue's depth (the forward at b1); past that the host
    waits for the GPU and this reads as GPU time (the forward+backward, ~100 launches per call)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
        if zero is not None:
            for t in zero:
                t.grad = None
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    return gr


def profile_kernels(fn, iters=10, zero=None):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
            if zero is not None:
                for t in zero:
                    t.grad = None
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", None)
        if dt is None:
            dt = getattr(ev, "cuda_time_total", 0)
        if dt > 0:
            rows.append((ev.key[:60], dt / iters / 1000.0, ev.count // iters))
    rows.sort(key=lambda t: -t[1])
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--variants", default="", help='config overrides to time too, e.g. "bn_bwd=64;warps_up=4"')
    ap.add_argument("--kmajor", action="store_true", help="w_down K-major (the transpose of a contiguous [E, f, r])")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    x, ids, wts, p = make(kmajor=a.kmajor)
    res = {"shape": dict(T=T, k=K, E=E, d=D, r=R, f=F), "dtype": "bf16", "w_down": "kmajor" if a.kmajor else "rowmajor",
           "device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}

    # forward (no autograd)
    with torch.no_grad():
        res["fwd_eager_ms"] = bench(lambda: expert_pass(x, ids, wts, p))
        res["fwd_host_ms"] = host_ms(lambda: expert_pass(x, ids, wts, p))
        gr = graph_of(lambda: expert_pass(x, ids, wts, p))
        res["fwd_graph_ms"] = bench(gr.replay)
        kern_fwd = profile_kernels(lambda: expert_pass(x, ids, wts, p))
        res["kernels_fwd"] = [dict(name=n, ms=t, calls=c) for n, t, c in kern_fwd]

    # forward + backward through autograd: grads of x, factors, scales, router weights
    xg = x.clone().requires_grad_(True)
    wg_ = wts.clone().requires_grad_(True)
    pg = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    go = torch.randn(T, F, device="cuda").to(x.dtype)
    leaves = [xg, wg_] + list(pg.values())

    def fwd_bwd():
        out = expert_pass(xg, ids, wg_, pg)
        out.backward(go)

    res["fwd_bwd_eager_ms"] = bench(fwd_bwd, grad_to_none=leaves)
    res["fwd_bwd_host_ms"] = host_ms(fwd_bwd, zero=leaves)
    kern = profile_kernels(fwd_bwd, zero=leaves)
    res["kernels_fwd_bwd"] = [dict(name=n, ms=t, calls=c) for n, t, c in kern]

    # forward + backward with the op's two halves called directly, in a CUDA graph
    def fb_direct():
        offs, token, rw, _, _ = route(ids, wts, E)
        args = (x, offs, p["wg"], p["wu"], p["wd"], p["sg"], p["su"], rw, token, token, T)
        _, saved = TG.grouped_glu_forward_saved(*args)
        TG.grouped_glu_backward(go, *args, [True] * 7, saved=saved)

    gr2 = graph_of(fb_direct)
    res["fwd_bwd_graph_ms"] = bench(gr2.replay)

    variants = []
    from tsct.kernels.triton_glu import glu as _glu
    for spec in filter(None, (v.strip() for v in a.variants.split(";"))):
        try:
            with _glu.overridden(spec):
                with torch.no_grad():
                    gv = graph_of(lambda: expert_pass(x, ids, wts, p))
                    tf = bench(gv.replay)
                gv2 = graph_of(fb_direct)
                tfb = bench(gv2.replay)
            variants.append(dict(spec=spec, fwd_graph_ms=tf, fwd_bwd_graph_ms=tfb))
            del gv, gv2
        except Exception as exc:  # a variant that fails to compile or run is reported, not fatal
            variants.append(dict(spec=spec, error=repr(exc)[:200]))
    res["variants"] = variants

    if not a.no_baseline:
        with torch.no_grad():
            res["bmm_fwd_ms"] = bench(lambda: padded_bmm_pass(x, ids, wts, p))

        def bmm_fb():
            padded_bmm_pass(xg, ids, wg_, pg).backward(go)

        res["bmm_fwd_bwd_ms"] = bench(bmm_fb, grad_to_none=leaves)
        with torch.no_grad():
            ref = padded_bmm_pass(x, ids, wts, p).float()
            out = expert_pass(x, ids, wts, p).float()
            res["rel_err_vs_bmm"] = ((out - ref).norm() / ref.norm()).item()

    floor_bytes = (T * D + E * (2 * D * R + R * F + 2 * R) + T * F) * 2
    res["bytes_floor_GB"] = floor_bytes / 1e9
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)

    print("\nper-kernel device time, forward (no grad) eager (ms per pass):")
    for n, t, c in kern_fwd[:16]:
        print(f"  {t:8.4f}  x{c:<3d} {n}")
    print("\nper-kernel device time, fwd+bwd eager (ms per pass):")
    for n, t, c in kern[:16]:
        print(f"  {t:8.4f}  x{c:<3d} {n}")
    if variants:
        print("\nconfig variants (CUDA graph replay, ms):")
        for v in variants:
            print(f"  {v['spec']:40s} " + (f"fwd {v['fwd_graph_ms']:.3f}  fwd+bwd {v['fwd_bwd_graph_ms']:.3f}"
                                           if "error" not in v else v["error"]))
    print("\nb1 whole expert pass (bf16, H200), medians of do_bench:")
    print(f"  {'what':28s} {'ms':>8s}")
    for key in ("fwd_eager_ms", "fwd_graph_ms", "fwd_host_ms", "fwd_bwd_eager_ms", "fwd_bwd_graph_ms",
                "fwd_bwd_host_ms", "bmm_fwd_ms",
                "bmm_fwd_bwd_ms"):
        if key in res:
            print(f"  {key:28s} {res[key]:8.3f}")
    if "bmm_fwd_ms" in res:
        print(f"  speedup fwd {res['bmm_fwd_ms'] / res['fwd_eager_ms']:.2f}x, fwd+bwd "
              f"{res['bmm_fwd_bwd_ms'] / res['fwd_bwd_eager_ms']:.2f}x over padded bmm; rel err vs bmm "
              f"{res.get('rel_err_vs_bmm', float('nan')):.2e}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
