// Library-wide entry points of tsct.h (version, errors, build info, kernel availability) and the
// host helpers of common/host.h. Plain C++: no device code, so it is compiled once, not per arch.
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/host.h"
#include "tsct/tsct.h"

namespace tsct {

extern const char kBuildInfoJson[];  // generated at build time (tools/gen_build_info.py)

namespace {
thread_local char g_detail[512];
}

void clear_error_detail() { g_detail[0] = '\0'; }

int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_detail, sizeof g_detail, fmt, ap);
  va_end(ap);
  return code;
}

int check_launch(const char* fn) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return fail(static_cast<int>(e), "%s: kernel launch failed: %s (%s)", fn, cudaGetErrorName(e),
              cudaGetErrorString(e));
}

bool checked_mul3(int64_t a, int64_t b, int64_t c, int64_t* out) {
  if (a < 0 || b < 0 || c < 0) return false;
  int64_t ab;
  return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, out);
}

int opt_in_shared_memory(const char* fn, const void* kernel, int bytes, std::atomic<bool>* opted) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev))
    return fail(static_cast<int>(e), "%s: cudaGetDevice: %s", fn, cudaGetErrorString(e));
  if (dev < 64 && opted[dev].load(std::memory_order_relaxed)) return 0;
  int optin = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev))
    return fail(static_cast<int>(e), "%s: cudaDeviceGetAttribute: %s", fn, cudaGetErrorString(e));
  if (optin < bytes)
    return fail(static_cast<int>(cudaErrorInvalidConfiguration),
                "%s: needs %d bytes of shared memory per block, device %d allows %d", fn, bytes, dev, optin);
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))
    return fail(static_cast<int>(e), "%s: cudaFuncSetAttribute: %s", fn, cudaGetErrorString(e));
  if (dev < 64) opted[dev].store(true, std::memory_order_relaxed);
  return 0;
}

unsigned grid_blocks(int64_t items) {
  // Enough blocks to fill any current GPU many times over; the grid-stride loop covers the rest.
  const int64_t kMaxBlocks = int64_t(1) << 20;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace tsct

namespace {
// The registry row of a kernel, or null.
const tsct::KernelEntry* find_kernel(const char* name) {
  const tsct::KernelEntry* const tables[] = {tsct::kNvfp4Kernels,      tsct::kSignKernels,  tsct::kFp8Kernels,
                                               tsct::kTernaryKernels,    tsct::kRowsGroupedKernels,
                                               tsct::kGluKernels,        tsct::kGluLowbitKernels,
                                               tsct::kGluUpLowbitKernels};
  for (const tsct::KernelEntry* table : tables)
    for (const tsct::KernelEntry* e = table; e->name; ++e)
      if (strcmp(e->name, name) == 0) return e;
  return nullptr;
}
}  // namespace

extern "C" {

int tsct_abi_version(void) { return TSCT_ABI_VERSION; }

const char* tsct_error_string(int code) {
  if (code == 0) return "success";
  if (code == TSCT_ERR_BAD_ARGUMENT) return "TSCT_ERR_BAD_ARGUMENT: a size, dtype, layout code or pointer is invalid";
  if (code == TSCT_ERR_NO_CUDA) return "TSCT_ERR_NO_CUDA: built without CUDA";
  if (code == TSCT_ERR_NOT_BUILT) return "TSCT_ERR_NOT_BUILT: this library was built without that kernel";
  if (code > 0) return cudaGetErrorString(static_cast<cudaError_t>(code));
  return "unknown tsct error code";
}

const char* tsct_last_error_detail(void) { return tsct::g_detail; }

const char* tsct_build_info(void) { return tsct::kBuildInfoJson; }

int tsct_kernel_smem_bytes(const char* kernel_name, int* bytes) {
  tsct::clear_error_detail();
  if (!kernel_name || !bytes)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_kernel_smem_bytes: null pointer argument");
  const tsct::KernelEntry* e = find_kernel(kernel_name);
  if (!e) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_kernel_smem_bytes: unknown kernel '%s'", kernel_name);
  *bytes = e->smem_bytes;
  return 0;
}

int tsct_stream_capture_id(void* stream, unsigned long long* capture_id) {
  tsct::clear_error_detail();
  if (!capture_id) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_stream_capture_id: null pointer argument");
  *capture_id = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t e = cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return tsct::fail(static_cast<int>(e), "tsct_stream_capture_id: %s (%s)", cudaGetErrorName(e),
                      cudaGetErrorString(e));
  }
  if (status == cudaStreamCaptureStatusActive) *capture_id = id;
  return 0;
}

int tsct_kernel_available(const char* kernel_name, int* available) {
  tsct::clear_error_detail();
  if (!kernel_name || !available)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_kernel_available: null pointer argument");
  *available = 0;
  const tsct::KernelEntry* entry = find_kernel(kernel_name);
  if (!entry) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_kernel_available: unknown kernel '%s'", kernel_name);
  const void* fn = entry->fn;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, fn);
  if (e == cudaSuccess) {
    *available = 1;
    return 0;
  }
  cudaGetLastError();  // not sticky: clear it so the next launch check does not see it
  if (e == cudaErrorInvalidDeviceFunction || e == cudaErrorNoKernelImageForDevice ||
      e == cudaErrorInvalidPtx || e == cudaErrorUnsupportedPtxVersion)
    return 0;  // no image this device can load: available = 0
  return tsct::fail(static_cast<int>(e), "tsct_kernel_available: %s (%s)", cudaGetErrorName(e),
                    cudaGetErrorString(e));
}

}  // extern "C"
