"""The first-use gate of ``tsct.ops.sort_by_expert``'s Triton routing kernels (``tsct.ops.routing``,
``dispatch.ROUTING``), on the CPU.

No GPU here: the device is dressed as compute capability 12.0 (``torch.cuda.get_device_capability``), the routing
layer sees the calls' CPU tensors as ``cuda:0`` (``uses_kernels``), the Triton kernels can launch
(``routing._serves``), and their launches are recorded by a stand-in (``FakeLaunch``) that writes what the kernels
write by contract (the torch reference; the real kernels are held to it under Triton's interpreter in
tests/ops/test_sort_by_expert.py and on an H200 in tests/ops/test_sort_by_expert_gpu.py). The child process is stubbed
by a fake runner (tests/_fake_child.py); the verdict logic, the caches and the warnings are the real ones.
"""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch

from _fake_child import IDENT, FakeRunner, failures
from tsct import config, dispatch, firstuse, probe, selftest
from tsct.kernels.triton_common import route
from tsct.kernels.triton_common import runtime as C
from tsct.ops import routing
from tsct.ops.routing import sort_by_expert, sort_by_expert_torch

FAILURES = failures(fail=("MISMATCH (Triton kernels): order (T=3000, k=2, E=37, int64 ids)",
                          "FAILED: fail: MISMATCH (Triton kernels): order"),
                    not_runnable=("the routing kernels cannot launch here: no cubins",
                                  "FAILED: not-runnable: the routing kernels cannot launch here"))
PASS = dict(detail="bit-exact (Triton kernels)")
USES_KERNELS = routing.uses_kernels


class FakeLaunch:
    """Stands in for ``runtime.launch_kernel`` under ``route.sort_by_expert``: records each launch (kernel, grid, the
    ids' or weights' dtype) and writes the outputs the kernels write (order, offs, token, row weights, the combine's
    CSR) from the torch reference."""

    def __init__(self):
        self.calls = []
        self._ids = None

    def __call__(self, name, grid, args, constexprs, warps, stages, aligned, cap, dev):
        if name == "route_rank":
            flat, m, e, k = args[0], args[5], args[6], args[8]
            self.calls.append((name, grid, flat.dtype, m, e, k))
            self._ids = flat
        elif name == "route_place":
            srt, rank, hist, cum, crank, order, token, offs, w, rw, rows, ptr, m, e, p, k = args
            self.calls.append((name, grid, None if w is None else w.dtype, m, e, k))
            o, f, tk = sort_by_expert_torch(self._ids.view(-1, k), e)
            order.copy_(o)
            offs.copy_(f)
            token.copy_(tk)
            if w is not None:
                rw.copy_(w[o].float())
            rows.copy_(torch.argsort(tk, stable=True))
            ptr.copy_(torch.arange(ptr.numel()) * k)
        else:
            raise AssertionError(f"unexpected launch {name}")

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A compute capability 12.0 device 0 on which the routing kernels can launch (recorded, ``launch``); returns a
    namespace with the capability to change (``cap``), whether a CUDA graph is being captured (``capturing``), the
    launches (``launch``) and ``child(runner)`` to stub the child process."""
    state = types.SimpleNamespace(cap=(12, 0), capturing=False, launch=FakeLaunch())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state.cap)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state.capturing)
    monkeypatch.setattr(firstuse, "identity", lambda index: dict(IDENT, capability=f"{state.cap[0]}.{state.cap[1]}"))
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(firstuse.ENV_IN_CHILD, raising=False)
    monkeypatch.setattr(config, "warn_fallbacks", True)
    monkeypatch.setattr(dispatch, "_first_use", {})
    dispatch.reset_fallback_counts(dispatch.ROUTING)
    monkeypatch.setattr(routing, "_serves", lambda capability, backend: True)
    monkeypatch.setattr(routing, "uses_kernels", lambda ids, e: route.fits(ids.numel(), e)
                        and routing._kernels_serve(torch.device("cuda", 0)))
    monkeypatch.setattr(C, "launch_kernel", state.launch)
    firstuse.reset_for_tests()

    def child(runner):
        monkeypatch.setattr(firstuse, "run_subprocess", runner)
        return runner

    state.child = child
    yield state
    firstuse.reset_for_tests()
    dispatch.reset_fallback_counts(dispatch.ROUTING)


def _ids(t=3001, k=2, e=35, seed=0, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, e + 3, (t, k), generator=g).to(dtype)
    w = torch.rand(t, k, generator=g).to(torch.bfloat16)
    return ids, e, w


def _reference(ids, e, w):
    """The result by definition, computed here: a stable argsort of the expert ids (padding last), a count."""
    flat = ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < e), flat, e)
    order = torch.argsort(key, stable=True)
    offs = torch.cumsum(torch.bincount(key, minlength=e + 1)[:e], 0).to(torch.int32)
    return order, offs, order // ids.shape[1], (w.reshape(-1)[order].float() if w is not None else None)


def _same(got, want):
    for name, a, b in zip(("order", "offs", "token", "row_weight"), got, want):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name


def test_the_table_row():
    assert dispatch.ROUTING == "triton-routing" and dispatch.ROUTING not in dispatch.PATHS
    assert dispatch.EXECUTED_ON[dispatch.ROUTING] == frozenset({"sm90"})
    assert dispatch.needs_first_use(dispatch.ROUTING, (12, 0)) and dispatch.needs_first_use(dispatch.ROUTING, (12, 1))
    assert not dispatch.needs_first_use(dispatch.ROUTING, (9, 0))
    assert not dispatch.needs_first_use(dispatch.ROUTING, None)


def test_pass_launches_the_kernels_after_one_child(gpu):
    run = gpu.child(FakeRunner(**PASS))
    ids, e, w = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no warning
        got = sort_by_expert(ids, e, w)
        again = sort_by_expert(ids, e)
    m, p = ids.numel(), -(-ids.numel() // 512)
    assert gpu.launch.calls == [("route_rank", (p,), torch.int64, m, e, 2),
                                ("route_place", (p,), torch.bfloat16, m, e, 2),
                                ("route_rank", (p,), torch.int64, m, e, 2), ("route_place", (p,), None, m, e, 2)]
    assert len(run.calls) == 1  # one child, then the verdict from this process's cache
    argv, env, _ = run.calls[0]
    assert argv[argv.index("--path") + 1] == "triton-routing" and argv[argv.index("--expect-capability") + 1] == "12.0"
    assert env[firstuse.ENV_IN_CHILD] == argv[argv.index("--path") + 1] and env["CUDA_VISIBLE_DEVICES"] == "0"
    (key, st), = dispatch.first_use_results().items()
    assert key == (dispatch.ROUTING, "sm120", "bf16") and st.ok
    assert "passed: pass: bit-exact (Triton kernels)" in st.reason
    _same(got, _reference(ids, e, w))
    _same(again, _reference(ids, e, None))
    assert C.linked_csr(got.token, got.offs, m, ids.shape[0]) is not None  # the kernels' CSR came along


@pytest.mark.parametrize("outcome", list(FAILURES))
def test_a_failed_verdict_serves_torchs_sort(gpu, outcome):
    kw, words = FAILURES[outcome]
    run = gpu.child(FakeRunner(**kw))
    ids, e, w = _ids(seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = sort_by_expert(ids, e, w)
        no_w = sort_by_expert(ids, e)
        i32 = sort_by_expert(ids.to(torch.int32), e, w.float())
    assert gpu.launch.calls == []  # the kernels never launched in this process
    assert len(run.calls) == 1
    want = _reference(ids, e, w)
    _same(got, want)
    _same(no_w, (*want[:3], None))
    _same(i32, want)
    assert C.linked_csr(got.token, got.offs, ids.numel(), ids.shape[0]) is None  # torch's sort links no CSR
    mine = [x for x in caught if issubclass(x.category, RuntimeWarning) and "sort_by_expert" in str(x.message)]
    assert len(mine) == 1, [str(x.message) for x in mine]  # once, not per call
    msg = str(mine[0].message)
    assert f"first-use self-test on sm120 {words}" in msg and "torch's sort serves" in msg
    (key, n), = dispatch.fallback_counts().items()  # every call counted, under the verdict's reason
    assert key[:2] == (dispatch.ROUTING, "torch") and words in key[2] and n == 3
    (key, st), = dispatch.first_use_results().items()
    assert key == (dispatch.ROUTING, "sm120", "bf16") and not st.ok and words in st.reason


def test_no_warning_when_fallback_warnings_are_off(gpu, monkeypatch):
    gpu.child(FakeRunner(**FAILURES["crash"][0]))
    monkeypatch.setattr(config, "warn_fallbacks", False)
    ids, e, w = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sort_by_expert(ids, e, w)
    assert gpu.launch.calls == []
    _same(got, _reference(ids, e, w))


def test_no_child_where_the_kernels_executed(gpu):
    gpu.cap = (9, 0)
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))  # would disable them, were it asked
    ids, e, w = _ids()
    _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert run.calls == [] and gpu.launch.names() == ["route_rank", "route_place"]
    assert dispatch.first_use_results() == {}


def test_no_child_for_a_cpu_tensor(gpu, monkeypatch):
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    monkeypatch.setattr(routing, "uses_kernels", USES_KERNELS)  # the real one: a CPU tensor is sorted by torch
    ids, e, w = _ids()
    assert not routing.uses_kernels(ids, e)
    _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert run.calls == [] and gpu.launch.calls == []


def test_inside_the_child_nothing_is_asked(gpu, monkeypatch):
    """The child runs the kernels directly: its self-test launches every variant of them (int64 and int32 ids; no,
    bf16, fp16 and fp32 router weights) and passes against the stand-in, which keeps the kernels' contract."""
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "1")
    r = selftest.sort_by_expert(torch.device("cpu"))  # what the child runs, through the stand-in here
    assert r.ok and r.detail == "bit-exact (Triton kernels)", r
    variants = {(c[0], c[2]) for c in gpu.launch.calls}
    assert variants == {("route_rank", torch.int64), ("route_rank", torch.int32), ("route_place", None),
                        ("route_place", torch.bfloat16), ("route_place", torch.float16),
                        ("route_place", torch.float32)}
    assert run.calls == [] and dispatch.first_use_results() == {}


def test_inside_another_paths_child_the_kernels_do_not_run(gpu, monkeypatch):
    """Inside a Triton path's self-test child the routing kernels (tested by a child of their own) do not launch:
    torch's sort serves, no child starts."""
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, dispatch.TRITON_BF16)
    ids, e, w = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert run.calls == [] and gpu.launch.calls == []


def test_the_self_test_sees_a_wrong_kernel(gpu, monkeypatch):
    """A kernel that writes one offset wrong, or no combine CSR, fails the self-test, naming what differed."""
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "1")
    real = gpu.launch.__call__

    def off_by_one(name, grid, args, *rest):
        real(name, grid, args, *rest)
        if name == "route_place":
            args[7][3] += 1  # offs

    monkeypatch.setattr(C, "launch_kernel", off_by_one)
    r = selftest.sort_by_expert(torch.device("cpu"))
    assert not r.ok and r.detail.startswith("MISMATCH (Triton kernels): offs (T=3000, k=2, E=37, int64 ids)"), r
    monkeypatch.setattr(C, "launch_kernel", gpu.launch)
    monkeypatch.setattr(C, "link_csr", lambda *a: None)
    r = selftest.sort_by_expert(torch.device("cpu"))
    assert not r.ok and "no combine CSR linked to the token tensor (T=1500, k=3, E=37, int32 ids)" in r.detail, r


def test_the_verdict_is_cached_in_the_process_and_on_disk(gpu):
    run = gpu.child(FakeRunner(**FAILURES["crash"][0]))
    ids, e, w = _ids()
    with pytest.warns(RuntimeWarning, match="SIGSEGV"):
        sort_by_expert(ids, e, w)
    sort_by_expert(ids, e, w)
    assert len(run.calls) == 1
    (entry,) = json.loads(firstuse.cache_file().read_text())["entries"].values()
    assert entry["path"] == "triton-routing" and entry["outcome"] == "crash" and entry["fmt"] == "bf16"
    firstuse.reset_for_tests()  # a new process: the disk answers, no child
    dispatch.reset_fallback_counts(dispatch.ROUTING)  # ... whose warnings are its own
    with pytest.warns(RuntimeWarning, match=r"SIGSEGV.*verdict cached in"):
        got = sort_by_expert(ids, e, w)
    assert len(run.calls) == 1 and gpu.launch.calls == []
    _same(got, _reference(ids, e, w))


def test_a_passed_verdict_on_disk_needs_no_child(gpu):
    run = gpu.child(FakeRunner(**PASS))
    ids, e, w = _ids()
    sort_by_expert(ids, e, w)
    firstuse.reset_for_tests()  # a new process
    gpu.launch.calls.clear()
    _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert len(run.calls) == 1 and gpu.launch.names() == ["route_rank", "route_place"]


def test_no_child_during_a_capture(gpu):
    """While a CUDA graph is captured no child starts: a verdict not known yet means torch's sort for that call (what
    the graph then replays; counted and warned) and no verdict is remembered; the next call outside a capture asks; a known verdict serves
    a capture as it serves eager calls."""
    run = gpu.child(FakeRunner(**PASS))
    ids, e, w = _ids()
    gpu.capturing = True
    with pytest.warns(RuntimeWarning, match="none is asked during a CUDA graph capture"):
        _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert run.calls == [] and gpu.launch.calls == [] and dispatch.first_use_results() == {}
    assert dispatch.fallback_counts() == {(dispatch.ROUTING, "torch", routing._NOT_YET): 1}
    gpu.capturing = False
    sort_by_expert(ids, e, w)
    assert len(run.calls) == 1 and gpu.launch.names() == ["route_rank", "route_place"]
    gpu.capturing = True
    gpu.launch.calls.clear()
    _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert len(run.calls) == 1 and gpu.launch.names() == ["route_rank", "route_place"]


def test_a_capture_reads_a_verdict_from_disk(gpu):
    """A verdict another process left on disk serves a capture without a child: a pass launches the kernels, a crash
    keeps torch's sort (warned)."""
    run = gpu.child(FakeRunner(**FAILURES["crash"][0]))
    ids, e, w = _ids()
    with pytest.warns(RuntimeWarning, match="SIGSEGV"):
        sort_by_expert(ids, e, w)
    firstuse.reset_for_tests()
    dispatch.reset_fallback_counts(dispatch.ROUTING)  # ... whose warnings are its own
    gpu.capturing = True
    with pytest.warns(RuntimeWarning, match="SIGSEGV"):
        _same(sort_by_expert(ids, e, w), _reference(ids, e, w))
    assert len(run.calls) == 1 and gpu.launch.calls == []


def test_compiled_code_asks_when_it_runs_not_while_tracing(gpu):
    """Under torch.compile the op is opaque: the verdict is asked when the compiled code first runs it, never while
    dynamo traces; a failed verdict gives torch's sort there too."""
    seen = []
    inner = FakeRunner(**FAILURES["crash"][0])

    def runner(argv, env, timeout):
        seen.append(torch.compiler.is_compiling())
        return inner(argv, env, timeout)

    gpu.child(runner)
    ids, e, w = _ids()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(ids, w):
        s = sort_by_expert(ids, e, w)
        return s.order, s.offs, s.token, s.row_weight

    torch._dynamo.reset()
    try:
        with pytest.warns(RuntimeWarning, match="SIGSEGV"):
            got = f(ids, w)
        got2 = f(ids, w)
    finally:
        torch._dynamo.reset()
    assert seen == [False] and gpu.launch.calls == []
    _same(got, _reference(ids, e, w))
    _same(got2, _reference(ids, e, w))


def test_the_child_runs_the_routing_self_test(gpu, monkeypatch, capsys):
    """``python -m tsct.selftest_child --path triton-routing``: runs ``selftest.sort_by_expert`` on the child's device;
    its failure is a fail; routing kernels that cannot launch there make it not runnable."""
    from tsct import selftest_child

    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "0")  # main sets it; restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name=IDENT["gpu"], major=12, minor=0))
    monkeypatch.setattr(routing, "kernels_status", lambda cap: (True, "AOT cubins for sm_120"))
    asked = []
    monkeypatch.setattr(selftest, "sort_by_expert", lambda dev: asked.append(dev) or selftest.Result(
        "sort_by_expert vs stable argsort", True, "bit-exact (Triton kernels)", 0.1))
    argv = ["--path", "triton-routing", "--fmt", "bf16", "--expect-name", IDENT["gpu"], "--expect-capability", "12.0"]
    assert selftest_child.main(argv) == firstuse.EXIT_PASS
    out = capsys.readouterr().out
    assert firstuse.interpret(firstuse.ChildResult(0, out, "", False, 1.0), 10) == (True, "pass",
                                                                                    "bit-exact (Triton kernels)")
    assert asked == [torch.device("cuda", 0)]
    monkeypatch.setattr(selftest, "sort_by_expert", lambda dev: selftest.Result(
        "sort_by_expert vs stable argsort", False, "MISMATCH (Triton kernels): offs (T=3000, k=2, E=37, int64 ids)",
        0.1))
    assert selftest_child.main(argv) == firstuse.EXIT_FAIL
    assert "MISMATCH (Triton kernels): offs" in capsys.readouterr().out
    monkeypatch.setattr(routing, "kernels_status", lambda cap: (False, "no AOT cubins for sm_120 and no Triton"))
    assert selftest_child.main(argv) == firstuse.EXIT_NOT_RUNNABLE
    assert "the routing kernels cannot launch here: no AOT cubins" in capsys.readouterr().out


def test_the_probe_shows_the_childs_verdict(gpu, monkeypatch):
    """On a GPU the kernels never executed on, the probe's sort_by_expert row is the child's verdict (the self-test
    does not run in the probe's process); where they executed, the self-test runs in the probe's process."""
    run = gpu.child(FakeRunner(**FAILURES["crash"][0]))
    monkeypatch.setattr(routing, "kernels_status", lambda cap: (True, "AOT cubins for sm_120"))
    in_process = []
    monkeypatch.setattr(selftest, "sort_by_expert", lambda dev: in_process.append(dev) or selftest.Result(
        "sort_by_expert vs stable argsort", True, "bit-exact (Triton kernels)", 0.1))
    row = probe._sort_by_expert_selftest(torch.device("cuda", 0), (12, 0))
    assert row["name"] == "sort_by_expert's Triton kernels vs stable argsort (child process)"
    assert not row["ok"] and row["detail"].startswith("crash (ran now in a child process")
    assert "SIGSEGV" in row["detail"]
    assert in_process == [] and len(run.calls) == 1
    assert run.calls[0][0][run.calls[0][0].index("--path") + 1] == "triton-routing"
    row = probe._sort_by_expert_selftest(torch.device("cuda", 0), (9, 0))
    assert row["ok"] and row["detail"] == "bit-exact (Triton kernels)" and in_process == [torch.device("cuda", 0)]
    assert len(run.calls) == 1
    monkeypatch.setattr(routing, "kernels_status", lambda cap: (False, "no cubins, no Triton"))
    row = probe._sort_by_expert_selftest(torch.device("cuda", 0), (12, 0))  # torch's sort: nothing to gate
    assert row["ok"] and len(in_process) == 2 and len(run.calls) == 1


def test_the_real_child_accepts_triton_routing(monkeypatch, tmp_path):
    """The real runner and child command: the child parses ``--path triton-routing`` and, seeing no GPU, says so."""
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child sees no device even on a GPU machine
    firstuse.reset_for_tests()
    try:
        v = firstuse.verdict(0, dispatch.ROUTING, "bf16", ident=IDENT, timeout=240)
    finally:
        firstuse.reset_for_tests()
    assert not v.ok and v.outcome == "not-runnable" and "no CUDA device visible" in v.detail, v
