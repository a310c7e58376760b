"""Shared cases of the bmm path's tests (CPU and GPU): routed problems with edge shapes, the op's outputs and
gradients, and the float64 oracle's (tests/_glu_oracle.py, one routed row at a time)."""

import torch

from _glu_oracle import make_problem, oracle_forward, rel_err
from tsct.ops import grouped_glu

GRAD_NAMES = ("x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight")

# (name, make_problem kwargs): empty experts, one expert holding every row, padding rows, odd f, top-k 1/2/6
CASES = [
    ("softmax-top2", dict(tokens=40, topk=2, experts=6, d=32, r=16, f=37, empty=(2,), pad_rows=3)),
    ("one-expert-all-rows", dict(tokens=48, topk=1, experts=5, d=32, r=16, f=21, empty=(0, 1, 2, 4))),
    ("top6-many-empty", dict(tokens=24, topk=6, experts=16, d=16, r=16, f=19, empty=(1, 3, 5, 7, 9), pad_rows=5)),
    ("no-gather", dict(tokens=30, topk=2, experts=4, d=32, r=16, f=13, gather=False, pad_rows=2)),
    ("f5461", dict(tokens=8, topk=2, experts=3, d=16, r=16, f=5461, empty=(1,))),
]


def skew(p, hot: int):
    """Re-route (in place) almost every row to expert ``hot``: every other remaining expert gets one row,
    up to a quarter of the rows, the rest of the experts are empty (a zipf router early in training)."""
    e = p["w_gate"].shape[0]
    m_valid = int(p["offs"][-1])
    counts = torch.zeros(e, dtype=torch.long)
    others = [i for i in range(e) if i != hot][::2][: m_valid // 4]
    counts[others] = 1
    counts[hot] = m_valid - len(others)
    dev = p["offs"].device
    p["offs"] = counts.cumsum(0).to(torch.int32).to(dev)
    p["expert_of_row"] = torch.repeat_interleave(torch.arange(e), counts).to(dev)
    return p


def leaves(p):
    """Fresh leaf copies of the differentiable inputs."""
    return {k: p[k].detach().clone().requires_grad_(True) for k in GRAD_NAMES}


def run_op(p, impl="bmm", **kw):
    """(output, {name: gradient}) of ``grouped_glu`` for a fixed random output gradient."""
    lv = leaves(p)
    y = grouped_glu(lv["x"], p["offs"], lv["w_gate"], lv["w_up"], lv["w_down"], lv["s_gate"], lv["s_up"],
                    row_weight=lv["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                    num_out_rows=p["num_out_rows"], impl=impl, **kw)
    g = torch.Generator().manual_seed(7)
    go = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.device, y.dtype)
    y.backward(go)
    return y.detach(), {k: v.grad for k, v in lv.items()}, go


def run_oracle(p, go):
    """float64 output and gradients of the same problem (CPU)."""
    cpu = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in p.items()}
    lv = {k: cpu[k].double().requires_grad_(True) for k in GRAD_NAMES}
    y = oracle_forward(lv["x"], cpu["offs"], lv["w_gate"], lv["w_up"], lv["w_down"], lv["s_gate"], lv["s_up"],
                       lv["row_weight"], cpu["gather_idx"], cpu["scatter_idx"], cpu["num_out_rows"],
                       cpu["expert_of_row"])
    y.backward(go.detach().cpu().double())
    return y.detach(), {k: v.grad for k, v in lv.items()}


def check_against_oracle(p, tol, **kw):
    y, grads, go = run_op(p, **kw)
    want, wgrads = run_oracle(p, go)
    assert torch.isfinite(y).all()
    assert rel_err(y.cpu(), want) < tol, ("out", rel_err(y.cpu(), want))
    valid = int(p["offs"][-1])
    for k in GRAD_NAMES:
        got, ref = grads[k].cpu(), wgrads[k]
        if k == "row_weight":
            assert (got[valid:] == 0).all(), "padding rows must get a zero row-weight gradient"
            got, ref = got[:valid], ref[:valid]
        assert torch.isfinite(got).all(), k
        assert rel_err(got, ref) < tol, (k, rel_err(got, ref))
    return y, grads


def problem(name_or_kwargs, dtype=torch.float32, device="cpu", seed=0):
    kw = dict(CASES)[name_or_kwargs] if isinstance(name_or_kwargs, str) else name_or_kwargs
    return make_problem(**kw, dtype=dtype, device=device, seed=seed)
