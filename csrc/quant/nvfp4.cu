// NVFP4 quantize / decode kernels and their C entry points (tsct.h; arithmetic: 0002-nvfp4-recipe.md).
#include <cuda_runtime.h>

#include "common/host.h"
#include "quant/quant_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::Nvfp4Args;

// One extern "C" kernel per dtype: its ELF symbol is its plain name (manifest, cuobjdump,
// tsct_kernel_available all agree); the body is one template.
#define TSCT_NVFP4_KERNEL(NAME, ITEM, T)                                                     \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads) NAME(Nvfp4Args a, int64_t items) { \
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;                \
         t += int64_t(gridDim.x) * blockDim.x)                                                 \
      tsct::quant::ITEM<T>(a, t);                                                              \
  }

TSCT_NVFP4_KERNEL(tsctk_nvfp4_quantize_f32, nvfp4_quantize_item, float)
TSCT_NVFP4_KERNEL(tsctk_nvfp4_quantize_bf16, nvfp4_quantize_item, __nv_bfloat16)
TSCT_NVFP4_KERNEL(tsctk_nvfp4_quantize_f16, nvfp4_quantize_item, __half)
TSCT_NVFP4_KERNEL(tsctk_nvfp4_dequantize_f32, nvfp4_dequantize_item, float)
TSCT_NVFP4_KERNEL(tsctk_nvfp4_dequantize_bf16, nvfp4_dequantize_item, __nv_bfloat16)
TSCT_NVFP4_KERNEL(tsctk_nvfp4_dequantize_f16, nvfp4_dequantize_item, __half)

namespace tsct {
const KernelEntry kNvfp4Kernels[] = {
    {"tsctk_nvfp4_quantize_f32", (const void*)tsctk_nvfp4_quantize_f32},
    {"tsctk_nvfp4_quantize_bf16", (const void*)tsctk_nvfp4_quantize_bf16},
    {"tsctk_nvfp4_quantize_f16", (const void*)tsctk_nvfp4_quantize_f16},
    {"tsctk_nvfp4_dequantize_f32", (const void*)tsctk_nvfp4_dequantize_f32},
    {"tsctk_nvfp4_dequantize_bf16", (const void*)tsctk_nvfp4_dequantize_bf16},
    {"tsctk_nvfp4_dequantize_f16", (const void*)tsctk_nvfp4_dequantize_f16},
    {nullptr, nullptr},
};
}  // namespace tsct

namespace {

using Kernel = void (*)(Nvfp4Args, int64_t);

bool aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

// Shared checks of both entry points; fills the size fields of `a`.
int check_nvfp4(const char* fn, int64_t batch, int64_t n, int64_t k, int layout, int dtype,
                const char* dtype_arg, Nvfp4Args* a) {
  if (batch < 0 || n < 0 || k < 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: negative size (batch=%lld, n=%lld, k=%lld)", fn,
                      (long long)batch, (long long)n, (long long)k);
  if (k % tsct::fmt::kNvfp4Block != 0)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: k=%lld is not a multiple of 16", fn, (long long)k);
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: %s=%d is not a tsct_dtype (0 f32, 1 bf16, 2 f16)", fn,
                      dtype_arg, dtype);
  if (layout != TSCT_LAYOUT_LINEAR && layout != TSCT_LAYOUT_SWIZZLED_128X4)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: layout=%d is not a tsct_scale_layout (0 linear, 1 swizzled_128x4)",
                      fn, layout);
  int64_t total;
  a->np = tsct::fmt::round_up(n, 128);
  if (!tsct::checked_mul3(batch, a->np, k, &total))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: batch*n*k overflows int64", fn);
  a->batch = batch;
  a->n = n;
  a->k = k;
  a->kb = k / tsct::fmt::kNvfp4Block;
  a->kbp = tsct::fmt::round_up(a->kb, 4);
  a->swizzled = layout == TSCT_LAYOUT_SWIZZLED_128X4;
  return 0;
}

Kernel pick(int dtype, Kernel f32, Kernel bf16, Kernel f16) {
  return dtype == TSCT_F32 ? f32 : dtype == TSCT_BF16 ? bf16 : f16;
}

}  // namespace

extern "C" int tsct_nvfp4_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k,
                                   const float* s_enc, uint8_t* codes, uint8_t* block_scale, int layout,
                                   void* stream) {
  static const char* fn = "tsct_nvfp4_quantize";
  tsct::clear_error_detail();
  Nvfp4Args a = {};
  if (int rc = check_nvfp4(fn, batch, n, k, layout, x_dtype, "x_dtype", &a)) return rc;
  a.rows_dom = a.swizzled ? a.np : n;
  a.kb_dom = a.swizzled ? a.kbp : a.kb;
  const int64_t items = batch * a.rows_dom * a.kb_dom;
  if (items == 0) return 0;
  if (!s_enc || !block_scale || ((!x || !codes) && batch * n * k > 0))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (x=%p, s_enc=%p, codes=%p, block_scale=%p)", fn, x,
                      (const void*)s_enc, (void*)codes, (void*)block_scale);
  a.x = x;
  a.codes = codes;
  a.block_scale = block_scale;
  a.s_enc = s_enc;
  a.vec = aligned(x, 16) && aligned(codes, 8);
  const Kernel kern = pick(x_dtype, tsctk_nvfp4_quantize_f32, tsctk_nvfp4_quantize_bf16, tsctk_nvfp4_quantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, items);
  return tsct::check_launch(fn);
}

extern "C" int tsct_nvfp4_dequantize(const uint8_t* codes, const uint8_t* block_scale, int layout,
                                     const float* s_enc, int64_t batch, int64_t n, int64_t k, void* out,
                                     int out_dtype, void* stream) {
  static const char* fn = "tsct_nvfp4_dequantize";
  tsct::clear_error_detail();
  Nvfp4Args a = {};
  if (int rc = check_nvfp4(fn, batch, n, k, layout, out_dtype, "out_dtype", &a)) return rc;
  const int64_t items = batch * n * a.kb;
  if (items == 0) return 0;
  if (!codes || !block_scale || !s_enc || !out)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (codes=%p, block_scale=%p, s_enc=%p, out=%p)", fn,
                      (const void*)codes, (const void*)block_scale, (const void*)s_enc, out);
  a.codes = const_cast<uint8_t*>(codes);
  a.block_scale = const_cast<uint8_t*>(block_scale);
  a.s_enc = s_enc;
  a.out = out;
  a.vec = aligned(out, 16) && aligned(codes, 8);
  const Kernel kern =
      pick(out_dtype, tsctk_nvfp4_dequantize_f32, tsctk_nvfp4_dequantize_bf16, tsctk_nvfp4_dequantize_f16);
  kern<<<tsct::grid_blocks(items), tsct::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, items);
  return tsct::check_launch(fn);
}
