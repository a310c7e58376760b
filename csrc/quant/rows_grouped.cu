// Grouped activation quantizer: routed rows -> NVFP4 per expert, block scales swizzled per expert
// (the A operand of the sm_120 grouped block-scaled GEMMs). Entry point tsct_nvfp4_quantize_rows_grouped
// (tsct.h); per-item code in rows_grouped_impl.cuh; recipe docs/decisions/0002; layout docs/sm120.md.
//
// Four stream-ordered steps, no host synchronisation (graph-capturable):
//   1. memset s_enc (used as per-expert amax bits) and the whole scale buffer to 0;
//   2. amax: one thread per 16-element block, warp max-reduction per expert, one atomicMax per
//      (warp, expert) on the uint32 bits (non-negative floats order like their bits);
//   3. finalize (one thread): amax -> s_enc in place, sfa_offsets (prefix sum over experts);
//   4. quantize: one thread per (row of m_alloc, block).
#include "quant/entry.cuh"
#include "quant/rows_grouped_impl.cuh"

using tsct::quant::RowsGroupedArgs;

namespace {

// Every lane of a warp runs the same number of iterations (the bound is tested on the warp's first
// item), so the full-mask match/reduce below is well defined; lanes past `items` contribute nothing.
template <typename T>
__device__ void rows_amax_body(RowsGroupedArgs a, int64_t items) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t - lane < items; t += stride) {
    int64_t e = -1;
    uint32_t bits = 0;
    if (t < items) bits = tsct::quant::rows_amax_item<T>(a, t, &e);
    const unsigned long long key = static_cast<unsigned long long>(e);
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, key);
    uint32_t best = bits;
    for (int i = 0; i < 32; ++i) {  // max over the lanes of the same expert (no sm_80-only intrinsics)
      const uint32_t other = __shfl_sync(0xFFFFFFFFu, bits, i);
      if ((peers >> i) & 1u) best = other > best ? other : best;
    }
    if (e >= 0 && lane == __ffs(peers) - 1 && best != 0)
      atomicMax(reinterpret_cast<unsigned int*>(a.s_enc) + e, best);
  }
}

}  // namespace

#define TSCT_ROWS_AMAX_KERNEL(SUFFIX, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads)                                           \
      tsctk_nvfp4_rows_amax_##SUFFIX(RowsGroupedArgs a, int64_t items) {                                  \
    rows_amax_body<T>(a, items);                                                                          \
  }

TSCT_ROWS_AMAX_KERNEL(f32, float)
TSCT_ROWS_AMAX_KERNEL(bf16, __nv_bfloat16)
TSCT_ROWS_AMAX_KERNEL(f16, __half)
// tsctk_nvfp4_rows_quantize_{f32,bf16,f16}
TSCT_ITEM_KERNELS(nvfp4_rows_quantize, RowsGroupedArgs, rows_quantize_item)

extern "C" __global__ void tsctk_nvfp4_rows_finalize(RowsGroupedArgs a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) tsct::quant::rows_finalize(a);
}

namespace tsct {
const KernelEntry kRowsGroupedKernels[] = {
    TSCT_KERNEL_ENTRIES(nvfp4_rows_amax),
    TSCT_KERNEL_ENTRIES(nvfp4_rows_quantize),
    {"tsctk_nvfp4_rows_finalize", (const void*)tsctk_nvfp4_rows_finalize},
    {nullptr, nullptr},
};
}  // namespace tsct

using tsct::quant::aligned;

extern "C" int tsct_nvfp4_quantize_rows_grouped(const void* x, int x_dtype, int64_t x_rows, int64_t k,
                                                const int64_t* gather_idx, const int32_t* offs, int64_t num_experts,
                                                int64_t m, const float* col_scale, int64_t m_alloc, uint8_t* codes,
                                                uint8_t* sfa, int64_t sfa_bytes, int32_t* sfa_offsets, float* s_enc,
                                                void* stream) {
  static const char* fn = "tsct_nvfp4_quantize_rows_grouped";
  tsct::clear_error_detail();
  if (x_rows < 0 || k < 0 || num_experts < 0 || m < 0 || m_alloc < m || sfa_bytes < 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "%s: bad sizes (x_rows=%lld, k=%lld, num_experts=%lld, m=%lld, m_alloc=%lld, sfa_bytes=%lld; "
                      "need all >= 0 and m_alloc >= m)", fn, (long long)x_rows, (long long)k, (long long)num_experts,
                      (long long)m, (long long)m_alloc, (long long)sfa_bytes);
  if (int rc = tsct::quant::check_k_and_dtype(fn, k, tsct::fmt::kNvfp4Block, x_dtype, "x_dtype")) return rc;
  if (!gather_idx && x_rows < m)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: x has %lld rows < m=%lld and no gather_idx", fn, (long long)x_rows,
                      (long long)m);
  if (sfa_bytes > INT32_MAX)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sfa_bytes=%lld does not fit the int32 sfa_offsets", fn,
                      (long long)sfa_bytes);
  int64_t total;
  if (!tsct::checked_mul3(m_alloc > x_rows ? m_alloc : x_rows, k, 4, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sizes overflow int64", fn);
  const RowsGroupedArgs a = tsct::quant::make_rows_grouped_args(x, x_rows, k, gather_idx, offs, num_experts, m,
                                                                  col_scale, m_alloc, codes, sfa, sfa_bytes,
                                                                  sfa_offsets, s_enc, aligned(x, 16));
  if (num_experts > 0 && (!offs || !s_enc || !sfa_offsets))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (offs=%p, s_enc=%p, sfa_offsets=%p)", fn,
                      (const void*)offs, (void*)s_enc, (void*)sfa_offsets);
  if (m_alloc * a.kb > 0 && !codes)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: codes is null", fn);
  if (m * a.kb > 0 && (!x || (sfa_bytes > 0 && !sfa)))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (x=%p, sfa=%p)", fn, x, (void*)sfa);
  if (codes && !aligned(codes, 8))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: codes must be 8-byte aligned", fn);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (num_experts > 0) {
    if (cudaError_t e = cudaMemsetAsync(s_enc, 0, sizeof(float) * num_experts, st))
      return tsct::fail(static_cast<int>(e), "%s: cudaMemsetAsync(s_enc): %s", fn, cudaGetErrorString(e));
  }
  if (sfa_bytes > 0) {
    if (cudaError_t e = cudaMemsetAsync(sfa, 0, sfa_bytes, st))
      return tsct::fail(static_cast<int>(e), "%s: cudaMemsetAsync(sfa): %s", fn, cudaGetErrorString(e));
  }
  const int64_t amax_items = m * a.kb;
  if (amax_items > 0 && num_experts > 0) {
    if (int rc = tsct::quant::launch_items(fn, x_dtype, a, amax_items, stream, tsctk_nvfp4_rows_amax_f32,
                                           tsctk_nvfp4_rows_amax_bf16, tsctk_nvfp4_rows_amax_f16))
      return rc;
  }
  if (num_experts > 0) {
    tsctk_nvfp4_rows_finalize<<<1, 32, 0, st>>>(a);
    if (int rc = tsct::check_launch(fn)) return rc;
  }
  const int64_t items = m_alloc * a.kb;
  if (items == 0) return 0;
  return tsct::quant::launch_items(fn, x_dtype, a, items, stream, tsctk_nvfp4_rows_quantize_f32,
                                   tsctk_nvfp4_rows_quantize_bf16, tsctk_nvfp4_rows_quantize_f16);
}
