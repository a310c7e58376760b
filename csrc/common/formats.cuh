// Exact NVFP4 / UE4M3 / E2M1 / sign arithmetic (docs/decisions/0002-nvfp4-recipe.md), FP8 (0020-fp8-format.md)
// and ternary (0021-ternary-format.md).
//
// Everything here is __host__ __device__ so the same source runs in the CUDA kernels and in the
// host harness (csrc/tools/host_reference.cpp) that the CPU tests compare against the torch
// reference. All float arithmetic is IEEE fp32 round-to-nearest-even; products and quotients go
// through mul_rn/div_rn so nvcc can never contract or approximate them (no fast-math anywhere).
#pragma once

#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDACC__)
#define TSCT_HD __host__ __device__ __forceinline__
#define TSCT_UNROLL _Pragma("unroll")
#else
#define TSCT_HD inline
#define TSCT_UNROLL
#endif

namespace tsct {
namespace fmt {

constexpr int kNvfp4Block = 16;   // K elements per UE4M3 scale
constexpr int kSignPack = 8;      // sign bits per byte
constexpr int kTernaryPack = 4;   // 2-bit ternary codes per byte
constexpr uint8_t kUe4m3Nan = 0x7F;
constexpr uint8_t kFp8NanCode = 0x7F;  // the E4M3 code of a non-finite input
// 2-bit ternary codes: two's complement for 0, +1, -1; the remaining pattern marks a non-finite input.
constexpr uint32_t kTernaryZero = 0u, kTernaryPlus = 1u, kTernaryNan = 2u, kTernaryMinus = 3u;

TSCT_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TSCT_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

TSCT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never fused into an FMA
#else
  return a * b;
#endif
}

TSCT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);  // IEEE division regardless of -prec-div
#else
  return a / b;
#endif
}

// Round to the nearest integer, ties to even (device: cvt.rni; host: the default FP environment).
TSCT_HD float rint_rne(float a) { return rintf(a); }

TSCT_HD bool is_finite(float f) { return (f2u(f) & 0x7F800000u) != 0x7F800000u; }
TSCT_HD bool sign_bit(float f) { return (f2u(f) >> 31) != 0; }
TSCT_HD float abs_f(float f) { return u2f(f2u(f) & 0x7FFFFFFFu); }

// fp32 -> float8_e4m3fn byte, round to nearest even, identical to `t.to(torch.float8_e4m3fn)` for
// every fp32 input (checked exhaustively against torch 2.13 on the host build): subnormals RNE,
// |v| > 448 and +-inf saturate to +-448 (0x7E | sign), nan -> 0x7F | sign.
TSCT_HD uint8_t e4m3_from_f32(float v) {
  const uint32_t bits = f2u(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abits = bits & 0x7FFFFFFFu;
  uint8_t r;
  if (abits > 0x7F800000u) {             // nan
    r = 0x7F;
  } else if (abits >= 0x43E00000u) {     // >= 448, inf: saturate
    r = 0x7E;
  } else if (abits < (121u << 23)) {     // < 2^-6: subnormal grid of 2^-9; exact scale, then RNE
    r = static_cast<uint8_t>(rint_rne(mul_rn(u2f(abits), 512.0f)));
  } else {                               // normal: RNE on the 20 dropped mantissa bits
    uint32_t b = abits;
    const uint32_t odd = (b >> 20) & 1u;
    b += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + odd;
    r = static_cast<uint8_t>(b >> 20);
  }
  return r | sign;
}

// float8_e4m3fn byte -> fp32 (exact; 0x7F / 0xFF are NaN; the sign bit is honoured).
TSCT_HD float e4m3_to_f32(uint8_t byte) {
  const uint32_t sign = static_cast<uint32_t>(byte & 0x80u) << 24;
  const uint32_t e = (byte >> 3) & 0xFu;
  const uint32_t m = byte & 0x7u;
  if (e == 0xFu && m == 0x7u) return u2f(sign | 0x7FC00000u);
  if (e == 0) return u2f(sign | f2u(mul_rn(static_cast<float>(m), 0.001953125f)));  // m * 2^-9
  return u2f(sign | ((e + 120u) << 23) | (m << 20));
}

// |y| -> E2M1 magnitude index 0..7, nearest with ties to the even index, saturating at 6.
// Midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5.0: a tie rounds up exactly when the lower index is odd,
// hence `>=` at the odd midpoints and `>` at the even ones. inf -> 7; nan -> 0 (never reached).
TSCT_HD uint8_t e2m1_magnitude_rne(float a) {
  return static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                              (a >= 3.5f) + (a > 5.0f));
}

// 4-bit code -> fp32 value (bit 3 sign: code 0x8 is -0.0).
TSCT_HD float e2m1_to_f32(uint8_t code) {
  // magnitudes in half units {0,1,2,3,4,6,8,12}, one nibble each: no table in local memory
  const uint32_t halves = (0xC8643210u >> (4u * (code & 0x7u))) & 0xFu;
  const float mag = mul_rn(static_cast<float>(halves), 0.5f);  // exact
  return u2f(f2u(mag) | (static_cast<uint32_t>(code & 0x8u) << 28));
}

// Byte offset of block scale (m, kb) inside one matrix's swizzled_128x4 buffer; kbp = Kb rounded
// up to a multiple of 4. CUTLASS Sm1xxBlockScaledConfig / cuBLAS / torchao to_blocked.
TSCT_HD int64_t swizzled_offset(int64_t m, int64_t kb, int64_t kbp) {
  return (m >> 7) * (kbp >> 2) * 512 + (kb >> 2) * 512 + (m & 31) * 16 + ((m & 127) >> 5) * 4 + (kb & 3);
}

TSCT_HD int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One 16-element NVFP4 block: x (fp32) and the matrix's encode scale -> scale byte, 8 code bytes.
TSCT_HD void nvfp4_quantize_block(const float (&x)[kNvfp4Block], float s_enc, uint8_t* scale_out,
                                  uint8_t (&packed)[kNvfp4Block / 2]) {
  float bamax = 0.0f;
  bool finite = true;
TSCT_UNROLL
  for (int i = 0; i < kNvfp4Block; ++i) {
    const bool f = is_finite(x[i]);
    finite = finite && f;
    const float a = abs_f(x[i]);
    if (f && a > bamax) bamax = a;
  }
  if (!finite) {  // a non-finite input poisons its own block, visibly: NaN scale, zero codes
    *scale_out = kUe4m3Nan;
TSCT_UNROLL
    for (int i = 0; i < kNvfp4Block / 2; ++i) packed[i] = 0;
    return;
  }
  float sf32 = div_rn(mul_rn(bamax, s_enc), 6.0f);
  sf32 = sf32 > 448.0f ? 448.0f : sf32;  // like torch.clamp(max=448): keeps a nan
  const uint8_t sf = e4m3_from_f32(sf32);
  const float sfv = e4m3_to_f32(sf);
  *scale_out = sf;
  uint8_t codes[kNvfp4Block];
TSCT_UNROLL
  for (int i = 0; i < kNvfp4Block; ++i) {
    uint8_t mag = 0;
    if (sfv != 0.0f) mag = e2m1_magnitude_rne(abs_f(div_rn(mul_rn(x[i], s_enc), sfv)));
    codes[i] = static_cast<uint8_t>((sign_bit(x[i]) ? 0x8u : 0u) | mag);
  }
TSCT_UNROLL
  for (int i = 0; i < kNvfp4Block / 2; ++i)
    packed[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));  // even index: low nibble
}

// x_hat = (e2m1(code) * sfv) / s_enc; a NaN scale gives NaN.
TSCT_HD float nvfp4_decode(uint8_t code, float sfv, float s_enc) {
  return div_rn(mul_rn(e2m1_to_f32(code), sfv), s_enc);
}

// w_hat = (+-1 * a) * b; bit set = negative.
TSCT_HD float sign_decode(bool negative, float a, float b) {
  return mul_rn(mul_rn(negative ? -1.0f : 1.0f, a), b);
}

// FP8 code of x with its column's decode scale: E4M3 of x / scale (RNE, saturating); NaN code if x is
// not finite (E4M3 has no inf; saturating an inf would hide it).
TSCT_HD uint8_t fp8_encode(float x, float scale) {
  return is_finite(x) ? e4m3_from_f32(div_rn(x, scale)) : kFp8NanCode;
}

// x_hat = e4m3(code) * scale (NaN codes give NaN).
TSCT_HD float fp8_decode(uint8_t code, float scale) { return mul_rn(e4m3_to_f32(code), scale); }

// Ternary code of x for the scale gamma (BitNet b1.58 RoundClip(x / gamma, -1, 1), round half to even):
// NaN code for a non-finite x; 0 if gamma == 0 or |x / gamma| <= 1/2; else the sign of x / gamma.
TSCT_HD uint32_t ternary_encode(float x, float gamma) {
  if (!is_finite(x)) return kTernaryNan;
  const float y = div_rn(x, gamma);
  if (gamma == 0.0f || !(abs_f(y) > 0.5f)) return kTernaryZero;
  return y < 0.0f ? kTernaryMinus : kTernaryPlus;
}

// w_hat = (q * a) * b, q = 0 / +1 / -1 / NaN by code (a = 1 for the absmean scaling: (q * 1) * b = q * b).
TSCT_HD float ternary_decode(uint32_t code, float a, float b) {
  const float q = code == kTernaryPlus ? 1.0f : code == kTernaryMinus ? -1.0f : code == kTernaryZero ? 0.0f
                                                                             : u2f(0x7FC00000u);
  return mul_rn(mul_rn(q, a), b);
}

// --- element types --------------------------------------------------------------------------
TSCT_HD float to_f32(float v) { return v; }
TSCT_HD float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
TSCT_HD float to_f32(__half v) { return __half2float(v); }

// Sign bit read from the stored bits (a nan's sign survives; no conversion can canonicalize it).
TSCT_HD bool raw_sign_bit(float v) { return (f2u(v) >> 31) != 0; }
TSCT_HD bool raw_sign_bit(__nv_bfloat16 v) { return (__bfloat16_as_ushort(v) >> 15) != 0; }
TSCT_HD bool raw_sign_bit(__half v) { return (__half_as_ushort(v) >> 15) != 0; }

template <typename T> TSCT_HD T from_f32(float v);
template <> TSCT_HD float from_f32<float>(float v) { return v; }
template <> TSCT_HD __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> TSCT_HD __half from_f32<__half>(float v) { return __float2half_rn(v); }

}  // namespace fmt
}  // namespace tsct
