"""The dispatch table: exact capabilities, formats, forced paths and counted fallbacks."""

import warnings

import pytest

from tsct import dispatch


@pytest.mark.parametrize("cap,cls", [
    (None, "cpu"), ((9, 0), "sm90"), ((10, 0), "sm100"), ((12, 0), "sm120"), ((12, 1), "sm120"),
    ((8, 0), "sm80"), ((8, 9), "sm80"), ((10, 3), "unknown"), ((11, 0), "unknown"), ((13, 0), "unknown"),
    ((7, 5), "unknown"),
])
def test_arch_class_is_exact(cap, cls):
    assert dispatch.arch_class(cap) == cls


def test_every_class_and_format_has_a_row_ending_in_reference():
    for cls in ("cpu", "sm80", "sm90", "sm100", "sm120", "unknown"):
        for fmt in dispatch.FORMATS:
            prefs = dispatch.TABLE[(cls, fmt)]
            assert prefs[-1] == dispatch.REFERENCE
            assert set(prefs) <= set(dispatch.PATHS)


def test_sm120_prefers_tensor_core_path_for_lowbit():
    assert dispatch.preferences((12, 0), "nvfp4")[0] == dispatch.SM120_FP4
    assert dispatch.preferences((12, 1), "sign")[0] == dispatch.SM120_FP4
    assert dispatch.SM120_FP4 not in dispatch.preferences((9, 0), "nvfp4")


def test_cpu_and_unknown_decide_reference_without_fallback():
    d = dispatch.decide(None, "bf16")
    assert d.path == "reference" and not d.skipped
    d = dispatch.decide((13, 0), "nvfp4")
    assert d.path == "reference" and "13.0 has no built artifacts" in d.reason
    d = dispatch.decide((9, 0), "fp32")
    assert d.path == "reference" and "no fast path for storage format 'fp32'" in d.reason


def test_fallback_is_counted_and_warned_once(monkeypatch):
    dispatch.reset_fallback_counts()
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16,
                        lambda cap, fmt: dispatch.Status(False, "test: artifact missing"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            assert dispatch.select("auto", (9, 0), "bf16") == "reference"
    assert sum("artifact missing" in str(x.message) for x in w) == 1
    assert dispatch.fallback_counts() == {("triton-bf16", "reference", "test: artifact missing"): 3}
    dispatch.reset_fallback_counts()


def test_forced_path_fails_loudly():
    with pytest.raises(RuntimeError, match=r"impl='sm120-fp4' cannot run on compute capability 9.0"):
        dispatch.select("sm120-fp4", (9, 0), "nvfp4")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        dispatch.select("triton-bf16", None, "bf16")
    assert dispatch.select("reference", (12, 0), "nvfp4") == "reference"


def test_first_use_selftest_failure_disables_path(monkeypatch):
    """A path never executed on this arch runs a self-test once; if it disagrees, auto falls back."""
    from tsct import selftest

    dispatch.reset_fallback_counts()
    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16, lambda cap, fmt: dispatch.Status(True, "built"))
    calls = []

    def fake_selftest(path, dev, dtype, fmt):
        calls.append(path)
        return selftest.Result(path, False, "rel err 3.1e-01 (tol 2e-02)", 0.0)

    monkeypatch.setattr(selftest, "grouped_glu", fake_selftest)
    monkeypatch.setattr(dispatch.torch.cuda, "current_device", lambda: 0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert dispatch.select("auto", (12, 0), "bf16") == "reference"
        assert dispatch.select("auto", (12, 0), "bf16") == "reference"
    assert calls == ["triton-bf16"]  # once per process, not per call
    (key, n), = dispatch.fallback_counts().items()
    assert key[:2] == ("triton-bf16", "reference") and "self-test on sm120 FAILED" in key[2] and n == 2
    assert sum("FAILED" in str(x.message) for x in w) == 1
    with pytest.raises(RuntimeError, match="first-use self-test on sm120 FAILED"):
        dispatch.select("triton-bf16", (12, 0), "bf16")
    dispatch.reset_fallback_counts()


def test_fallback_under_fullgraph_compile(monkeypatch):
    """A fallback decided while torch.compile traces neither breaks the graph nor changes results."""
    import torch
    from tsct.ops import grouped_glu
    from _glu_oracle import make_problem

    torch._dynamo.reset()
    dispatch.reset_fallback_counts()
    monkeypatch.setitem(dispatch.TABLE, ("cpu", "fp32"), [dispatch.TRITON_BF16, dispatch.REFERENCE])
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7, gather=False)
    fn = torch.compile(lambda x: grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"]), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = fn(p["x"])
    ref = grouped_glu(p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], impl="reference")
    assert torch.equal(y, ref)
    assert any(k[:2] == ("triton-bf16", "reference") for k in dispatch.fallback_counts())
    dispatch.reset_fallback_counts()


def test_w4a4_is_explicit_only():
    """triton-w4a4 has a status and an implementation but is in no preference list (auto never takes it)."""
    from tsct import dispatch

    assert dispatch.TRITON_W4A4 in dispatch.PATHS
    for key, prefs in dispatch.TABLE.items():
        assert dispatch.TRITON_W4A4 not in prefs, key
    st = dispatch.status(dispatch.TRITON_W4A4, (9, 0), "sign")
    assert not st.ok and "NVFP4" in st.reason
    assert not dispatch.status(dispatch.TRITON_W4A4, None, "nvfp4").ok
    assert dispatch.implementation(dispatch.TRITON_W4A4).__name__ == "tsct.kernels.triton_w4a4"
