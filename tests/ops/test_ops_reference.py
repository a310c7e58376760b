"""The reference path against the independent float64 oracle: forward and all seven gradients."""

import pytest
import torch

import tsct
from tsct.kernels.layout import to_kmajor
from tsct.ops import grouped_glu
from _glu_oracle import make_problem, oracle_forward, rel_err

GRAD_NAMES = ("x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight")
OP_KEYS = ("x", "offs", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight", "gather_idx", "scatter_idx",
           "num_out_rows")


def _run(p, fn, leaves):
    args = {k: p[k] for k in OP_KEYS}
    for n in GRAD_NAMES:
        args[n] = leaves[n]
    return fn(args)


def _tsct(args):
    a = dict(args)
    return grouped_glu(a.pop("x"), a.pop("offs"), a.pop("w_gate"), a.pop("w_up"), a.pop("w_down"), a.pop("s_gate"),
                       a.pop("s_up"), impl="reference", **a)


@pytest.mark.parametrize("case", [
    dict(tokens=24, topk=2, experts=6, d=32, r=8, f=37, empty=(2,), gather=True),
    dict(tokens=24, topk=2, experts=6, d=32, r=8, f=37, empty=(0, 5), gather=False, pad_rows=5),
    dict(tokens=17, topk=1, experts=3, d=16, r=16, f=5, gather=True, pad_rows=3),
    dict(tokens=10, topk=3, experts=1, d=48, r=4, f=9, gather=True),  # all rows in one expert, k = 3
])
def test_forward_and_grads_match_oracle(case):
    p = make_problem(**case, dtype=torch.float32, seed=hash(str(case)) % 1000)
    leaves32 = {n: p[n].detach().clone().requires_grad_() for n in GRAD_NAMES}
    leaves64 = {n: p[n].detach().double().clone().requires_grad_() for n in GRAD_NAMES}
    y = _run(p, _tsct, leaves32)
    y64 = _run(p, lambda a: oracle_forward(**a, expert_of_row=p["expert_of_row"]), leaves64)
    assert y.dtype == torch.float32 and y.shape == y64.shape
    assert torch.isfinite(y).all()
    assert rel_err(y, y64) < 1e-5
    grad = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (y * grad.float()).sum().backward()
    (y64 * grad).sum().backward()
    for n in GRAD_NAMES:
        g, g64 = leaves32[n].grad, leaves64[n].grad
        assert g is not None and g.shape == leaves32[n].shape, n
        assert torch.isfinite(g).all(), n
        assert rel_err(g, g64) < 1e-5, n


def test_padding_rows_zero_output_and_zero_grad():
    p = make_problem(tokens=12, topk=2, experts=4, d=16, r=8, f=11, gather=False, pad_rows=7)
    x = p["x"].clone().requires_grad_()
    rw = p["row_weight"].clone().requires_grad_()
    y = grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"], p["s_gate"], p["s_up"], row_weight=rw,
                    impl="reference")
    valid = int(p["offs"][-1])
    assert y.shape[0] == valid + 7
    assert torch.equal(y[valid:], torch.zeros_like(y[valid:]))
    assert torch.isfinite(y[:valid]).all() and y[:valid].abs().sum() > 0
    y.sum().backward()
    assert torch.equal(x.grad[valid:], torch.zeros_like(x.grad[valid:]))
    assert torch.equal(rw.grad[valid:], torch.zeros_like(rw.grad[valid:]))  # NaN weights there never read


def test_empty_experts_get_exact_zero_factor_grads():
    p = make_problem(tokens=16, topk=2, experts=5, d=16, r=8, f=13, empty=(1, 3))
    counts = torch.diff(p["offs"], prepend=torch.zeros(1, dtype=torch.int32))
    assert counts[1] == 0 and counts[3] == 0
    ws = {n: p[n].clone().requires_grad_() for n in ("w_gate", "w_up", "w_down", "s_gate", "s_up")}
    y = grouped_glu(p["x"], p["offs"], ws["w_gate"], ws["w_up"], ws["w_down"], ws["s_gate"], ws["s_up"],
                    row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                    num_out_rows=p["num_out_rows"], impl="reference")
    y.square().sum().backward()
    for n, w in ws.items():
        for e in (1, 3):
            assert torch.equal(w.grad[e], torch.zeros_like(w.grad[e])), (n, e)
        assert w.grad[0].abs().sum() > 0, n


def test_no_scales_no_row_weight_and_all_experts_empty():
    p = make_problem(tokens=9, topk=2, experts=3, d=16, r=4, f=7, gather=False)
    y = grouped_glu(p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], impl="reference")
    y64 = oracle_forward(p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], None, None, None, None, None, None,
                         p["expert_of_row"])
    assert rel_err(y, y64) < 1e-5
    zero_offs = torch.zeros_like(p["offs"])  # every expert empty: all rows are padding
    x = p["x"].clone().requires_grad_()
    y0 = grouped_glu(x, zero_offs, p["w_gate"], p["w_up"], p["w_down"], impl="reference")
    assert torch.equal(y0, torch.zeros_like(y0))
    y0.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
def test_low_precision_inputs(dtype, tol):
    p = make_problem(tokens=32, topk=2, experts=4, d=64, r=16, f=5461 // 40, dtype=dtype)
    args = {k: p[k] for k in OP_KEYS}
    y = grouped_glu(args.pop("x"), args.pop("offs"), args.pop("w_gate"), args.pop("w_up"), args.pop("w_down"),
                    args.pop("s_gate"), args.pop("s_up"), impl="reference", **args)
    assert y.dtype == dtype
    p64 = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in p.items()}
    y64 = oracle_forward(**{k: p64[k] for k in OP_KEYS}, expert_of_row=p["expert_of_row"])
    assert rel_err(y, y64) < tol


def test_autocast_does_not_change_the_oracle():
    """bf16 autocast would run the oracle's fp32 matmuls in bf16 (rel. error ~4e-3 at this size); it computes in fp32
    whatever autocast says, forward and backward."""
    p = make_problem(tokens=48, topk=2, experts=4, d=64, r=16, f=37, dtype=torch.bfloat16)
    outs = []
    for on in (False, True):
        args = {k: (v.detach().clone().requires_grad_(v.is_floating_point()) if torch.is_tensor(v) else v)
                for k, v in ((k, p[k]) for k in OP_KEYS)}
        leaves = [v for v in args.values() if torch.is_tensor(v) and v.requires_grad]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            y = grouped_glu(args.pop("x"), args.pop("offs"), args.pop("w_gate"), args.pop("w_up"),
                            args.pop("w_down"), args.pop("s_gate"), args.pop("s_up"), impl="reference", **args)
            (y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append([y] + [v.grad for v in leaves])
    assert len(outs[0]) == 8
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_combine_is_deterministic_and_matches_unfused():
    p = make_problem(tokens=40, topk=4, experts=6, d=32, r=8, f=19)
    args = {k: p[k] for k in OP_KEYS}
    y1 = _tsct(dict(args))
    y2 = _tsct(dict(args))
    assert torch.equal(y1, y2)
    unfused = dict(args, scatter_idx=None, num_out_rows=None)
    rows = _tsct(unfused)
    summed = torch.zeros_like(y1).index_add_(0, p["scatter_idx"], rows)
    assert rel_err(y1, summed) < 1e-6


def test_nan_in_one_token_stays_in_that_token():
    p = make_problem(tokens=12, topk=2, experts=3, d=16, r=4, f=7)
    x = p["x"].clone()
    x[5] = float("nan")
    args = dict({k: p[k] for k in OP_KEYS}, x=x)
    y = _tsct(args)
    assert torch.isnan(y[5]).all()
    others = torch.ones(12, dtype=torch.bool)
    others[5] = False
    assert torch.isfinite(y[others]).all()


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "nvfp4_with_master"])
def test_double_backward_fails_by_name(packed):
    """Only first derivatives exist; a second one must say so rather than return something wrong."""
    from tsct import quant
    torch.manual_seed(1)
    E, d, r, f = 3, 32, 16, 24
    x = torch.randn(10, d, requires_grad=True)
    offs = torch.tensor([3, 7, 10], dtype=torch.int32)
    wg, wu, wd = torch.randn(E, d, r), torch.randn(E, d, r), torch.randn(E, r, f)
    if packed:  # reference path: decoded factor + STE node to the master
        master = wg.clone().requires_grad_(True)
        y = grouped_glu(x, offs, quant.quantize_nvfp4(wg, backend="torch"), wu, wd, masters=(master, None, None))
    else:
        y = grouped_glu(x, offs, wg, wu, wd)
    g, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert g.shape == x.shape and torch.isfinite(g).all() and g.abs().sum() > 0
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        g.sum().backward()


def test_kmajor_w_down_gives_the_same_output_and_gradient():
    """w_down stored K-major (the transpose of a contiguous [E, f, r], decision 0012) is the same logical
    tensor: the same output and w_down gradient as the row-major copy up to fp32 summation order (torch's
    matmuls may sum in another order for another layout), and the gradient keeps the K-major layout."""
    p = make_problem(tokens=24, topk=2, experts=6, d=32, r=16, f=37, empty=(2,), gather=True, dtype=torch.float32,
                     seed=7)
    outs, grads = [], []
    for wd in (p["w_down"], to_kmajor(p["w_down"])):
        assert wd.shape == p["w_down"].shape
        leaf = wd.detach().clone(memory_format=torch.preserve_format).requires_grad_()
        assert leaf.stride() == wd.stride()
        a = {k: p[k] for k in OP_KEYS}
        a["w_down"] = leaf
        y = _tsct(a)
        y.backward(torch.ones_like(y))
        outs.append(y.detach())
        grads.append(leaf.grad)
    assert not outs[1].isnan().any()
    assert torch.allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    assert torch.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-6)
    assert grads[1].transpose(1, 2).is_contiguous()  # the leaf's layout
