"""The CuTeDSL exports for both Blackwell GeForce archs (decision 0010): sm_120a (compute capability 12.0)
and sm_121a (12.1, where an sm_120a cubin does not load).

* build.py names the sm_121a exports ``..._sm121`` (``export_name``, ``--list --arch``: no DSL needed);
* with the pinned DSL (here or at $TSCT_CUTEDSL_PYTHON) an sm_121a export of the two GLU kernels has
  ``code for sm_121a`` and the exact OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X count (check_sass.py);
* gen_build_info.py merges one index per arch into the manifest ("archs", per-kernel "arch");
* tsct.native.artifacts checks the embedded cubins per arch (count per arch, OMMA in each).
"""

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cutedsl"))
sys.path.insert(0, str(ROOT / "csrc" / "tools"))
import check_sass  # noqa: E402
import gen_build_info  # noqa: E402
from _cutedsl import dsl_python_or_skip  # noqa: E402


def _load(name, path):  # by path: "build" is also the name of a PyPI package
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cutedsl_build = _load("tsct_cutedsl_build_script", ROOT / "cutedsl" / "build.py")


def test_export_names_per_arch():
    assert cutedsl_build.export_name("tsct_nvfp4_grouped_glu_sm120", "sm_120a") == "tsct_nvfp4_grouped_glu_sm120"
    assert cutedsl_build.export_name("tsct_nvfp4_grouped_glu_sm120", "sm_121a") == "tsct_nvfp4_grouped_glu_sm121"
    with pytest.raises(ValueError, match="arch"):
        cutedsl_build.export_name("tsct_nvfp4_grouped_glu_sm120", "sm_100a")
    with pytest.raises(ValueError, match="name"):
        cutedsl_build.export_name("tsct_nvfp4_grouped_glu_sm121", "sm_121a")
    out = subprocess.run([sys.executable, str(ROOT / "cutedsl" / "build.py"), "--list", "--arch", "sm_121a"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(cutedsl_build.VARIANTS) and all(n.endswith("_sm121") for n in out)
    from tsct.kernels import sm120_fp4
    assert set(sm120_fp4.kernel_names("sm_121a")) <= set(out)  # the path asks for what the build writes


def test_sm121a_export_has_block_scaled_omma(tmp_path):
    py = dsl_python_or_skip()
    proc = subprocess.run([py, str(ROOT / "cutedsl" / "build.py"), str(tmp_path), "--arch", "sm_121a", "--check",
                           "--only", "tsct_nvfp4_grouped_glu_sm120", "tsct_sign_grouped_glu_sm120"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["arch"] == "sm_121a"
    assert [k["name"] for k in index["kernels"]] == ["tsct_nvfp4_grouped_glu_sm121", "tsct_sign_grouped_glu_sm121"]
    assert all(k["arch"] == "sm_121a" for k in index["kernels"])
    header = (tmp_path / "tsct_nvfp4_grouped_glu_sm121.h").read_text()
    assert "tsct_nvfp4_grouped_glu_sm121_Kernel_Module_Load" in header
    report = json.loads((tmp_path / "sass_report.json").read_text())
    for obj in report["objects"]:
        assert obj["ok"], obj
        (cubin,) = obj["cubins"]
        assert cubin["arch"] == ["sm_121a"] and cubin["omma"][check_sass.REQUIRED] == obj["omma_expected"] == 8


def _index(arch, names):
    return {"dsl": {"dist": "nvidia-cutlass-dsl", "version": "4.8.1"}, "arch": arch,
            "kernels": [{"name": n, "arch": arch, "entry": "grouped", "params": {"tile_n": 32}, "threads": 128}
                        for n in names]}


def test_manifest_merges_one_index_per_arch(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_index("sm_120a", ["k_sm120"])))
    b.write_text(json.dumps(_index("sm_121a", ["k_sm121"])))
    out = tmp_path / "manifest.json"
    host_elf = os.path.realpath(sys.executable)  # an ELF without .nv_fatbin: a host-only object
    gen_build_info.main(["--objects", host_elf, "--gencodes", "sm_90a", "--version", "0.1.0", "--abi-version", "3",
                         "--nvcc-version", "13.0", "--json", str(out), "--cpp", str(tmp_path / "b.cpp"),
                         "--cutedsl", str(a), "--cutedsl", str(b)])
    cd = json.loads(out.read_text())["cutedsl"]
    assert cd["arch"] == "sm_120a" and cd["archs"] == ["sm_120a", "sm_121a"]
    assert [(k["name"], k["arch"]) for k in cd["kernels"]] == [("k_sm120", "sm_120a"), ("k_sm121", "sm_121a")]
    bad = _index("sm_121a", ["k_sm121"])
    bad["dsl"]["version"] = "4.9.0"
    b.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="disagree"):
        gen_build_info.main(["--objects", host_elf, "--gencodes", "sm_90a", "--version", "0.1.0", "--abi-version", "3",
                             "--nvcc-version", "13.0", "--json", str(out), "--cpp", str(tmp_path / "b.cpp"),
                             "--cutedsl", str(a), "--cutedsl", str(b)])


def _fake_cuda_elf(tag: bytes) -> bytes:
    hdr = bytearray(64)
    hdr[0:4] = b"\x7fELF"
    hdr[4], hdr[5] = 2, 1
    struct.pack_into("<H", hdr, 18, 190)  # EM_CUDA
    struct.pack_into("<QQ", hdr, 32, 0, 64 + len(tag))
    struct.pack_into("<HHHH", hdr, 54, 0, 0, 64, 0)
    return bytes(hdr) + tag


@pytest.mark.parametrize("codes,ok", [(["sm_120a", "sm_121a"], True), (["sm_120a", "sm_120a"], False),
                                      (["sm_120a", "sm_100a"], False)])
def test_artifact_check_counts_cubins_per_arch(tmp_path, monkeypatch, codes, ok):
    from tsct.native import artifacts
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"host" + _fake_cuda_elf(b"A") + b"pad" + _fake_cuda_elf(b"B"))
    sass = {p: f"\n\tcode for {c}\n\t\tFunction : k\n  /*0000*/ OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X R0, R1 ;\n"
            for p, c in zip((b"A", b"B"), codes)}
    monkeypatch.setattr(artifacts, "_run_each",
                        lambda tool, args, paths, env=None: [(sass[p.read_bytes()[-1:]], None) for p in paths])
    man = {"cutedsl": {"arch": "sm_120a", "archs": ["sm_120a", "sm_121a"], "dsl": {},
                       "kernels": [{"name": "k_sm120", "arch": "sm_120a"}, {"name": "k_sm121", "arch": "sm_121a"}]}}
    res = {}
    problems = artifacts._verify_cutedsl(res, man, lib, "cuobjdump", True, None)
    assert (not problems) == ok, problems
    assert res["cutedsl"]["cubins"] == 2 and res["cutedsl"]["omma_ok"] == 2
