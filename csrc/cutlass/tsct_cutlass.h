/* tsct: CUTLASS C++ kernels for sm_120 (decisions 0007, 0011). The entry points are declared in tsct.h
 * ("sm_120 NVFP4 grouped GEMM on CUTLASS C++") and linked into libtsct_kernels.so by
 * cmake/tsct_cutlass.cmake (TSCT_CUTLASS=AUTO|ON|OFF); this header documents their operand conventions.
 *
 * Grouped NVFP4 x NVFP4 -> bf16 GEMM, one GEMM per expert e (ptr-array / "grouped" mode):
 *
 *     out_e[M_e, N] = alpha[e] * dequant(x_e)[M_e, K] @ dequant(w_e)[N, K]^T      (fp32 accumulate)
 *
 * x_e: the expert's activation rows, NVFP4 codes [M_e, K/2] bytes (K contiguous, even element in the
 * low nibble) with UE4M3 block scales (one per 16 K) in the swizzled_128x4 layout, rows padded to 128
 * PER EXPERT; w_e: the expert's factor [N, K/2] bytes with its swizzled scales [pad128(N) * pad4(K/16)].
 * out_e: bf16 [M_e, N] row-major. alpha: fp32 [G] on the device (per-group alpha, read by the epilogue).
 *
 * CUTLASS sees the problem transposed ("swap AB", so that the ~32 rows of an expert are CUTLASS's N,
 * the 128x32 tile's small side): CUTLASS A = w_e (M' = N, row-major), CUTLASS B = x_e (N' = M_e,
 * column-major = K contiguous), CUTLASS D = out_e^T (column-major [N, M_e] = row-major out_e).
 * So the per-group problem size is (N, M_e, K) and SFA = factor scales, SFB = activation scales.
 *
 * All per-group arrays are DEVICE arrays of length G, built by the caller on the device (no host read
 * of routing data, so the call can be captured in a CUDA graph):
 *   problem_nmk  int32 [G, 3]  (N, M_e, K) per group; M_e may be 0 (the group gets no tile)
 *   ptr_w, ptr_w_sf, ptr_x, ptr_x_sf, ptr_out   uint64 [G]   device addresses of group e's operands
 *   alpha        fp32 [G]
 * Requirements (checked by the caller's plan, python/tsct/kernels/sm120_fp4/cutlass_gemm.py): K % 128 == 0 (TMA boxes of
 * 64 bytes and full 4-scale columns), N % 8 == 0 (16-byte aligned output rows), operand addresses
 * 16-byte aligned, scale addresses 128-byte aligned (each per-group block is a multiple of 512 bytes).
 *
 * Return: 0, a cudaError_t (> 0) or TSCT_ERR_BAD_ARGUMENT (-1, with tsct_last_error_detail()).
 */
#ifndef TSCT_CUTLASS_H_
#define TSCT_CUTLASS_H_

#include <stdint.h>

#include "tsct/tsct.h"

/* Declared in tsct.h: tsct_cutlass_built, tsct_cutlass_nvfp4_grouped_sm120_workspace,
 * tsct_cutlass_nvfp4_grouped_sm120_bf16, tsct_cutlass_nvfp4_grouped_sm120_config,
 * tsct_cutlass_nvfp4_sf_offsets_sm120. */

#endif /* TSCT_CUTLASS_H_ */
