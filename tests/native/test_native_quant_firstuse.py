"""The first-use gate of the native quantize / decode kernels (``tsct.quant._backend``, ``dispatch.NATIVE_QUANT``), on
the CPU.

No GPU here: ``tsct.native`` is a stand-in computing the C ABI's contract on CPU tensors (tests/_fake_native.py), the
device is dressed as compute capability 12.0 (``torch.cuda.get_device_capability``), and ``tsct.quant``'s backend
choice sees the calls' CPU tensors as ``cuda:0`` (``as_cuda``) while the kernels (stand-in or torch) compute on the
CPU. The child process is stubbed by a fake runner that answers as the real child would; the verdict logic, the
caches, the counters and the warnings are the real ones.
"""

from __future__ import annotations

import json
import sys
import types
import warnings

import pytest
import torch

import tsct
from _fake_child import IDENT, FakeRunner, failures
from _fake_native import FakeNative
from tsct import config, dispatch, firstuse, quant, selftest
from tsct.quant import _backend

FAILURES = failures(fail=("1 of 6 failed: sign pack+decode native vs torch: MISMATCH", "FAILED: fail: 1 of 6 failed"),
                    not_runnable=("no kernel image", "FAILED: not-runnable: no kernel image"))


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A compute capability 12.0 device 0 with the native library (the stand-in) loaded; returns a namespace with the
    stand-in (``native``), the capability to change (``cap``) and ``child(runner)`` to stub the child process."""
    state = types.SimpleNamespace(native=FakeNative(), cap=(12, 0))
    monkeypatch.setitem(sys.modules, "tsct.native", state.native)
    monkeypatch.setattr(tsct, "native", state.native, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state.cap)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(firstuse, "identity", lambda index: dict(IDENT, capability=f"{state.cap[0]}.{state.cap[1]}"))
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(firstuse.ENV_IN_CHILD, raising=False)
    monkeypatch.setattr(config, "warn_fallbacks", True)
    monkeypatch.setattr(dispatch, "_first_use", {})
    firstuse.reset_for_tests()
    quant.reset_native_fallback_counts()

    def child(runner):
        monkeypatch.setattr(firstuse, "run_subprocess", runner)
        return runner

    state.child = child
    yield state
    firstuse.reset_for_tests()
    quant.reset_native_fallback_counts()


@pytest.fixture
def as_cuda(monkeypatch):
    """``tsct.quant``'s backend choice sees every call's tensor on ``cuda:0`` (the kernels still compute on the
    CPU: the stand-in or torch)."""
    real = _backend.resolve
    monkeypatch.setattr(_backend, "resolve", lambda backend, device, what: real(backend, torch.device("cuda", 0), what))


def _w(seed=5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(3, 64, 40, generator=g) * torch.logspace(-2, 2, 40)).to(torch.bfloat16)


def _all_formats(w):
    """Every quantizer and its decoder under ``auto``: [(container, decoded bf16)]."""
    qs = [quant.quantize_nvfp4(w), quant.quantize_nvfp4(w, layout="swizzled_128x4"), quant.quantize_sign(w),
          quant.quantize_fp8(w), quant.quantize_ternary(w, scaling="absmean"), quant.quantize_ternary(w, scaling="rank1")]
    return [(q, quant.dequantize(q, torch.bfloat16)) for q in qs]


def _torch_formats(w):
    qs = [quant.quantize_nvfp4(w, backend="torch"), quant.quantize_nvfp4(w, layout="swizzled_128x4", backend="torch"),
          quant.quantize_sign(w, backend="torch"), quant.quantize_fp8(w, backend="torch"),
          quant.quantize_ternary(w, scaling="absmean", backend="torch"),
          quant.quantize_ternary(w, scaling="rank1", backend="torch")]
    return [(q, quant.dequantize(q, torch.bfloat16, backend="torch")) for q in qs]


def _same_bytes(a, b):
    (qa, da), (qb, db) = a, b
    assert type(qa) is type(qb)
    for name in type(qa)._STORAGE:
        x, y = getattr(qa, name), getattr(qb, name)
        if x is None or y is None:  # ternary absmean: no scale_k
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name
    assert torch.equal(da.view(torch.int16), db.view(torch.int16))


def test_the_table_row():
    assert dispatch.EXECUTED_ON[dispatch.NATIVE_QUANT] == frozenset({"sm90"})
    assert dispatch.NATIVE_QUANT not in dispatch.PATHS  # a pseudo-path: nothing selects it
    assert dispatch.needs_first_use(dispatch.NATIVE_QUANT, (12, 0)) and dispatch.needs_first_use(dispatch.NATIVE_QUANT,
                                                                                                 (12, 1))
    assert not dispatch.needs_first_use(dispatch.NATIVE_QUANT, (9, 0))
    assert not dispatch.needs_first_use(dispatch.NATIVE_QUANT, None)


def test_pass_runs_the_native_kernels_after_one_child(gpu, as_cuda):
    run = gpu.child(FakeRunner())
    w = _w()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no warning
        got = _all_formats(w)
    names = [c[0] for c in gpu.native.calls]
    assert names == ["nvfp4_quantize", "nvfp4_quantize", "sign_pack", "fp8_quantize", "ternary_pack", "ternary_pack",
                     "nvfp4_dequantize", "nvfp4_dequantize", "sign_dequantize", "fp8_dequantize", "ternary_dequantize",
                     "ternary_dequantize"]
    assert len(run.calls) == 1  # one child for every quantizer and decoder
    argv, env, _ = run.calls[0]
    assert argv[argv.index("--path") + 1] == "native-quant" and argv[argv.index("--expect-capability") + 1] == "12.0"
    assert env[firstuse.ENV_IN_CHILD] == argv[argv.index("--path") + 1] and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert quant.native_fallback_counts() == {}
    (key, st), = dispatch.first_use_results().items()
    assert key == (dispatch.NATIVE_QUANT, "sm120", "bf16") and st.ok and "passed: pass" in st.reason
    for a, b in zip(got, _torch_formats(w)):  # the stand-in keeps the contract: the same bytes as torch
        _same_bytes(a, b)


@pytest.mark.parametrize("outcome", list(FAILURES))
def test_a_failed_verdict_serves_auto_with_torch(gpu, as_cuda, outcome):
    kw, words = FAILURES[outcome]
    run = gpu.child(FakeRunner(**kw))
    w = _w()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _all_formats(w)
        quant.quantize_nvfp4(w)
    assert gpu.native.calls == []  # the native kernels never ran in this process
    assert len(run.calls) == 1
    for a, b in zip(got, _torch_formats(w)):
        _same_bytes(a, b)
    counts = quant.native_fallback_counts()
    reasons = {why for _, why in counts}
    assert len(reasons) == 1 and f"first-use self-test on sm120 {words}" in next(iter(reasons))
    assert counts[("quantize_nvfp4", next(iter(reasons)))] == 3
    assert dispatch.fallback_counts()[("native-quant/quantize_nvfp4", "torch", next(iter(reasons)))] == 3  # one record
    assert counts[("NVFP4Tensor.dequantize", next(iter(reasons)))] == 2
    assert sum(counts.values()) == 13  # 7 quantize calls and 6 decodes, each counted
    mine = [x for x in caught if issubclass(x.category, RuntimeWarning) and "tsct.quant" in str(x.message)]
    assert len(mine) == 1 and words in str(mine[0].message)  # one warning per reason, not per function
    # backend="native" asked for explicitly: the failed verdict is an error, never a run of the kernels
    with pytest.raises(RuntimeError, match=f"backend='native' cannot run: first-use self-test on sm120 {words}"):
        quant.quantize_sign(w, backend="native")
    assert gpu.native.calls == [] and len(run.calls) == 1


def test_explicit_native_after_a_pass_and_torch_untouched(gpu, as_cuda):
    run = gpu.child(FakeRunner())
    w = _w()
    quant.quantize_fp8(w, backend="torch")
    assert run.calls == []  # the torch backend never asks
    quant.quantize_fp8(w, backend="native")
    assert [c[0] for c in gpu.native.calls] == ["fp8_quantize"] and len(run.calls) == 1


def test_no_child_where_the_kernels_executed(gpu, as_cuda):
    gpu.cap = (9, 0)
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))  # would disable them, were it asked
    _all_formats(_w())
    assert run.calls == [] and len(gpu.native.calls) == 12 and quant.native_fallback_counts() == {}
    assert dispatch.first_use_results() == {}


def test_no_child_for_a_cpu_tensor(gpu):
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    q = quant.quantize_nvfp4(_w())  # really on the CPU: torch, no native library, no verdict
    assert q.codes.device.type == "cpu" and run.calls == [] and gpu.native.calls == []


def test_inside_the_child_nothing_is_asked(gpu, as_cuda, monkeypatch):
    """The child runs the native kernels directly: its own self-test (backend="native") and auto alike."""
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "1")
    results = selftest.native_quant(torch.device("cpu"))  # what the child runs, through the stand-in here
    assert [r.ok for r in results] == [True] * 6, [r.detail for r in results]
    assert "nvfp4_quantize" in [c[0] for c in gpu.native.calls] and "ternary_dequantize" in [c[0] for c in
                                                                                             gpu.native.calls]
    n = len(gpu.native.calls)
    quant.quantize_sign(_w())
    assert len(gpu.native.calls) == n + 1 and run.calls == [] and dispatch.first_use_results() == {}


def test_inside_another_paths_child_the_native_kernels_do_not_run(gpu, as_cuda, monkeypatch):
    """A Triton path's self-test child quantizes its factors with tsct.quant: there the native kernels (tested by a
    child of their own) do not run, so a fault of theirs is never cached as that path's crash; auto serves the same
    bytes with torch, no child starts, and an explicit backend="native" raises."""
    run = gpu.child(FakeRunner(returncode=-11, stdout=""))
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, dispatch.TRITON_LOWBIT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        q = quant.quantize_nvfp4(_w())
    assert torch.equal(q.codes, quant.quantize_nvfp4(_w(), backend="torch").codes)
    assert gpu.native.calls == [] and run.calls == []
    with pytest.raises(RuntimeError, match="self-test child of triton-lowbit"):
        quant.quantize_sign(_w(), backend="native")
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, dispatch.NATIVE_QUANT)  # its own child: they run
    quant.quantize_sign(_w())
    assert [c[0] for c in gpu.native.calls] == ["sign_pack"], gpu.native.calls
    assert run.calls == []


def test_the_verdict_is_cached_in_the_process_and_on_disk(gpu, as_cuda):
    run = gpu.child(FakeRunner(**FAILURES["crash"][0]))
    w = _w()
    with pytest.warns(RuntimeWarning, match="SIGSEGV"):
        quant.quantize_nvfp4(w)
    quant.quantize_sign(w)
    assert len(run.calls) == 1
    entries = json.loads(firstuse.cache_file().read_text())["entries"]
    (entry,) = entries.values()
    assert entry["path"] == "native-quant" and entry["outcome"] == "crash"
    firstuse.reset_for_tests()  # a new process: the disk answers, no child
    quant.reset_native_fallback_counts()
    with pytest.warns(RuntimeWarning, match="SIGSEGV"):
        quant.quantize_fp8(w)
    assert len(run.calls) == 1 and gpu.native.calls == []
    (why,) = {why for _, why in quant.native_fallback_counts()}
    assert "verdict cached in" in why and str(firstuse.cache_file()) in why


def test_the_child_tests_the_callers_device(gpu, monkeypatch):
    """A tensor on cuda:1 gets its verdict from a child pinned to device 1, not to the current device."""
    run = gpu.child(FakeRunner())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _backend.resolve("auto", torch.device("cuda", 1), "quantize_sign") == "native"
    assert run.calls[0][1]["CUDA_VISIBLE_DEVICES"] == "5"


def test_the_child_runs_the_native_quant_self_test(gpu, monkeypatch, capsys):
    """``python -m tsct.selftest_child --path native-quant``: every comparison must pass; one failure is a fail
    naming it; without the library it is not runnable."""
    from tsct import selftest_child

    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "0")  # main sets it; restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name=IDENT["gpu"], major=12, minor=0))
    asked = []
    ok = [selftest.Result(f"k{i}", True, "bit-exact", 0.1) for i in range(6)]
    monkeypatch.setattr(selftest, "native_quant", lambda dev: asked.append(dev) or ok)
    argv = ["--path", "native-quant", "--fmt", "bf16", "--expect-name", IDENT["gpu"], "--expect-capability", "12.0"]
    assert selftest_child.main(argv) == firstuse.EXIT_PASS
    out = capsys.readouterr().out
    assert firstuse.interpret(firstuse.ChildResult(0, out, "", False, 1.0), 10) == (True, "pass",
                                                                                    "all 6 passed (bit-exact)")
    assert asked == [torch.device("cuda", 0)]
    monkeypatch.setattr(selftest, "native_quant",
                        lambda dev: ok[:5] + [selftest.Result("sign pack+decode", False, "MISMATCH", 0.1)])
    assert selftest_child.main(argv) == firstuse.EXIT_FAIL
    assert "1 of 6 failed: sign pack+decode: MISMATCH" in capsys.readouterr().out
    monkeypatch.setattr(gpu.native, "available", lambda: False)
    monkeypatch.setattr(gpu.native, "load_error", lambda: "libtsct_kernels.so: cannot open", raising=False)
    assert selftest_child.main(argv) == firstuse.EXIT_NOT_RUNNABLE
    assert "native library does not load: libtsct_kernels.so" in capsys.readouterr().out


def test_all_of():
    rs = [selftest.Result("a", True, "bit-exact", 0.5), selftest.Result("b", False, "MISMATCH", 0.25)]
    r = selftest.all_of("both", rs)
    assert not r.ok and r.detail == "1 of 2 failed: b: MISMATCH" and r.seconds == 0.75 and r.name == "both"
    assert selftest.all_of("one", rs[:1]).ok
    with pytest.raises(ValueError, match="nothing was tested"):
        selftest.all_of("none", [])


def test_the_real_child_accepts_native_quant(monkeypatch, tmp_path):
    """The real runner and child command: the child parses ``--path native-quant`` and, seeing no GPU, says so."""
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child sees no device even on a GPU machine
    firstuse.reset_for_tests()
    try:
        v = firstuse.verdict(0, dispatch.NATIVE_QUANT, "bf16", ident=IDENT, timeout=240)
    finally:
        firstuse.reset_for_tests()
    assert not v.ok and v.outcome == "not-runnable" and "no CUDA device visible" in v.detail, v
