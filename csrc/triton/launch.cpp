// Launcher for the Triton kernels compiled ahead of time (tsct/_aot/<arch>/*.cubin; docs/decisions/0005).
//
// Plain C++ against the CUDA runtime's library-management API (linked statically like the rest of
// the library, so loading libtsct_kernels.so still needs no libcuda): a cubin image is loaded once per
// process with cudaLibraryLoadData (a context-independent library: the driver loads it into each
// device's context on first use), its kernel is fetched with cudaLibraryGetKernel, and launches go
// through cudaLaunchKernel with the cudaKernel_t cast to a function pointer (documented for
// cudaKernel_t) and Triton's argument convention: one pointer per parameter, the two trailing scratch
// pointers included. Dynamic shared memory above 48 KB is opted into once per (kernel, device).
//
// Loaded kernels live until the process exits (the table is small: one entry per variant used).
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/host.h"
#include "tsct/tsct.h"

namespace tsct {
namespace {

constexpr int kMaxDevices = 64;
constexpr unsigned kDefaultSharedLimit = 48 * 1024;

struct TritonKernel {
  std::string key;
  std::string function;
  std::vector<unsigned char> image;  // owned copy of the cubin (the driver may load it lazily)
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  int num_params = 0;
  unsigned shared = 0;
  unsigned block_x = 0;
  std::atomic<uint64_t> smem_ready{0};  // bit d: the shared-memory opt-in is done on device d
  std::mutex smem_mutex;
};

std::mutex g_mutex;
std::unordered_map<std::string, std::unique_ptr<TritonKernel>>& table() {
  static auto* t = new std::unordered_map<std::string, std::unique_ptr<TritonKernel>>();  // never destroyed
  return *t;
}

}  // namespace
}  // namespace tsct

extern "C" {

int tsct_triton_load(const char* cache_key, const void* image, uint64_t image_size, const char* function,
                     int num_params, unsigned shared_bytes, unsigned block_x, void** handle) {
  tsct::clear_error_detail();
  if (!cache_key || !image || !function || !handle || image_size < 16 || num_params < 0 || num_params > 256 ||
      block_x == 0 || block_x > 1024)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_load: bad argument (key, image, function, handle, "
                      "num_params=%d, block_x=%u)", num_params, block_x);
  *handle = nullptr;
  std::lock_guard<std::mutex> lock(tsct::g_mutex);
  auto& t = tsct::table();
  auto it = t.find(cache_key);
  if (it != t.end()) {
    tsct::TritonKernel* k = it->second.get();
    if (k->num_params != num_params || k->shared != shared_bytes || k->block_x != block_x || k->function != function)
      return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_load: '%s' was loaded with other metadata", cache_key);
    *handle = k;
    return 0;
  }
  auto k = std::make_unique<tsct::TritonKernel>();
  k->key = cache_key;
  k->function = function;
  k->image.assign(static_cast<const unsigned char*>(image), static_cast<const unsigned char*>(image) + image_size);
  k->num_params = num_params;
  k->shared = shared_bytes;
  k->block_x = block_x;
  cudaError_t e = cudaLibraryLoadData(&k->library, k->image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tsct::fail(static_cast<int>(e), "tsct_triton_load: cudaLibraryLoadData(%s): %s (%s)", cache_key,
                      cudaGetErrorName(e), cudaGetErrorString(e));
  }
  e = cudaLibraryGetKernel(&k->kernel, k->library, function);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaLibraryUnload(k->library);
    return tsct::fail(static_cast<int>(e), "tsct_triton_load: cudaLibraryGetKernel(%s, %s): %s (%s)", cache_key,
                      function, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  *handle = k.get();
  t.emplace(k->key, std::move(k));
  return 0;
}

int tsct_triton_launch(void* handle, unsigned grid_x, unsigned grid_y, unsigned grid_z, void* stream, void** args,
                       int num_args) {
  tsct::clear_error_detail();
  auto* k = static_cast<tsct::TritonKernel*>(handle);
  if (!k || (num_args > 0 && !args))
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_launch: null handle or argument array");
  if (num_args != k->num_params)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_launch: %s takes %d parameters, got %d", k->key.c_str(),
                      k->num_params, num_args);
  if (grid_x == 0 || grid_y == 0 || grid_z == 0) return 0;  // an empty grid launches nothing (like Triton)
  if (grid_y > 65535 || grid_z > 65535)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_launch: %s: grid (%u, %u, %u) out of range", k->key.c_str(),
                      grid_x, grid_y, grid_z);
  const void* fn = reinterpret_cast<const void*>(k->kernel);
  if (k->shared > tsct::kDefaultSharedLimit) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return tsct::fail(static_cast<int>(e), "tsct_triton_launch: cudaGetDevice: %s", cudaGetErrorString(e));
    const uint64_t bit = dev < tsct::kMaxDevices ? (uint64_t(1) << dev) : 0;
    if (!bit || !(k->smem_ready.load(std::memory_order_acquire) & bit)) {
      std::lock_guard<std::mutex> lock(k->smem_mutex);
      if (!bit || !(k->smem_ready.load(std::memory_order_relaxed) & bit)) {
        // applies to the current device's instance of the context-independent kernel
        e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k->shared));
        if (e != cudaSuccess) {
          cudaGetLastError();
          return tsct::fail(static_cast<int>(e), "tsct_triton_launch: %s: opting into %u bytes of shared memory: %s (%s)",
                            k->key.c_str(), k->shared, cudaGetErrorName(e), cudaGetErrorString(e));
        }
        k->smem_ready.fetch_or(bit, std::memory_order_release);
      }
    }
  }
  cudaError_t e = cudaLaunchKernel(fn, dim3(grid_x, grid_y, grid_z), dim3(k->block_x, 1, 1), args, k->shared,
                                   static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    cudaGetLastError();  // a launch-configuration error is not sticky: clear it for the next launch
    return tsct::fail(static_cast<int>(e), "tsct_triton_launch: %s: %s (%s)", k->key.c_str(), cudaGetErrorName(e),
                      cudaGetErrorString(e));
  }
  return 0;
}

int tsct_triton_kernel_info(void* handle, int* num_regs, int* max_threads_per_block, int* local_bytes) {
  tsct::clear_error_detail();
  auto* k = static_cast<tsct::TritonKernel*>(handle);
  if (!k || !num_regs || !max_threads_per_block || !local_bytes)
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_triton_kernel_info: null argument");
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k->kernel));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tsct::fail(static_cast<int>(e), "tsct_triton_kernel_info: %s: %s (%s)", k->key.c_str(), cudaGetErrorName(e),
                      cudaGetErrorString(e));
  }
  *num_regs = attr.numRegs;
  *max_threads_per_block = attr.maxThreadsPerBlock;
  *local_bytes = static_cast<int>(attr.localSizeBytes);
  return 0;
}

}  // extern "C"
