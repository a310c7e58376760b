"""tsct.ops.sort_by_expert on a GPU (route_rank / route_place), and the forward's CSR built on a side stream.

sort_by_expert: the kernels against the torch path (stable argsort + count) on fresh random ids with the caching
allocator poisoned first (an unwritten output reads -1 bytes), bit for bit: the b1 routing (T 16384, top-2,
E 1024), many chunks, ids outside [0, E) (padding rows), int32 / int16 ids, every row in one expert, more experts
than rows, M not a multiple of the chunk; the same bits on repeat and from a CUDA graph replay.
Side stream (``tsct.config.side_stream``): grouped_glu's output and gradients with and without it are the
same bits, eager and replayed from a CUDA graph (scattering through a copy of the token tensor, which carries no
linked CSR). The CSR that route_place links to the token tensor (``runtime.link_csr``): used instead of a built one
(none is built), the same bits in the output and every gradient, with dropped choices (padding rows) and top-3.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import tsct  # noqa: E402
from _cuda_graph import captured, gc_paused  # noqa: E402
from tsct.ops.routing import _kernels_serve, sort_by_expert_torch  # noqa: E402

DEV = torch.device("cuda")
if not _kernels_serve(DEV):
    pytest.skip("the Triton kernels do not serve this GPU (no cubins, no Triton)", allow_module_level=True)


def poison() -> None:
    """Fill the caching allocator's free memory with 0xFF bytes (-1 in every integer type, NaN in floats): its large
    pool through one 1 GiB block, its small pool (requests of 1 MiB or less) through many 1 MiB ones."""
    blobs = [torch.empty(1 << 30, dtype=torch.uint8, device=DEV)] + [
        torch.empty(1 << 20, dtype=torch.uint8, device=DEV) for _ in range(64)]
    for b in blobs:
        b.fill_(0xFF)
    del blobs, b


CASES = [  # T, k, E, ids spill outside [0, E) by, dtype
    (16384, 2, 1024, 0, torch.int64), (16384, 2, 1024, 2, torch.int32), (40000, 8, 64, 1, torch.int64),
    (3000, 2, 5, 0, torch.int16), (100, 2, 50000, 4, torch.int64), (1023, 1, 7, 0, torch.int64),
    (1, 1, 1, 0, torch.int64), (70000, 1, 3, 0, torch.int32),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}_k{c[1]}_E{c[2]}_s{c[3]}_{str(c[4])[6:]}")
def test_kernels_match_torch(case):
    t, k, e, spill, dt = case
    g = torch.Generator(device=DEV).manual_seed(t + e)
    ids = torch.randint(-spill, e + spill, (t, k), generator=g, device=DEV).to(dt)
    if t == 70000:
        ids.fill_(1)  # every row in one expert
    wdt = (torch.bfloat16, torch.float16, torch.float32)[t % 3]
    w = torch.rand(t, k, generator=g, device=DEV).to(wdt)
    poison()
    got = tsct.ops.sort_by_expert(ids, e, w)
    want = sort_by_expert_torch(ids, e)
    for name, a, b in zip(("order", "offs", "token"), got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(got.row_weight, w.reshape(-1)[want[0]].float())
    again = tsct.ops.sort_by_expert(ids, e, w)
    assert all(torch.equal(a, b) for a, b in zip(got, again))
    assert tsct.ops.sort_by_expert(ids, e).row_weight is None


def test_large_expert_counts_take_the_torch_path():
    """E = 2**18 with M = 2**19: the kernels' scratch would be ~1 GB (route.fits says no); same result either way."""
    from tsct.kernels.triton_common import route
    ids = torch.randint(0, 1 << 18, (1 << 18, 2), device=DEV)
    assert not route.fits(ids.numel(), 1 << 18)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    got = tsct.ops.sort_by_expert(ids, 1 << 18)
    assert torch.cuda.max_memory_allocated() - base < 64 << 20
    assert all(torch.equal(a, b) for a, b in zip(got[:3], sort_by_expert_torch(ids, 1 << 18)))


def test_first_use_through_a_child_on_an_untested_arch(monkeypatch, tmp_path):
    """On an arch class the routing kernels never executed on (simulated by removing this one from
    EXECUTED_ON[ROUTING]) they run only after their self-test passed in a child process: the real child here, then
    the call, with no self-test in this process. A failing verdict (a stubbed child that crashed) warns once and keeps
    torch's sort, launching nothing (tests/ops/test_routing_firstuse.py covers the rest on the CPU)."""
    from tsct import dispatch, firstuse
    from tsct.kernels.triton_common import route

    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setitem(dispatch.EXECUTED_ON, dispatch.ROUTING, frozenset())
    monkeypatch.setattr(dispatch, "_first_use", {})
    dispatch.reset_fallback_counts(dispatch.ROUTING)  # its warning is met again below
    firstuse.reset_for_tests()
    ids = torch.randint(-1, 64, (4096, 2), device=DEV)
    calls = []
    real = route.sort_by_expert
    monkeypatch.setattr(route, "sort_by_expert", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    try:
        got = tsct.ops.sort_by_expert(ids, 64)
        st = dispatch.first_use_status(dispatch.ROUTING, torch.cuda.get_device_capability(DEV), "bf16")
        assert st is not None and st.ok and "passed: pass" in st.reason, st
        assert len(calls) == 1  # the call itself: the self-test ran in the child
        assert all(torch.equal(a, b) for a, b in zip(got[:3], sort_by_expert_torch(ids, 64)))
        firstuse.reset_for_tests()
        monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "b"))
        crash = firstuse.ChildResult(-11, "", "Segmentation fault", False, 0.1)
        monkeypatch.setattr(firstuse, "run_subprocess", lambda argv, env, t: crash)
        calls.clear()
        with pytest.warns(RuntimeWarning, match="SIGSEGV"):
            got = tsct.ops.sort_by_expert(ids, 64)
        assert calls == []
        assert all(torch.equal(a, b) for a, b in zip(got[:3], sort_by_expert_torch(ids, 64)))
    finally:
        firstuse.reset_for_tests()


def test_graph_replay_gives_the_same_result():
    ids = torch.randint(0, 1024, (16384, 2), device=DEV)
    g, out = captured(lambda: tsct.ops.sort_by_expert(ids, 1024))
    ids.copy_(torch.randint(0, 1024, (16384, 2), device=DEV))  # the replay sorts the new ids
    want = sort_by_expert_torch(ids, 1024)
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out[:3], want))


def _pass(side: bool, fmt_w, x, ids, w, e, go, link: bool = False):
    """Output and gradients of a routed pass; ``link``: through sort_by_expert's token tensor (its linked CSR),
    else through a copy of it (the CSR built, on the side stream with ``side``)."""
    tsct.config.side_stream = side
    try:
        s = tsct.ops.sort_by_expert(ids, e, w)
        token = s.token if link else s.token.clone()
        out = tsct.ops.grouped_glu(x, s.offs, *fmt_w, row_weight=s.row_weight, gather_idx=token,
                                   scatter_idx=token, num_out_rows=x.shape[0])
        grads = torch.autograd.grad(out, [x, w, *fmt_w], go)
        return [out, *grads]
    finally:
        tsct.config.side_stream = True


def _slow_side_stream(monkeypatch):
    """The side stream's CSR work starts behind ~50 ms of sleep: without the join the combine would read it early."""
    from tsct.kernels.triton_common import runtime as C
    fill = C._csr_fill

    def slow(*a):
        torch.cuda._sleep(100_000_000)
        return fill(*a)
    monkeypatch.setattr(C, "_csr_fill", slow)


def test_side_stream_join_when_the_fill_raises(monkeypatch):
    """An exception while the CSR is issued on the side stream still makes the caller's stream wait for the work
    already queued there (its outputs were allocated on the caller's stream)."""
    from tsct.kernels.triton_common import runtime as C

    def broken(*a):
        torch.cuda._sleep(200_000_000)
        raise RuntimeError("injected")
    monkeypatch.setattr(C, "_csr_fill", broken)
    idx = torch.randint(0, 100, (1000,), device=DEV)
    offs = torch.tensor([1000], dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="injected"):
        C.csr_overlap(idx, offs, 1000, 100, (9, 0))
    ev = torch.cuda.Event()
    ev.record()
    assert not ev.query(), "the caller's stream does not wait for the side stream"
    torch.cuda.synchronize()


@pytest.mark.parametrize("slow", [False, True], ids=["plain", "slow_side"])
def test_side_stream_csr_gives_the_same_bits(slow, monkeypatch):
    torch.manual_seed(5)
    t, k, e, d, r, f = 4096, 2, 64, 512, 64, 1365
    x = torch.randn(t, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    fac = [(torch.randn(e, d, r, device=DEV) / d ** 0.5).bfloat16().requires_grad_(),
           (torch.randn(e, d, r, device=DEV) / d ** 0.5).bfloat16().requires_grad_(),
           (torch.randn(e, r, f, device=DEV) / r ** 0.5).bfloat16().requires_grad_()]
    w, ids = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(k)
    w = w.bfloat16().requires_grad_()
    go = torch.randn(t, f, device=DEV, dtype=torch.bfloat16)
    if slow:
        _slow_side_stream(monkeypatch)
    poison()
    on = _pass(True, fac, x, ids, w, e, go)
    monkeypatch.undo()
    poison()
    off = _pass(False, fac, x, ids, w, e, go)
    for i, (a, b) in enumerate(zip(on, off)):
        assert torch.equal(a, b), i
    assert not torch.isnan(on[0]).any()
    # the forward without autograd (the plain forward), replayed from a CUDA graph with the side stream: the same
    # bits as eager
    xs, facs = x.detach(), [p.detach() for p in fac]
    s = tsct.ops.sort_by_expert(ids, e, w.detach())

    token = s.token.clone()

    def fwd():
        return tsct.ops.grouped_glu(xs, s.offs, *facs, row_weight=s.row_weight, gather_idx=token,
                                    scatter_idx=token, num_out_rows=t)

    poison()
    want = fwd()
    g, out = captured(fwd)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_row_weight_gradient_matches_indexing():
    """d topk_weights through sort_by_expert's row_weight equals d through indexing the weights with order."""
    g = torch.Generator(device=DEV).manual_seed(9)
    ids = torch.randint(-1, 300, (5000, 2), generator=g, device=DEV)
    w = torch.rand(5000, 2, generator=g, device=DEV).bfloat16().requires_grad_()
    s = tsct.ops.sort_by_expert(ids, 300, w)
    go = torch.randn(10000, generator=g, device=DEV)
    (gw,) = torch.autograd.grad(s.row_weight, w, go)
    w2 = w.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(w2.reshape(-1)[s.order].float(), w2, go)
    assert torch.equal(gw, want)


@pytest.mark.parametrize("k,spill", [(2, 0), (2, 1), (3, 1)], ids=["top2", "top2_dropped", "top3_dropped"])
def test_linked_csr_gives_the_same_bits(k, spill, monkeypatch):
    """grouped_glu through sort_by_expert's token tensor combines (forward and dX) with the CSR route_place linked
    to it, builds none, and gives the same bits as through a copy of the token (a built CSR); ids outside [0, E)
    (dropped choices: padding rows, last in their token's CSR entries) and top-3 included."""
    from tsct.kernels.triton_common import runtime as C
    torch.manual_seed(11 + k + spill)
    t, e, d, r, f = 3000, 48, 256, 64, 1001
    x = torch.randn(t, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    fac = [(torch.randn(e, d, r, device=DEV) / d ** 0.5).bfloat16().requires_grad_(),
           (torch.randn(e, d, r, device=DEV) / d ** 0.5).bfloat16().requires_grad_(),
           (torch.randn(e, r, f, device=DEV) / r ** 0.5).bfloat16().requires_grad_()]
    w, ids = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(k)
    if spill:
        ids = torch.where(torch.rand(t, k, device=DEV) < 0.1, -1, ids)  # dropped choices
    w = w.bfloat16().requires_grad_()
    go = torch.randn(t, f, device=DEV, dtype=torch.bfloat16)
    built = []
    real = C._csr
    monkeypatch.setattr(C, "_csr", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(tsct.config, "eager_replay", False)  # a replay repeats the CSR's ops without calling _csr
    poison()
    linked = _pass(False, fac, x, ids, w, e, go, link=True)
    assert built == [], "a CSR was built although sort_by_expert's token tensor carries one"
    poison()
    copied = _pass(False, fac, x, ids, w, e, go, link=False)
    assert built == [1]
    for i, (a, b) in enumerate(zip(linked, copied)):
        assert torch.equal(a, b), i
    assert not torch.isnan(linked[0]).any()


def test_csr_link_survives_the_op_and_is_voided_by_changes():
    """The link reaches the caller through the custom op (dispatcher) route as well as the eager direct one, and
    an in-place change of the token or offs tensor, or another offs tensor, voids it."""
    from tsct.kernels.triton_common import runtime as C
    from tsct.ops.routing import _sort_by_expert_op
    ids = torch.randint(-1, 100, (5000, 2), device=DEV)
    for order, offs, token, _ in (tsct.ops.sort_by_expert(ids, 100), _sort_by_expert_op(ids, 100, None)):
        rows, ptr = C.linked_csr(token, offs, 10000, 5000)
        assert torch.equal(ptr, torch.arange(5001, device=DEV) * 2)
        assert torch.equal(rows, torch.argsort(token, stable=True))  # each token's positions, increasing
        assert C.linked_csr(token, offs.clone(), 10000, 5000) is None
        assert C.linked_csr(token, offs, 10000, 4999) is None
        offs.add_(0)
        assert C.linked_csr(token, offs, 10000, 5000) is None
    s = tsct.ops.sort_by_expert(ids, 100)
    s.token.add_(0)
    assert C.linked_csr(s.token, s.offs, 10000, 5000) is None


def _small_glu(t, e, d=256, r=64, f=300, seed=21):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(t, d, device=DEV, generator=g).bfloat16()
    fac = [(torch.randn(e, d, r, device=DEV, generator=g) / d ** 0.5).bfloat16(),
           (torch.randn(e, d, r, device=DEV, generator=g) / d ** 0.5).bfloat16(),
           (torch.randn(e, r, f, device=DEV, generator=g) / r ** 0.5).bfloat16()]
    return x, fac


def _glu(x, fac, s):
    return tsct.ops.grouped_glu(x, s.offs, *fac, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                                num_out_rows=x.shape[0])


def test_graph_with_routing_as_static_input_builds_its_own_csr(monkeypatch):
    """A graph that takes sort_by_expert's outputs as static inputs (make_graphed_callables' pattern: new routing
    is copied into them before each replay) must not replay the CSR linked at capture time: it builds its own
    in the graph. Replayed with other routing copied in, it gives the eager result of that routing."""
    from tsct.kernels.triton_common import runtime as C
    t, e = 2000, 40
    x, fac = _small_glu(t, e)
    w1, ids1 = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(2)
    w2, ids2 = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(2)
    s = tsct.ops.sort_by_expert(ids1, e, w1)
    s2 = tsct.ops.sort_by_expert(ids2, e, w2)
    built = []
    real = C._csr
    monkeypatch.setattr(C, "_csr", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(tsct.config, "eager_replay", False)  # a replay repeats the CSR's ops without calling _csr
    g, out = captured(lambda: _glu(x, fac, s))
    assert built, "the capture used the CSR linked outside it"
    for a, b in zip((s.offs, s.token, s.row_weight), (s2.offs, s2.token, s2.row_weight)):
        a.copy_(b)
    g.replay()
    torch.cuda.synchronize()
    want = _glu(x, fac, tsct.ops.sort_by_expert(ids2, e, w2))
    assert torch.equal(out, want)


def test_graph_with_sort_inside_uses_the_linked_csr(monkeypatch):
    """The sort and the op captured together (the benchmark's graph): the op takes the CSR the captured sort
    writes (no CSR built in the capture), and each replay sorts the current ids."""
    from tsct.kernels.triton_common import runtime as C
    t, e = 2000, 40
    x, fac = _small_glu(t, e, seed=22)
    w, ids = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(2)
    built = []
    real = C._csr
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):  # warm-up outside the capture
        _glu(x, fac, tsct.ops.sort_by_expert(ids, e, w))
    torch.cuda.current_stream().wait_stream(st)
    monkeypatch.setattr(C, "_csr", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(tsct.config, "eager_replay", False)  # a replay repeats the CSR's ops without calling _csr
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        out = _glu(x, fac, tsct.ops.sort_by_expert(ids, e, w))
    assert not built, "the capture built a CSR although its own sort linked one"
    w2, ids2 = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(2)
    ids.copy_(ids2)
    w.copy_(w2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _glu(x, fac, tsct.ops.sort_by_expert(ids2, e, w2)))


def test_linked_csr_on_another_stream_and_under_inference_mode():
    """The op on another stream than the sort (the linked CSR is recorded on it), and a sort under
    torch.inference_mode (no link: no version counter): the same bits as through a copy of the token."""
    t, e = 2000, 40
    x, fac = _small_glu(t, e, seed=23)
    w, ids = torch.softmax(torch.randn(t, e, device=DEV), -1).topk(2)
    s = tsct.ops.sort_by_expert(ids, e, w)
    want = tsct.ops.grouped_glu(x, s.offs, *fac, row_weight=s.row_weight, gather_idx=s.token.clone(),
                                scatter_idx=s.token.clone(), num_out_rows=t)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _glu(x, fac, s)
    torch.cuda.current_stream().wait_stream(side)
    del s
    assert torch.equal(got, want)
    with torch.inference_mode():
        s = tsct.ops.sort_by_expert(ids, e, w)
        assert torch.equal(_glu(x, fac, s), want)
