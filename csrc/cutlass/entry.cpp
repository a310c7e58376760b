// C ABI of the CUTLASS sm_120 grouped NVFP4 GEMM when it is NOT linked in, and the built-in query.
//
// Always compiled into libtsct_kernels.so (cmake/tsct_cutlass.cmake). With TSCT_HAVE_CUTLASS (the option
// TSCT_CUTLASS on and the pinned headers found) the real entries come from grouped_nvfp4_sm120.cu (an
// sm_120a-only object) and this file defines only tsct_cutlass_built; without it every tsct_cutlass_*
// entry returns TSCT_ERR_NOT_BUILT with a detail saying how to build it, so the exported C ABI (tsct.h,
// exports.map) is the same in both builds. Host C++ only: no CUDA call here.
#include <stdint.h>

#include "common/host.h"
#include "tsct/tsct.h"

extern "C" {

int tsct_cutlass_built(int* built) {
  tsct::clear_error_detail();
  if (!built) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_cutlass_built: built is null");
#ifdef TSCT_HAVE_CUTLASS
  *built = 1;
#else
  *built = 0;
#endif
  return 0;
}

#ifndef TSCT_HAVE_CUTLASS
static int not_built(const char* fn) {
  return tsct::fail(TSCT_ERR_NOT_BUILT,
                    "%s: this library was built without the CUTLASS sm_120 kernel (TSCT_CUTLASS=OFF, or AUTO "
                    "without the pinned CUTLASS headers; docs/decisions/0011)", fn);
}

int tsct_cutlass_nvfp4_grouped_sm120_workspace(int64_t, int, uint64_t*) {
  tsct::clear_error_detail();
  return not_built("tsct_cutlass_nvfp4_grouped_sm120_workspace");
}

int tsct_cutlass_nvfp4_grouped_sm120_bf16(int64_t, const int32_t*, const uint64_t*, const uint64_t*,
                                          const uint64_t*, const uint64_t*, const uint64_t*, const float*, void*,
                                          uint64_t, int, void*) {
  tsct::clear_error_detail();
  return not_built("tsct_cutlass_nvfp4_grouped_sm120_bf16");
}

int tsct_cutlass_nvfp4_grouped_sm120_config(int64_t*, int) {
  tsct::clear_error_detail();
  return not_built("tsct_cutlass_nvfp4_grouped_sm120_config");
}

int tsct_cutlass_nvfp4_sf_offsets_sm120(int, int, int, int, int64_t*) {
  tsct::clear_error_detail();
  return not_built("tsct_cutlass_nvfp4_sf_offsets_sm120");
}
#endif

}  // extern "C"
