// Sign (1-bit) pack / decode kernels and their C entry points (tsct.h; format: 0002-nvfp4-recipe.md).
#include "quant/entry.cuh"
#include "quant/quant_impl.cuh"

using tsct::quant::SignArgs;

// tsctk_sign_pack_{f32,bf16,f16}, tsctk_sign_dequantize_{f32,bf16,f16}
TSCT_ITEM_KERNELS(sign_pack, SignArgs, sign_pack_item)
TSCT_ITEM_KERNELS(sign_dequantize, SignArgs, sign_dequantize_item)

namespace tsct {
const KernelEntry kSignKernels[] = {TSCT_KERNEL_ENTRIES(sign_pack), TSCT_KERNEL_ENTRIES(sign_dequantize),
                                   {nullptr, nullptr}};
}  // namespace tsct

namespace {

using tsct::quant::aligned;

// The checks of both entry points (k a multiple of 8) after clearing the error detail; fills the size fields of `s`
// and the item count (sign bytes).
int check_sign(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg, SignArgs* s,
               int64_t* items) {
  tsct::clear_error_detail();
  if (int rc = tsct::quant::check_factor(fn, batch, n, k, tsct::fmt::kSignPack, dtype, dtype_arg, s)) return rc;
  s->kbytes = k / tsct::fmt::kSignPack;
  *items = batch * n * s->kbytes;
  return 0;
}

}  // namespace

extern "C" int tsct_sign_pack(const void* w, int w_dtype, int64_t batch, int64_t n, int64_t k, uint8_t* bits,
                              void* stream) {
  static const char* fn = "tsct_sign_pack";
  SignArgs s = {};
  int64_t items = 0;
  if (int rc = check_sign(fn, batch, n, k, w_dtype, "w_dtype", &s, &items); rc != 0 || items == 0) return rc;
  if (int rc = tsct::quant::check_not_null(fn, {{"w", w}, {"bits", bits}})) return rc;
  s.w = w;
  s.bits = bits;
  s.vec = aligned(w, 16);
  return tsct::quant::launch_items(fn, w_dtype, s, items, stream, tsctk_sign_pack_f32, tsctk_sign_pack_bf16,
                                   tsctk_sign_pack_f16);
}

extern "C" int tsct_sign_dequantize(const uint8_t* bits, const float* a, const float* scale_n, int64_t batch,
                                    int64_t n, int64_t k, void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_sign_dequantize";
  SignArgs s = {};
  int64_t items = 0;
  if (int rc = check_sign(fn, batch, n, k, out_dtype, "out_dtype", &s, &items); rc != 0 || items == 0) return rc;
  if (int rc = tsct::quant::check_not_null(fn, {{"bits", bits}, {"a", a}, {"scale_n", scale_n}, {"out", out}}))
    return rc;
  s.bits = const_cast<uint8_t*>(bits);
  s.a = a;
  s.scale_n = scale_n;
  s.out = out;
  s.vec = aligned(out, 16) && aligned(a, 16);
  return tsct::quant::launch_items(fn, out_dtype, s, items, stream, tsctk_sign_dequantize_f32,
                                   tsctk_sign_dequantize_bf16, tsctk_sign_dequantize_f16);
}
