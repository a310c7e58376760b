"""The dispatch table: exact capabilities, formats, activation precision, forced paths, counted fallbacks."""

import json
import warnings

import pytest

from tsct import config, dispatch, firstuse
from tsct.ops import _select

CAPS = [None, (8, 0), (9, 0), (10, 0), (12, 0), (12, 1), (13, 0), (7, 5)]


@pytest.mark.parametrize("cap,cls", [
    (None, "cpu"), ((9, 0), "sm90"), ((10, 0), "sm100"), ((12, 0), "sm120"), ((12, 1), "sm120"),
    ((8, 0), "sm80"), ((8, 9), "sm80"), ((10, 3), "unknown"), ((11, 0), "unknown"), ((13, 0), "unknown"),
    ((7, 5), "unknown"),
])
def test_arch_class_is_exact(cap, cls):
    assert dispatch.arch_class(cap) == cls


def test_every_row_ends_in_bmm_and_reference_is_never_automatic():
    for table in (dispatch.TABLE, dispatch.TABLE_NVFP4_ACTIVATIONS):
        for key, prefs in table.items():
            assert prefs[-1] == dispatch.BMM, key
            assert dispatch.REFERENCE not in prefs, key
            assert set(prefs) <= set(dispatch.PATHS)
    for cap in CAPS:
        for fmt in (*dispatch.FORMATS, "fp16", "fp32", "mixed", dispatch.MIXED_DECODED):
            for act in dispatch.ACTIVATIONS:
                assert dispatch.preferences(cap, fmt, act)[-1] == dispatch.BMM


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "nvfp4", "sign", "mixed", "fp8", "ternary", "mixed-decoded"])
@pytest.mark.parametrize("act", ["bf16", "nvfp4"])
def test_auto_never_changes_the_activation_precision(cap, fmt, act):
    """Every path auto may take for a request computes the requested activations, on every GPU and the CPU."""
    for path in dispatch.preferences(cap, fmt, act):
        assert act in dispatch.COMPUTES[path], (cap, fmt, act, path)


def test_nvfp4_activations_take_the_tensor_cores_only_on_12x():
    for cap in ((12, 0), (12, 1)):
        for fmt in ("nvfp4", "sign"):
            assert dispatch.preferences(cap, fmt, "nvfp4")[0] == dispatch.SM120_FP4
            assert dispatch.SM120_FP4 not in dispatch.preferences(cap, fmt, "bf16")
    for cap in ((8, 0), (9, 0), (10, 0), (13, 0), None):
        assert dispatch.preferences(cap, "nvfp4", "nvfp4") == [dispatch.BMM]


def test_cpu_and_unknown_decide_bmm_without_fallback():
    d = dispatch.decide(None, "bf16")
    assert d.path == "bmm" and not d.skipped
    d = dispatch.decide((13, 0), "nvfp4")
    assert d.path == "bmm" and "13.0 has no built artifacts" in d.reason
    d = dispatch.decide((9, 0), "fp32")
    assert d.path == "bmm" and "no fast path for storage format 'fp32'" in d.reason
    d = dispatch.decide((9, 0), "nvfp4", "nvfp4")
    assert d.path == "bmm" and "NVFP4 activations" in d.reason


def test_unknown_activation_precision_is_refused():
    with pytest.raises(ValueError, match="activations must be one of"):
        dispatch.select("auto", None, "bf16", "fp8")
    with pytest.raises(ValueError, match="activations must be one of"):
        dispatch.preferences((9, 0), "bf16", "int4")


def test_fallback_is_counted_and_warned_once(monkeypatch):
    dispatch.reset_fallback_counts()
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16,
                        lambda cap, fmt, x_dtype: dispatch.Status(False, "test: artifact missing"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            assert dispatch.select("auto", (9, 0), "bf16") == "bmm"
    hits = [x for x in w if "artifact missing" in str(x.message)]
    assert len(hits) == 1
    assert hits[0].filename == __file__  # the caller's line, not one inside tsct or torch
    assert dispatch.fallback_counts() == {("triton-bf16", "bmm", "test: artifact missing"): 3}
    dispatch.reset_fallback_counts()


def test_forced_path_fails_loudly():
    with pytest.raises(RuntimeError, match=r"impl='sm120-fp4' cannot run on compute capability 9.0"):
        dispatch.select("sm120-fp4", (9, 0), "nvfp4", "nvfp4")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        dispatch.select("triton-bf16", None, "bf16")
    assert dispatch.select("reference", (12, 0), "nvfp4") == "reference"
    assert dispatch.select("bmm", None, "sign", "nvfp4") == "bmm"


def test_forced_path_must_compute_the_requested_activations():
    with pytest.raises(ValueError, match="impl='sm120-fp4' computes nvfp4 activations.*pass activations='nvfp4'"):
        dispatch.select("sm120-fp4", (12, 0), "nvfp4")
    for path in ("triton-bf16", "triton-lowbit", "reference"):
        with pytest.raises(ValueError, match=f"impl='{path}' computes bf16 activations"):
            dispatch.select(path, (9, 0), "nvfp4", "nvfp4")


def _fake_verdicts(monkeypatch, ok_for):
    calls = []

    def fake(device_index, path, fmt, **kw):
        calls.append((path, fmt))
        ok = ok_for(path, fmt)
        return firstuse.Verdict(ok, "pass" if ok else "crash", "rel err 1e-3" if ok else "self-test child died "
                                "with SIGSEGV", "test")

    monkeypatch.setattr(firstuse, "verdict", fake)
    monkeypatch.setattr(dispatch.torch.cuda, "current_device", lambda: 0)
    return calls


def test_first_use_failure_in_the_child_disables_path(monkeypatch):
    """A path never executed on this arch asks the child-process self-test once; a crash there falls back."""
    dispatch.reset_fallback_counts()
    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16, lambda cap, fmt, x: dispatch.Status(True, "built"))
    calls = _fake_verdicts(monkeypatch, lambda path, fmt: False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _select.select("auto", (12, 0), "bf16") == "bmm"
        assert _select.select("auto", (12, 0), "bf16") == "bmm"
    assert calls == [("triton-bf16", "bf16")] * 2  # firstuse memoizes; dispatch asks per call
    (key, n), = dispatch.fallback_counts().items()
    assert key[:2] == ("triton-bf16", "bmm") and "self-test on sm120 FAILED: crash" in key[2] and n == 2
    assert sum("FAILED" in str(x.message) for x in w) == 1
    with pytest.raises(RuntimeError, match="first-use self-test on sm120 FAILED"):
        _select.select("triton-bf16", (12, 0), "bf16")
    dispatch.reset_fallback_counts()


def test_no_child_where_the_path_has_executed_or_for_pure_torch(monkeypatch):
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16, lambda cap, fmt, x: dispatch.Status(True, "built"))
    calls = _fake_verdicts(monkeypatch, lambda path, fmt: True)
    assert _select.select("auto", (9, 0), "bf16") == "triton-bf16"
    assert _select.select("bmm", (12, 0), "bf16") == "bmm"
    assert _select.select("auto", (13, 0), "bf16") == "bmm"
    assert calls == []
    assert _select.select("auto", (10, 0), "bf16") == "triton-bf16"
    assert calls == [("triton-bf16", "bf16")]


def test_inside_the_child_dispatch_does_not_ask_again(monkeypatch):
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16, lambda cap, fmt, x: dispatch.Status(True, "built"))
    calls = _fake_verdicts(monkeypatch, lambda path, fmt: False)
    monkeypatch.setenv(firstuse.ENV_IN_CHILD, "1")
    assert _select.select("triton-bf16", (12, 0), "bf16") == "triton-bf16"
    assert calls == []


def test_impl_keys_and_implementations():
    assert dispatch.impl_key("bmm") == "bmm"
    assert dispatch.impl_key("bmm", "nvfp4", static=True) == "bmm/nvfp4-act/static"
    assert dispatch.impl_key("triton-bf16", "bf16", static=True) == "triton-bf16"
    v = dispatch.implementation("bmm/nvfp4-act/static")
    assert v._kw == {"activations": "nvfp4", "static": True}
    assert dispatch.implementation("bmm")._kw == {"activations": "bf16", "static": False}
    with pytest.raises(RuntimeError, match="no implementation"):
        dispatch.implementation("triton-bf16/static")
    with pytest.raises(ValueError, match="not a path"):
        dispatch.status("triton-w4a4", (9, 0), "nvfp4")


def test_fallback_under_fullgraph_compile(monkeypatch):
    """A fallback decided while torch.compile traces neither breaks the graph nor changes results."""
    import torch
    from tsct.ops import grouped_glu
    from _glu_oracle import make_problem

    torch._dynamo.reset()
    dispatch.reset_fallback_counts()
    monkeypatch.setitem(dispatch.TABLE, ("cpu", "fp32"), [dispatch.TRITON_BF16, dispatch.BMM])
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7, gather=False)
    fn = torch.compile(lambda x: grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"]), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = fn(p["x"])
    ref = grouped_glu(p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"], impl="reference")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert any(k[:2] == ("triton-bf16", "bmm") for k in dispatch.fallback_counts())
    dispatch.reset_fallback_counts()


def test_select_leaves_a_pending_path_uncounted(monkeypatch):
    """dispatch.select returns a path that still needs its first-use verdict without counting; with a failing
    verdict for it the same call falls back and counts once."""
    dispatch.reset_fallback_counts()
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_BF16, lambda cap, fmt, x: dispatch.Status(True, "built"))
    assert dispatch.needs_first_use(dispatch.TRITON_BF16, (12, 0))
    assert not dispatch.needs_first_use(dispatch.TRITON_BF16, (9, 0)) and not dispatch.needs_first_use("bmm", (12, 0))
    assert dispatch.select("auto", (12, 0), "bf16") == dispatch.TRITON_BF16 and not dispatch.fallback_counts()
    failed = {dispatch.TRITON_BF16: dispatch.Status(False, "self-test FAILED")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.select("auto", (12, 0), "bf16", first_use=failed) == dispatch.BMM
    assert dispatch.fallback_counts() == {(dispatch.TRITON_BF16, dispatch.BMM, "self-test FAILED"): 1}
    with pytest.raises(RuntimeError, match="self-test FAILED"):
        dispatch.select(dispatch.TRITON_BF16, (12, 0), "bf16", first_use=failed)
    dispatch.reset_fallback_counts()


def test_the_backward_verdict_is_asked_for_by_the_ops_layer(monkeypatch):
    """sm120-fp4's backward reads triton-lowbit's verdict from dispatch; tsct.ops asks for it before the backward."""
    import torch

    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_LOWBIT, lambda cap, fmt, x: dispatch.Status(True, "built"))
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (12, 0))
    calls = _fake_verdicts(monkeypatch, lambda path, fmt: False)
    assert dispatch.first_use_status(dispatch.TRITON_LOWBIT, (12, 0), "nvfp4") is None
    _select.before_backward(dispatch.TRITON_BF16, torch.device("cpu"))  # no BACKWARD_VIA entry: nothing asked
    assert calls == []
    _select.before_backward(dispatch.SM120_FP4, torch.device("cpu"))
    assert calls == [(dispatch.TRITON_LOWBIT, "nvfp4")]
    st = dispatch.first_use_status(dispatch.TRITON_LOWBIT, (12, 0), "nvfp4")
    assert not st.ok and "FAILED: crash" in st.reason


def test_cuda_rows_name_real_kernels_sources_and_formats():
    """Each CUDA row of the dispatch replaces a Triton kernel of a family's table, points at a CUDA source that
    defines a ``tsctk_`` kernel named after it, serves storage formats of the table (never bf16 and a packed one
    together) and only artifact arches; the rows' kernel names are unique (one stand-in per Triton kernel)."""
    from pathlib import Path

    from tsct.kernels.triton_common import specs as CS
    from tsct.kernels.triton_glu import specs as GS
    from tsct.kernels.triton_lowbit import specs as LS

    root = Path(__file__).resolve().parents[2]
    triton = set(GS.KERNELS) | set(LS.KERNELS)
    names = [k.replaces for k in dispatch.CUDA_KERNELS]
    assert len(names) == len(set(names)) and names
    for k in dispatch.CUDA_KERNELS:
        assert k.replaces in triton, k
        src = (root / k.source).read_text()
        stem = k.replaces.replace("lowbit_", "glu_")  # lowbit_down_fwd -> tsctk_glu_down_fwd_<format>
        assert f"tsctk_{stem}" in src, (k.replaces, k.source)
        assert k.formats and k.formats <= set(dispatch.FORMATS), k
        assert k.formats == {"bf16"} or "bf16" not in k.formats, k
        assert k.archs and k.archs <= set(CS.ARTIFACT_ARCH.values()), k
        assert not k.archs & set(CS.PROXIES), k  # a proxy install runs the proxied arch's Triton kernels


def test_every_family_counts_its_fallbacks_in_one_record_and_resets_its_own(monkeypatch):
    monkeypatch.setattr(config, "warn_fallbacks", True)
    dispatch.reset_fallback_counts()
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(2):
            dispatch.note_fallback("triton-bf16", "bmm", "why a", "path message")
            dispatch.note_fallback("native-quant/quantize_sign", "torch", "why b", "quant message",
                                   warn_key=("native-quant/", "why b"))
            dispatch.note_fallback("native-quant/quantize_fp8", "torch", "why b", "quant message",
                                   warn_key=("native-quant/", "why b"))
    assert [str(w.message) for w in caught] == ["path message", "quant message"]  # once per warn key
    assert dispatch.fallback_counts() == {("triton-bf16", "bmm", "why a"): 2,
                                          ("native-quant/quantize_sign", "torch", "why b"): 2,
                                          ("native-quant/quantize_fp8", "torch", "why b"): 2}
    from tsct import quant
    assert quant.native_fallback_counts() == {("quantize_sign", "why b"): 2, ("quantize_fp8", "why b"): 2}
    quant.reset_native_fallback_counts()  # its own share only, warnings included
    assert dispatch.fallback_counts() == {("triton-bf16", "bmm", "why a"): 2}
    with pytest.warns(RuntimeWarning, match="quant message"):
        dispatch.note_fallback("native-quant/quantize_fp8", "torch", "why b", "quant message",
                               warn_key=("native-quant/", "why b"))
    dispatch.reset_fallback_counts()
    assert dispatch.fallback_counts() == {}


def test_sm120_backward_reads_the_verdict_of_its_own_gpu(monkeypatch, tmp_path):
    """Two 12.0 GPUs of different models in one process: triton-lowbit's first-use child crashed on GPU 1 and
    passed on GPU 0 (asked last). sm120-fp4's backward on GPU 1 takes the bmm backward, on GPU 0 triton-lowbit:
    each reads its own GPU's verdict, not the last one recorded for the arch class."""
    import types

    import torch

    from tsct import bmm, quant
    from tsct.kernels import sm120_fp4, triton_lowbit

    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path))
    firstuse.reset_for_tests()
    monkeypatch.setattr(dispatch, "_first_use", {})
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_LOWBIT, lambda cap, fmt, x: dispatch.Status(True, "built"))
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (12, 0))
    out = {0: "pass", 1: "fail"}
    ident = {i: {"gpu": f"model {i}", "capability": "12.0"} for i in out}
    for i in (1, 0):  # GPU 0's pass is recorded last
        res = firstuse.ChildResult(0 if out[i] == "pass" else firstuse.EXIT_FAIL, firstuse.VERDICT_MARKER
                                   + json.dumps({"verdict": out[i], "detail": "stand-in"}) + "\n", "", False, 0.1)
        st = firstuse.gate  # the ops layer's call, with a stand-in child and identity
        monkeypatch.setattr(firstuse, "identity", lambda index: ident[index])
        monkeypatch.setattr(firstuse, "run_subprocess", lambda argv, env, timeout, res=res: res)
        assert st(dispatch.TRITON_LOWBIT, (12, 0), "nvfp4", i).ok == (out[i] == "pass")
    assert dispatch.first_use_status(dispatch.TRITON_LOWBIT, (12, 0), "nvfp4").ok  # the class's last: GPU 0's
    ran = []
    monkeypatch.setattr(triton_lowbit, "grouped_glu_backward", lambda *a: ran.append("triton-lowbit"))
    monkeypatch.setattr(bmm, "grouped_glu_backward", lambda *a: ran.append("bmm"))
    monkeypatch.setattr(quant, "dequantize", lambda w, dtype=None: w)
    for index in (1, 0):
        x = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=index), dtype=torch.bfloat16)
        sm120_fp4.grouped_glu_backward(None, x, None, None, None, None, None, None, None, None, None, None, None)
    assert ran == ["bmm", "triton-lowbit"]
    firstuse.reset_for_tests()


def test_fallback_record_resets_by_family_and_warns_once_warnings_are_on(monkeypatch):
    dispatch.reset_fallback_counts()
    monkeypatch.setattr(config, "warn_fallbacks", False)
    dispatch.note_fallback("triton-routing", "torch", "why", "routing message")  # counted, silent
    monkeypatch.setattr(config, "warn_fallbacks", True)
    with pytest.warns(RuntimeWarning, match="routing message"):  # met again with warnings on: warned now
        dispatch.note_fallback("triton-routing", "torch", "why", "routing message")
    with pytest.warns(RuntimeWarning, match="path message"):
        dispatch.note_fallback("triton-bf16", "bmm", "why", "path message")
    assert dispatch.fallback_counts()[("triton-routing", "torch", "why")] == 2
    dispatch.reset_fallback_counts("triton")  # a family name, not a prefix of others: nothing of these
    assert len(dispatch.fallback_counts()) == 2
    dispatch.reset_fallback_counts("triton-bf16")
    assert list(dispatch.fallback_counts()) == [("triton-routing", "torch", "why")]
    for bad in (dict(wanted=None), dict(why=["a"])):
        args = dict(wanted="triton-bf16", taken="bmm", why="w", message="m") | bad
        with pytest.raises(TypeError, match=f"note_fallback: {next(iter(bad))} must be a str"):
            dispatch.note_fallback(**args)
    with pytest.raises(TypeError, match="family must be a str"):
        dispatch.reset_fallback_counts(None)
    dispatch.reset_fallback_counts()
    assert dispatch.fallback_counts() == {}
