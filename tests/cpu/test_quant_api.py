"""tsct.quant public API: dequantize / is_quantized / storage_format, and STE fake-quant (also compiled)."""

import pytest
import torch

from tsct import quant
from tsct.quant import dequantize, fake_quantize, is_quantized, quantize, quantize_nvfp4, quantize_sign, storage_format


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_forward_is_dequantize_of_quantize(fmt, dtype):
    g = torch.Generator().manual_seed(70)
    w = torch.randn(3, 32, 6, generator=g).to(dtype)
    y = fake_quantize(w, fmt)
    assert y.dtype == dtype and y.shape == w.shape
    assert torch.equal(y, dequantize(quantize(w, fmt), dtype))
    assert not torch.equal(y, w)  # it does quantize


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
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
        return (x @ fake_quantize(w, "nvfp4")[0]).square().sum() + fake_quantize(w, "sign").sum()

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
    with pytest.raises(ValueError, match="backend"):
        fake_quantize(w, "sign", backend="gpu")


def test_is_quantized_storage_format_and_dequantize_of_tensors():
    g = torch.Generator().manual_seed(74)
    w = torch.randn(2, 32, 4, generator=g)
    qn, qs = quantize_nvfp4(w), quantize_sign(w)
    assert is_quantized(qn) and is_quantized(qs) and not is_quantized(w) and not is_quantized(None)
    assert storage_format(qn) == "nvfp4" and storage_format(qs) == "sign"
    assert [storage_format(w.to(d)) for d in (torch.bfloat16, torch.float16, torch.float32)] == ["bf16", "fp16", "fp32"]
    with pytest.raises(TypeError, match="obj"):
        storage_format(w.to(torch.int8))
    with pytest.raises(TypeError, match="obj"):
        storage_format([w])
    assert torch.equal(dequantize(w), w.to(torch.bfloat16))
    assert torch.equal(dequantize(qn, torch.float32), qn.dequantize(torch.float32))
    with pytest.raises(TypeError, match="container"):
        dequantize("w")
    assert set(quant.FORMATS) == {"nvfp4", "sign"} and set(quant.LAYOUTS) == {"linear", "swizzled_128x4"}
    assert quantize(w, "nvfp4", layout="swizzled_128x4").layout == "swizzled_128x4"
    assert quantize(w, "sign", iters=4).bits.shape == (2, 4, 4)


# ---- backend wiring (no GPU here: a stand-in for tsct.native, written from the C ABI contract) ----

class _FakeNative:
    """tsct.h's four quant entry points on [B, N, K] buffers, as the ctypes wrappers will expose them.

    Only the wiring is under test (argument order, orientation, contiguity, dtypes): decode and sign
    are re-derived here, quantize reuses the torch block quantizer.
    """

    def __init__(self):
        self.calls = []

    def available(self):
        return True

    def nvfp4_quantize(self, x, s_enc, layout):
        from tsct.quant.nvfp4 import _quantize_blocks_torch
        from tsct.quant.layout import to_swizzled
        self.calls.append(("nvfp4_quantize", tuple(x.shape), x.is_contiguous(), layout))
        codes, sc = _quantize_blocks_torch(x, s_enc)
        sc = sc.view(torch.uint8)  # the C ABI writes bytes
        return codes, (to_swizzled(sc) if layout == "swizzled_128x4" else sc)

    def nvfp4_dequantize(self, codes, block_scale, layout, s_enc, k, out_dtype):
        from tsct.quant.layout import to_linear
        self.calls.append(("nvfp4_dequantize", tuple(codes.shape), layout, k, out_dtype))
        sc = block_scale if layout == "linear" else to_linear(block_scale, codes.shape[1], k // 16)
        vals = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
        c = torch.stack((codes & 15, codes >> 4), -1).flatten(-2).long()
        x = (vals[c] * sc.float().repeat_interleave(16, -1)) / s_enc.view(-1, 1, 1)
        return x.to(out_dtype)

    def sign_pack(self, w):
        self.calls.append(("sign_pack", tuple(w.shape), w.is_contiguous()))
        neg = torch.signbit(w).view(*w.shape[:-1], -1, 8).to(torch.int32)
        return (neg << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8)

    def sign_dequantize(self, bits, a, b, out_dtype):
        self.calls.append(("sign_dequantize", tuple(bits.shape), out_dtype))
        neg = ((bits.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2).bool()
        return ((torch.where(neg, -1.0, 1.0) * a.unsqueeze(1)) * b.unsqueeze(2)).to(out_dtype)


@pytest.fixture
def fake_native(monkeypatch):
    import sys

    import tsct
    from tsct.quant import _backend
    fake = _FakeNative()
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
