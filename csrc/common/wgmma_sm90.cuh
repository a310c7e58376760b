// PTX wrappers of the sm_90a warpgroup MMA the hand-written CUDA kernels use (csrc/glu/): bf16 wgmma.mma_async with
// the A operand in registers (the decoded factors: never stored as bf16 in memory) and B in shared memory in the
// 128-byte swizzled K-major layout, fp32 accumulate. Device-only, header-only; everything here exists only when
// TSCT_WGMMA is 1 (compiling for sm_90a: wgmma is an arch-specific feature of sm_90a, absent from sm_100 / sm_120).
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): for m64nNk16 the A registers of warp
// w of the warpgroup are the mma.sync m16n8k16 A fragment of rows 16w..16w+15, and D is, per warp, the m16n8k16
// C fragment of each n8 block t in registers 4t..4t+3. B ([N][16] of a [N][64] bf16 tile with 128-byte rows): the
// 16-byte chunk C of row n sits at byte n * 128 + 16 * (C ^ (n % 8)) from a 1024-byte aligned tile base, and the
// descriptor of k16 step s starts 32 s bytes in (wg_desc_sw128(base) + 2 s).
#pragma once

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TSCT_WGMMA 1
#else
#define TSCT_WGMMA 0
#endif

namespace tsct {
namespace sm90 {

#if TSCT_WGMMA

// Byte offset of 16-byte chunk C of row n in a 128-byte swizzled tile.
__device__ __forceinline__ uint32_t wg_chunk(int n, int C) { return n * 128 + 16 * (C ^ (n & 7)); }

// Shared memory matrix descriptor: start address (bits 0-13, >> 4), leading byte offset 16 (unused with the
// 128-byte swizzle of a K-major operand), stride byte offset 1024 (8 rows of 128 bytes, bits 32-45), 128-byte
// swizzle (bits 62-63 = 1).
__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// generic-proxy writes to shared memory (st.shared, the in-place permutes) made visible to wgmma's reads
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// keeps the compiler from moving accesses of an accumulator register across the asynchronous MMA (cf. CUTLASS
// warpgroup_fence_operand)
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
template <int N>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_reg(r[i]);
}

// d[64 x N] (+)= a[64 x 16] (registers) * b[16 x N] (descriptor); accumulate = 0 ignores d's old value.
template <int N>
__device__ __forceinline__ void wgmma_rs_bf16(float* d, const uint32_t* a, uint64_t desc, int accumulate);

template <>
__device__ __forceinline__ void wgmma_rs_bf16<32>(float* d, const uint32_t* a, uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_rs_bf16<64>(float* d, const uint32_t* a, uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

#endif  // TSCT_WGMMA

}  // namespace sm90
}  // namespace tsct
