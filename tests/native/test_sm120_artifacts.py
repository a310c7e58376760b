"""The CuTeDSL sm_120 kernels linked into the installed library (decision 0009): manifest section,
tsct_sm120_built, the C entry without a GPU, and tsct.native.artifacts' count/OMMA check of the cubins
the exported objects embed. Skips when the installed library was built without them (TSCT_CUTEDSL=OFF
or AUTO without the DSL)."""

import ctypes

import pytest

from tsct import native
from tsct.native import artifacts

pytestmark = pytest.mark.skipif(not native.available() or not (native.manifest() or {}).get("cutedsl"),
                                reason="the installed library has no CuTeDSL kernels (TSCT_CUTEDSL=OFF/AUTO)")


def test_manifest_and_built_flag():
    cd = native.manifest()["cutedsl"]
    assert cd["dsl"] == {"dist": "nvidia-cutlass-dsl", "version": "4.8.1"} and cd["arch"] == "sm_120a"
    names = {k["name"] for k in cd["kernels"]}
    assert {"tsct_nvfp4_grouped_glu_sm120", "tsct_nvfp4_grouped_rowweight_sm120"} <= names
    assert native.sm120_built()


def test_entry_rejects_bad_arguments_before_any_cuda_call():
    lib = native._loader.get_lib()
    p = ctypes.c_void_p(16)
    args = [p, 64, 48, p, 128, 2, p, 512, p, p, 512, p, 40, 64, 64, p, p, p, 3, p, p, 2, 64, 64, p, None]
    assert lib.tsct_sm120_nvfp4_grouped(1, *args) == -1  # k = 48 is not a multiple of 64
    assert "multiple of 64" in native._loader.error_message("x", -1)
    assert lib.tsct_sm120_nvfp4_grouped(7, *args) == -1  # unknown variant
    sargs = [p, 64, 48, p, 128, 2, p, 512, p, p, p, 40, 64, 64, p, p, p, 3, p, p, 2, 64, 64, p, None]
    assert lib.tsct_sm120_sign_grouped(1, *sargs) == -1  # k = 48
    sargs[2], sargs[7] = 64, 500
    assert lib.tsct_sm120_sign_grouped(1, *sargs) == -1  # sfa copy stride not a multiple of 16
    assert "multiple of 16" in native._loader.error_message("x", -1)


def test_artifacts_find_the_embedded_cubins():
    if artifacts.find_tool("cuobjdump") is None:
        pytest.skip("no cuobjdump")
    r = artifacts.verify(lib=native.library_path())
    cd = r["cutedsl"]
    assert cd is not None and cd["cubins"] == cd["kernels"] == len(native.manifest()["cutedsl"]["kernels"]), r
    man = dict(native.manifest())
    man["cutedsl"] = dict(man["cutedsl"], kernels=man["cutedsl"]["kernels"] + [{"name": "tsct_not_built"}])
    bad = artifacts.verify(lib=native.library_path(), manifest=man)
    assert not bad["ok"] and any("cutedsl" in p for p in bad["problems"]), bad["problems"]
