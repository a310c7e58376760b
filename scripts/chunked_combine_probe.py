"""Device probe (docs/performance.md): does computing the up projection and the combine in column chunks
keep y in the L2 cache?

    python3 scripts/chunked_combine_probe.py [--fmt nvfp4|sign] [--chunks 128,256,512,1024] [--json PATH]

At b1 the forward's up projection writes y [M, f] (0.36 GB in bf16) and ``combine_rows`` reads it back: 0.72 GB
of the low-bit forward's ~1.3 GB of DRAM traffic. Run column chunk by column chunk instead (the up projection of
f columns [c0, c1) into ONE reused y buffer [M, c1 - c0], then the combine of those columns), y's chunk is
written and read back while it is still in the L2 (16.8 MB at 256 columns, against the H200's 50 MB; the
streaming factor and output bytes pass through too), so it never reaches DRAM. The cost: a launch pair per chunk
and their wave tails.

This probe times, on the b1 shape and routing, with the installed tsct's kernels (the CUDA up projection of the
low-bit path, ``tsct.native.glu_up_fwd_lowbit``; the Triton ``combine_rows`` with its CSR built outside the
timing), both as one CUDA graph each (no host gaps):

  whole     up projection of all f columns into y [M, ldy], then the combine
  chunk=N   per chunk of N columns: the up projection into the reused y chunk, the combine into that chunk's
            output columns (a [T, N] buffer per chunk here: the probe measures, it does not assemble out)

and checks that the chunked outputs are the whole one's columns, bit for bit (same per-column math and sum order).
Needs a CUDA GPU with the native library's low-bit kernels (sm_90 here; decision 0014).
"""
from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="nvfp4", choices=("nvfp4", "sign"))
    ap.add_argument("--chunks", default="128,256,512,1024")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from tsct import native, quant
    from tsct.bench import inputs, measure, routing
    from tsct.bench.config import from_preset
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_lowbit import glu as L

    cfg = from_preset("b1", device="cuda").resolved()
    dev = torch.device("cuda")
    t, e, f, r = cfg.tokens, cfg.experts, cfg.f, cfg.r
    s = inputs.make_input_sets(cfg, 1)[0]
    srt = routing.sort_by_expert(s.ids, e)
    m = srt.token.shape[0]
    g = torch.Generator(device=dev).manual_seed(7)
    wd = torch.randn(e, r, f, generator=g, device=dev) * r ** -0.5
    wq = quant.quantize(wd.to(torch.bfloat16), a.fmt)
    _, pd = L._factor_args("w_down", wq, torch.bfloat16)  # [E, f, *] storage: a column chunk = a row range
    z = (torch.randn(m, r, generator=g, device=dev) * 0.5).to(torch.bfloat16)
    rw = torch.rand(m, generator=g, device=dev)
    offs = srt.offs
    cap = torch.cuda.get_device_capability(dev)
    gcfg = C.tile_config(cap)
    cum = C.tile_cum(offs, native.GLU_DOWN_TILE, cap)
    max_tiles = -(-m // native.GLU_DOWN_TILE) + e
    csr = C.build_csr(srt.token, offs, m, t, cap)

    def up(storage, y, ncols):
        native.glu_up_fwd_lowbit(z, offs, cum, storage, y, fmt=a.fmt, f=ncols, max_tiles=max_tiles, row_weight=rw,
                                 validate=False)

    def chunk_storage(c0, c1):  # the experts' columns [c0, c1): the [E, f, ...] storage sliced along dim 1
        codes, scales, third = pd
        if a.fmt == "nvfp4":
            return (codes[:, c0:c1].contiguous(), scales[:, c0:c1].contiguous(), third)
        return (codes[:, c0:c1].contiguous(), scales, third[:, c0:c1].contiguous())

    ldy = -(-f // 8) * 8
    y = torch.empty(m, ldy, device=dev, dtype=torch.bfloat16)

    def whole():
        up(pd, y, f)
        return C.combine(y, srt.token, offs, t, gcfg, cap, ncols=f, csr=csr)

    def timed(fn):  # (fn's output, the median ms of its CUDA-graph replay)
        out = fn()
        return out, measure.time_graph(lambda i: fn(), dev, replays=a.iters)["median"]

    ref, ms_whole = timed(whole)
    res = {"device": torch.cuda.get_device_name(dev), "fmt": a.fmt, "shape": dict(T=t, M=m, E=e, f=f, r=r),
           "whole_ms": ms_whole, "chunks": {}}
    print(f"whole: up + combine {ms_whole:.4f} ms (graph replay, median of {a.iters})", flush=True)
    for n in (int(v) for v in a.chunks.split(",")):
        bounds = [(c0, min(c0 + n, f)) for c0 in range(0, f, n)]
        parts = [chunk_storage(c0, c1) for c0, c1 in bounds]
        yc = torch.empty(m, -(-n // 8) * 8, device=dev, dtype=torch.bfloat16)

        def chunked(bounds=bounds, parts=parts, yc=yc):
            outs = []
            for (c0, c1), st in zip(bounds, parts):  # the last chunk may be narrower: y rows keep their stride
                up(st, yc, c1 - c0)
                outs.append(C.combine(yc, srt.token, offs, t, gcfg, cap, ncols=c1 - c0, csr=csr))
            return outs

        outs, ms = timed(chunked)
        same = all(torch.equal(o, ref[:, c0:c1]) for o, (c0, c1) in zip(outs, bounds))
        res["chunks"][n] = {"ms": ms, "launch_pairs": len(bounds), "bit_identical": same,
                            "y_chunk_MB": m * yc.shape[1] * 2 / 2 ** 20}
        print(f"chunk={n:5d}: {ms:.4f} ms ({len(bounds)} up+combine pairs, y chunk "
              f"{res['chunks'][n]['y_chunk_MB']:.1f} MiB), bit-identical to whole: {same}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
