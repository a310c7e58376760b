// glu_up_fwd for an NVFP4, sign, FP8 or ternary w_down (kernels tsctk_glu_up_fwd_{nvfp4,sign,fp8,ternary,
// ternary_r1}), bf16 z, r = 64: the low-bit grouped GLU's up projection into a padded y, in CUDA C++ (the Triton
// kernel lowbit_up_fwd is latency-bound on the H200: ncu DRAM 37 %, 17 % occupancy). One source, the format a
// template parameter. Entry points tsct_glu_up_fwd_{nvfp4,sign,fp8,ternary} (tsct.h); caller
// python/tsct/kernels/triton_lowbit/glu.py; measurements docs/performance.md.
//
//   y[i, n] = (z[i] @ W_down_hat[e])[n] * row_weight[i]     bf16 [M, ldy]; n in [f, ldy): zero weights (0 if finite)
//
// One CTA (4 warps = one warpgroup) per row tile of 64 rows of one expert (the tile map of the down kernel). The z
// tile is read once into shared memory; the CTA then walks f in steps of 64 columns, warp w owning columns
// 16w..16w+15 of each step (the MMA M dimension: y^T = W^T z^T). Per step a cp.async ring (4 stages; 3 for fp8,
// whose codes are 4 KB a step) brings the step's codes [64 columns][kCrow B] and its 4 bytes per column (block
// scales, or the fp32 column scale b / scale_n; contiguous in memory: coalesced copies), and the codes are decoded
// straight into bf16 A fragments (nvfp4_mma.cuh). sm_90a: four k16 wgmma per step with A in
// registers and the z tile as B in wgmma's swizzled layout (wgmma_sm90.cuh). Elsewhere: mma.sync m16n8k16 with
// the z fragments loaded from shared memory every step (NTILE = 4 n8 tiles of rows, 8 above 32 rows). The bf16
// result goes through a shared tile of YSEG steps so that y leaves as whole YSEG x 128-byte row segments (512 B:
// longer runs of the scattered y rows were worth 0.027 ms at b1; one buffer, so that 4 CTAs still fit an SM, and
// one more barrier per segment; docs/performance.md).
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
#define RANK 64  // r = K
#define FN 64    // columns of y per step
#define YSEG 4   // steps of y staged per store: 512-byte row segments (-0.027 ms at b1 on the H200, docs/performance.md)
#define YLD (YSEG * FN + 8)  // y staging row stride (elements): + 16 B, conflict-free stmatrix and 16-byte reads
#define MINB 4   // CTAs per SM (<= 128 registers; 5 CTAs / 96 registers measured slower, docs/performance.md)

namespace {

using tsct::sm80::bf16;
using tsct::sm80::cp_async16;
using tsct::sm80::cp_commit;
using tsct::sm80::cp_wait;
using tsct::sm80::mma_bf16_16816;
using tsct::sm80::smem_u32;
using namespace tsct::nvfp4mma;

struct UpParams {
  const bf16* z;         // [M, 64]
  const int* offs;       // [E]
  const int* cum;        // [E] inclusive counts of BM-row tiles
  // NVFP4: codes [E, f, 32], UE4M3 block scales [E, f, 4] (linear), s_enc [E].
  // sign: bits [E, f, 8] (as codes), a fp32 [E, 64] (as scales), b fp32 [E, f] (as s_enc).
  // fp8: E4M3 codes [E, f, 64], scale_n fp32 [E, f] (as s_enc). ternary: codes [E, f, 16], scale_n [E, f] (as
  // s_enc), the rank-1 scaling's scale_k fp32 [E, 64] (as scales).
  const uint8_t* codes;
  const uint8_t* scales;
  const float* s_enc;
  const float* rw;       // [M] or null
  bf16* y;               // [M, ldy]
  long long ldy;
  int E, f;
};

// Code bytes per column (NVFP4 32, sign 8, fp8 64, ternary 16) and code pipeline stages: 4, and 3 for fp8, whose
// 4 KB code steps would not leave 4 CTAs per SM room for a fourth
template <int FMT>
constexpr int kCrow = FMT == kSign ? 8 : FMT == kFp8 ? 64 : FMT == kTernary || FMT == kTernaryR1 ? 16 : 32;
template <int FMT>
constexpr int kStages = FMT == kFp8 ? 3 : 4;
constexpr int Z_BYTES = BM * RANK * 2;           // 8 KB, swizzled (nvfp4_mma.cuh)
template <int FMT>
constexpr int kCStage = FMT == kSign ? FN * RANK / 2 : FN * kCrow<FMT>;  // code bytes per step (sign uses 512)
constexpr int S_STAGE = FN * RANK / 16;          // 256 B of scales per step (4 bytes per column)
constexpr int Y_BUF = BM * YLD;                  // bf16 elements (one staging buffer)
static_assert(NT % (8 * YSEG) == 0, "a row segment's 16-byte pieces must divide the CTA");
template <int FMT>
constexpr int kSmemUsed = Z_BYTES + kStages<FMT> * (kCStage<FMT> + S_STAGE) + Y_BUF * 2 + 256 * 4;
// + 1 KB: the z tile at a 1024-byte aligned address (wgmma's swizzled B operand; the same size on every arch)
template <int FMT>
constexpr int kSmemBytes = kSmemUsed<FMT> + 1024;
static_assert(kSmemBytes<kNvfp4> == 53248 && kSmemBytes<kSign> == 53248, "the documented shared memory (tsct.h)");
// MINB CTAs per SM on sm_90 / sm_100 (228 KB per SM; each CTA also takes 1 KB reserved and 128 B of static shared
// memory). On 100 KB parts (sm_86, sm_89, sm_120) this is 1 CTA per SM: the kernel is dispatched on sm_90 only.
static_assert(MINB * (kSmemBytes<kNvfp4> + 1024 + 128) <= 228 * 1024 &&
                  MINB * (kSmemBytes<kFp8> + 1024 + 128) <= 228 * 1024,
              "MINB CTAs per SM must fit sm_90's shared memory");

#if __CUDA_ARCH__ >= 900
// four 8x8 b16 matrices from mma-fragment registers (v[i]: matrix i), each stored transposed; lane l gives the
// shared address of row l % 8 of matrix l / 8
__device__ __forceinline__ void stsm4_trans(uint32_t addr, const uint32_t* v) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]),
               "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}
#endif

template <int FMT, int NTILE>
__device__ __forceinline__ void up_body(const UpParams& p, int e, int row0, int R, unsigned char* smem) {
  constexpr int ST = kStages<FMT>, C_STAGE = kCStage<FMT>;
  unsigned char* zs = smem;                                                  // [64][128 B]
  uint8_t* cs = zs + Z_BYTES;                                                // [ST][64][CROW]
  uint8_t* ss = cs + ST * C_STAGE;  // [ST][64][4]; sign, fp8, ternary: b / scale_n [ST][64] f32
  bf16* ys = reinterpret_cast<bf16*>(ss + ST * S_STAGE);                     // [64][YLD]
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(ys + Y_BUF);       // [256]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int f = p.f;
  const long long ldy = p.ldy;
  const int nsteps = (int)((ldy + FN - 1) / FN);
  constexpr bool SIGN = FMT == kSign;
  constexpr bool QF = FMT == kFp8 || FMT == kTernary || FMT == kTernaryR1;  // fp8 / ternary codes
  constexpr bool COLS = FMT != kNvfp4;  // a per-column fp32 scale (sign's b, scale_n)
  constexpr int CROW = kCrow<FMT>;      // code bytes per column
  const uint8_t* cbase = p.codes + (size_t)e * f * CROW;
  // 4 bytes per column: UE4M3 scale bytes (NVFP4) or b / scale_n
  const uint8_t* sbase =
      COLS ? reinterpret_cast<const uint8_t*>(p.s_enc + (size_t)e * f) : p.scales + (size_t)e * f * 4;

#if TSCT_WGMMA
  // z tile in wgmma's B layout: pieces 2m + zh of row zr (zero rows past R)
  const int zr = tid >> 1, zh = tid & 1;
  wg_copy_half_row(zs, zr, zh, zr < R ? p.z + (size_t)(row0 + zr) * RANK + 8 * zh : nullptr, 0, p.z);
  const uint64_t zdesc = tsct::sm90::wg_desc_sw128(smem_u32(zs));
#else
  const int pj = tid & 7;
  // z tile: piece tid & 7 of rows (tid >> 3) + 16 i (zero rows past R)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rr = (tid >> 3) + 16 * i;
    const uint32_t dst = smem_u32(zs + bt_piece(rr, pj));
    if (rr < R)
      cp_async16(dst, p.z + (size_t)(row0 + rr) * RANK + pj * 8, 16);
    else
      cp_async16(dst, p.z, 0);
  }
#endif
  // step j's codes: 16-byte piece tid (row tid / 2) of the 2 KB that columns 64j..64j+63 occupy; scales: 4 bytes
  // of column tid (tid < 64). Columns past f are zero-filled (they decode to 0).
  auto issue = [&](int j) {
    if (j < nsteps) {
      const int st = j % ST;
      if (SIGN) {  // 8 bytes of column tid (tid < 64)
        const int col = j * FN + tid;
        if (tid < FN) cp_async8(smem_u32(cs + st * C_STAGE + tid * 8), col < f ? cbase + (size_t)col * 8 : p.codes,
                                col < f ? 8 : 0);
      } else if constexpr (QF) {  // the step's FN * CROW bytes as 16-byte pieces pc (column pc / (CROW / 16))
#pragma unroll
        for (int i = 0; i < (FN * CROW / 16 + NT - 1) / NT; ++i) {
          const int pc = tid + NT * i, col = j * FN + pc / (CROW / 16);
          if (pc < FN * CROW / 16) {
            const uint32_t dst = smem_u32(cs + st * C_STAGE + pc * 16);
            if (col < f)
              cp_async16(dst, cbase + (size_t)j * FN * CROW + (size_t)pc * 16, 16);
            else
              cp_async16(dst, p.codes, 0);
          }
        }
      } else {
        const int col = j * FN + (tid >> 1);
        const uint32_t dst = smem_u32(cs + st * C_STAGE + tid * 16);
        if (col < f)
          cp_async16(dst, cbase + (size_t)col * 32 + 16 * (tid & 1), 16);
        else
          cp_async16(dst, p.codes, 0);
      }
      if (tid < FN) {
        const int sc = j * FN + tid;
        const uint32_t sdst = smem_u32(ss + st * S_STAGE + tid * 4);
        if (sc < f)
          cp_async4(sdst, sbase + (size_t)sc * 4);
        else
          *reinterpret_cast<uint32_t*>(ss + st * S_STAGE + tid * 4) = 0;
      }
    }
    cp_commit();
  };

  // per-row factor: row weight * 2^8 / s_enc (NVFP4: the decode's 2^-8 and the second-level scale); sign, fp8,
  // ternary: the row weight (b / scale_n multiplies the columns first, as in the Triton kernel)
  const float inv = COLS ? 1.f : 256.f / __ldg(p.s_enc + e);
  // sign, ternary rank-1: the a / scale_k pairs of this lane's k = 16c..16c+15 (the same for every column)
  uint32_t ap[8];
  if (SIGN || FMT == kTernaryR1) {
    a_pairs(reinterpret_cast<const float*>(p.scales) + (size_t)e * RANK + 16 * c, ap);  // 16-byte aligned
  }
  float rwf[NTILE][2];
#pragma unroll
  for (int t = 0; t < NTILE; ++t)
#pragma unroll
    for (int lo = 0; lo < 2; ++lo) {
      const int m = 8 * t + 2 * c + lo;
      rwf[t][lo] = p.rw ? (m < R ? __ldg(p.rw + row0 + m) * inv : 0.f) : inv;
    }

#pragma unroll
  for (int j = 0; j < ST - 1; ++j) issue(j);  // the z copies ride in the first group

  // y of steps YSEG jj .. YSEG jj + YSEG - 1 from the staging buffer: 16-byte pieces yp of rows yr0 + YR i
  // (whole YSEG * 128-byte row segments)
  constexpr int YP = 8 * YSEG, YR = NT / YP;  // pieces per row segment, rows per pass
  const int yp = tid % YP, yr0 = tid / YP;
  // Unrolled (the rolled loop was 0.005 ms slower for NVFP4 at b1; it spends registers up to the cap of MINB 4 on
  // sm_80 / sm_120a, without spills, where the kernel is not dispatched).
  auto store_y = [&](int jj) {
    const long long c0 = (long long)jj * YSEG * FN + 8 * yp;
    if (c0 < ldy) {
#pragma unroll
      for (int i = 0; i < BM / YR; ++i) {
        const int rr = yr0 + YR * i;
        if (rr < R)
          *reinterpret_cast<uint4*>(p.y + (size_t)(row0 + rr) * ldy + c0) =
              *reinterpret_cast<const uint4*>(ys + rr * YLD + 8 * yp);
      }
    }
  };

  for (int j = 0; j < nsteps; ++j) {
    const int st = j % ST;
    cp_wait<ST - 2>();
    if (j == 0) {
#if TSCT_WGMMA
      wg_permute(zs, zr, zh);  // (and the proxy fence: the tile is read by wgmma after the barrier)
#else
#pragma unroll
      for (int i = 0; i < 4; ++i) bt_permute(zs, (tid >> 3) + 16 * i, pj);
#endif
    }
    __syncthreads();  // step j's codes and (j == 0) the z tile ready; the y staging of step j - 1 complete
    issue(j + ST - 1);
    const bool seg_start = j > 0 && j % YSEG == 0;
    if (seg_start) store_y(j / YSEG - 1);  // the previous segment, complete since the barrier

    const uint8_t* cb = cs + st * C_STAGE;
    const uint8_t* sb = ss + st * S_STAGE;
    const int r0 = 16 * warp + g;
    uint2 w0, w1;
    uint32_t q0, q1;  // ternary: the lane's codes of columns r0, r0 + 8 (fp8: read per step, in decode)
    uint32_t s0 = 0, s1 = 0;
    float b0 = 1.f, b1 = 1.f;  // sign, fp8, ternary: b / scale_n of columns r0, r0 + 8
    if (SIGN) {
      w0.x = sign_spread(*reinterpret_cast<const uint16_t*>(cb + r0 * 8 + 2 * c));
      w1.x = sign_spread(*reinterpret_cast<const uint16_t*>(cb + (r0 + 8) * 8 + 2 * c));
      b0 = reinterpret_cast<const float*>(sb)[r0];
      b1 = reinterpret_cast<const float*>(sb)[r0 + 8];
    } else if constexpr (QF) {
      if (FMT != kFp8) {
        q0 = *reinterpret_cast<const uint32_t*>(cb + r0 * CROW + 4 * c);
        q1 = *reinterpret_cast<const uint32_t*>(cb + (r0 + 8) * CROW + 4 * c);
      }
      b0 = reinterpret_cast<const float*>(sb)[r0];
      b1 = reinterpret_cast<const float*>(sb)[r0 + 8];
    } else {
      w0 = *reinterpret_cast<const uint2*>(cb + r0 * 32 + 8 * c);
      w1 = *reinterpret_cast<const uint2*>(cb + (r0 + 8) * 32 + 8 * c);
      s0 = lut[sb[r0 * 4 + c]];
      s1 = lut[sb[(r0 + 8) * 4 + c]];
    }
    float acc[NTILE][4];
#if !TSCT_WGMMA
#pragma unroll
    for (int t = 0; t < NTILE; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
#endif
    // the A registers of k16 step S (both MMA paths)
    auto decode = [&](auto S, uint32_t* a) {
      if (SIGN)
        a_step_sign<decltype(S)::value>(w0.x, w1.x, ap, a);
      else if constexpr (FMT == kFp8) {  // the step's 8 of the lane's 16 code bytes per column (k16 steps 0, 1:
        // bytes 0..7; 2, 3: bytes 8..15): half the live code registers of a whole read (sm_120a spilled with it)
        constexpr int s = decltype(S)::value;
        const uint2 h0 = *reinterpret_cast<const uint2*>(cb + r0 * CROW + 16 * c + 8 * (s / 2));
        const uint2 h1 = *reinterpret_cast<const uint2*>(cb + (r0 + 8) * CROW + 16 * c + 8 * (s / 2));
        a_step_q<FMT, s>(make_uint4(h0.x, h0.y, h0.x, h0.y), make_uint4(h1.x, h1.y, h1.x, h1.y), ap, a);
      } else if constexpr (QF)
        a_step_q<FMT, decltype(S)::value>(q0, q1, ap, a);
      else
        a_step<decltype(S)::value>(w0, w1, s0, s1, a);
    };
#if TSCT_WGMMA  // (no zeroing: the first wgmma of the step ignores acc, scale-d 0)
    // one warpgroup: y^T[64 columns x 8 NTILE rows] = W^T z^T in four k16 wgmma, A decoded into registers
    uint32_t a[4][4];
    decode(std::integral_constant<int, 0>(), a[0]);
    decode(std::integral_constant<int, 1>(), a[1]);
    decode(std::integral_constant<int, 2>(), a[2]);
    decode(std::integral_constant<int, 3>(), a[3]);
    tsct::sm90::fence_regs<4 * NTILE>(&acc[0][0]);
    tsct::sm90::wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) tsct::sm90::wgmma_rs_bf16<8 * NTILE>(&acc[0][0], a[s], zdesc + 2 * s, s);
    tsct::sm90::wg_commit();
    tsct::sm90::wg_wait<0>();
    tsct::sm90::fence_regs<4 * NTILE>(&acc[0][0]);
#else
    auto step = [&](auto S) {
      constexpr int s = decltype(S)::value;
      uint32_t a[4];
      decode(S, a);
#pragma unroll
      for (int t = 0; t < NTILE; ++t) {  // B: the z fragments of n8 tile t, step s
        const uint2 v = *reinterpret_cast<const uint2*>(zs + t * 1024 + bt_frag(g, c, s));
        mma_bf16_16816(acc[t], a[0], a[1], a[2], a[3], v.x, v.y);
      }
    };
    step(std::integral_constant<int, 0>());
    step(std::integral_constant<int, 1>());
    step(std::integral_constant<int, 2>());
    step(std::integral_constant<int, 3>());
#endif
    // acc[t][i] is (column 16 warp + g + 8 (i >> 1) of the step, tile row 8 t + 2 c + (i & 1))
    if (seg_start) __syncthreads();  // the previous segment's store has read the buffer
    bf16* yb = ys + (j % YSEG) * FN;
#if __CUDA_ARCH__ >= 900
    // the accumulator of (t, hh) is an 8x8 matrix of y^T: stmatrix .trans stores it as 8 rows of y, 16 bytes each
#pragma unroll
    for (int q = 0; q < NTILE / 2; ++q) {
      uint32_t v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = 2 * q + (i >> 1), hh = i & 1;
        const float bc = hh ? b1 : b0;
        v[i] = tsct::sm80::pack_bf16(acc[t][2 * hh] * bc * rwf[t][0], acc[t][2 * hh + 1] * bc * rwf[t][1]);
      }
      const int i = lane >> 3, t = 2 * q + (i >> 1);
      stsm4_trans(smem_u32(yb + (8 * t + (lane & 7)) * YLD + 16 * warp + 8 * (i & 1)), v);
    }
#else
#pragma unroll
    for (int t = 0; t < NTILE; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        yb[(8 * t + 2 * c + (i & 1)) * YLD + r0 + 8 * (i >> 1)] =
            __float2bfloat16_rn(acc[t][i] * ((i >> 1) ? b1 : b0) * rwf[t][i & 1]);
#endif
  }
  cp_wait<0>();
  __syncthreads();
  if (nsteps > 0) store_y((nsteps - 1) / YSEG);
}

}  // namespace

namespace {

template <int FMT>
__device__ __forceinline__ void up_kernel(const UpParams& p, unsigned char* smem) {
  __shared__ int s_e;
  int e, row0, R;
  smem += (1024 - (smem_u32(smem) & 1023)) & 1023;
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + kSmemUsed<FMT> - 256 * 4);
  if (!cta_tile<BM>(p.cum, p.offs, p.E, lut, &s_e, e, row0, R)) return;
  if (R <= 32)
    up_body<FMT, 4>(p, e, row0, R, smem);
  else
    up_body<FMT, 8>(p, e, row0, R, smem);
}

}  // namespace

#define TSCT_UP_KERNEL(NAME, FMT)                                       \
  extern "C" __global__ void __launch_bounds__(NT, MINB) NAME(UpParams p) { \
    extern __shared__ __align__(128) unsigned char smem[];                \
    up_kernel<FMT>(p, smem);                                              \
  }
TSCT_UP_KERNEL(tsctk_glu_up_fwd_nvfp4, kNvfp4)
TSCT_UP_KERNEL(tsctk_glu_up_fwd_sign, kSign)
TSCT_UP_KERNEL(tsctk_glu_up_fwd_fp8, kFp8)
TSCT_UP_KERNEL(tsctk_glu_up_fwd_ternary, kTernary)
TSCT_UP_KERNEL(tsctk_glu_up_fwd_ternary_r1, kTernaryR1)

namespace tsct {
// in format order (kNvfp4 .. kTernaryR1): the C entries index it by format
const KernelEntry kGluUpLowbitKernels[] = {
    {"tsctk_glu_up_fwd_nvfp4", (const void*)tsctk_glu_up_fwd_nvfp4, kSmemBytes<kNvfp4>},
    {"tsctk_glu_up_fwd_sign", (const void*)tsctk_glu_up_fwd_sign, kSmemBytes<kSign>},
    {"tsctk_glu_up_fwd_fp8", (const void*)tsctk_glu_up_fwd_fp8, kSmemBytes<kFp8>},
    {"tsctk_glu_up_fwd_ternary", (const void*)tsctk_glu_up_fwd_ternary, kSmemBytes<kTernary>},
    {"tsctk_glu_up_fwd_ternary_r1", (const void*)tsctk_glu_up_fwd_ternary_r1, kSmemBytes<kTernaryR1>},
    {nullptr, nullptr},
};
}  // namespace tsct

// The C entries: the same checks and launch; the codes must be 16-byte aligned (sign bits 8-byte), sign's a and
// ternary's scale_k 16-byte; fp8 has no scales, ternary's scale_k may be null (absmean scaling).
static int up_entry(int fmt, const char* fn, const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum,
                    int64_t num_experts, int64_t f, int64_t r, const void* codes, const void* scales, const float* s_enc,
                    const float* row_weight, void* y, int64_t ldy, int64_t max_tiles, void* stream) {
  tsct::clear_error_detail();
  if (r != RANK) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: r=%lld, only r = 64 is built", fn, (long long)r);
  if (f <= 0 || m < 0 || num_experts < 0 || max_tiles < 0 || ldy < f || ldy % 8 || ldy > INT32_MAX - FN ||
      m > INT32_MAX || num_experts > INT32_MAX || max_tiles > INT32_MAX)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (m=%lld, f=%lld, ldy=%lld, num_experts=%lld, max_tiles=%lld; need f >= 1, ldy >= f "
                      "and a multiple of 8, ldy < 2^31 - 64, the others >= 0 and < 2^31)",
                      fn, (long long)m, (long long)f, (long long)ldy, (long long)num_experts, (long long)max_tiles);
  if (fmt == kFp8 && scales)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: scales must be null (fp8 has no scales)", fn);
  int64_t total;
  if (!tsct::checked_mul3(num_experts, f, 64, &total) || !tsct::checked_mul3(m, ldy, 2, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  if (num_experts == 0 || m == 0 || max_tiles == 0) return 0;
  const bool need_scales = fmt == kNvfp4 || fmt == kSign;
  if (!z || !offs || !tile_cum || !codes || (need_scales && !scales) || !s_enc || !y)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      need_scales ? "%s: null pointer (z, offs, tile_cum, codes, scales, s_enc and y are required)"
                                  : "%s: null pointer (z, offs, tile_cum, codes, s_enc (scale_n) and y are required)",
                      fn);
  const int kfmt = fmt == kTernary && scales ? kTernaryR1 : fmt;  // the kernel's format
  const bool sign = fmt == kSign;
  const uintptr_t a16 = (uintptr_t)z | (uintptr_t)y;
  const uintptr_t a4 = (uintptr_t)offs | (uintptr_t)tile_cum | (uintptr_t)s_enc |
                       (uintptr_t)row_weight;
  if ((a16 & 15) || ((uintptr_t)codes & (sign ? 7 : 15)) || ((uintptr_t)scales & (fmt == kNvfp4 ? 3 : 15)) ||
      (a4 & 3))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      sign ? "%s: z, y and a must be 16-byte aligned, the bits 8-byte, b, offs, tile_cum and "
                             "row_weight 4-byte"
                      : fmt == kNvfp4 ? "%s: z, the codes and y must be 16-byte aligned, the scales, offs, tile_cum "
                                        "and fp32 arguments 4-byte"
                                      : "%s: z, the codes, scale_k and y must be 16-byte aligned, scale_n, offs, "
                                        "tile_cum and row_weight 4-byte", fn);
  const tsct::KernelEntry& k = tsct::kGluUpLowbitKernels[kfmt - kNvfp4];  // the table is in format order
  const int smem_bytes = k.smem_bytes;
  static std::atomic<bool> opted[kTernaryR1 + 1][64] = {};
  if (int rc = tsct::opt_in_shared_memory(fn, k.fn, smem_bytes, opted[kfmt])) return rc;
  UpParams p;
  p.z = static_cast<const bf16*>(z);
  p.offs = offs;
  p.cum = tile_cum;
  p.codes = static_cast<const uint8_t*>(codes);
  p.scales = static_cast<const uint8_t*>(scales);
  p.s_enc = s_enc;
  p.rw = row_weight;
  p.y = static_cast<bf16*>(y);
  p.ldy = ldy;
  p.E = static_cast<int>(num_experts);
  p.f = static_cast<int>(f);
  void* args[] = {&p};
  (void)cudaLaunchKernel(k.fn, dim3(static_cast<unsigned>(max_tiles)), dim3(NT), args, smem_bytes,
                         static_cast<cudaStream_t>(stream));  // its error is check_launch's
  return tsct::check_launch(fn);
}

#define TSCT_UP_ENTRY(NAME, FMT)                                                                                       \
  extern "C" int NAME(const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum, int64_t num_experts,    \
                      int64_t f, int64_t r, const void* codes, const void* scales, const float* s_enc,                 \
                      const float* row_weight, void* y, int64_t ldy, int64_t max_tiles, void* stream) {                \
    return up_entry(FMT, #NAME, z, m, offs, tile_cum, num_experts, f, r, codes, scales, s_enc, row_weight, y, ldy,     \
                    max_tiles, stream);                                                                                \
  }
TSCT_UP_ENTRY(tsct_glu_up_fwd_nvfp4, kNvfp4)
TSCT_UP_ENTRY(tsct_glu_up_fwd_sign, kSign)
TSCT_UP_ENTRY(tsct_glu_up_fwd_fp8, kFp8)
TSCT_UP_ENTRY(tsct_glu_up_fwd_ternary, kTernary)
