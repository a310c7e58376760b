/* tsct native library: a plain C ABI (docs/decisions/0001-binding-c-abi.md).
 *
 * No Python, pybind11 or libtorch symbols cross this boundary, so one shared library serves every
 * CPython >= 3.10 and every torch release; Python calls it through ctypes with raw device pointers
 * and the caller's CUDA stream.
 *
 * Conventions for every entry point:
 *  - pointers are device pointers, contiguous row-major; `stream` is a cudaStream_t (NULL = legacy default);
 *  - the return value is 0 on success, else a cudaError_t (positive) or a TSCT_ERR_* code (negative);
 *    tsct_error_string() names it. Launch errors are checked right after the launch.
 *  - dtype codes: TSCT_F32, TSCT_BF16, TSCT_F16.
 * Formats and arithmetic: docs/decisions/0002-nvfp4-recipe.md (bit-exact with python/tsct/quant).
 */
#ifndef TSCT_TSCT_H_
#define TSCT_TSCT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSCT_ABI_VERSION 2 /* 2: the Triton AOT launcher (tsct_triton_*) */

/* The library is built with -fvisibility=hidden; only declarations marked TSCT_API are exported
 * (and csrc/exports.map lists the same names). */
#if defined(__GNUC__)
#define TSCT_API __attribute__((visibility("default")))
#else
#define TSCT_API
#endif

enum tsct_dtype { TSCT_F32 = 0, TSCT_BF16 = 1, TSCT_F16 = 2 };
enum tsct_scale_layout { TSCT_LAYOUT_LINEAR = 0, TSCT_LAYOUT_SWIZZLED_128X4 = 1 };
enum tsct_error {
  TSCT_ERR_BAD_ARGUMENT = -1, /* a size, dtype or layout code out of range, or a null pointer */
  TSCT_ERR_NO_CUDA = -2       /* built without CUDA */
};

TSCT_API int tsct_abi_version(void);
TSCT_API const char* tsct_error_string(int code);
/* Detail of the last non-zero return on the calling thread (e.g. "tsct_nvfp4_quantize: k=30 is not a
 * multiple of 16"); "" after a success. Thread-local; valid until the thread's next tsct_* call. */
TSCT_API const char* tsct_last_error_detail(void);
/* JSON text written at build time: version, nvcc, gencode targets, kernel names. */
TSCT_API const char* tsct_build_info(void);
/* *available = 1 if the current device has a loadable image for the named kernel (cudaFuncGetAttributes).
 * Kernel names are the extern "C" __global__ names listed in build info (e.g. "tsctk_nvfp4_quantize_bf16");
 * an unknown name is TSCT_ERR_BAD_ARGUMENT; no device / driver gives the cudaError_t. */
TSCT_API int tsct_kernel_available(const char* kernel_name, int* available);

/* NVFP4 quantize. x: [batch, n, k] of dtype x_dtype; s_enc: [batch] fp32 encode scales (computed by
 * the caller from the finite amax, see 0002). codes: [batch, n, k/2] bytes; block_scale: linear
 * [batch, n, k/16] or swizzled [batch, ceil(n/128)*128 * ceil(k/64)*4] bytes (padding written 0). k % 16 == 0. */
TSCT_API int tsct_nvfp4_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* s_enc,
                                 uint8_t* codes, uint8_t* block_scale, int layout, void* stream);
/* NVFP4 decode to out [batch, n, k] of out_dtype. */
TSCT_API int tsct_nvfp4_dequantize(const uint8_t* codes, const uint8_t* block_scale, int layout, const float* s_enc,
                                   int64_t batch, int64_t n, int64_t k, void* out, int out_dtype, void* stream);
/* Sign pack: bits [batch, n, k/8], bit j of byte i = signbit(w[..., 8i+j]). k % 8 == 0. */
TSCT_API int tsct_sign_pack(const void* w, int w_dtype, int64_t batch, int64_t n, int64_t k, uint8_t* bits, void* stream);
/* Sign decode: out[b, n, k] = (+-1 * a[b, k]) * scale_n[b, n]; a: [batch, k] fp32, scale_n: [batch, n] fp32. */
TSCT_API int tsct_sign_dequantize(const uint8_t* bits, const float* a, const float* scale_n, int64_t batch, int64_t n,
                                  int64_t k, void* out, int out_dtype, void* stream);

/* ---- Triton kernels compiled ahead of time (tsct/_aot/<arch>/*.cubin + index.json; decisions/0005) ----
 * The caller (python/tsct/kernels/aot.py) picks the cubin for the device's arch and passes its metadata
 * from index.json. No Triton and no compiler are needed at run time; libcuda is reached through the
 * statically linked CUDA runtime, on the first call. Thread-safe. */

/* Load `function` from a cubin image once per process (cudaLibraryLoadData: context-independent, so it
 * serves every device); later calls with the same cache_key return the same handle (and must pass the
 * same metadata). The image is copied. num_params counts every kernel parameter including Triton's
 * trailing scratch pointers; shared_bytes is the dynamic shared memory of each launch; block_x =
 * 32 * num_warps. A cubin the device cannot run is reported by the first launch (lazy loading). */
TSCT_API int tsct_triton_load(const char* cache_key, const void* image, uint64_t image_size, const char* function,
                              int num_params, unsigned shared_bytes, unsigned block_x, void** handle);
/* Launch on `stream` (a cudaStream_t) of the current device: args[i] points at parameter i's value
 * (Triton's ABI: pointers as 8-byte device addresses, i32 as 4 bytes; NULL scratch pointers). A zero
 * grid dimension launches nothing and returns 0. Returns a cudaError_t from the launch, if any. */
TSCT_API int tsct_triton_launch(void* handle, unsigned grid_x, unsigned grid_y, unsigned grid_z, void* stream,
                                void** args, int num_args);
/* Registers, max threads per block and local (spill) bytes of the kernel on the current device
 * (cudaFuncGetAttributes; also proves the device can load the cubin). */
TSCT_API int tsct_triton_kernel_info(void* handle, int* num_regs, int* max_threads_per_block, int* local_bytes);

#ifdef __cplusplus
}
#endif
#endif /* TSCT_TSCT_H_ */
