// glu_bwd_dz for bf16, r = 64, w_down K-major: the backward GEMM pair of the grouped GLU's up
// projection, in CUDA C++ because Triton cannot realign rows that start at 2-byte offsets (odd f).
// Entry point tsct_glu_bwd_dz_bf16 (tsct.h); caller python/tsct/kernels/triton_glu/glu.py; measurements
// docs/performance.md.
//
//   dz_part[s, i, k] = sum_{n in slice s} dy[sidx[i], n] * wd_e[n, k]      (fp32, one f-slice each)
//   dwd_e[n, k]      = sum_{i in e} dy[sidx[i], n] * zw[i, k]               (bf16, K-major [E, f, 64]; only for an
//                                                                           expert of at most 64 rows, 0 if empty)
//
// One CTA per (row tile, f-slice), the tiles numbered expert-major as the Triton backward's (_kernels.py "backward"):
// tile e < E is expert e's first (rows [offs[e-1], ...), at most 64; none for an empty expert), found without a
// search (at b1 every tile is one); tile E + j is the j-th further tile of the experts of more than 64 rows, found
// by a search of xtile_cum (inclusive counts per expert of the tiles past its first). So one expert with many rows
// spreads over the whole GPU. The CTA walks its slice in 64-column steps. Per step: the 16-byte chunks that cover
// each gathered dY row segment (start aligned down to 8 elements) and the w_down tile are copied with cp.async
// into a 4-stage ring; each row is then realigned in place (its 8 threads are 8 lanes of one warp: read,
// syncwarp, write; a 16-bit funnel shift for odd offsets), one step ahead of its use, so one __syncthreads
// per step suffices; both products run on mma.sync m16n8k16 (bf16 in, fp32 accumulate). dz accumulates over
// the slice in registers and is stored once (one writer per element: the caller sums the slices in a fixed
// order, so the result is deterministic). dW needs a sum over all of an expert's rows: the first tile of an
// expert of at most 64 rows (~all experts at b1) has them all and computes it in the same steps (rounded once
// to bf16, staged in a double buffer, stored with 16-byte writes one step later; an empty expert's tile skips the
// pipeline and stores its zeros directly); every other expert's dW (more than 64 rows) is left to the caller (the
// chunked Triton kernels). Each thread owns fixed (row, chunk) pairs, so a row's pointer and shift (sidx*f mod 8,
// the same at every step) are computed once.
// The ring has 4 stages and the dW staging tile two buffers: 99 KB of shared memory, 2 CTAs per SM on sm_90. The
// step's per-thread shared-memory and global offsets are computed once and kept in registers: recomputed from the
// thread index at every step (the compiler's choice) they cost the step a third more instructions.
// Needs: sm_80+ (cp.async, ldmatrix, bf16 mma.sync) and SMEM_BYTES of shared memory per block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "common/host.h"
#include "common/mma_sm80.cuh"
#include "tsct/tsct.h"

#define NT 256   // threads per CTA (8 warps)
#define LD 72    // padded smem row stride (elements) of every 64-wide tile: conflict-free ldmatrix
#define TILE_EL (64 * LD)
#define MAX_SLICES 16

namespace {

using tsct::sm80::bf16;
using tsct::sm80::cp_async16;
using tsct::sm80::cp_async16_full;
using tsct::sm80::cp_commit;
using tsct::sm80::cp_wait;
using tsct::sm80::ldsm4;
using tsct::sm80::mma_bf16_16816;
using tsct::sm80::pack_bf16;
using tsct::sm80::smem_u32;

// 32-bit shared loads and a 16-byte shared store at byte addresses held in registers (the realignment's per-thread
// addresses are computed once; through C++ pointers the compiler recomputed them from the thread index every step)
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void sts128(uint32_t a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

struct DzParams {
  const bf16* dy;
  const long long* sidx;
  const int* offs;
  const int* xtile_cum;
  const bf16* wd;
  const bf16* zw;
  float* ws;
  bf16* dwd;
  long long total;  // rows of dy * f
  long long T;      // rows of dy (scatter indices outside [0, T) read as zero rows)
  int M, E, f, S, nsteps;
};

constexpr int ST = 4;   // pipeline stages (raw dY + w_down tiles)
constexpr int OSB = 2;  // dW staging buffers (a tile is stored one step after it is staged)
constexpr uint32_t TB = TILE_EL * 2;  // bytes of one tile (a ring stage of raw or wdb)
constexpr uint32_t HB = 32 * LD * 2;  // bytes of 32 tile rows: a thread's second row / column, an m tile's half
// raw[ST] + wd[ST] + zs + os[OSB] tiles
constexpr int SMEM_BYTES = (2 * ST + 1 + OSB) * TB;

// One CTA's work: expert e, f-slice sl, rows [start, start + R), steps [stepbeg, stepbeg + nitems); do_dw: the tile
// holds all of the expert's rows. dz_body gets 1 <= R <= 64 (an empty expert's tile stores its zeros in dz_kernel).
struct Walk {
  int e, sl, start, R, stepbeg, nitems;
  bool do_dw;
};

// The number of entries of the non-decreasing cum[0:E] that are <= pid (the expert owning further row tile pid;
// E past the last one): a k-ary search with the CTA's NT threads (each round narrows the range NT-fold: two rounds
// up to NT^2 experts), every thread gets the answer.
__device__ __forceinline__ int tile_expert(const int* cum, int E, int pid) {
  int lo = 0, n = E;
  while (n > 0) {
    const int step = (n + NT - 1) / NT;
    const int first = threadIdx.x * step;  // thread t probes the last entry of segment t of [lo, lo + n)
    const bool le = first < n && __ldg(cum + lo + min(first + step, n) - 1) <= pid;
    const int c = __syncthreads_count(le);
    if (step == 1) return lo + c;
    if (c * step >= n) return lo + n;
    lo += c * step;
    n = min(step, n - c * step);
  }
  return lo;
}

__device__ __forceinline__ void dz_body(const DzParams& p, const Walk& w, unsigned char* smem) {
  bf16* raw = reinterpret_cast<bf16*>(smem);  // [ST][64 rows][LD] dY rows, realigned in place
  bf16* wdb = raw + ST * TILE_EL;              // [ST][64 n][LD] w_down tiles (k contiguous)
  bf16* zs = wdb + ST * TILE_EL;               // [64 rows][LD] zw
  bf16* os = zs + TILE_EL;                     // [OSB][64 n][LD] dW staging

  const int f = p.f;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const size_t ebase = (size_t)w.e * 64 * (size_t)f;
  const bool do_dw = w.do_dw;  // CTA-uniform

  // thread -> (rows r0, r0 + 32; chunk j); lane 7 of each row group also takes chunk 8
  const int r0 = tid >> 3, j = tid & 7;
  // wd tile: thread -> (cols wc, wc + 32; chunk j)
  const int wc = tid >> 3;

  // row state: aligned-down element index of the row's start, and its shift
  long long rb[2];
  int sh[2];
  bool rv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 32 * h;
    long long tok = -1;
    if (row < w.R) tok = p.sidx ? __ldg(p.sidx + w.start + row) : (long long)(w.start + row);
    rv[h] = tok >= 0 && tok < p.T;  // a bad index gives a zero row, never an out-of-bounds read
    const long long g = rv[h] ? tok * (long long)f : 0;
    sh[h] = (int)(g & 7);
    rb[h] = g - sh[h];
  }

  // A row whose every full step's chunks lie inside dy (all rows but those at its very end) is copied without a
  // size clamp; chunk 8 only where the row does not start on a chunk boundary. Per-thread shared addresses of
  // stage 0 (a stage adds TILE_EL elements, the second row / column half 32 rows).
  int plain = 0;  // bit h: row h is plain
  const bf16* ysrc[2];  // this thread's first chunk of row h at column 0
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    plain |= (rv[h] && rb[h] + f + 8 <= p.total) << h;
    ysrc[h] = p.dy + rb[h] + j * 8;
  }
  uint32_t ydst = smem_u32(raw + r0 * LD + j * 8);
  uint32_t wdst = smem_u32(wdb + wc * LD + j * 8);
  const bf16* wsrc = p.wd + ebase + (size_t)wc * 64 + j * 8;
  // realignment: the byte address in stage 0 of this thread's first source word of each row (sh / 2 words past
  // its chunk) and the funnel shift (16 bits for an odd sh)
  uint32_t rsrc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rsrc[h] = ydst + h * HB + (sh[h] >> 1) * 4;
  // kept in registers (the empty asm): recomputed from the thread index at every step they cost issue slots
  asm volatile("" : "+r"(ydst), "+r"(wdst), "+r"(rsrc[0]), "+r"(rsrc[1]), "+r"(plain), "+l"(ysrc[0]), "+l"(ysrc[1]));

  // async loads of step `it` into the stage at byte offset `so` (always commits a group)
  auto issue = [&](int it, uint32_t so) {
    if (it < w.nitems) {
      const int c0 = (w.stepbeg + it) * 64;
      const int ncols = min(64, f - c0);
      if (ncols == 64) {  // a full step (every one but the last of f when 64 does not divide f): no column bound
        const bf16* ws = wsrc + (size_t)c0 * 64;
        cp_async16_full(wdst + so, ws);
        cp_async16_full(wdst + so + HB, ws + 32 * 64);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = c0 + wc + 32 * h;
          const bf16* src = p.wd + ebase + (size_t)min(n, f - 1) * 64 + j * 8;
          cp_async16(wdst + so + h * HB, src, n < f ? 16 : 0);  // 0: zero-fill
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t d = ydst + so + h * HB;
        if (ncols == 64 && (plain >> h & 1)) {
          const bf16* src = ysrc[h] + c0;
          cp_async16_full(d, src);
          if (j == 0 && sh[h]) cp_async16_full(d + 128, src + 64);
        } else if (rv[h]) {
          const long long a0 = rb[h] + c0;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            if (q == 0 || j == 0) {  // chunk 8 only for lane j == 0 (q == 1)
              const int cj = q == 0 ? j : 8;
              if (8 * cj < sh[h] + ncols) {
                const long long a = a0 + 8 * cj;
                const long long rem = p.total - a;
                cp_async16(d + (cj - j) * 16, p.dy + a, rem >= 8 ? 16 : (int)rem * 2);
              }
            }
          }
        }
      }
    }
    cp_commit();
  };

  const int R16 = (w.R + 15) & ~15;  // rows realigned (zeros past R): whole 16-row m tiles
  // realign step `it` (in the stage at byte offset `so`)'s rows in place (this thread's rows, chunk j), zero-masked
  // past R / ncols
  auto realign = [&](int it, uint32_t so) {
    const int nv = min(64, f - (w.stepbeg + it) * 64) - j * 8;
    uint4 o[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[h] = make_uint4(0, 0, 0, 0);
      if (rv[h] && nv > 0) {  // rv: a row of the tile (< R) with a valid index
        const uint32_t a = rsrc[h] + so;
        const uint32_t x0 = lds32(a), x1 = lds32(a + 4), x2 = lds32(a + 8), x3 = lds32(a + 12), x4 = lds32(a + 16);
        const int b = (sh[h] & 1) * 16;
        o[h].x = __funnelshift_r(x0, x1, b);
        o[h].y = __funnelshift_r(x1, x2, b);
        o[h].z = __funnelshift_r(x2, x3, b);
        o[h].w = __funnelshift_r(x3, x4, b);
        if (nv < 8) {
          uint32_t v[4] = {o[h].x, o[h].y, o[h].z, o[h].w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (2 * u >= nv) v[u] = 0u;
            else if (2 * u + 1 >= nv) v[u] &= 0xFFFFu;
          }
          o[h] = make_uint4(v[0], v[1], v[2], v[3]);
        }
      }
    }
    __syncwarp();  // every lane of the row group has read before anyone writes
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (r0 + 32 * h < R16) sts128(ydst + so + h * HB, o[h]);
  };

  // bf16 dW tile of `c0` from os buffer `b` to global (16-byte coalesced stores)
  // (this thread's chunk j of columns wc and wc + 32; both addresses computed once, kept in registers)
  uint32_t osrc = smem_u32(os + wc * LD + j * 8);
  long long dwo = (long long)(ebase + (size_t)wc * 64 + j * 8);  // an element offset: a pinned pointer loses
  asm volatile("" : "+r"(osrc), "+l"(dwo));                         // its global space (generic stores)
  auto store_dw = [&](int b, int c0) {
    const int ncols = min(64, f - c0);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (wc + 32 * h < ncols)
        *reinterpret_cast<uint4*>(p.dwd + dwo + (c0 + 32 * h) * 64) = lds128(osrc + b * TB + h * HB);
  };

  // prologue: steps 0 .. ST-2 in flight; step 0 realigned; the tile's zw
  if (do_dw) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + 32 * h;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < w.R) v = __ldg(reinterpret_cast<const uint4*>(p.zw + (size_t)(w.start + row) * 64 + j * 8));
      *reinterpret_cast<uint4*>(zs + row * LD + j * 8) = v;
    }
  }
#pragma unroll
  for (int q = 0; q < ST - 1; ++q) issue(q, q * TB);
  cp_wait<ST - 2>();
  __syncthreads();
  realign(0, 0u);

  const int li = lane >> 3, lr = lane & 7;  // ldmatrix: matrix id, row in matrix
  const int g = lane >> 2, t = lane & 3;    // mma fragment coords
  const int h2 = warp >> 2, nq = warp & 3;  // dz: m-tiles {h2, h2+2}, k cols nq*16 .. +15
  const int mq = warp & 3, kh = warp >> 2;  // dW: n tile mq*16 .. +15, k cols kh*32 .. +31
  const int nmt = (w.R + 15) >> 4;
  // the lane's byte offsets of its ldmatrix rows in a tile (kc, mi and np add immediates), kept in registers: the
  // empty asm stops the compiler from recomputing them from the thread index at every use (it did, at 80 registers)
  uint32_t o_za = ((h2 * 16 + (li & 1) * 8 + lr) * LD + (li >> 1) * 8) * 2;  // dz A: dY rows
  uint32_t o_zb = (((li & 1) * 8 + lr) * LD + nq * 16 + (li >> 1) * 8) * 2;  // dz B: w_down
  uint32_t o_wa = (((li >> 1) * 8 + lr) * LD + mq * 16 + (li & 1) * 8) * 2;  // dW A: dY^T
  uint32_t o_wb = (((li & 1) * 8 + lr) * LD + kh * 32 + (li >> 1) * 8) * 2;  // dW B: zw
  uint32_t o_st = smem_u32(os + (mq * 16 + g) * LD + kh * 32 + 2 * t);      // dW staging: the lane's first word
  asm volatile("" : "+r"(o_za), "+r"(o_zb), "+r"(o_wa), "+r"(o_wb), "+r"(o_st));

  float accz[2][2][4];
  float accw[4][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int q = 0; q < 4; ++q) accz[a][b][q] = 0.f;

  int pend_c0 = -1;  // a dW tile staged in os[pend_b] waiting for its global store
  int pend_b = 0;
  uint32_t so_cur = 0;

  // so: the byte offset of stage it % ST, kept as a counter (no division per step)
  for (int it = 0; it < w.nitems; ++it) {
    const uint32_t so = so_cur;
    const int c0 = (w.stepbeg + it) * 64;
    const int ncols = min(64, f - c0);
    const uint32_t nxt = so + TB == ST * TB ? 0u : so + TB;
    const uint32_t prv = so == 0u ? (ST - 1) * TB : so - TB;  // stage (it + ST - 1) % ST
    so_cur = nxt;

    cp_wait<ST - 3>();  // this thread's copies of step it + 1 landed
    __syncthreads();    // ... everyone's; step it realigned; step it - 1 fully consumed
    if (pend_c0 >= 0) {
      store_dw(pend_b, pend_c0);
      pend_c0 = -1;
    }
    if (it + 1 < w.nitems) realign(it + 1, nxt);
    issue(it + ST - 1, prv);

    // ---- dz: accz[rows, k] += dY[rows, n] @ wd[n, k]
    const uint32_t rs = smem_u32(raw) + so;
    {
      const uint32_t wb_s = smem_u32(wdb) + so;
      const int nkc = (ncols + 15) >> 4;
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < nkc) {
          uint32_t b0, b1, b2, b3;
          ldsm4<true>(wb_s + o_zb + kc * (16 * LD * 2), b0, b1, b2, b3);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            const int mt = h2 + 2 * mi;
            if (mt < nmt) {
              uint32_t a0, a1, a2, a3;
              ldsm4<false>(rs + o_za + mi * HB + kc * 32, a0, a1, a2, a3);
              mma_bf16_16816(accz[mi][0], a0, a1, a2, a3, b0, b1);
              mma_bf16_16816(accz[mi][1], a0, a1, a2, a3, b2, b3);
            }
          }
        }
      }
    }

    // ---- dW: accw[n, k] = dY^T[n, rows] @ zw[rows, k]
    if (!do_dw) continue;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int q = 0; q < 4; ++q) accw[a][q] = 0.f;
    {
      const uint32_t zs_s = smem_u32(zs);
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < nmt) {
          uint32_t a0, a1, a2, a3;
          ldsm4<true>(rs + o_wa + kc * (16 * LD * 2), a0, a1, a2, a3);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t b0, b1, b2, b3;
            ldsm4<true>(zs_s + o_wb + kc * (16 * LD * 2) + np * 32, b0, b1, b2, b3);
            mma_bf16_16816(accw[2 * np], a0, a1, a2, a3, b0, b1);
            mma_bf16_16816(accw[2 * np + 1], a0, a1, a2, a3, b2, b3);
          }
        }
      }
    }
    {  // stage the bf16 tile; stored after the next barrier
      const uint32_t ob = o_st + (it & (OSB - 1)) * TB;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {  // rows n = mq * 16 + g (+ 8), columns k = kh * 32 + nt * 8 + 2 t
        sts32(ob + nt * 16, pack_bf16(accw[nt][0], accw[nt][1]));
        sts32(ob + 8 * LD * 2 + nt * 16, pack_bf16(accw[nt][2], accw[nt][3]));
      }
      pend_c0 = c0;
      pend_b = it & (OSB - 1);
    }
  }
  cp_wait<0>();
  __syncthreads();
  if (pend_c0 >= 0) store_dw(pend_b, pend_c0);

  // this slice's dz partial (plain stores, one writer per element)
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    const int mt = h2 + 2 * mi;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int rl = mt * 16 + g + hf * 8;
      if (rl < w.R) {
        float* dst = p.ws + ((size_t)w.sl * p.M + w.start + rl) * 64;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          *reinterpret_cast<float2*>(dst + nq * 16 + nt * 8 + 2 * t) =
              make_float2(accz[mi][nt][2 * hf], accz[mi][nt][2 * hf + 1]);
      }
    }
  }
}

__device__ __forceinline__ void dz_kernel(const DzParams& p, unsigned char* smem) {
  const int S = p.S;
  const int tile = blockIdx.x / S;
  Walk w;
  w.sl = blockIdx.x - tile * S;
  int t = 0;  // the tile's index within its expert
  if (tile < p.E) {
    w.e = tile;
  } else {
    const int j = tile - p.E;
    if (j >= __ldg(p.xtile_cum + p.E - 1)) return;  // past the last further tile (the grid is an upper bound)
    w.e = tile_expert(p.xtile_cum, p.E, j);
    t = j + 1 - (w.e ? __ldg(p.xtile_cum + w.e - 1) : 0);
  }
  const int lo = w.e ? __ldg(p.offs + w.e - 1) : 0;
  const int hi = __ldg(p.offs + w.e);
  w.start = lo + t * 64;
  w.R = max(0, min(64, hi - w.start));
  w.do_dw = p.dwd != nullptr && hi - lo <= 64;
  if (w.R == 0 && !w.do_dw) return;  // an empty expert's tile without dW: nothing to write
  w.stepbeg = (int)((long long)w.sl * p.nsteps / S);
  w.nitems = (int)((long long)(w.sl + 1) * p.nsteps / S) - w.stepbeg;
  if (w.R == 0) {  // an empty expert: its dW slice is zeros; plain 16-byte stores, no pipeline (no row, no w_down)
    const int cb = w.stepbeg * 64, ce = min(p.f, (w.stepbeg + w.nitems) * 64);
    uint4* dst = reinterpret_cast<uint4*>(p.dwd + ((size_t)w.e * p.f + cb) * 64);
    for (int q = threadIdx.x; q < (ce - cb) * 8; q += NT) dst[q] = make_uint4(0, 0, 0, 0);
    return;
  }
  dz_body(p, w, smem);
}

}  // namespace

// 2 CTAs per SM on sm_90 (registers <= 128, shared memory 2 x 99 KB)
extern "C" __global__ void __launch_bounds__(NT, 2) tsctk_glu_bwd_dz_bf16(DzParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  dz_kernel(p, smem);
}

namespace tsct {
const KernelEntry kGluKernels[] = {
    {"tsctk_glu_bwd_dz_bf16", (const void*)tsctk_glu_bwd_dz_bf16, SMEM_BYTES},
    {nullptr, nullptr},
};
}  // namespace tsct

extern "C" int tsct_glu_bwd_dz_bf16(const void* grad_out, int64_t grad_rows, int64_t f, const int64_t* scatter_idx,
                                    const int32_t* offs, const int32_t* xtile_cum, int64_t num_experts, int64_t m,
                                    int64_t max_tiles, const void* w_down_t, const void* zw, int64_t r, int64_t slices,
                                    float* dz_part, void* dw_down_t, void* stream) {
  static const char* fn = "tsct_glu_bwd_dz_bf16";
  tsct::clear_error_detail();
  if (r != 64)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: r=%lld, only r = 64 is built", fn, (long long)r);
  if (grad_rows < 0 || f <= 0 || num_experts < 0 || m < 0 || max_tiles < 0 || f > INT32_MAX || m > INT32_MAX ||
      num_experts > INT32_MAX)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (grad_rows=%lld, f=%lld, num_experts=%lld, m=%lld, max_tiles=%lld; need f >= 1, "
                      "the others >= 0, f, m and num_experts < 2^31)", fn, (long long)grad_rows, (long long)f,
                      (long long)num_experts, (long long)m, (long long)max_tiles);
  const int64_t nsteps = (f + 63) / 64;
  if (slices < 1 || slices > MAX_SLICES || slices > nsteps)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: slices=%lld, need 1 <= slices <= min(16, ceil(f / 64) = %lld)", fn,
                      (long long)slices, (long long)nsteps);
  int64_t total;
  if (!tsct::checked_mul3(grad_rows, f, 2, &total) || !tsct::checked_mul3(num_experts, f, 128, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  if (max_tiles > INT32_MAX / slices)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: max_tiles * slices exceeds the grid", fn);
  if (num_experts == 0 || m == 0 || max_tiles == 0) return 0;  // no row tile: nothing to write
  if ((grad_rows > 0 && !grad_out) || !offs || !xtile_cum || !w_down_t || !zw || !dz_part)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: null pointer (grad_out=%p, offs=%p, xtile_cum=%p, w_down_t=%p, zw=%p, dz_part=%p)", fn,
                      grad_out, (const void*)offs, (const void*)xtile_cum, w_down_t, zw, (void*)dz_part);
  if (((uintptr_t)scatter_idx & 7) || ((uintptr_t)offs & 3) || ((uintptr_t)xtile_cum & 3))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: scatter_idx must be 8-byte, offs and xtile_cum 4-byte aligned",
                      fn);
  const uintptr_t any = (uintptr_t)grad_out | (uintptr_t)w_down_t | (uintptr_t)zw | (uintptr_t)dz_part |
                        (uintptr_t)dw_down_t;
  if (any & 15)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: grad_out, w_down_t, zw, dz_part and dw_down_t must be 16-byte aligned",
                      fn);
  const void* kernel = (const void*)tsctk_glu_bwd_dz_bf16;
  static std::atomic<bool> opted[64] = {};
  if (int rc = tsct::opt_in_shared_memory(fn, kernel, SMEM_BYTES, opted)) return rc;
  DzParams p;
  p.dy = static_cast<const bf16*>(grad_out);
  p.sidx = reinterpret_cast<const long long*>(scatter_idx);
  p.offs = offs;
  p.xtile_cum = xtile_cum;
  p.wd = static_cast<const bf16*>(w_down_t);
  p.zw = static_cast<const bf16*>(zw);
  p.ws = dz_part;
  p.dwd = static_cast<bf16*>(dw_down_t);
  p.total = grad_rows * f;
  p.T = grad_rows;
  p.M = static_cast<int>(m);
  p.E = static_cast<int>(num_experts);
  p.f = static_cast<int>(f);
  p.S = static_cast<int>(slices);
  p.nsteps = static_cast<int>(nsteps);
  void* args[] = {&p};
  (void)cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(max_tiles * slices)), dim3(NT), args, SMEM_BYTES,
                         static_cast<cudaStream_t>(stream));  // its error is check_launch's
  return tsct::check_launch(fn);
}
