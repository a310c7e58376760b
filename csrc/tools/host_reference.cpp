// Host build of the kernels' per-item code (quant/quant_impl.cuh), for tests on machines without a
// GPU: the same indexing, layouts and fp32 arithmetic as the CUDA kernels, run in a plain loop.
// Not part of the library. The CPU tests compile it with the host C++ compiler:
//   c++ -O2 -std=c++17 -shared -fPIC -Icsrc -Icsrc/include -I$CUDA_HOME/include
//       csrc/tools/host_reference.cpp -o host_reference.so
// Entry points mirror tsct.h with host pointers and no stream; arguments are assumed valid.
#include <stdint.h>

#include "quant/quant_impl.cuh"
#include "tsct/tsct.h"

using tsct::quant::Fp8Args;
using tsct::quant::Nvfp4Args;
using tsct::quant::SignArgs;
using tsct::quant::TernaryArgs;

namespace {

template <typename F>
void for_dtype(int dtype, F&& f) {
  if (dtype == TSCT_F32) f(float{});
  else if (dtype == TSCT_BF16) f(__nv_bfloat16{});
  else f(__half{});
}

Nvfp4Args nvfp4_args(int64_t batch, int64_t n, int64_t k, int layout) {
  Nvfp4Args a = {};
  a.batch = batch;
  a.n = n;
  a.k = k;
  a.kb = k / 16;
  a.np = tsct::fmt::round_up(n, 128);
  a.kbp = tsct::fmt::round_up(a.kb, 4);
  a.swizzled = layout == TSCT_LAYOUT_SWIZZLED_128X4;
  return a;
}

}  // namespace

extern "C" {

int tsct_host_nvfp4_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* s_enc,
                             uint8_t* codes, uint8_t* block_scale, int layout) {
  Nvfp4Args a = nvfp4_args(batch, n, k, layout);
  a.rows_dom = a.swizzled ? a.np : n;
  a.kb_dom = a.swizzled ? a.kbp : a.kb;
  a.x = x;
  a.codes = codes;
  a.block_scale = block_scale;
  a.s_enc = s_enc;
  const int64_t items = batch * a.rows_dom * a.kb_dom;
  for_dtype(x_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::nvfp4_quantize_item<decltype(tag)>(a, t);
  });
  return 0;
}

int tsct_host_nvfp4_dequantize(const uint8_t* codes, const uint8_t* block_scale, int layout, const float* s_enc,
                               int64_t batch, int64_t n, int64_t k, void* out, int out_dtype) {
  Nvfp4Args a = nvfp4_args(batch, n, k, layout);
  a.codes = const_cast<uint8_t*>(codes);
  a.block_scale = const_cast<uint8_t*>(block_scale);
  a.s_enc = s_enc;
  a.out = out;
  const int64_t items = batch * n * a.kb;
  for_dtype(out_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::nvfp4_dequantize_item<decltype(tag)>(a, t);
  });
  return 0;
}

int tsct_host_sign_pack(const void* w, int w_dtype, int64_t batch, int64_t n, int64_t k, uint8_t* bits) {
  SignArgs s = {};
  s.w = w;
  s.bits = bits;
  s.batch = batch;
  s.n = n;
  s.k = k;
  s.kbytes = k / 8;
  const int64_t items = batch * n * s.kbytes;
  for_dtype(w_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::sign_pack_item<decltype(tag)>(s, t);
  });
  return 0;
}

int tsct_host_sign_dequantize(const uint8_t* bits, const float* a, const float* scale_n, int64_t batch, int64_t n,
                              int64_t k, void* out, int out_dtype) {
  SignArgs s = {};
  s.bits = const_cast<uint8_t*>(bits);
  s.a = a;
  s.scale_n = scale_n;
  s.out = out;
  s.batch = batch;
  s.n = n;
  s.k = k;
  s.kbytes = k / 8;
  const int64_t items = batch * n * s.kbytes;
  for_dtype(out_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::sign_dequantize_item<decltype(tag)>(s, t);
  });
  return 0;
}

int tsct_host_fp8_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_n,
                           uint8_t* codes, int vec) {
  Fp8Args a = {};
  a.x = x;
  a.scale_n = scale_n;
  a.codes = codes;
  a.batch = batch;
  a.n = n;
  a.k = k;
  a.kc = (k + 15) / 16;
  a.vec = vec && k % 16 == 0;  // the full-chunk branch, with scalar accesses on the host
  const int64_t items = batch * n * a.kc;
  for_dtype(x_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::fp8_quantize_item<decltype(tag)>(a, t);
  });
  return 0;
}

int tsct_host_fp8_dequantize(const uint8_t* codes, const float* scale_n, int64_t batch, int64_t n, int64_t k, void* out,
                             int out_dtype, int vec) {
  Fp8Args a = {};
  a.codes = const_cast<uint8_t*>(codes);
  a.scale_n = scale_n;
  a.out = out;
  a.batch = batch;
  a.n = n;
  a.k = k;
  a.kc = (k + 15) / 16;
  a.vec = vec && k % 16 == 0;
  const int64_t items = batch * n * a.kc;
  for_dtype(out_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::fp8_dequantize_item<decltype(tag)>(a, t);
  });
  return 0;
}

int tsct_host_ternary_pack(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_k,
                           const float* scale_n, uint8_t* codes) {
  TernaryArgs s = {};
  s.x = x;
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.codes = codes;
  s.batch = batch;
  s.n = n;
  s.k = k;
  s.kbytes = k / 4;
  const int64_t items = batch * n * s.kbytes;
  for_dtype(x_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::ternary_pack_item<decltype(tag)>(s, t);
  });
  return 0;
}

int tsct_host_ternary_dequantize(const uint8_t* codes, const float* scale_k, const float* scale_n, int64_t batch,
                                 int64_t n, int64_t k, void* out, int out_dtype) {
  TernaryArgs s = {};
  s.codes = const_cast<uint8_t*>(codes);
  s.scale_k = scale_k;
  s.scale_n = scale_n;
  s.out = out;
  s.batch = batch;
  s.n = n;
  s.k = k;
  s.kbytes = k / 4;
  const int64_t items = batch * n * s.kbytes;
  for_dtype(out_dtype, [&](auto tag) {
    for (int64_t t = 0; t < items; ++t) tsct::quant::ternary_dequantize_item<decltype(tag)>(s, t);
  });
  return 0;
}

// Element-wise format primitives, for exhaustive checks against torch's conversions.
void tsct_host_e4m3_from_f32(const float* v, int64_t count, uint8_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = tsct::fmt::e4m3_from_f32(v[i]);
}
void tsct_host_e4m3_to_f32(const uint8_t* b, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = tsct::fmt::e4m3_to_f32(b[i]);
}

}  // extern "C"
