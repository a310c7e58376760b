"""Prototype: persistent up projection + combine (bf16, K-major w_down), y chunks kept in the L2.

Run: PYTHONPATH=python TSCT_TRITON_BACKEND=jit python3 sweep/upc_proto.py
"""
import os
import sys
import time

import torch
import triton
import triton.language as tl

from tsct.kernels import triton_glu as TG
from tsct.kernels.triton_glu import glu
from tsct.kernels.triton_glu._kernels import _expert_of_tile
from tsct.kernels.triton_glu._bench import route
from tsct.kernels.layout import to_kmajor


@triton.jit
def _grid_sync(sync_ptr, target):
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    cur = tl.load(sync_ptr, volatile=True)
    while cur < target:
        cur = tl.load(sync_ptr, volatile=True)
    tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _up_tile(z_ptr, wd_ptr, rw_ptr, buf, e, rows, hi, r, f, n, ks, ns, HAS_RW: tl.constexpr, BN: tl.constexpr,
             EV_W: tl.constexpr, EV_Y: tl.constexpr):
    rmask = rows < hi
    kmask = ks < r
    zt = tl.load(z_ptr + rows.to(tl.int64)[:, None] * r + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
    b = tl.load(wd_ptr + tl.cast(e, tl.int64) * r * f + (n + ns)[None, :] * r + ks[:, None],
                mask=kmask[:, None] & ((n + ns) < f)[None, :], other=0.0, eviction_policy=EV_W)
    acc = tl.dot(zt, b)
    if HAS_RW:
        acc = acc * tl.load(rw_ptr + rows, mask=rmask, other=0.0)[:, None]
    tl.store(buf + rows.to(tl.int64)[:, None] * BN + ns[None, :], acc.to(buf.dtype.element_ty),
             mask=rmask[:, None], eviction_policy=EV_Y)


@triton.jit
def up_combine(z_ptr, offs_ptr, cum_ptr, wd_ptr, rw_ptr, te_ptr, ybuf_ptr, order_ptr, ptr_ptr, out_ptr, sync_ptr,
               E, r, f, M, n_out,
               HAS_RW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
               BLOCK_E: tl.constexpr, EV_W: tl.constexpr, EV_Y: tl.constexpr, SYNC: tl.constexpr,
               PH: tl.constexpr = 3, A_MODE: tl.constexpr = 0, NH: tl.constexpr = 2):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    n_tiles = tl.load(cum_ptr + E - 1)
    # per tile: its expert and first row (te[i], te[nt + i]); read back by this program only
    nt = M // BM + E
    for i in range(pid, n_tiles, P):
        e = _expert_of_tile(cum_ptr, i, E, BLOCK_E)
        tb = tl.load(cum_ptr + e - 1, mask=e > 0, other=0)
        lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
        hi = tl.load(offs_ptr + e)
        tl.store(te_ptr + i, e)
        tl.store(te_ptr + nt + i, lo + (i - tb) * BM)
        tl.store(te_ptr + 2 * nt + i, hi)
    ks = tl.arange(0, BK)
    bm = tl.arange(0, BM)
    if A_MODE == 3:  # z's first BM rows of each of this program's experts at zp[e] (direct addresses in the loop)
        zp_ptr = te_ptr + 3 * nt  # (int32 scratch, reused as bf16 [E, BM, BK])
        zp_ptr = zp_ptr.to(tl.pointer_type(z_ptr.dtype.element_ty), bitcast=True)
        for e in range(pid, E, P):
            lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
            hi = tl.load(offs_ptr + e)
            rows = lo + bm
            zt = tl.load(z_ptr + rows.to(tl.int64)[:, None] * r + ks[None, :],
                         mask=(rows < hi)[:, None] & (ks < r)[None, :], other=0.0)
            tl.store(zp_ptr + (e * BM + bm)[:, None] * BK + ks[None, :], zt)
        # this program's experts with more than BM rows (none at b1): their other row tiles, per chunk
        ov_ptr = te_ptr + 3 * nt + E * BM * BK // 2 + pid * (E // P + 1)
        n_ov = pid * 0
        for e in range(pid, E, P):
            lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
            hi = tl.load(offs_ptr + e)
            tl.store(ov_ptr + n_ov, e, mask=hi - lo > BM)
            n_ov += (hi - lo > BM).to(tl.int32)
    tl.debug_barrier()
    # phase B: this program's targets [t_lo, t_hi); the first BT of them with their first two rows hoisted
    t_lo = (pid * n_out) // P
    t_hi = ((pid + 1) * n_out) // P
    tsh = t_lo + tl.arange(0, BT)[:, None]
    tmh = tsh < t_hi
    plo_h = tl.load(ptr_ptr + tsh, mask=tmh, other=0)
    phi_h = tl.load(ptr_ptr + tsh + 1, mask=tmh, other=0)
    cnt_h = phi_h - plo_h
    row0_h = tl.load(order_ptr + plo_h, mask=cnt_h > 0, other=0).to(tl.int32)
    row1_h = tl.load(order_ptr + plo_h + 1, mask=cnt_h > 1, other=0).to(tl.int32)
    kmax_h = tl.max(tl.max(cnt_h, axis=1), axis=0)
    ns = tl.arange(0, BN)
    bm = tl.arange(0, BM)
    bt = tl.arange(0, BT)
    kmask = ks < r
    nch = tl.cdiv(f, BN)
    BH: tl.constexpr = BN // NH
    for c in range(0, nch):
        n = c * BN
        buf = ybuf_ptr + tl.cast(c % 2, tl.int64) * M * BN
        if PH & 1:
            if A_MODE == 0:
                for i in range(pid, n_tiles, P):
                    e = tl.load(te_ptr + i)
                    rows = tl.load(te_ptr + nt + i) + bm
                    hi = tl.load(te_ptr + 2 * nt + i)
                    _up_tile(z_ptr, wd_ptr, rw_ptr, buf, e, rows, hi, r, f, n, ks, ns, HAS_RW, BN, EV_W, EV_Y)
            elif A_MODE == 1:  # experts as the loop index; first row tile only (timing probe)
                for e in range(pid, E, P):
                    lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
                    hi = tl.load(offs_ptr + e)
                    _up_tile(z_ptr, wd_ptr, rw_ptr, buf, e, lo + bm, hi, r, f, n, ks, ns, HAS_RW, BN, EV_W, EV_Y)
            elif A_MODE == 3:  # experts as the loop index, z from zp: every load address is direct
                for e in range(pid, E, P):
                    lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
                    hi = tl.load(offs_ptr + e)
                    zt = tl.load(zp_ptr + (e * BM + bm)[:, None] * BK + ks[None, :])
                    b = tl.load(wd_ptr + tl.cast(e, tl.int64) * r * f + (n + ns)[None, :] * r + ks[:, None],
                                mask=(kmask & (lo + ks * 0 < hi))[:, None] & ((n + ns) < f)[None, :], other=0.0,
                                eviction_policy=EV_W)
                    acc = tl.dot(zt, b)
                    rows = lo + bm
                    rmask = rows < hi
                    if HAS_RW:
                        acc = acc * tl.load(rw_ptr + rows, mask=rmask, other=0.0)[:, None]
                    tl.store(buf + rows.to(tl.int64)[:, None] * BN + ns[None, :], acc.to(buf.dtype.element_ty),
                             mask=rmask[:, None], eviction_policy=EV_Y)
                # rows past the first BM of an expert (none at b1): plain tiles
                for j in range(0, n_ov):
                    e = tl.load(ov_ptr + j)
                    lo = tl.load(offs_ptr + e - 1, mask=e > 0, other=0)
                    hi = tl.load(offs_ptr + e)
                    for r0 in range(lo + BM, hi, BM):
                        _up_tile(z_ptr, wd_ptr, rw_ptr, buf, e, r0 + bm, hi, r, f, n, ks, ns, HAS_RW, BN, EV_W, EV_Y)
            else:  # tiles; tile info loaded two tiles ahead, the z tile one ahead (registers): only w_down is
                # left to Triton's pipeliner, with an address known at the start of each iteration
                i1 = pid + P
                e1 = tl.load(te_ptr + i1, mask=i1 < n_tiles, other=0)
                r1 = tl.load(te_ptr + nt + i1, mask=i1 < n_tiles, other=0)
                h1 = tl.load(te_ptr + 2 * nt + i1, mask=i1 < n_tiles, other=0)
                e0 = tl.load(te_ptr + pid, mask=pid < n_tiles, other=0)
                r0 = tl.load(te_ptr + nt + pid, mask=pid < n_tiles, other=0)
                h0 = tl.load(te_ptr + 2 * nt + pid, mask=pid < n_tiles, other=0)
                z0 = tl.load(z_ptr + (r0 + bm).to(tl.int64)[:, None] * r + ks[None, :],
                             mask=((r0 + bm) < h0)[:, None] & kmask[None, :], other=0.0)
                for i in range(pid, n_tiles, P):
                    e = e0
                    rows = r0 + bm
                    hi = h0
                    zt = z0
                    e0 = e1
                    r0 = r1
                    h0 = h1
                    i2 = i + 2 * P
                    e1 = tl.load(te_ptr + i2, mask=i2 < n_tiles, other=0)
                    r1 = tl.load(te_ptr + nt + i2, mask=i2 < n_tiles, other=0)
                    h1 = tl.load(te_ptr + 2 * nt + i2, mask=i2 < n_tiles, other=0)
                    z0 = tl.load(z_ptr + (r0 + bm).to(tl.int64)[:, None] * r + ks[None, :],
                                 mask=((r0 + bm) < h0)[:, None] & kmask[None, :], other=0.0)
                    rmask = rows < hi
                    b = tl.load(wd_ptr + tl.cast(e, tl.int64) * r * f + (n + ns)[None, :] * r + ks[:, None],
                                mask=kmask[:, None] & ((n + ns) < f)[None, :], other=0.0, eviction_policy=EV_W)
                    acc = tl.dot(zt, b)
                    if HAS_RW:
                        acc = acc * tl.load(rw_ptr + rows, mask=rmask, other=0.0)[:, None]
                    tl.store(buf + rows.to(tl.int64)[:, None] * BN + ns[None, :], acc.to(buf.dtype.element_ty),
                             mask=rmask[:, None], eviction_policy=EV_Y)
        if SYNC:
            _grid_sync(sync_ptr, (c + 1) * P)
        if PH & 2:
            for h in tl.static_range(NH):
                cols = h * BH + tl.arange(0, BH)[None, :]
                acc_h = tl.zeros((BT, BH), dtype=tl.float32)
                y0 = tl.load(buf + row0_h.to(tl.int64) * BN + cols, mask=cnt_h > 0, other=0.0, cache_modifier=".cg")
                y1 = tl.load(buf + row1_h.to(tl.int64) * BN + cols, mask=cnt_h > 1, other=0.0, cache_modifier=".cg")
                acc_h += y0.to(tl.float32)
                acc_h += y1.to(tl.float32)
                for j in range(2, kmax_h):
                    jj = tl.load(ptr_ptr + tsh, mask=tmh, other=0) + j
                    v = j < cnt_h
                    row = tl.load(order_ptr + jj, mask=v, other=0)
                    acc_h += tl.load(buf + row.to(tl.int64) * BN + cols, mask=v, other=0.0,
                                   cache_modifier=".cg").to(tl.float32)
                tl.store(out_ptr + tsh.to(tl.int64) * f + n + cols, acc_h.to(out_ptr.dtype.element_ty),
                         mask=tmh & (n + cols < f), eviction_policy="evict_first")
        for t0 in range(t_lo + BT, t_hi if PH & 2 else t_lo, BT):
            ts = (t0 + bt)[:, None]
            tm = ts < t_hi
            plo = tl.load(ptr_ptr + ts, mask=tm, other=0)
            phi = tl.load(ptr_ptr + ts + 1, mask=tm, other=0)
            acc = tl.zeros((BT, BN), dtype=tl.float32)
            for j in range(0, tl.max(tl.max(phi - plo, axis=1), axis=0)):
                jj = plo + j
                v = jj < phi
                row = tl.load(order_ptr + jj, mask=v, other=0)
                acc += tl.load(buf + row.to(tl.int64) * BN + ns[None, :], mask=v, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
            tl.store(out_ptr + ts.to(tl.int64) * f + (n + ns)[None, :], acc.to(out_ptr.dtype.element_ty),
                     mask=tm & ((n + ns) < f)[None, :], eviction_policy="evict_first")


def main():
    T, K, E, D, R, F = 16384, 2, 1024, 2048, 64, 5461
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
    wg = torch.randn(E, D, R, device=dev, dtype=torch.bfloat16) * 0.02
    wu = torch.randn(E, D, R, device=dev, dtype=torch.bfloat16) * 0.02
    wd = to_kmajor(torch.randn(E, R, F, device=dev, dtype=torch.bfloat16) * 0.1)
    logits = torch.randn(T, E, device=dev)
    wts, ids = torch.topk(torch.softmax(logits, -1), K)
    offs, token, rw, _, _ = route(ids, wts, E)
    out0, saved = TG.grouped_glu_forward_saved(x, offs, wg, wu, wd, None, None, rw, token, token, T)
    z = saved[2]
    order, ptr = saved[3], saved[4]
    m = token.shape[0]
    cap = glu._capability(dev)
    cfg = glu._config(cap)
    cum = glu._tile_cum(offs, 64, cap)

    def base():
        ldy = (F + 7) // 8 * 8
        y = torch.empty(m, ldy, device=dev, dtype=torch.bfloat16)
        glu._launch("glu_up_fwd", (m // 64 + E, 1), [z, offs, cum, wd, None, y, E, R, F, ldy],
                    dict(HAS_RW=False, FSPLIT=1, SINGLE_K=True, VEC=False, Y_PAD=True, WD_T=True, BM=64, BN=256,
                         BK=64, BLOCK_E=1024), 8, 4, True, cap, dev)
        return glu._combine(y, token, offs, T, cfg, cap, ncols=F, csr=(order, ptr))

    nsm = torch.cuda.get_device_properties(dev).multi_processor_count
    te = torch.empty(3 * (m // 64 + E) + E * 64 * 64 // 2 + nsm * (E // nsm + 1), device=dev, dtype=torch.int32)

    def new(bn=256, bt=64, stages=3, warps=8, ev_w="evict_first", ev_y="evict_last", progs=nsm, sync=True, ph=3, am=0, nh=2):
        ybuf = torch.empty(2, m, bn, device=dev, dtype=torch.bfloat16)
        out = torch.empty(T, F, device=dev, dtype=torch.bfloat16)
        cnt = torch.zeros(1, device=dev, dtype=torch.int32)
        up_combine[(progs,)](z, offs, cum, wd, None, te, ybuf, order, ptr, out, cnt, E, R, F, m, T,
                             HAS_RW=False, BM=64, BN=bn, BK=64, BT=bt, BLOCK_E=1024, EV_W=ev_w, EV_Y=ev_y,
                             SYNC=sync, PH=ph, A_MODE=am, NH=nh, num_warps=warps, num_stages=stages)
        return out, cnt

    ref = base()
    print("base vs op out equal:", torch.equal(ref, out0))

    def timeit(fn, n=30):
        fn(); torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(n):
            s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2]

    print(f"base up+combine: {timeit(base):.4f} ms")
    ldy = (F + 7) // 8 * 8
    yb = torch.empty(m, ldy, device=dev, dtype=torch.bfloat16)
    def up_only():
        glu._launch("glu_up_fwd", (m // 64 + E, 1), [z, offs, cum, wd, None, yb, E, R, F, ldy],
                    dict(HAS_RW=False, FSPLIT=1, SINGLE_K=True, VEC=False, Y_PAD=True, WD_T=True, BM=64, BN=256,
                         BK=64, BLOCK_E=1024), 8, 4, True, cap, dev)
    print(f"base up only: {timeit(up_only):.4f} ms, combine only: {timeit(lambda: glu._combine(yb, token, offs, T, cfg, cap, ncols=F, csr=(order, ptr))):.4f} ms")
    variants = [dict(am=3, bt=128, nh=4), dict(am=3, bt=128, nh=2), dict(am=3, bt=128, nh=4, stages=4),
                dict(am=3, ph=1, bt=128, nh=4), dict(am=3, ph=1, bt=128, nh=4, sync=False),
                dict(am=3, ph=2, bt=128, nh=4), dict(am=3, ph=2, bt=128, nh=4, sync=False),
                dict(am=3, bt=128, nh=4, ev_w="", ev_y=""), dict(am=3, bt=128, nh=2, bn=128, stages=4),
                dict(am=3, ph=1, bt=128, nh=2, bn=128, stages=4)]
    if len(sys.argv) > 1:
        variants = [eval(a) for a in sys.argv[1:]]
    for v in variants:
        try:
            out, cnt = new(**v)
            torch.cuda.synchronize()
            nch = -(-F // v.get("bn", 256))
            ok = torch.equal(out, ref) if v.get("sync", True) and v.get("ph", 3) == 3 else None
            print(f"{v}: equal={ok} counter={int(cnt)} (want {nch * nsm if v.get('sync', True) else 0}) "
                  f"{timeit(lambda: new(**v)):.4f} ms", flush=True)
        except Exception as ex:  # noqa
            print(f"{v}: FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)


if __name__ == "__main__":
    main()
