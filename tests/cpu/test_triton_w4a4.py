"""CPU checks of the W4A4 Triton kernels (issue 4 item 2): interpreter runs of the quantizer (bit-exact to
the 0002 recipe per row) and of the grouped NVFP4 x NVFP4 up-projection (against the torch model of its
math and the quantize-then-multiply emulation), the variant table, and the sm_120 / sm_90a compiles with
Triton 3.9 from the CPU: the sm_120 (sm_120f) cubin must hold OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X, the
sm_90a one compiles to the bf16 HGMMA emulation. About 30 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "tsct" / "kernels" / "triton_w4a4"


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    out = tmp_path_factory.mktemp("w4a4") / "res.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "python") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tsct.kernels.triton_w4a4._interp_check", "--json", str(out)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if not out.exists():
        pytest.fail(f"interpreter check crashed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return {r["name"]: r for r in json.loads(out.read_text())}


def test_quantizer_bit_exact(interp):
    q = [r for n, r in interp.items() if n.startswith("quant_")]
    assert len(q) == 4
    for r in q:
        assert r["codes_equal"] and r["scales_equal"] and r["senc_equal"], r


def test_up_projection_matches_model(interp):
    for n, r in interp.items():
        if n.startswith("up_"):
            assert r["ok"], r
            assert r["tail_zero"], r


def test_quantize_then_multiply(interp):
    r = interp["glu_d128_r64_f70"]
    assert r["ok"], r
    # z quantized to 4 bits costs accuracy against the unquantized latent: bounded, not tiny
    assert 1e-3 < r["rel_err_vs_unquantized_z"] < 0.25, r


def test_forward_pass_of_the_bench_arm(interp):
    """w4a4.glu_forward: low-bit down kernel + row quantizer + W4A4 up + combine, gather and scatter."""
    r = interp["pass_gather_scatter_d64_r32_f37"]
    assert r["ok"] and r["rel_err"] < 1e-2, r


def test_runnable_only_from_cubins(monkeypatch, tmp_path):
    import json as _json

    from tsct.kernels import aot
    from tsct.kernels.triton_w4a4 import w4a4

    for arch, fams in (("sm_90a", ["glu", "w4a4"]), ("sm_120", ["glu", "w4a4"]), ("sm_100a", ["glu"])):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "index.json").write_text(_json.dumps({"arch": arch, "families": {f: {} for f in fams},
                                                                 "kernels": {"k": {}}}))
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    aot._reset_for_tests()
    try:
        ok, why = w4a4.runnable((9, 0))
        assert ok and why.startswith("emulated (sm_90): ")
        ok, why = w4a4.runnable((12, 1))
        assert ok and why.startswith("native (sm_120f")
        assert w4a4.runnable((10, 0)) == (False, "not runnable: the W4A4 kernels ship cubins for sm_90a, sm_120 "
                                                 "only (compute capability 10.0)")
        assert w4a4.runnable(None) == (False, "not runnable: needs a CUDA GPU")
        (tmp_path / "sm_90a" / "index.json").write_text(_json.dumps({"families": {"glu": {}}, "kernels": {"k": {}}}))
        aot._reset_for_tests()
        assert w4a4.runnable((9, 0)) == (False, "not runnable: this install has no W4A4 cubins for sm_90a")
    finally:
        aot._reset_for_tests()


def test_interpreter_e4m3_scale_bug_is_patched_only_for_fp8():
    """Documents the Triton 3.9 interpreter behaviour the patch works around (run in a subprocess)."""
    code = r"""
import os; os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, triton.language as tl
from triton.runtime import interpreter as I
class H:  # a scale handle as the interpreter holds it
    def __init__(s, data, dtype): s.data, s.dtype = data, dtype
raw = np.array([0x38], dtype=np.uint8)  # UE4M3 1.0
print(float(I._dot_scaled_scale_to_f32(H(raw, tl.float8e4nv), tl.bfloat16)[0]))
from tsct.kernels.triton_w4a4.emulation import patch_interpreter_e4m3_scales
patch_interpreter_e4m3_scales()
print(float(I._dot_scaled_scale_to_f32(H(raw, tl.float8e4nv), tl.bfloat16)[0]))
print(float(I._dot_scaled_scale_to_f32(H(np.array([127], dtype=np.uint8), tl.uint8), tl.bfloat16)[0]))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    vals = [float(v) for v in out.stdout.split()]
    assert vals[0] == 2.0 ** -71  # unpatched: UE4M3 0x38 (1.0) read as E8M0 (bits << 23): 2^(56-127)
    assert vals[1] == 1.0                      # patched: UE4M3
    assert vals[2] == 1.0                      # E8M0 127 = 2^0 unchanged


def _specs():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_w4a4_specs_t", PKG / "specs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_w4a4_specs_t"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_variant_table():
    S = _specs()
    for arch in ("sm_90a", "sm_120"):
        specs = list(S.enumerate_specs(arch))
        assert len(specs) == 30 and len({s.key for s in specs}) == 30
        # fp32 activations (the exact GPU checks quantize an fp32 z) as well as bf16 / fp16
        quant_in = {dict(s.types)["x_ptr"] for s in specs if s.kernel == "nvfp4_quant_rows"}
        up_out = {dict(s.types)["y_ptr"] for s in specs if s.kernel == "w4a4_up_fwd"}
        assert quant_in == up_out == {"*bf16", "*fp16", "*fp32"}
    assert S.PTX_ARCH["sm_120"] == (120, "sm_120f") and S.AOT_ARCHS == ("sm_90a", "sm_120")
    from tsct.kernels.triton_glu import specs as G
    assert not set(S.KERNELS) & set(G.KERNELS)  # keys cannot collide: one index per arch for both families
    # one key format / Spec / limits for every family (W4A4 keeps only its own tables)
    assert S.Spec is G.Spec and S.KernelInfo is G.KernelInfo and S.MAX_SHARED is G.MAX_SHARED
    assert S.TRITON_VERSION == G.TRITON_VERSION and S.DTYPE_TYPES["float8_e4m3fn"] == "*fp8e4nv"
    s0 = next(S.enumerate_specs("sm_120"))
    assert s0.key == S.spec_key(s0.kernel, dict(s0.types), dict(s0.constexprs), s0.num_warps, s0.num_stages,
                                s0.aligned)


@pytest.mark.skipif(triton.__version__ != "3.9.0", reason="the AOT build is pinned to Triton 3.9.0")
def test_aot_build_and_sass(tmp_path):
    """The whole W4A4 table for sm_90a and sm_120 (60 cubins, ~30 s with 4 jobs), then cuobjdump."""
    out = tmp_path / "aot"
    p = subprocess.run([sys.executable, str(PKG / "aot_build.py"), "--out", str(out), "--jobs", "4", "--check-sass"],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, TRITON_DEFAULT_FP_FUSION="1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for arch, need, code_for in (("sm_120", "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", "sm_120"),
                                 ("sm_90a", "HGMMA.64x64x16.F32.BF16", "sm_90a")):
        idx = json.loads((out / arch / "index.json").read_text())
        sass = json.loads((out / arch / "sass_summary.json").read_text())
        ups = [k for k, e in idx["kernels"].items() if e["kernel"] == "w4a4_up_fwd"]
        assert len(ups) == 24  # 3 output dtypes x row weight x single/multi K x aligned/generic
        for k in ups:
            assert sass[k]["ops"].get(need, 0) > 0, (arch, k, sass[k]["ops"])
            assert sass[k]["code_for"] == code_for
            assert idx["kernels"][k]["ptx_arch"] == ("sm_120f" if arch == "sm_120" else "sm_90a")
        if arch == "sm_90a":  # the emulation: UE4M3 -> f16 -> bf16, e2m1 decode, scale multiply in bf16x2
            k = ups[0]
            assert sass[k]["ops"].get("F2FP.F16.E4M3.UNPACK_B", 0) > 0 and sass[k]["ops"].get("HMUL2.BF16_V2", 0) > 0


@pytest.mark.parametrize("z_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_test_launch_has_an_aot_variant(monkeypatch, z_dtype, out_dtype):
    """Dry run of w4a4.py's host code (CPU tensors, sm_90a / sm_120 capability, launches recorded): the
    launches of tests/gpu/test_triton_w4a4_gpu.py find a variant in the table (the H200 run of
    2026-11-29 failed for want of the fp32 quantizer variant)."""
    from tsct import quant
    from tsct.kernels import aot
    from tsct.kernels.triton_w4a4 import w4a4

    S = _specs()
    found, missing = [], []

    class Rec:
        def launch(self, grid, values, stream):
            found.append(grid)

    for cap in ((9, 0), (12, 0)):
        table = {s.key for s in S.enumerate_specs(aot.artifact_arch(cap))}
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
        monkeypatch.setattr(aot, "kernel", lambda arch, key: Rec() if key in table else missing.append(key))
        monkeypatch.setattr(w4a4, "_capability", lambda dev: cap)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 0})())
        for E, r, f, counts in ((4, 64, 37, [10, 0, 70, 1]), (3, 144, 45, [5, 66, 9]), (2, 16, 20, [3, 4])):
            m = sum(counts) + 3
            z = torch.randn(m, r).to(z_dtype)
            zq = w4a4.quantize_rows(z)
            w = quant.quantize_nvfp4(torch.randn(E, r, f), backend="torch")
            offs = torch.tensor(counts).cumsum(0).to(torch.int32)
            w4a4.up_forward(zq, offs, w, torch.rand(m), out_dtype=out_dtype)
    assert not missing, missing[:2]
    assert len(found) == 12

