"""A stand-in for ``tsct.native``'s quantize / decode entry points on the CPU (no GPU here), written from the C ABI
contract: the CPU tests of ``tsct.quant``'s backend wiring and of its first-use gate use it."""

from __future__ import annotations

import torch


class FakeNative:
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


    def fp8_quantize(self, x, scale_n):
        self.calls.append(("fp8_quantize", tuple(x.shape), x.is_contiguous()))
        q = (x.float() / scale_n.unsqueeze(2)).to(torch.float8_e4m3fn).view(torch.uint8)
        return q.masked_fill(~torch.isfinite(x), 0x7F)

    def fp8_dequantize(self, codes, scale_n, out_dtype):
        self.calls.append(("fp8_dequantize", tuple(codes.shape), codes.dtype, out_dtype))
        return (codes.view(torch.float8_e4m3fn).float() * scale_n.unsqueeze(2)).to(out_dtype)

    def ternary_pack(self, x, scale_k, scale_n):
        self.calls.append(("ternary_pack", tuple(x.shape), x.is_contiguous(), scale_k is None))
        gamma = scale_n.unsqueeze(2) if scale_k is None else scale_k.unsqueeze(1) * scale_n.unsqueeze(2)
        y = x.float() / gamma
        c = torch.where((gamma == 0) | (y.abs() <= 0.5), 0, torch.where(y < 0, 3, 1))
        c = torch.where(torch.isfinite(x), c, 2).view(*x.shape[:-1], -1, 4)
        return (c << torch.tensor([0, 2, 4, 6])).sum(-1).to(torch.uint8)

    def ternary_dequantize(self, codes, scale_k, scale_n, out_dtype):
        self.calls.append(("ternary_dequantize", tuple(codes.shape), scale_k is None, out_dtype))
        c = ((codes.unsqueeze(-1) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)) & 3).flatten(-2).long()
        q = torch.tensor([0.0, 1.0, float("nan"), -1.0])[c]
        if scale_k is not None:
            q = q * scale_k.unsqueeze(1)
        return (q * scale_n.unsqueeze(2)).to(out_dtype)
