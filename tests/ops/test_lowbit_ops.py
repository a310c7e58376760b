"""Wiring of the low-bit path into ``tsct.ops``, checked on the CPU.

- the ``tsct::grouped_glu`` custom op pair with packed factor slots (``tsct/ops/_function.py``,
  ``tsct/ops/_factors.py``): registration, container packing, fake implementations and autograd (``torch.library.opcheck``), torch.compile(fullgraph=True);
- the generic plug-in contract: ``dispatch.implementation(path)`` receives rebuilt containers. A CPU
  stand-in path (decode, then ``tsct.reference``) is installed in the dispatch table for these tests;
  the real Triton kernels behind the same op run in tests/kernels/test_triton_lowbit.py (interpreter) and
  tests/ops/test_lowbit_ops_gpu.py;
- training with the straight-through estimator: masters receive the gradient w.r.t. the decoded factor,
  dX uses the decoded factors, through the packed factor slots and on the reference path; ``quantize_master`` caches one
  container per master version and ``grouped_glu`` refuses a stale one;
- dispatch: the triton-lowbit status, auto's choice per arch, the first-use self-test elsewhere.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tsct import dispatch, quant
from tsct import reference as R
from tsct.ops import _factors
from tsct.ops import _function as F
from tsct.ops import grouped_glu, quantize_master
from tsct.ops import _select
from _glu_oracle import make_problem

NAMES = ("w_gate", "w_up", "w_down")


def _problem(fmts=("nvfp4", "nvfp4", "nvfp4"), seed=0):
    p = make_problem(tokens=12, topk=2, experts=4, d=32, r=16, f=24, empty=(1,), pad_rows=2, seed=seed)
    masters = [p[n].clone() for n in NAMES]
    facs = [m if f == "dense" else quant.quantize(m, f, backend="torch") for m, f in zip(masters, fmts)]
    return p, masters, facs


def _dq(w, dtype):
    return quant.dequantize(w, dtype=dtype, backend="torch") if quant.is_quantized(w) else w


class _Recorder:
    """A stand-in implementation module for path triton-lowbit on the CPU: decode, then the reference."""

    def __init__(self):
        self.seen = []

    def grouped_glu_forward(self, x, offs, wg, wu, wd, *rest):
        self.seen.append(("fwd", tuple(type(w).__name__ for w in (wg, wu, wd))))
        return R.grouped_glu_forward(x, offs, *(_dq(w, x.dtype) for w in (wg, wu, wd)), *rest)

    def grouped_glu_backward(self, go, x, offs, wg, wu, wd, *rest):
        self.seen.append(("bwd", tuple(type(w).__name__ for w in (wg, wu, wd))))
        return R.grouped_glu_backward(go, x, offs, *(_dq(w, x.dtype) for w in (wg, wu, wd)), *rest)


@pytest.fixture
def lowbit_on_cpu(monkeypatch):
    """Route packed factors on the CPU to path triton-lowbit, served by the stand-in module."""
    rec = _Recorder()
    for fmt in ("nvfp4", "sign", "mixed"):
        monkeypatch.setitem(dispatch.TABLE, ("cpu", fmt), [dispatch.TRITON_LOWBIT, dispatch.REFERENCE])
    real_status, real_impl = dispatch.status, dispatch.implementation
    monkeypatch.setattr(dispatch, "status", lambda path, cap, fmt, x_dtype="bf16": dispatch.Status(True, "test") if
                        path == dispatch.TRITON_LOWBIT else real_status(path, cap, fmt, x_dtype))
    monkeypatch.setattr(dispatch, "implementation", lambda path: rec if path == dispatch.TRITON_LOWBIT
                        else real_impl(path))
    torch._dynamo.reset()
    yield rec
    torch._dynamo.reset()


def _call(p, facs, masters=None, x=None, **kw):
    return grouped_glu(p["x"] if x is None else x, p["offs"], *facs, p["s_gate"], p["s_up"],
                       row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                       num_out_rows=p["num_out_rows"], masters=masters, **kw)


# ---- the op ------------------------------------------------------------------------------------------

def test_ops_are_registered_with_list_storage():
    fwd = str(torch.ops.tsct.grouped_glu.default._schema)
    bwd = str(torch.ops.tsct.grouped_glu_backward.default._schema)
    for name in ("w_gate", "w_up", "w_down"):
        assert f"Tensor? {name}" in fwd and f"Tensor? {name}" in bwd
    assert "Tensor?[] storage" in fwd and "Tensor?[] storage" in bwd
    assert "str formats" in fwd and "str impl" in fwd and "bool[] needs_grad" in bwd and "Tensor[] saved" in bwd
    assert fwd.endswith("-> (Tensor, Tensor[])") and bwd.endswith("-> Tensor[]")


@pytest.mark.parametrize("fmt", ["dense", "nvfp4", "nvfp4-swizzled_128x4", "sign", "fp8", "ternary", "ternary-rank1"])
def test_pack_unpack_round_trip(fmt):
    w = torch.randn(3, 32, 40)
    if fmt == "dense":
        c = w
    elif fmt.startswith("nvfp4"):
        c = quant.quantize_nvfp4(w, layout="linear" if fmt == "nvfp4" else "swizzled_128x4", backend="torch")
    elif fmt == "ternary-rank1":
        c = quant.quantize_ternary(w, scaling="rank1", backend="torch")
    else:
        c = quant.quantize(w, fmt, backend="torch")
    tag, storage = _factors.pack("w_down", c)
    assert tag == fmt.replace("-rank1", "")
    back = _factors.unpack("w_down", tag, c if fmt == "dense" else None, storage)
    if fmt == "dense":
        assert back is c and storage == ()
        return
    assert type(back) is type(c) and back.shape == (3, 32, 40) == tuple(c.shape)
    for name in c._STORAGE:  # never copied (float8 tensors travel as a uint8 view); an absent one stays None
        if getattr(c, name) is None:
            assert getattr(back, name) is None
            continue
        assert getattr(back, name).data_ptr() == getattr(c, name).data_ptr()
        assert getattr(back, name).dtype == getattr(c, name).dtype
    assert torch.equal(quant.dequantize(back, torch.float32), quant.dequantize(c, torch.float32))
    if fmt.startswith("nvfp4"):
        assert back.layout == c.layout


def test_pack_rejects_other_types():
    with pytest.raises(TypeError, match="w_gate must be a torch.Tensor, NVFP4Tensor, SignTensor, FP8Tensor or"):
        _factors.pack("w_gate", [1, 2])
    with pytest.raises(ValueError, match="unknown format tag 'int4'"):
        _factors.unpack("w_up", "int4", None, [torch.zeros(1, 2, 3, dtype=torch.uint8)] * 3)
    with pytest.raises(ValueError, match="format 'sign' carries 3 storage tensors, got 2"):
        _factors.unpack("w_up", "sign", None, [torch.zeros(1, 2, 3, dtype=torch.uint8)] * 2)


@pytest.mark.parametrize("fmts", [("nvfp4",) * 3, ("sign",) * 3, ("nvfp4", "sign", "dense")],
                         ids=["nvfp4", "sign", "mixed"])
def test_auto_routes_packed_factors_through_the_op_as_containers(lowbit_on_cpu, fmts):
    p, _, facs = _problem(fmts)
    y = _call(p, facs)
    want = R.grouped_glu_forward(p["x"], p["offs"], *(_dq(w, torch.float32) for w in facs), p["s_gate"],
                                 p["s_up"], p["row_weight"], p["gather_idx"], p["scatter_idx"], p["num_out_rows"])
    assert torch.equal(y, want)
    kinds = {"nvfp4": "NVFP4Tensor", "sign": "SignTensor", "dense": "Tensor"}
    assert lowbit_on_cpu.seen == [("fwd", tuple(kinds[f] for f in fmts))]  # containers, rebuilt
    # the reference path (forced) gives the same bits: same decode, same math
    assert torch.equal(_call(p, facs, impl="reference"), y)


def _grads_dense(p, facs, want_master):
    """Reference gradients with the DECODED factors as leaves."""
    x = p["x"].clone().requires_grad_(True)
    leaves = [_dq(w, torch.float32).clone().requires_grad_(True) for w in facs]
    sg = p["s_gate"].clone().requires_grad_(True)
    rw = p["row_weight"].clone().requires_grad_(True)
    y = grouped_glu(x, p["offs"], *leaves, sg, p["s_up"], row_weight=rw, gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], impl="reference")
    return y, x, leaves, sg, rw


@pytest.mark.parametrize("route", ["q-op", "reference"])
def test_ste_gradients_reach_the_masters(request, route):
    if route == "q-op":
        request.getfixturevalue("lowbit_on_cpu")
    fmts = ("nvfp4", "sign", "nvfp4")
    p, masters, _ = _problem(fmts, seed=3)
    ms = [m.clone().requires_grad_(True) for m in masters]
    ms[1] = None  # a frozen packed factor: no master, no gradient
    facs = [quantize_master(m if m is not None else masters[1], f, backend="torch") for m, f in zip(ms, fmts)]
    x = p["x"].clone().requires_grad_(True)
    sg = p["s_gate"].clone().requires_grad_(True)
    rw = p["row_weight"].clone().requires_grad_(True)
    y = grouped_glu(x, p["offs"], *facs, sg, p["s_up"], row_weight=rw, gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], masters=ms,
                    impl="reference" if route == "reference" else "auto")
    go = torch.randn_like(y)
    y.backward(go)
    y_ref, x_ref, leaves, sg_ref, rw_ref = _grads_dense(p, facs, None)
    y_ref.backward(go)
    assert torch.equal(y.detach(), y_ref.detach())
    # the STE gradient of a master IS the gradient w.r.t. its decoded factor (same computation: equal)
    assert torch.equal(ms[0].grad, leaves[0].grad) and torch.equal(ms[2].grad, leaves[2].grad)
    assert ms[0].grad.abs().sum() > 0
    assert torch.equal(x.grad, x_ref.grad) and torch.equal(sg.grad, sg_ref.grad)
    assert torch.equal(rw.grad[:-2], rw_ref.grad[:-2]) and (rw.grad[-2:] == 0).all()


def test_ste_master_gradient_takes_the_master_dtype(lowbit_on_cpu):
    p, masters, _ = _problem(("nvfp4", "dense", "dense"))
    mg = masters[0].to(torch.bfloat16).requires_grad_(True)
    facs = [quantize_master(mg, "nvfp4", backend="torch"), masters[1].clone().requires_grad_(True), masters[2]]
    y = _call(p, facs, masters=(mg, None, None))
    y.sum().backward()
    assert mg.grad.dtype == torch.bfloat16 and mg.grad.shape == mg.shape
    assert facs[1].grad is not None and facs[1].grad.dtype == torch.float32  # a dense factor is its own leaf


def test_frozen_packed_factors_still_give_dx_and_scale_grads(lowbit_on_cpu):
    p, _, facs = _problem(("sign",) * 3)
    x = p["x"].clone().requires_grad_(True)
    su = p["s_up"].clone().requires_grad_(True)
    y = grouped_glu(x, p["offs"], *facs, p["s_gate"], su, row_weight=p["row_weight"], gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"])
    y.sum().backward()
    _, x_ref, _, _, _ = _grads_dense(p, facs, None)
    assert x.grad is not None and su.grad is not None
    y2 = grouped_glu(x_ref, p["offs"], *(_dq(w, torch.float32) for w in facs), p["s_gate"], p["s_up"],
                     row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                     num_out_rows=p["num_out_rows"], impl="reference")
    y2.sum().backward()
    assert torch.equal(x.grad, x_ref.grad)


# ---- masters: once per step, never stale ------------------------------------------------------------

def test_quantize_master_caches_per_version():
    w = torch.nn.Parameter(torch.randn(2, 32, 16))
    a = quantize_master(w, "nvfp4", backend="torch")
    assert quantize_master(w, "nvfp4", backend="torch") is a  # cached: same version
    s = quantize_master(w, "sign", backend="torch")
    assert isinstance(s, quant.SignTensor) and quantize_master(w, "sign", backend="torch") is s
    want = quant.quantize_nvfp4(w.detach(), backend="torch")
    assert torch.equal(a.codes, want.codes) and torch.equal(a.global_scale, want.global_scale)
    opt = torch.optim.SGD([w], lr=0.5)
    w.grad = torch.ones_like(w)
    opt.step()  # in place: bumps the version counter
    b = quantize_master(w, "nvfp4", backend="torch")
    assert b is not a
    assert torch.equal(b.codes, quant.quantize_nvfp4(w.detach(), backend="torch").codes)
    assert not torch.equal(b.global_scale, a.global_scale)


def test_stale_or_foreign_containers_are_refused():
    p, masters, _ = _problem()
    m = [t.clone().requires_grad_(True) for t in masters]
    facs = [quantize_master(t, "nvfp4", backend="torch") for t in m]
    with torch.no_grad():
        m[2].mul_(1.5)  # the "optimizer step" of w_down
    with pytest.raises(ValueError, match=r"w_down is stale: masters\[w_down\] changed"):
        _call(p, facs, masters=m)
    stale = facs[2]
    facs[2] = quantize_master(m[2], "nvfp4", backend="torch")
    _call(p, facs, masters=m)  # fresh again: accepted
    with pytest.raises(ValueError, match=r"w_down is stale"):  # the replaced container is still refused
        _call(p, [*facs[:2], stale], masters=m)
    with pytest.raises(ValueError, match=r"w_gate was quantized \(quantize_master\) from another tensor"):
        _call(p, facs, masters=[m[1], None, None])  # w_up's master paired with w_gate's container
    with pytest.raises(ValueError, match=r"masters\[w_up\] is given but w_up is a dense tensor"):
        _call(p, [facs[0], masters[1], facs[2]], masters=[None, masters[1], None])
    with pytest.raises(ValueError, match=r"masters\[w_down\] has shape \[4, 24, 16\]"):
        _call(p, facs, masters=[None, None, torch.zeros(4, 24, 16)])
    with pytest.raises(ValueError, match="masters must be a sequence .* got 2 entries"):
        _call(p, facs, masters=[None, None])
    with pytest.raises(TypeError, match="masters must be a sequence .* got Tensor"):
        _call(p, facs, masters=m[0])
    # a container made without quantize_master is accepted (freshness is then the caller's job)
    _call(p, [quant.quantize_nvfp4(t.detach(), backend="torch") for t in m], masters=m)


def test_kmajor_master_views_are_one_master_and_retired_by_its_parameters_step():
    """A K-major w_down master is a view (p.transpose(1, 2)) of the [E, f, r] parameter the optimizer
    holds (decision 0012): every fresh view of it is the same master (one cached container, accepted by
    the STE check), and a fused optimizer step on the parameter retires that container."""
    p, masters, _ = _problem()
    m = [t.clone().requires_grad_(True) for t in masters[:2]]
    pd = torch.nn.Parameter(masters[2].transpose(1, 2).contiguous())  # [E, f, r]
    q = quantize_master(pd.transpose(1, 2), "nvfp4", backend="torch")
    assert quantize_master(pd.transpose(1, 2), "nvfp4", backend="torch") is q  # a fresh view: cache hit
    assert torch.equal(q.codes, quant.quantize_nvfp4(masters[2], backend="torch").codes)
    facs = [quantize_master(t, "nvfp4", backend="torch") for t in m] + [q]
    y = _call(p, facs, masters=m + [pd.transpose(1, 2)])  # another fresh view: accepted
    y.sum().backward()
    assert pd.grad is not None and pd.grad.shape == pd.shape
    with pytest.raises(ValueError, match=r"w_down was quantized \(quantize_master\) from another tensor"):
        _call(p, facs, masters=m + [pd.detach().clone().transpose(1, 2)])  # same values, another tensor
    opt = torch.optim.AdamW([pd], lr=0.5, fused=True)  # fused: no version-counter bump
    opt.step()
    with pytest.raises(ValueError, match=r"w_down is stale"):
        _call(p, facs, masters=m + [pd.transpose(1, 2)])
    q2 = quantize_master(pd.transpose(1, 2), "nvfp4", backend="torch")
    assert q2 is not q
    assert torch.equal(q2.codes, quant.quantize_nvfp4(pd.detach().transpose(1, 2), backend="torch").codes)
    tsct_mark = __import__("tsct.ops", fromlist=["mark_masters_updated"]).mark_masters_updated
    tsct_mark(pd.transpose(1, 2))  # marking a view marks its parameter
    assert quantize_master(pd.transpose(1, 2), "nvfp4", backend="torch") is not q2


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.AdamW, {"fused": True}), (torch.optim.Adam, {"foreach": True}),
                                          (torch.optim.SGD, {})], ids=["adamw_fused", "adam_foreach", "sgd"])
def test_optimizer_steps_invalidate_even_without_version_bump(opt_cls, kw):
    """A fused optimizer updates in place without moving the version counter: the global step hook
    must still retire the cached container (else the forward silently keeps the old weights)."""
    p, masters, _ = _problem()
    m = [t.clone().requires_grad_(True) for t in masters]
    facs = [quantize_master(t, "nvfp4", backend="torch") for t in m]
    opt = opt_cls(m, lr=0.5, **kw)
    for t in m:
        t.grad = torch.randn_like(t)
    opt.step()
    with pytest.raises(ValueError, match=r"w_gate is stale"):
        _call(p, facs, masters=m)
    fresh = [quantize_master(t, "nvfp4", backend="torch") for t in m]
    assert all(f is not g for f, g in zip(fresh, facs))
    for f, t in zip(fresh, m):
        assert torch.equal(f.codes, quant.quantize_nvfp4(t.detach(), backend="torch").codes)
    _call(p, fresh, masters=m)  # accepted


def test_a_cast_or_moved_data_is_a_new_master():
    """``p.data = p.data.to(<dtype>)`` (what ``module.to`` does) moves no version counter; the master's dtype and
    device are part of its stamp, so the next quantize_master quantizes the cast values, the old container is
    refused as stale, and the cache keeps one entry per view (a cast back and forth does not grow it)."""
    from tsct.ops import _masters
    p, masters, _ = _problem()
    m = [t.clone().requires_grad_(True) for t in masters]
    facs = [quantize_master(t, "nvfp4", backend="torch") for t in m]
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16):
        m[0].data = m[0].data.to(dtype)
        q = quantize_master(m[0], "nvfp4", backend="torch")
        assert q is not facs[0] and torch.equal(q.codes, quant.quantize_nvfp4(m[0].detach(), backend="torch").codes)
        assert quantize_master(m[0], "nvfp4", backend="torch") is q
    with pytest.raises(ValueError, match=r"w_gate is stale: masters\[w_gate\] changed .*a cast"):
        _call(p, facs, masters=m)
    assert len(_masters._master_cache[m[0]]) == 1


def test_data_writes_need_mark_masters_updated():
    from tsct.ops import mark_masters_updated
    p, masters, _ = _problem()
    m = [t.clone().requires_grad_(True) for t in masters]
    facs = [quantize_master(t, "nvfp4", backend="torch") for t in m]
    m[1].data.mul_(2.0)  # invisible to the version counter and to the optimizer hook
    assert quantize_master(m[1], "nvfp4", backend="torch") is facs[1]  # documented limitation
    mark_masters_updated(m[1])
    with pytest.raises(ValueError, match=r"w_up is stale"):
        _call(p, facs, masters=m)
    new = quantize_master(m[1], "nvfp4", backend="torch")
    assert new is not facs[1] and torch.equal(new.codes, quant.quantize_nvfp4(m[1].detach(), backend="torch").codes)
    with pytest.raises(TypeError, match="mark_masters_updated: expected tensors"):
        mark_masters_updated("w_up")


# ---- torch.library checks and torch.compile -----------------------------------------------------------

def _op_args(p, facs, masters, impl):
    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], p["num_out_rows"], p["row_weight"])
    return F.op_args(p["x"], facs, masters, p["s_gate"], p["s_up"], routing, impl)


def test_opcheck_with_packed_factors(lowbit_on_cpu):
    """torch.library's own checks of schema, fake implementation, autograd registration and dynamic
    shapes, for a packed/dense mix with a master and a dense leaf."""
    p, masters, facs = _problem(("nvfp4", "sign", "dense"))
    p["x"] = p["x"].requires_grad_(True)
    leaf = facs[2].clone().requires_grad_(True)
    args = _op_args(p, [facs[0], facs[1], leaf], (masters[0].clone().requires_grad_(True), None, None),
                    dispatch.TRITON_LOWBIT)
    torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args)


def test_fake_impls_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    p, masters, facs = _problem(("sign", "nvfp4", "nvfp4"))
    with FakeTensorMode(allow_non_fake_inputs=True):
        y, saved = torch.ops.tsct.grouped_glu(*_op_args(p, facs, (None, None, None), dispatch.TRITON_LOWBIT))
        assert tuple(y.shape) == (12, 24) and y.dtype == torch.float32
        # triton-lowbit saves hg, hu (fp32) and z * rw ([M, r] = [26, 16]) for its backward, and with scatter_idx
        # the combine's CSR (order [M], ptr [num_out_rows + 1], int64) for the dX combine
        assert [(tuple(t.shape), t.dtype) for t in saved] == ([((26, 16), torch.float32)] * 2 + [((26, 16), y.dtype)]
                                                              + [((26,), torch.int64), ((13,), torch.int64)])
        grads = torch.ops.tsct.grouped_glu_backward(
            torch.empty(12, 24), *_op_args(p, facs, (masters[0], None, masters[2]), dispatch.TRITON_LOWBIT),
            [True, True, False, True, False, True, True], saved)
        shapes = [tuple(g.shape) for g in grads]
    assert shapes == [(12, 32), (4, 32, 16), (0,), (4, 16, 24), (0,), (4, 16), (26,)]


def test_fullgraph_compile_with_packed_factors_and_masters(lowbit_on_cpu):
    fmts = ("nvfp4", "sign", "nvfp4")
    p, masters, _ = _problem(fmts, seed=5)
    ms = [m.clone().requires_grad_(True) for m in masters]
    facs = [quantize_master(m, f, backend="torch") for m, f in zip(ms, fmts)]

    def step(x, f0, f1, f2, m0, m1, m2):
        h = torch.tanh(x)
        return grouped_glu(h, p["offs"], f0, f1, f2, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                           gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                           num_out_rows=p["num_out_rows"], masters=(m0, m1, m2)) * 2

    y_eager = step(p["x"], *facs, *ms)
    y_eager.sum().backward()
    g_eager = [m.grad.clone() for m in ms]
    for m in ms:
        m.grad = None
    compiled = torch.compile(step, fullgraph=True)
    y = compiled(p["x"], *facs, *ms)
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    for g, ge in zip([m.grad for m in ms], g_eager):
        torch.testing.assert_close(g, ge, rtol=1e-5, atol=1e-6)
    assert ("fwd", ("NVFP4Tensor", "SignTensor", "NVFP4Tensor")) in lowbit_on_cpu.seen


# ---- dispatch -----------------------------------------------------------------------------------------

def _fake_aot_dir(tmp_path, families):
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "index.json").write_text(json.dumps(
        {"arch": "sm_90a", "families": {f: {"variants": 1} for f in families}, "kernels": {"k": {}}}))
    return tmp_path


def test_lowbit_status_reasons(monkeypatch, tmp_path):
    from tsct.kernels import aot
    from tsct.kernels import triton_lowbit as TL

    monkeypatch.setenv("TSCT_AOT_DIR", str(_fake_aot_dir(tmp_path, ["glu", "lowbit"])))
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    aot._reset_for_tests()
    try:
        for fmt in ("nvfp4", "sign"):
            assert TL.status((9, 0), fmt) == (True, "AOT cubins for sm_90a")
            assert dispatch.status(dispatch.TRITON_LOWBIT, (9, 0), fmt) == dispatch.Status(True, "AOT cubins for sm_90a")
        assert not TL.status(None, "nvfp4")[0] and not TL.status((7, 5), "sign")[0]
        assert TL.status((9, 0), "fp32") == (False, "storage format 'fp32' is not served by the Triton low-bit path")
        ok, why = TL.status((9, 0), "mixed")  # mixes other than the tested one: JIT
        assert ok == (why == "Triton JIT")
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
        for fmt in ("mixed", "fp8", "ternary"):  # no cubins (fp8 / ternary: forced-only, JIT)
            assert TL.status((9, 0), fmt) == (False, f"TSCT_TRITON_BACKEND=aot but this install has no cubin for {fmt} "
                                                     f"factors (Triton JIT runs them)")
        ok, why = TL.status((12, 0), "nvfp4")  # this fake install has no sm_120 cubins
        assert (ok, why) == (False, "TSCT_TRITON_BACKEND=aot but this install has no AOT cubins for compute "
                                    "capability 12.0")
        assert TL.status((9, 0), "sign") == (True, "AOT cubins for sm_90a")
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "jit")
        ok, why = TL.status((9, 0), "nvfp4")
        assert ok == (why == "Triton JIT")
    finally:
        aot._reset_for_tests()
    # an install whose index lacks the lowbit family is not "AOT"
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    other = tmp_path / "old"
    other.mkdir()
    monkeypatch.setenv("TSCT_AOT_DIR", str(_fake_aot_dir(other, ["glu"])))
    aot._reset_for_tests()
    try:
        assert TL.aot_arch((9, 0)) is None
        assert TL.status((9, 0), "nvfp4")[1] != "AOT cubins for sm_90a"
    finally:
        aot._reset_for_tests()


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1)])
@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "mixed"])
def test_auto_takes_triton_lowbit_on_gpu_arches(monkeypatch, cap, fmt):
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_LOWBIT, lambda c, f, x: dispatch.Status(True, "built"))
    monkeypatch.setitem(dispatch._STATUS, dispatch.SM120_FP4, lambda c, f, x: dispatch.Status(False, "test: not built"))
    dec = dispatch.decide(cap, fmt)
    assert dec.path == dispatch.TRITON_LOWBIT and dec.skipped == ()  # bf16 activations: sm120-fp4 is not a candidate
    assert dispatch.decide(None, fmt).path == dispatch.BMM
    assert dispatch.decide((13, 0), fmt).path == dispatch.BMM


def test_implementation_and_executed_on():
    mod = dispatch.implementation(dispatch.TRITON_LOWBIT)
    from tsct.kernels import triton_lowbit

    assert mod is triton_lowbit
    assert callable(mod.grouped_glu_forward) and callable(mod.grouped_glu_backward)
    assert dispatch.EXECUTED_ON[dispatch.TRITON_LOWBIT] == frozenset({"sm90"})


def test_first_use_selftest_runs_off_sm90_with_the_storage_format(monkeypatch):
    """Off sm_90 the first use of triton-lowbit asks tsct.firstuse (a child process) per storage format."""
    from tsct import firstuse

    dispatch.reset_fallback_counts()
    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_LOWBIT, lambda c, f, x: dispatch.Status(True, "built"))
    calls = []

    def fake(device_index, path, fmt, **kw):
        calls.append((path, fmt))
        ok = fmt != "sign"
        return firstuse.Verdict(ok, "pass" if ok else "fail", "rel err 1e-3" if ok else "rel err 0.4", "test")

    monkeypatch.setattr(firstuse, "verdict", fake)
    monkeypatch.setattr(dispatch.torch.cuda, "current_device", lambda: 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _select.select("auto", (9, 0), "nvfp4") == dispatch.TRITON_LOWBIT  # executed there: no test
        assert calls == []
        assert _select.select("auto", (10, 0), "nvfp4") == dispatch.TRITON_LOWBIT
        assert _select.select("auto", (10, 0), "sign") == dispatch.BMM  # self-test failed: disabled
        assert _select.select("auto", (10, 0), "mixed") == dispatch.TRITON_LOWBIT
    assert calls == [(dispatch.TRITON_LOWBIT, "nvfp4"), (dispatch.TRITON_LOWBIT, "sign"),
                     (dispatch.TRITON_LOWBIT, "mixed")]  # the mix is self-tested as a mix
    dispatch.reset_fallback_counts()


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "mixed"])
def test_selftest_runs_the_lowbit_path_through_the_op(lowbit_on_cpu, fmt):
    from tsct import selftest

    res = selftest.grouped_glu(dispatch.TRITON_LOWBIT, torch.device("cpu"), torch.float32, fmt)
    assert res.ok, res.detail
    want = {"nvfp4": ("NVFP4Tensor",) * 3, "sign": ("SignTensor",) * 3,
            "mixed": ("NVFP4Tensor", "SignTensor", "NVFP4Tensor")}[fmt]
    assert lowbit_on_cpu.seen and lowbit_on_cpu.seen[0] == ("fwd", want)


def test_bench_ste_arm_call_differentiates_the_masters():
    """The "-ste" bench arms: tsct_call with masters; the arm's leaves are the masters and the scales."""
    from tsct.bench import arms, inputs

    p, masters, facs = _problem(("nvfp4", "sign", "nvfp4"), seed=8)
    ms = [m.clone().requires_grad_(True) for m in masters]
    sg, su = p["s_gate"].clone().requires_grad_(True), p["s_up"].clone().requires_grad_(True)
    fac = inputs.Factors("nvfp4", *facs, sg, su)
    dense = inputs.Factors("fp32", *ms, sg, su)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (12, 2), generator=g)
    w = torch.rand(12, 2, generator=g)
    x = torch.randn(12, 32, generator=g)
    wm = arms._WithMasters(fac, dense)
    assert wm.storage_bytes() == fac.storage_bytes() < sum(m.numel() * 4 for m in ms)
    assert wm.leaf_names() == ["master_w_gate", "master_w_up", "master_w_down", "s_gate", "s_up"]
    y = arms.tsct_call(x, ids, w, fac, 4, "reference", masters=tuple(ms))
    grads = torch.autograd.grad(y.sum(), wm.leaves())
    assert [tuple(gr.shape) for gr in grads] == [(4, 32, 16), (4, 32, 16), (4, 16, 24), (4, 16), (4, 16)]
    assert all(gr.abs().sum() > 0 for gr in grads)
    # equal to the gradient w.r.t. the decoded factors (STE)
    dec = [_dq(f, torch.float32).requires_grad_(True) for f in facs]
    y2 = arms.tsct_call(x, ids, w, inputs.Factors("fp32", *dec, sg, su), 4, "reference")
    assert torch.equal(y, y2)
    for a, b in zip(grads[:3], torch.autograd.grad(y2.sum(), dec)):
        assert torch.equal(a, b)
