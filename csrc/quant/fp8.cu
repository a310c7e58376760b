// FP8 (E4M3 codes, one fp32 decode scale per column) quantize / decode kernels and their C entry points
// (tsct.h; format: docs/decisions/0021-fp8-format.md). The scales come from the caller (torch: a max and one
// division per column); the kernels encode and decode, bit-exact with python/tsct/quant/fp8.py.
#include "quant/entry.cuh"
#include "quant/quant_impl.cuh"

using tsct::quant::Fp8Args;

// tsctk_fp8_quantize_{f32,bf16,f16}, tsctk_fp8_dequantize_{f32,bf16,f16}
TSCT_ITEM_KERNELS(fp8_quantize, Fp8Args, fp8_quantize_item)
TSCT_ITEM_KERNELS(fp8_dequantize, Fp8Args, fp8_dequantize_item)

namespace tsct {
const KernelEntry kFp8Kernels[] = {TSCT_KERNEL_ENTRIES(fp8_quantize), TSCT_KERNEL_ENTRIES(fp8_dequantize),
                                   {nullptr, nullptr}};
}  // namespace tsct

namespace {

using tsct::quant::aligned;
using tsct::quant::kFp8Chunk;

// The checks of both entry points (any k) after clearing the error detail; fills the size fields of `a` and the
// item count (16-element chunks of the rows).
int check_fp8(const char* fn, int64_t batch, int64_t n, int64_t k, int dtype, const char* dtype_arg, Fp8Args* a,
              int64_t* items) {
  tsct::clear_error_detail();
  if (int rc = tsct::quant::check_factor(fn, batch, n, k, 1, dtype, dtype_arg, a)) return rc;
  a->kc = k / kFp8Chunk + (k % kFp8Chunk != 0);
  *items = batch * n * a->kc;
  return 0;
}

}  // namespace

extern "C" int tsct_fp8_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_n,
                                 uint8_t* codes, void* stream) {
  static const char* fn = "tsct_fp8_quantize";
  Fp8Args a = {};
  int64_t items = 0;
  if (int rc = check_fp8(fn, batch, n, k, x_dtype, "x_dtype", &a, &items); rc != 0 || items == 0) return rc;
  if (int rc = tsct::quant::check_not_null(fn, {{"x", x}, {"scale_n", scale_n}, {"codes", codes}})) return rc;
  a.x = x;
  a.scale_n = scale_n;
  a.codes = codes;
  a.vec = k % kFp8Chunk == 0 && aligned(x, 16) && aligned(codes, 16);
  return tsct::quant::launch_items(fn, x_dtype, a, items, stream, tsctk_fp8_quantize_f32, tsctk_fp8_quantize_bf16,
                                   tsctk_fp8_quantize_f16);
}

extern "C" int tsct_fp8_dequantize(const uint8_t* codes, const float* scale_n, int64_t batch, int64_t n, int64_t k,
                                   void* out, int out_dtype, void* stream) {
  static const char* fn = "tsct_fp8_dequantize";
  Fp8Args a = {};
  int64_t items = 0;
  if (int rc = check_fp8(fn, batch, n, k, out_dtype, "out_dtype", &a, &items); rc != 0 || items == 0) return rc;
  if (int rc = tsct::quant::check_not_null(fn, {{"codes", codes}, {"scale_n", scale_n}, {"out", out}})) return rc;
  a.codes = const_cast<uint8_t*>(codes);
  a.scale_n = scale_n;
  a.out = out;
  a.vec = k % kFp8Chunk == 0 && aligned(codes, 16) && aligned(out, 16);
  return tsct::quant::launch_items(fn, out_dtype, a, items, stream, tsctk_fp8_dequantize_f32,
                                   tsctk_fp8_dequantize_bf16, tsctk_fp8_dequantize_f16);
}
