// FP8 (E4M3 codes, one fp32 decode scale per column) quantize / decode kernels and their C entry points
// (tsct.h; format: docs/decisions/0021-fp8-format.md). The scales come from the caller (torch: a max and one
// division per column); the kernels encode and decode, bit-exact with python/tsct/quant/fp8.py.
#include <cuda_runtime.h>

#include "common/host.h"
#include "quant/quant_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::Fp8Args;

#define TSCT_FP8_KERNEL(NAME, ITEM, T)                                                       \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads) NAME(Fp8Args a, int64_t items) { \
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;              \
         t += int64_t(gridDim.x) * blockDim.x)                                               \
      tsct::quant::ITEM<T>(a, t);                                                            \
  }

TSCT_FP8_KERNEL(tsctk_fp8_quantize_f32, fp8_quantize_item, float)
TSCT_FP8_KERNEL(tsctk_fp8_quantize_bf16, fp8_quantize_item, __nv_bfloat16)
TSCT_FP8_KERNEL(tsctk_fp8_quantize_f16, fp8_quantize_item, __half)
TSCT_FP8_KERNEL(tsctk_fp8_dequantize_f32, fp8_dequantize_item, float)
TSCT_FP8_KERNEL(tsctk_fp8_dequantize_bf16, fp8_dequantize_item, __nv_bfloat16)
TSCT_FP8_KERNEL(tsctk_fp8_dequantize_f16, fp8_dequantize_item, __half)

namespace tsct {
const KernelEntry kFp8Kernels[] = {
    {"tsctk_fp8_quantize_f32", (const void*)tsctk_fp8_quantize_f32},
    {"tsctk_fp8_quantize_bf16", (const void*)tsctk_fp8_quantize_bf16},
    {"tsctk_fp8_quantize_f16", (const void*)tsctk_fp8_quantize_f16},
    {"tsctk_fp8_dequantize_f32", (const void*)tsctk_fp8_dequantize_f32},
    {"tsctk_fp8_dequantize_bf16", (const void*)tsctk_fp8_dequantize_bf16},
    {"tsctk_fp8_dequantize_f16", (const void*)tsctk_fp8_dequantize_f16},
    {nullptr, nullptr},
};
}  // namespace tsct

namespace {

using Kernel = void (*)(Fp8Args, int64_t);

bool aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

int check_fp8(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg, Fp8Args* a) {
  if (batch < 0 || n < 0 || k < 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: negative size (batch=%lld, n=%lld, k=%lld)", fn,
                      (long long)batch, (long long)n, (long long)k);
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: %s=%d is not a tsct_dtype (0 f32, 1 bf16, 2 f16)", fn,
                      dtype_arg, dtype);
  int64_t total;
  if (!tsct::checked_mul3(batch, n, k, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: batch*n*k overflows int64", fn);
  a->batch = batch;
  a->n = n;
  a->k = k;
  a->kc = k / tsct::quant::kFp8Chunk + (k % tsct::quant::kFp8Chunk != 0);
  return 0;
}

Kernel pick(int dtype, Kernel f32, Kernel bf16, Kernel f16) {
  return dtype == TSCT_F32 ? f32 : dtype == TSCT_BF16 ? bf16 : f16;
}

}  // namespace

extern "C" int tsct_fp8_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_n,
                                 uint8_t* codes, void* stream) {
  static const char* fn = "tsct_fp8_quantize";
  tsct::clear_error_detail();
  Fp8Args a = {};
  if (int rc = check_fp8(fn, batch, n, k, x_dtype, "x_dtype", &a)) return rc;
  const int64_t items = batch * n * a.kc;
  if (items == 0) return 0;
  if (!x || !scale_n || !codes)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (x=%p, scale_n=%p, codes=%p)", fn, x,
                      (const void*)scale_n, (void*)codes);
  a.x = x;
  a.scale_n = scale_n;
  a.codes = codes;
  a.vec = k % tsct::quant::kFp8Chunk == 0 && aligned(x, 16) && aligned(codes, 16);
  const Kernel kern = pick(x_dtype, tsctk_fp8_quantize_f32, tsctk_fp8_quantize_bf16, tsctk_fp8_quantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, items);
  return tsct::check_launch(fn);
}

extern "C" int tsct_fp8_dequantize(const uint8_t* codes, const float* scale_n, int64_t batch, int64_t n, int64_t k,
                                   void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_fp8_dequantize";
  tsct::clear_error_detail();
  Fp8Args a = {};
  if (int rc = check_fp8(fn, batch, n, k, out_dtype, "out_dtype", &a)) return rc;
  const int64_t items = batch * n * a.kc;
  if (items == 0) return 0;
  if (!codes || !scale_n || !out)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (codes=%p, scale_n=%p, out=%p)", fn,
                      (const void*)codes, (const void*)scale_n, out);
  a.codes = const_cast<uint8_t*>(codes);
  a.scale_n = scale_n;
  a.out = out;
  a.vec = k % tsct::quant::kFp8Chunk == 0 && aligned(codes, 16) && aligned(out, 16);
  const Kernel kern =
      pick(out_dtype, tsctk_fp8_dequantize_f32, tsctk_fp8_dequantize_bf16, tsctk_fp8_dequantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, items);
  return tsct::check_launch(fn);
}
