"""Exhaustive check of the NVFP4 tile decoder (``_kernels._w_tile_nk``): every E2M1 code under every
UE4M3 block scale, in each product dtype. Used by the interpreter check (fp32, CPU) and by
tests/gpu/test_triton_lowbit_gpu.py (bf16 and fp32 on the GPU: Triton's interpreter mishandles the bf16
bit casts of the pair decoder ``_e2m1_pair``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsct.kernels.triton_lowbit._kernels import _w_tile_nk

_TL = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _decode_tile(codes, scales, out, DT: tl.constexpr):
    """The NVFP4 tile decoder on a [256, 16] factor (one block per row), in DT."""
    ns = tl.arange(0, 256)
    w = _w_tile_nk(1, codes, scales, 0, 0, 16, 256, ns, ns < 256, 16, 256, DT)
    tl.store(out + ns[:, None] * 16 + tl.arange(0, 16)[None, :], w)


def nvfp4_tile_probe(device="cpu"):
    """(codes uint8 [256, 8], block scales uint8 [256, 1], exact values float64 [256, 16]): row n holds
    all 16 E2M1 codes (k = code, even k in the low nibble) under the block scale byte n % 128 (every
    UE4M3 value, sign bit 0 as the format has it: zero, subnormals, 448, NaN); the value is
    e2m1 * sf * 2^-8 (the decoder leaves 2^8 / s_enc to the product's scale). Bytes with the sign bit
    are not block scales; on the GPU the decoder reads 0x80 as +0 where torch reads -0 (H200, 2026-11-30)."""
    from tsct.quant import formats

    k = torch.arange(16)
    codes = (k[0::2] | (k[1::2] << 4)).to(torch.uint8).repeat(256, 1)
    sf = (torch.arange(256, dtype=torch.int32) % 128).to(torch.uint8)[:, None]
    want = formats.e2m1_decode(k.to(torch.uint8))[None, :].double() * sf.view(torch.float8_e4m3fn).double() * 2.0 ** -8
    return codes.to(device), sf.to(device), want


def check_tile_decode(device="cpu", dtypes=(torch.bfloat16, torch.float32)) -> float:
    """0.0 when the decoded tile in each dtype equals the exact values rounded to bf16 bit for bit (NaN
    where the block scale is NaN; the values are exact in bf16), else inf."""
    codes, scales, want = nvfp4_tile_probe(device)
    ref = want.to(torch.bfloat16)
    nan = ref.isnan()
    for dt in dtypes:
        out = torch.empty(256, 16, dtype=dt, device=device)
        _decode_tile[(1,)](codes, scales, out, _TL[dt])
        got = out.cpu().to(torch.bfloat16)
        if not (torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), ref[~nan].view(torch.int16))):
            return float("inf")
    return 0.0
