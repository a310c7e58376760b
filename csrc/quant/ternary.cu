// Ternary (2-bit codes, 4 per byte along K) pack / decode kernels and their C entry points (tsct.h; format:
// docs/decisions/0022-ternary-format.md). The scales come from the caller (torch: the absmean, or the rank-1
// fit of the sign format); the kernels encode, pack and decode, bit-exact with python/tsct/quant/ternary.py.
#include "quant/entry.cuh"
#include "quant/quant_impl.cuh"

using tsct::quant::TernaryArgs;

// tsctk_ternary_pack_{f32,bf16,f16}, tsctk_ternary_dequantize_{f32,bf16,f16}
TSCT_ITEM_KERNELS(ternary_pack, TernaryArgs, ternary_pack_item)
TSCT_ITEM_KERNELS(ternary_dequantize, TernaryArgs, ternary_dequantize_item)

namespace tsct {
const KernelEntry kTernaryKernels[] = {TSCT_KERNEL_ENTRIES(ternary_pack), TSCT_KERNEL_ENTRIES(ternary_dequantize),
                                       {nullptr, nullptr}};
}  // namespace tsct

namespace {

// The checks of both entry points (k a multiple of 4) after clearing the error detail; fills the size fields of `s`
// and the item count (code bytes).
int check_ternary(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg,
                  TernaryArgs* s, int64_t* items) {
  tsct::clear_error_detail();
  if (int rc = tsct::quant::check_factor(fn, batch, n, k, tsct::fmt::kTernaryPack, dtype, dtype_arg, s)) return rc;
  s->kbytes = k / tsct::fmt::kTernaryPack;
  *items = batch * n * s->kbytes;
  return 0;
}

}  // namespace

extern "C" int tsct_ternary_pack(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_k,
                                 const float* scale_n, uint8_t* codes, void* stream) {
  static const char* fn = "tsct_ternary_pack";
  TernaryArgs s = {};
  int64_t items = 0;
  if (int rc = check_ternary(fn, batch, n, k, x_dtype, "x_dtype", &s, &items); rc != 0 || items == 0) return rc;
  // scale_k may be null: the absmean scaling
  if (int rc = tsct::quant::check_not_null(fn, {{"x", x}, {"scale_n", scale_n}, {"codes", codes}})) return rc;
  s.x = x;
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.codes = codes;
  return tsct::quant::launch_items(fn, x_dtype, s, items, stream, tsctk_ternary_pack_f32, tsctk_ternary_pack_bf16,
                                   tsctk_ternary_pack_f16);
}

extern "C" int tsct_ternary_dequantize(const uint8_t* codes, const float* scale_k, const float* scale_n, int64_t batch,
                                       int64_t n, int64_t k, void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_ternary_dequantize";
  TernaryArgs s = {};
  int64_t items = 0;
  if (int rc = check_ternary(fn, batch, n, k, out_dtype, "out_dtype", &s, &items); rc != 0 || items == 0) return rc;
  if (int rc = tsct::quant::check_not_null(fn, {{"codes", codes}, {"scale_n", scale_n}, {"out", out}})) return rc;
  s.codes = const_cast<uint8_t*>(codes);
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.out = out;
  return tsct::quant::launch_items(fn, out_dtype, s, items, stream, tsctk_ternary_dequantize_f32,
                                   tsctk_ternary_dequantize_bf16, tsctk_ternary_dequantize_f16);
}
