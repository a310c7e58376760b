"""Session 13: combine variants at b1 (y [32768, 5464] bf16 -> out [16384, 5461], top-2 CSR of the b1 routing), JIT,
graph-replayed kernel alone. A: shipped combine_rows (1 warp, BN 1024). U: the first two rows of each target loaded
together (one dependent latency chain instead of two), then the rest in order: the same fp32 sum, same bits."""
import sys
import torch
import triton
import triton.language as tl
from tsct.bench import measure
from tsct.kernels.triton_glu import glu as G, _kernels as K


@triton.jit
def comb_u2(src_ptr, order_ptr, ptr_ptr, out_ptr, ncols, ld_src, SRC8: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr):
    t = tl.program_id(0)
    pn = tl.program_id(1)
    lo = tl.load(ptr_ptr + t)
    hi = tl.load(ptr_ptr + t + 1)
    r0 = tl.load(order_ptr + lo, mask=lo < hi, other=0).to(tl.int64)
    r1 = tl.load(order_ptr + lo + 1, mask=lo + 1 < hi, other=0).to(tl.int64)
    if SRC8:
        ld_src = (ld_src // 8) * 8
    for b in tl.static_range(NB):
        cols = (pn * NB + b) * BN + tl.arange(0, BN)
        cmask = cols < ncols
        lmask = cols < ld_src if SRC8 else cmask
        v0 = tl.load(src_ptr + r0 * ld_src + cols, mask=lmask & (lo < hi), other=0.0).to(tl.float32)
        v1 = tl.load(src_ptr + r1 * ld_src + cols, mask=lmask & (lo + 1 < hi), other=0.0).to(tl.float32)
        acc = tl.zeros((BN,), dtype=tl.float32) + v0 + v1
        for j in range(lo + 2, hi):
            row = tl.load(order_ptr + j).to(tl.int64)
            acc += tl.load(src_ptr + row * ld_src + cols, mask=lmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + t.to(tl.int64) * ncols + cols, acc.to(out_ptr.dtype.element_ty), mask=cmask)


dev = torch.device("cuda")
T, k, E, f = 16384, 2, 1024, 5461
M = T * k
ldy = (f + 7) // 8 * 8
g = torch.Generator(device=dev).manual_seed(0)
y = torch.randn(M, ldy, generator=g, device=dev).bfloat16()
ids = torch.randint(0, E, (T, k), generator=g, device=dev)
import tsct
s = tsct.ops.sort_by_expert(ids, E)
cap = torch.cuda.get_device_capability()
order, ptr = G.build_csr(s.token, s.offs, M, T, cap)
out_ref = torch.empty(T, f, device=dev, dtype=torch.bfloat16)
K.combine_rows[(T, 6)](y, order, ptr, out_ref, f, ldy, SRC8=True, BN=1024, PDL=False, num_warps=1)
res = {}
def timeit(tag, fn):
    v = measure.time_graph(lambda i: fn(), dev, replays=100)["median"]
    res[tag] = v
    print(f"{tag}: {v:.4f} ms", flush=True)
for ncols, ld, mrows in ((f, ldy, M), (2048, 2048, M)):
    src = y if ncols == f else torch.randn(M, 2048, generator=g, device=dev).bfloat16()
    ref = torch.empty(T, ncols, device=dev, dtype=torch.bfloat16)
    K.combine_rows[(T, triton.cdiv(ncols, 1024))](src, order, ptr, ref, ncols, ld, SRC8=True, BN=1024, PDL=False, num_warps=1)
    for rep in range(2):
        o = torch.empty_like(ref)
        timeit(f"n{ncols} A BN1024 w1", lambda: K.combine_rows[(T, triton.cdiv(ncols, 1024))](src, order, ptr, o, ncols, ld, SRC8=True, BN=1024, PDL=False, num_warps=1))
        for bn, nb, w in ((2048, 3, 4), (2048, 3, 8), (2048, 3, 2), (4096, 2, 4), (4096, 2, 8), (8192, 1, 4), (8192, 1, 8), (8192, 1, 16), (1024, 6, 2), (2048, 1, 2), (2048, 1, 4), (1024, 2, 2), (1024, 2, 1), (2048, 2, 4), (4096, 1, 4), (4096, 1, 8)):
            if ncols == 2048 and bn * nb > 4096:
                continue
            o = torch.full_like(ref, float("nan"))
            grid = (T, triton.cdiv(ncols, bn * nb))
            comb_u2[grid](src, order, ptr, o, ncols, ld, SRC8=True, BN=bn, NB=nb, num_warps=w)
            torch.cuda.synchronize()
            assert torch.equal(o, ref), (bn, nb, w)
            timeit(f"n{ncols} U BN{bn} NB{nb} w{w}", lambda: comb_u2[grid](src, order, ptr, o, ncols, ld, SRC8=True, BN=bn, NB=nb, num_warps=w))
print("bytes floor at 4.23 TB/s:", (M * f * 2 + T * f * 2) / 4.23e12 * 1e3, "ms", (M * 2048 * 2 + T * 2048 * 2) / 4.23e12 * 1e3)
