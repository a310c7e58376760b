// C ABI of the CuTeDSL sm_120 NVFP4 grouped GEMMs (tsct.h "sm_120 NVFP4 grouped GEMMs"; decision 0009).
//
// Built always; with TSCT_HAVE_CUTEDSL (CMake TSCT_CUTEDSL=ON/AUTO and the pinned DSL found) it
// includes the headers cutedsl/build.py wrote next to the exported objects and fills their tensor
// structs from (pointer, sizes, strides); without it every entry returns TSCT_ERR_NOT_BUILT.
// Two export sets are linked (decision 0010): sm_120a (`..._sm120`, compute capability 12.0) and
// sm_121a (`..._sm121`, 12.1: an sm_120a cubin does not load there); each call picks the set by the
// current device's capability (12.1 -> sm_121a, anything else -> sm_120a, whose module load fails
// cleanly with "no kernel image" off 12.0). The objects embed their cubins as data;
// <name>_Kernel_Module_Load loads them with cudaLibraryLoadData on the first call of each variant
// (never at dlopen: `import tsct` stays device-free), once per process, under std::call_once
// (load_module_once). Host C++ only: no device code here.
#include <stdint.h>

#include "common/host.h"
#include "tsct/tsct.h"

#ifdef TSCT_HAVE_CUTEDSL
#include <cuda_runtime.h>

#include <mutex>

namespace {
// The generated headers report CUDA errors through this macro (printing by default): record the
// first one instead, so the entry can return it.
thread_local int g_dsl_error = 0;
inline void note_dsl_error(cudaError_t e) {
  if (e != cudaSuccess && g_dsl_error == 0) g_dsl_error = static_cast<int>(e);
}
}  // namespace
#define CUTE_DSL_CUDA_ERROR_CHECK(err) note_dsl_error(err)

#include "tsct_nvfp4_grouped_alpha_sm120.h"
#include "tsct_nvfp4_grouped_glu_sm120.h"
#include "tsct_nvfp4_grouped_rowweight_sm120.h"
#include "tsct_sign_grouped_alpha_sm120.h"
#include "tsct_sign_grouped_glu_sm120.h"
#include "tsct_sign_grouped_rowweight_sm120.h"
#include "tsct_nvfp4_grouped_alpha_sm121.h"
#include "tsct_nvfp4_grouped_glu_sm121.h"
#include "tsct_nvfp4_grouped_rowweight_sm121.h"
#include "tsct_sign_grouped_alpha_sm121.h"
#include "tsct_sign_grouped_glu_sm121.h"
#include "tsct_sign_grouped_rowweight_sm121.h"

namespace {

struct GroupedArgs {
  const void *a, *b, *sfa, *sfb;  // sign: b = bits, sfb unused
  const int32_t *sfa_offsets, *offs, *tile_expert, *tile_row;
  void* c;
  const float *alpha, *ep0, *ep1, *col_scale;
  int64_t m_alloc, k, n, num_experts, sfa_bytes, sfb_bytes, c_rows, c_cols, ldc, num_tiles, ep_rows, ep_cols, ep_ld;
  cudaStream_t stream;
};

// One exported module, loaded once per process: 0, or the CUDA error its load reported (cleared, so it
// does not poison the next call's launch check). Every variant of both entries goes through here.
template <typename Module, void (*Load)(Module*)>
int load_module_once(Module** out) {
  static Module module;
  static std::once_flag once;
  static int rc = 0;
  std::call_once(once, [] {
    g_dsl_error = 0;
    Load(&module);
    rc = g_dsl_error;
    if (rc) cudaGetLastError();
  });
  *out = &module;
  return rc;
}

// The wrapper's return code -> the entry's: a failed launch is cleared too, then the launch check.
int finish_launch(int32_t rc, const char* fn, const char* name) {
  if (rc) {
    cudaGetLastError();
    return tsct::fail(rc, "%s: %s launch returned %d", fn, name, int(rc));
  }
  return tsct::check_launch(fn);
}

// Which export set loads on the current device: *sm121 = (compute capability == 12.1). Without a driver
// this is where cudaErrorInsufficientDriver (35) comes back.
int current_is_sm121(const char* fn, bool* sm121) {
  int dev = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tsct::fail(static_cast<int>(e), "%s: querying the current device failed: %s", fn, cudaGetErrorString(e));
  }
  *sm121 = major == 12 && minor == 1;
  return 0;
}

// Load PFX's module (once) into `module`, or return the load error from the enclosing entry.
#define TSCT_SM120_LOAD(PFX, fn)                                                                                \
  PFX##_Kernel_Module_t* module = nullptr;                                                                     \
  if (const int load_rc = load_module_once<PFX##_Kernel_Module_t, PFX##_Kernel_Module_Load>(&module))          \
    return tsct::fail(load_rc, "%s: loading " #PFX " failed: %s", fn,                                          \
                      cudaGetErrorString(static_cast<cudaError_t>(load_rc)))

// One NVFP4 variant: fill the generated structs (shapes are int32 where the DSL declared sym_int32,
// strides int64; fp4 strides count elements), launch.
#define TSCT_SM120_GROUPED_LAUNCH_ONE(PFX, fn, g)                                                               \
  do {                                                                                                         \
    TSCT_SM120_LOAD(PFX, fn);                                                                                  \
    PFX##_Tensor_a_t ta = {const_cast<void*>(g.a), {int32_t(g.m_alloc), int32_t(g.k)}, {g.k}};                 \
    PFX##_Tensor_b_t tb = {const_cast<void*>(g.b), {int32_t(g.n), int32_t(g.k), int32_t(g.num_experts)},      \
                           {g.k, g.n * g.k}};                                                                  \
    PFX##_Tensor_sfa_t tsfa = {const_cast<void*>(g.sfa), {g.sfa_bytes}};                                       \
    PFX##_Tensor_sfa_offsets_t tso = {const_cast<int32_t*>(g.sfa_offsets), {int32_t(g.num_experts)}};          \
    PFX##_Tensor_sfb_t tsfb = {const_cast<void*>(g.sfb), {g.sfb_bytes}};                                       \
    PFX##_Tensor_c_t tc = {g.c, {int32_t(g.c_rows), int32_t(g.c_cols)}, {g.ldc}};                               \
    PFX##_Tensor_offs_t toffs = {const_cast<int32_t*>(g.offs), {int32_t(g.num_experts)}};                      \
    PFX##_Tensor_tile_expert_t tte = {const_cast<int32_t*>(g.tile_expert), {int32_t(g.num_tiles)}};            \
    PFX##_Tensor_tile_row_t ttr = {const_cast<int32_t*>(g.tile_row), {int32_t(g.num_tiles)}};                  \
    PFX##_Tensor_alpha_t tal = {const_cast<float*>(g.alpha), {int32_t(g.num_experts)}};                        \
    PFX##_Tensor_ep0_t te0 = {const_cast<float*>(g.ep0), {int32_t(g.ep_rows), int32_t(g.ep_cols)}, {g.ep_ld}}; \
    PFX##_Tensor_ep1_t te1 = {const_cast<float*>(g.ep1), {int32_t(g.ep_rows), int32_t(g.ep_cols)}, {g.ep_ld}}; \
    return finish_launch(cute_dsl_##PFX##_wrapper(module, &ta, &tb, &tsfa, &tso, &tsfb, &tc, &toffs, &tte, &ttr, \
                                                  &tal, &te0, &te1, g.stream),                                 \
                         fn, #PFX);                                                                            \
  } while (0)

// Sign variants: P copies outermost (tsct.h); P is static in each export (2 for the GLU, else 1).
#define TSCT_SM120_SIGN_LAUNCH_ONE(PFX, fn, g, P)                                                               \
  do {                                                                                                         \
    TSCT_SM120_LOAD(PFX, fn);                                                                                  \
    const int64_t k8 = g.k / 8;                                                                                \
    PFX##_Tensor_a_t ta = {const_cast<void*>(g.a), {int32_t(g.m_alloc), int32_t(g.k)}, {g.k, g.m_alloc * g.k}}; \
    PFX##_Tensor_bits_t tb = {const_cast<void*>(g.b), {int32_t(g.n), int32_t(k8), int32_t(g.num_experts)},    \
                              {k8, g.n * k8, g.num_experts * g.n * k8}};                                       \
    PFX##_Tensor_sfa_t tsfa = {const_cast<void*>(g.sfa), {g.sfa_bytes}, {g.sfa_bytes}};                        \
    PFX##_Tensor_sfa_offsets_t tso = {const_cast<int32_t*>(g.sfa_offsets), {int32_t(g.num_experts)}};          \
    PFX##_Tensor_col_scale_t tcs = {const_cast<float*>(g.col_scale), {int32_t(g.num_experts), int32_t(g.n)},   \
                                    {g.n, g.num_experts * g.n}};                                               \
    PFX##_Tensor_c_t tc = {g.c, {int32_t(g.c_rows), int32_t(g.c_cols)}, {g.ldc}};                               \
    PFX##_Tensor_offs_t toffs = {const_cast<int32_t*>(g.offs), {int32_t(g.num_experts)}};                      \
    PFX##_Tensor_tile_expert_t tte = {const_cast<int32_t*>(g.tile_expert), {int32_t(g.num_tiles)}};            \
    PFX##_Tensor_tile_row_t ttr = {const_cast<int32_t*>(g.tile_row), {int32_t(g.num_tiles)}};                  \
    PFX##_Tensor_alpha_t tal = {const_cast<float*>(g.alpha), {int32_t(g.num_experts)}, {int64_t(P)}};          \
    PFX##_Tensor_ep0_t te0 = {const_cast<float*>(g.ep0), {int32_t(g.ep_rows), int32_t(g.ep_cols)}, {g.ep_ld}}; \
    PFX##_Tensor_ep1_t te1 = {const_cast<float*>(g.ep1), {int32_t(g.ep_rows), int32_t(g.ep_cols)}, {g.ep_ld}}; \
    return finish_launch(cute_dsl_##PFX##_wrapper(module, &ta, &tb, &tsfa, &tso, &tcs, &tc, &toffs, &tte, &ttr, \
                                                  &tal, &te0, &te1, g.stream),                                 \
                         fn, #PFX);                                                                            \
  } while (0)

// The variant NAME (without its _sm120 / _sm121 suffix) for the arch the current device loads.
#define TSCT_SM120_GROUPED_LAUNCH(NAME, fn, g, sm121)                      \
  do {                                                                    \
    if (sm121) TSCT_SM120_GROUPED_LAUNCH_ONE(NAME##_sm121, fn, g);        \
    TSCT_SM120_GROUPED_LAUNCH_ONE(NAME##_sm120, fn, g);                   \
  } while (0)
#define TSCT_SM120_SIGN_LAUNCH(NAME, fn, g, P, sm121)                      \
  do {                                                                    \
    if (sm121) TSCT_SM120_SIGN_LAUNCH_ONE(NAME##_sm121, fn, g, P);        \
    TSCT_SM120_SIGN_LAUNCH_ONE(NAME##_sm120, fn, g, P);                   \
  } while (0)

// Shared argument checks of both entries (sizes fit int32, k % 64, pointers); 1 = nothing to do.
int check_grouped(const char* fn, int64_t m_alloc, int64_t k, int64_t n, int64_t num_experts, int64_t c_rows,
                  int64_t c_cols, int64_t num_tiles, int64_t ep_rows, int64_t ep_cols, bool null_ptr, int* empty) {
  const int64_t sizes[] = {m_alloc, k, n, num_experts, c_rows, c_cols, num_tiles, ep_rows, ep_cols};
  for (int64_t s : sizes)
    if (s < 0 || s > INT32_MAX)
      return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: a size (%lld) is negative or >= 2^31", fn, (long long)s);
  if (k % 64)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: k=%lld is not a multiple of 64 (one MMA k-step)", fn,
                      (long long)k);
  *empty = num_tiles == 0 || c_rows == 0 || c_cols == 0 || num_experts == 0;
  if (!*empty && null_ptr) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer argument", fn);
  return 0;
}

}  // namespace
#endif  // TSCT_HAVE_CUTEDSL

extern "C" int tsct_sm120_built(int* built) {
  tsct::clear_error_detail();
  if (!built) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_sm120_built: built is null");
#ifdef TSCT_HAVE_CUTEDSL
  *built = 1;
#else
  *built = 0;
#endif
  return 0;
}

extern "C" int tsct_sm120_nvfp4_grouped(int variant, const void* a, int64_t m_alloc, int64_t k, const void* b,
                                        int64_t n, int64_t num_experts, const void* sfa, int64_t sfa_bytes,
                                        const int32_t* sfa_offsets, const void* sfb, int64_t sfb_bytes, void* c,
                                        int64_t c_rows, int64_t c_cols, int64_t ldc, const int32_t* offs,
                                        const int32_t* tile_expert, const int32_t* tile_row, int64_t num_tiles,
                                        const float* alpha, const float* ep0, int64_t ep_rows, int64_t ep_cols,
                                        int64_t ep_ld, const float* ep1, void* stream) {
  static const char* fn = "tsct_sm120_nvfp4_grouped";
  tsct::clear_error_detail();
#ifndef TSCT_HAVE_CUTEDSL
  (void)variant; (void)a; (void)m_alloc; (void)k; (void)b; (void)n; (void)num_experts; (void)sfa; (void)sfa_bytes;
  (void)sfa_offsets; (void)sfb; (void)sfb_bytes; (void)c; (void)c_rows; (void)c_cols; (void)ldc; (void)offs;
  (void)tile_expert; (void)tile_row; (void)num_tiles; (void)alpha; (void)ep0; (void)ep_rows; (void)ep_cols;
  (void)ep_ld; (void)ep1; (void)stream;
  return tsct::fail(TSCT_ERR_NOT_BUILT, "%s: this library was built without the CuTeDSL sm_120 kernels "
                    "(TSCT_CUTEDSL=OFF, or AUTO without nvidia-cutlass-dsl in the build environment)", fn);
#else
  if (variant < TSCT_SM120_NVFP4_ALPHA || variant > TSCT_SM120_NVFP4_ROW_WEIGHT)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: variant=%d is not a tsct_sm120_variant", fn, variant);
  int empty = 0;
  const bool null_ptr = !a || !b || !sfa || !sfa_offsets || !sfb || !c || !offs || !tile_expert || !tile_row ||
                        !alpha || !ep0 || !ep1;
  if (int rc = check_grouped(fn, m_alloc, k, n, num_experts, c_rows, c_cols, num_tiles, ep_rows, ep_cols, null_ptr,
                             &empty))
    return rc;
  if (empty) return 0;  // nothing to compute
  const GroupedArgs g = {a, b, sfa, sfb, sfa_offsets, offs, tile_expert, tile_row, c, alpha, ep0, ep1, nullptr, m_alloc, k, n,
                         num_experts, sfa_bytes, sfb_bytes, c_rows, c_cols, ldc, num_tiles, ep_rows, ep_cols, ep_ld,
                         static_cast<cudaStream_t>(stream)};
  bool sm121 = false;
  if (int rc = current_is_sm121(fn, &sm121)) return rc;
  switch (variant) {
    case TSCT_SM120_NVFP4_ALPHA: TSCT_SM120_GROUPED_LAUNCH(tsct_nvfp4_grouped_alpha, fn, g, sm121);
    case TSCT_SM120_NVFP4_GLU: TSCT_SM120_GROUPED_LAUNCH(tsct_nvfp4_grouped_glu, fn, g, sm121);
    default: TSCT_SM120_GROUPED_LAUNCH(tsct_nvfp4_grouped_rowweight, fn, g, sm121);
  }
#endif
}

extern "C" int tsct_sm120_sign_grouped(int variant, const void* a, int64_t m_alloc, int64_t k, const void* bits,
                                       int64_t n, int64_t num_experts, const void* sfa, int64_t sfa_bytes,
                                       const int32_t* sfa_offsets, const float* col_scale, void* c, int64_t c_rows,
                                       int64_t c_cols, int64_t ldc, const int32_t* offs, const int32_t* tile_expert,
                                       const int32_t* tile_row, int64_t num_tiles, const float* alpha, const float* ep0,
                                       int64_t ep_rows, int64_t ep_cols, int64_t ep_ld, const float* ep1, void* stream) {
  static const char* fn = "tsct_sm120_sign_grouped";
  tsct::clear_error_detail();
#ifndef TSCT_HAVE_CUTEDSL
  (void)variant; (void)a; (void)m_alloc; (void)k; (void)bits; (void)n; (void)num_experts; (void)sfa; (void)sfa_bytes;
  (void)sfa_offsets; (void)col_scale; (void)c; (void)c_rows; (void)c_cols; (void)ldc; (void)offs; (void)tile_expert;
  (void)tile_row; (void)num_tiles; (void)alpha; (void)ep0; (void)ep_rows; (void)ep_cols; (void)ep_ld; (void)ep1;
  (void)stream;
  return tsct::fail(TSCT_ERR_NOT_BUILT, "%s: this library was built without the CuTeDSL sm_120 kernels "
                    "(TSCT_CUTEDSL=OFF, or AUTO without nvidia-cutlass-dsl in the build environment)", fn);
#else
  if (variant < TSCT_SM120_SIGN_ALPHA || variant > TSCT_SM120_SIGN_ROW_WEIGHT)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: variant=%d is not a tsct_sm120_sign_variant", fn, variant);
  int empty = 0;
  const bool null_ptr = !a || !bits || !sfa || !sfa_offsets || !col_scale || !c || !offs || !tile_expert ||
                        !tile_row || !alpha || !ep0 || !ep1;
  if (int rc = check_grouped(fn, m_alloc, k, n, num_experts, c_rows, c_cols, num_tiles, ep_rows, ep_cols, null_ptr,
                             &empty))
    return rc;
  if (empty) return 0;
  if (sfa_bytes % 16)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: sfa_bytes=%lld must be a multiple of 16 (copy stride)", fn,
                      (long long)sfa_bytes);
  const GroupedArgs g = {a, bits, sfa, nullptr, sfa_offsets, offs, tile_expert, tile_row, c, alpha, ep0, ep1,
                         col_scale, m_alloc, k, n, num_experts, sfa_bytes, 0, c_rows, c_cols, ldc, num_tiles, ep_rows,
                         ep_cols, ep_ld, static_cast<cudaStream_t>(stream)};
  bool sm121 = false;
  if (int rc = current_is_sm121(fn, &sm121)) return rc;
  switch (variant) {
    case TSCT_SM120_SIGN_ALPHA: TSCT_SM120_SIGN_LAUNCH(tsct_sign_grouped_alpha, fn, g, 1, sm121);
    case TSCT_SM120_SIGN_GLU: TSCT_SM120_SIGN_LAUNCH(tsct_sign_grouped_glu, fn, g, 2, sm121);
    default: TSCT_SM120_SIGN_LAUNCH(tsct_sign_grouped_rowweight, fn, g, 1, sm121);
  }
#endif
}
