"""CPU checks of the Triton low-bit grouped GLU (path "triton-lowbit").

The kernels run under Triton's interpreter in fp32 (the interpreter is trusted for fp32 dots only,
design.md section 5) in ONE subprocess (TRITON_INTERPRET must be set before Triton is imported, and
other tests in this process may already have imported it): ``tools/triton_lowbit_interp_check.py``
writes the relative errors of every case, forward and all seven gradients, against ``tsct.reference``
on the dequantized factors; the tests below assert on them. Plus pure-Python checks of ``status`` (the
argument checks of ``masters`` are the front door's: tests/ops/test_lowbit_ops.py). About 40 s.
"""

from __future__ import annotations

import pytest

import _interp

pytest.importorskip("triton")

CASES = ["nvfp4_basic", "sign_basic", "sign_r64", "nvfp4_r64",
         "nvfp4_nogs", "sign_nogs_f64_multitile", "sign_nogs_noscales", "mixed_ns_d", "mixed_dd_n",
         "empty_one_multitile", "nvfp4_d80_r48", "sign_d72_r24", "nvfp4_r144_multik", "swizzled_nvfp4",
         "f5461_sign_nvfp4", "fp8_basic", "fp8_d37_r20_nogs", "fp8_r64_f5461", "ternary_basic", "ternary_r1_d72_r24",
         "ternary_r144_multik", "mixed_f8_t_n", "mixed_t1_d_f8"]


def _run_interp(tmp_path_factory, name: str, cfg: str = "", cases=()) -> dict:
    """The interpreter check with the Triton GLU config override ``cfg`` (TSCT_TRITON_GLU_CFG) on ``cases`` (all
    when empty) -> its JSON."""
    out = tmp_path_factory.mktemp(name) / "res.json"
    return _interp.run_json("tools/triton_lowbit_interp_check.py", out, *cases, cfg=cfg)


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    return _run_interp(tmp_path_factory, "lowbit")


# lowbit_bwd_dx_dw with several d blocks per program across several programs (partial groups at the end of d),
# for NVFP4, sign, fp8, ternary and mixed factors; the default tiles cover d <= 512 in one program
NDB_CFG = "bd_bwd=16,ndb_dxdw_lb=3,ndb_dxdw_sign_lb=2"
NDB_CASES = ["nvfp4_d80_r48", "sign_d72_r24", "empty_one_multitile", "mixed_ns_d", "nvfp4_basic", "ternary_r1_d72_r24",
             "fp8_d37_r20_nogs"]


@pytest.fixture(scope="module")
def interp_ndb(tmp_path_factory):
    return _run_interp(tmp_path_factory, "lowbit_ndb", NDB_CFG, NDB_CASES)


# lowbit_up_fwd and lowbit_down_fwd in byte planes (LowbitTiles.planes_up_lb: on for sm_120; planes_down_lb: an opt-in):
# aligned r in 33..64 for the up kernel; empty experts, a two-tile expert, padding rows, odd f (37, 70, 5461), a last K
# step of 16 (d = 80, NVFP4) and of 8 (d = 72, sign) in the planes of 64, NVFP4 gate with sign up
PLANES_CFG = "planes_up_lb=1,planes_down_lb=1"
PLANES_CASES = ["nvfp4_d80_r48", "sign_r64", "nvfp4_r64", "mixed_ns_d", "sign_d72_r24"]


@pytest.fixture(scope="module")
def interp_planes(tmp_path_factory):
    return _run_interp(tmp_path_factory, "lowbit_planes", PLANES_CFG, PLANES_CASES)


# lowbit_bwd_dz running the GLU backward itself (one f slice, no glu_bwd_epi; the default tiles do so on NVFP4 w_down
# only from 768 row tiles and r 64, so not on these small cases): every case's w_down NVFP4; scales and row weights
# present and absent, an empty expert, f 5461, r 48 (masked ranks), r 144 (three rank blocks: d row_weight summed
# over them), padding rows
FUSED_CFG = "fuse_tiles_lb=1,fuse_rank_lb=1"
FUSED_CASES = ["nvfp4_basic", "nvfp4_r64", "nvfp4_nogs", "mixed_dd_n", "nvfp4_d80_r48", "nvfp4_r144_multik",
               "f5461_sign_nvfp4"]


@pytest.fixture(scope="module")
def interp_fused(tmp_path_factory):
    return _run_interp(tmp_path_factory, "lowbit_fused", FUSED_CFG, FUSED_CASES)


# (config override, cases, gradients that must be present) of the runs with an override
OVERRIDES = {"ndb": (NDB_CFG, NDB_CASES, ("x", "w_gate")),
             "planes": (PLANES_CFG, PLANES_CASES, ("fwd", "x", "w_gate", "w_up", "w_down")),
             "fused": (FUSED_CFG, FUSED_CASES, ("x", "w_gate", "w_up", "w_down", "s_gate", "row_weight"))}


def test_glu_backward_fused_only_where_the_table_says(interp, interp_fused):
    """The default run (f-slice partials summed by glu_bwd_epi) launches the epilogue; the fused run never does (the
    cases above check both against the reference)."""
    assert interp["launches"].get("glu_bwd_epi", 0) > 0, interp["launches"]
    assert interp_fused["launches"].get("lowbit_bwd_dz", 0) > 0
    assert interp_fused["launches"].get("glu_bwd_epi", 0) == 0, interp_fused["launches"]


@pytest.mark.parametrize("which,case", [(w, c) for w, (_, cases, _) in OVERRIDES.items() for c in cases])
def test_interpreter_case_with_override(request, which, case):
    cfg, _, keys = OVERRIDES[which]
    res = request.getfixturevalue(f"interp_{which}")
    errs = res["results"][case]
    bad = {k: v for k, v in errs.items() if not v < res["tol"]}
    assert not bad, f"{case} with {cfg}: {bad}"
    assert all(k in errs for k in keys), sorted(errs)


def test_case_list_matches(interp):
    assert set(CASES) <= set(interp["results"])


@pytest.mark.parametrize("case", CASES)
def test_interpreter_case(interp, case):
    errs = interp["results"][case]
    tol = interp["tol"]
    bad = {k: v for k, v in errs.items() if not v < tol}
    assert not bad, f"{case}: {bad} (tol {tol})"
    for key in ("fwd", "x", "w_gate", "w_up", "w_down", "dx_only"):
        assert key in errs, f"{case}: {key} not checked"


def test_decoders_exhaustive(interp):
    res = interp["results"]["decode_exhaustive"]
    assert res["mismatch"] == 0.0          # E2M1, E4M3 and ternary element decoders, every byte
    assert res["tile_fp32"] == 0.0         # the NVFP4 tile decoder, every code at every position and scale
    assert res["tile_ternary_bf16"] == 0.0  # the ternary bf16 pair decoder (bit moves only: the interpreter is exact)


def test_nan_codes(interp):
    """fp8 / ternary NaN codes decode to NaN in the kernels exactly where the reference's decode puts them."""
    errs = interp["results"]["nan_codes"]
    assert set(errs) == {"fp8", "ternary", "ternary_r1"}
    assert all(v < interp["tol"] for v in errs.values()), errs


@pytest.mark.parametrize("which", ["custom_op", "custom_op_fp8_ternary"])
def test_custom_op_runs_the_kernels(interp, which):
    """tsct::grouped_glu with impl="triton-lowbit": containers rebuilt in the op, masters' STE grads."""
    errs = interp["results"][which]
    assert errs.pop("op_tags_ok") == 0.0
    assert set(errs) == {"op_fwd", "op_x", "op_master_gate", "op_master_down", "op_s_gate", "op_row_weight"}
    assert all(v < interp["tol"] for v in errs.values()), errs


def test_swizzled_conversion_counted(interp):
    assert interp["conversions"].get("w_gate", 0) > 0


@pytest.fixture
def no_cubins(monkeypatch, tmp_path):
    """An install without AOT cubins (whatever this one ships)."""
    from tsct.kernels import aot

    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    aot._reset_for_tests()
    yield
    aot._reset_for_tests()


def test_status(no_cubins):
    from tsct.kernels import triton_lowbit as TL

    assert not TL.status(None, "nvfp4")[0]
    assert not TL.status((7, 5), "nvfp4")[0]
    assert not TL.status((9, 0), "fp32")[0]
    ok, why = TL.status((9, 0), "nvfp4")
    assert ok and why == "Triton JIT"
    assert TL.status((12, 0), "sign") == (True, "Triton JIT")


def test_status_refuses_aot(monkeypatch, no_cubins):
    from tsct.kernels import triton_lowbit as TL

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    ok, why = TL.status((9, 0), "nvfp4")
    assert not ok and "AOT" in why
