"""An independent oracle for the grouped GLU: one routed row at a time, float64, torch autograd.

Written from design.md section 2 without using tsct.reference, so that the reference path (and
through it every kernel) is checked against a second implementation of the same text.
"""

import torch


def make_problem(*, tokens, topk, experts, d, r, f, dtype=torch.float32, device="cpu", empty=(), seed=0,
                 pad_rows=0, gather=True):
    """Random routing and factors. Returns a dict of the op's inputs plus the routing it came from."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (tokens, topk), generator=g)
    for e in empty:  # force some experts empty by moving their rows to expert (e+1) % E
        ids[ids == e] = (e + 1) % experts
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    token_of_row = order // topk
    m_valid = flat.numel()
    counts = torch.bincount(flat, minlength=experts)
    offs = counts.cumsum(0).to(torch.int32)
    probs = torch.rand(tokens, topk, generator=g, dtype=torch.float64).flatten()[order]

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)

    p = dict(
        x=rnd(tokens, d),
        w_gate=rnd(experts, d, r, scale=d ** -0.5),
        w_up=rnd(experts, d, r, scale=d ** -0.5),
        w_down=rnd(experts, r, f, scale=r ** -0.5),
        s_gate=1 + 0.1 * rnd(experts, r),
        s_up=1 + 0.1 * rnd(experts, r),
        row_weight=probs,
    )
    gather_idx = token_of_row
    scatter_idx = token_of_row
    if pad_rows:  # padding rows past offs[-1] with garbage indices and NaN weights: must be ignored
        gather_idx = torch.cat([gather_idx, torch.full((pad_rows,), 10 ** 6)])
        scatter_idx = torch.cat([scatter_idx, torch.full((pad_rows,), -5)])
        p["row_weight"] = torch.cat([p["row_weight"], torch.full((pad_rows,), float("nan"), dtype=torch.float64)])
    if not gather:  # routed rows materialised in sorted order
        xs = p["x"][token_of_row]
        if pad_rows:
            xs = torch.cat([xs, rnd(pad_rows, d)])
        p["x"] = xs
        gather_idx = scatter_idx = None
    p = {k: v.to(device=device, dtype=dtype) for k, v in p.items()}
    p["offs"] = offs.to(device)
    p["gather_idx"] = gather_idx.to(device) if gather_idx is not None else None
    p["scatter_idx"] = scatter_idx.to(device) if scatter_idx is not None else None
    p["num_out_rows"] = tokens if scatter_idx is not None else None
    p["expert_of_row"] = flat[order].to(device)
    return p


def problem_with_counts(counts, *, d, r, f, seed=0):
    """fp32 inputs of the op with ``counts[e]`` routed rows for expert e, already sorted (no gather / scatter):
    ``(offs, x, w_gate, w_up, w_down, s_gate, s_up, row_weight)``, drawn from torch's global generator seeded with
    ``seed``."""
    torch.manual_seed(seed)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    m = int(offs[-1])
    e = len(counts)
    x = torch.randn(m, d)
    w_gate = torch.randn(e, d, r) / d ** 0.5
    w_up = torch.randn(e, d, r) / d ** 0.5
    w_down = torch.randn(e, r, f) / r ** 0.5
    s_gate = 1 + 0.1 * torch.randn(e, r)
    s_up = 1 + 0.1 * torch.randn(e, r)
    rw = torch.rand(m)
    return offs, x, w_gate, w_up, w_down, s_gate, s_up, rw


def oracle_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                   num_out_rows, expert_of_row):
    """float64, one routed row at a time; differentiable by autograd."""
    x, w_gate, w_up, w_down = (t.double() for t in (x, w_gate, w_up, w_down))
    valid = int(offs[-1])
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    f = w_down.shape[2]
    rows = []
    for i in range(valid):
        e = int(expert_of_row[i])
        xi = x[int(gather_idx[i])] if gather_idx is not None else x[i]
        gg = xi @ w_gate[e]
        uu = xi @ w_up[e]
        if s_gate is not None:
            gg = gg * s_gate[e].double()
        if s_up is not None:
            uu = uu * s_up[e].double()
        y = (torch.nn.functional.silu(gg) * uu) @ w_down[e]
        if row_weight is not None:
            y = y * row_weight[i].double()
        rows.append(y)
    y = torch.stack(rows) if rows else x.new_zeros(0, f)
    if scatter_idx is not None:
        out = x.new_zeros(num_out_rows, f)
        for i in range(valid):
            out = out.index_add(0, scatter_idx[i:i + 1].long(), y[i:i + 1])
        return out
    return torch.cat([y, x.new_zeros(m - valid, f)])


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()
