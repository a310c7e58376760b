"""tsct.kernels.replay: a replayed call issues what the recorded one did, with the new call's tensors.

Two levels: torch-only functions on the CPU (the replay must compute the new inputs' values, not repeat the recorded
ones; what it cannot repeat runs the function every time), and the real eager pass of each Triton path on CPU
tensors dressed as a 9.0 GPU (``tools/host_profile.py``'s stand-ins: the installed sm_90a cubin index resolves the
launches, the native library is a stand-in that logs its calls), where the replayed pass must launch the same
kernels with the same grids and arguments, pointers included up to renaming."""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import pytest
import torch

from tsct import config
from tsct.kernels import aot, replay
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_glu import glu as G
from tsct.kernels.triton_lowbit import glu as L
from tsct.ops import _factors

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh():
    replay.clear()
    yield
    replay.clear()


def _scaled_sum(x, w, out_rows):
    # allocations, views, compute ops and an in-place write: all repeatable
    out = torch.empty(out_rows, x.shape[1], dtype=x.dtype)
    out.copy_((x * w.view(-1, 1)).cumsum(0)[:out_rows])
    return out, [out.t(), torch.zeros(3, dtype=torch.int32)]


def test_replay_computes_the_new_inputs():
    g = torch.Generator().manual_seed(0)
    calls = []

    def fn(x, w):
        calls.append(1)
        return _scaled_sum(x, w, 5)

    xs = [torch.randn(8, 4, generator=g) for _ in range(4)]
    ws = [torch.rand(8, generator=g) + 0.5 for _ in range(4)]
    for x, w in zip(xs, ws):
        out, (view, zeros) = replay.call(lambda: fn(x, w), [x, w], ("scaled", 5))
        want = _scaled_sum(x, w, 5)[0]
        assert torch.equal(out, want)
        assert view.shape == (4, 5) and torch.equal(view, want.t())
        assert torch.equal(zeros, torch.zeros(3, dtype=torch.int32))
    assert len(calls) == 2  # the first call runs it, the second records it, the rest replay
    st = replay.stats()
    assert st["first"] == 1 and st["recorded"] == 1 and st["replayed"] == 2


def test_an_op_returning_nothing_is_repeated():
    g = torch.Generator().manual_seed(2)
    calls = []

    def fn(x):
        calls.append(1)
        y = x + 1
        torch._foreach_mul_([y], 2.0)  # an in-place op whose result is None
        return y

    for _ in range(4):
        x = torch.randn(3, generator=g)
        assert torch.equal(replay.call(lambda: fn(x), [x], ("nothing",)), (x + 1) * 2)
    assert len(calls) == 2
    st = replay.stats()
    assert st["recorded"] == 1 and st["replayed"] == 2 and st["reasons"] == {}


def test_an_assert_is_repeated():
    def fn(x):
        torch._assert_async(x.min() >= 0)  # no result, no write: its check is what it does
        return x + 1

    for _ in range(3):
        x = torch.rand(3)
        assert torch.equal(replay.call(lambda: fn(x), [x], ("assert",)), x + 1)
    assert replay.stats()["replayed"] == 1
    x = -torch.rand(3) - 1
    with pytest.raises(RuntimeError):
        replay.call(lambda: fn(x), [x], ("assert",))


def test_replay_keys_on_the_signature():
    g = torch.Generator().manual_seed(1)
    seen = []

    def fn(x):
        seen.append(tuple(x.shape))
        return x * 2

    for shape in ((4, 3), (4, 3), (5, 3), (4, 3)):
        x = torch.randn(*shape, generator=g)
        assert torch.equal(replay.call(lambda: fn(x), [x], ()), x * 2)
    x = torch.randn(3, 4, generator=g).t()  # the same shape, other strides
    assert torch.equal(replay.call(lambda: fn(x), [x], ()), x * 2)
    # (4, 3): run, recorded, replayed; (5, 3) and the transposed (4, 3) are other signatures (first calls)
    assert seen == [(4, 3), (4, 3), (5, 3), (4, 3)]
    # the extra part of the key too
    y = torch.randn(4, 3, generator=g)
    replay.call(lambda: fn(y), [y], ("other",))
    assert len(seen) == 5


def test_aliasing_is_part_of_the_key():
    g = torch.Generator().manual_seed(2)
    n = []

    def fn(a, b):
        n.append(1)
        return a + b

    a, b = torch.randn(6, generator=g), torch.randn(6, generator=g)
    replay.call(lambda: fn(a, b), [a, b], ())
    replay.call(lambda: fn(a, b), [a, b], ())  # recorded
    out = replay.call(lambda: fn(a, a), [a, a], ())  # the same tensor twice: another signature, run
    assert torch.equal(out, a + a) and len(n) == 3


def test_what_cannot_be_repeated_runs_every_time():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, generator=g)  # a tensor the call does not declare
    n = []

    def fn(x):
        n.append(1)
        return x + hidden

    for _ in range(3):
        x = torch.randn(4, generator=g)
        assert torch.equal(replay.call(lambda: fn(x), [x], ()), x + hidden)
    assert len(n) == 3
    assert replay.stats()["reasons"] == {"a torch op on a tensor the call neither received nor made": 1}


@pytest.mark.parametrize("entries,reason", [
    ([("join",)], "a join without a fork"),
    ([("fork", 7, object(), False)], "a fork after an event the call did not mark"),
    ([("mark", "ev"), ("fork", 7, "ev", True)], "a fork on the high-priority side stream"),
    ([("mark", "ev"), ("fork", 7, "ev", False), ("op",)], "a torch op beside the caller's stream (aten.mul.Tensor)"),
])
def test_side_work_it_cannot_repeat_runs_every_time(entries, reason):
    """The recorder's side-work entries (runtime.SideWork: mark, fork, join): a join without a fork, a fork after an
    event no mark made, a fork on the high-priority stream (the CSR's sort), a torch op inside a fork (a replay runs
    ops on the caller's stream) leave the signature to the path."""
    from tsct.kernels import record

    x = torch.randn(4)
    n = []

    def fn():
        n.append(1)
        log = record.active()
        out = None
        for e in entries:
            if e[0] == "op":
                out = x * 2
            elif log is not None:
                log.append(e)
        return x * 2 if out is None else out

    for _ in range(3):
        assert torch.equal(replay.call(fn, [x], ("side",)), x * 2)
    assert len(n) == 3
    assert replay.stats()["reasons"] == {reason: 1}


def test_a_host_read_is_not_replayed():
    # int(tensor) steers the call: a replay would keep the recorded value
    x = torch.arange(8.0)

    def fn(n):
        return x[:int(n[0])] * 2

    for v in (3, 5, 5):
        n = torch.tensor([v])
        assert torch.equal(replay.call(lambda: fn(n), [x, n], ()), x[:v] * 2)
    assert list(replay.stats()["reasons"]) == ["a host read of a device value (aten._local_scalar_dense.default)"]


def test_detach_of_an_input_stays_a_new_tensor():
    w = torch.randn(3, requires_grad=True)
    for _ in range(4):
        out = replay.call(lambda: w.detach(), [w], ())
        assert out is not w and not out.requires_grad and torch.equal(out, w.detach())
    assert replay.stats()["replayed"] == 2


def test_zeros_keep_their_strides():
    for _ in range(3):
        a = torch.empty_strided((1, 4), (1, 1))
        out = replay.call(lambda: torch.zeros_like(a), [a], ())
        assert out.stride() == torch.zeros_like(a).stride() and not out.any()


def test_a_failed_recording_keeps_the_result():
    import collections
    pair = collections.namedtuple("pair", "a b")
    x = torch.randn(4)
    for _ in range(2):
        out = replay.call(lambda: pair(x + 1, x + 2), [x], ())
        assert type(out) is pair and torch.equal(out.a, x + 1)
    assert list(replay.stats()["reasons"])[0].startswith("recording failed: TypeError")


def test_counts_are_the_calls_own():
    import threading
    from tsct.kernels import launch
    fam = launch.Family("replay-test", None, "")
    started, go = threading.Event(), threading.Event()

    def other():  # another thread counts while this one records
        started.set()
        go.wait(5)
        for _ in range(4):
            fam.count("native", "other")

    x = torch.randn(4)
    replay.call(lambda: fam.count("native", "mine") or x * 2, [x], ("counts",))  # the first call: not recorded
    t = threading.Thread(target=other)
    t.start()

    def fn():
        started.wait(5)
        go.set()
        t.join(5)
        fam.count("native", "mine")
        return x * 2

    replay.call(fn, [x], ("counts",))
    for _ in range(3):
        replay.call(fn, [x], ("counts",))
    assert fam.counts[("native", "mine")] == 5 and fam.counts[("native", "other")] == 4


def _harness():
    spec = importlib.util.spec_from_file_location("tsct_host_profile_tool", ROOT / "tools" / "host_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _canonical(log, inputs: set, internal: bool):
    """Launches with the pass's own tensors' addresses (``inputs``) as they are and every other pointer renamed by its
    first appearance within its segment (one replayed call, whose tensors stay alive to its end; another call may
    reuse their addresses), or with ``internal`` False just "new": the plain path frees and reuses memory within a
    call, where a recording and a replay hold theirs to the end."""
    names: dict = {}
    out = []
    for kind, what, grid, values in log:
        if kind == "mark":
            names = {}
            continue
        vals = []
        for is_ptr, v in values:
            if is_ptr and v:
                v = ("in", v) if v in inputs else ("p", names.setdefault(v, len(names))) if internal else "new"
            vals.append(v)
        out.append((kind, what, (*grid, 1, 1)[:3] if grid else grid, tuple(vals)))
    return out


@pytest.mark.skipif(aot.index("sm_90a") is None, reason="no AOT cubins for sm_90a in this install")
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "sign"])
def test_replayed_pass_launches_what_the_path_launches(fmt, monkeypatch):
    H = _harness()
    with H.as_h200(str(aot.aot_dir())) as lib:
        events: list = []  # cubin launches, native calls (the stand-in library appends them) and call marks
        real_launch, real_call = aot.AotKernel.launch, replay.call

        def logged(k, grid, values, stream):
            events.append(("aot", k.entry["kernel"], tuple(grid),
                           [(p["type"].startswith("*"), v) for p, v in zip(k.params, values)]))
            return real_launch(k, grid, values, stream)

        def marked(*args):
            events.append(("mark", None, (), []))
            return real_call(*args)

        monkeypatch.setattr(aot.AotKernel, "launch", logged)
        monkeypatch.setattr(replay, "call", marked)
        lib.log = events
        step = H._pass(fmt, backward=True)
        inputs = set()  # the addresses of the pass's own tensors (the harness's closure: x, factors, scales, ...)
        for cell in step.__closure__:
            v = cell.cell_contents
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor):
                    inputs.add(t.data_ptr())
                elif hasattr(t, "_STORAGE"):
                    inputs.update(u.data_ptr() for u in _factors.pack("w", t, False)[1] if u is not None)

        def counted():
            return collections.Counter({(f.name, *k): n for f in (C.FAMILY, G.FAMILY, L.FAMILY)
                                        for k, n in f.backend_counts().items()})

        def one_pass():
            events.clear()
            c0 = counted()
            step()
            added.append(counted() - c0)
            out = []
            for e in events:
                if len(e) == 2:  # a native call: (name, ctypes arguments and the stream)
                    if e[0] != "tsct_triton_launch":  # the cubin launches are logged above
                        out.append(("native", e[0], (), [(hasattr(a, "value"), getattr(a, "value", a))
                                                         for a in e[1][:-1]]))
                else:
                    out.append(e)
            return out

        added: list = []  # the launch counts each pass added
        monkeypatch.setattr(config, "eager_replay", False)
        one_pass()  # the first pass also asks the library about its kernels (cached)
        plain = one_pass()
        monkeypatch.setattr(config, "eager_replay", True)
        first = one_pass()  # a signature's first call runs the path
        recorded = one_pass()
        replayed = [one_pass() for _ in range(2)]
        lib.log = None
    st = replay.stats()  # the sort, forward and backward
    assert st["first"] == 3 and st["recorded"] == 3 and st["replayed"] == 6
    assert replay.stats()["reasons"] == {}
    assert len(plain) >= 6
    assert any(v[0] == "in" for e in _canonical(plain, inputs, False) for v in e[3] if type(v) is tuple)
    assert _canonical(first, inputs, False) == _canonical(plain, inputs, False)
    assert _canonical(recorded, inputs, False) == _canonical(plain, inputs, False)
    assert added[1] and added[1] == added[2] == added[3] == added[4] == added[5]  # plain, first, recorded, replays
    want = _canonical(recorded, inputs, True)
    assert _canonical(replayed[0], inputs, True) == want and _canonical(replayed[1], inputs, True) == want


@pytest.mark.skipif(aot.index("sm_90a") is None, reason="no AOT cubins for sm_90a in this install")
def test_a_layout_conversion_runs_every_time():
    """Swizzled NVFP4 block scales are converted (and counted) per call: such a forward is not replayed."""
    from tsct import quant
    from tsct.ops import grouped_glu, sort_by_expert
    from tsct.quant.layout import to_layout
    H = _harness()
    g = torch.Generator().manual_seed(0)
    t, e, d, r, f = 64, 4, 256, 64, 128
    with H.as_h200(str(aot.aot_dir())):
        x = torch.randn(t, d, generator=g).bfloat16()
        ws = [to_layout(quant.quantize((torch.randn(e, a, b, generator=g) / a ** .5).bfloat16(), "nvfp4"),
                        "swizzled_128x4") for a, b in ((d, r), (d, r), (r, f))]
        probs, ids = torch.softmax(torch.randn(t, e, generator=g), -1).topk(2)
        before = L.layout_conversions().get("w_gate", 0)
        for _ in range(3):
            s = sort_by_expert(ids, e, probs)
            grouped_glu(x, s.offs, *ws, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                        num_out_rows=t, impl="triton-lowbit")
        assert L.layout_conversions()["w_gate"] - before == 3
    assert replay.stats()["reasons"] == {"a block-scale layout conversion": 1}
