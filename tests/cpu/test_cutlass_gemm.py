"""The CUTLASS backend of the sm_120 fp4 forward (tsct.kernels.sm120_fp4.cutlass_gemm), on the CPU.

Host preparation (design.md section 6 b): the whole forward runs with ``emulated_gemm``, which reads
every operand ONLY through the prepared per-group addresses, and must agree with the CuTeDSL path's
emulated forward (same W4A4 math) and hence the reference; K / N padding, empty experts and padding
rows included. With a library built with TSCT_CUTLASS (``$TSCT_NATIVE_LIB``, decision 0011): the
compiled object's own scale-factor layout equals what the preparation writes, the C entries give
clean errors off sm_120, and the artifact check requires the OMMA in the linked GEMM.
"""

import ctypes
import functools
import json
import pathlib

import pytest
import torch
from _sm120_problem import make_problem

from tsct import quant
from tsct.kernels.sm120_fp4 import cutlass_gemm as cg
from tsct.kernels.sm120_fp4 import glu as sglu
from tsct.kernels.sm120_fp4.emulated import emulated_gemm as cutedsl_emulated_gemm

CUTLASS_FWD = functools.partial(cg.forward, gemm=cg.emulated_gemm, quant_backend="torch")
CUTEDSL_FWD = functools.partial(sglu.forward, gemm=cutedsl_emulated_gemm, quant_backend="torch")


@pytest.mark.parametrize("layout", ["linear", "swizzled_128x4"])
@pytest.mark.parametrize("d,r,f", [(128, 64, 37), (192, 64, 40)])  # K and N padding: r 64 -> 128, d 192 -> 256, f 37 -> 40
def test_forward_matches_cutedsl_emulation(layout, d, r, f, monkeypatch):
    monkeypatch.delenv(cg.ENV_GEMM, raising=False)
    x, offs, w, sg, su, rw, gather, tokens = make_problem(d=d, r=r, f=f)
    qg, qu, qd = (quant.quantize_nvfp4(t, layout=layout, backend="torch") for t in w)
    y = CUTLASS_FWD(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens)
    want = CUTEDSL_FWD(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens)
    assert y.shape == want.shape == (tokens, f) and y.dtype == torch.bfloat16
    # The same W4A4 math; CUTLASS rounds g, u and y to bf16 before the GLU / row weight (the CuTeDSL
    # epilogues keep fp32): ~1 bf16 ulp, which now and then flips an E2M1 rounding of z (one fp4 step in
    # one element). So: the self-test's metric (selftest.sm120_fp4_forward, relative Frobenius, 3e-2);
    # a pointer or layout mistake gives O(1) (test_forward_detects_a_wrong_pointer).
    err = torch.linalg.norm(y.double() - want.double()) / torch.linalg.norm(want.double())
    assert err < 3e-2, float(err)
    # without scatter: [M, f], padding rows exactly 0
    y2 = CUTLASS_FWD(x, offs, qg, qu, qd, sg, su, rw, gather, None, None)
    valid = int(offs[-1])
    assert y2.shape == (gather.shape[0], f) and y2[valid:].eq(0).all() and y2[:valid].abs().sum() > 0


def test_forward_detects_a_wrong_pointer(monkeypatch):
    """The emulated check can fail: an off-by-one-expert weight pointer changes the result."""
    x, offs, w, sg, su, rw, gather, tokens = make_problem()
    qg, qu, qd = (quant.quantize_nvfp4(t, backend="torch") for t in w)
    want = CUTLASS_FWD(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens)

    def shifted(call):
        r = call.problem_nmk[0, 0] * call.problem_nmk[0, 2] // 2
        call.ptr_w = torch.roll(call.ptr_w - call.ptr_w[0], 1) + call.ptr_w[0]  # expert e reads e-1's factor
        call.ptr_w_sf = torch.roll(call.ptr_w_sf - call.ptr_w_sf[0], 1) + call.ptr_w_sf[0]
        assert int(r) > 0
        cg.emulated_gemm(call)

    bad = cg.forward(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens, gemm=shifted, quant_backend="torch")
    assert torch.linalg.norm(bad.double() - want.double()) / torch.linalg.norm(want.double()) > 0.3


def test_env_selects_the_backend(monkeypatch):
    x, offs, w, sg, su, rw, gather, tokens = make_problem(seed=3)
    qg, qu, qd = (quant.quantize_nvfp4(t, backend="torch") for t in w)
    calls = []

    def fake_native(call):
        calls.append(call.num_groups)
        cg.emulated_gemm(call)

    monkeypatch.setattr(cg, "run_native", fake_native)
    monkeypatch.setenv(cg.ENV_GEMM, "cutlass")
    assert cg.gemm_backend() == "cutlass"
    y = sglu.forward(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens, quant_backend="torch")
    assert calls == [2 * offs.shape[0], offs.shape[0]]  # gate+up in one launch, then down
    assert torch.equal(y, CUTLASS_FWD(x, offs, qg, qu, qd, sg, su, rw, gather, gather, tokens))
    monkeypatch.setenv(cg.ENV_GEMM, "cutedsl")
    assert cg.gemm_backend() == "cutedsl"
    monkeypatch.setenv(cg.ENV_GEMM, "cublas")
    with pytest.raises(ValueError, match="TSCT_SM120_GEMM"):
        cg.gemm_backend()


def test_sign_factors_are_refused():
    x, offs, w, sg, su, rw, gather, tokens = make_problem()
    qs = [quant.quantize_sign(t, backend="torch") for t in w]
    with pytest.raises(TypeError, match="w_gate: the CUTLASS backend"):
        cg.forward(x, offs, *qs, sg, su, rw, gather, gather, tokens, gemm=cg.emulated_gemm, quant_backend="torch")


def _operands(e=3, n=64, k=128, m=40):
    offs = torch.tensor([10, 10, m], dtype=torch.int32)[:e]
    w_codes = torch.zeros(e, n, k // 2, dtype=torch.uint8)
    w_sf = torch.zeros(e, 128 * (-(-(k // 16) // 4) * 4), dtype=torch.uint8)  # pad128(n) * Kbp
    x_codes = torch.zeros(m, k // 2, dtype=torch.uint8)
    x_sf = torch.zeros(4096, dtype=torch.uint8)
    x_sf_off = torch.tensor([0, 1024, 1024], dtype=torch.int32)  # expert 0: pad128(10) * Kbp 8 bytes
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    alpha = torch.ones(e)
    return offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha


def test_grouped_call_arrays_and_errors():
    offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha = _operands()
    c = cg.grouped_call(offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha)
    assert c.problem_nmk.tolist() == [[n, 10, k], [n, 0, k], [n, 30, k]]  # swap AB, empty expert kept
    assert (c.ptr_x - x_codes.data_ptr()).tolist() == [0, 10 * k // 2, 10 * k // 2]
    assert (c.ptr_out - out.data_ptr()).tolist() == [0, 10 * n * 2, 10 * n * 2]
    assert (c.ptr_w - w_codes.data_ptr()).tolist() == [0, n * k // 2, 2 * n * k // 2]
    assert (c.ptr_x_sf - x_sf.data_ptr()).tolist() == x_sf_off.tolist()
    both = cg.concat_calls(c, c)
    assert both.num_groups == 6 and both.alpha.shape == (6,)
    with pytest.raises(ValueError, match="k=64 must be a positive multiple of 128"):
        cg.grouped_call(offs, n, 64, w_codes[..., :32].contiguous(), w_sf, x_codes, x_sf, x_sf_off, out, alpha)
    with pytest.raises(ValueError, match="n=60"):
        cg.grouped_call(offs, 60, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha)
    with pytest.raises(TypeError, match="out must be a torch.bfloat16"):
        cg.grouped_call(offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out.float(), alpha)
    big = torch.zeros(4096, dtype=torch.uint8)
    base = (-big.data_ptr()) % 128
    cg._check_aligned(x_codes=big[base + 16:], x_sf=big[base:])  # checked on CUDA tensors by grouped_call
    with pytest.raises(ValueError, match="x_codes: data_ptr"):
        cg._check_aligned(x_codes=big[base + 8:])
    with pytest.raises(ValueError, match="x_sf: data_ptr"):
        cg._check_aligned(x_sf=big[base + 16:])


def test_grouped_call_on_meta_is_sync_free():
    ops = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in _operands()]
    c = cg.grouped_call(*ops)
    assert all(t.device.type == "meta" for t in (c.problem_nmk, c.ptr_w, c.ptr_x, c.ptr_x_sf, c.ptr_out))


def test_emulated_gemm_refuses_a_wild_address():
    offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha = _operands()
    c = cg.grouped_call(offs, n, k, w_codes, w_sf, x_codes, x_sf, x_sf_off, out, alpha)
    c.ptr_x = c.ptr_x + 10 ** 9
    with pytest.raises(ValueError, match="in no operand buffer"):
        cg.emulated_gemm(c)


# --- against a library built with TSCT_CUTLASS ($TSCT_NATIVE_LIB) ------------------------------------
@pytest.fixture(scope="module")
def lib():
    from tsct.native import _loader
    try:
        h = _loader.get_lib()
    except _loader.NativeUnavailableError as e:
        pytest.skip(f"no native library: {e}")
    flag = ctypes.c_int(0)
    assert h.tsct_cutlass_built(ctypes.byref(flag)) == 0
    if not flag.value:
        pytest.skip("the native library was built without TSCT_CUTLASS")
    return h


def _sf(lib, which, m, n, k):
    rows = m if which == 0 else n
    out = (ctypes.c_int64 * (rows * (k // 16)))()
    assert lib.tsct_cutlass_nvfp4_sf_offsets_sm120(which, m, n, k, out) == 0
    return torch.tensor(list(out), dtype=torch.int64).view(rows, k // 16)


@pytest.mark.parametrize("n,m_e,k", [(64, 32, 128), (40, 5, 128), (64, 130, 256), (128, 1, 2048)])
def test_prepared_scales_are_where_the_compiled_kernel_reads_them(lib, n, m_e, k):
    from tsct.quant.layout import to_swizzled
    # factor (SFA): prepare_factor's swizzled block holds scale (row, kb) at CUTLASS's SFA offset
    lin = torch.arange(n * (k // 16), dtype=torch.int64).remainder(251).add(1).to(torch.uint8).view(1, n, k // 16)
    sw = to_swizzled(lin)[0]
    sfa = _sf(lib, 0, n, m_e, k)
    assert torch.equal(sw[sfa], lin[0])
    # activation (SFB): the quantizer's per-expert block layout == CUTLASS's SFB for rows M_e
    sfb = _sf(lib, 1, n, m_e, k)
    assert torch.equal(sfb, cg._swizzle(torch.arange(m_e).unsqueeze(1), torch.arange(k // 16).unsqueeze(0), k))


def test_compiled_configuration(lib):
    out = (ctypes.c_int64 * 10)()
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_config(out, 10) == 0
    assert (out[0], out[1], out[2]) == (128, 32, cg.TILE_K)
    assert out[4] <= 101376 and out[5] == 12 and out[6] == 1 and out[7] == 405


def test_entry_gives_a_clean_error_off_sm120(lib):
    """No GPU here (or an sm_90 one): the run entry must return an error with a detail, not crash."""
    from tsct.native import _loader
    rc = lib.tsct_cutlass_nvfp4_grouped_sm120_bf16(1, None, None, None, None, None, None, None, None, 0, 188, None)
    assert rc > 0, rc  # a cudaError_t: no device / insufficient driver, or 209 (no kernel image) on a non-12.0 GPU
    msg = _loader.error_message("tsct_cutlass_nvfp4_grouped_sm120_bf16", rc)
    assert "querying the current device failed" in msg or "built for sm_120a (12.0) only" in msg, msg
    b = ctypes.c_uint64()
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(1024, 188, ctypes.byref(b)) == 0 and b.value > 0
    assert lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(-1, 188, ctypes.byref(b)) == -1


def test_artifacts_require_omma_in_the_linked_gemm(lib):
    from tsct.native import _loader, artifacts
    if artifacts.find_tool("cuobjdump", "CUOBJDUMP") is None or artifacts.find_tool("nvdisasm", "NVDISASM") is None:
        pytest.skip("no cuobjdump / nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    path = pathlib.Path(_loader.library_path())
    man = json.loads((path.parent / "manifest.json").read_text())
    sec = man.get("cutlass")
    assert sec and sec["arch"] == "sm_120a" and sec["required_sass"] == "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"
    r = artifacts.verify(lib=path, manifest=man, sass=True, aot_dir=path.parent / "no-aot")
    cut = [p for p in r["problems"] if "cutlass" in p]
    assert not cut and r["cutlass"]["omma_ok"] == 1 and "; cutlass: 2/2 sm_120a OMMA ok" in r["detail"], r["detail"]
    # the prep kernel declared the GEMM: it has no OMMA, so the check fails
    bad = json.loads(json.dumps(man))
    for k in bad["cutlass"]["kernels"]:
        k["role"] = "gemm"
    r = artifacts.verify(lib=path, manifest=bad, sass=True, aot_dir=path.parent / "no-aot")
    assert any("prep_kernel" in p and "SASS lacks" in p for p in r["problems"]), r["problems"]
    # a manifest without the section: the CUTLASS kernels are unexpected sm_120a kernels
    bad = {k: v for k, v in man.items() if k != "cutlass"}
    r = artifacts.verify(lib=path, manifest=bad, sass=False, aot_dir=path.parent / "no-aot")
    assert any(p.startswith("sm_120a: kernels differ") and "device_kernel" in p for p in r["problems"]), r["problems"]
