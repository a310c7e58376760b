// combine_rows in CUDA C++: the deterministic combine of the grouped GLU (design.md section 2), the sum of each
// target's routed rows in a fixed order. Entry point tsct_combine_rows (tsct.h); caller
// python/tsct/kernels/triton_glu/glu.py (_combine); measurements bench/notes.md "Session 10".
//
//   out[t, c] = sum_{j in [ptr[t], ptr[t+1])} src[order[j], c]     fp32 from +0 in increasing j, rounded once
//
// The same sum, in the same order, as the Triton combine_rows, so the bits are equal. Why CUDA: at odd ncols
// (f = 5461) out's rows start at 2-byte offsets, and Triton stores them element by element; here every row
// is written with 16-byte stores. One warp per target row. src rows are 16-byte aligned (ld_src a multiple of
// 16 bytes), out row t is not: its first 16-byte boundary is at column h = (-t * ncols) mod V (V elements per
// 16 bytes). A lane sums the V columns [h + V q, h + V q + V) of every source row (16-byte chunks q and q + 1
// of the row, shifted by h: h is fixed per row, so the shift is a template parameter and costs no
// instruction) and stores them with one 16-byte write; the < V columns before h and after the last full chunk
// are summed and stored one by one. A target's first four source rows are loaded once per warp; more rows
// (rare: top-k > 4 or a hot target) reload their index per chunk.
// No shared memory, no atomics; any sm_80+ GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/host.h"
#include "tsct/tsct.h"

namespace {

constexpr int kWarps = 8;    // target rows per CTA
constexpr int kHoisted = 4;  // source rows whose offsets a warp keeps in registers

// V elements of one 16-byte chunk <-> fp32
template <typename T>
struct Elt;

template <>
struct Elt<float> {
  static constexpr int V = 4;
  __device__ static void unpack(uint4 u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  __device__ static float load1(const float* p) { return __ldg(p); }
  __device__ static void store1(float* p, float v) { *p = v; }
};

template <>
struct Elt<__nv_bfloat16> {
  static constexpr int V = 8;
  __device__ static void unpack2(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ static void unpack(uint4 u, float* f) {
    unpack2(u.x, f);
    unpack2(u.y, f + 2);
    unpack2(u.z, f + 4);
    unpack2(u.w, f + 6);
  }
  __device__ static uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even, as Triton's fp32 -> bf16
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
  }
  __device__ static float load1(const __nv_bfloat16* p) { return __bfloat162float(__ldg(p)); }
  __device__ static void store1(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};

template <>
struct Elt<__half> {
  static constexpr int V = 8;
  __device__ static void unpack2(uint32_t w, float* f) {
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w));
    f[0] = v.x;
    f[1] = v.y;
  }
  __device__ static void unpack(uint4 u, float* f) {
    unpack2(u.x, f);
    unpack2(u.y, f + 2);
    unpack2(u.z, f + 4);
    unpack2(u.w, f + 6);
  }
  __device__ static uint32_t pack2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
  }
  __device__ static float load1(const __half* p) { return __half2float(__ldg(p)); }
  __device__ static void store1(__half* p, float v) { *p = __float2half_rn(v); }
};

template <typename T>
struct CombineParams {
  const T* src;
  const long long* order;
  const long long* ptr;
  T* out;
  long long ld;  // src row stride, elements (a multiple of V)
  long long n_out;
  int ncols;
};

// acc += the V columns [H + V q, H + V q + V) of source row `row` (H = 0: one aligned chunk)
template <typename T, int H>
__device__ __forceinline__ void add_chunk(const T* __restrict__ row, int q, float* acc) {
  constexpr int V = Elt<T>::V;
  const uint4* c = reinterpret_cast<const uint4*>(row) + q;
  float a[V];
  Elt<T>::unpack(__ldg(c), a);
  if constexpr (H == 0) {
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] += a[i];
  } else {  // chunk q + 1 lies inside the row: H + V q + V - 1 < ncols <= ld, and ld is a multiple of V
    float b[V];
    Elt<T>::unpack(__ldg(c + 1), b);
#pragma unroll
    for (int i = 0; i < V - H; ++i) acc[i] += a[H + i];
#pragma unroll
    for (int i = V - H; i < V; ++i) acc[i] += b[i - (V - H)];
  }
}

// one target row whose first 16-byte boundary is at column H
template <typename T, int H>
__device__ __forceinline__ void combine_row(const CombineParams<T>& p, long long lo, long long n, T* __restrict__ orow, int lane) {
  constexpr int V = Elt<T>::V;
  const int ncols = p.ncols;
  const int nq = ncols >= H ? (ncols - H) / V : 0;  // full 16-byte chunks of the out row
  const T* rows[kHoisted];
#pragma unroll
  for (int j = 0; j < kHoisted; ++j) rows[j] = j < n ? p.src + __ldg(p.order + lo + j) * p.ld : p.src;
  for (int q = lane; q < nq; q += 32) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kHoisted; ++j)
      if (j < n) add_chunk<T, H>(rows[j], q, acc);
    for (long long j = kHoisted; j < n; ++j) add_chunk<T, H>(p.src + __ldg(p.order + lo + j) * p.ld, q, acc);
    *reinterpret_cast<uint4*>(orow + H + q * V) = Elt<T>::pack(acc);
  }
  // the columns before H and after the last full chunk: at most 2 (V - 1) < 32, one per lane
  const int tail0 = H + nq * V;
  const int nhead = H < ncols ? H : ncols;
  const int c = lane < nhead ? lane : tail0 + (lane - nhead);
  if (c < (lane < nhead ? nhead : ncols)) {
    float acc = 0.f;
    for (long long j = 0; j < n; ++j) acc += Elt<T>::load1(p.src + __ldg(p.order + lo + j) * p.ld + c);
    Elt<T>::store1(orow + c, acc);
  }
}

template <typename T, int H = 0>
__device__ __forceinline__ void combine_phase(int h, const CombineParams<T>& p, long long lo, long long n, T* orow,
                                              int lane) {
  if constexpr (H < Elt<T>::V) {
    if (h == H)
      combine_row<T, H>(p, lo, n, orow, lane);
    else
      combine_phase<T, H + 1>(h, p, lo, n, orow, lane);
  }
}

template <typename T>
__device__ __forceinline__ void combine_kernel(const CombineParams<T>& p) {
  constexpr int V = Elt<T>::V;
  const long long t = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (t >= p.n_out) return;
  const int lane = threadIdx.x & 31;
  const long long lo = __ldg(p.ptr + t);
  const long long n = __ldg(p.ptr + t + 1) - lo;
  const long long start = t * p.ncols;  // out row t's first element
  const int h = (int)((V - start % V) % V);
  combine_phase<T>(h, p, lo, n, p.out + start, lane);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kWarps * 32) tsctk_combine_rows_f32(CombineParams<float> p) {
  combine_kernel(p);
}
extern "C" __global__ void __launch_bounds__(kWarps * 32) tsctk_combine_rows_bf16(CombineParams<__nv_bfloat16> p) {
  combine_kernel(p);
}
extern "C" __global__ void __launch_bounds__(kWarps * 32) tsctk_combine_rows_f16(CombineParams<__half> p) {
  combine_kernel(p);
}

namespace tsct {
const KernelEntry kCombineKernels[] = {
    {"tsctk_combine_rows_f32", (const void*)tsctk_combine_rows_f32},
    {"tsctk_combine_rows_bf16", (const void*)tsctk_combine_rows_bf16},
    {"tsctk_combine_rows_f16", (const void*)tsctk_combine_rows_f16},
    {nullptr, nullptr},
};
}  // namespace tsct

template <typename T>
static void launch_combine(const void* src, int64_t ld_src, const int64_t* order, const int64_t* ptr, int64_t n_out,
                           int64_t ncols, void* out, cudaStream_t stream,
                           void (*kernel)(CombineParams<T>)) {
  CombineParams<T> p;
  p.src = static_cast<const T*>(src);
  p.order = reinterpret_cast<const long long*>(order);
  p.ptr = reinterpret_cast<const long long*>(ptr);
  p.out = static_cast<T*>(out);
  p.ld = ld_src;
  p.n_out = n_out;
  p.ncols = static_cast<int>(ncols);
  kernel<<<static_cast<unsigned>((n_out + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(p);
}

extern "C" int tsct_combine_rows(const void* src, int dtype, int64_t src_rows, int64_t ld_src, const int64_t* order,
                                 const int64_t* ptr, int64_t n_out, int64_t ncols, void* out, void* stream) {
  static const char* fn = "tsct_combine_rows";
  tsct::clear_error_detail();
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: dtype=%d, expected TSCT_F32, TSCT_BF16 or TSCT_F16", fn, dtype);
  const int64_t esize = dtype == TSCT_F32 ? 4 : 2;
  if (src_rows < 0 || n_out < 0 || ncols < 0 || ncols > INT32_MAX || ld_src < ncols || (ld_src * esize) % 16 ||
      n_out > (int64_t)INT32_MAX * 8)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (src_rows=%lld, ld_src=%lld, n_out=%lld, ncols=%lld; need them >= 0, ncols < 2^31, "
                      "ld_src >= ncols and a multiple of 16 bytes, n_out < 2^34)",
                      fn, (long long)src_rows, (long long)ld_src, (long long)n_out, (long long)ncols);
  int64_t total;
  if (!tsct::checked_mul3(src_rows, ld_src, esize, &total) || !tsct::checked_mul3(n_out, ncols, esize, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  if (n_out == 0 || ncols == 0) return 0;
  if (!ptr || !out || (src_rows > 0 && (!src || !order)))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (src=%p, order=%p, ptr=%p, out=%p)", fn, src,
                      (const void*)order, (const void*)ptr, out);
  if ((((uintptr_t)src | (uintptr_t)out) & 15) || (((uintptr_t)order | (uintptr_t)ptr) & 7))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: src and out must be 16-byte aligned, order and ptr 8-byte", fn);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == TSCT_F32)
    launch_combine<float>(src, ld_src, order, ptr, n_out, ncols, out, s, tsctk_combine_rows_f32);
  else if (dtype == TSCT_BF16)
    launch_combine<__nv_bfloat16>(src, ld_src, order, ptr, n_out, ncols, out, s, tsctk_combine_rows_bf16);
  else
    launch_combine<__half>(src, ld_src, order, ptr, n_out, ncols, out, s, tsctk_combine_rows_f16);
  return tsct::check_launch(fn);
}
