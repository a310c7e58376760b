"""cutedsl/: the AOT build (compile for sm_120a + export_to_c) and the SASS check (OMMA present).

The build needs the pinned CuTeDSL, which is not a tsct dependency (docs/decisions/0006): it runs
when the DSL is importable here, or with ``TSCT_CUTEDSL_PYTHON=/path/to/venv/bin/python``; otherwise
those tests skip with the reason. The object parser is tested without the DSL.
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cutedsl"))
import check_sass  # noqa: E402
from _cutedsl import dsl_python_or_skip  # noqa: E402


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
    py = dsl_python_or_skip()
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
    assert {"tsct_nvfp4_gemm_dense_sm120", "tsct_nvfp4_grouped_glu_sm120", "tsct_sign_grouped_alpha_sm120",
            "tsct_sign_grouped_glu_sm120", "tsct_sign_grouped_rowweight_sm120"} <= names
    for k in index["kernels"]:
        if k["params"].get("sign"):
            assert k["entry"] == "grouped_sign" and "bits" in k["args"] and "col_scale" in k["args"]
            assert k["operands"] == (2 if k["params"]["epilogue"] == "glu" else 1)
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
        # exactly one OMMA per (warp, m16n8 atom, accumulator chain) in the non-unrolled K loop
        assert sum(c["omma"][check_sass.REQUIRED] for c in obj["cubins"]) == obj["omma_expected"], obj["object"]


def test_sign_kernels_expand_bits_in_registers(built):
    out, proc = built
    report = json.loads((out / "sass_report.json").read_text())
    sign = {o["object"]: o for o in report["objects"] if o["sign"]}
    assert set(sign) == {"tsct_sign_grouped_alpha_sm120.o", "tsct_sign_grouped_glu_sm120.o",
                         "tsct_sign_grouped_rowweight_sm120.o"}
    for name, obj in sign.items():
        (cubin,) = obj["cubins"]
        assert cubin["immediates"]["0x22222222"] > 0  # +1.0 codes OR-ed with the shifted sign bits
        assert cubin["immediates"]["0x38383838"] > 0  # unit UE4M3 B scales, no scale buffer
        assert cubin["ldg_u8"] > 0  # the bits, one byte per B register
    # two accumulator chains (x*a_gate, x*a_up) in the sign GLU: 2 x (64 / 16) OMMA
    assert sign["tsct_sign_grouped_glu_sm120.o"]["omma_expected"] == 8
    # the NVFP4 kernels carry no sign constants
    for obj in report["objects"]:
        if not obj["sign"]:
            assert obj["cubins"][0]["immediates"]["0x38383838"] == 0, obj["object"]


def test_expected_omma_counts():
    k = lambda **p: {"params": p, "operands": 2 if p.get("sign") and p["epilogue"] == "glu" else 1}  # noqa: E731
    assert check_sass.expected_omma(k(epilogue="alpha", tile_n=32)) == 2
    assert check_sass.expected_omma(k(epilogue="glu", tile_n=128)) == 8
    assert check_sass.expected_omma(k(epilogue="glu", tile_n=64, sign=True)) == 8
    assert check_sass.expected_omma({"params": {}}) is None


def test_list_names_every_variant_without_the_dsl():
    """CMake reads the object names from `build.py --list` at configure time (decision 0009): it must
    work with a plain Python (no DSL import) and match VARIANTS."""
    import subprocess
    import sys
    from pathlib import Path

    build = Path(__file__).resolve().parents[2] / "cutedsl" / "build.py"
    out = subprocess.run([sys.executable, str(build), "--list"], capture_output=True, text=True, check=True).stdout
    names = out.split()
    assert len(names) == 7 and "tsct_nvfp4_grouped_glu_sm120" in names and "tsct_nvfp4_grouped_rowweight_sm120" in names
