"""The routed problem the sm120-fp4 tests share (tests/kernels/test_sm120_fp4_dispatch.py,
tests/kernels/test_sm120_fp4_emulated_gpu.py): sorted routing with an empty expert (1), padding rows whose
gather entries are out of range (never read), bf16 x, dense fp32 factors, per-rank scales, row weights.
"""

import math

import torch


def make_problem(seed=0, d=128, r=64, f=37, experts=6, tokens=40, topk=2, pad=5):
    """Returns ``(x [tokens, d] bf16, offs [E] int32, [w_gate [E,d,r], w_up [E,d,r], w_down [E,r,f]] fp32,
    s_gate [E,r], s_up [E,r], row_weight [M], gather [M] int64, tokens)`` with M = tokens * topk + pad.
    ``gather`` doubles as scatter_idx; its last ``pad`` entries are 10**6 (padding rows)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (tokens * topk,), generator=g)
    ids[ids == 1] = 2  # an empty expert
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    tok = order // topk
    gather = torch.cat([tok, torch.full((pad,), 10 ** 6)])
    x = torch.randn(tokens, d, generator=g).to(torch.bfloat16)
    w = [torch.randn(experts, d, r, generator=g) / math.sqrt(d), torch.randn(experts, d, r, generator=g) / math.sqrt(d),
         torch.randn(experts, r, f, generator=g) / math.sqrt(r)]
    sg, su = 1 + 0.1 * torch.randn(experts, r, generator=g), 1 + 0.1 * torch.randn(experts, r, generator=g)
    rw = torch.rand(tokens * topk + pad, generator=g)
    return x, offs, w, sg, su, rw, gather, tokens
