"""CPU checks of the W4A4 Triton kernels (issue 4 item 2): interpreter runs of the quantizer (bit-exact to
the 0002 recipe per row), the grouped NVFP4 x NVFP4 down-projection (against the torch model of its math:
hg, hu, z), the up-projection (likewise, and quantize-then-multiply), the whole W4A4 pass with its STE
backward through autograd (against the torch models, tight, and the fp32 reference on dequantized factors,
loose), the variant table, and the sm_120 / sm_90a compiles with Triton 3.9 from the CPU: every sm_120
(sm_120f) cubin of both GEMM kernels must hold OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X, the sm_90a ones compile
to the bf16 HGMMA emulation. About 2 minutes (interpreter ~1 min, AOT build of 204 cubins ~1-3 min)."""

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


def test_down_projection_matches_model(interp):
    """w4a4_down_fwd (token-major quantizer + gathered codes) vs the torch model of its math: hg / hu exact
    products (fp32 accumulation order only), z through fp32 sigmoid; empty and one-row experts, r = 144 (three
    rank blocks), d = 48 / 80 (not multiples of 64: the K tail of a 128-element step is masked), bf16 x."""
    cases = [r for n, r in interp.items() if n.startswith("down_")]
    assert len(cases) == 5
    for r in cases:
        assert r["ok"], r
        assert r["same_nonfinite"], r
        if r["name"] != "down_bf16":
            assert max(r["rel_err_hg"], r["rel_err_hu"], r["rel_err_z"], r["rel_err_zw"]) < 1e-6, r


def test_down_projection_nan_inf_rows(interp):
    """A nan or an inf in a token's x row poisons exactly the routed rows that read it (its NVFP4 block gets
    the NaN block scale 0x7F, as decision 0002 says), like the model; the other rows stay finite and exact."""
    r = interp["down_nan_inf_rows"]
    assert r["ok"] and r["nonfinite_rows"] >= 2 and r["same_nonfinite"], r


def test_full_pass_forward_and_ste_backward(interp):
    """grouped_glu (autograd) = W4A4 down -> quantize z -> W4A4 up -> combine, and the STE backward on the
    low-bit kernels. Tight: forward vs the quantize-then-multiply model (<= 1e-2 max-rel; in these seeds every
    row within 1e-5), all seven gradients vs the fp64 STE model (<= 1e-5). Loose, vs the fp32 reference on the
    dequantized factors: 4-bit activations at both GEMMs (x rows and z rows, each ~9-10 % relative RMS error
    per element) give ~15-20 % Frobenius error; bounded above by 0.3 and below by 1e-3 (quantization happened)."""
    cases = [r for n, r in interp.items() if n.startswith("full_")]
    assert len(cases) == 3
    for r in cases:
        assert r["ok"], r
        assert r["fwd_rel_err"] <= 1e-2 and max(r["bwd_rel_err"].values()) <= 1e-5, r
        assert r["empty_expert_grads_zero"] and r["finite"], r
        assert 1e-3 < r["vs_ref_fro_rel"] < 0.3 and r["vs_ref_max_rel"] < 0.4, r


def test_errors_name_the_argument(interp):
    m = interp["errors_named"]["messages"]
    assert interp["errors_named"]["ok"], m
    assert m["dense_w_up"].startswith("w_up must be an NVFP4Tensor")
    assert "40 must be a multiple of 16" in m["d_40"]


def test_runnable_only_from_cubins(monkeypatch, tmp_path):
    import json as _json

    from tsct.kernels import aot
    from tsct.kernels.triton_w4a4 import w4a4

    for arch, fams in (("sm_90a", ["glu", "w4a4"]), ("sm_120", ["glu", "w4a4"]), ("sm_100a", ["glu"])):
        (tmp_path / arch).mkdir()
        kern = {"k": {"kernel": "w4a4_down_fwd"}} if "w4a4" in fams else {"k": {"kernel": "glu_up_fwd"}}
        (tmp_path / arch / "index.json").write_text(_json.dumps({"arch": arch, "families": {f: {} for f in fams},
                                                                 "kernels": kern}))
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
        # an install whose W4A4 cubins predate the down kernel (up-projection and quantizer only)
        (tmp_path / "sm_90a" / "index.json").write_text(_json.dumps({"families": {"w4a4": {}},
                                                                     "kernels": {"k": {"kernel": "w4a4_up_fwd"}}}))
        aot._reset_for_tests()
        ok, why = w4a4.runnable((9, 0))
        assert not ok and "predate the W4A4 down kernel" in why
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
        assert len(specs) == 102 and len({s.key for s in specs}) == 102
        # fp32 activations (the exact GPU checks quantize an fp32 z) as well as bf16 / fp16
        quant_in = {dict(s.types)["x_ptr"] for s in specs if s.kernel == "nvfp4_quant_rows"}
        up_out = {dict(s.types)["y_ptr"] for s in specs if s.kernel == "w4a4_up_fwd"}
        down = [s for s in specs if s.kernel == "w4a4_down_fwd"]
        z_out = {dict(s.types)["z_ptr"] for s in down}
        assert quant_in == up_out == z_out == {"*bf16", "*fp16", "*fp32"}
        assert len(down) == 72
        # the down kernel reads NVFP4 codes + UE4M3 scales for x and both factors, scales fp32, indices int64
        t = dict(down[0].types)
        assert (t["xc_ptr"], t["xs_ptr"], t["gc_ptr"], t["gs_ptr"], t["us_ptr"]) == ("*u8", "*fp8e4nv", "*u8",
                                                                                      "*fp8e4nv", "*fp8e4nv")
        assert {dict(s.types)["gidx_ptr"] for s in down} == {"*i64", "*i8"}
        c = dict(down[0].constexprs)
        assert c["BK"] == S.CONFIGS[arch].bk_down == 64 and c["BR"] == 64 and c["BM"] == 64
    assert S.PTX_ARCH["sm_120"] == (120, "sm_120f") and S.AOT_ARCHS == ("sm_90a", "sm_120")
    from tsct.kernels.triton_glu import specs as G
    assert not set(S.KERNELS) & set(G.KERNELS)  # keys cannot collide: one index per arch for both families
    # one key format / Spec / limits for every family (W4A4 keeps only its own tables)
    assert S.Spec is G.Spec and S.KernelInfo is G.KernelInfo and S.MAX_SHARED is G.MAX_SHARED
    assert S.TRITON_VERSION == G.TRITON_VERSION and S.DTYPE_TYPES["float8_e4m3fn"] == "*fp8e4nv"
    s0 = next(S.enumerate_specs("sm_120"))
    assert s0.key == S.spec_key(s0.kernel, dict(s0.types), dict(s0.constexprs), s0.num_warps, s0.num_stages,
                                s0.aligned)


def _cuobjdump():
    import shutil
    exe = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if exe is None:
        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        exe = str(cand) if cand.is_file() else None
    return exe


def sass_ops(cubin: Path) -> dict:
    """{mnemonic with modifiers: count} and the "code for" arch of one cubin (cuobjdump -sass)."""
    import collections
    import re
    text = subprocess.run([_cuobjdump(), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", text, re.M))
    arch = re.findall(r"code for (sm_\w+)", text)
    return {"ops": dict(ops), "code_for": arch[0] if arch else None}


@pytest.mark.skipif(triton.__version__ != "3.9.0", reason="the AOT build is pinned to Triton 3.9.0")
def test_aot_build_and_sass(tmp_path):
    """The whole W4A4 table for sm_90a and sm_120 (204 cubins, 1-3 min with 2 jobs), then cuobjdump: every
    GEMM cubin (up: SASS_RULES via --check-sass; down: disassembled here, the rules table of
    tsct.native.artifacts does not cover it yet) holds the arch's MMA."""
    if _cuobjdump() is None:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    out = tmp_path / "aot"
    p = subprocess.run([sys.executable, str(PKG / "aot_build.py"), "--out", str(out), "--jobs", "2", "--check-sass"],
                       capture_output=True, text=True, timeout=1500, env=dict(os.environ, TRITON_DEFAULT_FP_FUSION="1"))
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
        downs = [k for k, e in idx["kernels"].items() if e["kernel"] == "w4a4_down_fwd"]
        assert len(downs) == 72
        for k in downs:
            ent = idx["kernels"][k]
            s = sass_ops(out / arch / ent["file"])
            assert s["code_for"] == code_for and ent["ptx_arch"] == ("sm_120f" if arch == "sm_120" else "sm_90a")
            # sm_90a: 8 warps split the 64x64 tile into two warpgroups of N 32 (HGMMA.64x32x16.F32.BF16)
            mma = need if arch == "sm_120" else "HGMMA.64x32x16.F32.BF16"
            assert s["ops"].get(mma, 0) > 0, (arch, k, {o: n for o, n in s["ops"].items() if "MMA" in o})
            if arch == "sm_120":  # native block-scaled MMA only, no bf16 fallback
                assert not any(o.startswith("HMMA") for o in s["ops"]), (k, s["ops"])
            assert not any(o.startswith(("STL", "LDL")) for o in s["ops"]), (arch, k, "local-memory spill")


@pytest.mark.parametrize("z_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_test_launch_has_an_aot_variant(monkeypatch, z_dtype, out_dtype):
    """Dry run of w4a4.py's host code (CPU tensors, sm_90a / sm_120 capability, launches recorded): the
    launches of tests/gpu/test_triton_w4a4_gpu.py find a variant in the table (the H200 run of
    2026-11-29 failed for want of the fp32 quantizer variant)."""
    from tsct import quant
    from tsct.kernels import aot, launch
    from tsct.kernels.triton_glu import glu as G
    from tsct.kernels.triton_glu import specs as GS
    from tsct.kernels.triton_w4a4 import w4a4

    S = _specs()
    found, missing = [], []

    class Rec:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            found.append(self.key.split("|")[0])

    for cap in ((9, 0), (12, 0)):
        arch = aot.artifact_arch(cap)
        # the tile map is the bf16 family's tile_cum kernel
        table = {s.key for s in S.enumerate_specs(arch)} | {s.key for s in GS.enumerate_specs(arch)}
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
        monkeypatch.setattr(aot, "kernel", lambda a, key: Rec(key) if key in table else missing.append(key))
        monkeypatch.setattr(w4a4, "_capability", lambda dev: cap)
        monkeypatch.setattr(G, "_capability", lambda dev: cap)
        monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
        for E, r, f, counts in ((4, 64, 37, [10, 0, 70, 1]), (3, 144, 45, [5, 66, 9]), (2, 16, 20, [3, 4])):
            m = sum(counts) + 3
            z = torch.randn(m, r).to(z_dtype)
            zq = w4a4.quantize_rows(z)
            w = quant.quantize_nvfp4(torch.randn(E, r, f), backend="torch")
            offs = torch.tensor(counts).cumsum(0).to(torch.int32)
            w4a4.up_forward(zq, offs, w, torch.rand(m), out_dtype=out_dtype)
    assert not missing, missing[:2]
    # per call: the quantizer (quantize_rows), the tile map and the up kernel; 3 shapes x 2 arches
    assert sorted(found) == sorted(["nvfp4_quant_rows", "tile_cum", "w4a4_up_fwd"] * 6)



@pytest.mark.parametrize("cap", [(9, 0), (12, 0)])
def test_every_gpu_test_launch_of_the_full_pass_has_an_aot_variant(monkeypatch, cap):
    """Dry run (CPU tensors, capability patched, launches recorded) of the down-kernel and whole-pass launches of
    tests/gpu/test_triton_w4a4_gpu.py (bf16 / fp32 down with and without gather and saving; the bf16 pass with
    gather, scatter, masters and the full backward; b1 dims): every launch finds a variant in the tables the AOT
    build compiles: this family's (W4A4 down, quantizer, up), the bf16 family's weight-free kernels (combine,
    GLU backward epilogue, padding) and the low-bit family's backward kernels (dz, dx/dw on NVFP4)."""
    from tsct import quant
    from tsct.kernels import aot, launch
    from tsct.kernels.triton_glu import glu as G
    from tsct.kernels.triton_glu import specs as GS
    from tsct.kernels.triton_lowbit import specs as LS
    from tsct.kernels.triton_w4a4 import w4a4

    S = _specs()
    arch = aot.artifact_arch(cap)
    table = ({s.key for s in S.enumerate_specs(arch)} | {s.key for s in GS.enumerate_specs(arch)}
             | {s.key for s in LS.enumerate_specs(arch)})
    found, missing = [], []

    class Rec:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            assert all(int(g) >= 0 for g in grid), (self.key, grid)
            found.append(self.key.split("|")[0])

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(aot, "kernel", lambda a, key: Rec(key) if key in table else missing.append(key))
    monkeypatch.setattr(aot, "index", lambda a: {"kernels": {}})
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(w4a4, "_capability", lambda dev: cap)
    monkeypatch.setattr(G, "_capability", lambda dev: cap)

    def nv(*shape):
        return quant.quantize_nvfp4(torch.randn(*shape), backend="torch")

    for E, d, r, counts, T in ((4, 2048, 64, [10, 0, 70, 1], 50), (3, 80, 144, [5, 66, 9], 0)):
        m = sum(counts) + 3
        offs = torch.tensor(counts).cumsum(0).to(torch.int32)
        wg, wu = nv(E, d, r), nv(E, d, r)
        for dt, save in ((torch.float32, False), (torch.bfloat16, True), (torch.float32, True)):
            x = torch.randn(T or m, d).to(dt)
            gidx = torch.randint(0, T, (m,)) if T else None
            w4a4.down_forward(x, offs, wg, wu, torch.ones(E, r), torch.ones(E, r), gidx, torch.rand(m), save=save)
    for T, k, E, d, r, f in ((64, 2, 8, 2048, 64, 5461), (40, 2, 6, 80, 32, 37)):
        m = T * k
        offs = torch.bincount(torch.arange(m) % E, minlength=E).cumsum(0).to(torch.int32)
        tok = torch.randperm(m) // k
        x = torch.randn(T, d).to(torch.bfloat16)
        wg, wu, wd = nv(E, d, r), nv(E, d, r), nv(E, r, f)
        sg, su, rw = torch.ones(E, r), torch.ones(E, r), torch.rand(m)
        out, saved = w4a4.grouped_glu_forward_saved(x, offs, wg, wu, wd, sg, su, rw, tok, tok, T)
        w4a4.grouped_glu_backward(torch.randn(T, f).to(torch.bfloat16), x, offs, wg, wu, wd, sg, su, rw, tok, tok, T,
                                  [True] * 7, saved)
    assert not missing, missing[:3]
    assert {"w4a4_down_fwd", "nvfp4_quant_rows", "w4a4_up_fwd", "combine_rows", "lowbit_bwd_dz", "glu_bwd_epi",
            "lowbit_bwd_dx_dw"} <= set(found)
