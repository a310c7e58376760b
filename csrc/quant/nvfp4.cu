// NVFP4 quantize / decode kernels and their C entry points (tsct.h; arithmetic: 0002-nvfp4-recipe.md).
#include "quant/entry.cuh"
#include "quant/quant_impl.cuh"

using tsct::quant::Nvfp4Args;

// tsctk_nvfp4_quantize_{f32,bf16,f16}, tsctk_nvfp4_dequantize_{f32,bf16,f16}
TSCT_ITEM_KERNELS(nvfp4_quantize, Nvfp4Args, nvfp4_quantize_item)
TSCT_ITEM_KERNELS(nvfp4_dequantize, Nvfp4Args, nvfp4_dequantize_item)

namespace tsct {
const KernelEntry kNvfp4Kernels[] = {TSCT_KERNEL_ENTRIES(nvfp4_quantize), TSCT_KERNEL_ENTRIES(nvfp4_dequantize),
                                     {nullptr, nullptr}};
}  // namespace tsct

namespace {

using tsct::quant::aligned;

// Shared checks of both entry points after clearing the error detail; fills the size fields of `a`.
int check_nvfp4(const char* fn, int64_t batch, int64_t n, int64_t k, int layout, int dtype,
                const char* dtype_arg, Nvfp4Args* a) {
  tsct::clear_error_detail();
  if (int rc = tsct::quant::check_factor_shape(fn, batch, n, k, tsct::fmt::kNvfp4Block, dtype, dtype_arg)) return rc;
  if (layout != TSCT_LAYOUT_LINEAR && layout != TSCT_LAYOUT_SWIZZLED_128X4)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: layout=%d is not a tsct_scale_layout (0 linear, 1 swizzled_128x4)",
                      fn, layout);
  a->np = tsct::fmt::round_up(n, 128);
  if (int rc = tsct::quant::check_total(fn, batch, a->np, k)) return rc;
  a->batch = batch;
  a->n = n;
  a->k = k;
  a->kb = k / tsct::fmt::kNvfp4Block;
  a->kbp = tsct::fmt::round_up(a->kb, 4);
  a->swizzled = layout == TSCT_LAYOUT_SWIZZLED_128X4;
  return 0;
}

}  // namespace

extern "C" int tsct_nvfp4_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k,
                                   const float* s_enc, uint8_t* codes, uint8_t* block_scale, int layout,
                                   void* stream) {
  static const char* fn = "tsct_nvfp4_quantize";
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
  return tsct::quant::launch_items(fn, x_dtype, a, items, stream, tsctk_nvfp4_quantize_f32, tsctk_nvfp4_quantize_bf16,
                                   tsctk_nvfp4_quantize_f16);
}

extern "C" int tsct_nvfp4_dequantize(const uint8_t* codes, const uint8_t* block_scale, int layout,
                                     const float* s_enc, int64_t batch, int64_t n, int64_t k, void* out,
                                     int out_dtype, void* stream) {
  static const char* fn = "tsct_nvfp4_dequantize";
  Nvfp4Args a = {};
  if (int rc = check_nvfp4(fn, batch, n, k, layout, out_dtype, "out_dtype", &a)) return rc;
  const int64_t items = batch * n * a.kb;
  if (items == 0) return 0;
  if (int rc = tsct::quant::check_not_null(
          fn, {{"codes", codes}, {"block_scale", block_scale}, {"s_enc", s_enc}, {"out", out}}))
    return rc;
  a.codes = const_cast<uint8_t*>(codes);
  a.block_scale = const_cast<uint8_t*>(block_scale);
  a.s_enc = s_enc;
  a.out = out;
  a.vec = aligned(out, 16) && aligned(codes, 8);
  return tsct::quant::launch_items(fn, out_dtype, a, items, stream, tsctk_nvfp4_dequantize_f32,
                                   tsctk_nvfp4_dequantize_bf16, tsctk_nvfp4_dequantize_f16);
}
