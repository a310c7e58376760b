# Harness of the rejected CUDA prototype (session 11), run from the repo root on the H200 as
#   PYTHONPATH=python TSCT_TRITON_BACKEND=jit python3 sweep/upc_cuda_run.py sweep/upc_v1.so ...
# with each .so built from 2026-11-30_cuda_persistent_up_combine_rejected.cu (copied to sweep/upc_cuda.cu):
#   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc -shared -Xcompiler -fPIC [-DMACRO=...] -o sweep/upc_v1.so sweep/upc_cuda.cu
"""Prototype harness: CUDA persistent up + combine (sweep/upc_cuda.cu -> upc_cuda.so) against the shipped pair."""
import ctypes
import sys

import torch

from tsct.kernels import triton_glu as TG
from tsct.kernels.triton_glu import glu
from tsct.kernels.triton_glu._bench import route
from tsct.kernels.layout import to_kmajor

LIBS = sys.argv[1:] or ["sweep/upc_cuda.so"]


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
    ldy = (F + 7) // 8 * 8
    yb = torch.empty(m, ldy, device=dev, dtype=torch.bfloat16)

    def up_only():
        glu._launch("glu_up_fwd", (m // 64 + E, 1), [z, offs, cum, wd, None, yb, E, R, F, ldy],
                    dict(HAS_RW=False, FSPLIT=1, SINGLE_K=True, VEC=False, Y_PAD=True, WD_T=True, BM=64, BN=256,
                         BK=64, BLOCK_E=1024), 8, 4, True, cap, dev)

    def base():
        up_only()
        return glu._combine(yb, token, offs, T, cfg, cap, ncols=F, csr=(order, ptr))

    nsm = torch.cuda.get_device_properties(dev).multi_processor_count
    wdk = wd.transpose(1, 2)  # [E, f, 64] contiguous storage
    assert wdk.is_contiguous()
    ybuf = torch.empty(2, m, 256, device=dev, dtype=torch.bfloat16)
    cnt = torch.zeros(1, device=dev, dtype=torch.int32)

    def new(evict=1, rwt=None, zz=z, mode=7):
        out = torch.empty(T, F, device=dev, dtype=torch.bfloat16)
        rc = globals()['_lib'].upc_launch(ctypes.c_void_p(zz.data_ptr()), ctypes.c_void_p(offs.data_ptr()),
                            ctypes.c_void_p(wdk.data_ptr()),
                            ctypes.c_void_p(rwt.data_ptr() if rwt is not None else 0), ctypes.c_void_p(ybuf.data_ptr()),
                            ctypes.c_void_p(order.data_ptr()), ctypes.c_void_p(ptr.data_ptr()),
                            ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(cnt.data_ptr()), E, F, m, T, nsm, evict, mode,
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        assert rc == 0, rc
        return out

    ref = base()
    torch.cuda.synchronize()
    print("base == op:", torch.equal(ref, out0), "order/ptr dtypes", order.dtype, ptr.dtype)
    # fp64 reference of the combine of (z @ Wd) (z is saved z * rw)
    yref = torch.empty(m, F, device=dev, dtype=torch.float64)
    oc = [0] + offs.tolist()
    for e0 in range(E):
        if oc[e0 + 1] > oc[e0]:
            yref[oc[e0]:oc[e0 + 1]] = z[oc[e0]:oc[e0 + 1]].double() @ wd[e0].double()
    oref = torch.zeros(T, F, device=dev, dtype=torch.float64).index_add_(0, token, yref)
    scale = oref.abs().max().item()
    print(f"base err vs fp64: {(ref.double() - oref).abs().max().item() / scale:.3e} (relative to max |out| {scale:.3f})")
    def timeit(fn, n=30):
        fn(); torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(n):
            s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2]
    print(f"base up+combine {timeit(base):.4f} ms; up only {timeit(up_only):.4f}; "
          f"combine only {timeit(lambda: glu._combine(yb, token, offs, T, cfg, cap, ncols=F, csr=(order, ptr))):.4f}")
    for path in LIBS:
        lib = ctypes.CDLL(path)
        lib.upc_launch.restype = ctypes.c_int
        globals()["_lib"] = lib
        print("==", path, flush=True)
        for ev in (1, 3):
            o = new(ev)
            torch.cuda.synchronize()
            o2 = new(ev)
            torch.cuda.synchronize()
            print(f"  evict={ev}: err vs fp64 {(o.double() - oref).abs().max().item() / scale:.3e}, bits equal to base: "
                  f"{torch.equal(o, ref)}, repeat equal {torch.equal(o, o2)}, counter {int(cnt)}; full "
                  f"{timeit(lambda: new(ev)):.4f} ms, A only {timeit(lambda: new(ev, mode=1)):.4f}, "
                  f"B only {timeit(lambda: new(ev, mode=4)):.4f}", flush=True)


if __name__ == "__main__":
    main()
