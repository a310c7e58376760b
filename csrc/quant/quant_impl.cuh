// Per-thread bodies of the quantize/decode kernels, shared by the CUDA kernels (nvfp4.cu, sign.cu, fp8.cu,
// ternary.cu) and the host harness (tools/host_reference.cpp), so the CPU tests exercise the exact indexing,
// layout and arithmetic code that runs on the GPU. One "item" = one 16-element NVFP4 block, one sign byte
// (8 elements), one 16-element FP8 chunk of a row, or one ternary byte (4 elements); kernels run items in a
// grid-stride loop, the harness in a plain loop.
#pragma once

#include <stdint.h>
#include <string.h>

#include "common/formats.cuh"

namespace tsct {
namespace quant {

using fmt::kNvfp4Block;
using fmt::kSignPack;
using fmt::kTernaryPack;
constexpr int kFp8Chunk = 16;  // K elements per FP8 item (one 128-bit code store)

// Loads n contiguous elements as fp32. `vec`: p is 16-byte aligned and n*sizeof(T) is a multiple of
// 16, so the device path uses 128-bit loads; the host harness always takes the scalar path.
template <typename T, int N>
TSCT_HD void load_f32(const T* p, bool vec, float (&out)[N]) {
#if defined(__CUDA_ARCH__)
  static_assert((N * sizeof(T)) % 16 == 0, "vector load size");
  if (vec) {
    T e[N];
TSCT_UNROLL
    for (int i = 0; i < int(N * sizeof(T) / 16); ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      memcpy(reinterpret_cast<char*>(e) + 16 * i, &v, 16);
    }
TSCT_UNROLL
    for (int i = 0; i < N; ++i) out[i] = fmt::to_f32(e[i]);
    return;
  }
#endif
  (void)vec;
TSCT_UNROLL
  for (int i = 0; i < N; ++i) out[i] = fmt::to_f32(p[i]);
}

// Stores n fp32 values converted (RNE) to T.
template <typename T, int N>
TSCT_HD void store_from_f32(T* p, bool vec, const float (&v)[N]) {
  T e[N];
TSCT_UNROLL
  for (int i = 0; i < N; ++i) e[i] = fmt::from_f32<T>(v[i]);
#if defined(__CUDA_ARCH__)
  static_assert((N * sizeof(T)) % 16 == 0, "vector store size");
  if (vec) {
TSCT_UNROLL
    for (int i = 0; i < int(N * sizeof(T) / 16); ++i) {
      uint4 w;
      memcpy(&w, reinterpret_cast<const char*>(e) + 16 * i, 16);
      reinterpret_cast<uint4*>(p)[i] = w;
    }
    return;
  }
#endif
  (void)vec;
TSCT_UNROLL
  for (int i = 0; i < N; ++i) p[i] = e[i];
}

// --- NVFP4 --------------------------------------------------------------------------------------
struct Nvfp4Args {
  const void* x;          // quantize: input [batch, n, k] of T
  void* out;              // decode: output [batch, n, k] of T
  uint8_t* codes;         // [batch, n, k/2]
  uint8_t* block_scale;   // linear [batch, n, k/16] or swizzled [batch, np*kbp]
  const float* s_enc;     // [batch]
  int64_t batch, n, k;
  int64_t kb, np, kbp;    // k/16; n and kb padded for the swizzled layout (128, 4)
  int64_t rows_dom, kb_dom;  // item domain per matrix: (n, kb), or (np, kbp) when quantizing swizzled
  int swizzled;
  int vec;                // all element pointers 16-byte aligned (codes 8-byte): vector accesses
};

TSCT_HD int64_t nvfp4_scale_offset(const Nvfp4Args& a, int64_t b, int64_t m, int64_t kbi) {
  return a.swizzled ? b * a.np * a.kbp + fmt::swizzled_offset(m, kbi, a.kbp) : (b * a.n + m) * a.kb + kbi;
}

// Item t over (batch, rows_dom, kb_dom). With the swizzled layout the domain covers the padding,
// whose scale bytes are written 0 here, so no separate memset pass is needed.
template <typename T>
TSCT_HD void nvfp4_quantize_item(const Nvfp4Args& a, int64_t t) {
  const int64_t kbi = t % a.kb_dom;
  const int64_t r = t / a.kb_dom;
  const int64_t m = r % a.rows_dom;
  const int64_t b = r / a.rows_dom;
  if (m >= a.n || kbi >= a.kb) {
    a.block_scale[nvfp4_scale_offset(a, b, m, kbi)] = 0;
    return;
  }
  const int64_t row = b * a.n + m;
  float x[kNvfp4Block];
  load_f32<T, kNvfp4Block>(static_cast<const T*>(a.x) + row * a.k + kbi * kNvfp4Block, a.vec != 0, x);
  uint8_t packed[kNvfp4Block / 2];
  uint8_t sf;
  fmt::nvfp4_quantize_block(x, a.s_enc[b], &sf, packed);
  uint8_t* c = a.codes + row * (a.k / 2) + kbi * (kNvfp4Block / 2);
#if defined(__CUDA_ARCH__)
  if (a.vec) {
    uint2 w;
    memcpy(&w, packed, 8);
    *reinterpret_cast<uint2*>(c) = w;
  } else
#endif
  {
    for (int i = 0; i < kNvfp4Block / 2; ++i) c[i] = packed[i];
  }
  a.block_scale[nvfp4_scale_offset(a, b, m, kbi)] = sf;
}

// Item t over (batch, n, kb): one block decoded to 16 outputs.
template <typename T>
TSCT_HD void nvfp4_dequantize_item(const Nvfp4Args& a, int64_t t) {
  const int64_t kbi = t % a.kb;
  const int64_t r = t / a.kb;
  const int64_t m = r % a.n;
  const int64_t b = r / a.n;
  const int64_t row = b * a.n + m;
  const uint8_t* c = a.codes + row * (a.k / 2) + kbi * (kNvfp4Block / 2);
  uint8_t packed[kNvfp4Block / 2];
#if defined(__CUDA_ARCH__)
  if (a.vec) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(c));
    memcpy(packed, &w, 8);
  } else
#endif
  {
    for (int i = 0; i < kNvfp4Block / 2; ++i) packed[i] = c[i];
  }
  const float sfv = fmt::e4m3_to_f32(a.block_scale[nvfp4_scale_offset(a, b, m, kbi)]);
  const float s_enc = a.s_enc[b];
  float v[kNvfp4Block];
TSCT_UNROLL
  for (int i = 0; i < kNvfp4Block / 2; ++i) {
    v[2 * i] = fmt::nvfp4_decode(packed[i] & 0xF, sfv, s_enc);
    v[2 * i + 1] = fmt::nvfp4_decode(packed[i] >> 4, sfv, s_enc);
  }
  store_from_f32<T, kNvfp4Block>(static_cast<T*>(a.out) + row * a.k + kbi * kNvfp4Block, a.vec != 0, v);
}

// --- sign ---------------------------------------------------------------------------------------
struct SignArgs {
  const void* w;          // pack: input [batch, n, k] of T
  void* out;              // decode: output [batch, n, k] of T
  uint8_t* bits;          // [batch, n, k/8]
  const float* a;         // decode: [batch, k]
  const float* scale_n;   // decode: [batch, n]
  int64_t batch, n, k, kbytes;  // kbytes = k/8
  int vec;
};

// Item t over (batch, n, kbytes): 8 elements -> one byte, element 8i+j in bit j.
template <typename T>
TSCT_HD void sign_pack_item(const SignArgs& s, int64_t t) {
  const T* p = static_cast<const T*>(s.w) + t * kSignPack;
  T e[kSignPack];
#if defined(__CUDA_ARCH__)
  if (s.vec) {
TSCT_UNROLL
    for (int i = 0; i < int(kSignPack * sizeof(T) / 16); ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      memcpy(reinterpret_cast<char*>(e) + 16 * i, &v, 16);
    }
  } else
#endif
  {
    for (int i = 0; i < kSignPack; ++i) e[i] = p[i];
  }
  uint32_t byte = 0;
TSCT_UNROLL
  for (int j = 0; j < kSignPack; ++j) byte |= static_cast<uint32_t>(fmt::raw_sign_bit(e[j])) << j;
  s.bits[t] = static_cast<uint8_t>(byte);
}

// Item t over (batch, n, kbytes): one byte -> 8 outputs (+-1 * a[b, k]) * scale_n[b, n].
template <typename T>
TSCT_HD void sign_dequantize_item(const SignArgs& s, int64_t t) {
  const int64_t kbyte = t % s.kbytes;
  const int64_t r = t / s.kbytes;
  const int64_t m = r % s.n;
  const int64_t b = r / s.n;
  const uint32_t byte = s.bits[t];
  float av[kSignPack];
  load_f32<float, kSignPack>(s.a + b * s.k + kbyte * kSignPack, s.vec != 0, av);
  const float bn = s.scale_n[b * s.n + m];
  float v[kSignPack];
TSCT_UNROLL
  for (int j = 0; j < kSignPack; ++j) v[j] = fmt::sign_decode(((byte >> j) & 1u) != 0, av[j], bn);
  store_from_f32<T, kSignPack>(static_cast<T*>(s.out) + t * kSignPack, s.vec != 0, v);
}

// --- FP8 (E4M3 codes, one decode scale per row of storage = column of the logical factor) ----------
struct Fp8Args {
  const void* x;          // quantize: input [batch, n, k] of T
  void* out;              // decode: output [batch, n, k] of T
  uint8_t* codes;         // [batch, n, k] E4M3 bytes
  const float* scale_n;   // [batch, n]
  int64_t batch, n, k, kc;  // kc = ceil(k / 16): items per row
  int vec;                // k % 16 == 0 and the element / code pointers 16-byte aligned: vector accesses
};

// Item t over (batch * n, kc): up to 16 elements of one row -> their codes.
template <typename T>
TSCT_HD void fp8_quantize_item(const Fp8Args& a, int64_t t) {
  const int64_t row = t / a.kc;
  const int64_t k0 = (t % a.kc) * kFp8Chunk;
  const float s = a.scale_n[row];
  const T* src = static_cast<const T*>(a.x) + row * a.k + k0;
  uint8_t* dst = a.codes + row * a.k + k0;
  if (a.vec) {  // a full chunk
    float x[kFp8Chunk];
    load_f32<T, kFp8Chunk>(src, true, x);
    uint8_t q[kFp8Chunk];
TSCT_UNROLL
    for (int i = 0; i < kFp8Chunk; ++i) q[i] = fmt::fp8_encode(x[i], s);
#if defined(__CUDA_ARCH__)
    uint4 w;
    memcpy(&w, q, 16);
    *reinterpret_cast<uint4*>(dst) = w;
#else
    memcpy(dst, q, kFp8Chunk);
#endif
    return;
  }
  const int64_t len = a.k - k0 < kFp8Chunk ? a.k - k0 : kFp8Chunk;
  for (int64_t i = 0; i < len; ++i) dst[i] = fmt::fp8_encode(fmt::to_f32(src[i]), s);
}

// Item t over (batch * n, kc): up to 16 codes -> e4m3 * scale, stored as T.
template <typename T>
TSCT_HD void fp8_dequantize_item(const Fp8Args& a, int64_t t) {
  const int64_t row = t / a.kc;
  const int64_t k0 = (t % a.kc) * kFp8Chunk;
  const float s = a.scale_n[row];
  const uint8_t* src = a.codes + row * a.k + k0;
  T* dst = static_cast<T*>(a.out) + row * a.k + k0;
  if (a.vec) {
    uint8_t q[kFp8Chunk];
#if defined(__CUDA_ARCH__)
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(src));
    memcpy(q, &w, 16);
#else
    memcpy(q, src, kFp8Chunk);
#endif
    float v[kFp8Chunk];
TSCT_UNROLL
    for (int i = 0; i < kFp8Chunk; ++i) v[i] = fmt::fp8_decode(q[i], s);
    store_from_f32<T, kFp8Chunk>(dst, true, v);
    return;
  }
  const int64_t len = a.k - k0 < kFp8Chunk ? a.k - k0 : kFp8Chunk;
  for (int64_t i = 0; i < len; ++i) dst[i] = fmt::from_f32<T>(fmt::fp8_decode(src[i], s));
}

// --- ternary (2-bit codes, 4 per byte along K) ---------------------------------------------------
struct TernaryArgs {
  const void* x;          // pack: input [batch, n, k] of T
  void* out;              // decode: output [batch, n, k] of T
  uint8_t* codes;         // [batch, n, k/4]
  const float* scale_k;   // [batch, k] (rank-1 scaling's a), or null (absmean scaling: a = 1)
  const float* scale_n;   // [batch, n]
  int64_t batch, n, k, kbytes;  // kbytes = k/4
};

// Item t over (batch, n, kbytes): 4 elements -> one byte, element 4i+j in bits 2j..2j+1.
template <typename T>
TSCT_HD void ternary_pack_item(const TernaryArgs& s, int64_t t) {
  const int64_t kbyte = t % s.kbytes;
  const int64_t row = t / s.kbytes;
  const int64_t b = row / s.n;
  const float bn = s.scale_n[row];
  const T* src = static_cast<const T*>(s.x) + t * kTernaryPack;
  uint32_t byte = 0;
TSCT_UNROLL
  for (int j = 0; j < kTernaryPack; ++j) {
    const float gamma = s.scale_k ? fmt::mul_rn(s.scale_k[b * s.k + kbyte * kTernaryPack + j], bn) : bn;
    byte |= fmt::ternary_encode(fmt::to_f32(src[j]), gamma) << (2 * j);
  }
  s.codes[t] = static_cast<uint8_t>(byte);
}

// Item t over (batch, n, kbytes): one byte -> 4 outputs (q * a[b, k]) * scale_n[b, n].
template <typename T>
TSCT_HD void ternary_dequantize_item(const TernaryArgs& s, int64_t t) {
  const int64_t kbyte = t % s.kbytes;
  const int64_t row = t / s.kbytes;
  const int64_t b = row / s.n;
  const uint32_t byte = s.codes[t];
  const float bn = s.scale_n[row];
  T* dst = static_cast<T*>(s.out) + t * kTernaryPack;
TSCT_UNROLL
  for (int j = 0; j < kTernaryPack; ++j) {
    const float a = s.scale_k ? s.scale_k[b * s.k + kbyte * kTernaryPack + j] : 1.0f;
    dst[j] = fmt::from_f32<T>(fmt::ternary_decode((byte >> (2 * j)) & 3u, a, bn));
  }
}

}  // namespace quant
}  // namespace tsct
