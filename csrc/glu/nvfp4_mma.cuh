// Device helpers shared by the CUDA low-bit grouped GLU kernels (down_nvfp4.cu, up_nvfp4.cu): NVFP4, sign, FP8 and
// ternary codes decoded straight into bf16 mma.sync m16n8k16 A fragments, and the matching layout of the bf16 B
// operand in shared memory.
//
// K order. The kernels permute K inside each 64-wide K chunk, identically for both operands (a contraction does
// not care): lane (g, c) of a warp (g = lane / 4, c = lane % 4) handles the 16 consecutive k = 16c..16c+15 of the
// chunk, which are exactly two 32-bit code words and ONE UE4M3 block scale per factor row. A code word decodes
// into four bf16 pairs, elements (j, j + 4): their nibbles sit 16 bits apart, as the halves of a bf16 pair do, so
// one shift and mask per field builds both (e2m1_pair). Pair p of the lane's 8 pairs (p < 4: word lo, p >= 4:
// word hi) feeds mma step p / 2, slots 2c, 2c+1 (p even) or 2c+8, 2c+9 (p odd).
//
// B tiles ([rows][64] bf16, 128-byte rows, K contiguous) get the same pairing: after its cp.async, each thread
// rewrites the 16-byte pieces it copied (bt_permute: elements 0..7 -> pairs (0,4) (1,5) (2,6) (3,7)). Pieces are
// stored swizzled so the fragment loads (one 8-byte unit per lane and mma step) hit 16 distinct bank pairs per
// half warp: 8-byte unit u of row r sits at unit u ^ (r & 3) (piece p at p ^ ((r >> 1) & 1), halves swapped on
// odd rows).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/mma_sm80.cuh"
#include "common/wgmma_sm90.cuh"

namespace tsct {
namespace nvfp4mma {

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// UE4M3 byte -> sf * 2^118 as a bf16 pair (both halves): exact (sf has <= 4 significant bits; 448 * 2^118
// < 2^127). 0x7F / 0xFF are NaN, as in the Triton decoder and torch. The kernels tabulate it (256 words).
__device__ inline uint32_t scale_pair(uint32_t b) {
  const uint32_t ex = (b >> 3) & 15, man = b & 7;
  float v = ex ? __uint_as_float(((ex + 120u) << 23) | (man << 20)) : (float)man * 0.001953125f;
  if ((b & 127) == 127) v = __uint_as_float(0x7fc00000u);
  if (b & 128) v = -v;
  v *= 3.32306998946229e+35f;  // 2^118
  const uint32_t h = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
  return h | (h << 16);
}

// Nibbles J and J + 4 of a code word as a bf16 pair of e2m1 * 2^-126 (magnitude bits to 8..6, sign to 15): the
// Triton decoder's _e2m1_pair (triton_lowbit/_kernels.py), checked exhaustively there. Times scale_pair this is
// e2m1 * sf * 2^-8, exact (<= 6 significant bits); the kernels multiply the fp32 accumulator by 2^8 / s_enc.
template <int J>  // 0..3
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w) {
  const uint32_t mag = (J <= 1 ? (w << (6 - 4 * J)) : (w >> (4 * J - 6))) & 0x01C001C0u;
  const uint32_t sgn = (w << (12 - 4 * J)) & 0x80008000u;
  return mag | sgn;
}

// a * b per bf16 half (fma with -0: the same bits as a multiply, including the sign of zero; mul.bf16x2 needs
// sm_90, fma.bf16x2 sm_80)
__device__ __forceinline__ uint32_t hmul2_bf16(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// The four A registers of mma step S for rows g (codes w0, scale pair s0) and g + 8 (w1, s1): pairs 2S, 2S + 1.
template <int S>
__device__ __forceinline__ void a_step(uint2 w0, uint2 w1, uint32_t s0, uint32_t s1, uint32_t* a) {
  const uint32_t v0 = S < 2 ? w0.x : w0.y, v1 = S < 2 ? w1.x : w1.y;
  a[0] = hmul2_bf16(S % 2 == 0 ? e2m1_pair<0>(v0) : e2m1_pair<2>(v0), s0);
  a[1] = hmul2_bf16(S % 2 == 0 ? e2m1_pair<0>(v1) : e2m1_pair<2>(v1), s1);
  a[2] = hmul2_bf16(S % 2 == 0 ? e2m1_pair<1>(v0) : e2m1_pair<3>(v0), s0);
  a[3] = hmul2_bf16(S % 2 == 0 ? e2m1_pair<1>(v1) : e2m1_pair<3>(v1), s1);
}

// Sign factors (docs/formats.md: bit k % 8 of byte k / 8, LSB first, 1 = negative; W = (+-a[k]) b[n]) decode the
// same way: the A registers are bf16 pairs of a[k] in the pair order above (a_pairs), their signs flipped by the
// lane's 16 sign bits. sign_spread puts bit j + 4 of each byte 16 bits above bit j, so one shift and mask moves the
// signs of a pair to bits 15 and 31 (sign_pair). +-bf16(a) is the Triton path's rounding of +-a.
__device__ __forceinline__ uint32_t sign_spread(uint32_t s) { return s | (s << 12); }

template <int P>  // 0..7: elements (P, P + 4) of the lane's 16 for P < 4, else (P + 4, P + 8)
__device__ __forceinline__ uint32_t sign_pair(uint32_t s2, uint32_t apair) {
  return ((s2 << (P < 4 ? 15 - P : 11 - P)) & 0x80008000u) ^ apair;
}

// The 8 bf16 pairs of a[0..15] (fp32, 16-byte aligned) in pair order.
__device__ __forceinline__ void a_pairs(const float* a, uint32_t* ap) {
  const float4 v0 = reinterpret_cast<const float4*>(a)[0], v1 = reinterpret_cast<const float4*>(a)[1];
  const float4 v2 = reinterpret_cast<const float4*>(a)[2], v3 = reinterpret_cast<const float4*>(a)[3];
  ap[0] = tsct::sm80::pack_bf16(v0.x, v1.x);
  ap[1] = tsct::sm80::pack_bf16(v0.y, v1.y);
  ap[2] = tsct::sm80::pack_bf16(v0.z, v1.z);
  ap[3] = tsct::sm80::pack_bf16(v0.w, v1.w);
  ap[4] = tsct::sm80::pack_bf16(v2.x, v3.x);
  ap[5] = tsct::sm80::pack_bf16(v2.y, v3.y);
  ap[6] = tsct::sm80::pack_bf16(v2.z, v3.z);
  ap[7] = tsct::sm80::pack_bf16(v2.w, v3.w);
}

// The four A registers of mma step S for sign rows g (spread signs s0) and g + 8 (s1), a pairs ap.
template <int S>
__device__ __forceinline__ void a_step_sign(uint32_t s0, uint32_t s1, const uint32_t* ap, uint32_t* a) {
  a[0] = sign_pair<2 * S>(s0, ap[2 * S]);
  a[1] = sign_pair<2 * S>(s1, ap[2 * S]);
  a[2] = sign_pair<2 * S + 1>(s0, ap[2 * S + 1]);
  a[3] = sign_pair<2 * S + 1>(s1, ap[2 * S + 1]);
}

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// Factor formats of the kernels (triton_lowbit's FMT codes): NVFP4, sign, FP8 (E4M3 codes, scale_n), ternary
// (2-bit codes, scale_n) and ternary with the rank-1 scaling (also scale_k).
constexpr int kNvfp4 = 1, kSign = 2, kFp8 = 3, kTernary = 4, kTernaryR1 = 5;

// prmt in its default mode: byte i of the result is byte s_i & 7 of {b, a} (a: bytes 0..3), or, when bit 3 of
// the selector nibble s_i is set, that byte's sign bit replicated (inline asm: the __byte_perm documentation
// masks the selector to 3 bits)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

// FP8 (docs/decisions/0021-fp8-format.md): a lane's 16 E4M3 codes are 16 bytes (q.x: elements 0..3, q.y 4..7,
// q.z 8..11, q.w 12..15). Pair P (elements (P, P + 4) for P < 4, else (P + 4, P + 8)) as a bf16 pair of
// e4m3 * 2^-120: one prmt puts each byte in the low byte of its half and its sign replicated above it, a shift
// and mask leave the sign at bit 15 and exponent and mantissa at bits 10..4 (bf16 exponent field = e4m3's,
// mantissa aligned; e4m3 subnormals are bf16 subnormals), and the code 0x7F / 0xFF (magnitude bits all ones: the
// + 0x10 carries into bit 11) gets bits 14..11 set, a NaN. Times 2^120 (bf16 0x7B80, exact): e4m3 exactly, NaN for
// the NaN codes, as triton_lowbit's _ue4m3 (checked exhaustively against torch's float8_e4m3fn decode).
template <int P>  // 0..7
__device__ __forceinline__ uint32_t fp8_pair(const uint4& q) {
  constexpr uint32_t j = P & 3, sel = j | (j | 8) << 4 | (j + 4) << 8 | ((j + 4) | 8) << 12;
  const uint32_t h = (prmt(P < 4 ? q.x : q.z, P < 4 ? q.y : q.w, sel) << 4) & 0x87F087F0u;
  const uint32_t nan = (h + 0x00100010u) & 0x08000800u;
  return hmul2_bf16(nan * 15u + h, 0x7B807B80u);
}

// Ternary (docs/decisions/0022-ternary-format.md): a lane's 16 2-bit codes are one 32-bit word (element i in bits
// 2i, 2i + 1). Pair P (elements as fp8_pair's) as a bf16 pair of q = 0, +1, NaN, -1 for the codes 0..3: the two
// codes become the selector nibbles of one prmt over a table of the four bf16 values (low bytes in the first
// word, high bytes in the second): exact, as triton_lowbit's _ternary_w.
template <int P>  // 0..7
__device__ __forceinline__ uint32_t ternary_pair(uint32_t w) {
  constexpr int sh = P < 4 ? 2 * P : 2 * P + 8;  // elements P, P + 4 or P + 4, P + 8: bytes 0, 1 or 2, 3
  return prmt(0x80C08000u, 0xBF7F3F00u, ((w >> sh) & 0x0303u) * 0x11u + 0x4040u);
}

// Pair P of an fp8 / ternary lane: the bf16 decode of its codes c; the rank-1 ternary scaling multiplies by the
// bf16 pair kp[P] of scale_k (q * bf16(scale_k): the bits of Triton's bf16(q * scale_k) for q = 0, +-1 and NaN,
// a finite scale_k that rounds to a bf16 inf aside).
template <int FMT, int P, typename C>
__device__ __forceinline__ uint32_t q_pair(const C& c, const uint32_t* kp) {
  if constexpr (FMT == kFp8) {
    return fp8_pair<P>(c);
  } else {
    const uint32_t t = ternary_pair<P>(c);
    return FMT == kTernaryR1 ? hmul2_bf16(t, kp[P]) : t;
  }
}

// The four A registers of mma step S for fp8 / ternary rows g (codes c0) and g + 8 (c1), pairs 2S, 2S + 1.
template <int FMT, int S, typename C>
__device__ __forceinline__ void a_step_q(const C& c0, const C& c1, const uint32_t* kp, uint32_t* a) {
  a[0] = q_pair<FMT, 2 * S>(c0, kp);
  a[1] = q_pair<FMT, 2 * S>(c1, kp);
  a[2] = q_pair<FMT, 2 * S + 1>(c0, kp);
  a[3] = q_pair<FMT, 2 * S + 1>(c1, kp);
}

// Byte offset of 16-byte piece p of row r in a swizzled B tile (128-byte rows).
__device__ __forceinline__ uint32_t bt_piece(int r, int p) { return r * 128 + 16 * (p ^ ((r >> 1) & 1)); }

// Rewrite one copied piece of row r (at bt_piece) into mma pair order, halves swapped on odd rows.
__device__ __forceinline__ void bt_permute(unsigned char* tile, int r, int p) {
  uint4* q = reinterpret_cast<uint4*>(tile + bt_piece(r, p));
  const uint4 v = *q;
  const uint32_t p0 = __byte_perm(v.x, v.z, 0x5410), p1 = __byte_perm(v.x, v.z, 0x7632);
  const uint32_t p2 = __byte_perm(v.y, v.w, 0x5410), p3 = __byte_perm(v.y, v.w, 0x7632);
  *q = (r & 1) ? make_uint4(p2, p3, p0, p1) : make_uint4(p0, p1, p2, p3);
}

// Byte offset of lane (g, c)'s B registers of mma step s in n8 tile 0 (add t * 1024 for tile t): its row is g.
__device__ __forceinline__ uint32_t bt_frag(int g, int c, int s) { return g * 128 + 8 * ((4 * c + s) ^ (g & 3)); }

#if TSCT_WGMMA
// The same pairing for wgmma's B operand (sm_90a): the tensor cores read B from shared memory themselves, so the
// tile must be in their 128-byte swizzled K-major layout (wgmma_sm90.cuh) with the physical k already in mma pair
// order. Lane c's A registers of step s hold physical k 16s + 2c, +1 (chunk 2s, word c) and 16s + 8 + 2c, +1 (chunk 2s + 1,
// word c), which a_step fills with pair (i, i + 4) of piece 2c + (s >= 2), i = 2 (s % 2) or 2 (s % 2) + 1: so chunk
// 4h + i (h = 0, 1) holds pair word i of logical 16-byte pieces h, 2 + h, 4 + h, 6 + h, in that order. Thread
// (row n, half h) copies pieces 2m + h to chunks 4h + m (wg_copy_half_row, given the row at piece h) and, once
// they have arrived, rewrites its own four chunks in place (wg_permute): no other thread touches them, and the
// accesses are free of bank conflicts.
__device__ __forceinline__ uint32_t wg_piece(int n, int h, int m) { return tsct::sm90::wg_chunk(n, 4 * h + m); }

// cp.async of the 64 bf16 row[k0 .. k0 + 63] (16-byte aligned) into the pieces of half h of tile row n; row null:
// zeros (the copies name `gmem`, any global address, and read 0 bytes of it)
__device__ __forceinline__ void wg_copy_half_row(unsigned char* tile, int n, int h, const __nv_bfloat16* row, int k0,
                                                 const void* gmem) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t dst = tsct::sm80::smem_u32(tile + wg_piece(n, h, m));
    if (row)
      tsct::sm80::cp_async16(dst, row + k0 + 16 * m, 16);
    else
      tsct::sm80::cp_async16(dst, gmem, 0);
  }
}

// ends with the proxy fence: once a barrier follows, wgmma may read the tile
__device__ __forceinline__ void wg_permute(unsigned char* tile, int n, int h) {
  uint4 v[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) v[m] = *reinterpret_cast<const uint4*>(tile + wg_piece(n, h, m));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (i & 1) ? 0x7632 : 0x5410;  // element i (i + 4) from the low / high halves
    uint32_t o[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) o[m] = i < 2 ? __byte_perm(v[m].x, v[m].z, sel) : __byte_perm(v[m].y, v[m].w, sel);
    *reinterpret_cast<uint4*>(tile + wg_piece(n, h, i)) = make_uint4(o[0], o[1], o[2], o[3]);
  }
  tsct::sm90::fence_proxy_async_smem();  // generic-proxy writes, read by wgmma (async proxy)
}
#endif

// Expert owning row tile `pid`: the number of experts whose inclusive tile count is <= pid (one warp; the
// answer is narrowed 32-fold per round of 32 loads).
__device__ inline int expert_of_tile(const int* cum, int E, int pid, int lane) {
  int a = 0, n = E;  // the answer lies in [a, a + n]
  while (n > 32) {
    const int q = a + (int)(((long long)(lane + 1) * n) / 32) - 1;
    const unsigned bal = __ballot_sync(0xffffffffu, __ldg(cum + q) <= pid);
    const int k = __popc(bal);
    const int na = a + (int)(((long long)k * n) / 32);
    const int nb = k < 32 ? a + (int)(((long long)(k + 1) * n) / 32) - 1 : a + n;
    a = na;
    n = nb - na;
  }
  const bool pred = lane < n && __ldg(cum + a + lane) <= pid;
  return a + __popc(__ballot_sync(0xffffffffu, pred));
}

// The row tile of this CTA (rows sorted by expert; tiles of BM rows, `cum` = inclusive tile counts per expert,
// CTA i runs tile i): e, first row and row count R (0 < R <= BM), or false when the CTA has no tile (the grid is
// an upper bound). Also fills `lut` (256 words in shared memory) with scale_pair of every UE4M3 byte. Called by
// all threads of the CTA (one barrier).
template <int BM>
__device__ __forceinline__ bool cta_tile(const int* cum, const int* offs, int E, uint32_t* lut, int* s_e, int& e,
                                         int& row0, int& R) {
  for (int b = threadIdx.x; b < 256; b += blockDim.x) lut[b] = scale_pair((uint32_t)b);
  if (threadIdx.x < 32) {
    const int ex = expert_of_tile(cum, E, (int)blockIdx.x, threadIdx.x);
    if (threadIdx.x == 0) *s_e = ex;
  }
  __syncthreads();
  e = *s_e;
  if (e >= E) return false;
  const int lo = e ? __ldg(offs + e - 1) : 0;
  const int hi = __ldg(offs + e);
  const int before = e ? __ldg(cum + e - 1) : 0;
  row0 = lo + ((int)blockIdx.x - before) * BM;
  R = min(BM, hi - row0);
  return R > 0;
}

}  // namespace nvfp4mma
}  // namespace tsct
