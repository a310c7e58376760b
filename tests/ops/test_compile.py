"""torch.compile(fullgraph=True) traces a model that calls grouped_glu: forward and backward."""

import torch

from tsct.kernels.layout import to_kmajor
from tsct.ops import grouped_glu
from _glu_oracle import make_problem


class TinyMoE(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.w_gate = torch.nn.Parameter(p["w_gate"].clone())
        self.w_up = torch.nn.Parameter(p["w_up"].clone())
        self.w_down = torch.nn.Parameter(p["w_down"].clone())
        self.s_gate = torch.nn.Parameter(p["s_gate"].clone())
        self.s_up = torch.nn.Parameter(p["s_up"].clone())

    def forward(self, x, offs, row_weight, gather_idx, scatter_idx, num_out_rows: int):
        h = torch.tanh(x)  # ordinary ops around the custom op must trace too
        y = grouped_glu(h, offs, self.w_gate, self.w_up, self.w_down, self.s_gate, self.s_up,
                        row_weight=row_weight, gather_idx=gather_idx, scatter_idx=scatter_idx,
                        num_out_rows=num_out_rows)
        return y * 2


def _compiled_matches_eager(model_cls):
    """Forward and every gradient (parameters and row weights) of ``torch.compile(model, fullgraph=True)``
    against eager; returns the model (its .grad fields from the compiled run)."""
    torch._dynamo.reset()
    p = make_problem(tokens=20, topk=2, experts=5, d=16, r=8, f=13, empty=(2,))
    model = model_cls(p)
    args = (p["x"], p["offs"], p["row_weight"].clone().requires_grad_(), p["gather_idx"], p["scatter_idx"], 20)
    y_eager = model(*args)
    y_eager.sum().backward()
    eager_grads = [q.grad.clone() for q in model.parameters()] + [args[2].grad.clone()]
    model.zero_grad()
    args[2].grad = None
    y = torch.compile(model, fullgraph=True)(*args)
    # inductor may fuse/vectorise the tanh around the op differently from eager: fp32 rounding only
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    for g, ge in zip([q.grad for q in model.parameters()] + [args[2].grad], eager_grads):
        torch.testing.assert_close(g, ge, rtol=1e-5, atol=1e-6)
    return model


def test_fullgraph_compile_matches_eager():
    _compiled_matches_eager(TinyMoE)


def test_opcheck():
    """torch.library's own consistency checks of the schema, fake implementation and autograd."""
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7)
    from tsct.ops import _function as F

    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], 8, p["row_weight"])
    args = F.op_args(p["x"].requires_grad_(), (p["w_gate"].requires_grad_(), p["w_up"], p["w_down"]), (None,) * 3,
                     p["s_gate"], p["s_up"], routing, "reference")
    torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args)


def test_bad_offs_under_compile_raise_not_silently_wrong():
    """Values cannot be read while tracing; they are asserted in the graph (and by the reference path)."""
    import pytest

    torch._dynamo.reset()
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7, gather=False)
    fn = torch.compile(lambda x, offs: grouped_glu(x, offs, p["w_gate"], p["w_up"], p["w_down"]), fullgraph=True)
    assert fn(p["x"], p["offs"]).shape == (16, 7)
    bad = p["offs"].clone()
    bad[0], bad[1] = bad[1], bad[0] - 1  # decreasing
    with pytest.raises(RuntimeError, match="offs must be non-decreasing"):
        fn(p["x"], bad)
    over = p["offs"].clone()
    over[-1] = 99
    with pytest.raises(RuntimeError, match="offs"):
        fn(p["x"], over)


def test_reference_checks_offs_even_with_value_checks_off(monkeypatch):
    import pytest
    import tsct

    monkeypatch.setattr(tsct.config, "check_values", False)
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7, gather=False)
    over = p["offs"].clone()
    over[-1] = 99
    with pytest.raises(ValueError, match=r"offs\[-1\] = 99 exceeds M = 16"):
        grouped_glu(p["x"], over, p["w_gate"], p["w_up"], p["w_down"], impl="reference")


class KMajorMoE(TinyMoE):
    """w_down held K-major: an [E, f, r] parameter passed as its transpose (decision 0012)."""

    def __init__(self, p):
        super().__init__(p)
        self.w_down = torch.nn.Parameter(p["w_down"].transpose(1, 2).contiguous())

    def forward(self, x, offs, row_weight, gather_idx, scatter_idx, num_out_rows: int):
        y = grouped_glu(torch.tanh(x), offs, self.w_gate, self.w_up, self.w_down.transpose(1, 2), self.s_gate,
                        self.s_up, row_weight=row_weight, gather_idx=gather_idx, scatter_idx=scatter_idx,
                        num_out_rows=num_out_rows)
        return y * 2


def test_fullgraph_compile_with_a_kmajor_w_down():
    """The backward op's fake promises each gradient in its input's empty_like layout (K-major for a
    K-major w_down); the real kernels must deliver exactly that or inductor's stride asserts fail."""
    model = _compiled_matches_eager(KMajorMoE)
    assert model.w_down.grad.stride() == model.w_down.stride()


def test_backward_op_returns_each_gradient_in_its_inputs_layout():
    """Direct call of the backward op with a K-major w_down: dW_down comes back with w_down's strides
    (as the fake says), the others contiguous; opcheck's fake-vs-real checks pass for that input."""
    from tsct.ops import _function as F

    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7)
    wd = to_kmajor(p["w_down"])
    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], 8, p["row_weight"])

    def args(x, w_down):
        return F.op_args(x, (p["w_gate"], p["w_up"], w_down), (None,) * 3, p["s_gate"], p["s_up"], routing,
                         "reference")

    out, saved = torch.ops.tsct.grouped_glu(*args(p["x"], wd))
    grads = torch.ops.tsct.grouped_glu_backward(torch.ones_like(out), *args(p["x"], wd), [True] * 7, saved)
    assert grads[3].stride() == wd.stride() and grads[3].shape == wd.shape
    assert all(g.is_contiguous() for i, g in enumerate(grads) if i != 3)
    torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args(p["x"].requires_grad_(), wd.requires_grad_()))
