// Ternary (2-bit codes, 4 per byte along K) pack / decode kernels and their C entry points (tsct.h; format:
// docs/decisions/0022-ternary-format.md). The scales come from the caller (torch: the absmean, or the rank-1
// fit of the sign format); the kernels encode, pack and decode, bit-exact with python/tsct/quant/ternary.py.
#include <cuda_runtime.h>

#include "common/host.h"
#include "quant/quant_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::TernaryArgs;

#define TSCT_TERNARY_KERNEL(NAME, ITEM, T)                                                       \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads) NAME(TernaryArgs s, int64_t items) { \
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;                  \
         t += int64_t(gridDim.x) * blockDim.x)                                                   \
      tsct::quant::ITEM<T>(s, t);                                                                \
  }

TSCT_TERNARY_KERNEL(tsctk_ternary_pack_f32, ternary_pack_item, float)
TSCT_TERNARY_KERNEL(tsctk_ternary_pack_bf16, ternary_pack_item, __nv_bfloat16)
TSCT_TERNARY_KERNEL(tsctk_ternary_pack_f16, ternary_pack_item, __half)
TSCT_TERNARY_KERNEL(tsctk_ternary_dequantize_f32, ternary_dequantize_item, float)
TSCT_TERNARY_KERNEL(tsctk_ternary_dequantize_bf16, ternary_dequantize_item, __nv_bfloat16)
TSCT_TERNARY_KERNEL(tsctk_ternary_dequantize_f16, ternary_dequantize_item, __half)

namespace tsct {
const KernelEntry kTernaryKernels[] = {
    {"tsctk_ternary_pack_f32", (const void*)tsctk_ternary_pack_f32},
    {"tsctk_ternary_pack_bf16", (const void*)tsctk_ternary_pack_bf16},
    {"tsctk_ternary_pack_f16", (const void*)tsctk_ternary_pack_f16},
    {"tsctk_ternary_dequantize_f32", (const void*)tsctk_ternary_dequantize_f32},
    {"tsctk_ternary_dequantize_bf16", (const void*)tsctk_ternary_dequantize_bf16},
    {"tsctk_ternary_dequantize_f16", (const void*)tsctk_ternary_dequantize_f16},
    {nullptr, nullptr},
};
}  // namespace tsct

namespace {

using Kernel = void (*)(TernaryArgs, int64_t);

int check_ternary(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg,
                  TernaryArgs* s) {
  if (batch < 0 || n < 0 || k < 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: negative size (batch=%lld, n=%lld, k=%lld)", fn,
                      (long long)batch, (long long)n, (long long)k);
  if (k % tsct::fmt::kTernaryPack != 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: k=%lld is not a multiple of 4", fn, (long long)k);
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: %s=%d is not a tsct_dtype (0 f32, 1 bf16, 2 f16)", fn,
                      dtype_arg, dtype);
  int64_t total;
  if (!tsct::checked_mul3(batch, n, k, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: batch*n*k overflows int64", fn);
  s->batch = batch;
  s->n = n;
  s->k = k;
  s->kbytes = k / tsct::fmt::kTernaryPack;
  return 0;
}

Kernel pick(int dtype, Kernel f32, Kernel bf16, Kernel f16) {
  return dtype == TSCT_F32 ? f32 : dtype == TSCT_BF16 ? bf16 : f16;
}

}  // namespace

extern "C" int tsct_ternary_pack(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_k,
                                 const float* scale_n, uint8_t* codes, void* stream) {
  static const char* fn = "tsct_ternary_pack";
  tsct::clear_error_detail();
  TernaryArgs s = {};
  if (int rc = check_ternary(fn, batch, n, k, x_dtype, "x_dtype", &s)) return rc;
  const int64_t items = batch * n * s.kbytes;
  if (items == 0) return 0;
  if (!x || !scale_n || !codes)  // scale_k may be null: the absmean scaling
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (x=%p, scale_n=%p, codes=%p)", fn, x,
                      (const void*)scale_n, (void*)codes);
  s.x = x;
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.codes = codes;
  const Kernel kern = pick(x_dtype, tsctk_ternary_pack_f32, tsctk_ternary_pack_bf16, tsctk_ternary_pack_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, items);
  return tsct::check_launch(fn);
}

extern "C" int tsct_ternary_dequantize(const uint8_t* codes, const float* scale_k, const float* scale_n, int64_t batch,
                                       int64_t n, int64_t k, void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_ternary_dequantize";
  tsct::clear_error_detail();
  TernaryArgs s = {};
  if (int rc = check_ternary(fn, batch, n, k, out_dtype, "out_dtype", &s)) return rc;
  const int64_t items = batch * n * s.kbytes;
  if (items == 0) return 0;
  if (!codes || !scale_n || !out)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (codes=%p, scale_n=%p, out=%p)", fn,
                      (const void*)codes, (const void*)scale_n, out);
  s.codes = const_cast<uint8_t*>(codes);
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.out = out;
  const Kernel kern =
      pick(out_dtype, tsctk_ternary_dequantize_f32, tsctk_ternary_dequantize_bf16, tsctk_ternary_dequantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, items);
  return tsct::check_launch(fn);
}
