"""The CUTLASS sm_120 grouped NVFP4 GEMM object (csrc/cutlass/build_check.sh), checked on the CPU.

Skips unless the build exists: ``bash csrc/cutlass/build_check.sh build/cutlass --lib`` (one heavy
TU, several minutes; needs nvcc >= 12.8 and the PyPI header source, decision 0007), or
TSCT_CUTLASS_BUILD=<dir>. Checks: sm_120a SASS with the block-scaled fp4 MMA; the compiled
configuration (tile, stages, shared memory within SM120's 99 KiB); CUTLASS's own scale-factor
layout functions == tsct's swizzled_128x4 formula per group; the host-only workspace query.
"""

import ctypes
import json
import os
import pathlib

import pytest
import torch

import _cutlass_plan as cp

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TSCT_CUTLASS_BUILD", ROOT / "build" / "cutlass"))
INFO = BUILD / "build.json"
LIB = BUILD / "libtsct_cutlass_check.so"

pytestmark = pytest.mark.skipif(not INFO.exists(), reason=f"no CUTLASS build at {BUILD} "
                                "(bash csrc/cutlass/build_check.sh build/cutlass --lib)")


def _info():
    return json.loads(INFO.read_text())


def test_sass_has_block_scaled_fp4_mma():
    info = _info()
    assert info["arches"] == ["sm_120a"]
    gemm = {n: f for n, f in info["functions"].items() if f["omma_nvfp4"]}
    assert len(gemm) == 1, info["functions"].keys()
    (f,) = gemm.values()
    assert f["omma_nvfp4"] >= 8  # 128x32 tile per warpgroup, k-step 64: >= 8 m16n8k64 per k-step
    assert all(k.startswith("OMMA.SF.16864.F32.E2M1.E2M1.UE4M3") for k in f["omma_kinds"])
    assert info["cutlass_headers"] == "4.5.0"


@pytest.fixture(scope="module")
def lib():
    if not LIB.exists():
        pytest.skip(f"no {LIB} (build_check.sh --lib)")
    h = ctypes.CDLL(str(LIB))
    h.tsct_cutlass_nvfp4_grouped_sm120_config.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    h.tsct_cutlass_nvfp4_sf_offsets_sm120.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int64)]
    h.tsct_cutlass_nvfp4_grouped_sm120_workspace.argtypes = [ctypes.c_int64, ctypes.c_int,
                                                             ctypes.POINTER(ctypes.c_uint64)]
    return h


def _config(lib):
    out = (ctypes.c_int64 * 10)()
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_config(out, 10) == 0
    keys = ["tile_m", "tile_n", "tile_k", "stages", "smem", "shape_bytes", "shape_is_int32_mnk", "cutlass",
            "threads", "prep_bytes_1"]
    return dict(zip(keys, list(out)))


def test_compiled_configuration(lib):
    c = _config(lib)
    assert (c["tile_m"], c["tile_n"], c["tile_k"]) == (cp.TILE_M, cp.TILE_N, cp.TILE_K)
    assert c["stages"] >= 2
    assert c["smem"] <= 101376  # SM120/SM121 opt-in shared memory per block (cutlass#3096 guard)
    assert c["shape_bytes"] == 12 and c["shape_is_int32_mnk"] == 1  # problem_nmk int32 [G, 3] is the ABI
    assert c["cutlass"] == 405
    assert c["prep_bytes_1"] == 5 * cp.ALIGN  # five per-group arrays, each padded to 256 bytes


def _sf(lib, which, m, n, k):
    rows = m if which == 0 else n
    out = (ctypes.c_int64 * (rows * (k // 16)))()
    assert lib.tsct_cutlass_nvfp4_sf_offsets_sm120(which, m, n, k, out) == 0
    return torch.tensor(list(out), dtype=torch.int64).view(rows, k // 16)


@pytest.mark.parametrize("n_out,m_e,k", [(64, 32, 256), (128, 1, 128), (256, 5, 384), (72, 130, 2048),
                                         (8, 300, 128)])
def test_cutlass_sf_layouts_are_tsct_swizzle(lib, n_out, m_e, k):
    # swap AB: CUTLASS (M', N', K) = (N, M_e, K); SFA = factor scales, SFB = the expert's activation scales
    kb = torch.arange(k // 16).unsqueeze(0)
    sfa = _sf(lib, 0, n_out, m_e, k)
    assert torch.equal(sfa, cp.sf_offset(torch.arange(n_out).unsqueeze(1), kb, k))
    sfb = _sf(lib, 1, n_out, m_e, k)
    assert torch.equal(sfb, cp.sf_offset(torch.arange(m_e).unsqueeze(1), kb, k))
    assert int(sfb.max()) < cp.sf_block_bytes(m_e, k)  # the group's block, rows padded to 128


def test_workspace_query_host_only(lib):
    b = ctypes.c_uint64()
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(0, 188, ctypes.byref(b)) == 0 and b.value == 0
    sizes = []
    for g in (1, 2, 64, 1024):
        assert lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(g, 188, ctypes.byref(b)) == 0
        assert b.value % cp.ALIGN == 0 and b.value >= 5 * cp.ALIGN
        sizes.append(b.value)
    assert sizes == sorted(sizes)
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(-1, 188, ctypes.byref(b)) == -1
