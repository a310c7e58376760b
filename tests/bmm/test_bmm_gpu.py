"""The bmm path on a CUDA GPU: the oracle on edge shapes, many experts, CUDA-graph capture, torch.compile,
bitwise repeatability, NVFP4 / sign / FP8 / ternary factors decoded by the native kernels (auto sends FP8 and
ternary here on every GPU); and a first-use child that faults:
the parent's CUDA context stays usable and the op answers through bmm."""

import sys
import warnings

import pytest
import torch

from _bmm_cases import CASES, check_against_oracle, problem, run_op, skew
from _glu_oracle import make_problem, rel_err
from tsct import dispatch, firstuse, quant
from tsct.ops import grouped_glu

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_matches_the_float64_oracle(name):
    check_against_oracle(problem(name, dtype=torch.bfloat16, device=DEV), 2e-2)


def test_skewed_routing():
    p = skew(problem(dict(tokens=256, topk=2, experts=33, d=64, r=32, f=45, pad_rows=4), dtype=torch.bfloat16,
                     device=DEV), 5)
    check_against_oracle(p, 2e-2)


@pytest.mark.parametrize("experts", [2048, 8192])
def test_many_experts_against_the_reference(experts):
    p = make_problem(tokens=4096, topk=2, experts=experts, d=64, r=16, f=37, pad_rows=7, dtype=torch.bfloat16,
                     device=DEV)
    y, g, go = run_op(p)
    cpu = {k: (v.cpu().float() if torch.is_tensor(v) and v.is_floating_point() else
               (v.cpu() if torch.is_tensor(v) else v)) for k, v in p.items()}
    y_ref, g_ref, _ = run_op(cpu, impl="reference")
    assert rel_err(y.float().cpu(), y_ref) < 2e-2
    for k in g:
        a, b = g[k].float().cpu(), g_ref[k]
        if k == "row_weight":
            a, b = a[:int(p["offs"][-1])], b[:int(p["offs"][-1])]
        assert rel_err(a, b) < 2e-2, k


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "fp8", "ternary"])
def test_packed_factors_decoded_once(fmt):
    p = problem("softmax-top2", dtype=torch.bfloat16, device=DEV)
    facs = [quant.quantize(p[k], fmt) for k in ("w_gate", "w_up", "w_down")]
    kw = dict(row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
              num_out_rows=p["num_out_rows"])
    y = grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], impl="bmm", **kw)
    dense = [quant.dequantize(w) for w in facs]
    y_ref = grouped_glu(p["x"], p["offs"], *dense, p["s_gate"], p["s_up"], impl="reference", **kw)
    assert rel_err(y, y_ref) < 2e-2


@pytest.mark.parametrize("fmts", [("fp8",) * 3, ("ternary",) * 3, ("fp8", "nvfp4", "ternary")])
def test_auto_takes_bmm_for_fp8_and_ternary_without_a_fallback(fmts):
    """auto does not take the low-bit kernels for FP8 / ternary factors (``dispatch.FORCED_ONLY``): its first choice
    is bmm (nothing counted as a fallback), the factors are quantized and decoded by the native kernels (no torch
    fallback counted), and the result is bmm's on the decoded factors, bit for bit. Forced, triton-lowbit decodes
    them in registers and agrees with bmm to bf16 rounding."""
    dispatch.reset_fallback_counts()
    quant.reset_native_fallback_counts()
    p = problem("softmax-top2", dtype=torch.bfloat16, device=DEV)
    facs = [quant.quantize(p[k], f) for k, f in zip(("w_gate", "w_up", "w_down"), fmts)]
    kw = dict(row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
              num_out_rows=p["num_out_rows"])
    y = grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], **kw)
    dense = [quant.dequantize(w) for w in facs]
    assert torch.equal(y, grouped_glu(p["x"], p["offs"], *dense, p["s_gate"], p["s_up"], impl="bmm", **kw))
    assert not dispatch.fallback_counts() and not quant.native_fallback_counts()
    y_lb = grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], impl="triton-lowbit", **kw)
    err = ((y_lb.float() - y.float()).norm() / y.float().norm()).item()
    assert err < 1e-2, err


def test_bitwise_repeatable():
    p = problem("top6-many-empty", dtype=torch.bfloat16, device=DEV)
    y1, g1, _ = run_op(p)
    y2, g2, _ = run_op(p)
    assert torch.equal(y1, y2) and all(torch.equal(g1[k], g2[k]) for k in g1)


def test_cuda_graph_capture_runs_the_static_layout():
    from _cuda_graph import captured

    p = problem("softmax-top2", dtype=torch.bfloat16, device=DEV)
    x = p["x"].detach().clone().requires_grad_(True)
    go = torch.randn(p["num_out_rows"], p["w_down"].shape[2], device=DEV, dtype=torch.bfloat16)

    def step():
        x.grad = None
        y = grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"], p["s_gate"], p["s_up"],
                        row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                        num_out_rows=p["num_out_rows"], impl="bmm")
        (dx,) = torch.autograd.grad(y, x, go)
        return y, dx

    g, (y_g, dx_g) = captured(step)
    y_e, dx_e = step()
    g.replay()
    a, b = y_g.clone(), dx_g.clone()
    g.replay()
    assert torch.equal(a, y_g) and torch.equal(b, dx_g)
    assert rel_err(a, y_e) < 1e-2 and rel_err(b, dx_e) < 1e-2


def test_compile_fullgraph():
    torch._dynamo.reset()
    p = problem("softmax-top2", dtype=torch.bfloat16, device=DEV)
    fn = torch.compile(lambda x: grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"], p["s_gate"],
                                             p["s_up"], row_weight=p["row_weight"], gather_idx=p["gather_idx"],
                                             scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                                             impl="bmm"), fullgraph=True)
    y = fn(p["x"])
    y_e, _, _ = run_op(p)
    assert rel_err(y, y_e) < 1e-2
    torch._dynamo.reset()


def test_faulting_first_use_child_leaves_the_parent_working(monkeypatch, tmp_path):
    """A kernel family never executed on this GPU: its first-use child hits an illegal access (a device-side
    assert). The parent, which already holds a CUDA context, falls back to bmm, warns, counts, keeps working."""
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path))
    firstuse.reset_for_tests()
    dispatch.reset_fallback_counts()
    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch.EXECUTED_ON, dispatch.TRITON_BF16, frozenset())
    fault = ("import torch; x = torch.zeros(4, device='cuda'); i = torch.tensor([1 << 40], device='cuda'); "
             "x[i] = 1; torch.cuda.synchronize(); print('unreachable')")
    real = firstuse.verdict
    monkeypatch.setattr(firstuse, "verdict", lambda dev, path, fmt, **kw: real(
        dev, path, fmt, runner=lambda argv, env, t: firstuse.run_subprocess([sys.executable, "-c", fault], env, t)))
    p = problem("softmax-top2", dtype=torch.bfloat16, device=DEV)
    before = torch.ones(8, device=DEV).sum()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y, g, _ = run_op(p, impl="auto")
    assert any("triton-bf16 unavailable" in str(x.message) and "crash" in str(x.message) for x in w)
    (key, n), = dispatch.fallback_counts().items()
    assert key[:2] == ("triton-bf16", "bmm") and n >= 1
    y_ref, _, _ = run_op(p, impl="bmm")
    assert torch.equal(y, y_ref)
    assert (torch.ones(8, device=DEV).sum() + before).item() == 16  # the parent's context is fine
    torch.cuda.synchronize()
    dispatch.reset_fallback_counts()
    firstuse.reset_for_tests()
