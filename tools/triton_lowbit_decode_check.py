"""Exhaustive check of the NVFP4, FP8 and ternary tile decoders (``_kernels._w_tile_nk``): every E2M1 code at every
nibble position under every UE4M3 block scale, every E4M3 byte and every ternary byte at every position, in each
product dtype. Used by the
interpreter check (fp32, CPU; and the ternary bf16 tile: ``_ternary_pair`` has no multiply) and by
tests/kernels/test_triton_lowbit_gpu.py (bf16 and fp32 on the GPU: Triton's interpreter gets bf16 multiplies wrong, so
the bf16 pair decoders ``_e2m1_pair`` / ``_e4m3_pair`` are checked on a GPU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsct.kernels.triton_lowbit._kernels import _w_tile_nk

_TL = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _decode_tile(FMT: tl.constexpr, codes, scales, out, DT: tl.constexpr):
    """The tile decoder of format FMT (``_kernels``' numbering) on a [256, 16] factor, in DT: NVFP4 with one block
    scale per row; FP8 and ternary (absmean form) read no scales (pass the codes again)."""
    ns = tl.arange(0, 256)
    w = _w_tile_nk(FMT, codes, scales, 0, 0, 16, 256, ns, ns < 256, 16, 256, DT)
    tl.store(out + ns[:, None] * 16 + tl.arange(0, 16)[None, :], w)


def ternary_tile_probe(device="cpu"):
    """(ternary bytes uint8 [256, 4], exact values float64 [256, 16]): row n holds the byte (n + 37 i) % 256 at
    byte position i, so every byte (every code, 0b10 = NaN included, at every bit pair) meets every position."""
    from tsct.quant import formats

    byt = ((torch.arange(256)[:, None] + 37 * torch.arange(4)[None, :]) % 256).to(torch.uint8)
    return byt.to(device), formats.ternary_decode(formats.unpack_2bit(byt)).double()


def fp8_tile_probe(device="cpu"):
    """(E4M3 bytes uint8 [256, 16], exact values float64 [256, 16]): row n holds the byte (n + 17 k) % 256 at
    position k, so every byte (zeros of both signs, subnormals, 448, the NaN codes 0x7F / 0xFF) meets every
    position, the even and the odd ones the pair decoder treats apart."""
    byt = ((torch.arange(256)[:, None] + 17 * torch.arange(16)[None, :]) % 256).to(torch.uint8)
    return byt.to(device), byt.view(torch.float8_e4m3fn).double()


def nvfp4_tile_probe(device="cpu"):
    """(codes uint8 [256, 8], block scales uint8 [256, 1], exact values float64 [256, 16]): row n holds
    the code (k + n) % 16 at position k (even k in the low nibble), so every code meets every nibble
    position and sign pattern, under the block scale byte n % 128 (every UE4M3 value with sign bit 0,
    as the format has it: zero, subnormals, 448, NaN; rows n and n + 128 differ in their codes); the
    value is e2m1 * sf * 2^-8 (the decoder leaves 2^8 / s_enc to the product's scale). Bytes with the
    sign bit are not block scales (the FP8 probe has them: both decoders give -0 for 0x80, as torch)."""
    from tsct.quant import formats

    n = torch.arange(256)[:, None]
    code = (torch.arange(16)[None, :] + n) % 16                                 # [256, 16]
    codes = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    sf = (n % 128).to(torch.uint8)
    want = formats.e2m1_decode(code.to(torch.uint8)).double() * sf.view(torch.float8_e4m3fn).double() * 2.0 ** -8
    return codes.to(device), sf.to(device), want


def _mismatches(got: torch.Tensor, ref: torch.Tensor) -> int:
    """Elements not equal bit for bit: NaN at other places, other values or other signs (of zeros too)."""
    nan = ref.isnan()
    bad = got.isnan() != nan
    bad |= ~nan & ((got != ref) | (got.signbit() != ref.signbit()))
    return int(bad.sum())


def tile_mismatches(device="cpu", dtypes=(torch.bfloat16, torch.float32)) -> dict[str, int]:
    """{"nvfp4 bfloat16": elements, ...}: how many elements of the NVFP4, FP8 and ternary decoded tiles in each
    dtype differ from the exact values (they are exact in bf16 and fp32), NaN where the block scale or the code is
    NaN."""
    codes, scales, want = nvfp4_tile_probe(device)
    byt, want8 = fp8_tile_probe(device)
    tern, want3 = ternary_tile_probe(device)
    probes = {"nvfp4": (1, codes, scales, want), "fp8": (3, byt, byt, want8), "ternary": (4, tern, tern, want3)}
    out = {}
    for dt in dtypes:
        name = str(dt).removeprefix("torch.")
        for fmt, (code, p0, p1, ref) in probes.items():
            got = torch.empty(256, 16, dtype=dt, device=device)
            _decode_tile[(1,)](code, p0, p1, got, _TL[dt])
            out[f"{fmt} {name}"] = _mismatches(got.cpu(), ref.to(dt))
    return out


def check_tile_decode(device="cpu", dtypes=(torch.bfloat16, torch.float32)) -> float:
    """0.0 when ``tile_mismatches`` finds none, else inf."""
    return 0.0 if not any(tile_mismatches(device, dtypes).values()) else float("inf")
