"""Device probe (bench/notes.md "v8", next steps): can bf16 atomics replace the y round trip of the combine?

    python3 scripts/atomic_combine_probe.py [--f 5461] [--tokens 16384] [--topk 2]

At b1 the up projection writes y [M, f] (bf16, row stride padded to 16 bytes) and ``combine_rows``
reads it back to sum each token's k rows into out [T, f]. A fused combine would instead add each
routed row into out[token] with atomics in the up kernel's epilogue. This probe times the two memory
patterns alone (values made in registers, no GEMM), on the real routing (rows in expert order, so a
token's two rows land far apart in time), and checks the atomic result's bits against the combine:

  store_y     y[row, :f] = v(row)                              (what the up kernel's epilogue writes)
  combine     tsct's combine_rows of that y (CSR built outside the timing)
  atomic      out.zero_() then out[token(row), :f] += v(row)   (tl.atomic_add, bf16, relaxed)
  atomic_f32  the same into an fp32 out (then no bf16 atomics needed; a cast pass would follow)

For top-2 the atomic sum is the same bits as the combine's (0 + a = a exactly; a + b = b + a), so a
deterministic fused combine is possible if ``atomic`` costs less than ``store_y + combine``.
Needs a CUDA GPU and Triton (JIT).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _val(rows, cols):
    """A cheap deterministic value per (row, column), exactly representable in bf16 sums' range."""
    h = (rows[:, None] * 7919 + cols[None, :] * 104729) % 2003
    return (h.to(tl.float32) - 1001.0) * (1.0 / 1024.0)


@triton.jit
def store_y(y_ptr, M, f, ldy, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    ldy = (ldy // 8) * 8
    for n in range(0, f, BN):
        cols = n + tl.arange(0, BN)
        v = _val(rows, cols)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * ldy + cols[None, :], v.to(y_ptr.dtype.element_ty),
                 mask=(rows < M)[:, None] & (cols < ldy)[None, :])


@triton.jit
def atomic_rows(out_ptr, tok_ptr, M, f, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rmask = rows < M
    tok = tl.load(tok_ptr + rows, mask=rmask, other=0).to(tl.int64)
    for n in range(0, f, BN):
        cols = n + tl.arange(0, BN)
        v = _val(rows, cols)
        tl.atomic_add(out_ptr + tok[:, None] * f + cols[None, :], v.to(out_ptr.dtype.element_ty),
                      mask=rmask[:, None] & (cols < f)[None, :], sem="relaxed")


def _time(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--experts", type=int, default=1024)
    ap.add_argument("--f", type=int, default=5461)
    ap.add_argument("--bm", type=int, default=64)
    ap.add_argument("--bn", type=int, default=256)
    a = ap.parse_args()
    from tsct.kernels.triton_common import runtime as C

    dev = torch.device("cuda")
    T, k, f, M = a.tokens, a.topk, a.f, a.tokens * a.topk
    g = torch.Generator(device=dev).manual_seed(0)
    ids = torch.rand(T, a.experts, device=dev, generator=g).topk(k, dim=1).indices.reshape(-1)
    order = torch.argsort(ids, stable=True)            # rows in expert order, as the up kernel runs them
    tok = (order // k).to(torch.int32)                 # token of each routed row
    offs = torch.full((1,), M, device=dev, dtype=torch.int32)
    ldy = -(-f // 8) * 8
    y = torch.empty(M, ldy, device=dev, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, a.bm),)
    cfg = C.tile_config(tuple(torch.cuda.get_device_capability()))
    cap = tuple(torch.cuda.get_device_capability())

    t_store = _time(lambda: store_y[grid](y, M, f, ldy, BM=a.bm, BN=a.bn))
    ref = C.combine(y, tok.long(), offs, T, cfg, cap, ncols=f)
    t_comb = _time(lambda: C.combine(y, tok.long(), offs, T, cfg, cap, ncols=f))

    out = torch.empty(T, f, device=dev, dtype=torch.bfloat16)

    def atomic():
        out.zero_()
        atomic_rows[grid](out, tok, M, f, BM=a.bm, BN=a.bn)

    t_atom = _time(atomic)
    t_zero = _time(lambda: out.zero_())
    same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
    out32 = torch.empty(T, f, device=dev, dtype=torch.float32)

    def atomic32():
        out32.zero_()
        atomic_rows[grid](out32, tok, M, f, BM=a.bm, BN=a.bn)

    t_atom32 = _time(atomic32)
    print(f"T {T} k {k} f {f} M {M} (BM {a.bm}, BN {a.bn}), {torch.cuda.get_device_name()}, triton {triton.__version__}")
    print(f"store_y {t_store:.3f} ms + combine {t_comb:.3f} ms (incl. its CSR sort) = {t_store + t_comb:.3f} ms")
    print(f"atomic bf16 {t_atom:.3f} ms (of which zeroing out {t_zero:.3f} ms); bits equal to the combine: {same}")
    print(f"atomic fp32 {t_atom32:.3f} ms (an fp32 out; a cast to bf16 would follow)")


if __name__ == "__main__":
    main()
