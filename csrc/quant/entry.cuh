// What the C entry points of the quant kernels share (nvfp4.cu, sign.cu, fp8.cu, ternary.cu, rows_grouped.cu): the
// per-dtype kernels of one per-item body, their registry rows, the argument checks, the launch. nvcc only.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <initializer_list>
#include <utility>

#include "common/host.h"
#include "tsct/tsct.h"

// tsctk_<NAME>_f32 / _bf16 / _f16 (ARGS a, int64_t items): a grid-stride loop running tsct::quant::ITEM<T>(a, t)
// for every item. extern "C": the ELF symbol is the plain name (manifest.json, cuobjdump, tsct_kernel_available).
#define TSCT_ITEM_KERNEL(NAME, ARGS, ITEM, T)                                                      \
  extern "C" __global__ void __launch_bounds__(tsct::kThreads) NAME(ARGS a, int64_t items) {      \
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;                   \
         t += int64_t(gridDim.x) * blockDim.x)                                                    \
      tsct::quant::ITEM<T>(a, t);                                                                 \
  }
#define TSCT_ITEM_KERNELS(NAME, ARGS, ITEM)                         \
  TSCT_ITEM_KERNEL(tsctk_##NAME##_f32, ARGS, ITEM, float)           \
  TSCT_ITEM_KERNEL(tsctk_##NAME##_bf16, ARGS, ITEM, __nv_bfloat16)  \
  TSCT_ITEM_KERNEL(tsctk_##NAME##_f16, ARGS, ITEM, __half)
// The three KernelEntry rows of tsctk_<NAME>_f32 / _bf16 / _f16.
#define TSCT_KERNEL_ENTRIES(NAME)                                                         \
  {"tsctk_" #NAME "_f32", (const void*)tsctk_##NAME##_f32},                                   \
      {"tsctk_" #NAME "_bf16", (const void*)tsctk_##NAME##_bf16},                             \
      {"tsctk_" #NAME "_f16", (const void*)tsctk_##NAME##_f16}

namespace tsct {
namespace quant {

inline bool aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

// k a multiple of `k_multiple` (the format's elements per block or byte; 1: any k) and `dtype` a tsct_dtype
// (`dtype_arg`: the argument's name). 0, or TSCT_ERR_BAD_ARGUMENT with the detail naming `fn`.
inline int check_k_and_dtype(const char* fn, int64_t k, int k_multiple, int dtype, const char* dtype_arg) {
  if (k % k_multiple != 0)
    return fail(TSCT_ERR_BAD_ARGUMENT, "%s: k=%lld is not a multiple of %d", fn, (long long)k, k_multiple);
  if (dtype != TSCT_F32 && dtype != TSCT_BF16 && dtype != TSCT_F16)
    return fail(TSCT_ERR_BAD_ARGUMENT, "%s: %s=%d is not a tsct_dtype (0 f32, 1 bf16, 2 f16)", fn, dtype_arg, dtype);
  return 0;
}

// A [batch, n, k] factor's sizes >= 0, then check_k_and_dtype.
inline int check_factor_shape(const char* fn, int64_t batch, int64_t n, int64_t k, int k_multiple, int dtype,
                              const char* dtype_arg) {
  if (batch < 0 || n < 0 || k < 0)
    return fail(TSCT_ERR_BAD_ARGUMENT, "%s: negative size (batch=%lld, n=%lld, k=%lld)", fn, (long long)batch,
                (long long)n, (long long)k);
  return check_k_and_dtype(fn, k, k_multiple, dtype, dtype_arg);
}

// batch * rows * k fits int64 (rows: n, or n padded by a scale layout).
inline int check_total(const char* fn, int64_t batch, int64_t rows, int64_t k) {
  int64_t total;
  if (!checked_mul3(batch, rows, k, &total))
    return fail(TSCT_ERR_BAD_ARGUMENT, "%s: batch*n*k overflows int64", fn);
  return 0;
}

// check_factor_shape and check_total of an unpadded factor; fills a->batch, a->n, a->k.
template <typename Args>
int check_factor(const char* fn, int64_t batch, int64_t n, int64_t k, int k_multiple, int dtype,
                 const char* dtype_arg, Args* a) {
  if (int rc = check_factor_shape(fn, batch, n, k, k_multiple, dtype, dtype_arg)) return rc;
  if (int rc = check_total(fn, batch, n, k)) return rc;
  a->batch = batch;
  a->n = n;
  a->k = k;
  return 0;
}

// TSCT_ERR_BAD_ARGUMENT naming every pointer ("fn: null pointer (x=0x.., codes=(nil))") if one of them is null, else 0.
inline int check_not_null(const char* fn, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  bool ok = true;
  for (const auto& p : ptrs) ok = ok && p.second != nullptr;
  if (ok) return 0;
  char list[256] = "";
  size_t len = 0;
  for (const auto& p : ptrs)
    if (len < sizeof(list))
      len += snprintf(list + len, sizeof(list) - len, "%s%s=%p", len ? ", " : "", p.first, p.second);
  return fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer (%s)", fn, list);
}

// The kernel of `dtype` (checked: a tsct_dtype) among a family's three, launched over `items` (> 0) on `stream`;
// check_launch's result.
template <typename Args>
int launch_items(const char* fn, int dtype, const Args& a, int64_t items, void* stream, void (*f32)(Args, int64_t),
                 void (*bf16)(Args, int64_t), void (*f16)(Args, int64_t)) {
  const auto kernel = dtype == TSCT_F32 ? f32 : dtype == TSCT_BF16 ? bf16 : f16;
  kernel<<<grid_blocks(items), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, items);
  return check_launch(fn);
}

}  // namespace quant
}  // namespace tsct
