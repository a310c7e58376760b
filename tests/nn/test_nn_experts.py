"""tsct.nn expert layers on the CPU: GroupedGLUExperts in every storage mode and PaddedBmmGLUExperts against an
independent float64 oracle (one token at a time from design.md section 2), their shared parameter layout, the
counts interface with garbage rows, state_dict round trips, torch.compile(fullgraph=True), autocast, and the
arguments passed through to tsct.ops.grouped_glu."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from tsct import quant
from tsct.nn import GroupedGLUExperts, PaddedBmmGLUExperts
from tsct.nn.capacity import capacity_slots

E, D, R, F, T, K = 8, 64, 16, 63, 150, 2
NAMES = ("w_gate", "w_up", "w_down", "s_gate", "s_up")


def routing(seed=0, t=T, e=E, k=K, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, D, generator=g)
    probs = torch.softmax(torch.randn(t, e, generator=g), -1)
    w, ids = probs.topk(k)
    return x, ids, (w / w.sum(-1, keepdim=True)).to(dtype)


def layer(cls=GroupedGLUExperts, seed=1, **kw):
    torch.manual_seed(seed)
    m = cls(E, D, R, F, **kw)
    with torch.no_grad():  # scales away from 1, so a dropped scale would show
        m.s_gate.uniform_(0.5, 1.5)
        m.s_up.uniform_(0.5, 1.5)
    return m


def oracle(factors, x, ids, w):
    """float64, one token at a time: sum_j w[t, j] * GLU_{ids[t, j]}(x[t]); factors (w_gate, w_up, w_down [E, r, f],
    s_gate, s_up); ids outside [0, E) contribute nothing. Differentiable by autograd."""
    wg, wu, wd, sg, su = factors
    out = []
    for t in range(x.shape[0]):
        acc = x.new_zeros(wd.shape[2])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if 0 <= e < wg.shape[0]:
                g = (x[t] @ wg[e]) * sg[e]
                u = (x[t] @ wu[e]) * su[e]
                acc = acc + w[t, j] * ((torch.nn.functional.silu(g) * u) @ wd[e])
        out.append(acc)
    return torch.stack(out)


def leaves64(factors):
    return [f.detach().double().requires_grad_(True) for f in factors]


def dense_factors(m):
    """The factors a layer computes with, dense, in the op's logical shapes (decoded for low-bit storage)."""
    storage = getattr(m, "storage", "bf16")  # PaddedBmmGLUExperts: dense
    if getattr(m, "frozen", False):
        facs = [quant.dequantize(q, torch.float32, backend="torch") for q in m.packed_factors()]
    elif storage != "bf16":
        facs = [quant.dequantize(quant.quantize(v.detach(), storage, backend="torch"), torch.float32, "torch")
                for v in m.factor_views()]
    else:
        facs = [v.detach() for v in m.factor_views()]
    return facs + [m.s_gate.detach(), m.s_up.detach()]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


# ---- the layout both layers share -------------------------------------------------------------------------

def test_both_layers_share_parameters_and_state_dict_keys():
    a, b = layer(GroupedGLUExperts), layer(PaddedBmmGLUExperts)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) == list(NAMES)
    assert {k: v.shape for k, v in sa.items()} == {k: v.shape for k, v in sb.items()}
    assert tuple(a.w_gate.shape) == (E, D, R) and tuple(a.w_down.shape) == (E, F, R)  # w_down K-major
    assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in b.parameters()) == E * (2 * D * R + R * F
                                                                                                   + 2 * R)
    wd = a.factor_views()[2]
    assert tuple(wd.shape) == (E, R, F) and wd.transpose(1, 2).is_contiguous()
    # same seed, same init: the A/B arms start from the same weights
    for (k, va), vb in zip(layer(GroupedGLUExperts, seed=7).state_dict().items(),
                           layer(PaddedBmmGLUExperts, seed=7).state_dict().values()):
        assert torch.equal(va, vb), k


def test_init_follows_nn_linear():
    torch.manual_seed(3)
    m = GroupedGLUExperts(E, D, R, F)
    for name, fan_in in (("w_gate", D), ("w_up", D), ("w_down", R)):
        p = getattr(m, name)
        bound = fan_in ** -0.5
        assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound
        assert abs(p.mean().item()) < 0.1 * bound
    assert torch.equal(m.s_gate, torch.ones(E, R)) and torch.equal(m.s_up, torch.ones(E, R))
    no_scales = GroupedGLUExperts(E, D, R, F, scales=False)
    assert no_scales.s_gate is None and list(no_scales.state_dict()) == ["w_gate", "w_up", "w_down"]


# ---- forward and gradients against the oracle ------------------------------------------------------------

@pytest.mark.parametrize("cls, kw", [(GroupedGLUExperts, {}), (PaddedBmmGLUExperts, {"capacity_factor": None})])
def test_forward_and_every_gradient_match_the_float64_oracle(cls, kw):
    m = layer(cls, **kw)
    x, ids, w = routing()
    ids[3, 1] = -1 if cls is GroupedGLUExperts else ids[3, 1]  # a dropped choice (tsct only: -1 is not an id)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y = m(x, ids, w)
    assert y.shape == (T, F) and y.dtype == torch.float32
    go = torch.randn(T, F, generator=torch.Generator().manual_seed(9))
    (y * go).sum().backward()
    facs = leaves64(dense_factors(m))
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    want = oracle(facs, x64, ids, w64)
    (want * go.double()).sum().backward()
    assert rel(y, want) < 1e-6
    grads = {"x": (x.grad, x64.grad), "topk_weights": (w.grad, w64.grad)}
    got = [m.w_gate.grad, m.w_up.grad, m.w_down.grad.transpose(1, 2), m.s_gate.grad, m.s_up.grad]
    grads.update({n: (g, f.grad) for n, g, f in zip(NAMES, got, facs)})
    for name, (g, gw) in grads.items():
        assert rel(g, gw) < 1e-5, name
    assert m.w_down.grad.is_contiguous()  # the parameter's own [E, f, r] layout


@pytest.mark.parametrize("cls, kw", [(GroupedGLUExperts, {}), (PaddedBmmGLUExperts, {"capacity_factor": None})])
def test_float64_router_weights_are_taken_by_both_layers(cls, kw):
    """A float64 router (weights) is taken as fp32 by both layers (the A/B swaps one line): the output of the fp32
    weights, and a float64 gradient equal to theirs."""
    m = layer(cls, **kw)
    x, ids, w = routing(seed=5)
    w32, w64 = w.clone().requires_grad_(True), w.double().requires_grad_(True)
    y32, y64 = m(x, ids, w32), m(x, ids, w64)
    assert torch.equal(y64, y32)
    go = torch.randn(T, F, generator=torch.Generator().manual_seed(3))
    (y32 * go).sum().backward()
    (y64 * go).sum().backward()
    assert w64.grad.dtype == torch.float64 and torch.equal(w64.grad, w32.grad.double())


def test_padded_bmm_drops_the_rows_past_capacity_and_reports_the_fraction():
    m = layer(PaddedBmmGLUExperts, capacity_factor=1.0)
    x, ids, w = routing(seed=2)
    ids[:40, 0] = 3  # overload expert 3
    y = m(x, ids, w)
    c = m.capacity(ids)
    assert c == -(-T * K // E)
    keep = capacity_slots(ids, E, c).keep.view(T, K)
    assert 0 < m.dropped_fraction.item() == pytest.approx(1 - keep.float().mean().item())
    want = oracle([f.double() for f in dense_factors(m)], x.double(), torch.where(keep, ids, -1), w.double())
    assert rel(y, want) < 1e-6
    m.capacity_factor = None  # dropless: the busiest expert's load
    assert m.capacity(ids) == int(torch.bincount(ids.flatten()).max())
    m(x, ids, w)
    assert m.dropped_fraction.item() == 0


def test_grouped_and_dropless_padded_bmm_agree_in_bf16():
    a = layer(GroupedGLUExperts).to(torch.bfloat16)
    b = layer(PaddedBmmGLUExperts, capacity_factor=None).to(torch.bfloat16)
    x, ids, w = routing(seed=4)
    ya, yb = a(x.bfloat16(), ids, w), b(x.bfloat16(), ids, w)
    assert ya.dtype == yb.dtype == torch.bfloat16
    assert rel(ya, yb) < 1e-2


def test_fp32_intermediates_compute_the_float_oracles_math_under_autocast():
    """The exact layer of the training A/B: under bf16 autocast, the operands rounded to bf16 and everything after them
    in fp32 gives tsct's float oracle (impl="reference") to fp32 rounding, output and every gradient; the "compute"
    intermediates (bf16 products and elementwise results, a bf16 backward) are a bf16 rounding away."""
    x, ids, w = routing(seed=14)
    go = torch.randn(T, F, generator=torch.Generator().manual_seed(15))

    def run(m):
        xx, ww = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xx, ids, ww)
        (y.float() * go).sum().backward()
        return [y, xx.grad, ww.grad] + [p.grad for p in m.parameters()]

    want = run(layer(GroupedGLUExperts, impl="reference"))
    assert want[0].dtype == torch.bfloat16
    exact = run(layer(PaddedBmmGLUExperts, capacity_factor=None, intermediates="fp32"))
    usual = run(layer(PaddedBmmGLUExperts, capacity_factor=None))
    rounded = run(layer(PaddedBmmGLUExperts, capacity_factor=None, intermediates="tensor-core"))
    for name, a, b, c, d in zip(("y", "x", "topk_weights") + NAMES, exact, usual, want, rounded):
        assert rel(a, c) < 1e-4, name
        assert 1e-3 < rel(b, c) < 2e-2, name
        assert rel(d, c) < 1e-2, name  # z and the products' gradients rounded to bf16: a bf16 rounding away
    assert rel(rounded[0], want[0]) > 0 and rel(rounded[1], want[1]) > 0  # ... and not the same bits
    assert "intermediates='fp32'" in repr(layer(PaddedBmmGLUExperts, intermediates="fp32"))


# ---- low-bit storage ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_straight_through_masters_get_the_decoded_factors_gradient(fmt):
    m = layer(GroupedGLUExperts, storage=fmt)
    dense = layer(GroupedGLUExperts)  # a bf16-storage layer holding the decoded factors
    with torch.no_grad():
        wg, wu, wd, _, _ = dense_factors(m)
        dense.w_gate.copy_(wg), dense.w_up.copy_(wu), dense.w_down.copy_(wd.transpose(1, 2))
        dense.s_gate.copy_(m.s_gate), dense.s_up.copy_(m.s_up)
    x, ids, w = routing(seed=5)
    y, yd = m(x, ids, w), dense(x, ids, w)
    assert torch.equal(y, yd)
    y.square().sum().backward()
    yd.square().sum().backward()
    for name in NAMES:  # STE: d master = d decoded factor
        assert torch.equal(getattr(m, name).grad, getattr(dense, name).grad), name


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_masters_are_quantized_once_per_optimizer_step(fmt, monkeypatch):
    m = layer(GroupedGLUExperts, storage=fmt)
    calls = []
    real = quant.quantize
    monkeypatch.setattr(quant, "quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, ids, w = routing(seed=6)
    for _ in range(3):  # three micro-batches: one quantization of each factor
        m(x, ids, w).sum().backward()
    assert len(calls) == 3
    y0 = m(x, ids, w).detach()
    opt.step()
    y1 = m(x, ids, w).detach()
    assert len(calls) == 6 and not torch.equal(y0, y1)  # the step retired the cached containers


def test_straight_through_cache_follows_loads_and_writes_the_version_counter_misses():
    m, other = layer(GroupedGLUExperts, storage="nvfp4"), layer(GroupedGLUExperts, seed=5, storage="nvfp4")
    x, ids, w = routing(seed=6)
    m(x, ids, w)  # fills the cache
    m.load_state_dict(other.state_dict())
    assert torch.equal(m(x, ids, w), other(x, ids, w))
    with torch.no_grad():
        m.w_up.data.mul_(-1)  # a write the version counter of the parameter does not record
    stale = m(x, ids, w)
    m.requantize()
    fresh = m(x, ids, w)
    assert torch.equal(stale, other(x, ids, w)) and not torch.equal(fresh, stale)


@pytest.mark.parametrize("storage", ["bf16", "nvfp4"])
def test_meta_device_layer_gives_the_output_shape(storage):
    """On the meta device (shape inference, deferred init) the layer runs without data: the output's shape and
    dtype, no error from asking the meta device about autocast."""
    m = GroupedGLUExperts(E, D, R, F, storage=storage, device="meta")
    x, ids, w = (t.to("meta") for t in routing(seed=9))
    y = m(x, ids, w)
    assert y.device.type == "meta" and tuple(y.shape) == (T, F) and y.dtype == torch.float32


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_cast_layer_quantizes_its_cast_masters(fmt, dtype):
    """``.to(dtype)`` after a forward: the next forward quantizes the cast masters (a cache of the fp32 masters'
    factors would give the old output), as a layer built in that dtype does."""
    m = layer(GroupedGLUExperts, storage=fmt)
    x, ids, w = routing(seed=8)
    before = m(x, ids, w).detach()
    m.to(dtype)
    fresh = GroupedGLUExperts(E, D, R, F, storage=fmt, dtype=dtype)
    fresh.load_state_dict(m.state_dict())
    got = m(x.to(dtype), ids, w.to(dtype))
    assert got.dtype == dtype and torch.equal(got, fresh(x.to(dtype), ids, w.to(dtype)))
    assert not torch.equal(got.float(), before)


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_freeze_keeps_the_output_and_stores_packed_buffers(fmt):
    m = layer(GroupedGLUExperts, storage=fmt)
    x, ids, w = routing(seed=7)
    want = m(x, ids, w).detach()
    assert m.freeze() is m and m.frozen
    assert [n for n, _ in m.named_parameters()] == ["s_gate", "s_up"]
    fields = ("codes", "block_scale", "global_scale") if fmt == "nvfp4" else ("bits", "scale_k", "scale_n")
    assert [n for n, _ in m.named_buffers()] == [f"{f}_{fld}" for f in ("w_gate", "w_up", "w_down") for fld in fields]
    assert torch.equal(m(x, ids, w), want)
    q_down = m.packed_factors()[2]
    assert tuple(q_down.shape) == (E, R, F)
    if fmt == "nvfp4":
        assert m.w_down_codes.shape == (E, F, R // 2) and m.w_down_block_scale.dtype == torch.float8_e4m3fn
    m.to(torch.float16)  # a dtype cast must not reinterpret codes and scales
    assert {b.dtype for b in m.buffers()} == {torch.uint8, torch.float32} | (
        {torch.float8_e4m3fn} if fmt == "nvfp4" else set())
    assert m.s_gate.dtype == torch.float16
    with pytest.raises(ValueError, match="storage 'bf16' has no packed form"):
        layer(GroupedGLUExperts).freeze()


def _roundtrip(m, fresh):
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    return fresh


@pytest.mark.parametrize("storage, frozen", [("bf16", False), ("nvfp4", False), ("sign", False), ("nvfp4", True),
                                             ("sign", True)])
def test_state_dict_round_trip(storage, frozen):
    m = layer(GroupedGLUExperts, storage=storage)
    if frozen:
        m.freeze()
    x, ids, w = routing(seed=8)
    want = m(x, ids, w)
    fresh = _roundtrip(m, GroupedGLUExperts(E, D, R, F, storage=storage, frozen=frozen))
    assert torch.equal(fresh(x, ids, w), want)
    for (k, a), b in zip(m.state_dict().items(), fresh.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                                  b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b), k
    # a frozen layer built empty computes zeros until loaded (no NaN from its placeholder scales)
    if frozen:
        empty = GroupedGLUExperts(E, D, R, F, storage=storage, frozen=True)
        assert torch.equal(empty(x, ids, w), torch.zeros(T, F))


# ---- the counts interface ---------------------------------------------------------------------------------

def _expert_major(x, ids, w):
    """Rows grouped by expert as an engine hands them: (rows [M, d], counts [E], probs [M])."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // K], torch.bincount(flat, minlength=E), w.reshape(-1)[order]


def test_forward_counts_matches_forward_and_ignores_the_garbage_tail():
    m = layer(GroupedGLUExperts)
    x, ids, w = routing(seed=10)
    rows, counts, probs = _expert_major(x, ids, w)
    pad = 37  # a static receive buffer: a tail of garbage rows, NaN among them
    rows = torch.cat([rows, torch.full((pad, D), float("nan"))]).requires_grad_(True)
    probs = torch.cat([probs, torch.full((pad,), float("nan"))]).requires_grad_(True)
    y = m.forward_counts(rows, counts, probs)
    assert y.shape == (T * K + pad, F)
    assert torch.equal(y[T * K:], torch.zeros(pad, F))
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # row i of the sorted rows is choice order[i] of the token-major routing: summing back gives forward()
    combined = torch.zeros(T * K, F).index_copy(0, order, y[:T * K].detach()).view(T, K, F).sum(1)
    assert rel(combined, m(x, ids, w)) < 1e-6
    y.sum().backward()
    assert torch.equal(rows.grad[T * K:], torch.zeros(pad, D))
    assert torch.equal(probs.grad[T * K:], torch.zeros(pad))
    assert torch.isfinite(rows.grad).all() and rows.grad[:T * K].abs().sum() > 0


def test_forward_counts_per_expert_slots():
    """The [E, C, d] form (a receive buffer with C slots per expert): rows past each count are garbage."""
    m = layer(GroupedGLUExperts)
    x, ids, w = routing(seed=11)
    rows, counts, probs = _expert_major(x, ids, w)
    c = int(counts.max()) + 3
    slots = torch.full((E, c, D), float("nan"))
    pw = torch.full((E, c), float("nan"))
    starts = torch.cumsum(counts, 0) - counts
    for e in range(E):
        slots[e, :counts[e]] = rows[starts[e]:starts[e] + counts[e]]
        pw[e, :counts[e]] = probs[starts[e]:starts[e] + counts[e]]
    slots.requires_grad_(True)
    pw.requires_grad_(True)
    y = m.forward_counts(slots, counts, pw)
    assert y.shape == (E, c, F)
    want = m.forward_counts(rows, counts, probs).detach()
    valid = torch.arange(c) < counts.unsqueeze(1)
    assert torch.equal(y[valid], want) and torch.equal(y[~valid], torch.zeros(int((~valid).sum()), F))
    y.sum().backward()
    assert torch.equal(slots.grad[~valid], torch.zeros(int((~valid).sum()), D))
    assert torch.equal(pw.grad[~valid], torch.zeros(int((~valid).sum())))
    with pytest.raises(ValueError, match=r"num_tokens_per_expert must lie in \[0, C = "):
        m.forward_counts(slots.detach()[:, :2], counts, None)


def test_forward_counts_argument_errors():
    m = layer(GroupedGLUExperts)
    x = torch.randn(20, D)
    with pytest.raises(TypeError, match="num_tokens_per_expert must be an integer tensor"):
        m.forward_counts(x, torch.ones(E))
    with pytest.raises(ValueError, match=r"num_tokens_per_expert must be \[E\] = \[8\]"):
        m.forward_counts(x, torch.ones(E + 1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^GroupedGLUExperts.forward_counts: num_tokens_per_expert must be >= 0 and "
                                         r"sum to at most M = 20 \(the rows of x\); .*exceeds M = 20"):
        m.forward_counts(x, torch.full((E,), 3))
    with pytest.raises(ValueError, match="offs must be non-decreasing"):
        m.forward_counts(x, torch.tensor([3, -1, 0, 0, 0, 0, 0, 0]))
    # counts that wrap int32 (2^32 + 3 would read as 3) are out of range, not another routing
    with pytest.raises(ValueError, match="exceeds M = 20"):
        m.forward_counts(x, torch.tensor([2 ** 32 + 3, 2, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="offs must be non-negative"):
        m.forward_counts(x, torch.tensor([-2 ** 32 + 3, 2, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="offs must be non-decreasing"):
        m.forward_counts(x, torch.tensor([2 ** 32 + 3, -2 ** 32, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="row_weight must be"):
        m.forward_counts(x, torch.ones(E, dtype=torch.int64), torch.ones(3))
    # an integer or bool row weight would be cast to a weight of 0 / 1: refused in both forms, as grouped_glu does
    slots = torch.randn(E, 3, D)
    for dt in (torch.int64, torch.bool):
        with pytest.raises(TypeError, match=f"^GroupedGLUExperts.forward_counts: row_weight must be a floating-point "
                                            f"tensor, got {dt}"):
            m.forward_counts(x, torch.full((E,), 2), torch.ones(20, dtype=dt))
        with pytest.raises(TypeError, match="row_weight must be a floating-point tensor"):
            m.forward_counts(slots, torch.full((E,), 2), torch.ones(E, 3, dtype=dt))


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="storage must be one of"):
        GroupedGLUExperts(E, D, R, F, storage="fp8")
    with pytest.raises(ValueError, match="impl must be 'auto' or one of"):
        GroupedGLUExperts(E, D, R, F, impl="cuda")
    with pytest.raises(ValueError, match="activations must be one of"):
        GroupedGLUExperts(E, D, R, F, activations="fp8")
    with pytest.raises(ValueError, match="frozen=True needs storage"):
        GroupedGLUExperts(E, D, R, F, frozen=True)
    with pytest.raises(ValueError, match="needs r to be a multiple of 16 "):
        GroupedGLUExperts(E, D, 24, F, storage="nvfp4")
    GroupedGLUExperts(E, D, 24, F, storage="sign")  # 24 is a multiple of sign's 8
    with pytest.raises(ValueError, match="capacity_factor must be"):
        PaddedBmmGLUExperts(E, D, R, F, capacity_factor=0)
    with pytest.raises(ValueError, match="intermediates must be one of"):
        PaddedBmmGLUExperts(E, D, R, F, intermediates="bf16")
    with pytest.raises(TypeError, match="^GroupedGLUExperts: num_experts must be an int"):
        GroupedGLUExperts(8.0, D, R, F)
    for bad in (True, torch.tensor(True), torch.tensor([E])):  # bools and shaped tensors are not sizes
        with pytest.raises(TypeError, match="^GroupedGLUExperts: num_experts must be an int, got "):
            GroupedGLUExperts(bad, D, R, F)
    # integer scalars (NumPy's, a 0-d tensor) are sizes, checked like ints, the block multiple too
    m = GroupedGLUExperts(np.int64(E), np.int32(D), torch.tensor(R), F, storage="nvfp4")
    assert (m.num_experts, m.d, m.r) == (E, D, R) and type(m.num_experts) is int
    with pytest.raises(ValueError, match="needs r to be a multiple of 16 "):
        GroupedGLUExperts(E, D, np.int64(24), F, storage="nvfp4")
    # low-bit storage quantizes float32 / bfloat16 / float16 masters; float64 is refused by name, not at the forward
    with pytest.raises(TypeError, match=r"^GroupedGLUExperts\(storage='sign'\): dtype must be one of"):
        GroupedGLUExperts(E, D, R, F, storage="sign", dtype=torch.float64)
    x, ids, w = routing()
    cast = layer(GroupedGLUExperts, storage="nvfp4").double()
    with pytest.raises(TypeError, match=r"the parameters' dtype \(after .to\(\) / .double\(\)\) must be one of"):
        cast(x, ids, w)
    assert layer(GroupedGLUExperts, dtype=torch.float64)(x, ids, w).dtype == torch.float32  # dense: cast to x's
    with pytest.raises(ValueError, match="^PaddedBmmGLUExperts: f must be >= 1, got 0"):
        PaddedBmmGLUExperts(E, D, R, 0)
    for cls, bad in ((GroupedGLUExperts, torch.int32), (PaddedBmmGLUExperts, "float32")):
        with pytest.raises(TypeError, match=f"^{cls.__name__}: dtype must be a floating-point torch.dtype"):
            cls(E, D, R, F, dtype=bad)
    assert GroupedGLUExperts(E, D, R, F, dtype=torch.bfloat16).w_gate.dtype == torch.bfloat16
    m = layer(GroupedGLUExperts)
    x, ids, w = routing()
    with pytest.raises(ValueError, match=r"x must be \[T, d\] with d = 64"):
        m(x[:, :10], ids, w)
    with pytest.raises(ValueError, match="topk_ids must be"):
        m(x, ids[:5], w)
    with pytest.raises(ValueError, match="^GroupedGLUExperts: topk_ids must be on x's device cpu, got meta"):
        m(x, ids.to("meta"), w)
    with pytest.raises(ValueError, match="^GroupedGLUExperts: topk_weights must be on x's device cpu, got meta"):
        m(x, ids, w.to("meta"))


@pytest.mark.parametrize("cls", [GroupedGLUExperts, PaddedBmmGLUExperts])
def test_forward_argument_errors_name_the_argument(cls):
    m = layer(cls)
    x, ids, w = routing()
    who = cls.__name__
    for args, exc, msg in [
        ((x.tolist(), ids, w), TypeError, "x must be a torch.Tensor, got list"),
        ((x.long(), ids, w), TypeError, "x must be a floating-point tensor, got torch.int64"),
        ((x, ids.float(), w), TypeError, "topk_ids must be an integer tensor, got torch.float32"),
        ((x, ids.bool(), w), TypeError, "topk_ids must be an integer tensor, got torch.bool"),
        ((x, ids, (w * 10).long()), TypeError, "topk_weights must be a floating-point tensor, got torch.int64"),
        ((x, ids, w.numpy()), TypeError, "topk_weights must be a torch.Tensor, got ndarray"),
    ]:
        with pytest.raises(exc, match=f"{who}: {msg}"):
            m(*args)


def test_padded_bmm_refuses_ids_outside_the_experts():
    """GroupedGLUExperts drops a choice with an id outside [0, E) (a padding row); the padded bmm has no padding
    rows, so it says so instead of failing inside an index op."""
    m = layer(PaddedBmmGLUExperts)
    x, ids, w = routing()
    for bad, seen in ((-1, r"\[-1, 7\]"), (E, r"\[0, 8\]")):
        ids_bad = ids.clone()
        ids_bad[3, 1] = bad
        with pytest.raises(ValueError, match=r"PaddedBmmGLUExperts: topk_ids must lie in \[0, E = 8\) .*found values "
                                             r"in " + seen):
            m(x, ids_bad, w)


@pytest.mark.parametrize("cls", [GroupedGLUExperts, PaddedBmmGLUExperts])
def test_no_tokens_give_an_empty_output_and_zero_gradients(cls):
    m = layer(cls)
    x, ids, w = routing()
    x0, w0 = x[:0].requires_grad_(), w[:0].requires_grad_()
    y = m(x0, ids[:0], w0)
    assert y.shape == (0, F)
    y.sum().backward()
    assert x0.grad.shape == (0, D) and w0.grad.shape == (0, K)
    for n in NAMES:
        g = getattr(m, n).grad
        assert g is None or torch.equal(g, torch.zeros_like(g)), n


# ---- what passes through to the op ------------------------------------------------------------------------

def test_impl_and_activations_pass_through(monkeypatch):
    import tsct.ops

    seen = []
    real = tsct.ops.grouped_glu

    def spy(*a, **kw):
        seen.append({k: kw.get(k) for k in ("impl", "activations")})
        return real(*a, **kw)

    monkeypatch.setattr(tsct.ops, "grouped_glu", spy)
    x, ids, w = routing()
    y_ref = layer(GroupedGLUExperts, impl="reference")(x, ids, w)
    y_act = layer(GroupedGLUExperts, activations="nvfp4", storage="nvfp4")(x, ids, w)
    assert seen == [{"impl": "reference", "activations": "bf16"}, {"impl": "auto", "activations": "nvfp4"}]
    assert 0 < rel(y_act, y_ref) < 0.5  # 4-bit factors and activations: close, not equal
    monkeypatch.setattr(tsct.ops, "grouped_glu", real)
    with pytest.raises(RuntimeError):  # a forced path that cannot run here says so
        layer(GroupedGLUExperts, impl="triton-bf16")(x, ids, w)
    with pytest.raises(ValueError, match="activations 'nvfp4' needs r to be a multiple of 16"):
        GroupedGLUExperts(E, D, 24, F, activations="nvfp4")


def test_autocast_computes_in_bf16_with_fp32_masters():
    m = layer(GroupedGLUExperts)
    b = layer(PaddedBmmGLUExperts, capacity_factor=None)
    x, ids, w = routing(seed=12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, yb = m(x, ids, w), b(x, ids, w)
    assert y.dtype == yb.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.w_gate.grad.dtype == torch.float32
    assert rel(y, m(x, ids, w)) < 1e-2 and rel(yb, y) < 1e-2


# ---- torch.compile ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage, frozen", [("bf16", False), ("nvfp4", False), ("sign", True)])
def test_fullgraph_compile_matches_eager(storage, frozen):
    torch._dynamo.reset()
    m = layer(GroupedGLUExperts, storage=storage)
    if frozen:
        m.freeze()
    x, ids, w = routing(seed=13, t=40)
    w.requires_grad_(True)

    def run(fn):
        for p in list(m.parameters()) + [w]:
            p.grad = None
        y = fn(x, ids, w)
        (y * torch.linspace(-1, 1, F)).sum().backward()
        return [y.detach()] + [p.grad.clone() for p in list(m.parameters()) + [w]]

    eager = run(m)
    compiled = run(torch.compile(m, fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_fullgraph_compile_of_forward_counts():
    torch._dynamo.reset()
    m = layer(GroupedGLUExperts)
    x, ids, w = routing(seed=14, t=40)
    rows, counts, probs = _expert_major(x, ids, w)
    rows = torch.cat([rows, torch.randn(5, D)])
    fn = torch.compile(m.forward_counts, fullgraph=True)
    torch.testing.assert_close(fn(rows, counts), m.forward_counts(rows, counts), rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_padded_bmm_keeps_a_non_finite_token_to_its_own_experts(capacity_factor):
    """Token 0 inf: the empty slots of the padded grid read token 0 and a dropped row reads slot 0, yet only the
    experts token 0 is routed to get non-finite gradients, and only the tokens routed with it a non-finite output,
    as in GroupedGLUExperts (the dropless layer)."""
    a = layer(GroupedGLUExperts)
    b = PaddedBmmGLUExperts(E, D, R, F, capacity_factor=capacity_factor, intermediates="fp32")
    b.load_state_dict(a.state_dict())
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(T, D, generator=g), torch.rand(T, K, generator=g)
    others = torch.stack([torch.randperm(E - 2, generator=g)[:K] + 2 for _ in range(T - 1)])
    ids = torch.cat([torch.arange(K).unsqueeze(0), others])  # token 0 alone on experts 0 .. K-1
    x[0] = float("inf")
    hot = sorted(set(ids[0].tolist()))
    for lay in (a, b):
        lay.zero_grad()
        y = lay(x, ids, w)
        assert torch.isfinite(y[1:]).all(), type(lay).__name__
        y[1:].sum().backward()  # the other tokens' loss
        for name in ("w_gate", "w_up", "w_down"):
            g = getattr(lay, name).grad
            finite = torch.isfinite(g).flatten(1).all(1)
            cold = [e for e in range(E) if e not in hot]
            assert finite[cold].all(), (type(lay).__name__, name, finite)


@pytest.mark.parametrize("capacity_factor", [2.0, None])  # None: the capacity is the largest expert load
def test_padded_bmm_takes_ids_of_any_integer_dtype(capacity_factor):
    m = layer(PaddedBmmGLUExperts)
    m.capacity_factor = capacity_factor
    x, ids, w = routing(seed=2)
    want = m(x, ids, w)
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32):
        assert m.capacity(ids.to(dt)) == m.capacity(ids), dt
        assert torch.equal(m(x, ids.to(dt), w), want), dt


def test_forward_counts_per_expert_slots_casts_a_float64_row_weight():
    """The [E, C, d] form takes the row weights the [M, d] form takes (a float64 one cast to fp32), with the same
    result."""
    m = layer(GroupedGLUExperts)
    x, ids, w = routing(seed=11)
    rows, counts, probs = _expert_major(x, ids, w)
    c = int(counts.max())
    slots, pw = torch.zeros(E, c, D), torch.zeros(E, c, dtype=torch.float64)
    starts = torch.cumsum(counts, 0) - counts
    for e in range(E):
        slots[e, :counts[e]] = rows[starts[e]:starts[e] + counts[e]]
        pw[e, :counts[e]] = probs[starts[e]:starts[e] + counts[e]].double()
    y = m.forward_counts(slots, counts, pw)
    valid = torch.arange(c) < counts.unsqueeze(1)
    assert torch.equal(y[valid], m.forward_counts(rows, counts, probs.double()).detach())


@pytest.mark.parametrize("storage", ["nvfp4", "sign"])
def test_a_low_bit_layer_built_and_run_under_inference_mode(storage):
    """Built and called inside torch.inference_mode (a serving pattern): its masters have no version counter, so
    they are quantized per call, uncached; the output is the one the same layer gives outside."""
    with torch.inference_mode():
        m = layer(GroupedGLUExperts, storage=storage)
        x, ids, w = routing(seed=4)
        y = m(x, ids, w)
    n = layer(GroupedGLUExperts, storage=storage)
    with torch.no_grad():
        assert torch.equal(y, n(x.clone(), ids.clone(), w.clone()))


@pytest.mark.parametrize("storage", ["nvfp4", "sign"])
@pytest.mark.parametrize("first", [False, True])  # True: the layer's very first forward is the evaluation pass
def test_an_evaluation_pass_under_inference_mode_leaves_the_next_training_step_intact(storage, first):
    """A training loop's validation pass under torch.inference_mode between steps: the packed factors it quantizes
    are cached for the next training forward, so they must be normal tensors (autograd refuses to save inference
    tensors); that step's output and gradients are those of a layer that never ran the evaluation pass."""
    x, ids, w = routing(seed=5)
    runs = []
    for evaluate in (True, False):
        m = layer(GroupedGLUExperts, storage=storage)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        if not first:
            m(x, ids, w).sum().backward()
            opt.step()
            opt.zero_grad()
        if evaluate:
            with torch.inference_mode():
                y_eval = m(x, ids, w)
        y = m(x, ids, w)
        y.square().sum().backward()
        if evaluate:
            assert torch.equal(y_eval, y.detach())
        runs.append((y.detach(), [p.grad.clone() for p in m.parameters()]))
    (y0, g0), (y1, g1) = runs
    assert torch.equal(y0, y1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_of_the_layer_get_torchs_refusal(transform):
    """torch.func transforms are not supported (README): the layer's call reaches torch's own refusal of the op (its
    routing bookkeeping does not read a wrapped tensor's storage first)."""
    m = layer(GroupedGLUExperts)
    x, ids, w = routing(seed=6, t=8)
    if transform == "grad":
        call, match = (lambda: torch.func.grad(lambda xx: m(xx, ids, w).sum())(x)), "setup_context"
    else:
        call, match = (lambda: torch.func.vmap(lambda xx: m(xx, ids, w))(x[None].expand(2, -1, -1))), "Batching rule"
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.parametrize("frozen", [False, True])
def test_a_low_bit_layer_survives_pickle_and_deepcopy(frozen):
    """Plain pickle (Ray, a copy through bytes) of an NVFP4 layer, whose frozen form holds float8 block scales that
    pickle cannot read back by itself, and copy.deepcopy: the same buffers in the same dtypes, the same output."""
    import copy
    import pickle

    m = layer(GroupedGLUExperts, storage="nvfp4")
    if frozen:
        m.freeze()
    x, ids, w = routing(seed=7)
    y = m(x, ids, w)
    for c in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert {n: b.dtype for n, b in c.named_buffers()} == {n: b.dtype for n, b in m.named_buffers()}
        assert torch.equal(c(x, ids, w), y)
