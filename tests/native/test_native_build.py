"""The native library as built and installed, checked on a machine without a GPU.

* the install: manifest.json lists sm_90a / sm_120a and the kernels (no sm_100a SASS by default: compute_80 PTX); the .so loads with
  ctypes, has ABI version _loader.ABI_VERSION, exports exactly the C functions of tsct.h; build info == manifest;
  cuobjdump agrees with the manifest, for the library and the Triton AOT cubins (tsct.native.artifacts.verify,
  also ci/check_artifacts.py; skipped without cuobjdump), and tampered copies of the cubin tree are caught;
* lazy loading: importing tsct / tsct.native loads no library and initialises no CUDA;
* argument checking without a GPU: the C entry points (TSCT_ERR_BAD_ARGUMENT + detail) and the
  Python wrappers (TypeError / ValueError naming the argument);
* the kernels' arithmetic: csrc/quant/quant_impl.cuh (the per-item code the CUDA kernels run) is
  compiled for the host (csrc/tools/host_reference.cpp) and compared bit for bit with the torch
  reference tsct.quant on the case matrix of tests/_native_cases.py. The GPU run of the same
  comparison is tests/native/test_native_quant_gpu.py.

A missing library fails these tests (the wheel must ship it); set TSCT_EXPECT_NATIVE=0 for an
install built with TSCT_BUILD_CUDA=OFF, which skips them instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tsct
import tsct.native as native
from tsct.native import _loader
import _native_cases as T
from tsct.quant import quantize_fp8

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "csrc" / "include" / "tsct" / "tsct.h"
REQUIRED_TARGETS = ("sm_80", "compute_80", "sm_90a", "sm_120a")
KERNELS = {f"tsctk_{op}_{dt}" for op in ("nvfp4_quantize", "nvfp4_dequantize", "sign_pack", "sign_dequantize",
                                         "fp8_quantize", "fp8_dequantize", "ternary_pack", "ternary_dequantize",
                                         "nvfp4_rows_amax", "nvfp4_rows_quantize")
           for dt in ("f32", "bf16", "f16")} | {"tsctk_nvfp4_rows_finalize", "tsctk_glu_bwd_dz_bf16"} | {
    f"tsctk_glu_{op}_fwd_{fmt}" for op in ("down", "up") for fmt in ("nvfp4", "sign", "fp8", "ternary", "ternary_r1")}
BAD_ARGUMENT = -1


@pytest.fixture(scope="module")
def lib_path() -> str:
    path = native.library_path()
    if path is None or not native.available():
        why = native.load_error()
        if os.environ.get("TSCT_EXPECT_NATIVE", "1") == "0":
            pytest.skip(f"native library not available (TSCT_EXPECT_NATIVE=0): {why}")
        pytest.fail(f"native library not available: {why}. Install with `pip install .` (needs nvcc), "
                    "or set TSCT_EXPECT_NATIVE=0 for a TSCT_BUILD_CUDA=OFF install.")
    return path


@pytest.fixture(scope="module")
def lib(lib_path) -> ctypes.CDLL:
    return _loader.get_lib()


# --- the install -------------------------------------------------------------------------------
def test_manifest_lists_targets_and_kernels(lib_path):
    m = native.manifest()
    assert m is not None, f"no manifest.json next to {lib_path}"
    assert m["version"] == tsct.__version__
    assert m["abi_version"] == _loader.ABI_VERSION
    for target in REQUIRED_TARGETS:
        assert target in m["gencodes"], f"{target} missing from manifest gencodes {m['gencodes']}"
    assert set(m["kernels"]) == set(m["gencodes"])
    for target, names in m["kernels"].items():
        assert set(names) == KERNELS, f"{target}: kernels {sorted(names)}"
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", m["nvcc_version"]), m["nvcc_version"]


def test_ctypes_load_and_abi_version(lib_path):
    raw = ctypes.CDLL(lib_path)  # independent of tsct.native's loader
    raw.tsct_abi_version.restype = ctypes.c_int
    assert raw.tsct_abi_version() == _loader.ABI_VERSION


def _header_functions() -> set[str]:
    return set(re.findall(r"^TSCT_API\s+[\w\s\*]+?\b(tsct_\w+)\s*\(", HEADER.read_text(), re.M))


@pytest.mark.skipif(not HEADER.is_file(), reason="needs the source tree (csrc/include/tsct/tsct.h)")
def test_exports_exactly_the_c_abi(lib_path):
    declared = _header_functions()
    assert "tsct_nvfp4_quantize" in declared and len(declared) >= 9
    raw = ctypes.CDLL(lib_path)
    for name in declared:
        assert hasattr(raw, name), f"{name} declared in tsct.h but not exported"
    assert set(_loader._SIGNATURES) == declared, "tsct/native/_loader.py signatures out of sync with tsct.h"
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found: exported-symbol set not checked")
    out = subprocess.run([nm, "-D", "--defined-only", lib_path], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    assert exported == declared, f"unexpected exports: {sorted(exported - declared)}; missing: {sorted(declared - exported)}"


def test_build_info_matches_manifest(lib_path):
    info = native.build_info()
    assert info == native.manifest()
    assert info["library"] == os.path.basename(lib_path)


@pytest.mark.skipif(not (REPO / "csrc" / "quant").is_dir(), reason="needs the source tree")
def test_kernel_registry_matches_manifest(lib_path):
    names = set()
    for src in (REPO / "csrc").glob("*/*.cu"):
        text = src.read_text()
        names |= set(re.findall(r'\{"(tsctk_\w+)",', text))
        # TSCT_KERNEL_ENTRIES(op): the rows of tsctk_<op>_f32 / _bf16 / _f16 (csrc/quant/entry.cuh)
        names |= {f"tsctk_{op}_{dt}" for op in re.findall(r"\bTSCT_KERNEL_ENTRIES\((\w+)\)", text)
                  for dt in ("f32", "bf16", "f16")}
    assert names == KERNELS  # tsct_kernel_available's table names every kernel the library holds


def test_kernel_smem_bytes(lib_path):
    """The shared memory each entry point launches its kernel with comes from the library's registry (the
    dispatch compares it with the device's opt-in maximum): the values tsct.h documents for the GLU kernels, 0 for
    the grid-stride quant kernels; an unknown name is an error naming it."""
    documented = {"tsctk_glu_bwd_dz_bf16": 101376,
                  "tsctk_glu_down_fwd_nvfp4": 71680, "tsctk_glu_down_fwd_sign": 71680,
                  "tsctk_glu_up_fwd_nvfp4": 53248, "tsctk_glu_up_fwd_sign": 53248,
                  "tsctk_glu_down_fwd_fp8": 67584, "tsctk_glu_up_fwd_fp8": 57088,
                  # the two ternary scalings take the same shared memory (the dispatch checks one name for both)
                  "tsctk_glu_down_fwd_ternary": 75776, "tsctk_glu_down_fwd_ternary_r1": 75776,
                  "tsctk_glu_up_fwd_ternary": 49152, "tsctk_glu_up_fwd_ternary_r1": 49152}
    header = HEADER.read_text()
    for name in sorted(KERNELS):
        want = documented.get(name, 0)
        assert native.kernel_smem_bytes(name) == want, name
        if want:
            assert f"{want:,} bytes of" in header, (name, want)  # tsct.h states the same number
    with pytest.raises(ValueError, match="unknown kernel 'tsctk_nope'"):
        native.kernel_smem_bytes("tsctk_nope")
    with pytest.raises(TypeError):
        native.kernel_smem_bytes(3)


# tsct.native.artifacts (also ci/check_artifacts.py, tsct-probe --verify-artifacts): cuobjdump vs manifest
@pytest.fixture(scope="module")
def cuobjdump() -> str:
    from tsct.native import artifacts

    tool = artifacts.find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    return tool


def test_check_artifacts_match(lib_path, cuobjdump):
    from tsct.native import artifacts

    sass = artifacts.find_tool("nvdisasm") is not None
    r = artifacts.verify(lib=lib_path, cuobjdump=cuobjdump, sass=sass)
    assert r["ok"] and r["status"] == "match" and r["problems"] == [], r
    assert r["library"] == lib_path and r["cuobjdump"] == cuobjdump
    m = native.manifest()
    assert [row["target"] for row in r["targets"]] == m["gencodes"]
    assert all(row["ok"] and row["kernels_found"] == len(KERNELS) for row in r["targets"]), r["targets"]
    assert r["detail"].startswith(f"library: {len(m['gencodes'])} targets x {len(KERNELS)} kernels match"), r["detail"]
    aot = r["triton_aot"]
    if "triton_aot" not in m:
        assert aot is None and "; triton AOT: none in the manifest" in r["detail"], r["detail"]
    else:  # the Triton cubins: every one listed, present, hashed and of its arch (docs/decisions/0005)
        sec = m["triton_aot"]
        total = sum(a["variants"] for a in sec["archs"].values())
        assert aot["cubins"] == total and [row["arch"] for row in aot["archs"]] == sorted(sec["archs"])
        for row in aot["archs"]:
            n = sec["archs"][row["arch"]]["variants"]
            assert row["ok"] and row["status"] == "ok", row
            assert row["cubins_index"] == row["present"] == row["sha256_ok"] == row["elf_ok"] == n, row
            assert row["kernels"] == sec["archs"][row["arch"]]["kernels"], row
        if sass:  # one variant per (arch, kernel) a SASS rule covers: the GEMMs
            want = {a: sum(artifacts.rules_cover(a, k) for k in v["kernels"]) for a, v in sec["archs"].items()}
            assert {row["arch"]: row["sass_checked"] for row in aot["archs"]} == want, aot["archs"]
            assert aot["sass_checked"] == sum(want.values()), aot
            assert want == {a: 8 for a in want}, want  # 4 bf16 + 4 low-bit GEMMs
        assert f"; triton AOT: {total} cubins, {len(sec['archs'])} archs match" in r["detail"], r["detail"]
    assert len(r["detail"]) < 180, r["detail"]
    assert ("; cutedsl: none" in r["detail"]) == (not m.get("cutedsl")), r["detail"]
    json.dumps(r)  # the probe's --json report carries it


def test_sass_rules_of_the_cuda_lowbit_projections():
    """sm_90a: wgmma (HGMMA, bf16, fp32 accumulate) and no mma.sync left; the other targets: mma.sync (HMMA)."""
    from tsct.native import artifacts as A

    hgmma = "  HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR16], RZ, !UPT ;\n  STSM.16.MT88.4 [R98], R16 ;"
    hmma = "  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n  STSM.16.MT88.4 [R98], R16 ;"
    for k in ("tsctk_glu_down_fwd_nvfp4", "tsctk_glu_up_fwd_sign"):
        assert A.rule_failures("sm_90a", {k: hgmma}) == []
        assert [kn for kn, _ in A.rule_failures("sm_90a", {k: hmma})] == [k, k]  # no HGMMA, and an HMMA
        assert [kn for kn, _ in A.rule_failures("sm_90a", {k: hgmma + "\n  STL [R1], R4 ;"})] == [k]  # a spill
        assert A.rule_failures("sm_100a", {k: hmma}) == [] and A.rule_failures("sm_80", {k: hmma}) == []
        assert [kn for kn, _ in A.rule_failures("sm_120a", {k: hgmma})] == [k]


def test_sass_rules_cover_the_triton_gemms():
    from tsct.native import artifacts as A

    gemms = ("glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw")
    want = {"sm_90a": "HGMMA.64x64x16.F32.BF16", "sm_100a": "UTCHMMA gdesc[UR4]", "sm_120": "HMMA.16816.F32.BF16"}
    for arch, insn in want.items():
        for k in gemms:
            assert A.rules_cover(arch, k)
            assert A.rule_failures(arch, {k: f"  /*0100*/  {insn} R4, R8 ;"}) == []
            assert A.rule_failures(arch, {k: f"  {insn} R4, R8 ;\n  STL [R1+0x10], R4 ;"}) == []  # spills allowed
            other = next(v for a, v in want.items() if a != arch)
            assert [kn for kn, _ in A.rule_failures(arch, {k: other})] == [k]
        for k in ("glu_bwd_epi", "combine_rows", "zero_tail_rows"):
            assert not A.rules_cover(arch, k)
    assert not A.rules_cover("sm_120a", "glu_up_fwd") and not A.rules_cover("sm_90a", "glu_up_fwd_x")
    # the low-bit (W4A16) family's GEMMs share the rules
    for arch, insn in want.items():
        assert A.rules_cover(arch, "lowbit_up_fwd") and A.rules_cover(arch, "lowbit_bwd_dx_dw")
        assert A.rule_failures(arch, {"lowbit_down_fwd": f"  {insn} R4, R8 ;"}) == []
        assert [kn for kn, _ in A.rule_failures(arch, {"lowbit_bwd_dz": "  FFMA R1, R2 ;"})] == ["lowbit_bwd_dz"]
    assert not A.rules_cover("sm_120a", "lowbit_up_fwd") and not A.rules_cover("sm_90a", "lowbit_up_fwd_x")
    # the library's kernels keep their no-spill rule, and no Triton rule applies to them
    assert A.rules_cover("sm_90a", "tsctk_nvfp4_quantize_bf16")
    assert A.rule_failures("sm_90a", {"tsctk_nvfp4_quantize_bf16": "HGMMA.64x64x16 LDL.64 R2, [R1]"})
    assert A.rule_failures("sm_120", {"tsctk_sign_pack_f32": "FFMA R1"}) == []


def _aot_section():
    m = native.manifest()
    if m is None or "triton_aot" not in m:
        pytest.skip("this build has no Triton AOT cubins (TSCT_TRITON_AOT=OFF)")
    return m, m["triton_aot"]


def _aot_copy(dst: Path, archs: dict[str, tuple[str, dict]]) -> None:
    """A cubin tree under dst: {arch: (source arch, index.json as dict)}, cubins symlinked from the install."""
    from tsct.kernels import aot

    for arch, (src_arch, idx) in archs.items():
        (dst / arch).mkdir(parents=True)
        for e in idx["kernels"].values():
            (dst / arch / e["file"]).symlink_to(aot.aot_dir() / src_arch / e["file"])
        (dst / arch / "index.json").write_text(json.dumps(idx))


def test_check_artifacts_aot_tampered_index(lib_path, cuobjdump, tmp_path, capsys):
    """A copy of the install's cubin tree whose index.json records a wrong sha256 for one cubin and
    lists one that is not there: a mismatch naming both; the other archs still match."""
    from tsct.kernels import aot
    from tsct.native import artifacts

    m, sec = _aot_section()
    idxs = {a: json.loads((aot.aot_dir() / a / "index.json").read_text()) for a in sec["archs"]}
    _aot_copy(tmp_path, {a: (a, idx) for a, idx in idxs.items()})
    r = artifacts.verify(lib=lib_path, cuobjdump=cuobjdump, aot_dir=tmp_path)
    assert r["ok"], r["problems"]  # the copy itself is faithful

    idx = idxs["sm_90a"]
    keys = sorted(k for k, e in idx["kernels"].items() if e["kernel"] == "glu_down_fwd")
    tampered, gone = idx["kernels"][keys[0]], idx["kernels"][keys[1]]
    tampered["sha256"] = "0" * 64
    (tmp_path / "sm_90a" / "index.json").write_text(json.dumps(idx))
    (tmp_path / "sm_90a" / gone["file"]).unlink()
    r = artifacts.verify(lib=lib_path, cuobjdump=cuobjdump, aot_dir=tmp_path)
    assert not r["ok"] and r["status"] == "mismatch", r
    assert any(f"sm_90a/{tampered['file']}" in p and "sha256" in p for p in r["problems"]), r["problems"]
    assert any(f"sm_90a/{gone['file']}" in p and "missing" in p for p in r["problems"]), r["problems"]
    assert len(r["problems"]) == 2, r["problems"]
    rows = {row["arch"]: row for row in r["triton_aot"]["archs"]}
    assert rows["sm_90a"]["status"] == "MISSING, SHA256" and not rows["sm_90a"]["ok"]
    assert rows["sm_90a"]["present"] == rows["sm_90a"]["cubins_index"] - 1
    assert all(row["ok"] for a, row in rows.items() if a != "sm_90a")
    assert "library: " in r["detail"] and "kernels match; triton AOT: " in r["detail"] and "2 problems" in r["detail"]
    assert r["targets"] and all(row["ok"] for row in r["targets"])  # the library part is unaffected
    # the CLI: exit 1, the cubin named
    assert artifacts.main(["--lib", lib_path, "--cuobjdump", cuobjdump, "--aot-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and tampered["file"] in out and "MISSING, SHA256" in out
    # a cubin that no index lists, and a manifest that disagrees with the index
    (tmp_path / "sm_120" / "stray.cubin").write_bytes(b"\x7fELF")
    m2 = json.loads(json.dumps(m))
    m2["triton_aot"]["archs"]["sm_120"]["variants"] += 1
    r = artifacts.verify(lib=lib_path, manifest=m2, cuobjdump=cuobjdump, aot_dir=tmp_path)
    assert any("sm_120" in p and "stray.cubin" in p for p in r["problems"]), r["problems"]
    assert any(p.startswith("triton AOT sm_120: index.json lists") for p in r["problems"]), r["problems"]
    # no cubin directory at all
    r = artifacts.verify(lib=lib_path, cuobjdump=cuobjdump, aot_dir=tmp_path / "nowhere")
    assert not r["ok"] and r["status"] == "mismatch" and "no cubin directory" in r["problems"][0], r


def test_check_artifacts_aot_ptx_target(lib_path, cuobjdump, tmp_path):
    """The sm_120 directory holds plain sm_120 cubins (they load on 12.0 and 12.1); an entry recorded as
    built for sm_120a (loads on 12.0 only) is a mismatch."""
    from tsct.kernels import aot
    from tsct.native import artifacts

    m, sec = _aot_section()
    idxs = {a: json.loads((aot.aot_dir() / a / "index.json").read_text()) for a in sec["archs"]}
    assert {e["ptx_arch"] for e in idxs["sm_120"]["kernels"].values()} == {"sm_120"}
    e = next(e for e in idxs["sm_120"]["kernels"].values() if e["kernel"] == "lowbit_up_fwd")
    e["ptx_arch"] = "sm_120a"
    _aot_copy(tmp_path, {a: (a, idx) for a, idx in idxs.items()})
    r = artifacts.verify(lib=lib_path, cuobjdump=cuobjdump, aot_dir=tmp_path)
    assert not r["ok"] and len(r["problems"]) == 1, r["problems"]
    assert f"sm_120/{e['file']}: built for PTX target 'sm_120a'" in r["problems"][0], r["problems"]


def test_check_artifacts_aot_wrong_arch(lib_path, cuobjdump, tmp_path):
    """sm_120 cubins posing as sm_90a: --list-elf names the real arch, and with the SASS check the
    'code for' line and the sm_90a wgmma rule fail (only the GEMM kernel is disassembled)."""
    from tsct.kernels import aot
    from tsct.native import artifacts

    m, sec = _aot_section()
    src = json.loads((aot.aot_dir() / "sm_120" / "index.json").read_text())
    up = next(e for e in src["kernels"].values() if e["kernel"] == "glu_up_fwd" and e["aligned"])
    comb = next(e for e in src["kernels"].values() if e["kernel"] == "combine_rows")
    idx = {"arch": "sm_90a", "triton_version": src["triton_version"], "kernels": {e["key"]: e for e in (up, comb)}}
    _aot_copy(tmp_path, {"sm_90a": ("sm_120", idx)})
    m = json.loads(json.dumps(m))
    m["triton_aot"] = {"dir": sec["dir"], "triton_version": sec["triton_version"],
                       "archs": {"sm_90a": {"variants": 2, "kernels": {"combine_rows": 1, "glu_up_fwd": 1}}}}
    sass = artifacts.find_tool("nvdisasm") is not None
    r = artifacts.verify(lib=lib_path, manifest=m, cuobjdump=cuobjdump, aot_dir=tmp_path, sass=sass)
    assert not r["ok"], r
    for e in (up, comb):
        assert any(f"sm_90a/{e['file']}: --list-elf shows ['sm_120']" in p for p in r["problems"]), r["problems"]
    row = r["triton_aot"]["archs"][0]
    assert row["elf_ok"] == 0 and row["sha256_ok"] == 2 and "ELF ARCH" in row["status"], row
    if sass:
        assert row["sass_checked"] == 1 and "RULE" in row["status"], row
        assert any(up["file"] in p and "HGMMA" in p for p in r["problems"]), r["problems"]
        assert any(up["file"] in p and "'code for' ['sm_120']" in p for p in r["problems"]), r["problems"]
        assert not any(comb["file"] in p and "SASS" in p for p in r["problems"]), r["problems"]
    assert r["detail"].startswith("library: ") and "triton AOT: 2 cubins, 1 arch: " in r["detail"], r["detail"]


def test_stack_budget_rule():
    """STACK_BUDGET bounds each (arch, kernel, aligned / generic) group's local memory; a kernel without a row may have
    none; arches without rows (a proxy, sm_100a) are not checked."""
    from tsct.native import artifacts as A

    out = ("  Function lowbit_bwd_dx_dw:\n  REG:255 STACK:192 SHARED:1024 LOCAL:0 CONSTANT[0]:1048 TEXTURE:0 "
           "SURFACE:0 SAMPLER:0\n")
    assert A.stack_of(out) == 192 and A.stack_of("no such line") is None
    assert A.stack_over_budget("sm_120", "lowbit_bwd_dx_dw", True, 192) is None
    why = A.stack_over_budget("sm_120", "lowbit_bwd_dx_dw", True, 200)
    assert "lowbit_bwd_dx_dw (aligned) uses 200 bytes of stack" in why and "192 allowed" in why, why
    assert "0 allowed" in A.stack_over_budget("sm_120", "combine_rows", True, 8)
    assert "0 allowed" in A.stack_over_budget("sm_120", "glu_down_fwd", True, 8)  # only its generic variants spill
    assert A.stack_over_budget("sm_120_proxy_sm90", "glu_down_fwd", True, 999) is None
    assert A.stack_over_budget("sm_100a", "glu_down_fwd", True, 999) is None


def test_check_artifacts_aot_stack_budget(lib_path, cuobjdump, tmp_path, monkeypatch):
    """With the SASS check, every cubin's stack is held to STACK_BUDGET: the shipped ones pass, and a budget below a
    shipped cubin's spills fails naming the cubin (two sm_120 cubins: a spilling sign dX kernel, a combine)."""
    from tsct.kernels import aot
    from tsct.native import artifacts

    if artifacts.find_tool("nvdisasm") is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm): the stack check runs with the SASS check")
    m, sec = _aot_section()
    src = json.loads((aot.aot_dir() / "sm_120" / "index.json").read_text())
    dx = next(e for e in src["kernels"].values() if e["kernel"] == "lowbit_bwd_dx_dw" and e["aligned"]
              and e["constexprs"].get("FMT_G") == 2 and e["constexprs"].get("FMT_U") == 2)
    comb = next(e for e in src["kernels"].values() if e["kernel"] == "combine_rows")
    idx = dict(src, kernels={e["key"]: e for e in (dx, comb)})
    _aot_copy(tmp_path, {"sm_120": ("sm_120", idx)})
    m = json.loads(json.dumps(m))
    m["triton_aot"] = {"dir": sec["dir"], "triton_version": sec["triton_version"],
                       "archs": {"sm_120": {"variants": 2, "kernels": {"combine_rows": 1, "lowbit_bwd_dx_dw": 1}}}}
    r = artifacts.verify(lib=lib_path, manifest=m, cuobjdump=cuobjdump, aot_dir=tmp_path, sass=True)
    assert r["ok"], r["problems"]
    monkeypatch.setitem(artifacts.STACK_BUDGET, ("sm_120", "lowbit_bwd_dx_dw", "aligned"), 8)
    r = artifacts.verify(lib=lib_path, manifest=m, cuobjdump=cuobjdump, aot_dir=tmp_path, sass=True)
    assert not r["ok"] and len(r["problems"]) == 1, r["problems"]
    assert f"sm_120/{dx['file']}: lowbit_bwd_dx_dw (aligned) uses" in r["problems"][0] and "8 allowed" in r["problems"][0]
    assert r["triton_aot"]["archs"][0]["status"] == "STACK"


def test_check_artifacts_tampered_manifest(lib_path, cuobjdump, tmp_path, capsys):
    from tsct.native import artifacts

    m = native.manifest()
    m["kernels"]["sm_90a"] = sorted(set(m["kernels"]["sm_90a"]) - {"tsctk_sign_pack_bf16"}) + ["tsctk_not_built"]
    m["gencodes"].append("sm_89")
    r = artifacts.verify(lib=lib_path, manifest=m, cuobjdump=cuobjdump)
    assert not r["ok"] and r["status"] == "mismatch", r
    assert any(p.startswith("sm_90a: kernels differ") and "tsctk_not_built" in p and "tsctk_sign_pack_bf16" in p
               for p in r["problems"]), r["problems"]
    assert any("sm_89" in p for p in r["problems"]), r["problems"]
    assert {row["target"]: row["ok"] for row in r["targets"]}["sm_90a"] is False
    assert "problem" in r["detail"]
    # the CLI: the same findings from a manifest file, exit code 1 and a report
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    assert artifacts.main(["--lib", lib_path, "--manifest", str(path), "--cuobjdump", cuobjdump]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "tsctk_not_built" in out and "KERNELS DIFFER" in out


def test_check_artifacts_without_cuobjdump(lib_path, tmp_path, monkeypatch, capsys):
    from tsct.native import artifacts

    r = artifacts.verify(lib=lib_path, cuobjdump=str(tmp_path / "no-cuobjdump"))
    assert not r["ok"] and r["status"] == "error" and r["targets"] == [], r
    assert "cuobjdump" in r["detail"] and "pip install nvidia-cuda-cuobjdump" in r["detail"], r["detail"]
    # nothing on $CUOBJDUMP / PATH / site-packages either
    monkeypatch.delenv("CUOBJDUMP", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(artifacts, "_site_dirs", lambda: [])
    r = artifacts.verify(lib=lib_path)
    assert not r["ok"] and "pip install nvidia-cuda-cuobjdump" in r["detail"], r
    assert artifacts.main(["--lib", lib_path]) == 2
    assert "pip install nvidia-cuda-cuobjdump" in capsys.readouterr().err
    r = artifacts.verify(lib=tmp_path / "libtsct_kernels.so")
    assert not r["ok"] and r["status"] == "error" and "no native library" in r["detail"], r


def test_check_artifacts_entry_points(lib_path, cuobjdump):
    """`python ci/check_artifacts.py` (what .ci/run calls) and `python -m tsct.native.artifacts`; importing
    the module loads no library and touches no CUDA."""
    script = REPO / "ci" / "check_artifacts.py"
    cmds = [["-m", "tsct.native.artifacts"]] + ([[str(script)]] if script.is_file() else [])
    for cmd in cmds:
        proc = subprocess.run([sys.executable, *cmd, "--lib", lib_path, "--cuobjdump", cuobjdump],
                              capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "artifacts match the manifest" in proc.stdout
        aot_archs = ((native.manifest() or {}).get("triton_aot") or {}).get("archs")
        if aot_archs:  # the summary names every arch the manifest lists (the default build: sm_90a, sm_120)
            assert f"cubins, {len(aot_archs)} archs match" in proc.stdout, proc.stdout
    proc = subprocess.run([sys.executable, "-m", "tsct.native.artifacts", "--all-variants"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "--all-variants needs --sass" in proc.stderr
    code = (
        "import sys, torch, tsct.native.artifacts as A, tsct.native._loader as L\n"
        "print(L._lib is None, 'libtsct_kernels' in open('/proc/self/maps').read(), torch.cuda.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"], out


# --- lazy loading --------------------------------------------------------------------------------
def test_import_loads_nothing():
    code = (
        "import sys, torch, tsct, tsct.native, tsct.native._loader as L\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(L._lib is None, 'libtsct_kernels' in maps, torch.cuda.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"], out


def test_missing_library_is_reported(tmp_path):
    code = (
        "import tsct.native as n\n"
        "print(n.available(), n.library_path(), n.manifest())\n"
        "print(n.load_error())\n"
        "try:\n    n.build_info()\nexcept n.NativeUnavailableError as e:\n    print('raised', isinstance(e, RuntimeError))\n"
    )
    env = dict(os.environ, TSCT_NATIVE_LIB=str(tmp_path / "nope" / "libtsct_kernels.so"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    lines = out.splitlines()
    assert lines[0] == "False None None"
    assert "not found" in lines[1] and "TSCT_NATIVE_LIB" in lines[1] and "unset it" in lines[1]
    assert "TSCT_BUILD_CUDA" not in lines[1]  # the override points nowhere; the install itself may have the library
    assert lines[2] == "raised True"


def test_env_override_accepts_a_directory(lib_path):
    code = "import tsct.native as n; print(n.available(), n.library_path())"
    env = dict(os.environ, TSCT_NATIVE_LIB=os.path.dirname(lib_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["True", str(Path(lib_path))]


# --- argument checks, no GPU needed ---------------------------------------------------------------
def _detail(lib) -> str:
    return lib.tsct_last_error_detail().decode()


def test_error_strings(lib):
    assert lib.tsct_error_string(0) == b"success"
    assert b"BAD_ARGUMENT" in lib.tsct_error_string(-1)
    assert b"NO_CUDA" in lib.tsct_error_string(-2)
    assert lib.tsct_error_string(100)  # a cudaError_t, named by the CUDA runtime without a device
    assert lib.tsct_error_string(-99) == b"unknown tsct error code"


def test_c_entry_points_reject_bad_arguments(lib):
    P = ctypes.c_void_p(0x1000)  # never dereferenced: checks run before any CUDA call
    cases = [
        (lib.tsct_nvfp4_quantize, (P, 0, 1, 4, 30, P, P, P, 0, None), "multiple of 16"),
        (lib.tsct_nvfp4_quantize, (P, 7, 1, 4, 32, P, P, P, 0, None), "x_dtype=7"),
        (lib.tsct_nvfp4_quantize, (P, 0, 1, 4, 32, P, P, P, 5, None), "layout=5"),
        (lib.tsct_nvfp4_quantize, (P, 0, -1, 4, 32, P, P, P, 0, None), "negative size"),
        (lib.tsct_nvfp4_quantize, (None, 0, 1, 4, 32, P, P, P, 0, None), "null pointer"),
        (lib.tsct_nvfp4_quantize, (P, 0, 1 << 40, 1 << 40, 32, P, P, P, 0, None), "overflows"),
        (lib.tsct_nvfp4_dequantize, (P, P, 0, P, 1, 4, 24, P, 1, None), "multiple of 16"),
        (lib.tsct_nvfp4_dequantize, (P, P, 0, P, 1, 4, 32, P, 3, None), "out_dtype=3"),
        (lib.tsct_nvfp4_dequantize, (P, None, 1, P, 1, 4, 32, P, 1, None), "null pointer"),
        (lib.tsct_sign_pack, (P, 0, 1, 4, 12, P, None), "multiple of 8"),
        (lib.tsct_sign_pack, (P, -1, 1, 4, 16, P, None), "w_dtype=-1"),
        (lib.tsct_sign_dequantize, (P, P, None, 1, 4, 16, P, 0, None), "null pointer"),
        (lib.tsct_sign_dequantize, (P, P, P, 1, 4, 16, P, 9, None), "out_dtype=9"),
        (lib.tsct_fp8_quantize, (P, 3, 1, 4, 16, P, P, None), "x_dtype=3"),
        (lib.tsct_fp8_quantize, (P, 0, 1, -4, 16, P, P, None), "negative size"),
        (lib.tsct_fp8_quantize, (P, 0, 1, 4, 16, None, P, None), "null pointer"),
        (lib.tsct_fp8_quantize, (P, 0, 1 << 40, 1 << 40, 16, P, P, None), "overflows"),
        (lib.tsct_fp8_dequantize, (P, P, 1, 4, 17, P, 5, None), "out_dtype=5"),
        (lib.tsct_fp8_dequantize, (P, P, 1, 4, 17, None, 0, None), "null pointer"),
        (lib.tsct_ternary_pack, (P, 0, 1, 4, 18, None, P, P, None), "multiple of 4"),
        (lib.tsct_ternary_pack, (P, 4, 1, 4, 16, None, P, P, None), "x_dtype=4"),
        (lib.tsct_ternary_pack, (P, 0, 1, 4, 16, P, None, P, None), "null pointer"),
        (lib.tsct_ternary_dequantize, (P, None, P, 1, 4, 16, P, 7, None), "out_dtype=7"),
        (lib.tsct_ternary_dequantize, (P, None, P, 1, 4, 16, None, 0, None), "null pointer"),
        # grad_out, grad_rows, f, scatter_idx, offs, xtile_cum, E, m, max_tiles, w_down_t, zw, r, slices, dz_part,
        # dw_down_t, stream
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, P, 2, 8, 4, P, P, 32, 1, P, P, None), "only r = 64"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, P, 2, 8, 4, P, P, 64, 3, P, P, None), "slices=3"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, P, 2, 8, 4, P, P, 64, 0, P, P, None), "slices=0"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 0, None, P, P, 2, 8, 4, P, P, 64, 1, P, P, None), "f=0"),
        (lib.tsct_glu_bwd_dz_bf16, (P, -1, 100, None, P, P, 2, 8, 4, P, P, 64, 1, P, P, None), "grad_rows=-1"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, P, 2, 8, -1, P, P, 64, 1, P, P, None), "max_tiles=-1"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 1 << 31, None, P, P, 2, 8, 4, P, P, 64, 1, P, P, None), "< 2^31"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 1 << 40, 1 << 30, None, P, P, 2, 8, 4, P, P, 64, 1, P, P, None), "overflow"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, None, P, 2, 8, 4, P, P, 64, 1, P, P, None), "null pointer"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, None, 2, 8, 4, P, P, 64, 1, P, P, None), "null pointer"),
        (lib.tsct_glu_bwd_dz_bf16, (ctypes.c_void_p(0x1002), 8, 100, None, P, P, 2, 8, 4, P, P, 64, 1, P, P, None),
         "16-byte aligned"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, ctypes.c_void_p(0x1004), P, P, 2, 8, 4, P, P, 64, 1, P, P, None),
         "scatter_idx must be 8-byte"),
        (lib.tsct_glu_bwd_dz_bf16, (P, 8, 100, None, P, P, 2, 8, 1 << 30, P, P, 64, 2, P, P, None),
         "exceeds the grid"),
        # x, x_rows, stride_x, gather_idx, offs, tile_cum, E, m, d, r, gate codes/scales/s_enc, up codes/scales/s_enc,
        # s_gate, s_up, scales_bf16, row_weight, z, hg, hu, max_tiles, stream
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 64, None, P, P, 2, 8, 64, 32, P, P, P, P, P, P, None, None, 0, None, P,
                                       None, None, 3, None), "only r = 64"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 96, None, P, P, 2, 8, 96, 64, P, P, P, P, P, P, None, None, 0, None, P,
                                       None, None, 3, None), "positive multiple of 64"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 100, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, None, None, 0, None, P,
                                       None, None, 3, None), "stride_x=100 must be a multiple of 8"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 4, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, None, None, 0, None, P,
                                       None, None, 3, None), "x has 4 rows < m=8"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, None, None, 0, None, P,
                                       P, None, 3, None), "hg and hu must be both given"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, None, None, 0, None, None,
                                       None, None, 3, None), "null pointer"),
        (lib.tsct_glu_down_fwd_nvfp4, (ctypes.c_void_p(0x1008), 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P,
                                       None, None, 0, None, P, None, None, 3, None), "16-byte aligned"),
        (lib.tsct_glu_down_fwd_sign, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, ctypes.c_void_p(0x1008), P, P, P, P,
                                      None, None, 0, None, P, None, None, 3, None), "x and a must be 16-byte aligned"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, None, None, 2, None, P,
                                       None, None, 3, None), "scales_bf16=2 must be 0"),
        (lib.tsct_glu_down_fwd_nvfp4, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, P, P, ctypes.c_void_p(0x1002),
                                       None, 0, None, P, None, None, 3, None), "bf16 s_gate / s_up 2-byte"),
        (lib.tsct_glu_down_fwd_fp8, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, None, P, None, None, 0, None, P,
                                     None, None, 3, None), "must be null (fp8 has no scales)"),
        (lib.tsct_glu_down_fwd_fp8, (P, 8, 64, None, P, P, 2, 8, 64, 64, ctypes.c_void_p(0x1008), None, P, P, None, P,
                                     None, None, 0, None, P, None, None, 3, None), "the codes and scale_k must be 16"),
        (lib.tsct_glu_down_fwd_fp8, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, None, None, P, None, P, None, None, 0, None,
                                     P, None, None, 3, None), "codes, s_enc (scale_n) and z are required"),
        (lib.tsct_glu_down_fwd_ternary, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, P, P, P, None, P, None, None, 0, None,
                                         P, None, None, 3, None), "both given (rank-1 scaling) or both null"),
        (lib.tsct_glu_down_fwd_ternary, (P, 8, 64, None, P, P, 2, 8, 64, 64, P, ctypes.c_void_p(0x1008), P, P,
                                         ctypes.c_void_p(0x1008), P, None, None, 0, None, P, None, None, 3, None),
         "the codes and scale_k must be 16-byte aligned"),
        (lib.tsct_glu_down_fwd_ternary, (P, 8, 64, None, P, P, 2, 8, 64, 64, ctypes.c_void_p(0x1004), None, P, P, None,
                                         P, None, None, 0, None, P, None, None, 3, None), "16-byte aligned"),
        # z, m, offs, tile_cum, E, f, r, codes, scales, s_enc, row_weight, y, ldy, max_tiles, stream
        (lib.tsct_glu_up_fwd_nvfp4, (P, 8, P, P, 2, 40, 32, P, P, P, None, P, 40, 3, None), "only r = 64"),
        (lib.tsct_glu_up_fwd_nvfp4, (P, 8, P, P, 2, 37, 64, P, P, P, None, P, 37, 3, None), "multiple of 8"),
        (lib.tsct_glu_up_fwd_nvfp4, (P, 8, P, P, 2, 48, 64, P, P, P, None, P, 40, 3, None), "ldy >= f"),
        (lib.tsct_glu_up_fwd_nvfp4, (P, 8, P, P, 2, 40, 64, None, P, P, None, P, 40, 3, None), "null pointer"),
        (lib.tsct_glu_up_fwd_nvfp4, (P, 8, P, P, 2, 40, 64, P, P, P, None, ctypes.c_void_p(0x1008), 40, 3, None),
         "16-byte aligned"),
        (lib.tsct_glu_up_fwd_sign, (P, 8, P, P, 2, 40, 64, ctypes.c_void_p(0x1004), P, P, None, P, 40, 3, None),
         "the bits 8-byte"),
        (lib.tsct_glu_up_fwd_sign, (P, 8, P, P, 2, 40, 64, P, ctypes.c_void_p(0x1004), P, None, P, 40, 3, None),
         "z, y and a must be 16-byte aligned"),
        (lib.tsct_glu_up_fwd_fp8, (P, 8, P, P, 2, 40, 64, P, P, P, None, P, 40, 3, None), "scales must be null"),
        (lib.tsct_glu_up_fwd_fp8, (P, 8, P, P, 2, 40, 64, ctypes.c_void_p(0x1008), None, P, None, P, 40, 3, None),
         "the codes, scale_k and y must be 16-byte aligned"),
        (lib.tsct_glu_up_fwd_fp8, (P, 8, P, P, 2, 40, 64, P, None, None, None, P, 40, 3, None),
         "codes, s_enc (scale_n) and y are required"),
        (lib.tsct_glu_up_fwd_ternary, (P, 8, P, P, 2, 40, 64, P, ctypes.c_void_p(0x1004), P, None, P, 40, 3, None),
         "the codes, scale_k and y must be 16-byte aligned"),
        (lib.tsct_glu_up_fwd_ternary, (P, 8, P, P, 2, 40, 64, ctypes.c_void_p(0x1004), None, P, None, P, 40, 3, None),
         "the codes, scale_k and y must be 16-byte aligned"),
    ]
    for fn, args, needle in cases:
        rc = fn(*args)
        assert rc == BAD_ARGUMENT, (fn.__name__, args, rc)
        assert needle in _detail(lib), (fn.__name__, needle, _detail(lib))
    assert lib.tsct_stream_capture_id(None, None) == BAD_ARGUMENT and "null pointer" in _detail(lib)
    # Empty work is a success with no launch (so no CUDA call), null pointers allowed.
    assert lib.tsct_nvfp4_quantize(None, 1, 0, 4, 32, None, None, None, 1, None) == 0
    assert lib.tsct_nvfp4_dequantize(None, None, 0, None, 3, 0, 32, None, 1, None) == 0
    assert lib.tsct_sign_pack(None, 0, 2, 3, 0, None, None) == 0
    assert lib.tsct_sign_dequantize(None, None, None, 0, 3, 8, None, 2, None) == 0
    assert lib.tsct_fp8_quantize(None, 0, 2, 3, 0, None, None, None) == 0
    assert lib.tsct_fp8_dequantize(None, None, 2, 0, 7, None, 1, None) == 0
    assert lib.tsct_ternary_pack(None, 1, 0, 3, 8, None, None, None, None) == 0
    assert lib.tsct_ternary_dequantize(None, None, None, 2, 3, 0, None, 0, None) == 0
    assert lib.tsct_glu_bwd_dz_bf16(None, 0, 100, None, None, None, 0, 0, 0, None, None, 64, 1, None, None,
                                    None) == 0
    assert lib.tsct_glu_bwd_dz_bf16(None, 0, 100, None, None, None, 2, 0, 2, None, None, 64, 1, None, None,
                                    None) == 0  # no routed rows: no row tile, nothing to write
    assert lib.tsct_glu_down_fwd_nvfp4(None, 0, 64, P, None, None, 2, 0, 64, 64, *([None] * 8), 0, *([None] * 4), 3,
                                       None) == 0
    assert lib.tsct_glu_up_fwd_nvfp4(None, 0, None, None, 2, 40, 64, None, None, None, None, None, 40, 3, None) == 0
    assert lib.tsct_glu_down_fwd_sign(None, 0, 64, P, None, None, 2, 0, 64, 64, *([None] * 8), 0, *([None] * 4), 3,
                                      None) == 0
    assert lib.tsct_glu_up_fwd_sign(None, 0, None, None, 2, 40, 64, None, None, None, None, None, 40, 3, None) == 0
    for fmt in ("fp8", "ternary"):
        assert getattr(lib, f"tsct_glu_down_fwd_{fmt}")(None, 0, 64, P, None, None, 2, 0, 64, 64, *([None] * 8), 0,
                                                       *([None] * 4), 3, None) == 0
        assert getattr(lib, f"tsct_glu_up_fwd_{fmt}")(None, 0, None, None, 2, 40, 64, None, None, None, None, None, 40,
                                                     3, None) == 0
    assert _detail(lib) == ""
    if not torch.cuda.is_available():
        # routed rows whose scatter indices all miss grad_out (no rows of it) are valid arguments (zero rows): they
        # pass the checks and reach the first CUDA call, which fails here for want of a device
        rc = lib.tsct_glu_bwd_dz_bf16(None, 0, 100, P, P, P, 2, 8, 3, P, P, 64, 1, P, P, None)
        assert rc > 0 and "tsct_glu_bwd_dz_bf16" in _detail(lib), (rc, _detail(lib))


def test_kernel_available_c_level(lib):
    avail = ctypes.c_int(5)
    assert lib.tsct_kernel_available(b"no_such_kernel", ctypes.byref(avail)) == BAD_ARGUMENT
    assert "unknown kernel" in _detail(lib) and avail.value == 0
    if torch.cuda.is_available():
        pytest.skip("the no-GPU branch below needs a machine without CUDA")
    rc = lib.tsct_kernel_available(b"tsctk_nvfp4_quantize_bf16", ctypes.byref(avail))
    assert rc > 0 and avail.value == 0  # a cudaError_t (no device / no driver), not a crash
    assert "tsct_kernel_available" in _detail(lib)


def test_wrappers_reject_bad_input(lib):
    x = torch.zeros(2, 4, 32)
    s = torch.ones(2)
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        native.nvfp4_quantize(x, s, "linear")
    with pytest.raises(TypeError, match="x must have dtype"):
        native.nvfp4_quantize(x.to(torch.int32), s, "linear")
    with pytest.raises(ValueError, match="multiple of 16"):
        native.nvfp4_quantize(torch.zeros(2, 4, 24), s, "linear")
    with pytest.raises(ValueError, match=r"x must be \[B, N, K\]"):
        native.nvfp4_quantize(torch.zeros(4, 32), s, "linear")
    with pytest.raises(ValueError, match="layout must be one of"):
        native.nvfp4_quantize(x, s, "blocked")
    with pytest.raises(ValueError, match="s_enc must have shape"):
        native.nvfp4_quantize(x, torch.ones(3), "linear")
    with pytest.raises(TypeError, match="s_enc must have dtype"):
        native.nvfp4_quantize(x, torch.ones(2, dtype=torch.float64), "linear")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        native.nvfp4_quantize([1.0], s, "linear")
    codes = torch.zeros(2, 4, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="block_scale must have shape"):
        native.nvfp4_dequantize(codes, torch.zeros(2, 4, 3, dtype=torch.float8_e4m3fn), "linear", s, 32)
    with pytest.raises(ValueError, match="block_scale must have shape .*swizzled"):
        native.nvfp4_dequantize(codes, torch.zeros(2, 4, 2, dtype=torch.float8_e4m3fn), "swizzled_128x4", s, 32)
    with pytest.raises(ValueError, match="codes has last dimension"):
        native.nvfp4_dequantize(codes, torch.zeros(2, 4, 4, dtype=torch.float8_e4m3fn), "linear", s, 64)
    with pytest.raises(TypeError, match="out_dtype"):
        native.nvfp4_dequantize(codes, torch.zeros(2, 4, 2, dtype=torch.float8_e4m3fn), "linear", s, 32, torch.int8)
    with pytest.raises(ValueError, match="codes must be a CUDA tensor"):
        native.nvfp4_dequantize(codes, torch.zeros(2, 4, 2, dtype=torch.float8_e4m3fn), "linear", s, 32)
    with pytest.raises(ValueError, match="multiple of 8"):
        native.sign_pack(torch.zeros(1, 2, 12))
    with pytest.raises(ValueError, match="w must be a CUDA tensor"):
        native.sign_pack(torch.zeros(1, 2, 16))
    bits = torch.zeros(1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="a must have shape"):
        native.sign_dequantize(bits, torch.ones(1, 8), torch.ones(1, 2))
    with pytest.raises(ValueError, match="b must have shape"):
        native.sign_dequantize(bits, torch.ones(1, 16), torch.ones(2, 2))
    with pytest.raises(ValueError, match="bits must be a CUDA tensor"):
        native.sign_dequantize(bits, torch.ones(1, 16), torch.ones(1, 2))
    with pytest.raises(ValueError, match="scale_n must have shape"):
        native.fp8_quantize(torch.zeros(2, 3, 7), torch.ones(2, 4))
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        native.fp8_quantize(torch.zeros(2, 3, 7), torch.ones(2, 3))
    with pytest.raises(TypeError, match="codes must have dtype"):
        native.fp8_dequantize(torch.zeros(2, 3, 7, dtype=torch.int8), torch.ones(2, 3))
    with pytest.raises(ValueError, match="multiple of 4"):
        native.ternary_pack(torch.zeros(1, 2, 6), None, torch.ones(1, 2))
    with pytest.raises(ValueError, match="scale_k must have shape"):
        native.ternary_dequantize(torch.zeros(1, 2, 2, dtype=torch.uint8), torch.ones(1, 7), torch.ones(1, 2))
    with pytest.raises(ValueError, match="codes must be a CUDA tensor"):
        native.ternary_dequantize(torch.zeros(1, 2, 2, dtype=torch.uint8), None, torch.ones(1, 2))
    with pytest.raises(TypeError, match="name must be a str"):
        native.kernel_available(3)


def test_glu_bwd_dz_wrapper_rejects_bad_input(lib):
    bf = torch.bfloat16
    go, offs = torch.zeros(8, 100, dtype=bf), torch.tensor([3, 8], dtype=torch.int32)
    wd, zw = torch.zeros(2, 100, 64, dtype=bf), torch.zeros(8, 64, dtype=bf)
    cum = torch.tensor([1, 2], dtype=torch.int32)
    t = dict(xtile_cum=cum, max_tiles=3)

    def dz(*args, **kw):
        return native.glu_bwd_dz_bf16(*args, **{**t, **kw})

    with pytest.raises(TypeError, match="grad_out must have dtype"):
        dz(go.float(), offs, wd, zw, slices=1)
    with pytest.raises(TypeError, match="offs must have dtype"):
        dz(go, offs.long(), wd, zw, slices=1)
    with pytest.raises(TypeError, match="xtile_cum must have dtype"):
        dz(go, offs, wd, zw, slices=1, xtile_cum=cum.long())
    with pytest.raises(TypeError, match="zw must be a torch.Tensor"):
        dz(go, offs, wd, None, slices=1)
    with pytest.raises(ValueError, match=r"w_down_t must have shape \[2, 100, 64\]"):
        dz(go, offs, torch.zeros(2, 64, 100, dtype=bf), zw, slices=1)
    with pytest.raises(ValueError, match=r"zw must have shape \[8, 64\]"):
        dz(go, offs, wd, torch.zeros(8, 32, dtype=bf), slices=1)
    with pytest.raises(ValueError, match=r"xtile_cum must have shape \[2\]"):
        dz(go, offs, wd, zw, slices=1, xtile_cum=cum[:1])
    with pytest.raises(ValueError, match=r"dw_out must have shape \[2, 100, 64\]"):
        dz(go, offs, wd, zw, slices=1, dw_out=torch.zeros(2, 64, 100, dtype=bf))
    with pytest.raises(ValueError, match=r"slices must be an int in \[1, min\(16, ceil\(f/64\) = 2\)\]"):
        dz(go, offs, wd, zw, slices=3)
    with pytest.raises(ValueError, match="max_tiles must be an int >= 0"):
        dz(go, offs, wd, zw, slices=1, max_tiles=-1)
    with pytest.raises(ValueError, match="grad_out has 4 rows < M=8 and no scatter_idx"):
        dz(go[:4], offs, wd, zw, slices=1)
    with pytest.raises(ValueError, match=r"scatter_idx must have shape \[8\]"):
        dz(go, offs, wd, zw, slices=1, scatter_idx=torch.zeros(7, dtype=torch.int64))
    with pytest.raises(ValueError, match="grad_out must be a CUDA tensor"):
        dz(go, offs, wd, zw, slices=2)


def test_swizzled_scale_numel():
    assert native.swizzled_scale_numel(5461, 64) == 5504 * 4
    assert native.swizzled_scale_numel(130, 48) == 256 * 4
    assert native.swizzled_scale_numel(64, 2048) == 128 * 128
    assert native.swizzled_scale_numel(0, 32) == 0


# --- the kernels' arithmetic, on the host ----------------------------------------------------------
@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if not (REPO / "csrc" / "tools" / "host_reference.cpp").is_file():
        pytest.skip("needs the source tree (csrc/tools/host_reference.cpp)")
    try:
        return T.HostRunner(T.build_host_reference(str(REPO), str(tmp_path_factory.mktemp("host_ref"))))
    except RuntimeError as e:
        pytest.skip(f"cannot build the host harness: {e}")


CASES = T.quant_cases()
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _assert_ok(tag, results, stats):
    print(T.summary(tag, results, stats))
    bad = {k: v for k, v in results.items() if v is not None}
    assert not bad, f"{tag}: {bad}"


@pytest.mark.parametrize("layout", ["linear", "swizzled_128x4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_host_nvfp4_matches_torch(host, case, dtype, layout):
    w = T.make_case(case, dtype)
    _assert_ok(f"host nvfp4 {case.name} {dtype} {layout}", *T.check_nvfp4(host, w, layout))


@pytest.mark.parametrize("factor", [64.0, 1e-3, 3.0e30])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_pad", "heavy_tailed", "ties", "saturate")],
                         ids=lambda c: c.name)
def test_host_nvfp4_scaled_s_enc(host, case, factor):
    """s_enc off the recipe: block scales hit the 448 clamp (or underflow) and |y| saturates at 6."""
    w = T.make_case(case, torch.bfloat16)
    _assert_ok(f"host nvfp4 {case.name} s_enc*{factor}", *T.check_nvfp4(host, w, "swizzled_128x4", factor))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_host_sign_matches_torch(host, case, dtype):
    w = T.make_case(case, dtype)
    _assert_ok(f"host sign {case.name} {dtype}", *T.check_sign(host, w))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES + T.fp8_cases(), ids=lambda c: c.name)
def test_host_fp8_matches_torch(host, case, dtype):
    w = T.make_case(case, dtype)
    _assert_ok(f"host fp8 {case.name} {dtype}", *T.check_fp8(host, w))


@pytest.mark.parametrize("factor", [16.0, 1e-4, 2.0 ** 20])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_pad", "heavy_tailed", "saturate")]
                         + T.fp8_cases()[:1], ids=lambda c: c.name)
def test_host_fp8_scaled_and_scalar_tail(host, case, factor):
    """Scales off the recipe (codes saturating at 448, deep subnormals, zeros), and the scalar (unaligned) branch."""
    w = T.make_case(case, torch.bfloat16)
    _assert_ok(f"host fp8 {case.name} scale*{factor}", *T.check_fp8(host, w, factor))
    x, ref = T.storage(w), quantize_fp8(w, backend="torch")
    codes = host.fp8_quantize(x, ref.scale_n, vec=False)
    assert T.bitwise_mismatch(codes, ref.codes.view(torch.uint8)) is None
    out = host.fp8_dequantize(codes, ref.scale_n, torch.bfloat16, vec=False)
    assert T.bitwise_mismatch(out, host.fp8_dequantize(codes, ref.scale_n, torch.bfloat16)) is None


# the rank-1 scaling (scale_k given) on every case but the two large ones, whose power iteration costs seconds
TERNARY_CASES = [(c, sc) for c in CASES + T.ternary_cases() for sc in ("absmean", "rank1")
                 if sc == "absmean" or c.name not in ("normal_wdown", "normal_wgate")]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case,scaling", TERNARY_CASES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_host_ternary_matches_torch(host, case, dtype, scaling):
    w = T.make_case(case, dtype)
    _assert_ok(f"host ternary {scaling} {case.name} {dtype}", *T.check_ternary(host, w, scaling))


def _e4m3_check(host, bits: torch.Tensor):
    f = bits.view(torch.float32)
    ref = f.to(torch.float8_e4m3fn).view(torch.uint8)
    got = host.e4m3_from_f32(f)
    bad = got != ref
    assert not bool(bad.any()), f"{int(bad.sum())} differ, e.g. {f[bad][:5].tolist()}: {got[bad][:5].tolist()} vs {ref[bad][:5].tolist()}"


def test_host_e4m3_encoder_matches_torch(host):
    """UE4M3 RNE: every fp32 below 2^-5 (subnormal scales and the normal boundary), every rounding
    midpoint +-1 ulp in the normal range, specials, and 4M random bit patterns."""
    g = torch.Generator().manual_seed(0)
    low = torch.arange(0, 0x3D000000 + 1, 997, dtype=torch.int64)  # strided sweep of [0, 2^-5]
    codes = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mids = ((codes[:-1] + codes[1:]) / 2).view(torch.int32).to(torch.int64)
    near = torch.cat([mids + d for d in (-1, 0, 1)] + [codes.view(torch.int32).to(torch.int64) + d for d in (-1, 0, 1)])
    special = torch.tensor([0x7F800000, 0x7FC00000, 0x43E00000, 0x43E80000, 0x43F00000, 0x7F7FFFFF, 1], dtype=torch.int64)
    rand = torch.randint(0, 1 << 32, (1 << 22,), generator=g, dtype=torch.int64)
    u = torch.cat([low, near.clamp_min(0), special, rand]) & 0xFFFFFFFF
    for sign in (0, 1 << 31):
        _e4m3_check(host, ((u | sign) - ((u | sign) >= (1 << 31)).to(torch.int64) * (1 << 32)).to(torch.int32))


@pytest.mark.slow
def test_host_e4m3_encoder_exhaustive(host):
    """All 2^32 fp32 bit patterns (about a minute on 2 cores)."""
    step = 1 << 26
    for start in range(-(1 << 31), 1 << 31, step):
        _e4m3_check(host, torch.arange(start, start + step, dtype=torch.int64).to(torch.int32))
