// Prototype (session 11): persistent up projection + combine, bf16, K-major w_down [E, f, 64], r = 64.
// One CTA per SM. f in chunks of 256 columns; per chunk: phase A (each CTA: its experts' row tiles,
// y chunk -> ybuf[c % 2], [M, 256] bf16, meant to stay in L2), grid barrier, phase B (each CTA: its targets'
// rows summed in CSR order, fp32, -> out[:, chunk]). The cp.async ring runs across chunks and barriers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/mma_sm80.cuh"

using namespace tsct::sm80;

#define NT 256
#define BM 64
#define RK 64
#define CW 256               // chunk width (columns)
#ifndef UPC_ST
#define UPC_ST 4
#endif
#define Z_ST (BM * RK * 2)   // 8 KB
#define W_ST (CW * RK * 2)   // 32 KB
#define STAGE (Z_ST + W_ST)
#ifndef MAX_ITEMS
#define MAX_ITEMS 1024
#endif
#define MAX_TGT 512
#ifndef UPC_U
#define UPC_U 8
#endif
#define ST UPC_ST
#define U UPC_U
#ifndef Y_LAST
#define Y_LAST 0
#endif
#ifndef OUT_FIRST
#define OUT_FIRST 0
#endif
#ifndef DISCARD
#define DISCARD 0
#endif
#ifndef Y_MOD
#define Y_MOD 0
#endif
#ifndef ALIGN_OUT
#define ALIGN_OUT 0
#endif
#ifndef BULK
#define BULK 0
#endif
#ifndef NO_MMA
#define NO_MMA 0
#endif
#ifndef NO_STORE
#define NO_STORE 0
#endif

struct P {
  const bf16* z; const int* offs; const bf16* wd; const float* rw; bf16* ybuf;
  const long long* order; const long long* ptr; bf16* out; unsigned* counter;
  int E, f, M, n_out, mode;
};

constexpr int SMEM = ST * STAGE + MAX_ITEMS * 16 + MAX_TGT * 12 + 8 * U * 512 + 64;

__device__ __forceinline__ uint4 ldcg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// elements [s, s + 8) of the 16 bf16 in W[0..7] (W[0] holds elements 0, 1), s in 1..7 (uniform)
__device__ __forceinline__ uint4 window8(const uint32_t* W, int s) {
#define FS(i) __funnelshift_r(W[i], W[i + 1], 16)
  switch (s) {
    case 1: return make_uint4(FS(0), FS(1), FS(2), FS(3));
    case 2: return make_uint4(W[1], W[2], W[3], W[4]);
    case 3: return make_uint4(FS(1), FS(2), FS(3), FS(4));
    case 4: return make_uint4(W[2], W[3], W[4], W[5]);
    case 5: return make_uint4(FS(2), FS(3), FS(4), FS(5));
    case 6: return make_uint4(W[3], W[4], W[5], W[6]);
    default: return make_uint4(FS(3), FS(4), FS(5), FS(6));
  }
#undef FS
}

template <int EVICT>
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int bytes, uint64_t pol) {
  if (EVICT)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(bytes), "l"(pol) : "memory");
  else
    cp_async16(dst, src, bytes);
}

template <int EVICT, int STAGED>
__global__ void __launch_bounds__(NT, 1) upc_kernel(P p) {
  extern __shared__ __align__(128) unsigned char sm[];
  unsigned char* stages = sm;
  int4* items = reinterpret_cast<int4*>(sm + ST * STAGE);                    // (row0, e, hi)
  int* t_r0 = reinterpret_cast<int*>(sm + ST * STAGE + MAX_ITEMS * 16);
  int* t_r1 = t_r0 + MAX_TGT;
  int* t_cnt = t_r1 + MAX_TGT;
  unsigned char* stg = sm + ST * STAGE + MAX_ITEMS * 16 + MAX_TGT * 12;      // phase-B staging, per warp
  int* s_n = reinterpret_cast<int*>(stg + 8 * U * 512);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = gridDim.x, b = blockIdx.x;
  uint64_t pol = 0, pol_last = 0;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol_last));

  // items: this CTA's experts e = b + k G, each row tile of 64 rows
  if (tid == 0) {
    int n = 0;
    for (int e = b; e < p.E; e += G) {
      int lo = e ? p.offs[e - 1] : 0, hi = p.offs[e];
      for (int r0 = lo; r0 < hi && n < MAX_ITEMS; r0 += BM) items[n++] = make_int4(r0, e, hi, 0);
    }
    s_n[0] = n;
  }
  const int t_lo = (int)(((long long)b * p.n_out) / G), t_hi = (int)(((long long)(b + 1) * p.n_out) / G);
  for (int t = t_lo + tid; t < t_hi && t - t_lo < MAX_TGT; t += NT) {
    long long a = p.ptr[t], z = p.ptr[t + 1];
    t_cnt[t - t_lo] = (int)(z - a);
    t_r0[t - t_lo] = z > a ? (int)p.order[a] : 0;
    t_r1[t - t_lo] = z > a + 1 ? (int)p.order[a + 1] : 0;
  }
  __syncthreads();
  const int nI = s_n[0];
  const int nC = (p.f + CW - 1) / CW;
  const int total = nI * nC;
  const size_t half = (size_t)p.M * CW;

  auto issue = [&](int s) {
    if (s < total) {
      const int c = s / nI, i = s - c * nI;
      const int4 it = items[i];
      const int e = it.y, r0 = it.x;
      const int hi = it.z;
      unsigned char* st = stages + (s % ST) * STAGE;
      const uint32_t zs = smem_u32(st), ws = smem_u32(st + Z_ST);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        int idx = tid + NT * q, rr = idx >> 3, j = idx & 7;
        int row = r0 + rr;
        const bf16* src = p.z + (size_t)(row < hi ? row : 0) * RK + j * 8;
        cp_async16(zs + rr * 128 + ((j ^ (rr & 7)) << 4), src, row < hi ? 16 : 0);
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        int idx = tid + NT * q, n = idx >> 3, j = idx & 7;
        int col = c * CW + n;
        const bf16* src = p.wd + ((size_t)e * p.f + (col < p.f ? col : 0)) * RK + j * 8;
        cp16<EVICT>(ws + n * 128 + ((j ^ (n & 7)) << 4), src, col < p.f ? 16 : 0, pol);
      }
    }
    cp_commit();
  };

  for (int s = 0; s < ST - 1; ++s) issue(s);
  const int wm = warp & 3, wn = warp >> 2;
  int s = 0;
  for (int c = 0; c < nC; ++c) {
    bf16* buf = p.ybuf + (size_t)(c & 1) * half;
    for (int i = 0; i < ((p.mode & 1) ? nI : 0); ++i, ++s) {
      cp_wait<ST - 2>();
      if (BULK && tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // stage free again
      __syncthreads();
      issue(s + ST - 1);
      const unsigned char* st = stages + (s % ST) * STAGE;
      const uint32_t zs = smem_u32(st), ws = smem_u32(st + Z_ST);
      float acc[16][4];
#pragma unroll
      for (int t = 0; t < 16; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < (NO_MMA ? 0 : 4); ++kk) {
        uint32_t a0, a1, a2, a3;
        {
          int row = wm * 16 + (lane & 15), kc = kk * 2 + (lane >> 4);
          ldsm4<false>(zs + row * 128 + ((kc ^ (row & 7)) << 4), a0, a1, a2, a3);
        }
#pragma unroll
        for (int pp = 0; pp < 8; ++pp) {
          int n = wn * 128 + pp * 16 + (lane & 7) + ((lane >> 4) << 3), kc = kk * 2 + ((lane >> 3) & 1);
          uint32_t b0, b1, b2, b3;
          ldsm4<false>(ws + n * 128 + ((kc ^ (n & 7)) << 4), b0, b1, b2, b3);
          mma_bf16_16816(acc[2 * pp], a0, a1, a2, a3, b0, b1);
          mma_bf16_16816(acc[2 * pp + 1], a0, a1, a2, a3, b2, b3);
        }
      }
      const int4 it = items[i];
      const int hi = it.z;
      const int ra = it.x + wm * 16 + (lane >> 2), rb = ra + 8;
      const float wa = (p.rw && ra < hi) ? p.rw[ra] : 1.f, wb = (p.rw && rb < hi) ? p.rw[rb] : 1.f;
      if (NO_STORE) {
      } else if (STAGED) {
        // the y tile [64][256] bf16 through the stage's w_down area (512-byte rows, 16-byte chunks swizzled by
        // row & 7), then whole-row 16-byte stores: y's tile is one contiguous span of the buffer
        __syncthreads();  // every warp is done reading this stage
        unsigned char* ys = const_cast<unsigned char*>(st) + Z_ST;
        const int la = wm * 16 + (lane >> 2), lb = la + 8;
#pragma unroll
        for (int t = 0; t < 16; ++t) {
          int ch = wn * 16 + t, w4 = (lane & 3) * 4;
          const int sa = BULK ? ch : (ch ^ (la & 7)), sb = BULK ? ch : (ch ^ (lb & 7));
          *reinterpret_cast<uint32_t*>(ys + la * 512 + (sa << 4) + w4) = pack_bf16(acc[t][0] * wa, acc[t][1] * wa);
          *reinterpret_cast<uint32_t*>(ys + lb * 512 + (sb << 4) + w4) = pack_bf16(acc[t][2] * wb, acc[t][3] * wb);
        }
        const int nrow = min(BM, hi - it.x);
        if (BULK) {  // one bulk copy of the tile's rows (contiguous in the buffer), issued by thread 0
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          __syncthreads();
          if (tid == 0 && nrow > 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(buf + (size_t)it.x * CW),
                         "r"(smem_u32(ys)), "r"(nrow * CW * 2) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
          }
          continue;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          int idx = tid + NT * q, row = idx >> 5, ch = idx & 31;
          if (row < nrow) {
            uint4 v = *reinterpret_cast<const uint4*>(ys + row * 512 + ((ch ^ (row & 7)) << 4));
            bf16* dst = buf + (size_t)(Y_MOD ? (it.x + row) % Y_MOD : it.x + row) * CW + ch * 8;
            if (Y_LAST)
              asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(dst), "r"(v.x), "r"(v.y),
                           "r"(v.z), "r"(v.w), "l"(pol_last) : "memory");
            else
              *reinterpret_cast<uint4*>(dst) = v;
          }
        }
      } else {
#pragma unroll
        for (int t = 0; t < 16; ++t) {
          int col = wn * 128 + t * 8 + (lane & 3) * 2;
          if (ra < hi) *reinterpret_cast<uint32_t*>(buf + (size_t)ra * CW + col) = pack_bf16(acc[t][0] * wa, acc[t][1] * wa);
          if (rb < hi) *reinterpret_cast<uint32_t*>(buf + (size_t)rb * CW + col) = pack_bf16(acc[t][2] * wb, acc[t][3] * wb);
        }
      }
    }
    // grid barrier: every CTA's y chunk c is written
    if (BULK && tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    __syncthreads();
    if (tid == 0 && (p.mode & 2)) {
      __threadfence();
      atomicAdd(p.counter, 1u);
      const unsigned want = (unsigned)(c + 1) * G;
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p.counter) : "memory");
      } while (v < want);
      __threadfence();
    }
    __syncthreads();
    // phase B: out[t, c*CW + :] for this CTA's targets, U per warp at a time
    const int n0 = c * CW;
    const bool full = n0 + CW <= p.f;
    unsigned char* my = stg + warp * U * 512;
    const int nt = t_hi - t_lo;
    for (int tb = warp * U; tb < ((p.mode & 4) ? nt : 0); tb += 8 * U) {
      uint4 v0[U], v1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int k = tb + u;
        int cnt = k < nt ? (k < MAX_TGT ? t_cnt[k] : 0) : 0;
        v0[u] = make_uint4(0, 0, 0, 0);
        v1[u] = make_uint4(0, 0, 0, 0);
        if (cnt > 0) v0[u] = ldcg16(buf + (size_t)t_r0[k] * CW + lane * 8);
        if (cnt > 1) v1[u] = ldcg16(buf + (size_t)t_r1[k] * CW + lane * 8);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int k = tb + u;
        if (k >= nt) break;
        int cnt = t_cnt[k];
        float a[8];
        const bf16* h0 = reinterpret_cast<const bf16*>(&v0[u]);
        const bf16* h1 = reinterpret_cast<const bf16*>(&v1[u]);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          a[q] = 0.f;
          a[q] += __bfloat162float(h0[q]);
          if (cnt > 1) a[q] += __bfloat162float(h1[q]);
        }
        if (cnt > 2) {
          long long base = p.ptr[t_lo + k];
          for (int j = 2; j < cnt; ++j) {
            int row = (int)p.order[base + j];
            uint4 w = ldcg16(buf + (size_t)row * CW + lane * 8);
            const bf16* hw = reinterpret_cast<const bf16*>(&w);
#pragma unroll
            for (int q = 0; q < 8; ++q) a[q] += __bfloat162float(hw[q]);
          }
        }
        if (DISCARD && (lane & 7) == 0) {
          const bf16* l0 = buf + (size_t)t_r0[k] * CW + lane * 8;
          if (cnt > 0) asm volatile("discard.global.L2 [%0], 128;" ::"l"(l0) : "memory");
          const bf16* l1 = buf + (size_t)t_r1[k] * CW + lane * 8;
          if (cnt > 1) asm volatile("discard.global.L2 [%0], 128;" ::"l"(l1) : "memory");
        }
        uint4 o;
        o.x = pack_bf16(a[0], a[1]); o.y = pack_bf16(a[2], a[3]);
        o.z = pack_bf16(a[4], a[5]); o.w = pack_bf16(a[6], a[7]);
        if (ALIGN_OUT && full) {
          // out's row segment starts at any 2-byte offset: 16-byte words of out from this lane's and the previous
          // lane's 8 values (one uniform shift per row); lane 0 writes the two partial words element by element
          const long long e0 = (long long)(t_lo + k) * p.f + n0;
          const int al = (int)(e0 & 7);
          bf16* ob = p.out + (e0 - al);
          const int src = (lane + 31) & 31;
          uint32_t W[8] = {__shfl_sync(0xffffffffu, o.x, src), __shfl_sync(0xffffffffu, o.y, src),
                           __shfl_sync(0xffffffffu, o.z, src), __shfl_sync(0xffffffffu, o.w, src), o.x, o.y, o.z, o.w};
          if (al == 0) {
            *reinterpret_cast<uint4*>(ob + lane * 8) = o;
          } else {
            if (lane > 0) *reinterpret_cast<uint4*>(ob + lane * 8) = window8(W, 8 - al);
            if (lane == 0) {
              const bf16* cur = reinterpret_cast<const bf16*>(&W[4]);
              const bf16* prv = reinterpret_cast<const bf16*>(&W[0]);
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                if (j < 8 - al) ob[al + j] = cur[j];
                if (j < al) ob[CW + j] = prv[8 - al + j];
              }
            }
          }
        } else {
          *reinterpret_cast<uint4*>(my + u * 512 + lane * 16) = o;
        }
      }
      __syncwarp();
#pragma unroll
      for (int u = 0; u < ((ALIGN_OUT && full) ? 0 : U); ++u) {
        int k = tb + u;
        if (k >= nt) break;
        bf16* orow = p.out + (size_t)(t_lo + k) * p.f + n0;
        const bf16* srow = reinterpret_cast<const bf16*>(my + u * 512);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          int col = q * 32 + lane;
          if (n0 + col < p.f) {
            if (OUT_FIRST)
              asm volatile("st.global.L2::cache_hint.b16 [%0], %1, %2;" ::"l"(orow + col),
                           "h"(*reinterpret_cast<const unsigned short*>(srow + col)), "l"(pol) : "memory");
            else
              orow[col] = srow[col];
          }
        }
      }
      __syncwarp();
    }
  }
  cp_wait<0>();
}

extern "C" int upc_launch(const void* z, const int* offs, const void* wd, const float* rw, void* ybuf,
                          const long long* order, const long long* ptr, void* out, unsigned* counter, int E, int f,
                          int M, int n_out, int grid, int evict, int mode, void* stream) {
  P p{(const bf16*)z, offs, (const bf16*)wd, rw, (bf16*)ybuf, order, ptr, (bf16*)out, counter, E, f, M, n_out, mode};
  cudaStream_t s = (cudaStream_t)stream;
  cudaMemsetAsync(counter, 0, 4, s);
  auto go = [&](auto kern) {
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    kern<<<grid, NT, SMEM, s>>>(p);
  };
  if (evict & 2) {
    if (evict & 1) go(upc_kernel<1, 1>); else go(upc_kernel<0, 1>);
  } else {
    if (evict & 1) go(upc_kernel<1, 0>); else go(upc_kernel<0, 0>);
  }
  return (int)cudaGetLastError();
}

extern "C" int upc_smem() { return SMEM; }
