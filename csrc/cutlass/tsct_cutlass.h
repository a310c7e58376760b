/* tsct: CUTLASS C++ kernels for sm_120 (decision 0007). Not yet part of tsct.h / exports.map: this
 * header is the proposed ABI; wiring is described in docs/decisions/0007-cutlass-headers.md.
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
 * Requirements (checked by the caller's plan, tests/cpu/_cutlass_plan.py): K % 128 == 0 (TMA boxes of
 * 64 bytes and full 4-scale columns), N % 8 == 0 (16-byte aligned output rows), operand addresses
 * 16-byte aligned, scale addresses 128-byte aligned (each per-group block is a multiple of 512 bytes).
 *
 * Return: 0, a cudaError_t (> 0) or TSCT_ERR_BAD_ARGUMENT (-1, with tsct_last_error_detail()).
 */
#ifndef TSCT_CUTLASS_H_
#define TSCT_CUTLASS_H_

#include <stdint.h>

#include "tsct/tsct.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace bytes for a call with num_groups groups on a device with sm_count SMs (sm_count <= 0:
 * the current device's; the same value must then be passed to the run). Host only, no launch. */
TSCT_API int tsct_cutlass_nvfp4_grouped_sm120_workspace(int64_t num_groups, int sm_count, uint64_t* bytes);

/* Runs the grouped GEMM on `stream`. workspace: device memory of >= the queried bytes, 256-byte
 * aligned. num_groups == 0 returns 0 without a launch. */
TSCT_API int tsct_cutlass_nvfp4_grouped_sm120_bf16(int64_t num_groups, const int32_t* problem_nmk,
                                                   const uint64_t* ptr_w, const uint64_t* ptr_w_sf,
                                                   const uint64_t* ptr_x, const uint64_t* ptr_x_sf,
                                                   const uint64_t* ptr_out, const float* alpha, void* workspace,
                                                   uint64_t workspace_bytes, int sm_count, void* stream);

/* Host-only introspection of the compiled configuration, for the CPU tests (no CUDA call):
 * out[0..n) = { tile M, tile N, tile K, pipeline stages, shared-memory bytes of one CTA,
 *               sizeof(problem shape), 1 if a problem shape is laid out as int32 {M, N, K} else 0,
 *               CUTLASS_MAJOR*100 + CUTLASS_MINOR, threads per CTA, prep workspace bytes per group }. */
TSCT_API int tsct_cutlass_nvfp4_grouped_sm120_config(int64_t* out, int n);

/* Host-only: byte offsets that CUTLASS's own scale-factor layout (Sm1xxBlockScaledConfig, built with
 * tile_atom_to_shape_SFA/SFB for the problem (m, n, k)) gives scale (row, kb), kb = k/16 index:
 * which = 0: SFA, rows [0, m); which = 1: SFB, rows [0, n). out is row-major [rows, k/16]. */
TSCT_API int tsct_cutlass_nvfp4_sf_offsets_sm120(int which, int m, int n, int k, int64_t* out);

#ifdef __cplusplus
}
#endif

#endif /* TSCT_CUTLASS_H_ */
