"""Exhaustive check of the NVFP4 tile decoder (``_kernels._w_tile_nk``): every E2M1 code at every nibble
position under every UE4M3 block scale, in each product dtype. Used by the interpreter check (fp32, CPU)
and by tests/gpu/test_triton_lowbit_gpu.py (bf16 and fp32 on the GPU: Triton's interpreter gets bf16
multiplies wrong, so the bf16 pair decoder ``_e2m1_pair`` can only be checked on a GPU)."""

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
    the code (k + n) % 16 at position k (even k in the low nibble), so every code meets every nibble
    position and sign pattern, under the block scale byte n % 128 (every UE4M3 value with sign bit 0,
    as the format has it: zero, subnormals, 448, NaN; rows n and n + 128 differ in their codes); the
    value is e2m1 * sf * 2^-8 (the decoder leaves 2^8 / s_enc to the product's scale). Bytes with the
    sign bit are not block scales; on the GPU the decoder reads 0x80 as +0 where torch reads -0 (H200,
    2026-11-30)."""
    from tsct.quant import formats

    n = torch.arange(256)[:, None]
    code = (torch.arange(16)[None, :] + n) % 16                                 # [256, 16]
    codes = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    sf = (n % 128).to(torch.uint8)
    want = formats.e2m1_decode(code.to(torch.uint8)).double() * sf.view(torch.float8_e4m3fn).double() * 2.0 ** -8
    return codes.to(device), sf.to(device), want


def check_tile_decode(device="cpu", dtypes=(torch.bfloat16, torch.float32)) -> float:
    """0.0 when the decoded tile in each dtype holds the exact values (they are exact in bf16 and fp32),
    bit for bit, NaN where the block scale is NaN; else inf."""
    codes, scales, want = nvfp4_tile_probe(device)
    for dt in dtypes:
        ref = want.to(dt)
        nan = ref.isnan()
        out = torch.empty(256, 16, dtype=dt, device=device)
        _decode_tile[(1,)](codes, scales, out, _TL[dt])
        got = out.cpu()
        if not (torch.equal(got.isnan(), nan) and torch.equal(got[~nan], ref[~nan])
                and torch.equal(got[~nan].signbit(), ref[~nan].signbit())):
            return float("inf")
    return 0.0
