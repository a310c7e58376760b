// glu_down_fwd for NVFP4, sign, FP8 or ternary w_gate / w_up (both the same format; kernels
// tsctk_glu_down_fwd_{nvfp4,sign,fp8,ternary,ternary_r1}: one source, the format a template parameter), bf16 x,
// r = 64: the low-bit grouped GLU's down projection with the GLU in its epilogue, in CUDA C++. The Triton
// kernel (triton_lowbit lowbit_down_fwd) is latency-bound on the H200 (ncu: DRAM 23 %, 25 % occupancy): its decoded
// tiles pass through shared memory to reach the wgmma operand layout and each step waits on its own wgmma. Here the
// codes are decoded straight into mma.sync A fragments. Entry points tsct_glu_down_fwd_{nvfp4,sign,fp8,ternary}
// (tsct.h); caller python/tsct/kernels/triton_lowbit/glu.py; measurements docs/performance.md.
//
//   hg = (x_rows @ W_gate_hat[e]),  hu = (x_rows @ W_up_hat[e])          fp32 [M, 64]  (W_hat = e2m1 * sf / s_enc)
//   z  = silu(hg * s_gate[e]) * (hu * s_up[e]) [* row_weight]           x.dtype [M, 64]
//
// One CTA (4 warps) per row tile of 64 rows of one expert (the Triton path's tile map: cum = inclusive tile
// counts per expert). Warp w owns ranks 16w..16w+15 of BOTH factors, so the GLU needs no exchange; it runs
// NTILE = 4 n8 tiles of rows (8 when the tile has more than 32 rows). K runs in chunks of 64: an ST-stage
// cp.async ring of x tiles [64 rows][64 k] and a ring of code stages (kNb stages of kCq chunks: the codes
// [128 rows][kRowB B] and the per-k scales of the stage, rows 0..63 gate, 64..127 up; NVFP4: two stages of 4
// chunks, 128-byte code rows and [128 rows][16 B] of block scales), so a warp's copy instruction covers whole rows.
// The decode and the operand layouts: nvfp4_mma.cuh. sm_90a: per chunk
// eight k16 wgmma (gate and up) with A in registers and the x stage as B in wgmma's swizzled layout (thread
// (tid / 2, tid % 2) copies half of one row and permutes it in place; wgmma_sm90.cuh); they run while the next
// stage is permuted.
//
// Needs: sm_80+ (cp.async, bf16 mma.sync) and kSmemBytes<FMT> of shared memory per block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <type_traits>

#include "common/host.h"
#include "common/mma_sm80.cuh"
#include "glu/nvfp4_mma.cuh"
#include "tsct/tsct.h"

#define NT 128   // threads per CTA (4 warps)
#define BM 64    // rows per tile
#define RANK 64  // r
#define KC 64    // K per chunk
#define ST 4     // x pipeline stages
#define MINB 3   // CTAs per SM (registers <= 170)

namespace {

using tsct::sm80::bf16;
using tsct::sm80::cp_async16;
using tsct::sm80::cp_commit;
using tsct::sm80::cp_wait;
using tsct::sm80::mma_bf16_16816;
using tsct::sm80::smem_u32;
using namespace tsct::nvfp4mma;

struct DownParams {
  const bf16* x;
  const long long* gidx;  // [M] or null
  const int* offs;        // [E]
  const int* cum;         // [E] inclusive row-tile counts (tiles of BM rows)
  // gate, up. NVFP4: codes [E, 64, d/2], UE4M3 block scales [E, 64, d/16] (linear), s_enc [E].
  // sign: bits [E, 64, d/8] (as codes), a fp32 [E, d] (as scales), b fp32 [E, 64] (as s_enc).
  // fp8: E4M3 codes [E, 64, d], scale_n fp32 [E, 64] (as s_enc). ternary: codes [E, 64, d/4], scale_n [E, 64]
  // (as s_enc), the rank-1 scaling's scale_k fp32 [E, d] (as scales).
  const uint8_t* codes[2];
  const uint8_t* scales[2];
  const float* s_enc[2];
  const void* s_rank[2];     // s_gate, s_up [E, 64] or null: fp32, or bf16 with s_bf16
  int s_bf16;
  const float* rw;           // [M] or null (multiplies z; the BWD mode's z * row_weight)
  bf16* z;
  float* hg;  // BWD mode: fp32 [M, 64], or null
  float* hu;
  long long stride_x;  // elements
  int E, d;
};

// A per-rank scale, fp32 or bf16 (the caller's dtype: no conversion kernel before the launch), as fp32 (exact).
__device__ __forceinline__ float rank_scale(const void* s, int bf16_scales, size_t i) {
  return bf16_scales ? __bfloat162float(__ldg(static_cast<const bf16*>(s) + i))
                     : __ldg(static_cast<const float*>(s) + i);
}

// The code ring, by format: kNb stages of kCq K chunks, 128 rows (64 gate, 64 up) of kRowB bytes each. NVFP4 (32
// bytes per row and chunk) and ternary (16): two stages of 128-byte rows (a warp's copy instruction covers 4 whole
// rows); sign: two stages of 32-byte rows of bits; fp8 (64 bytes per row and chunk): four one-chunk stages of
// 64-byte rows, the same 32 KB. Stage q + kNb - 1 is issued with x chunk kCq q + ST - 1, when stage q starts; it
// must be complete kCq (kNb - 1) chunks later, so kCq (kNb - 1) >= ST - 1 (cp_wait counts the x groups).
template <int FMT>
constexpr int kCq = FMT == kFp8 ? 1 : FMT == kTernary || FMT == kTernaryR1 ? 8 : 4;
template <int FMT>
constexpr int kNb = FMT == kFp8 ? 4 : 2;
template <int FMT>
constexpr int kRowB = FMT == kFp8 ? 64 : 128;
constexpr int X_STAGE = BM * KC;                   // bf16 elements: 64 rows x 128 B
template <int FMT>
constexpr int kCStage = 2 * RANK * kRowB<FMT>;     // code bytes per stage (sign uses a quarter)
// scale bytes per code stage: NVFP4 128 rows x 16 B; sign's a of both factors (the same bytes); none for fp8;
// ternary: the rank-1 scaling's scale_k of both factors (kCq * 64 fp32 each; the absmean kernel sized alike, so
// that both ternary kernels take the same shared memory)
template <int FMT>
constexpr int kSStage =
    FMT == kNvfp4 || FMT == kSign ? 2 * RANK * 4 * KC / 16 : FMT == kFp8 ? 0 : 2 * kCq<FMT> * KC * 4;
template <int FMT>
constexpr int kSmemUsed = ST * X_STAGE * 2 + kNb<FMT> * (kCStage<FMT> + kSStage<FMT>) + 256 * 4;
// + 1 KB: the x stages at a 1024-byte aligned address (wgmma's swizzled B operand; the same size on every arch)
template <int FMT>
constexpr int kSmemBytes = kSmemUsed<FMT> + 1024;
static_assert(kSmemBytes<kNvfp4> == 71680 && kSmemBytes<kSign> == 71680, "the documented shared memory (tsct.h)");
static_assert(MINB * (kSmemBytes<kTernaryR1> + 1024 + 128) <= 228 * 1024 &&
                  MINB * (kSmemBytes<kNvfp4> + 1024 + 128) <= 228 * 1024 &&
                  MINB * (kSmemBytes<kFp8> + 1024 + 128) <= 228 * 1024,
              "MINB CTAs per SM must fit sm_90's shared memory");
static_assert(kCq<kNvfp4> * (kNb<kNvfp4> - 1) >= ST - 1 && kCq<kFp8> * (kNb<kFp8> - 1) >= ST - 1 &&
                  kCq<kTernary> * (kNb<kTernary> - 1) >= ST - 1, "a code stage must arrive with its x chunks");

// 16-byte unit swizzle of fp8 / ternary code rows. fp8: a lane reads unit c of its 64-byte rows, and the two rows
// a quarter warp reads are adjacent (128 distinct bytes): none. ternary: a lane reads 4 bytes of unit u (chunk
// u), so the 8 rows of a warp's read go to units u ^ (row & 7).
__device__ __forceinline__ int q_swz(int fmt, int row) { return fmt == kFp8 ? 0 : row & 7; }

template <int FMT, bool BWD, int NTILE>
__device__ __forceinline__ void down_body(const DownParams& p, int e, int row0, int R, unsigned char* smem) {
  constexpr int CQ = kCq<FMT>, NB = kNb<FMT>, RB = kRowB<FMT>, C_STAGE = kCStage<FMT>, S_STAGE = kSStage<FMT>;
  bf16* xs = reinterpret_cast<bf16*>(smem);                                     // [ST][BM][KC], swizzled
  // NVFP4 [NB][128][CQ * 32] swizzled; sign: [NB][128][CQ * 8]; fp8 / ternary [NB][128][RB] (q_swz)
  uint8_t* cs = reinterpret_cast<uint8_t*>(xs + ST * X_STAGE);
  uint8_t* ss = cs + NB * C_STAGE;  // [NB][128][CQ * 4]; sign, ternary rank-1: a / scale_k [NB][2][CQ * 64] f32
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(ss + 2 * S_STAGE);    // [256]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int d = p.d, nk = d / KC, nq = (nk + CQ - 1) / CQ;

  const int xj = tid & 7;
#if TSCT_WGMMA
  // x copies in wgmma's B layout: pieces 2m + xh of row xr (nvfp4_mma.cuh wg_piece), null past R
  const int xr = tid >> 1, xh = tid & 1;
  const bf16* xrow = nullptr;
  if (xr < R) {
    const long long src = p.gidx ? __ldg(p.gidx + row0 + xr) : (long long)(row0 + xr);
    xrow = p.x + src * p.stride_x + xh * 8;  // piece xh: wg_copy_half_row adds 16 m
  }
#else
  // x copies: 16-byte piece xj = tid & 7 of rows (tid >> 3) + 16 i (a warp copies 4 whole 128-byte rows)
  const bf16* xsrc[4];  // this thread's x pieces: row source + piece, null past R
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rr = (tid >> 3) + 16 * i;
    xsrc[i] = nullptr;
    if (rr < R) {
      const long long src = p.gidx ? __ldg(p.gidx + row0 + rr) : (long long)(row0 + rr);
      xsrc[i] = p.x + src * p.stride_x + xj * 8;
    }
  }
#endif
  // code copies: 16-byte piece xj of code rows (tid >> 3) + 16 i (a code stage row is CQ chunks = 128 bytes);
  // scale copies: code row tid
  constexpr bool SIGN = FMT == kSign;
  constexpr bool QF = FMT == kFp8 || FMT == kTernary || FMT == kTernaryR1;  // fp8 / ternary codes
  constexpr bool AK = SIGN || FMT == kTernaryR1;  // a per-k scale (sign's a, scale_k) in the scale stages
  const size_t crow_bytes = (size_t)(SIGN ? d / 8 : FMT == kFp8 ? d : QF ? d / 4 : d / 2);
  const size_t srow_bytes = (size_t)(d / 16);
  auto code_row = [&](int row) {
    return p.codes[row >> 6] + ((size_t)e * RANK + (row & 63)) * crow_bytes;
  };
  const uint8_t* ssrc = p.scales[tid >> 6] + ((size_t)e * RANK + (tid & 63)) * srow_bytes;
  const bool s16 = (srow_bytes & 15) == 0 && ((uintptr_t)ssrc & 15) == 0;  // one 16-byte copy per code stage

  auto issue_codes = [&](int q) {  // code stage q (chunks CQ q .. CQ q + CQ - 1) into buffer q % NB
    if (q >= nq) return;
    uint8_t* cb = cs + (q & (NB - 1)) * C_STAGE;
    if constexpr (SIGN) {
      // bits: 8-byte piece tid & 3 (one chunk) of rows (tid >> 2) + 32 i; a: 16-byte piece tid & 63 of factor tid >> 6
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = (tid >> 2) + 32 * i, chunk = CQ * q + (tid & 3);
        const uint32_t dst = smem_u32(cb + row * (CQ * 8) + 8 * (tid & 3));
        if (chunk < nk)
          cp_async8(dst, code_row(row) + (size_t)chunk * 8, 8);
        else
          cp_async8(dst, p.codes[0], 0);
      }
      const int chunk = CQ * q + (tid & 63) / 16;
      const uint32_t dst = smem_u32(ss + (q & (NB - 1)) * S_STAGE + (tid >> 6) * (CQ * 256) + 16 * (tid & 63));
      const float* asrc = reinterpret_cast<const float*>(p.scales[tid >> 6]) + (size_t)e * d + (size_t)q * CQ * 64 +
                          4 * (tid & 63);
      cp_async16(dst, chunk < nk ? (const void*)asrc : (const void*)p.scales[0], chunk < nk ? 16 : 0);
    } else if constexpr (QF) {
      // codes: the stage's RB bytes of each row as 16-byte pieces pj of rows tid / PR + (NT / PR) i, to unit
      // pj ^ q_swz (a warp's copy covers whole rows)
      constexpr int PR = RB / 16;
      const int pj = tid % PR;
#pragma unroll
      for (int i = 0; i < 2 * RANK * PR / NT; ++i) {
        const int row = tid / PR + (NT / PR) * i;
        const size_t off = (size_t)q * RB + 16 * pj;
        const uint32_t dst = smem_u32(cb + row * RB + 16 * (pj ^ q_swz(FMT, row)));
        if (off < crow_bytes)
          cp_async16(dst, code_row(row) + off, 16);
        else
          cp_async16(dst, p.codes[0], 0);
      }
      if constexpr (FMT == kTernaryR1) {  // scale_k: 16-byte pieces tid + NT i of each factor's CQ * 64 fp32
        static_assert(CQ * 16 % NT == 0, "whole scale_k pieces per thread");
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int i = 0; i < CQ * 16 / NT; ++i) {
            const int pc = tid + NT * i, chunk = CQ * q + pc / 16;
            const uint32_t dst = smem_u32(ss + (q & (NB - 1)) * S_STAGE + f * (CQ * 256) + 16 * pc);
            const float* ksrc = reinterpret_cast<const float*>(p.scales[f]) + (size_t)e * d + (size_t)q * CQ * 64 +
                                4 * pc;
            cp_async16(dst, chunk < nk ? (const void*)ksrc : (const void*)p.scales[0], chunk < nk ? 16 : 0);
          }
      }
    } else {  // NVFP4: codes as 16-byte pieces xj of rows (tid >> 3) + 16 i (swizzled), scales of row tid
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = (tid >> 3) + 16 * i;
        const int chunk = CQ * q + (xj >> 1);
        const uint32_t dst = smem_u32(cb + row * (CQ * 32) + 32 * ((xj >> 1) ^ (row & 3)) + 16 * (xj & 1));
        if (chunk < nk)
          cp_async16(dst, code_row(row) + (size_t)chunk * 32 + 16 * (xj & 1), 16);
        else
          cp_async16(dst, p.codes[0], 0);
      }
      uint8_t* sb = ss + (q & (NB - 1)) * S_STAGE + tid * (CQ * 4);
      const int nbytes = min(CQ, nk - CQ * q) * 4;
      if (s16) {
        cp_async16(smem_u32(sb), ssrc + (size_t)q * CQ * 4, nbytes);
      } else {
        for (int b = 0; b < nbytes; b += 4) cp_async4(smem_u32(sb + b), ssrc + (size_t)q * CQ * 4 + b);
      }
    }
  };

  auto issue_x = [&](int kc) {  // x chunk kc into stage kc % ST (swizzled pieces, nvfp4_mma.cuh)
    if (kc >= nk) return;
    unsigned char* xb = reinterpret_cast<unsigned char*>(xs + (kc % ST) * X_STAGE);
#if TSCT_WGMMA
    wg_copy_half_row(xb, xr, xh, xrow, kc * KC, p.x);
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int rr = (tid >> 3) + 16 * i;
      const uint32_t dst = smem_u32(xb + bt_piece(rr, xj));
      if (xsrc[i])
        cp_async16(dst, xsrc[i] + kc * KC, 16);
      else
        cp_async16(dst, p.x, 0);  // zero fill, no read
    }
#endif
  };
  // this thread's x pieces of stage st into mma pair order
  auto permute = [&](int st) {
    unsigned char* xb = reinterpret_cast<unsigned char*>(xs + st * X_STAGE);
#if TSCT_WGMMA
    wg_permute(xb, xr, xh);  // (and the proxy fence: the stage is read by wgmma after the barrier)
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) bt_permute(xb, (tid >> 3) + 16 * i, xj);
#endif
  };

  float acc[2][NTILE][4];
#if !TSCT_WGMMA
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int t = 0; t < NTILE; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][t][i] = 0.f;
#endif

  issue_codes(0);
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s > 0 && s < NB - 1) issue_codes(s);  // code stages 1 .. NB - 2 with x chunks 1 .. (NB > 2)
    issue_x(s);
    cp_commit();
  }

  for (int kc = 0; kc < nk; ++kc) {
    const int st = kc % ST;
    cp_wait<ST - 2>();
    permute(st);
#if TSCT_WGMMA
    tsct::sm90::wg_wait<0>();  // chunk kc - 1's wgmma have read x stage (kc - 1) % ST, refilled after the barrier
#endif
    __syncthreads();  // x stage st and code stage kc / CQ complete for all; x stage (kc - 1) % ST free
    issue_x(kc + ST - 1);
    if (kc % CQ == 0) issue_codes(kc / CQ + NB - 1);  // its buffer was last read in code stage kc / CQ - 1
    cp_commit();

    const uint8_t* cb = cs + ((kc / CQ) & (NB - 1)) * C_STAGE;
    const uint8_t* sb = ss + ((kc / CQ) & (NB - 1)) * S_STAGE;
    const int u = kc % CQ;
    // NVFP4: code words w and scale pairs sp of rows g, g + 8 of both factors; sign: spread sign bits in w[.][.].x
    // and the a pairs of both factors; fp8 / ternary: the lane's codes wq (and the scale_k pairs in ap)
    uint2 w[2][2];
    uint32_t sp[2][2];
    uint32_t ap[AK ? 2 : 1][8];
    std::conditional_t<FMT == kFp8, uint4, uint32_t> wq[QF ? 2 : 1][2];
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      if (AK) a_pairs(reinterpret_cast<const float*>(sb + f * (CQ * 256)) + 64 * u + 16 * c, ap[AK ? f : 0]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 64 * f + 16 * warp + g + 8 * h;
        if (SIGN) {
          w[f][h].x = sign_spread(*reinterpret_cast<const uint16_t*>(cb + row * (CQ * 8) + 8 * u + 2 * c));
        } else if constexpr (FMT == kFp8) {
          wq[f][h] = *reinterpret_cast<const uint4*>(cb + row * RB + 16 * (c ^ q_swz(FMT, row)));  // (u = 0)
        } else if constexpr (QF) {
          wq[f][h] = *reinterpret_cast<const uint32_t*>(cb + row * RB + 16 * (u ^ q_swz(FMT, row)) + 4 * c);
        } else {
          w[f][h] = *reinterpret_cast<const uint2*>(cb + row * (CQ * 32) + 32 * (u ^ (row & 3)) + 8 * c);
          sp[f][h] = lut[sb[row * (CQ * 4) + 4 * u + c]];
        }
      }
    }
    const unsigned char* xb = reinterpret_cast<const unsigned char*>(xs + st * X_STAGE);
    // the A registers of k16 step S, gate and up (both MMA paths)
    auto decode = [&](auto S, uint32_t (&a)[2][4]) {
      constexpr int s = decltype(S)::value;
      if (SIGN) {
        a_step_sign<s>(w[0][0].x, w[0][1].x, ap[0], a[0]);
        a_step_sign<s>(w[1][0].x, w[1][1].x, ap[AK ? 1 : 0], a[1]);
      } else if constexpr (QF) {
        a_step_q<FMT, s>(wq[0][0], wq[0][1], ap[0], a[0]);
        a_step_q<FMT, s>(wq[QF ? 1 : 0][0], wq[QF ? 1 : 0][1], ap[AK ? 1 : 0], a[1]);
      } else {
        a_step<s>(w[0][0], w[0][1], sp[0][0], sp[0][1], a[0]);
        a_step<s>(w[1][0], w[1][1], sp[1][0], sp[1][1], a[1]);
      }
    };
#if TSCT_WGMMA
    // one warpgroup: hg^T, hu^T [64 ranks x 8 NTILE rows] += W^T x^T, eight k16 wgmma per chunk, A decoded into
    // registers; they run while the next chunk's x stage is permuted (waited for before the next barrier)
    uint32_t a[4][2][4];
    decode(std::integral_constant<int, 0>(), a[0]);
    decode(std::integral_constant<int, 1>(), a[1]);
    decode(std::integral_constant<int, 2>(), a[2]);
    decode(std::integral_constant<int, 3>(), a[3]);
    const uint64_t xdesc = tsct::sm90::wg_desc_sw128(smem_u32(xb));
    tsct::sm90::wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int f = 0; f < 2; ++f)  // the first chunk's first step ignores acc (zeroing it would serialize wgmma)
        tsct::sm90::wgmma_rs_bf16<8 * NTILE>(&acc[f][0][0], a[s][f], xdesc + 2 * s, kc > 0 || s > 0);
    tsct::sm90::wg_commit();
#else
    auto step = [&](auto S) {
      constexpr int s = decltype(S)::value;
      uint32_t a[2][4];  // mma A registers of step s, gate and up
      decode(S, a);
#pragma unroll
      for (int t = 0; t < NTILE; ++t) {
        const uint2 xv = *reinterpret_cast<const uint2*>(xb + t * 8 * (KC * 2) + bt_frag(g, c, s));
#pragma unroll
        for (int f = 0; f < 2; ++f) mma_bf16_16816(acc[f][t], a[f][0], a[f][1], a[f][2], a[f][3], xv.x, xv.y);
      }
    };
    step(std::integral_constant<int, 0>());
    step(std::integral_constant<int, 1>());
    step(std::integral_constant<int, 2>());
    step(std::integral_constant<int, 3>());
#endif
  }
  cp_wait<0>();
#if TSCT_WGMMA
  tsct::sm90::wg_wait<0>();
  tsct::sm90::fence_regs<8 * NTILE>(&acc[0][0][0]);
#endif

  // epilogue: acc[f][t][i] is (rank 16 warp + g + 8 (i >> 1), tile row 8 t + 2 c + (i & 1))
  // NVFP4: 2^8 / s_enc per expert (the decode's 2^-8 and the second-level scale); sign: b[n] per rank; fp8,
  // ternary: scale_n[n] per rank
  constexpr bool COLS = FMT != kNvfp4;
  const float inv_g = COLS ? 0.f : 256.f / __ldg(p.s_enc[0] + e), inv_u = COLS ? 0.f : 256.f / __ldg(p.s_enc[1] + e);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int n = 16 * warp + g + 8 * hh;
    const float cg = COLS ? __ldg(p.s_enc[0] + (size_t)e * RANK + n) : inv_g;
    const float cu = COLS ? __ldg(p.s_enc[1] + (size_t)e * RANK + n) : inv_u;
    const float sgn = p.s_rank[0] ? rank_scale(p.s_rank[0], p.s_bf16, (size_t)e * RANK + n) : 1.f;
    const float sun = p.s_rank[1] ? rank_scale(p.s_rank[1], p.s_bf16, (size_t)e * RANK + n) : 1.f;
#pragma unroll
    for (int t = 0; t < NTILE; ++t) {
#pragma unroll
      for (int lo = 0; lo < 2; ++lo) {
        const int m = 8 * t + 2 * c + lo;
        if (m < R) {
          const long long row = row0 + m;
          const float hgv = acc[0][t][2 * hh + lo] * cg, huv = acc[1][t][2 * hh + lo] * cu;
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

namespace {

template <int FMT>
__device__ __forceinline__ void down_kernel(const DownParams& p, unsigned char* smem) {
  __shared__ int s_e;
  int e, row0, R;
  smem += (1024 - (smem_u32(smem) & 1023)) & 1023;
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + kSmemUsed<FMT> - 256 * 4);
  if (!cta_tile<BM>(p.cum, p.offs, p.E, lut, &s_e, e, row0, R)) return;
  // n8 tiles: 4 for up to 32 rows (the common case at ~32 rows per expert), else 8
  if (p.hg) {
    if (R <= 32)
      down_body<FMT, true, 4>(p, e, row0, R, smem);
    else
      down_body<FMT, true, 8>(p, e, row0, R, smem);
  } else {
    if (R <= 32)
      down_body<FMT, false, 4>(p, e, row0, R, smem);
    else
      down_body<FMT, false, 8>(p, e, row0, R, smem);
  }
}

}  // namespace

#define TSCT_DOWN_KERNEL(NAME, FMT)                                       \
  extern "C" __global__ void __launch_bounds__(NT, MINB) NAME(DownParams p) { \
    extern __shared__ __align__(128) unsigned char smem[];                  \
    down_kernel<FMT>(p, smem);                                              \
  }
TSCT_DOWN_KERNEL(tsctk_glu_down_fwd_nvfp4, kNvfp4)
TSCT_DOWN_KERNEL(tsctk_glu_down_fwd_sign, kSign)
TSCT_DOWN_KERNEL(tsctk_glu_down_fwd_fp8, kFp8)
TSCT_DOWN_KERNEL(tsctk_glu_down_fwd_ternary, kTernary)
TSCT_DOWN_KERNEL(tsctk_glu_down_fwd_ternary_r1, kTernaryR1)

namespace tsct {
// in format order (kNvfp4 .. kTernaryR1): the C entries index it by format
const KernelEntry kGluLowbitKernels[] = {
    {"tsctk_glu_down_fwd_nvfp4", (const void*)tsctk_glu_down_fwd_nvfp4, kSmemBytes<kNvfp4>},
    {"tsctk_glu_down_fwd_sign", (const void*)tsctk_glu_down_fwd_sign, kSmemBytes<kSign>},
    {"tsctk_glu_down_fwd_fp8", (const void*)tsctk_glu_down_fwd_fp8, kSmemBytes<kFp8>},
    {"tsctk_glu_down_fwd_ternary", (const void*)tsctk_glu_down_fwd_ternary, kSmemBytes<kTernary>},
    {"tsctk_glu_down_fwd_ternary_r1", (const void*)tsctk_glu_down_fwd_ternary_r1, kSmemBytes<kTernaryR1>},
    {nullptr, nullptr},
};
}  // namespace tsct

// The C entries: the same checks and launch; the formats differ in what the three pointers per factor hold and in
// their alignment (NVFP4: codes 16-byte, scales and s_enc 4-byte; sign: bits 8-byte, a 16-byte, b 4-byte; fp8:
// codes 16-byte, no scales, scale_n 4-byte; ternary: codes 16-byte, scale_k of both factors or of neither 16-byte,
// scale_n 4-byte). fmt: kNvfp4, kSign, kFp8 or kTernary (the rank-1 kernel when scale_k is given).
static int down_entry(int fmt, const char* fn, const void* x, int64_t x_rows, int64_t stride_x,
                      const int64_t* gather_idx, const int32_t* offs, const int32_t* tile_cum, int64_t num_experts,
                      int64_t m, int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                      const float* gate_s_enc, const void* up_codes, const void* up_scales, const float* up_s_enc,
                      const void* s_gate, const void* s_up, int32_t scales_bf16, const float* row_weight, void* z,
                      float* hg, float* hu, int64_t max_tiles, void* stream) {
  tsct::clear_error_detail();
  if (r != RANK) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: r=%lld, only r = 64 is built", fn, (long long)r);
  if (d <= 0 || d % KC || x_rows < 0 || m < 0 || num_experts < 0 || max_tiles < 0 || d > INT32_MAX ||
      m > INT32_MAX || num_experts > INT32_MAX || max_tiles > INT32_MAX || stride_x < d)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (x_rows=%lld, stride_x=%lld, d=%lld, m=%lld, num_experts=%lld, max_tiles=%lld; "
                      "need d a positive multiple of 64, stride_x >= d, the others >= 0 and < 2^31)",
                      fn, (long long)x_rows, (long long)stride_x, (long long)d, (long long)m, (long long)num_experts,
                      (long long)max_tiles);
  if (!gather_idx && x_rows < m)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: x has %lld rows < m=%lld and no gather_idx", fn, (long long)x_rows,
                      (long long)m);
  if ((hg == nullptr) != (hu == nullptr))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: hg and hu must be both given or both null", fn);
  if (stride_x % 8)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: stride_x=%lld must be a multiple of 8 (16-byte rows)", fn,
                      (long long)stride_x);
  if (fmt == kFp8 && (gate_scales || up_scales))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: gate_scales and up_scales must be null (fp8 has no scales)", fn);
  if (fmt == kTernary && (gate_scales == nullptr) != (up_scales == nullptr))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: gate_scales and up_scales (scale_k) must be both given (rank-1 scaling) or both null", fn);
  int64_t total;
  if (!tsct::checked_mul3(num_experts, RANK, d, &total) || !tsct::checked_mul3(x_rows, stride_x, 2, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  if (num_experts == 0 || m == 0 || max_tiles == 0) return 0;
  const bool need_scales = fmt == kNvfp4 || fmt == kSign;
  if (!x || !offs || !tile_cum || !gate_codes || (need_scales && !gate_scales) || !gate_s_enc || !up_codes ||
      (need_scales && !up_scales) || !up_s_enc || !z)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      need_scales ? "%s: null pointer (x, offs, tile_cum, codes, scales, s_enc and z are required)"
                                  : "%s: null pointer (x, offs, tile_cum, codes, s_enc (scale_n) and z are required)",
                      fn);
  const int kfmt = fmt == kTernary && gate_scales ? kTernaryR1 : fmt;  // the kernel's format
  const uintptr_t codes = (uintptr_t)gate_codes | (uintptr_t)up_codes, scales = (uintptr_t)gate_scales |
                                                                                (uintptr_t)up_scales;
  if (scales_bf16 != 0 && scales_bf16 != 1)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: scales_bf16=%d must be 0 (fp32 s_gate / s_up) or 1 (bf16)", fn,
                      (int)scales_bf16);
  const uintptr_t a4 = (uintptr_t)offs | (uintptr_t)tile_cum | (uintptr_t)gate_s_enc | (uintptr_t)up_s_enc |
                       (uintptr_t)row_weight | (uintptr_t)hg | (uintptr_t)hu;
  const uintptr_t a_rank = (uintptr_t)s_gate | (uintptr_t)s_up;
  const bool sign = fmt == kSign;
  if (((uintptr_t)x & 15) || (codes & (sign ? 7 : 15)) || (scales & (fmt == kNvfp4 ? 3 : 15)) || (a4 & 3) ||
      (a_rank & (scales_bf16 ? 1 : 3)) || ((uintptr_t)gather_idx & 7) || ((uintptr_t)z & 1))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      sign ? "%s: x and a must be 16-byte aligned, the bits and gather_idx 8-byte, b, offs, "
                             "tile_cum and the other fp32 arguments 4-byte (bf16 s_gate / s_up 2-byte)"
                      : fmt == kNvfp4 ? "%s: x and the codes must be 16-byte aligned, gather_idx 8-byte, the scales, "
                                        "offs, tile_cum and fp32 arguments 4-byte (bf16 s_gate / s_up 2-byte)"
                                      : "%s: x, the codes and scale_k must be 16-byte aligned, gather_idx 8-byte, "
                                        "scale_n, offs, tile_cum and the other fp32 arguments 4-byte (bf16 s_gate / "
                                        "s_up 2-byte)", fn);
  const tsct::KernelEntry& k = tsct::kGluLowbitKernels[kfmt - kNvfp4];  // the table is in format order
  const int smem_bytes = k.smem_bytes;
  static std::atomic<bool> opted[kTernaryR1 + 1][64] = {};
  if (int rc = tsct::opt_in_shared_memory(fn, k.fn, smem_bytes, opted[kfmt])) return rc;
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
  p.s_bf16 = scales_bf16;
  p.rw = row_weight;
  p.z = static_cast<bf16*>(z);
  p.hg = hg;
  p.hu = hu;
  p.stride_x = stride_x;
  p.E = static_cast<int>(num_experts);
  p.d = static_cast<int>(d);
  void* args[] = {&p};
  (void)cudaLaunchKernel(k.fn, dim3(static_cast<unsigned>(max_tiles)), dim3(NT), args, smem_bytes,
                         static_cast<cudaStream_t>(stream));  // its error is check_launch's
  return tsct::check_launch(fn);
}

#define TSCT_DOWN_ENTRY(NAME, FMT)                                                                                     \
  extern "C" int NAME(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx, const int32_t* offs, \
                      const int32_t* tile_cum, int64_t num_experts, int64_t m, int64_t d, int64_t r, const void* gc,   \
                      const void* gs, const float* ge, const void* uc, const void* us, const float* ue,                \
                      const void* s_gate, const void* s_up, int32_t scales_bf16, const float* row_weight, void* z,     \
                      float* hg, float* hu, int64_t max_tiles, void* stream) {                                         \
    return down_entry(FMT, #NAME, x, x_rows, stride_x, gather_idx, offs, tile_cum, num_experts, m, d, r, gc, gs, ge,   \
                      uc, us, ue, s_gate, s_up, scales_bf16, row_weight, z, hg, hu, max_tiles, stream);                \
  }
TSCT_DOWN_ENTRY(tsct_glu_down_fwd_nvfp4, kNvfp4)
TSCT_DOWN_ENTRY(tsct_glu_down_fwd_sign, kSign)
TSCT_DOWN_ENTRY(tsct_glu_down_fwd_fp8, kFp8)
TSCT_DOWN_ENTRY(tsct_glu_down_fwd_ternary, kTernary)
