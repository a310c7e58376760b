// Host build of the grouped activation quantizer's per-item code (quant/rows_grouped_impl.cuh) for
// the CPU tests: the same steps as tsct_nvfp4_quantize_rows_grouped (memset, amax, finalize,
// quantize) in plain loops, host pointers, no stream. Not part of the library. Compiled by
// tests/_native_cases.py build_host_rows_grouped (same flags as host_reference.cpp).
#include <string.h>

#include "quant/rows_grouped_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::RowsGroupedArgs;

template <typename T>
static void run(RowsGroupedArgs& a) {
  for (int64_t e = 0; e < a.num_experts; ++e) a.s_enc[e] = 0.0f;
  if (a.sfa_bytes > 0) memset(a.sfa, 0, a.sfa_bytes);
  for (int64_t t = 0; t < a.m * a.kb; ++t) {
    int64_t e;
    const uint32_t bits = tsct::quant::rows_amax_item<T>(a, t, &e);
    uint32_t cur;
    memcpy(&cur, &a.s_enc[e < 0 ? 0 : e], 4);
    if (e >= 0 && bits > cur) memcpy(&a.s_enc[e], &bits, 4);
  }
  if (a.num_experts > 0) tsct::quant::rows_finalize(a);
  for (int64_t t = 0; t < a.m_alloc * a.kb; ++t) tsct::quant::rows_quantize_item<T>(a, t);
}

extern "C" int tsct_host_nvfp4_quantize_rows_grouped(const void* x, int x_dtype, int64_t x_rows, int64_t k,
                                                     const int64_t* gather_idx, const int32_t* offs,
                                                     int64_t num_experts, int64_t m, const float* col_scale,
                                                     int64_t m_alloc, uint8_t* codes, uint8_t* sfa, int64_t sfa_bytes,
                                                     int32_t* sfa_offsets, float* s_enc) {
  RowsGroupedArgs a = tsct::quant::make_rows_grouped_args(x, x_rows, k, gather_idx, offs, num_experts, m, col_scale,
                                                            m_alloc, codes, sfa, sfa_bytes, sfa_offsets, s_enc, false);
  if (x_dtype == TSCT_F32) run<float>(a);
  else if (x_dtype == TSCT_BF16) run<__nv_bfloat16>(a);
  else run<__half>(a);
  return 0;
}
