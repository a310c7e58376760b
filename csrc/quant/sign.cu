// Sign (1-bit) pack / decode kernels and their C entry points (tsct.h; format: 0002-nvfp4-recipe.md).
#include <cuda_runtime.h>

#include "common/host.h"
#include "quant/quant_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::SignArgs;

#define TSCT_SIGN_KERNEL(NAME, ITEM, T)                                                      \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads) NAME(SignArgs s, int64_t items) { \
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;               \
         t += int64_t(gridDim.x) * blockDim.x)                                                \
      tsct::quant::ITEM<T>(s, t);                                                             \
  }

TSCT_SIGN_KERNEL(tsctk_sign_pack_f32, sign_pack_item, float)
TSCT_SIGN_KERNEL(tsctk_sign_pack_bf16, sign_pack_item, __nv_bfloat16)
TSCT_SIGN_KERNEL(tsctk_sign_pack_f16, sign_pack_item, __half)
TSCT_SIGN_KERNEL(tsctk_sign_dequantize_f32, sign_dequantize_item, float)
TSCT_SIGN_KERNEL(tsctk_sign_dequantize_bf16, sign_dequantize_item, __nv_bfloat16)
TSCT_SIGN_KERNEL(tsctk_sign_dequantize_f16, sign_dequantize_item, __half)

namespace tsct {
const KernelEntry kSignKernels[] = {
    {"tsctk_sign_pack_f32", (const void*)tsctk_sign_pack_f32},
    {"tsctk_sign_pack_bf16", (const void*)tsctk_sign_pack_bf16},
    {"tsctk_sign_pack_f16", (const void*)tsctk_sign_pack_f16},
    {"tsctk_sign_dequantize_f32", (const void*)tsctk_sign_dequantize_f32},
    {"tsctk_sign_dequantize_bf16", (const void*)tsctk_sign_dequantize_bf16},
    {"tsctk_sign_dequantize_f16", (const void*)tsctk_sign_dequantize_f16},
    {nullptr, nullptr},
};
}  // namespace tsct

namespace {

using Kernel = void (*)(SignArgs, int64_t);

bool aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

int check_sign(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg,
               SignArgs* s) {
  if (batch < 0 || n < 0 || k < 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: negative size (batch=%lld, n=%lld, k=%lld)", fn,
                      (long long)batch, (long long)n, (long long)k);
  if (k % tsct::fmt::kSignPack != 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: k=%lld is not a multiple of 8", fn, (long long)k);
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: %s=%d is not a tsct_dtype (0 f32, 1 bf16, 2 f16)", fn,
                      dtype_arg, dtype);
  int64_t total;
  if (!tsct::checked_mul3(batch, n, k, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: batch*n*k overflows int64", fn);
  s->batch = batch;
  s->n = n;
  s->k = k;
  s->kbytes = k / tsct::fmt::kSignPack;
  return 0;
}

Kernel pick(int dtype, Kernel f32, Kernel bf16, Kernel f16) {
  return dtype == TSCT_F32 ? f32 : dtype == TSCT_BF16 ? bf16 : f16;
}

}  // namespace

extern "C" int tsct_sign_pack(const void* w, int w_dtype, int64_t batch, int64_t n, int64_t k, uint8_t* bits,
                              void* stream) {
  static const char* fn = "tsct_sign_pack";
  tsct::clear_error_detail();
  SignArgs s = {};
  if (int rc = check_sign(fn, batch, n, k, w_dtype, "w_dtype", &s)) return rc;
  const int64_t items = batch * n * s.kbytes;
  if (items == 0) return 0;
  if (!w || !bits)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (w=%p, bits=%p)", fn, w, (void*)bits);
  s.w = w;
  s.bits = bits;
  s.vec = aligned(w, 16);
  const Kernel kern = pick(w_dtype, tsctk_sign_pack_f32, tsctk_sign_pack_bf16, tsctk_sign_pack_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, items);
  return tsct::check_launch(fn);
}

extern "C" int tsct_sign_dequantize(const uint8_t* bits, const float* a, const float* scale_n, int64_t batch,
                                    int64_t n, int64_t k, void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_sign_dequantize";
  tsct::clear_error_detail();
  SignArgs s = {};
  if (int rc = check_sign(fn, batch, n, k, out_dtype, "out_dtype", &s)) return rc;
  const int64_t items = batch * n * s.kbytes;
  if (items == 0) return 0;
  if (!bits || !a || !scale_n || !out)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (bits=%p, a=%p, scale_n=%p, out=%p)", fn,
                      (const void*)bits, (const void*)a, (const void*)scale_n, out);
  s.bits = const_cast<uint8_t*>(bits);
  s.a = a;
  s.scale_n = scale_n;
  s.out = out;
  s.vec = aligned(out, 16) && aligned(a, 16);
  const Kernel kern =
      pick(out_dtype, tsctk_sign_dequantize_f32, tsctk_sign_dequantize_bf16, tsctk_sign_dequantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, items);
  return tsct::check_launch(fn);
}
