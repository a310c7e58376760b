"""tsct.quant public API: dequantize / is_quantized / storage_format, and STE fake-quant (also compiled)."""

import pytest
import torch

from _fake_native import FakeNative
from tsct import quant
from tsct.quant import (
    dequantize,
    fake_quantize,
    is_quantized,
    quantize,
    quantize_fp8,
    quantize_nvfp4,
    quantize_sign,
    quantize_ternary,
    storage_format,
)


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "fp8", "ternary"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_forward_is_dequantize_of_quantize(fmt, dtype):
    g = torch.Generator().manual_seed(70)
    w = torch.randn(3, 32, 6, generator=g).to(dtype)
    y = fake_quantize(w, fmt)
    assert y.dtype == dtype and y.shape == w.shape
    assert torch.equal(y, dequantize(quantize(w, fmt), dtype))
    assert not torch.equal(y, w)  # it does quantize


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "fp8", "ternary"])
def test_ste_gradient_is_identity(fmt):
    g = torch.Generator().manual_seed(71)
    w = torch.randn(2, 48, 5, generator=g).requires_grad_()
    up = torch.randn(2, 48, 5, generator=g)
    y = fake_quantize(w, fmt)
    assert y.requires_grad
    y.backward(up)
    assert torch.equal(w.grad, up)


def test_fake_quantize_under_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(72)
    w = torch.randn(2, 32, 8, generator=g)
    x = torch.randn(4, 32, generator=g)

    def f(w, x):
        return ((x @ fake_quantize(w, "nvfp4")[0]).square().sum() + fake_quantize(w, "sign").sum()
                + (x @ fake_quantize(w, "fp8")[1]).square().sum() + (x @ fake_quantize(w, "ternary")[0]).sum())

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    le, lc = f(we, x), cf(wc, x)
    le.backward()
    lc.backward()
    assert torch.equal(le, lc)
    assert torch.equal(we.grad, wc.grad)


def test_fake_quantize_validation():
    g = torch.Generator().manual_seed(73)
    w = torch.randn(24, 4, generator=g)
    with pytest.raises(ValueError, match="fmt"):
        fake_quantize(w, "int4")
    with pytest.raises(ValueError, match="multiple of 16"):
        fake_quantize(w, "nvfp4")
    assert fake_quantize(w, "sign").shape == (24, 4)  # 24 % 8 == 0
    assert fake_quantize(w[:7], "fp8").shape == (7, 4)  # any K
    with pytest.raises(ValueError, match="multiple of 4"):
        fake_quantize(w[:10], "ternary")
    with pytest.raises(ValueError, match="backend"):
        fake_quantize(w, "sign", backend="gpu")


def test_errors_name_the_function_called_and_its_argument():
    """Each public entry names itself and the argument the caller passed (quantize_master's factor is ``master``,
    not the quantizer's ``w``), whichever function checks it."""
    from tsct.ops import quantize_master

    w = torch.randn(2, 32, 4)
    cases = [
        (lambda: quantize_master(w.double(), "nvfp4"), TypeError, r"^quantize_master: master\.dtype must be one of"),
        (lambda: quantize_master(w[:, :17], "nvfp4"), ValueError,
         r"^quantize_master: master: K = master\.shape\[-2\] = 17 must be a multiple of 16 for nvfp4"),
        (lambda: quantize_master(w, "sign", backend="gpu"), ValueError, r"^quantize_master: backend must be one of"),
        (lambda: quant.quantize(w.double(), "nvfp4"), TypeError, r"^quantize_nvfp4: w\.dtype must be one of"),
        (lambda: quant.quantize(w[:, :12], "sign"), ValueError, r"^quantize_sign: w: K = w\.shape\[-2\] = 12"),
        (lambda: quant.quantize(w, "fp8", backend="gpu"), ValueError, r"^quantize_fp8: backend must be one of"),
        (lambda: quant.quantize(w[0, 0], "ternary"), ValueError, r"^quantize_ternary: w must be \[E, K, N\] or"),
        (lambda: fake_quantize(w.int(), "sign"), TypeError, r"^tsct\.quant\.fake_quantize: w\.dtype must be"),
        (lambda: dequantize(w, torch.int8), TypeError, r"^tsct\.quant\.dequantize: dtype must be one of"),
        (lambda: dequantize(w, backend="gpu"), ValueError, r"^tsct\.quant\.dequantize: backend must be one of"),
        (lambda: quantize_nvfp4(w).dequantize(torch.int8), TypeError, r"^NVFP4Tensor\.dequantize: dtype must be"),
        (lambda: quantize_sign(w).dequantize(backend="gpu"), ValueError,
         r"^SignTensor\.dequantize: backend must be one of"),
    ]
    for i, (call, exc, msg) in enumerate(cases):
        with pytest.raises(exc, match=msg):
            call()


def test_is_quantized_storage_format_and_dequantize_of_tensors():
    g = torch.Generator().manual_seed(74)
    w = torch.randn(2, 32, 4, generator=g)
    qn, qs, q8, qt = quantize_nvfp4(w), quantize_sign(w), quantize_fp8(w), quantize_ternary(w)
    assert all(is_quantized(q) for q in (qn, qs, q8, qt)) and not is_quantized(w) and not is_quantized(None)
    assert [storage_format(q) for q in (qn, qs, q8, qt)] == ["nvfp4", "sign", "fp8", "ternary"]
    assert [storage_format(w.to(d)) for d in (torch.bfloat16, torch.float16, torch.float32)] == ["bf16", "fp16", "fp32"]
    with pytest.raises(TypeError, match="obj"):
        storage_format(w.to(torch.int8))
    with pytest.raises(TypeError, match="obj"):
        storage_format([w])
    assert torch.equal(dequantize(w), w.to(torch.bfloat16))
    assert torch.equal(dequantize(qn, torch.float32), qn.dequantize(torch.float32))
    with pytest.raises(TypeError, match="container"):
        dequantize("w")
    assert set(quant.FORMATS) == {"nvfp4", "sign", "fp8", "ternary"}
    assert set(quant.LAYOUTS) == {"linear", "swizzled_128x4"}
    assert quantize(w, "nvfp4", layout="swizzled_128x4").layout == "swizzled_128x4"
    assert quantize(w, "sign", iters=4).bits.shape == (2, 4, 4)
    assert quantize(w, "ternary", scaling="rank1").scale_k.shape == (2, 32)
    assert torch.equal(dequantize(q8, torch.float32), q8.dequantize(torch.float32))
    assert torch.equal(dequantize(qt, torch.float32), qt.dequantize(torch.float32))


@pytest.mark.parametrize("how", ["torch.save", "pickle", "deepcopy"])
@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "fp8", "ternary"])
def test_containers_serialize_with_torch_save_and_pickle(fmt, how, tmp_path):
    """A container is a plain dataclass of tensors: ``torch.save`` / ``torch.load``, plain ``pickle`` (which cannot
    read a float8 tensor back by itself: NVFP4's block scales, FP8's codes) and ``copy.deepcopy`` give the same bytes
    in the same dtypes back."""
    import copy
    import pickle

    g = torch.Generator().manual_seed(78)
    w = torch.randn(2, 32, 6, generator=g)
    opts = {"scaling": "rank1"} if fmt == "ternary" else {}
    q = quantize(w, fmt, **opts)
    if how == "torch.save":
        torch.save(q, tmp_path / "q.pt")
        r = torch.load(tmp_path / "q.pt")  # torch's default, weights_only=True: the containers are safe globals
    else:
        r = pickle.loads(pickle.dumps(q)) if how == "pickle" else copy.deepcopy(q)
    r.check()
    assert type(r) is type(q) and r.shape == q.shape
    for name in type(q)._STORAGE:
        a, b = getattr(q, name), getattr(r, name)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert torch.equal(r.dequantize(torch.float32), q.dequantize(torch.float32))


# ---- backend wiring (no GPU here: a stand-in for tsct.native, written from the C ABI contract) ----

@pytest.fixture
def fake_native(monkeypatch):
    import sys

    import tsct
    from tsct.quant import _backend
    fake = FakeNative()
    monkeypatch.setitem(sys.modules, "tsct.native", fake)
    monkeypatch.setattr(tsct, "native", fake, raising=False)
    monkeypatch.setattr(_backend, "_native_status", lambda device: (True, "fake"))
    return fake


@pytest.mark.parametrize("layout", ["linear", "swizzled_128x4"])
def test_native_backend_wiring_matches_torch(fake_native, layout):
    g = torch.Generator().manual_seed(75)
    w = torch.randn(3, 48, 20, generator=g).to(torch.bfloat16)
    a = quantize_nvfp4(w, layout=layout, backend="native")
    t = quantize_nvfp4(w, layout=layout, backend="torch")
    assert fake_native.calls[0] == ("nvfp4_quantize", (3, 20, 48), True, layout)
    assert a.block_scale.dtype == torch.float8_e4m3fn
    assert torch.equal(a.codes, t.codes) and torch.equal(a.global_scale, t.global_scale)
    assert torch.equal(a.block_scale.view(torch.uint8), t.block_scale.view(torch.uint8))
    da = a.dequantize(torch.bfloat16, backend="native")
    assert fake_native.calls[-1] == ("nvfp4_dequantize", (3, 20, 24), layout, 48, torch.bfloat16)
    assert da.shape == w.shape and da.is_contiguous()
    assert torch.equal(da, t.dequantize(torch.bfloat16, backend="torch"))


def test_native_sign_wiring_and_auto_picks_native(fake_native):
    g = torch.Generator().manual_seed(76)
    w = torch.randn(40, 6, generator=g)
    a = quantize_sign(w)  # auto -> native (the stand-in says it is available)
    t = quantize_sign(w, backend="torch")
    assert fake_native.calls[0] == ("sign_pack", (1, 6, 40), True)
    assert torch.equal(a.bits, t.bits) and torch.equal(a.scale_k, t.scale_k)
    d = dequantize(a, torch.float32)
    assert fake_native.calls[-1] == ("sign_dequantize", (1, 6, 5), torch.float32)
    assert d.shape == (40, 6) and torch.equal(d, t.dequantize(torch.float32, backend="torch"))


@pytest.mark.parametrize("scaling", ["absmean", "rank1"])
def test_native_fp8_and_ternary_wiring(fake_native, scaling):
    g = torch.Generator().manual_seed(79)
    w = torch.randn(3, 40, 6, generator=g).to(torch.bfloat16)
    w[1, 7, 2] = float("nan")
    a8, t8 = quantize_fp8(w, backend="native"), quantize_fp8(w, backend="torch")
    assert fake_native.calls[0] == ("fp8_quantize", (3, 6, 40), True)
    assert torch.equal(a8.codes.view(torch.uint8), t8.codes.view(torch.uint8)) and torch.equal(a8.scale_n, t8.scale_n)
    d8 = a8.dequantize(torch.float16, backend="native")
    assert fake_native.calls[-1] == ("fp8_dequantize", (3, 6, 40), torch.uint8, torch.float16)
    assert d8.shape == w.shape and d8.is_contiguous()
    assert torch.equal(d8.nan_to_num(7.0), t8.dequantize(torch.float16, backend="torch").nan_to_num(7.0))
    at = quantize_ternary(w, scaling=scaling, backend="native")
    tt = quantize_ternary(w, scaling=scaling, backend="torch")
    assert fake_native.calls[-1] == ("ternary_pack", (3, 6, 40), True, scaling == "absmean")
    assert torch.equal(at.codes, tt.codes) and torch.equal(at.scale_n, tt.scale_n)
    dt = at.dequantize(torch.float32, backend="native")
    assert fake_native.calls[-1] == ("ternary_dequantize", (3, 6, 10), scaling == "absmean", torch.float32)
    assert torch.equal(dt.nan_to_num(7.0), tt.dequantize(torch.float32, backend="torch").nan_to_num(7.0))


def test_auto_is_torch_under_torch_compile(fake_native):
    """dynamo cannot trace the native kernels' ctypes calls: ``auto`` picks torch while compiling (the same bits),
    so a fullgraph compile of a dequantize compiles, and eager still takes the native kernels."""
    g = torch.Generator().manual_seed(77)
    q = quantize_nvfp4(torch.randn(2, 32, 8, generator=g), backend="torch")
    torch._dynamo.reset()
    x = torch.randn(2, 32, 8, generator=g)
    got = torch.compile(lambda x: q.dequantize(torch.float32) * x, fullgraph=True)(x)
    assert not fake_native.calls  # traced through the torch backend
    assert torch.equal(got, q.dequantize(torch.float32, backend="torch") * x)
    q.dequantize(torch.float32)  # eager auto: the (fake) native kernels
    assert fake_native.calls[-1][0] == "nvfp4_dequantize"


def test_auto_on_cuda_without_native_is_a_counted_warned_fallback(monkeypatch):
    import sys

    from tsct import config
    from tsct.quant import _backend
    import tsct
    monkeypatch.setitem(sys.modules, "tsct.native", None)  # import fails
    monkeypatch.delattr(tsct, "native", raising=False)
    monkeypatch.setattr(config, "warn_fallbacks", True)
    quant.reset_native_fallback_counts()
    cuda = torch.device("cuda", 0)  # only the device type is looked at; nothing is allocated
    with pytest.warns(RuntimeWarning, match="torch backend on CUDA"):
        assert _backend.resolve("auto", cuda, "quantize_nvfp4") == "torch"
    assert _backend.resolve("auto", cuda, "quantize_nvfp4") == "torch"  # warned once, counted twice
    (key, count), = quant.native_fallback_counts().items()
    assert key[0] == "quantize_nvfp4" and "cannot be imported" in key[1] and count == 2
    with pytest.raises(RuntimeError, match="backend='native' cannot run"):
        _backend.resolve("native", cuda, "quantize_sign")
    quant.reset_native_fallback_counts()


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
@pytest.mark.parametrize("shape", [(3, 64, 40), (64, 24)])
def test_dequantize_in_storage_order_is_the_same_values_without_a_copy(fmt, shape):
    """``contiguous=False``: the same values, as the transposed view of a K-contiguous decode (the bmm path
    hands it to torch.bmm as it is)."""
    w = torch.randn(*shape) * torch.linspace(0.1, 3.0, shape[-1])
    q = quant.quantize(w, fmt)
    dense = quant.dequantize(q, torch.bfloat16)
    view = quant.dequantize(q, torch.bfloat16, contiguous=False)
    assert dense.is_contiguous() and view.shape == dense.shape
    assert view.stride(-2) == 1 and view.stride(-1) == shape[-2]  # K (dim -2) contiguous
    assert torch.equal(view, dense)
    assert torch.equal(quant.dequantize(w, torch.bfloat16, contiguous=False), w.bfloat16())


def test_a_container_moves_to_a_device_not_a_dtype():
    q = quantize(torch.randn(2, 32, 8), "nvfp4")
    assert torch.equal(q.to("cpu").codes, q.codes)
    with pytest.raises(TypeError, match=r"NVFP4Tensor.to: device must be a device, got the dtype torch.bfloat16"):
        q.to(torch.bfloat16)
