"""Times the bmm path's three GEMM shapes at b1 in the operand layouts torch.bmm can take, to pick the fast
one: y = z @ W_down (W_down K-major view or row-major), dz = dY @ W_down^T (fp32 or bf16 out),
dW_down = z^T @ dY, and the gate projection, at h0 = 56 and 64 rows per expert."""

import torch
from triton.testing import do_bench

E, d, r, f = 1024, 2048, 64, 5461
for h0 in (56, 64):
    z = torch.randn(E, h0, r, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(E, h0, d, device="cuda", dtype=torch.bfloat16)
    wg = torch.randn(E, d, r, device="cuda", dtype=torch.bfloat16)
    wk = torch.randn(E, f, r, device="cuda", dtype=torch.bfloat16)  # K-major storage
    wr = wk.transpose(1, 2).contiguous()  # row-major [E, r, f]
    dy = torch.randn(E, h0, f, device="cuda", dtype=torch.bfloat16)
    o32 = torch.empty(E, h0, r, device="cuda")
    cases = {
        "y = z @ Wd (K-major view)": lambda: torch.bmm(z, wk.transpose(1, 2)),
        "y = z @ Wd (row-major)": lambda: torch.bmm(z, wr),
        "y^T = Wd^T @ z^T (K-major)": lambda: torch.bmm(wk, z.transpose(1, 2)),
        "dz = dY @ Wd^T (K-major, bf16 out)": lambda: torch.bmm(dy, wk),
        "dz = dY @ Wd^T (K-major, fp32 out)": lambda: torch.bmm(dy, wk, out_dtype=torch.float32, out=o32),
        "dz = dY @ Wd^T (row-major view, bf16)": lambda: torch.bmm(dy, wr.transpose(1, 2)),
        "dWd = z^T @ dY": lambda: torch.bmm(z.transpose(1, 2), dy),
        "dWd^T = dY^T @ z (K-major grad)": lambda: torch.bmm(dy.transpose(1, 2), z),
        "g = x @ Wg (bf16 out)": lambda: torch.bmm(x, wg),
        "g = x @ Wg (fp32 out)": lambda: torch.bmm(x, wg, out_dtype=torch.float32, out=o32),
        "dWg = x^T @ dg": lambda: torch.bmm(x.transpose(1, 2), z),
        "dX = dg @ Wg^T": lambda: torch.bmm(z, wg.transpose(1, 2)),
    }
    for name, fn in cases.items():
        print(f"h0={h0:3d} {name:42s} {do_bench(fn, warmup=5, rep=30, return_mode='median'):.3f} ms")
