"""The bmm path on the CPU: outputs and every gradient against the float64 oracle on edge shapes, both
layouts (host plan and static bound), skewed routing, determinism, torch.compile, NVFP4 activations."""

import math
import random

import pytest
import torch

from _bmm_cases import CASES, check_against_oracle, problem, run_op, skew
from _glu_oracle import make_problem, rel_err
from tsct import bmm, quant
from tsct.bmm import glu as B
from tsct.ops import grouped_glu


@pytest.fixture(params=["host", "static"])
def layout(request, monkeypatch):
    """Run the op with the host plan (eager default) or the static bound (what capture / compile use)."""
    if request.param == "static":
        monkeypatch.setattr(B, "_plan_for", lambda offs, m, *a: B.static_plan(m, offs.shape[0]))
    return request.param


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_matches_the_float64_oracle(name, layout):
    check_against_oracle(problem(name), 1e-5)


@pytest.mark.parametrize("hot", [0, 3])
def test_skewed_routing_matches_the_oracle(hot, layout):
    p = skew(problem(dict(tokens=64, topk=2, experts=9, d=16, r=16, f=23, pad_rows=2)), hot)
    check_against_oracle(p, 1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_row_shared_by_many_routed_rows_is_summed_without_a_table_of_targets_times_fan(dtype, tol, monkeypatch):
    """One x row read, and one output row written, by half of the routed rows (a shared or sink row): the sums over
    it (the forward's combine, the backward's dX) match the oracle, and no [targets, fan] index table is built (it
    would hold targets x fan entries: 100 x 150 here, 8.3 GB at T 4000 with one row shared by 4001 routed rows)."""
    p = problem(dict(tokens=100, topk=3, experts=5, d=16, r=16, f=24, pad_rows=2), dtype=dtype)
    m = p["gather_idx"].shape[0]
    shared = torch.arange(m) % 2 == 0
    for k in ("gather_idx", "scatter_idx"):
        p[k] = torch.where(shared & (torch.arange(m) < int(p["offs"][-1])), 0, p[k])
    sizes = []
    real_full = torch.full
    monkeypatch.setattr(torch, "full", lambda size, *a, **kw: sizes.append(math.prod(size)) or real_full(size, *a,
                                                                                                            **kw))
    check_against_oracle(p, tol)
    assert sizes and max(sizes) <= 3 * m + p["num_out_rows"] + 1, max(sizes)


def test_bf16_within_bf16_tolerance():
    check_against_oracle(problem("softmax-top2", dtype=torch.bfloat16), 2e-2)


def test_many_experts():
    p = make_problem(tokens=150, topk=2, experts=2048, d=16, r=16, f=11, pad_rows=3)
    check_against_oracle(p, 1e-5)


def test_bitwise_repeatable(layout):
    p = problem("top6-many-empty")
    y1, g1, _ = run_op(p)
    y2, g2, _ = run_op(p)
    assert torch.equal(y1, y2)
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k


@pytest.mark.parametrize("nan", [("w_gate", "w_up", "w_down"), ("s_gate", "s_up")])
def test_empty_experts_get_exact_zero_gradients_even_with_nan_factors(nan, layout):
    p = problem("top6-many-empty")
    for k in nan:
        p[k][1] = float("nan")  # expert 1 is empty
    _, g, _ = run_op(p)
    for k in ("w_gate", "w_up", "w_down", "s_gate", "s_up"):
        assert torch.equal(g[k][1], torch.zeros_like(g[k][1])), k
        assert torch.isfinite(g[k][0]).all(), k
    assert torch.isfinite(g["x"]).all()


@pytest.mark.parametrize("zero", ["E", "d", "r", "f"])
@pytest.mark.parametrize("impl,act", [("bmm", "bf16"), ("bmm", "nvfp4"), ("reference", "bf16")])
def test_zero_sizes_give_exact_zeros(zero, impl, act, layout):
    """No experts, or d, r or f = 0: every output and gradient is an exact zero of its input's shape (E = 0: every
    row is padding; d or r = 0: empty contractions; f = 0: an empty output), on both paths and both layouts."""
    p = problem(dict(tokens=8, topk=2, experts=4, d=16, r=16, f=9, pad_rows=2))
    keep = {"E": ("offs", "w_gate", "w_up", "w_down", "s_gate", "s_up"), "d": ("x", "w_gate", "w_up"),
            "r": ("w_gate", "w_up", "w_down", "s_gate", "s_up"), "f": ("w_down",)}[zero]
    axis = {"E": 0, "d": 1, "r": -1, "f": -1}[zero]
    for k in keep:
        ax = 1 if (zero == "r" and k == "w_down") else axis
        p[k] = p[k].narrow(ax, 0, 0)
    y, g, _ = run_op(p, impl=impl, activations=act)
    assert y.shape == (p["num_out_rows"], p["w_down"].shape[2]) and torch.equal(y, torch.zeros_like(y))
    for k, v in g.items():
        assert v.shape == p[k].shape and torch.equal(v, torch.zeros_like(v)), k


def test_static_bound_covers_every_routing():
    """The static plan's tile bound is never exceeded (random and adversarial count vectors)."""
    rng = random.Random(0)
    for _ in range(300):
        e = rng.choice([1, 2, 7, 64, 1024])
        m = rng.randint(0, 5000)
        plan = B.static_plan(m, e)
        cuts = sorted(rng.randint(0, m) for _ in range(e - 1))
        counts = [b - a for a, b in zip([0] + cuts, cuts + [m])]
        for c in (counts, [m] + [0] * (e - 1), [plan.h0 + 1] * min(e, m // (plan.h0 + 1)) + [0] * e):
            need = sum(-(-max(0, ci - plan.h0) // plan.b) for ci in c[:e])
            assert need <= plan.n_tiles, (m, e, plan, c[:8])


def test_host_plan_is_exact_for_its_counts():
    counts = [0, 5, 300, 1, 0, 17, 64, 2000]
    plan = B.plan_from_counts(counts, d=2048, r=64, f=5461)
    need = sum(-(-max(0, c - plan.h0) // plan.b) for c in counts)
    assert plan.n_tiles == need
    assert plan.rows(len(counts)) >= sum(counts)
    # balanced routing: one dense part, no tiles (a padded bmm without dropped rows)
    bal = B.plan_from_counts([30, 32, 29, 31] * 256, d=2048, r=64, f=5461)
    assert bal.n_tiles == 0 and bal.h0 == 32


def test_compile_fullgraph_uses_the_static_layout():
    torch._dynamo.reset()
    p = problem("softmax-top2")
    fn = torch.compile(lambda x, wg: grouped_glu(x, p["offs"], wg, p["w_up"], p["w_down"], p["s_gate"], p["s_up"],
                                                   row_weight=p["row_weight"], gather_idx=p["gather_idx"],
                                                   scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                                                   impl="bmm"), fullgraph=True)
    x = p["x"].clone().requires_grad_(True)
    wg = p["w_gate"].clone().requires_grad_(True)
    y = fn(x, wg)
    y.sum().backward()
    y2, g, _ = run_op(p)
    assert rel_err(y.detach(), y2) < 1e-6
    torch._dynamo.reset()


def test_opcheck():
    from tsct.ops import _function as F

    p = problem("softmax-top2")
    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], p["num_out_rows"], p["row_weight"])
    for key in ("bmm", "bmm/static"):
        args = F.op_args(p["x"], (p["w_gate"], p["w_up"], p["w_down"]), (None,) * 3, p["s_gate"], p["s_up"],
                         routing, key)
        torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args, test_utils=("test_schema", "test_faketensor"))


# ---- NVFP4 activations -------------------------------------------------------------------------

def _w4a4_oracle(p, facs):
    """x and z quantized to NVFP4 per expert (one encode scale per expert, ``tsct.quant.quantize_nvfp4`` on
    each expert's rows), products of the dequantized values in float64, z rounded to bf16 before its
    quantization (the tensor-core path writes it so). ``facs``: the factors as the path reads them (bf16)."""
    xs = p["x"][p["gather_idx"].clamp(max=p["x"].shape[0] - 1)] if p["gather_idx"] is not None else p["x"]
    wg, wu, wd = (w.double() for w in facs)
    bounds = [0] + p["offs"].tolist()
    y = torch.zeros(xs.shape[0], wd.shape[2], dtype=torch.float64)

    def q(v):
        return quant.dequantize(quant.quantize_nvfp4(v.t().unsqueeze(0), backend="torch"),
                                dtype=torch.float32)[0].t().double()

    for e in range(len(bounds) - 1):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            xe = q(xs[lo:hi].float())
            g = (xe @ wg[e]) * p["s_gate"][e].double()
            u = (xe @ wu[e]) * p["s_up"][e].double()
            z = (torch.nn.functional.silu(g) * u).to(torch.bfloat16).float()
            y[lo:hi] = (q(z) @ wd[e]) * p["row_weight"][lo:hi, None].double()
    out = torch.zeros(p["num_out_rows"], wd.shape[2], dtype=torch.float64)
    return out.index_add_(0, p["scatter_idx"][:bounds[-1]], y[:bounds[-1]])


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "sign"])
def test_nvfp4_activations_follow_the_recipe(fmt, layout):
    """Against the oracle on the factors decoded to bf16, as the bmm path reads them. (Decoding rounds an
    NVFP4 factor to bf16, 2^-9 relative; through z's 4-bit quantization that moves the result by a few
    percent against exact fp4 x fp4 products: docs/decisions/0019.)"""
    p = problem(dict(tokens=40, topk=2, experts=5, d=64, r=32, f=40, empty=(2,), pad_rows=3), dtype=torch.bfloat16)
    facs = [p[k] for k in ("w_gate", "w_up", "w_down")]
    if fmt != "bf16":
        facs = [quant.quantize(w, fmt, backend="torch") for w in facs]
    kw = dict(row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
              num_out_rows=p["num_out_rows"])
    y4 = grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], activations="nvfp4", **kw)
    y16 = grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], **kw)
    read = [quant.dequantize(w, dtype=torch.bfloat16) if quant.is_quantized(w) else w for w in facs]
    want = _w4a4_oracle({k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
                         for k, v in p.items()}, read)
    assert rel_err(y4.float(), want) < 1e-2
    assert rel_err(y16.float(), want) > 3e-2  # the 4-bit activations are really there


def test_nvfp4_activations_refuse_odd_k():
    p = problem("softmax-top2")
    with pytest.raises(ValueError, match="multiples of 16"):
        grouped_glu(p["x"][:, :30], p["offs"], p["w_gate"][:, :30], p["w_up"][:, :30], p["w_down"],
                    activations="nvfp4", gather_idx=p["gather_idx"])
    with pytest.raises(ValueError, match="activations must be one of"):
        grouped_glu(p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], activations="fp8",
                    gather_idx=p["gather_idx"])


def test_forward_backward_module_api():
    assert bmm.grouped_glu_forward is B.grouped_glu_forward


@pytest.mark.parametrize("name", ["softmax-top2", "f5461", "top6-many-empty"])
def test_kmajor_w_down_matches_the_oracle(name, layout):
    """w_down stored K-major (``[E, f, r]`` viewed transposed): the wide products split at a multiple of 8 in
    M, N and K (odd f), every gradient against the float64 oracle, dW_down in the same K-major strides."""
    from tsct.kernels.layout import to_kmajor

    p = problem(name)
    p["w_down"] = to_kmajor(p["w_down"])
    _, grads = check_against_oracle(p, 1e-5)
    assert grads["w_down"].shape == p["w_down"].shape


@pytest.mark.parametrize("mkn", [(16, 64, 5461), (5461, 48, 64), (40, 5461, 64), (16, 64, 24)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_product_split_at_multiples_of_8_is_the_product(mkn, out_dtype):
    """The CUDA-only split of a product at a multiple of 8 (N, else M, else K for fp32 outputs) computes the same
    product (run here on the CPU; a product that needs no split is left alone)."""
    m, k, n = mkn
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, m, k, generator=g).bfloat16(), torch.randn(3, k, n, generator=g).bfloat16()
    o = torch.full((3, m, n), float("nan"), dtype=out_dtype)
    split = B._mm_split(a, b, o)
    assert split == (n % 8 != 0 or m % 8 != 0 or (k % 8 != 0 and out_dtype == torch.float32))
    if split:
        want = a.double() @ b.double()
        assert torch.isfinite(o).all()
        assert (o.double() - want).norm() / want.norm() < (1e-6 if out_dtype == torch.float32 else 4e-3)
