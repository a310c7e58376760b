"""The CUDA quantize / decode kernels (libtsct_kernels.so) against the torch reference, bit for bit.

Every case of tests/_native_cases.py quant_cases() (normal, Student-t heavy tails spanning 10^+-30,
all-zero matrix, zero / -0.0 blocks, exact E2M1 ties, bf16 subnormals, nan/inf, values at the dtype
maximum; N = 5461, padded K/16, 2-D, batch > 1) in float32 / bfloat16 / float16, both block-scale
layouts: codes and block-scale bytes equal, and decodes to f32 / bf16 / f16 equal bitwise (NaN at
the same positions). The kernels' outputs are poisoned (0xA5) before each launch, so an unwritten
byte cannot pass. Also: the public tsct.quant API with backend="native", unaligned inputs (the
scalar-load path), a side stream, empty tensors, and the b1 factor shapes.

Also FP8 and ternary (decisions 0021, 0022): the same case matrix plus their own (odd K, exact ties), codes and
decodes bitwise, scales off the recipe, the public API, unaligned pointers, empty tensors, the b1 banks.

Run on a GPU machine:  pytest -s -m gpu tests/native/test_native_quant_gpu.py
Each case prints one line "[PASS|FAIL] ..."; set TSCT_GPU_LOG=path to also append them to a file.
"""

from __future__ import annotations

import time

import pytest
import torch
from _gpu_log import log

import tsct.native as native
import tsct.quant as tq
from tsct.native import _ops
import _native_cases as T

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = T.quant_cases()
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUTS = ("linear", "swizzled_128x4")


def _assert_ok(tag: str, results: dict, stats: dict) -> None:
    log(T.summary(tag, results, stats))
    bad = {k: v for k, v in results.items() if v is not None}
    assert not bad, f"{tag}: {bad}"


@pytest.fixture(scope="module", autouse=True)
def _native_ready():
    if not native.available():
        pytest.fail(f"native library unavailable on the GPU machine: {native.load_error()}")
    _ops._POISON_OUTPUTS = True  # every wrapper output starts as 0xA5 bytes
    dev = torch.cuda.current_device()
    cap = torch.cuda.get_device_capability(dev)
    m = native.manifest() or {}
    log(f"[info] device {torch.cuda.get_device_name(dev)} sm_{cap[0]}{cap[1]}; library {native.library_path()}; "
        f"targets {m.get('gencodes')}; built {m.get('built_at')} with nvcc {m.get('nvcc_version')}")
    yield
    _ops._POISON_OUTPUTS = False


def test_every_kernel_loads_on_this_device():
    names = sorted(set().union(*map(set, native.build_info()["kernels"].values())))
    missing = [n for n in names if not native.kernel_available(n)]
    log(f"[{'PASS' if not missing else 'FAIL'}] kernel_available: {len(names) - len(missing)}/{len(names)} kernels loadable")
    assert not missing
    with pytest.raises(ValueError, match="unknown kernel"):
        native.kernel_available("tsctk_no_such_kernel")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_nvfp4_matches_reference(case, dtype, layout):
    w = T.make_case(case, dtype).cuda()
    _assert_ok(f"gpu nvfp4 {case.name} {str(dtype)[6:]} {layout}", *T.check_nvfp4(native, w, layout))


@pytest.mark.parametrize("factor", [64.0, 1e-3, 3.0e30])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_pad", "heavy_tailed", "ties", "saturate")],
                         ids=lambda c: c.name)
def test_nvfp4_scaled_s_enc(case, factor):
    w = T.make_case(case, torch.bfloat16).cuda()
    _assert_ok(f"gpu nvfp4 {case.name} s_enc*{factor}", *T.check_nvfp4(native, w, "swizzled_128x4", factor))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sign_matches_reference(case, dtype):
    w = T.make_case(case, dtype).cuda()
    _assert_ok(f"gpu sign {case.name} {str(dtype)[6:]}", *T.check_sign(native, w))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_wdown", "nonfinite", "ties")],
                         ids=lambda c: c.name)
def test_public_api_native_backend(case, layout):
    """tsct.quant with backend="native" gives the same containers and decodes as backend="torch"."""
    w = T.make_case(case, torch.bfloat16).cuda()
    a = tq.quantize_nvfp4(w, layout=layout, backend="torch")
    b = tq.quantize_nvfp4(w, layout=layout, backend="native")
    res = {
        "codes": T.bitwise_mismatch(a.codes, b.codes),
        "block_scale": T.bitwise_mismatch(T.as_bytes(a.block_scale), T.as_bytes(b.block_scale)),
        "global_scale": T.bitwise_mismatch(a.global_scale, b.global_scale),
    }
    for dt in DTYPES:
        res[f"decode_{str(dt)[6:]}"] = T.bitwise_mismatch(tq.dequantize(a, dtype=dt, backend="torch"),
                                                         tq.dequantize(b, dtype=dt, backend="native"))
    sa, sb = tq.quantize_sign(w, backend="torch"), tq.quantize_sign(w, backend="native")
    res["sign_bits"] = T.bitwise_mismatch(sa.bits, sb.bits)
    res["sign_decode"] = T.bitwise_mismatch(tq.dequantize(sa, dtype=torch.bfloat16, backend="torch"),
                                            tq.dequantize(sb, dtype=torch.bfloat16, backend="native"))
    _assert_ok(f"gpu api {case.name} {layout}", res, {"shape": list(w.shape)})


def _offset_copy(t: torch.Tensor, elems: int) -> torch.Tensor:
    """A contiguous copy of t whose data pointer is `elems` elements past an aligned allocation."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


def test_unaligned_pointers_take_the_scalar_path():
    """Inputs 1 element off 16-byte alignment: the kernels fall back to scalar loads, same bits."""
    res = {}
    for dt in DTYPES:
        w = T.make_case(CASES[2], dt).cuda()  # normal_pad [4, 48, 130]
        x = T.storage(w)
        ref = tq.quantize_nvfp4(w, layout="swizzled_128x4", backend="torch")
        xo = _offset_copy(x, 1)
        assert xo.data_ptr() % 16 != 0
        c, s = native.nvfp4_quantize(xo, ref.global_scale, "swizzled_128x4")
        res[f"q_{str(dt)[6:]}"] = T.bitwise_mismatch(c, ref.codes) or T.bitwise_mismatch(T.as_bytes(s), T.as_bytes(ref.block_scale))
        co = _offset_copy(ref.codes, 1)
        out = native.nvfp4_dequantize(co, ref.block_scale, "swizzled_128x4", ref.global_scale, x.shape[-1], dt)
        exp = ref.dequantize(dt, backend="torch").transpose(-1, -2)
        res[f"dq_{str(dt)[6:]}"] = T.bitwise_mismatch(out, exp)
        sref = tq.quantize_sign(w, backend="torch")
        res[f"sp_{str(dt)[6:]}"] = T.bitwise_mismatch(native.sign_pack(_offset_copy(x, 1)), sref.bits)
        out = native.sign_dequantize(sref.bits, _offset_copy(sref.scale_k, 1), sref.scale_n, dt)
        res[f"sd_{str(dt)[6:]}"] = T.bitwise_mismatch(out, sref.dequantize(dt, backend="torch").transpose(-1, -2))
    _assert_ok("gpu unaligned", res, {})


def test_non_contiguous_input_and_side_stream():
    w = T.make_case(CASES[0], torch.bfloat16).cuda()  # [3, 64, 5461]
    x_nc = w.transpose(-1, -2)  # the storage view, not contiguous: the wrapper copies it
    assert not x_nc.is_contiguous()
    ref = tq.quantize_nvfp4(w, backend="torch")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c, sc = native.nvfp4_quantize(x_nc, ref.global_scale, "linear")
        out = native.nvfp4_dequantize(c, sc, "linear", ref.global_scale, 64, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(s)
    res = {"codes": T.bitwise_mismatch(c, ref.codes), "block_scale": T.bitwise_mismatch(T.as_bytes(sc), T.as_bytes(ref.block_scale)),
           "decode": T.bitwise_mismatch(out, ref.dequantize(torch.bfloat16, backend="torch").transpose(-1, -2))}
    _assert_ok("gpu side-stream non-contiguous", res, {})


def test_empty_tensors():
    dev = torch.device("cuda")
    for b, n, k in [(0, 4, 32), (2, 0, 32), (2, 4, 0)]:
        x = torch.empty(b, n, k, device=dev)
        s = torch.ones(b, device=dev)
        for layout in LAYOUTS:
            c, sc = native.nvfp4_quantize(x, s, layout)
            assert c.shape == (b, n, k // 2)
            assert native.nvfp4_dequantize(c, sc, layout, s, k).shape == (b, n, k)
        bits = native.sign_pack(x)
        assert native.sign_dequantize(bits, torch.ones(b, k, device=dev), torch.ones(b, n, device=dev)).shape == (b, n, k)
    torch.cuda.synchronize()
    log("[PASS] gpu empty tensors: no launch, right shapes")


@pytest.mark.parametrize("name,shape", [("b1_w_down", (1024, 64, 5461)), ("b1_w_gate", (1024, 2048, 64))])
def test_b1_shapes_and_timing(name, shape):
    """The b1 factor banks: bitwise equal to torch, and how long each path takes (informational)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (torch.randn(shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        return r, (time.perf_counter() - t0) * 1e3

    a, t_torch = timed(lambda: tq.quantize_nvfp4(w, layout="swizzled_128x4", backend="torch"))
    b, t_native = timed(lambda: tq.quantize_nvfp4(w, layout="swizzled_128x4", backend="native"))
    da, td_torch = timed(lambda: a.dequantize(torch.bfloat16, backend="torch"))
    db, td_native = timed(lambda: b.dequantize(torch.bfloat16, backend="native"))
    res = {"codes": T.bitwise_mismatch(a.codes, b.codes),
           "block_scale": T.bitwise_mismatch(T.as_bytes(a.block_scale), T.as_bytes(b.block_scale)),
           "decode": T.bitwise_mismatch(da, db)}
    _assert_ok(f"gpu {name} {list(shape)}", res,
               {"quantize_ms_torch": f"{t_torch:.2f}", "quantize_ms_native": f"{t_native:.2f}",
                "decode_ms_torch": f"{td_torch:.2f}", "decode_ms_native": f"{td_native:.2f}"})


# ---- FP8 (docs/decisions/0021) and ternary (0022) -------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES + T.fp8_cases(), ids=lambda c: c.name)
def test_fp8_matches_reference(case, dtype):
    w = T.make_case(case, dtype).cuda()
    _assert_ok(f"gpu fp8 {case.name} {str(dtype)[6:]}", *T.check_fp8(native, w))


@pytest.mark.parametrize("factor", [16.0, 1e-4, 2.0 ** 20])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_pad", "heavy_tailed", "saturate")],
                         ids=lambda c: c.name)
def test_fp8_scaled(case, factor):
    """Scales off the recipe: codes saturating at 448, deep in the E4M3 subnormals, flushed to zero."""
    w = T.make_case(case, torch.bfloat16).cuda()
    _assert_ok(f"gpu fp8 {case.name} scale*{factor}", *T.check_fp8(native, w, factor))


@pytest.mark.parametrize("scaling", ["absmean", "rank1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES + T.ternary_cases(), ids=lambda c: c.name)
def test_ternary_matches_reference(case, dtype, scaling):
    w = T.make_case(case, dtype).cuda()
    _assert_ok(f"gpu ternary {scaling} {case.name} {str(dtype)[6:]}", *T.check_ternary(native, w, scaling))


@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("normal_wdown", "nonfinite", "heavy_tailed")]
                         + T.fp8_cases()[:1], ids=lambda c: c.name)
def test_fp8_ternary_public_api_native_backend(case):
    """tsct.quant with backend="native" gives the same containers and decodes as backend="torch" on the GPU, and
    the scales computed on the GPU equal the CPU's (fp8: a max and a division; ternary absmean: a float64 sum
    rounded once, so equal unless the two float64 sums round apart, which is logged)."""
    w = T.make_case(case, torch.bfloat16).cuda()
    res, stats = {}, {"shape": list(w.shape)}
    a, b = tq.quantize_fp8(w, backend="torch"), tq.quantize_fp8(w, backend="native")
    res["fp8_codes"] = T.bitwise_mismatch(T.as_bytes(a.codes), T.as_bytes(b.codes))
    res["fp8_scale"] = T.bitwise_mismatch(a.scale_n, b.scale_n)
    res["fp8_scale_cpu"] = T.bitwise_mismatch(a.scale_n, tq.quantize_fp8(w.cpu(), backend="torch").scale_n)
    for dt in DTYPES:
        res[f"fp8_decode_{str(dt)[6:]}"] = T.bitwise_mismatch(a.dequantize(dt, backend="torch"),
                                                             b.dequantize(dt, backend="native"))
    if w.shape[-2] % 4 == 0:
        for scaling in ("absmean", "rank1"):
            ta = tq.quantize_ternary(w, scaling=scaling, backend="torch")
            tb = tq.quantize_ternary(w, scaling=scaling, backend="native")
            res[f"ternary_{scaling}_codes"] = T.bitwise_mismatch(ta.codes, tb.codes)
            res[f"ternary_{scaling}_decode"] = T.bitwise_mismatch(ta.dequantize(torch.bfloat16, backend="torch"),
                                                                  tb.dequantize(torch.bfloat16, backend="native"))
        cpu = tq.quantize_ternary(w.cpu(), backend="torch").scale_n
        gpu = tq.quantize_ternary(w, backend="torch").scale_n.cpu()
        stats["absmean_cpu_gpu_differ"] = int((cpu.view(torch.int32) != gpu.view(torch.int32)).sum())
        ulps = (cpu.view(torch.int32).long() - gpu.view(torch.int32).long()).abs().max().item() if cpu.numel() else 0
        assert ulps <= 1, f"CPU and GPU absmean scales differ by {ulps} ulp"
    _assert_ok(f"gpu fp8/ternary api {case.name}", res, stats)


def test_fp8_ternary_unaligned_and_empty():
    """Pointers 1 element off 16-byte alignment (the FP8 kernels' scalar branch; ternary is scalar throughout) and
    empty tensors (no launch)."""
    res = {}
    for dt in DTYPES:
        w = T.make_case(CASES[2], dt).cuda()  # normal_pad [4, 48, 130]
        x = T.storage(w)
        ref = tq.quantize_fp8(w, backend="torch")
        res[f"fp8_q_{str(dt)[6:]}"] = T.bitwise_mismatch(native.fp8_quantize(_offset_copy(x, 1), ref.scale_n),
                                                         T.as_bytes(ref.codes))
        out = native.fp8_dequantize(_offset_copy(T.as_bytes(ref.codes), 1), ref.scale_n, dt)
        res[f"fp8_dq_{str(dt)[6:]}"] = T.bitwise_mismatch(out, ref.dequantize(dt, backend="torch").transpose(-1, -2))
        tr = tq.quantize_ternary(w, scaling="rank1", backend="torch")
        res[f"ter_p_{str(dt)[6:]}"] = T.bitwise_mismatch(
            native.ternary_pack(_offset_copy(x, 1), _offset_copy(tr.scale_k, 1), tr.scale_n), tr.codes)
        out = native.ternary_dequantize(_offset_copy(tr.codes, 1), tr.scale_k, _offset_copy(tr.scale_n, 1), dt)
        res[f"ter_dq_{str(dt)[6:]}"] = T.bitwise_mismatch(out, tr.dequantize(dt, backend="torch").transpose(-1, -2))
    dev = torch.device("cuda")
    for b, n, k in [(0, 4, 32), (2, 0, 32), (2, 4, 0)]:
        x = torch.empty(b, n, k, device=dev)
        c = native.fp8_quantize(x, torch.ones(b, n, device=dev))
        assert native.fp8_dequantize(c, torch.ones(b, n, device=dev)).shape == (b, n, k)
        t = native.ternary_pack(x, None, torch.ones(b, n, device=dev))
        assert native.ternary_dequantize(t, None, torch.ones(b, n, device=dev)).shape == (b, n, k)
    torch.cuda.synchronize()
    _assert_ok("gpu fp8/ternary unaligned, empty", res, {})


@pytest.mark.parametrize("fmt", ["fp8", "ternary"])
@pytest.mark.parametrize("name,shape", [("b1_w_down", (1024, 64, 5461)), ("b1_w_gate", (1024, 2048, 64))])
def test_fp8_ternary_b1_shapes_and_timing(fmt, name, shape):
    """The b1 factor banks: bitwise equal to torch, the storage, and how long each path takes (informational)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (torch.randn(shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16)

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        return r, (time.perf_counter() - t0) * 1e3

    a, t_torch = timed(lambda: tq.quantize(w, fmt, backend="torch"))
    b, t_native = timed(lambda: tq.quantize(w, fmt, backend="native"))
    da, td_torch = timed(lambda: a.dequantize(torch.bfloat16, backend="torch"))
    db, td_native = timed(lambda: b.dequantize(torch.bfloat16, backend="native"))
    store = T.as_bytes(a.codes) if fmt == "fp8" else a.codes
    res = {"codes": T.bitwise_mismatch(store, T.as_bytes(b.codes) if fmt == "fp8" else b.codes),
           "scale_n": T.bitwise_mismatch(a.scale_n, b.scale_n), "decode": T.bitwise_mismatch(da, db)}
    _assert_ok(f"gpu {fmt} {name} {list(shape)}", res,
               {"nbytes": a.nbytes, "quantize_ms_torch": f"{t_torch:.2f}", "quantize_ms_native": f"{t_native:.2f}",
                "decode_ms_torch": f"{td_torch:.2f}", "decode_ms_native": f"{td_native:.2f}"})
