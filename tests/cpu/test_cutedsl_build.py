"""cutedsl/: the AOT build (compile for sm_120a + export_to_c) and the SASS check (OMMA present).

The build needs the pinned CuTeDSL, which is not a tsct dependency (docs/decisions/0006): it runs
when the DSL is importable here, or with ``TSCT_CUTEDSL_PYTHON=/path/to/venv/bin/python``; otherwise
those tests skip with the reason. The object parser is tested without the DSL.
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
import check_sass  # noqa: E402


def _dsl_python():
    exe = os.environ.get("TSCT_CUTEDSL_PYTHON")
    if exe:
        return exe
    if importlib.util.find_spec("nvidia_cutlass_dsl") is not None:
        return sys.executable
    return None


def _fake_cuda_elf(payload=b"") -> bytes:
    hdr = bytearray(64)
    hdr[0:4] = b"\x7fELF"
    hdr[4], hdr[5] = 2, 1  # ELF64, little-endian
    struct.pack_into("<H", hdr, 18, check_sass.EM_CUDA)
    struct.pack_into("<QQ", hdr, 32, 0, 64 + len(payload))  # e_phoff, e_shoff (empty table)
    struct.pack_into("<HHHH", hdr, 54, 0, 0, 64, 0)
    return bytes(hdr) + payload


def test_embedded_cubins_finds_cuda_elf_only():
    host_elf = bytearray(_fake_cuda_elf())
    struct.pack_into("<H", host_elf, 18, 62)  # x86-64: not a cubin
    cubin = _fake_cuda_elf(b"x" * 10)
    blob = bytes(host_elf) + b"\0" * 7 + cubin + b"tail"
    found = check_sass.embedded_cubins(blob)
    assert found == [cubin]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    py = _dsl_python()
    if py is None:
        pytest.skip("CuTeDSL not installed (set TSCT_CUTEDSL_PYTHON to a python with nvidia-cutlass-dsl==4.8.1)")
    try:
        check_sass.find_cuobjdump()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("cutedsl")
    proc = subprocess.run([py, str(ROOT / "cutedsl" / "build.py"), str(out), "--check"], capture_output=True,
                          text=True, timeout=900)
    return out, proc


def test_build_exports_objects_headers_index(built):
    out, proc = built
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert index["dsl"] == {"dist": "nvidia-cutlass-dsl", "version": "4.8.1"}
    assert index["arch"] == "sm_120a"
    names = {k["name"] for k in index["kernels"]}
    assert {"tsct_nvfp4_gemm_dense_sm120", "tsct_nvfp4_grouped_glu_sm120"} <= names
    for k in index["kernels"]:
        assert (out / k["object"]).stat().st_size > 0
        assert f"{k['name']}_Kernel_Module_Load" in (out / k["header"]).read_text()


def test_every_exported_cubin_has_block_scaled_omma_for_sm120a(built):
    out, proc = built
    report = json.loads((out / "sass_report.json").read_text())
    assert report["objects"]
    for obj in report["objects"]:
        assert obj["ok"], obj
        for cubin in obj["cubins"]:
            assert cubin["arch"] == ["sm_120a"]  # not the DSL's silent sm_100a default
            assert cubin["omma"][check_sass.REQUIRED] > 0
