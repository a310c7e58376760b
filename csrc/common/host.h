// Host-side helpers shared by the entry points: error detail, argument checks, launch sizing,
// and the kernel-name registry behind tsct_kernel_available().
#pragma once

#include <stdint.h>

#include <atomic>

namespace tsct {

// Records a thread-local message (printf format) for tsct_last_error_detail() and returns `code`.
int fail(int code, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Clears the thread-local detail at the start of an entry point.
void clear_error_detail();
// cudaGetLastError() after a launch: 0, or the error code with the detail naming `fn`.
int check_launch(const char* fn);

// a * b * c with overflow (or a negative factor) detected; false on failure.
bool checked_mul3(int64_t a, int64_t b, int64_t c, int64_t* out);

// The current device gives `kernel` `bytes` of dynamic shared memory per block: checks its opt-in maximum and
// sets the kernel's attribute once per device (`opted`: the caller's cache of 64 devices; setting it twice
// from racing threads is harmless). 0, or a CUDA error code with a detail naming `fn`.
int opt_in_shared_memory(const char* fn, const void* kernel, int bytes, std::atomic<bool>* opted);

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over `items` (> 0) with kThreads threads per block.
unsigned grid_blocks(int64_t items);

struct KernelEntry {
  const char* name;    // the extern "C" __global__ name, also its ELF symbol (see manifest.json)
  const void* fn;      // host stub address, for cudaFuncGetAttributes
  int smem_bytes = 0;  // dynamic shared memory per block its entry point launches it with (tsct_kernel_smem_bytes)
};
// Defined next to the kernels (nvfp4.cu, sign.cu); nullptr-terminated.
extern const KernelEntry kNvfp4Kernels[];
extern const KernelEntry kSignKernels[];
extern const KernelEntry kFp8Kernels[];      // quant/fp8.cu
extern const KernelEntry kTernaryKernels[];  // quant/ternary.cu
extern const KernelEntry kRowsGroupedKernels[];  // rows_grouped.cu
extern const KernelEntry kGluKernels[];          // glu/dz_bf16.cu
extern const KernelEntry kGluLowbitKernels[];    // glu/down_nvfp4.cu
extern const KernelEntry kGluUpLowbitKernels[];  // glu/up_nvfp4.cu

}  // namespace tsct
