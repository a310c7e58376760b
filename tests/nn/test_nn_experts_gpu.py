"""tsct.nn expert layers on a CUDA GPU: the kernel paths against the padded bmm in fp32 (independent of tsct), the
straight-through layers, CUDA graphs (``torch.cuda.make_graphed_callables``: forward and backward, replays that
see updated masters), torch.compile(fullgraph=True), the counts interface without host reads, determinism.

    python3 -m pytest -q tests/nn/test_nn_experts_gpu.py
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import config, quant  # noqa: E402
from tsct.nn import GroupedGLUExperts, PaddedBmmGLUExperts  # noqa: E402
from _cuda_graph import captured, gc_paused  # noqa: E402

DEV = torch.device("cuda")
E, D, R, F, T, K = 64, 256, 64, 683, 1024, 2  # f odd
TOL = 1e-2  # rel Frobenius: bf16 activations against fp32
NAMES = ("w_gate", "w_up", "w_down", "s_gate", "s_up")


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def routing(seed=0, t=T):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(t, D, generator=g, device=DEV)
    probs = torch.softmax(torch.randn(t, E, generator=g, device=DEV), -1)
    w, ids = probs.topk(K)
    ids[ids == 5] = 6  # an empty expert
    return x.bfloat16(), ids, w / w.sum(-1, keepdim=True)


def layer(cls=GroupedGLUExperts, seed=1, **kw):
    torch.manual_seed(seed)
    m = cls(E, D, R, F, device=DEV, **kw)  # fp32 parameters: masters, cast to bf16 in the forward
    with torch.no_grad():
        m.s_gate.uniform_(0.5, 1.5)
        m.s_up.uniform_(0.5, 1.5)
    return m


def run(m, x, ids, w, go):
    """(output, x grad, weight grad, parameter grads) of <m(x, ids, w), go>."""
    m.zero_grad(set_to_none=True)
    x, w = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    y = m(x, ids, w)
    (y.float() * go).sum().backward()
    return [y.detach(), x.grad, w.grad] + [p.grad.clone() for p in m.parameters()]


def with_decoded(m):
    """A bf16-storage layer holding ``m``'s decoded low-bit factors (what the straight-through layer computes)."""
    d = layer(GroupedGLUExperts)
    with torch.no_grad():
        for p, v in zip((d.w_gate, d.w_up, d.w_down), m.factor_views()):
            dq = quant.dequantize(quant.quantize(v.detach(), m.storage), torch.float32)
            p.copy_(dq if p.shape == dq.shape else dq.transpose(1, 2))
        d.s_gate.copy_(m.s_gate), d.s_up.copy_(m.s_up)
    return d


def test_grouped_layer_matches_the_padded_bmm_in_fp32():
    m = layer()
    ref = layer(PaddedBmmGLUExperts, capacity_factor=None)
    x, ids, w = routing()
    go = torch.randn(T, F, device=DEV)
    got = run(m, x, ids, w, go)
    want = run(ref, x.float(), ids, w, go)  # fp32 activations: the oracle
    assert got[0].dtype == torch.bfloat16
    for name, a, b in zip(("y", "x.grad", "w.grad") + NAMES, got, want):
        assert rel(a, b) < TOL, (name, rel(a, b))
    again = run(m, x, ids, w, go)
    for a, b in zip(got, again):  # deterministic
        assert torch.equal(a, b)


def test_exact_layer_under_autocast_is_the_float_oracle_and_the_grouped_layer_is_within_bf16_of_it():
    """The training A/B's pair under bf16 autocast: the exact layer (fp32 intermediates; its fp32 bmm must not be
    autocast back to bf16, and TF32 is exact for bf16 operands) against impl="reference", and the grouped layer on
    the kernel path against the exact layer, per gradient tensor (what the A/B's gate checks)."""
    x, ids, w = routing(seed=3)
    go = torch.randn(T, F, device=DEV)

    def under_autocast(m):  # the forward under autocast, the backward outside it (as torch recommends)
        forward = m.forward

        def autocast_forward(*args):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return forward(*args)

        m.forward = autocast_forward
        return run(m, x.float(), ids, w, go)

    exact = under_autocast(layer(PaddedBmmGLUExperts, capacity_factor=None, intermediates="fp32"))
    oracle = under_autocast(layer(impl="reference"))
    grouped = under_autocast(layer())
    for name, a, b, c in zip(("y", "x.grad", "w.grad") + NAMES, exact, oracle, grouped):
        assert rel(a, b) < 1e-4, (name, rel(a, b))
        assert rel(c, a) < TOL, (name, rel(c, a))


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_straight_through_layer_on_the_low_bit_kernels(fmt):
    m = layer(storage=fmt)
    dense = with_decoded(m)
    x, ids, w = routing(seed=2)
    go = torch.randn(T, F, device=DEV)
    got, want = run(m, x, ids, w, go), run(dense, x, ids, w, go)
    for name, a, b in zip(("y", "x.grad", "w.grad") + NAMES, got, want):
        assert rel(a, b) < TOL, (name, rel(a, b))
    frozen = copy.deepcopy(m).freeze()
    with torch.no_grad():
        assert torch.equal(frozen(x, ids, w), m(x, ids, w))


@contextlib.contextmanager
def no_value_checks():
    old = config.check_values
    config.check_values = False
    try:
        yield
    finally:
        config.check_values = old


@pytest.mark.parametrize("storage", ["bf16", "nvfp4", "sign"])
def test_graphed_forward_backward_matches_eager_and_follows_the_masters(storage):
    m = layer(storage=storage)
    ref = copy.deepcopy(m)
    x, ids, w = routing(seed=3)
    x.requires_grad_(True)
    w.requires_grad_(True)
    with gc_paused():
        graphed = torch.cuda.make_graphed_callables(m, (x, ids, w))
    for seed in (4, 5):
        if seed == 5:  # an optimizer-like in-place update: a replay quantizes the new masters (straight-through)
            with torch.no_grad():
                for p, q in zip(m.parameters(), ref.parameters()):
                    p.add_(torch.randn_like(p), alpha=0.01)
                    q.copy_(p)
        x2, ids2, w2 = routing(seed=seed)
        go = torch.randn(T, F, device=DEV)
        got, want = run(graphed, x2, ids2, w2, go), run(ref, x2, ids2, w2, go)
        for name, a, b in zip(("y", "x.grad", "w.grad") + NAMES, got, want):
            assert rel(a, b) < (1e-3 if storage == "bf16" else TOL), (storage, seed, name, rel(a, b))


@pytest.mark.parametrize("storage, frozen", [("bf16", False), ("nvfp4", False), ("nvfp4", True)])
def test_fullgraph_compile_matches_eager(storage, frozen):
    torch._dynamo.reset()
    m = layer(storage=storage)
    if frozen:
        m.freeze()
    x, ids, w = routing(seed=6)
    go = torch.randn(T, F, device=DEV)
    want = run(m, x, ids, w, go)
    got = run(torch.compile(m, fullgraph=True), x, ids, w, go)
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel(a, b) < (1e-3 if storage == "bf16" else TOL), (storage, i, rel(a, b))
    torch._dynamo.reset()


def test_counts_interface_reads_nothing_on_the_host_and_ignores_garbage():
    m = layer()
    x, ids, w = routing(seed=7)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    pad = 300
    rows = torch.cat([x[order // K], torch.full((pad, D), float("nan"), device=DEV, dtype=x.dtype)])
    probs = torch.cat([w.reshape(-1)[order], torch.full((pad,), float("nan"), device=DEV)])
    rows.requires_grad_(True)
    probs.requires_grad_(True)
    want = m(x, ids, w)
    m.forward_counts(rows, counts, probs)  # warm-up: first-use work (loading kernels) may read the host
    with no_value_checks():
        torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
        try:
            y = m.forward_counts(rows, counts, probs)
            y.float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(y[T * K:], torch.zeros(pad, F, device=DEV, dtype=y.dtype))
    assert torch.equal(rows.grad[T * K:], torch.zeros(pad, D, device=DEV, dtype=rows.dtype))
    assert torch.equal(probs.grad[T * K:], torch.zeros(pad, device=DEV))
    combined = torch.zeros(T * K, F, device=DEV).index_copy(0, order, y[:T * K].float()).view(T, K, F).sum(1)
    assert rel(combined, want) < TOL
    # and in a CUDA graph, the [E, C, d] receive-buffer form
    c = int(counts.max()) + 5
    slots = torch.randn(E, c, D, device=DEV, dtype=x.dtype)
    with no_value_checks():
        m.forward_counts(slots, counts)
        graph, out = captured(lambda: m.forward_counts(slots, counts))
        graph.replay()
        want_slots = m.forward_counts(slots, counts)
    torch.cuda.synchronize()
    assert torch.equal(out, want_slots)
    unused = torch.arange(c, device=DEV) >= counts.unsqueeze(1)
    assert torch.equal(out[unused], torch.zeros_like(out[unused]))


@pytest.mark.parametrize("storage", ["bf16", "nvfp4"])
def test_default_value_checks_add_no_sync_to_a_training_step(storage):
    """With the default ``check_values`` the layer's routing comes from its own ``sort_by_expert`` (valid by
    construction), so ``grouped_glu`` reads nothing back: a forward and backward run under the sync debug mode's
    "error" and give the same bits as with the checks off."""
    assert config.check_values  # the default
    m = layer(storage=storage)
    x, ids, w = routing(seed=9)
    x.requires_grad_(True)
    m(x, ids, w).float().sum().backward()  # warm-up: first-use work (loading kernels) may read the host
    x.grad = None
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
    try:
        y = m(x, ids, w)
        y.float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    gx = x.grad
    x.grad = None
    with no_value_checks():
        y2 = m(x, ids, w)
        y2.float().sum().backward()
    assert torch.equal(y, y2) and torch.equal(gx, x.grad)
