"""The sm120-fp4 path on a machine without sm_120 (design.md section 6).

* Dispatch decisions with a patched compute capability (12,0) / (12,1) / (9,0), kernels present or
  not, TSCT_SM120_FP4 set or not; the first-use self-test (its child process faked here; the verdict
  logic itself: test_sm120_firstuse.py) disables the path when it fails (counted).
* The host argument preparation of ``tsct.kernels.sm120_fp4.glu.forward`` end to end on the CPU: the
  forward is run with an EMULATED GEMM that receives exactly the arguments of the native entry
  (``tsct.native.sm120_nvfp4_grouped``: operands, plans, alpha, ep0/ep1 incl. the [rows, 1] row-weight
  view) and computes them with ``tsct.emulation.grouped_gemm_emulated``; the result must equal the
  emulation of the whole W4A4 GLU (``tsct.emulation.grouped_glu_w4a4``) plus a float64 combine.
* The self-test itself (``tsct.selftest.sm120_fp4_forward``) passes with that emulated forward and
  fails with a broken one; the plan runs on ``meta`` (no host reads).
"""

import functools
import math

import pytest
import torch
from _sm120_problem import make_problem

from tsct import dispatch, quant, selftest
from tsct.emulation import grouped_glu_w4a4, plan
from tsct.emulation.grouped_glu import GluFactors
from tsct.kernels import sm120_fp4
from tsct import firstuse
from tsct.ops import _select
from tsct.kernels.sm120_fp4 import glu as sglu
from tsct.kernels.sm120_fp4.emulated import emulated_gemm, emulated_sign_gemm
from tsct.emulation import grouped_glu_w4a4_sign
from tsct.emulation.sign_glu import SignGluFactors


_problem = make_problem
EMU_FORWARD = functools.partial(sglu.forward, gemm=emulated_gemm, quant_backend="torch")


@pytest.mark.parametrize("layout", ["linear", "swizzled_128x4"])
def test_forward_host_prep_matches_emulation(layout):
    x, offs, w, sg, su, rw, gather, tokens = _problem()
    qg, qu, qd = (quant.quantize_nvfp4(t, layout=layout, backend="torch") for t in w)
    y = EMU_FORWARD(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens)
    assert y.shape == (tokens, w[2].shape[2]) and y.dtype == torch.bfloat16
    ops = sglu.prepare_factors(qg, qu, qd)
    facs = GluFactors(gu_codes=ops.gu_codes, gu_sfb=ops.gu_sfb.view(torch.float8_e4m3fn), gate=qg, up=qu, down=qd,
                      down_sfb=ops.down_sfb.view(torch.float8_e4m3fn))
    m, valid = gather.shape[0], int(offs[-1])
    xr = torch.zeros(m, x.shape[1])
    xr[:valid] = x[gather[:valid]].float()
    y_emu = grouped_glu_w4a4(xr, offs, facs, sg, su, rw)
    want = torch.zeros(tokens, y.shape[1], dtype=torch.float64).index_add_(0, gather[:valid], y_emu[:valid].double())
    assert torch.allclose(y.double(), want.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-3)
    # without scatter: [M, f], padding rows 0, bit-identical to the emulation
    y2 = EMU_FORWARD(x, offs, qg, qu, qd, sg, su, rw, gather, None, None)
    assert torch.equal(y2, y_emu.to(torch.bfloat16)) and y2[valid:].eq(0).all()


def test_sign_forward_host_prep_matches_emulation():
    x, offs, w, sg, su, rw, gather, tokens = _problem(seed=2)
    qg, qu, qd = (quant.quantize_sign(t, backend="torch") for t in w)
    fwd = functools.partial(sglu.forward, gemm=emulated_sign_gemm, quant_backend="torch")
    m, valid = gather.shape[0], int(offs[-1])
    xr = torch.zeros(m, x.shape[1])
    xr[:valid] = x[gather[:valid]].float()
    facs = SignGluFactors(gate=qg, up=qu, down=qd, gu_bits=torch.stack((qg.bits, qu.bits)),
                          gu_col=torch.stack((qg.scale_n, qu.scale_n)))
    y_emu = grouped_glu_w4a4_sign(xr, offs, facs, sg, su, rw)
    y = fwd(x, offs, qg, qu, qd, sg, su, rw, gather, None, None)
    assert torch.equal(y, y_emu.to(torch.bfloat16)) and y[valid:].eq(0).all()
    y2 = fwd(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens)
    want = torch.zeros(tokens, y.shape[1], dtype=torch.float64).index_add_(0, gather[:valid], y_emu[:valid].double())
    assert torch.allclose(y2.double(), want.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-3)
    assert selftest.sm120_fp4_forward("cpu", forward=fwd, fmt="sign").ok
    with pytest.raises(TypeError, match="w_down"):
        sglu.forward_sign(x, offs, qg, qu, quant.quantize_nvfp4(w[2], backend="torch"), sg, su, rw, gather, None, None,
                          gemm=emulated_sign_gemm, quant_backend="torch")


def test_prepare_factors_interleaves_and_refuses():
    x, offs, w, *_ = _problem()
    qg, qu, qd = (quant.quantize_nvfp4(t, backend="torch") for t in w)
    ops = sglu.prepare_factors(qg, qu, qd)
    assert torch.equal(ops.gu_codes[:, 0::2], qg.codes) and torch.equal(ops.gu_codes[:, 1::2], qu.codes)
    with pytest.raises(TypeError, match="w_down"):
        sglu.prepare_factors(qg, qu, w[2])
    q48 = quant.quantize_nvfp4(torch.randn(2, 48, 64), backend="torch")
    with pytest.raises(ValueError, match="d % 64"):
        sglu.prepare_factors(q48, q48, quant.quantize_nvfp4(torch.randn(2, 64, 32), backend="torch"))


def test_launch_args_on_meta_device():
    e, m, d, r, f = 7, 100, 128, 64, 37
    offs = torch.empty(e, dtype=torch.int32, device="meta")
    ops = sglu.GluOperands(gu_codes=None, gu_sfb=None, s_enc_gate=torch.empty(e, device="meta"),
                           s_enc_up=torch.empty(e, device="meta"), down_codes=None, down_sfb=None,
                           s_enc_down=torch.empty(e, device="meta"), d=d, r=r, f=f)
    la = sglu.launch_args(offs, m, ops, None, None)  # would raise on a host read
    assert la.plan1.grid == (plan.max_tiles(m, e, 32), 1, 1) and la.plan2.grid[1] == math.ceil(f / 32)
    assert la.plan1.a_rows == m + 31 and la.ep0.shape == (e, r)


def test_combine_is_deterministic_and_exact():
    g = torch.Generator().manual_seed(3)
    y = torch.randn(50, 9, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 20, (50,), generator=g)
    offs = torch.tensor([10, 45], dtype=torch.int32)
    out = sglu.combine_rows(y, idx, offs, 20)
    want = torch.zeros(20, 9, dtype=torch.float64).index_add_(0, idx[:45], y[:45].double())
    assert torch.allclose(out.double(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(out, sglu.combine_rows(y, idx, offs, 20))


def test_selftest_with_emulated_forward():
    assert selftest.sm120_fp4_forward("cpu", forward=EMU_FORWARD).ok

    def broken(x, offs, *args):  # a fragment mistake: e.g. gate and up swapped
        a = list(args)
        a[0], a[1] = a[1], a[0]
        return EMU_FORWARD(x, offs, *a)
    r = selftest.sm120_fp4_forward("cpu", forward=broken)
    assert not r.ok and "rel err" in r.detail


# --- dispatch decisions with patched capabilities ------------------------------------------------
@pytest.fixture
def linked(monkeypatch, tmp_path):
    monkeypatch.setattr(sm120_fp4, "kernels_linked",
                        lambda arch="sm_120a": (arch == "sm_120a", f"CuTeDSL 4.8.1 {arch} kernels linked"))
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "1")
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    firstuse.reset_for_tests()
    dispatch.reset_fallback_counts()
    yield
    dispatch.reset_fallback_counts()
    firstuse.reset_for_tests()


def test_status_off_sm120_says_why(monkeypatch):
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (arch == "sm_120a", f"{arch} exports?"))
    assert "12.0" in dispatch.status(dispatch.SM120_FP4, (9, 0), "nvfp4").reason
    st = dispatch.status(dispatch.SM120_FP4, (12, 1), "nvfp4")
    assert not st.ok and "sm_121a" in st.reason
    assert "mixed" in dispatch.status(dispatch.SM120_FP4, (12, 0), "mixed").reason
    assert not dispatch.status(dispatch.SM120_FP4, None, "nvfp4").ok


def test_status_without_kernels_or_with_env_off(monkeypatch):
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (False, "built without the CuTeDSL kernels"))
    assert "without the CuTeDSL" in dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4").reason
    monkeypatch.setattr(sm120_fp4, "kernels_linked", lambda arch="sm_120a": (True, "linked"))
    monkeypatch.delenv(sm120_fp4.ENV_ENABLE, raising=False)
    st = dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4")  # auto: runnable, behind the child's self-test
    assert st.ok and "child process" in st.reason
    monkeypatch.setenv(sm120_fp4.ENV_ENABLE, "0")
    st = dispatch.status(dispatch.SM120_FP4, (12, 0), "nvfp4")
    assert not st.ok and "TSCT_SM120_FP4=0" in st.reason
    dec = dispatch.decide((12, 0), "nvfp4", "nvfp4")
    assert dec.path != dispatch.SM120_FP4 and dec.skipped[0][0] == dispatch.SM120_FP4


def test_manifest_without_cutedsl_section(monkeypatch):
    from tsct import native
    monkeypatch.setattr(native, "manifest", lambda: {"gencodes": []})
    ok, why = sm120_fp4.kernels_linked()
    assert not ok and "TSCT_CUTEDSL" in why
    monkeypatch.setattr(native, "manifest", lambda: {"cutedsl": {"linked": True, "dsl": {"version": "4.8.1"},
                                                                 "arch": "sm_120a",
                                                                 "kernels": [{"name": k} for k in sm120_fp4.KERNELS]}})
    assert sm120_fp4.kernels_linked()[0]


def test_decide_sm120_first_choice_when_linked_and_enabled(linked):
    dec = dispatch.decide((12, 0), "nvfp4", "nvfp4")
    assert dec.path == dispatch.SM120_FP4 and dec.reason == "first choice"
    assert dispatch.decide((12, 1), "nvfp4", "nvfp4").skipped[0][0] == dispatch.SM120_FP4  # no sm_121a exports here
    assert dispatch.decide((9, 0), "nvfp4").path != dispatch.SM120_FP4
    assert dispatch.decide((12, 0), "bf16").path != dispatch.SM120_FP4
    assert dispatch.decide((12, 0), "sign", "nvfp4").path == dispatch.SM120_FP4
    assert dispatch.implementation(dispatch.SM120_FP4) is sm120_fp4
    assert callable(sm120_fp4.grouped_glu_forward) and callable(sm120_fp4.grouped_glu_backward)


def test_first_use_selftest_disables_and_counts(linked, monkeypatch):
    """The numerical self-test's failure, reported by the child (tests/package/test_firstuse.py: crashes)."""
    assert dispatch.EXECUTED_ON[dispatch.SM120_FP4] == frozenset()
    monkeypatch.delenv(sm120_fp4.ENV_ENABLE)
    calls = []

    def child(argv, env, timeout):  # what selftest_child prints when sm120_fp4_forward disagrees
        calls.append(argv)
        line = firstuse.VERDICT_MARKER + '{"verdict": "fail", "detail": "rel err vs emulation 1.0e+00 (tol 3e-02)"}'
        return firstuse.ChildResult(firstuse.EXIT_FAIL, line + "\n", "", False, 0.1)
    monkeypatch.setattr(firstuse, "run_subprocess", child)
    monkeypatch.setattr(firstuse, "identity", lambda i: {"gpu": "test", "capability": "12.0"})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(dispatch, "_first_use", {})
    with pytest.warns(RuntimeWarning, match="sm120-fp4 unavailable"):
        path = _select.select("auto", (12, 0), "nvfp4", "nvfp4")
    assert path != dispatch.SM120_FP4 and len(calls) == 1
    counts = dispatch.fallback_counts()
    assert any(k[0] == dispatch.SM120_FP4 and "first-use self-test on sm120 FAILED: fail: rel err" in k[2]
               for k in counts), counts
    with pytest.raises(RuntimeError, match="FAILED"):
        _select.select(dispatch.SM120_FP4, (12, 0), "nvfp4", "nvfp4")
    assert len(calls) == 1


def test_bench_arms_and_probe_say_why_off_sm120():
    import types

    from tsct import probe
    from tsct.bench import arms
    from tsct.bench.config import from_preset

    cfg = from_preset("small", device="cpu")
    names = {a.name for a in arms.all_arms(cfg, "bf16")}
    assert "tsct-sm120-fp4-nvfp4" in names
    spec = next(a for a in arms.all_arms(cfg, "bf16") if a.name == "tsct-sm120-fp4-nvfp4")
    res = arms.tsct_arm(spec, types.SimpleNamespace(capability=(9, 0), formats={}, cfg=cfg))
    assert res["status"] == arms.UNAVAILABLE and "12.0" in res["reason"], res
    sm = probe._sm120_fp4([None, (9, 0), (12, 1)])
    reasons = {r["device"]: r["reason"] for r in sm["status"]}
    from tsct.kernels import sm120_fp4

    assert "12.0" in reasons["cuda (cc 9.0)"]
    # with the CuTeDSL kernels linked the reason names the sm_121a set; a build without them (pip install . on
    # a machine without nvidia-cutlass-dsl, or no native library) says why for compute capability 12.1
    want_121 = "sm_121a" if sm120_fp4.kernels_linked()[0] else "compute capability 12.1"
    assert want_121 in reasons["cuda (cc 12.1)"], reasons
    assert all(k["ran_on_sm120"] == "no" for k in sm["kernels"]) and len(sm["kernels"]) == 7
    # what this install holds is said per install, never the CI's claim (a build without the kernels says why)
    linked, why = sm120_fp4.kernels_linked()
    for k in sm["kernels"]:
        assert k["in_this_library"].startswith("yes: sm_120a") if linked else k["in_this_library"] == f"no: {why}"
        if not linked:
            assert k["first_use_selftest"] != "yes", k
