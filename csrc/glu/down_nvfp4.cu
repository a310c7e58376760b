// glu_down_fwd for NVFP4 w_gate / w_up, bf16 x, r = 64: the low-bit grouped GLU's down projection with the
// GLU in its epilogue, in CUDA C++. The Triton kernel (triton_lowbit lowbit_down_fwd) is latency-bound on
// the H200 (ncu: DRAM 23 %, 25 % occupancy): its decoded tiles pass through shared memory to reach the
// wgmma operand layout and each step waits on its own wgmma. Here the codes are decoded straight into
// mma.sync A fragments. Entry point tsct_glu_down_fwd_nvfp4 (tsct.h); caller
// python/tsct/kernels/triton_lowbit/glu.py; measurements bench/notes.md "CUDA down kernel".
//
//   hg = (x_rows @ W_gate_hat[e]),  hu = (x_rows @ W_up_hat[e])          fp32 [M, 64]  (W_hat = e2m1 * sf / s_enc)
//   z  = silu(hg * s_gate[e]) * (hu * s_up[e]) [* row_weight]           x.dtype [M, 64]
//
// One CTA (4 warps) per row tile of 64 rows of one expert (the Triton path's tile map: cum = inclusive tile
// counts per expert). Warp w owns ranks 16w..16w+15 of BOTH factors, so the GLU needs no exchange. K runs in
// chunks of 64; a ST-stage cp.async ring holds per chunk the x tile [64 rows][64 k], the codes [128 rows][32 B]
// and the block scales [128 rows][4 B] (rows 0..63 gate, 64..127 up).
//
// The K order inside each chunk is permuted, identically for both operands (a contraction does not care):
// lane (g, c) of a warp handles the 16 consecutive k = 16c..16c+15 of the chunk, which are exactly two 32-bit
// code words and ONE block scale per row. A code word decodes into four bf16 pairs (elements j, j + 4: their
// nibbles sit 16 bits apart, as the halves of a bf16 pair do: one shift and mask per field, see e2m1_pair)
// and one bf16x2 multiply by sf * 2^118 gives e2m1 * sf * 2^-8, exact (<= 6 significant bits); 2^8 / s_enc
// goes on the fp32 accumulator. x gets the same pairing: each thread permutes the 16-byte chunks it copied
// (elements 0..7 -> pairs (0,4) (1,5) (2,6) (3,7)) before the stage's barrier. Pair p of a lane's 8 pairs
// feeds mma step p / 2, slots 2c, 2c+1 (p even) or 2c+8, 2c+9 (p odd).
//
// Needs: sm_80+ (cp.async, bf16 mma.sync) and SMEM_BYTES of shared memory per block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "common/host.h"
#include "common/mma_sm80.cuh"
#include "tsct/tsct.h"

#define NT 128   // threads per CTA (4 warps)
#define BM 64    // rows per tile
#define RANK 64  // r
#define KC 64    // K per chunk
#define ST 4     // pipeline stages
#define MINB 3   // CTAs per SM (registers <= 170)
#define XLD 72   // x row stride in shared memory (elements): 144 B, conflict-free 16-byte fragment loads

namespace {

using tsct::sm80::bf16;
using tsct::sm80::cp_async16;
using tsct::sm80::cp_commit;
using tsct::sm80::cp_wait;
using tsct::sm80::mma_bf16_16816;
using tsct::sm80::smem_u32;

struct DownParams {
  const bf16* x;
  const long long* gidx;  // [M] or null
  const int* offs;        // [E]
  const int* cum;         // [E] inclusive row-tile counts (tiles of BM rows)
  const uint8_t* codes[2];   // gate, up: [E, 64, d/2]
  const uint8_t* scales[2];  // [E, 64, d/16] UE4M3 bytes, linear
  const float* s_enc[2];     // [E]
  const float* s_rank[2];    // s_gate, s_up fp32 [E, 64] or null
  const float* rw;           // [M] or null (multiplies z; the BWD mode's z * row_weight)
  bf16* z;
  float* hg;  // BWD mode: fp32 [M, 64], or null
  float* hu;
  long long stride_x;  // elements
  int E, d;
};

constexpr int X_STAGE = BM * XLD;              // bf16 elements
constexpr int C_STAGE = 2 * RANK * KC / 2;     // code bytes: 128 rows x 32 B
constexpr int S_STAGE = 2 * RANK * KC / 16;    // scale bytes: 128 rows x 4 B
constexpr int SMEM_BYTES = ST * (X_STAGE * 2 + C_STAGE + S_STAGE) + 256 * 4;

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// UE4M3 byte -> sf * 2^118 as a bf16 pair (both halves): exact (sf has <= 4 significant bits; 448 * 2^118
// < 2^127). 0x7F / 0xFF are NaN, as in the Triton decoder and torch.
__device__ uint32_t scale_pair(uint32_t b) {
  const uint32_t ex = (b >> 3) & 15, man = b & 7;
  float v = ex ? __uint_as_float(((ex + 120u) << 23) | (man << 20)) : (float)man * 0.001953125f;
  if ((b & 127) == 127) v = __uint_as_float(0x7fc00000u);
  if (b & 128) v = -v;
  v *= 3.32306998946229e+35f;  // 2^118
  const uint32_t h = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
  return h | (h << 16);
}

// Nibbles J and J + 4 of a code word as a bf16 pair of e2m1 * 2^-126 (magnitude bits to 8..6, sign to 15):
// the Triton decoder's _e2m1_pair, checked exhaustively there.
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

// 8 pairs of one row of the chunk for this lane: words (lo: k 16c..16c+7, hi: 16c+8..16c+15) times the scale
__device__ __forceinline__ void decode_row(uint2 w, uint32_t sp, uint32_t* a) {
  a[0] = hmul2_bf16(e2m1_pair<0>(w.x), sp);
  a[1] = hmul2_bf16(e2m1_pair<1>(w.x), sp);
  a[2] = hmul2_bf16(e2m1_pair<2>(w.x), sp);
  a[3] = hmul2_bf16(e2m1_pair<3>(w.x), sp);
  a[4] = hmul2_bf16(e2m1_pair<0>(w.y), sp);
  a[5] = hmul2_bf16(e2m1_pair<1>(w.y), sp);
  a[6] = hmul2_bf16(e2m1_pair<2>(w.y), sp);
  a[7] = hmul2_bf16(e2m1_pair<3>(w.y), sp);
}

// Expert owning row tile `pid`: the number of experts whose inclusive tile count is <= pid (one warp; the
// answer is narrowed 32-fold per round of 32 loads).
__device__ int expert_of_tile(const int* cum, int E, int pid, int lane) {
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

template <bool BWD>
__device__ __forceinline__ void down_body(const DownParams& p, int e, int row0, int R, unsigned char* smem) {
  bf16* xs = reinterpret_cast<bf16*>(smem);                                    // [ST][BM][XLD]
  uint8_t* cs = reinterpret_cast<uint8_t*>(xs + ST * X_STAGE);                 // [ST][128][32]
  uint8_t* ss = cs + ST * C_STAGE;                                             // [ST][128][4]
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(ss + ST * S_STAGE);  // [256]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int d = p.d, nk = d / KC;

  // copy roles: x chunk j = tid & 7 of rows (tid >> 3) + 16 i; codes and scales of factor row tid
  const int xj = tid & 7;
  const bf16* xsrc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rr = (tid >> 3) + 16 * i;
    xsrc[i] = nullptr;
    if (rr < R) {
      const long long src = p.gidx ? __ldg(p.gidx + row0 + rr) : (long long)(row0 + rr);
      xsrc[i] = p.x + src * p.stride_x + xj * 8;
    }
  }
  const int fac = tid >> 6, rank = tid & 63;
  const size_t frow = (size_t)e * RANK + rank;
  const uint8_t* csrc = p.codes[fac] + frow * (size_t)(d / 2);
  const uint8_t* ssrc = p.scales[fac] + frow * (size_t)(d / 16);

  auto issue = [&](int kc) {
    if (kc < nk) {
      const int st = kc % ST;
      bf16* xb = xs + st * X_STAGE;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rr = (tid >> 3) + 16 * i;
        const uint32_t dst = smem_u32(xb + rr * XLD + xj * 8);
        if (xsrc[i])
          cp_async16(dst, xsrc[i] + kc * KC, 16);
        else
          cp_async16(dst, p.x, 0);  // zero fill, no read
      }
      uint8_t* cb = cs + st * C_STAGE + tid * 32;
      cp_async16(smem_u32(cb), csrc + kc * 32, 16);
      cp_async16(smem_u32(cb + 16), csrc + kc * 32 + 16, 16);
      cp_async4(smem_u32(ss + st * S_STAGE + tid * 4), ssrc + kc * 4);
    }
    cp_commit();
  };
  // this thread's x chunks of stage st, elements 0..7 -> pairs (0,4) (1,5) (2,6) (3,7)
  auto permute = [&](int st) {
    bf16* xb = xs + st * X_STAGE;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint4* q = reinterpret_cast<uint4*>(xb + ((tid >> 3) + 16 * i) * XLD + xj * 8);
      const uint4 v = *q;
      *q = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                      __byte_perm(v.y, v.w, 0x7632));
    }
  };

  const int nt = (R + 7) >> 3;  // n8 tiles with rows (warp-uniform)
  float acc[2][8][4];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][t][i] = 0.f;

#pragma unroll
  for (int s = 0; s < ST - 1; ++s) issue(s);

  for (int kc = 0; kc < nk; ++kc) {
    const int st = kc % ST;
    cp_wait<ST - 2>();
    permute(st);
    __syncthreads();  // stage st complete and permuted for all; stage (kc - 1) % ST no longer read
    issue(kc + ST - 1);

    uint32_t a[2][2][8];  // [factor][row g, g + 8][pair]
    const uint8_t* cb = cs + st * C_STAGE;
    const uint8_t* sb = ss + st * S_STAGE;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 64 * f + 16 * warp + g + 8 * h;
        const uint2 w = *reinterpret_cast<const uint2*>(cb + row * 32 + 8 * c);
        decode_row(w, lut[sb[row * 4 + c]], a[f][h]);
      }
    const bf16* xb = xs + st * X_STAGE + g * XLD + 16 * c;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      if (t < nt) {
        const uint4 lo = *reinterpret_cast<const uint4*>(xb + t * 8 * XLD);
        const uint4 hi = *reinterpret_cast<const uint4*>(xb + t * 8 * XLD + 8);
        const uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
          for (int f = 0; f < 2; ++f)
            mma_bf16_16816(acc[f][t], a[f][0][2 * s], a[f][1][2 * s], a[f][0][2 * s + 1], a[f][1][2 * s + 1],
                           xw[2 * s], xw[2 * s + 1]);
      }
    }
  }
  cp_wait<0>();

  // epilogue: acc[f][t][i] is (rank 16 warp + g + 8 (i >> 1), tile row 8 t + 2 c + (i & 1))
  const float inv_g = 256.f / __ldg(p.s_enc[0] + e), inv_u = 256.f / __ldg(p.s_enc[1] + e);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int n = 16 * warp + g + 8 * hh;
    const float sgn = p.s_rank[0] ? __ldg(p.s_rank[0] + e * RANK + n) : 1.f;
    const float sun = p.s_rank[1] ? __ldg(p.s_rank[1] + e * RANK + n) : 1.f;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int lo = 0; lo < 2; ++lo) {
        const int m = 8 * t + 2 * c + lo;
        if (m < R) {
          const long long row = row0 + m;
          const float hgv = acc[0][t][2 * hh + lo] * inv_g, huv = acc[1][t][2 * hh + lo] * inv_u;
          if (BWD) {
            p.hg[row * RANK + n] = hgv;
            p.hu[row * RANK + n] = huv;
          }
          const float gv = p.s_rank[0] ? hgv * sgn : hgv;
          const float uv = p.s_rank[1] ? huv * sun : huv;
          float zv = gv / (1.f + __expf(-gv)) * uv;
          if (p.rw) zv *= __ldg(p.rw + row);
          p.z[row * RANK + n] = __float2bfloat16_rn(zv);
        }
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, MINB) tsctk_glu_down_fwd_nvfp4(DownParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_e;
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + ST * (X_STAGE * 2 + C_STAGE + S_STAGE));
  for (int b = threadIdx.x; b < 256; b += NT) lut[b] = scale_pair((uint32_t)b);
  if (threadIdx.x < 32) {
    const int e = expert_of_tile(p.cum, p.E, (int)blockIdx.x, threadIdx.x);
    if (threadIdx.x == 0) s_e = e;
  }
  __syncthreads();
  const int e = s_e;
  if (e >= p.E) return;
  const int lo = e ? __ldg(p.offs + e - 1) : 0;
  const int hi = __ldg(p.offs + e);
  const int before = e ? __ldg(p.cum + e - 1) : 0;
  const int row0 = lo + ((int)blockIdx.x - before) * BM;
  const int R = min(BM, hi - row0);
  if (R <= 0) return;
  if (p.hg)
    down_body<true>(p, e, row0, R, smem);
  else
    down_body<false>(p, e, row0, R, smem);
}

namespace tsct {
const KernelEntry kGluLowbitKernels[] = {
    {"tsctk_glu_down_fwd_nvfp4", (const void*)tsctk_glu_down_fwd_nvfp4},
    {nullptr, nullptr},
};
}  // namespace tsct

extern "C" int tsct_glu_down_fwd_nvfp4(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx,
                                       const int32_t* offs, const int32_t* tile_cum, int64_t num_experts, int64_t m,
                                       int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                                       const float* gate_s_enc, const void* up_codes, const void* up_scales,
                                       const float* up_s_enc, const float* s_gate, const float* s_up,
                                       const float* row_weight, void* z, float* hg, float* hu, int64_t max_tiles,
                                       void* stream) {
  static const char* fn = "tsct_glu_down_fwd_nvfp4";
  tsct::clear_error_detail();
  if (r != RANK) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: r=%lld, only r = 64 is built", fn, (long long)r);
  if (d <= 0 || d % KC || x_rows < 0 || m < 0 || num_experts < 0 || max_tiles < 0 || d > INT32_MAX ||
      m > INT32_MAX || num_experts > INT32_MAX || max_tiles > INT32_MAX || stride_x < d)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (x_rows=%lld, stride_x=%lld, d=%lld, m=%lld, num_experts=%lld, max_tiles=%lld; "
                      "need d a positive multiple of 64, stride_x >= d, the others >= 0 and < 2^31)",
                      fn, (long long)x_rows, (long long)stride_x, (long long)d, (long long)m, (long long)num_experts,
                      (long long)max_tiles);
  if ((hg == nullptr) != (hu == nullptr))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: hg and hu must be both given or both null", fn);
  if (stride_x % 8)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: stride_x=%lld must be a multiple of 8 (16-byte rows)", fn,
                      (long long)stride_x);
  int64_t total;
  if (!tsct::checked_mul3(num_experts, RANK, d, &total) || !tsct::checked_mul3(x_rows, stride_x, 2, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  if (num_experts == 0 || m == 0 || max_tiles == 0) return 0;
  if (!x || !offs || !tile_cum || !gate_codes || !gate_scales || !gate_s_enc || !up_codes || !up_scales ||
      !up_s_enc || !z)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (x, offs, tile_cum, codes, scales, s_enc and z are "
                      "required)", fn);
  const uintptr_t a16 = (uintptr_t)x | (uintptr_t)gate_codes | (uintptr_t)up_codes;
  const uintptr_t a4 = (uintptr_t)gate_scales | (uintptr_t)up_scales | (uintptr_t)offs | (uintptr_t)tile_cum |
                       (uintptr_t)gate_s_enc | (uintptr_t)up_s_enc | (uintptr_t)s_gate | (uintptr_t)s_up |
                       (uintptr_t)row_weight | (uintptr_t)hg | (uintptr_t)hu;
  if ((a16 & 15) || (a4 & 3) || ((uintptr_t)gather_idx & 7) || ((uintptr_t)z & 1))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: x and the codes must be 16-byte aligned, gather_idx 8-byte, the scales, offs, tile_cum and "
                      "fp32 arguments 4-byte", fn);
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev))
    return tsct::fail(static_cast<int>(e), "%s: cudaGetDevice: %s", fn, cudaGetErrorString(e));
  int optin = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev))
    return tsct::fail(static_cast<int>(e), "%s: cudaDeviceGetAttribute: %s", fn, cudaGetErrorString(e));
  if (optin < SMEM_BYTES)
    return tsct::fail(static_cast<int>(cudaErrorInvalidConfiguration),
                      "%s: needs %d bytes of shared memory per block, device %d allows %d", fn, SMEM_BYTES, dev, optin);
  static std::atomic<bool> opted[64] = {};
  if (dev >= 64 || !opted[dev].load(std::memory_order_relaxed)) {
    if (cudaError_t e = cudaFuncSetAttribute(tsctk_glu_down_fwd_nvfp4, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             SMEM_BYTES))
      return tsct::fail(static_cast<int>(e), "%s: cudaFuncSetAttribute: %s", fn, cudaGetErrorString(e));
    if (dev < 64) opted[dev].store(true, std::memory_order_relaxed);
  }
  DownParams p;
  p.x = static_cast<const bf16*>(x);
  p.gidx = reinterpret_cast<const long long*>(gather_idx);
  p.offs = offs;
  p.cum = tile_cum;
  p.codes[0] = static_cast<const uint8_t*>(gate_codes);
  p.codes[1] = static_cast<const uint8_t*>(up_codes);
  p.scales[0] = static_cast<const uint8_t*>(gate_scales);
  p.scales[1] = static_cast<const uint8_t*>(up_scales);
  p.s_enc[0] = gate_s_enc;
  p.s_enc[1] = up_s_enc;
  p.s_rank[0] = s_gate;
  p.s_rank[1] = s_up;
  p.rw = row_weight;
  p.z = static_cast<bf16*>(z);
  p.hg = hg;
  p.hu = hu;
  p.stride_x = stride_x;
  p.E = static_cast<int>(num_experts);
  p.d = static_cast<int>(d);
  tsctk_glu_down_fwd_nvfp4<<<static_cast<unsigned>(max_tiles), NT, SMEM_BYTES, static_cast<cudaStream_t>(stream)>>>(
      p);
  return tsct::check_launch(fn);
}
