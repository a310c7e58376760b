"""Plain eager calls apply the one Function without the custom ops' dispatcher (tsct.ops._function): same
functions, same results.

On the CPU the direct route is switched on by hand (it is CUDA-only in use) and checked against the op
route bit for bit: forward, every gradient, the STE gradient to a master through the quantized op, and
the named double-backward error.
"""

import pytest
import torch

from tsct import config, dispatch, quant
from tsct.ops import _eager, _function, _select, grouped_glu
from _glu_oracle import make_problem

GRAD_NAMES = ("x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight")


def _run(p, direct, monkeypatch, **kw):
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: direct)
    leaves = {n: p[n].detach().clone().requires_grad_() for n in GRAD_NAMES}
    y = grouped_glu(leaves["x"], p["offs"], leaves["w_gate"], leaves["w_up"], leaves["w_down"], leaves["s_gate"],
                    leaves["s_up"], row_weight=leaves["row_weight"], gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], impl="reference", **kw)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(y, [leaves[n] for n in GRAD_NAMES], g)
    return y, grads


def test_direct_route_equals_the_op_route_bitwise(monkeypatch):
    p = make_problem(tokens=24, topk=2, experts=6, d=32, r=8, f=37, empty=(2,), gather=True, dtype=torch.float32,
                     seed=5)
    calls = []
    real = _function.forward
    monkeypatch.setattr(_function, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    y_op, g_op = _run(p, False, monkeypatch)
    y_d, g_d = _run(p, True, monkeypatch)
    assert len(calls) == 2  # both routes ran the same forward function
    assert torch.equal(y_op, y_d)
    for n, a, b in zip(GRAD_NAMES, g_op, g_d):
        assert torch.equal(a, b), n


def test_direct_route_is_taken_and_fails_double_backward_by_name(monkeypatch):
    p = make_problem(tokens=10, topk=2, experts=3, d=16, r=8, f=9, gather=True, dtype=torch.float32, seed=2)
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: True)
    x = p["x"].clone().requires_grad_()
    y = grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"], gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], impl="reference")
    assert type(y.grad_fn).__name__ == "GroupedGLUBackward"
    g, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert g.abs().sum() > 0
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        g.sum().backward()


class _DecodingPath:
    """A stand-in quantized path for the CPU: decodes the containers, runs the reference (the
    path interface: rebuilt containers in, gradients w.r.t. the decoded factors out)."""

    @staticmethod
    def _dense(facs, dtype):
        return [quant.dequantize(w, dtype=dtype) if quant.is_quantized(w) else w for w in facs]

    @staticmethod
    def grouped_glu_forward(x, offs, wg, wu, wd, *rest):
        from tsct import reference
        return reference.grouped_glu_forward(x, offs, *_DecodingPath._dense((wg, wu, wd), x.dtype), *rest)

    @staticmethod
    def grouped_glu_backward(go, x, offs, wg, wu, wd, *rest):
        from tsct import reference
        return reference.grouped_glu_backward(go, x, offs, *_DecodingPath._dense((wg, wu, wd), x.dtype), *rest)


def _run_q(p, direct, monkeypatch):
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: direct)
    monkeypatch.setattr(_select, "select", lambda impl, cap, fmt, activations="bf16", x_dtype="bf16", device_index=None:
                        dispatch.TRITON_LOWBIT)
    monkeypatch.setattr(dispatch, "implementation", lambda path: _DecodingPath)
    master = p["w_gate"].detach().clone().requires_grad_()
    wq = quant.quantize_nvfp4(master.detach(), backend="torch")
    x = p["x"].detach().clone().requires_grad_()
    rw = p["row_weight"].detach().clone().requires_grad_()
    y = grouped_glu(x, p["offs"], wq, p["w_up"], p["w_down"], p["s_gate"], p["s_up"], row_weight=rw,
                    gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                    masters=(master, None, None))
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(4))
    return (y, *torch.autograd.grad(y, [x, master, rw], g)), type(y.grad_fn).__name__


def test_quantized_direct_route_equals_the_op_route(monkeypatch):
    p = make_problem(tokens=16, topk=2, experts=4, d=32, r=16, f=24, empty=(1,), gather=True, dtype=torch.float32,
                     seed=7)
    a, name_op = _run_q(p, False, monkeypatch)
    b, name_d = _run_q(p, True, monkeypatch)
    assert name_d == "GroupedGLUBackward" and "GroupedGLU" not in name_op
    for n, u, v in zip(("y", "x", "master", "row_weight"), a, b):
        assert u.abs().sum() > 0 and torch.equal(u, v), n


def test_direct_ok_refuses_cpu_and_the_switch(monkeypatch):
    x = torch.randn(4, 4)
    assert not _eager.direct_ok(x)
    monkeypatch.setattr(config, "eager_direct", False)
    assert not _eager.direct_ok(x)


def test_direct_inference_runs_the_plain_forward(monkeypatch):
    """Under no_grad (or with no input requiring grad) the direct route calls the path's plain forward
    (nothing saved for a backward); the result is the same bits as the saving forward."""
    from tsct import reference

    p = make_problem(tokens=24, topk=2, experts=6, d=32, r=8, f=37, empty=(2,), gather=True, dtype=torch.float32,
                     seed=9)
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: True)
    calls = []
    real = reference.grouped_glu_forward
    monkeypatch.setattr(reference, "grouped_glu_forward", lambda *a: calls.append("plain") or real(*a))
    args = (p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], p["s_gate"], p["s_up"])
    kw = dict(row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
              num_out_rows=p["num_out_rows"], impl="reference")
    with torch.no_grad():
        y_inf = grouped_glu(*args, **kw)
    assert calls == ["plain"] and y_inf.grad_fn is None
    x = p["x"].clone().requires_grad_()
    y_train = grouped_glu(x, *args[1:], **kw)
    assert type(y_train.grad_fn).__name__ == "GroupedGLUBackward"
    assert torch.equal(y_inf, y_train.detach())


def test_quantized_direct_inference_runs_the_plain_forward(monkeypatch):
    p = make_problem(tokens=16, topk=2, experts=4, d=32, r=16, f=24, gather=True, dtype=torch.float32, seed=11)
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: True)
    monkeypatch.setattr(_select, "select", lambda impl, cap, fmt, activations="bf16", x_dtype="bf16", device_index=None:
                        dispatch.TRITON_LOWBIT)
    monkeypatch.setattr(dispatch, "implementation", lambda path: _DecodingPath)
    seen = []
    monkeypatch.setattr(_function, "forward",
                        lambda inputs, call, save=True, trusted=False, factors=None, real=_function.forward:
                        seen.append(save) or real(inputs, call, save, trusted, factors))
    wq = quant.quantize_nvfp4(p["w_gate"], backend="torch")
    kw = dict(row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
              num_out_rows=p["num_out_rows"])
    with torch.no_grad():
        y = grouped_glu(p["x"], p["offs"], wq, p["w_up"], p["w_down"], p["s_gate"], p["s_up"], **kw)
    assert seen == [False] and y.grad_fn is None
    y2 = grouped_glu(p["x"].clone().requires_grad_(), p["offs"], wq, p["w_up"], p["w_down"], p["s_gate"], p["s_up"], **kw)
    assert type(y2.grad_fn).__name__ == "GroupedGLUBackward" and torch.equal(y, y2.detach())


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "fp8", "ternary"])
def test_eager_route_rebuilds_the_same_container_without_its_checks(fmt, monkeypatch):
    """The eager route rebuilds each packed factor from the storage it took out of the caller's container in the same
    call, without the container's checks (host time per call); the result is the same container. The custom op
    rebuilds with the checks: storage that does not fit its format tag is refused there, naming the storage."""
    from tsct.ops import _factors

    w = quant.quantize(torch.randn(3, 32, 24, generator=torch.Generator().manual_seed(1)), fmt)
    tag, storage = _factors.pack("w_gate", w)
    fast = _factors.unpack("w_gate", tag, None, storage, trusted=True)
    checked = _factors.unpack("w_gate", tag, None, storage)
    assert type(fast) is type(checked) is type(w) and fast.shape == checked.shape == w.shape
    for name in type(w)._STORAGE + (("layout",) if fmt == "nvfp4" else ()):
        a, b, c = getattr(fast, name), getattr(checked, name), getattr(w, name)
        assert (a is None and b is None and c is None) or (isinstance(a, str) and a == b == c) or (
            a.dtype == b.dtype == c.dtype and torch.equal(a.view(torch.uint8), c.view(torch.uint8))), name
    bad = (storage[0], storage[1][..., :-1]) + tuple(storage[2:])  # the second storage tensor one entry short
    with pytest.raises(ValueError, match="must have shape"):
        _factors.unpack("w_gate", tag, None, bad)


def test_quantized_direct_forward_refuses_double_backward_by_name(monkeypatch):
    """An eager forward keeps an NVFP4 factor's float8 block scale as it is; a backward that takes the op (here under
    create_graph) hands the op its bytes and still gets the named double-backward error."""
    p = make_problem(tokens=16, topk=2, experts=4, d=32, r=16, f=24, gather=True, dtype=torch.float32, seed=13)
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: True)
    monkeypatch.setattr(_select, "select", lambda impl, cap, fmt, activations="bf16", x_dtype="bf16", device_index=None:
                        dispatch.TRITON_LOWBIT)
    monkeypatch.setattr(dispatch, "implementation", lambda path: _DecodingPath)
    wq = quant.quantize_nvfp4(p["w_gate"], backend="torch")
    x = p["x"].clone().requires_grad_()
    y = grouped_glu(x, p["offs"], wq, p["w_up"], p["w_down"], gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"])
    assert type(y.grad_fn).__name__ == "GroupedGLUBackward"
    g, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert g.abs().sum() > 0
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        g.sum().backward()


@pytest.mark.parametrize("how", ["setattr", "data"])
@pytest.mark.parametrize("direct", [False, True])
def test_a_container_changed_after_construction_is_refused_on_both_routes(direct, how, monkeypatch):
    """A packed factor whose storage was replaced after its constructor checked it (``object.__setattr__``, or a
    tensor's ``.data``) is refused by ``grouped_glu`` with the factor and storage named, whether the call then crosses
    the custom op (which checks again) or not (which rebuilds the containers without their checks)."""
    p = make_problem(tokens=16, topk=2, experts=3, d=32, r=16, f=24, gather=True, dtype=torch.float32, seed=7)
    monkeypatch.setattr(_eager, "direct_ok", lambda *a: direct)
    monkeypatch.setattr(_select, "select", lambda impl, cap, fmt, activations="bf16", x_dtype="bf16", device_index=None:
                        dispatch.TRITON_LOWBIT)
    monkeypatch.setattr(dispatch, "implementation", lambda path: _DecodingPath)
    w = quant.quantize(p["w_gate"], "fp8", backend="torch")
    if how == "setattr":
        object.__setattr__(w, "scale_n", w.scale_n[:, :8].contiguous())
    else:
        w.scale_n.data = w.scale_n.data[:, :8].contiguous()
    with pytest.raises(ValueError, match="grouped_glu: w_gate: scale_n must have shape"):
        grouped_glu(p["x"], p["offs"], w, p["w_up"], p["w_down"], gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"])


def test_kernels_run_with_their_tensors_device_current(monkeypatch):
    """A call on cuda:1 while cuda:0 is current switches the device around its kernels (they launch on the current
    device's streams); the current device and any other device type need no switch."""
    entered = []

    class _Guard:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", _Guard)
    for dev in (torch.device("cuda", 0), torch.device("cuda"), torch.device("cpu"), torch.device("meta")):
        with _eager.on_device(dev):
            pass
    assert entered == []
    with _eager.on_device(torch.device("cuda", 1)):
        pass
    assert entered == [1]


def test_forward_backward_and_sort_ask_for_their_device(monkeypatch):
    from tsct.kernels.triton_common import route
    from tsct.ops import routing, sort_by_expert

    asked = []
    real = _eager.on_device
    monkeypatch.setattr(_eager, "on_device", lambda dev: asked.append(dev) or real(dev))
    monkeypatch.setattr(routing, "uses_kernels", lambda ids, e: True)  # the kernel branch, served by torch's sort
    monkeypatch.setattr(route, "sort_by_expert",
                        lambda ids, e, w=None, replayed=False: (*routing.sort_by_expert_torch(ids, e), None))
    ids = torch.randint(0, 4, (16, 2), generator=torch.Generator().manual_seed(12))
    s = sort_by_expert(ids, 4)
    assert asked == [torch.device("cpu")]
    p = make_problem(tokens=16, topk=2, experts=4, d=32, r=16, f=24, gather=True, dtype=torch.float32, seed=12)
    x = p["x"].clone().requires_grad_()
    y = grouped_glu(x, s.offs, p["w_gate"], p["w_up"], p["w_down"], gather_idx=s.token, scatter_idx=s.token,
                    num_out_rows=16, impl="reference")
    y.sum().backward()
    assert asked == [torch.device("cpu")] * 3 and x.grad is not None
