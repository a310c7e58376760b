"""The crash-safe first-use self-test (tsct.firstuse), on the CPU.

* The verdict logic with a fake child runner: pass, numerical failure, death by a signal, exit without
  a verdict, timeout; the in-process and on-disk caches (and their key: a new library / driver / GPU
  re-tests); an unwritable cache dir; the TSCT_SM120_FP4 overrides (sm120-fp4 only); the path in the key; CUDA_VISIBLE_DEVICES pinning.
* Dispatch and the probe on top of it (patched capability (12,0), no device).
* Real child processes: one that calls os.abort() (the parent survives and records SIGABRT), one that
  sleeps past the timeout, and the real child module on this GPU-less machine ("not-runnable").
"""

import json
import os
import sys

import pytest
import torch

from tsct import dispatch
from tsct.kernels import sm120_fp4
from tsct import firstuse
from tsct.ops import _select

IDENT = {"tsct": "0.1.0", "library": "/x/libtsct_kernels.so 123 sha256:ab", "driver": "615.00 (CUDA 12.9)",
         "gpu": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}


def _out(verdict, detail="rel err vs emulation 1.20e-02 (tol 3e-02)"):
    return firstuse.VERDICT_MARKER + json.dumps({"verdict": verdict, "detail": detail}) + "\n"


class FakeRunner:
    """Records the calls; answers with a fixed ChildResult."""

    def __init__(self, returncode=0, stdout=None, stderr="", timed_out=False):
        self.result = firstuse.ChildResult(returncode, _out("pass") if stdout is None else stdout, stderr, timed_out,
                                           0.5)
        self.calls = []

    def __call__(self, argv, env, timeout):
        self.calls.append((argv, env, timeout))
        return self.result


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(sm120_fp4.ENV_ENABLE, raising=False)
    monkeypatch.delenv(firstuse.ENV_TIMEOUT, raising=False)
    firstuse.reset_for_tests()
    yield
    firstuse.reset_for_tests()


def test_pass_runs_once_then_cached_in_process_then_on_disk():
    run = FakeRunner()
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert v.ok and v.outcome == "pass" and v.source.startswith(firstuse.RAN_NOW) and "saved to" in v.source
    assert "1.20e-02" in v.detail and len(run.calls) == 1
    argv, env, timeout = run.calls[0]
    assert argv[argv.index("--fmt") + 1] == "nvfp4" and argv[argv.index("--expect-capability") + 1] == "12.0"
    assert timeout == firstuse.DEFAULT_TIMEOUT_S
    again = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert again.ok and again.source == firstuse.CACHED_PROCESS and len(run.calls) == 1
    saved = json.loads(firstuse.cache_file().read_text())
    entry = saved["entries"][firstuse.cache_key(IDENT, "sm120-fp4", "nvfp4")]
    assert entry["outcome"] == "pass" and entry["identity"] == IDENT
    firstuse.reset_for_tests()  # a new process: the disk cache answers
    third = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert third.ok and third.source.startswith(firstuse.CACHED_DISK) and len(run.calls) == 1
    # the other format is a separate test
    firstuse.verdict(0, "sm120-fp4", "sign", runner=run, ident=IDENT)
    assert len(run.calls) == 2


def test_numeric_failure_is_a_cached_fail():
    run = FakeRunner(returncode=firstuse.EXIT_FAIL, stdout=_out("fail", "rel err vs emulation 9.8e-01 (tol 3e-02)"))
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert not v.ok and v.outcome == "fail" and "9.8e-01" in v.detail
    firstuse.reset_for_tests()
    v2 = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert not v2.ok and v2.outcome == "fail" and v2.source.startswith(firstuse.CACHED_DISK) and len(run.calls) == 1


@pytest.mark.parametrize("rc,name", [(-11, "SIGSEGV"), (-6, "SIGABRT"), (-9, "SIGKILL")])
def test_death_by_signal_is_a_crash(rc, name):
    run = FakeRunner(returncode=rc, stdout="", stderr="Fatal Python error: Segmentation fault\n")
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert not v.ok and v.outcome == "crash" and f"self-test child died with {name}" in v.detail
    assert "Segmentation fault" in v.detail


def test_exit_without_verdict_or_inconsistent_status_is_a_crash():
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=FakeRunner(returncode=1, stdout="", stderr="ImportError: boom"),
                         ident=IDENT)
    assert not v.ok and v.outcome == "crash" and "status 1 without a verdict" in v.detail and "boom" in v.detail
    ok, outcome, detail = firstuse.interpret(firstuse.ChildResult(1, _out("pass"), "", False, 1.0), 10)
    assert not ok and outcome == "crash" and "exited with status 1" in detail
    ok, outcome, _ = firstuse.interpret(firstuse.ChildResult(0, "noise\n" + _out("pass") + "more noise\n", "", False,
                                                             1.0), 10)
    assert ok and outcome == "pass"
    ok, outcome, _ = firstuse.interpret(firstuse.ChildResult(3, _out("not-runnable", "cc 9.0"), "", False, 1.0), 10)
    assert not ok and outcome == "not-runnable"


def test_timeout_is_a_failure(monkeypatch):
    monkeypatch.setenv(firstuse.ENV_TIMEOUT, "7.5")
    run = FakeRunner(returncode=None, stdout="", timed_out=True)
    v = firstuse.verdict(0, "sm120-fp4", "sign", runner=run, ident=IDENT)
    assert not v.ok and v.outcome == "timeout" and "after 7.5 s" in v.detail and run.calls[0][2] == 7.5
    monkeypatch.setenv(firstuse.ENV_TIMEOUT, "nonsense")
    monkeypatch.setattr(firstuse.config, "_warned_timeouts", set())
    with pytest.warns(RuntimeWarning, match="not a positive number"):
        assert firstuse.timeout_s() == firstuse.DEFAULT_TIMEOUT_S


def test_unwritable_cache_dir_keeps_the_verdict_in_process(monkeypatch, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TSCT_CACHE_DIR", str(blocker / "tsct"))  # mkdir under a file fails, even for root
    run = FakeRunner()
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert v.ok and "not saved" in v.source and not (blocker / "tsct").exists()
    assert firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT).source == firstuse.CACHED_PROCESS
    assert len(run.calls) == 1


def test_child_that_cannot_start_is_a_failure_not_an_exception():
    def no_exec(argv, env, timeout):
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=no_exec, ident=IDENT)
    assert not v.ok and v.outcome == "fail" and "could not start" in v.detail
    assert not firstuse.cache_file().exists()  # not a property of the install: not cached on disk
    assert firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=FakeRunner(), ident=IDENT).outcome == "fail"  # but in the process


def test_two_threads_get_one_child():
    import threading
    import time
    run = FakeRunner()

    def slow(argv, env, timeout):
        time.sleep(0.3)
        return run(argv, env, timeout)
    out = []
    threads = [threading.Thread(target=lambda: out.append(firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=slow, ident=IDENT)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(run.calls) == 1 and all(v.ok for v in out) and len(out) == 2


def test_corrupt_cache_file_is_ignored_and_replaced():
    path = firstuse.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=FakeRunner(), ident=IDENT)
    assert v.ok and json.loads(path.read_text())["schema"] == firstuse.CACHE_SCHEMA


@pytest.mark.parametrize("field,value", [("library", "/x/libtsct_kernels.so 124 sha256:cd"),
                                         ("driver", "620.10 (CUDA 13.1)"), ("gpu", "NVIDIA GeForce RTX 5090"),
                                         ("capability", "12.1"), ("tsct", "0.2.0"), ("tested", "0123456789abcdef")])
def test_identity_change_retests(field, value):
    run = FakeRunner()
    firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    firstuse.reset_for_tests()
    other = dict(IDENT, **{field: value})
    assert firstuse.cache_key(other, "sm120-fp4", "nvfp4") != firstuse.cache_key(IDENT, "sm120-fp4", "nvfp4")
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=other)
    assert v.source.startswith(firstuse.RAN_NOW) and len(run.calls) == 2
    entries = json.loads(firstuse.cache_file().read_text())["entries"]
    assert len(entries) == 2  # both kept; the old one is valid for the old install


def test_env_overrides(monkeypatch):
    run = FakeRunner(returncode=-11, stdout="")
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "1")
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert v.ok and v.outcome == "forced" and "no self-test" in v.detail and not run.calls
    assert dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4").ok or not sm120_fp4.kernels_linked()[0]
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "0")
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert not v.ok and v.outcome == "disabled" and "TSCT_SM120_FP4=0" in v.detail and not run.calls
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "yes")
    assert firstuse.env_mode()[0] == "invalid" and not firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=run, ident=IDENT).ok
    for unset in ("", "auto", " AUTO "):
        monkeypatch.setenv(sm120_fp4.ENV_ENABLE, unset)
        assert firstuse.env_mode()[0] == "auto"
    with pytest.raises(ValueError, match="fmt"):
        firstuse.verdict(0, "sm120-fp4", "bf16", runner=run, ident=IDENT)


def test_status_follows_env(monkeypatch):
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (True, f"{arch} linked"))
    st = dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4")
    assert st.ok and "child process" in st.reason
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "0")
    st = dispatch.status(dispatch.SM120_FP4, (12, 0), "sign")
    assert not st.ok and "TSCT_SM120_FP4=0" in st.reason
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "2")
    st = dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4")
    assert not st.ok and "not one of 0, 1" in st.reason


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert firstuse.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("TSCT_CACHE_DIR")
    assert firstuse.cache_dir() == tmp_path / "b" / "tsct"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert firstuse.cache_dir() == tmp_path / "home" / ".cache" / "tsct"


def test_child_is_pinned_to_the_parents_device(monkeypatch):
    assert firstuse.child_visible_devices(1, "") == "1"
    assert firstuse.child_visible_devices(1, "4, 5") == "5"
    assert firstuse.child_visible_devices(0, "GPU-abc,GPU-def") == "GPU-abc"
    assert firstuse.child_visible_devices(3, "4,5") == "3"
    with pytest.raises(ValueError, match="device_index"):
        firstuse.child_visible_devices(-1, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,7")
    run = FakeRunner()
    firstuse.verdict(1, "sm120-fp4", "nvfp4", runner=run, ident=IDENT)
    assert run.calls[0][1]["CUDA_VISIBLE_DEVICES"] == "7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    firstuse.verdict(1, "sm120-fp4", "sign", runner=run, ident=IDENT)
    assert run.calls[1][1]["CUDA_VISIBLE_DEVICES"] == "1"


def test_library_identity_hashes_the_bytes(monkeypatch, tmp_path):
    from tsct import native
    lib = tmp_path / "libtsct_kernels.so"
    lib.write_bytes(b"abc")
    monkeypatch.setattr(native, "library_path", lambda: str(lib))
    a = firstuse.library_identity()
    assert "sha256:ba7816bf" in a and " 3 " in a
    lib.write_bytes(b"abd")
    os.utime(lib, ns=(1, 1))  # a new mtime: not the memoised digest
    assert firstuse.library_identity() != a
    monkeypatch.setattr(native, "library_path", lambda: None)
    assert firstuse.library_identity() == "none"


# --- dispatch and probe on top of the verdict (capability patched, no device) ---------------------
@pytest.fixture
def sm120_here(monkeypatch):
    monkeypatch.setattr(sm120_fp4, "kernels_linked",
                        lambda arch="sm_120a": (True, f"CuTeDSL 4.8.1 {arch} kernels linked"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(firstuse, "identity", lambda i: dict(IDENT))
    monkeypatch.setattr(dispatch, "_first_use", {})
    dispatch.reset_fallback_counts()
    yield
    dispatch.reset_fallback_counts()


def test_auto_takes_sm120_when_the_child_passes(sm120_here, monkeypatch):
    run = FakeRunner()
    monkeypatch.setattr(firstuse, "run_subprocess", run)
    assert _select.select("auto", (12, 0), "nvfp4", "nvfp4") == dispatch.SM120_FP4
    assert _select.select("auto", (12, 0), "nvfp4", "nvfp4") == dispatch.SM120_FP4
    assert len(run.calls) == 1 and not dispatch.fallback_counts()
    (key, st), = dispatch.first_use_results().items()
    assert key == (dispatch.SM120_FP4, "sm120", "nvfp4") and st.ok and "passed" in st.reason


def test_the_verdict_is_asked_of_the_tensors_device_not_the_current_one(sm120_here, monkeypatch):
    """x on cuda:1 while device 0 is current (another GPU, maybe of another model): the child is pinned to GPU 1, and
    the verdict is device 1's, for the op's selection and for a backward that reads another path's verdict."""
    run = FakeRunner()
    monkeypatch.setattr(firstuse, "run_subprocess", run)
    assert _select.select("auto", (12, 0), "nvfp4", "nvfp4", "bf16", 1) == dispatch.SM120_FP4
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env, _ in run.calls] == ["1"]
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (12, 0))
    monkeypatch.setattr(dispatch, "status", lambda *a, **k: dispatch.Status(True, ""))
    _select.before_backward(dispatch.SM120_FP4, torch.device("cuda", 1))
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env, _ in run.calls] == ["1", "1"]
    assert {i for i, _, _ in firstuse._memo} == {1}


def test_crashing_child_disables_with_counted_warning(sm120_here, monkeypatch):
    run = FakeRunner(returncode=-11, stdout="", stderr="")
    monkeypatch.setattr(firstuse, "run_subprocess", run)
    with pytest.warns(RuntimeWarning, match="self-test child died with SIGSEGV"):
        path = _select.select("auto", (12, 0), "sign", "nvfp4")
    assert path != dispatch.SM120_FP4
    _select.select("auto", (12, 0), "sign", "nvfp4")
    (wanted, taken, why), n = next(iter(dispatch.fallback_counts().items()))
    assert wanted == dispatch.SM120_FP4 and taken == path and n == 2 and "FAILED: crash" in why
    with pytest.raises(RuntimeError, match="SIGSEGV"):
        _select.select(dispatch.SM120_FP4, (12, 0), "sign", "nvfp4")
    assert len(run.calls) == 1


def test_forced_on_skips_the_child(sm120_here, monkeypatch):
    run = FakeRunner(returncode=-11, stdout="")
    monkeypatch.setattr(firstuse, "run_subprocess", run)
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "1")
    assert _select.select("auto", (12, 0), "nvfp4", "nvfp4") == dispatch.SM120_FP4 and not run.calls


def test_twelve_one_needs_sm121a_exports(monkeypatch):
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (arch == "sm_120a", f"{arch}?"))
    st = dispatch.status(dispatch.SM120_FP4, (12, 1), "nvfp4")
    assert not st.ok and "12.1" in st.reason and "sm_121a" in st.reason
    assert dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4").ok
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (True, f"{arch} linked"))
    assert dispatch.status(dispatch.SM120_FP4, (12, 1), "nvfp4").ok
    assert sm120_fp4.kernel_names("sm_121a")[0].endswith("_sm121")
    with pytest.raises(ValueError, match="arch"):
        sm120_fp4.kernel_names("sm_100a")


def test_manifest_arch_lookup(monkeypatch):
    from tsct import native
    names = list(sm120_fp4.KERNELS)
    sec = {"linked": True, "dsl": {"version": "4.8.1"}, "arch": "sm_120a", "kernels": [{"name": k} for k in names]}
    monkeypatch.setattr(native, "manifest", lambda: {"cutedsl": sec})
    assert sm120_fp4.kernels_linked("sm_120a")[0]
    ok, why = sm120_fp4.kernels_linked("sm_121a")
    assert not ok and "no sm_121a exports" in why
    sec["kernels"] += [{"name": k} for k in sm120_fp4.kernel_names("sm_121a")]
    assert sm120_fp4.kernels_linked("sm_121a")[0]


def test_probe_shows_verdict_and_its_source(sm120_here, monkeypatch):
    from tsct import probe
    gpus = [{"index": 0, "name": IDENT["gpu"], "capability": "12.0"}]
    sm = probe._sm120_fp4([(12, 0)], gpus, run=False)
    assert [v["verdict"] for v in sm["verdicts"]] == [None, None]
    assert all("on first use" in v["source"] for v in sm["verdicts"])
    run = FakeRunner()
    monkeypatch.setattr(firstuse, "run_subprocess", run)
    sm = probe._sm120_fp4([(12, 0)], gpus, run=True)
    assert [v["verdict"] for v in sm["verdicts"]] == ["pass", "pass"] and len(run.calls) == 2
    assert all(v["source"].startswith(firstuse.RAN_NOW) for v in sm["verdicts"])
    firstuse.reset_for_tests()
    sm = probe._sm120_fp4([(12, 0)], gpus, run=False)
    assert all(v["source"].startswith(firstuse.CACHED_DISK) for v in sm["verdicts"])
    assert sm["cache_file"] == str(firstuse.cache_file())
    rows = [probe._sm120_selftest_row(v) for v in sm["verdicts"]]
    assert all(r["ok"] and "child process" in r["name"] for r in rows)
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "1")
    sm = probe._sm120_fp4([(12, 0)], gpus, run=True)
    assert {v["verdict"] for v in sm["verdicts"]} == {"forced"} and len(run.calls) == 2


# --- real child processes ---------------------------------------------------------------------------
def _with_argv(argv):
    return lambda _argv, env, timeout: firstuse.run_subprocess(argv, env, timeout)


def test_real_child_abort_leaves_the_parent_alive():
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=_with_argv([sys.executable, "-c", "import os; os.abort()"]), ident=IDENT)
    assert not v.ok and v.outcome == "crash" and "died with SIGABRT" in v.detail
    assert torch.ones(3).sum().item() == 3  # still here
    firstuse.reset_for_tests()
    assert firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=FakeRunner(), ident=IDENT).outcome == "crash"  # cached on disk


def test_real_child_timeout_is_killed():
    v = firstuse.verdict(0, "sm120-fp4", "sign", runner=_with_argv([sys.executable, "-c", "import time; time.sleep(60)"]),
                         ident=IDENT, timeout=1.0)
    assert not v.ok and v.outcome == "timeout" and v.seconds < 30


@pytest.mark.parametrize("raw", ["inf", "1e7"])
def test_a_timeout_past_what_the_wait_takes_runs_the_child(monkeypatch, raw):
    """"No limit" spelled as inf or a huge number of seconds: the child runs and its verdict comes back (the wait on
    it used to raise OverflowError into the op that asked)."""
    monkeypatch.setenv(firstuse.ENV_TIMEOUT, raw)
    line = firstuse.VERDICT_MARKER + json.dumps({"verdict": "pass", "detail": "ok"})
    v = firstuse.verdict(0, "sm120-fp4", "sign", ident=IDENT,
                         runner=_with_argv([sys.executable, "-c", f"print({line!r})"]))
    assert v.ok and v.outcome == "pass", v


def test_real_child_module_without_a_gpu_says_not_runnable(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child sees no device even on a GPU machine
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", ident=IDENT, timeout=240)  # the real runner and the real child command
    assert not v.ok and v.outcome == "not-runnable", v
    assert "no CUDA device visible" in v.detail


def test_transient_failures_are_kept_on_disk_only_while_others_may_be_asking(monkeypatch):
    """A timeout or an out-of-memory failure is kept on disk for the timeout plus CHILD_LOCK_MARGIN_S: a process asking
    in that window (a rank that waited on the lock) takes it; a later process tests again."""
    monkeypatch.setenv(firstuse.ENV_TIMEOUT, "5")
    v = firstuse.verdict(0, "sm120-fp4", "sign", runner=FakeRunner(returncode=None, stdout="", timed_out=True), ident=IDENT)
    assert v.outcome == "timeout" and "kept on disk for 65 s only" in v.source
    oom = FakeRunner(returncode=1, stdout=_out("fail", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"))
    v = firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=oom, ident=IDENT)
    assert v.outcome == "fail" and "kept on disk" in v.source
    firstuse.reset_for_tests()  # another process, asking at the same time: the disk answers
    again = FakeRunner()
    w = firstuse.verdict(0, "sm120-fp4", "sign", runner=again, ident=IDENT)
    assert w.outcome == "timeout" and w.source.startswith(firstuse.CACHED_DISK) and again.calls == []
    firstuse.reset_for_tests()  # a process asking after the window: both are tested again
    now = firstuse.time.time()
    monkeypatch.setattr(firstuse.time, "time", lambda: now + 66)
    assert firstuse.verdict(0, "sm120-fp4", "sign", runner=again, ident=IDENT).ok and len(again.calls) == 1
    assert firstuse.verdict(0, "sm120-fp4", "nvfp4", runner=again, ident=IDENT).ok and len(again.calls) == 2
    saved = json.loads(firstuse.cache_file().read_text())["entries"].values()
    assert sorted(e["outcome"] for e in saved) == ["pass", "pass"] and all("expires" not in e for e in saved)


def test_an_unknown_format_is_refused_by_name():
    for bad in ("nvfp", "NVFP4", "garbage"):
        with pytest.raises(ValueError, match=r"fmt must be one of .*got '" + bad):
            firstuse.verdict(0, "triton-lowbit", bad, runner=FakeRunner(), ident=IDENT)
    assert firstuse.canonical_format("fp16") == firstuse.canonical_format("fp32") == "bf16"


def test_a_verdict_on_disk_does_not_wait_for_another_threads_child():
    import threading
    import time

    firstuse.verdict(0, "triton-bf16", "bf16", runner=FakeRunner(), ident=IDENT)  # key B, on disk
    firstuse.reset_for_tests()
    started, release = threading.Event(), threading.Event()

    def slow(argv, env, timeout):  # key A's child, holding the process's one-child lock
        started.set()
        release.wait(30)
        return FakeRunner().result

    t = threading.Thread(target=firstuse.verdict, args=(0, "triton-lowbit", "nvfp4"), kwargs=dict(runner=slow,
                                                                                                  ident=IDENT))
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    v = firstuse.verdict(0, "triton-bf16", "bf16", runner=FakeRunner(), ident=IDENT)
    waited = time.monotonic() - t0
    release.set()
    t.join()
    assert v.ok and v.source.startswith(firstuse.CACHED_DISK) and waited < 5, waited


def test_the_path_is_part_of_the_key_and_of_the_child_command():
    run = FakeRunner()
    assert firstuse.verdict(0, "triton-lowbit", "nvfp4", runner=run, ident=IDENT).ok
    assert firstuse.verdict(0, "triton-bf16", "fp16", runner=run, ident=IDENT).ok  # dense formats test as bf16
    argv = run.calls[0][0]
    assert argv[argv.index("--path") + 1] == "triton-lowbit" and argv[argv.index("--fmt") + 1] == "nvfp4"
    argv = run.calls[1][0]
    assert argv[argv.index("--path") + 1] == "triton-bf16" and argv[argv.index("--fmt") + 1] == "bf16"
    assert [c[1][firstuse.ENV_IN_CHILD] for c in run.calls] == ["triton-lowbit", "triton-bf16"]  # the path under test
    assert firstuse.cache_key(IDENT, "triton-lowbit", "nvfp4") != firstuse.cache_key(IDENT, "sm120-fp4", "nvfp4")
    assert len(json.loads(firstuse.cache_file().read_text())["entries"]) == 2
    firstuse.reset_for_tests()
    assert firstuse.verdict(0, "triton-lowbit", "nvfp4", runner=run, ident=IDENT).source.startswith(
        firstuse.CACHED_DISK) and len(run.calls) == 2


def test_the_sm120_switch_does_not_touch_other_paths(monkeypatch):
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "0")
    run = FakeRunner()
    assert firstuse.verdict(0, "triton-bf16", "bf16", runner=run, ident=IDENT).ok and len(run.calls) == 1
    assert firstuse.env_mode("triton-lowbit")[0] == "auto"


def test_real_child_module_for_a_triton_path_without_a_gpu_says_not_runnable(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    v = firstuse.verdict(0, "triton-bf16", "bf16", ident=IDENT, timeout=240)
    assert not v.ok and v.outcome == "not-runnable" and "no CUDA device visible" in v.detail, v


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "nvfp4", "sign", "mixed", "fp8", "ternary", "mixed-decoded"])
def test_the_child_accepts_every_format_a_verdict_asks_for(fmt, monkeypatch, capsys):
    """The child's ``--fmt`` takes what ``verdict`` passes (``canonical_format``): a format it refused would end the
    child with a usage error, which the parent caches as a crash (a forced triton-lowbit with fp8 factors)."""
    from tsct import selftest_child

    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "0")  # main sets it; restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = FakeRunner()
    firstuse.verdict(0, "triton-lowbit", fmt, runner=run, ident=IDENT)
    args = run.calls[0][0]
    rc = selftest_child.main(args[args.index("--path"):args.index("--fmt") + 2])
    assert rc == firstuse.EXIT_NOT_RUNNABLE and "no CUDA device visible" in capsys.readouterr().out


def test_tested_identity_follows_the_cubin_indexes(monkeypatch, tmp_path):
    """A verdict is valid for the self-test and the cubins it ran: ``tested_identity`` changes when an installed cubin
    index changes (a rebuilt kernel records another SHA-256 there) or one is added, with tsct's version and the native
    library unchanged."""
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    (tmp_path / "sm_120").mkdir()
    index = tmp_path / "sm_120" / "index.json"
    index.write_text('{"kernels": {"k": {"sha256": "aa"}}}')
    firstuse.tested_identity.cache_clear()
    try:
        a = firstuse.tested_identity()
        index.write_text('{"kernels": {"k": {"sha256": "bb"}}}')
        firstuse.tested_identity.cache_clear()
        b = firstuse.tested_identity()
        (tmp_path / "sm_90a").mkdir()
        (tmp_path / "sm_90a" / "index.json").write_text("{}")
        firstuse.tested_identity.cache_clear()
        c = firstuse.tested_identity()
        assert len({a, b, c}) == 3 and all(len(v) == 16 for v in (a, b, c))
    finally:
        firstuse.tested_identity.cache_clear()


def test_a_path_without_a_self_test_is_refused_by_name():
    run = FakeRunner()
    for bad in ("bmm", "triton_bf16", ""):
        with pytest.raises(ValueError, match=r"path must be one of .*got '" + bad):
            firstuse.verdict(0, bad, "bf16", runner=run, ident=IDENT)
    assert run.calls == [] and not firstuse.cache_file().exists()


# Two processes asking for one verdict at once (two ranks on GPUs of one model). Each waits for the other at a
# barrier after its imports, then asks; the stand-in child appends this process's id to a file and takes a second.
_ASKER = r"""
import json, os, sys, time
from pathlib import Path
from tsct import firstuse
ident, runs, barrier, me, timed_out = (json.loads(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4],
                                       sys.argv[5] == "timeout")
def child(argv, env, timeout):
    with open(runs, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    if timed_out:
        return firstuse.ChildResult(None, "", "", True, 1.0)
    out = firstuse.VERDICT_MARKER + json.dumps({"verdict": "pass", "detail": "stand-in"}) + "\n"
    return firstuse.ChildResult(0, out, "", False, 1.0)
(barrier / me).touch()
deadline = time.monotonic() + 60
while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
v = firstuse.verdict(0, "triton-bf16", "bf16", runner=child, ident=ident, timeout=30)
print(json.dumps({"ok": v.ok, "outcome": v.outcome, "source": v.source}))
"""


def _tsct_env(**extra):
    import tsct
    from pathlib import Path

    path = [str(Path(tsct.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), **extra)


@pytest.mark.parametrize("outcome", ["pass", "timeout"])
def test_processes_asking_together_get_one_child(outcome, tmp_path):
    """Two processes at once, one child between them, the same verdict for both: a pass (saved), and a timeout (kept
    on disk for the window in which others ask, not for later processes)."""
    import subprocess

    runs, barrier = tmp_path / "runs", tmp_path / "barrier"
    barrier.mkdir()
    env = _tsct_env(TSCT_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", _ASKER, json.dumps(IDENT), str(runs), str(barrier), str(i),
                               outcome], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    got = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert len(runs.read_text().split()) == 1  # one child for both
    assert [g["outcome"] for g in got] == [outcome] * 2
    assert sorted(g["source"].split(" (")[0].split(",")[0] for g in got) == [firstuse.CACHED_DISK, firstuse.RAN_NOW]
    assert oct(os.stat(tmp_path / "cache" / firstuse.CACHE_FILE).st_mode & 0o777) == "0o644"  # readable by others


def test_concurrent_saves_of_different_verdicts_keep_every_entry(tmp_path):
    import subprocess

    saver = ("import sys, time; from pathlib import Path; from tsct import firstuse\n"
             "barrier = Path(sys.argv[3]); (barrier / sys.argv[2]).touch()\n"
             "while len(list(barrier.iterdir())) < 2: time.sleep(0.01)\n"
             "for i in range(150):\n"
             "    assert firstuse._write_cache(Path(sys.argv[1]), f'{sys.argv[2]}-{i}', {'ok': True}) is None\n")
    file, barrier = tmp_path / "cache" / firstuse.CACHE_FILE, tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", saver, str(file), name, str(barrier)], env=_tsct_env(),
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert set(json.loads(file.read_text())["entries"]) == {f"{n}-{i}" for n in "ab" for i in range(150)}
