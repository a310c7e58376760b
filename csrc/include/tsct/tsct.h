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
 * Formats and arithmetic: docs/decisions/0002-nvfp4-recipe.md, 0021-fp8-format.md, 0022-ternary-format.md
 * (bit-exact with python/tsct/quant).
 */
#ifndef TSCT_TSCT_H_
#define TSCT_TSCT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSCT_ABI_VERSION 14 /* 2: the Triton AOT launcher (tsct_triton_*); 3: the grouped activation quantizer
                              (tsct_nvfp4_quantize_rows_grouped) and the sm_120 CuTeDSL entries (tsct_sm120_*);
                              4: the CUTLASS C++ sm_120 grouped NVFP4 GEMM entries;
                              5: the grouped GLU backward kernel tsct_glu_bwd_dz_bf16;
                              6: the low-bit grouped GLU projections tsct_glu_{down,up}_fwd_{nvfp4,sign};
                              tsct_kernel_smem_bytes; 7: tsct_glu_down_fwd_{nvfp4,sign} take s_gate / s_up
                              in bf16 or fp32 (scales_bf16); tsct_stream_capture_id;
                              8: the CUTLASS C++ entries of 4 removed (docs/retired.md);
                              9: tsct_glu_bwd_dz_bf16 on the row tiles of a tile map (tile_cum, max_tiles),
                              dW only for experts of at most 64 rows;
                              10: the FP8 and ternary formats (tsct_fp8_*, tsct_ternary_*);
                              11: tsct_glu_bwd_dz_bf16 on expert-major row tiles (xtile_cum: tiles past each
                              expert's first), dW also for an empty expert (zeros);
                              12: the low-bit GLU projections for FP8 and ternary factors
                              tsct_glu_{down,up}_fwd_{fp8,ternary};
                              13: tsct_glu_bwd_dz_bf16 takes its pipeline stages (3 or 4);
                              14: tsct_glu_bwd_dz_bf16 without stages (one 4-stage build) */

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
  TSCT_ERR_NO_CUDA = -2,      /* built without CUDA */
  TSCT_ERR_NOT_BUILT = -3     /* this library was built without the kernel (e.g. TSCT_CUTEDSL=OFF) */
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
/* *bytes = the dynamic shared memory per block the library's entry point launches the named kernel with (0 for
 * the grid-stride kernels); a host-side table read, no CUDA call. An unknown name is TSCT_ERR_BAD_ARGUMENT. */
TSCT_API int tsct_kernel_smem_bytes(const char* kernel_name, int* bytes);
/* *capture_id = the id of the CUDA graph capture active on stream (cudaStreamGetCaptureInfo), 0 when none;
 * the cudaError_t when the query fails (then *capture_id = 0). Host-side, no launch. */
TSCT_API int tsct_stream_capture_id(void* stream, unsigned long long* capture_id);

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
/* FP8 quantize: codes [batch, n, k] E4M3 bytes = E4M3(x / scale_n[b, n]), round to nearest even, saturating at
 * +-448; 0x7F for a non-finite x. scale_n: [batch, n] fp32 decode scales (the caller's: amax / 448 per row, see
 * 0021). Any k. */
TSCT_API int tsct_fp8_quantize(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_n,
                               uint8_t* codes, void* stream);
/* FP8 decode: out[b, n, k] = e4m3(codes[b, n, k]) * scale_n[b, n], then out_dtype (RNE). */
TSCT_API int tsct_fp8_dequantize(const uint8_t* codes, const float* scale_n, int64_t batch, int64_t n, int64_t k,
                                 void* out, int out_dtype, void* stream);
/* Ternary pack: codes [batch, n, k/4], element 4i+j in bits 2j..2j+1 of byte i; 2-bit code of x for
 * gamma = scale_k[b, k] * scale_n[b, n] (scale_k null: gamma = scale_n[b, n]): 0b10 if x is not finite, else
 * 0b00 if gamma == 0 or |x / gamma| <= 1/2, else 0b01 (x / gamma > 0) or 0b11. k % 4 == 0. */
TSCT_API int tsct_ternary_pack(const void* x, int x_dtype, int64_t batch, int64_t n, int64_t k, const float* scale_k,
                               const float* scale_n, uint8_t* codes, void* stream);
/* Ternary decode: out[b, n, k] = (q * scale_k[b, k]) * scale_n[b, n] (scale_k null: q * scale_n[b, n]),
 * q = 0 / +1 / NaN / -1 for codes 0b00 / 0b01 / 0b10 / 0b11, then out_dtype (RNE). */
TSCT_API int tsct_ternary_dequantize(const uint8_t* codes, const float* scale_k, const float* scale_n, int64_t batch,
                                     int64_t n, int64_t k, void* out, int out_dtype, void* stream);

/* NVFP4 quantize of routed activation rows grouped by expert: the A operand of the sm_120 grouped
 * block-scaled GEMMs (docs/sm120.md, "activation quantizer"). Recipe 0002, with ONE encode scale per
 * EXPERT over that expert's rows: s_enc[e] = min(2688 / amax_e, FLT_MAX), amax_e = max |v| over the
 * finite v of the expert's rows, s_enc[e] = 1 if amax_e == 0 or the expert has no rows. The GEMM
 * epilogue then multiplies by alpha[e] = 1 / (s_enc[e] * s_enc_factor[e]) (one scalar per group).
 *   x: [x_rows, k] of x_dtype; routed row i (0 <= i < m) reads x[gather_idx[i]] (int64 [m]), or x[i] if
 *      gather_idx is NULL (then x_rows >= m). A gather index outside [0, x_rows) poisons its blocks (NaN
 *      scale byte 0x7F, zero codes) instead of reading out of bounds.
 *   offs: int32 [num_experts] cumulative END offsets of the routed rows (torch grouped_mm), non-decreasing,
 *      offs[E-1] <= m (the caller checks; other values never cause out-of-bounds accesses). Rows at or
 *      past offs[E-1] are padding.
 *   col_scale: fp32 [num_experts, k] or NULL: row i of expert e is multiplied (fp32, RNE) by col_scale[e]
 *      before quantizing (the sign path's x * a[e]); the amax is taken of the products.
 * Outputs: codes [m_alloc, k/2] (8-byte aligned; padding rows and rows in [m, m_alloc) are 0);
 *   sfa: sfa_bytes bytes, expert e's block scales at byte sfa_offsets[e] = sum_{j<e} pad128(m_j)*Kbp in
 *   the swizzled_128x4 layout of an [pad128(m_e), Kbp] matrix (Kbp = ceil(k/64)*4); every other byte 0.
 *   sfa_bytes >= sum_e pad128(m_e)*Kbp (tsct.emulation.plan.sfa_bytes_bound) and <= INT32_MAX;
 *   sfa_offsets: int32 [num_experts]; s_enc: fp32 [num_experts]. k % 16 == 0. Stream-ordered, no host sync. */
TSCT_API int tsct_nvfp4_quantize_rows_grouped(const void* x, int x_dtype, int64_t x_rows, int64_t k,
                                              const int64_t* gather_idx, const int32_t* offs, int64_t num_experts,
                                              int64_t m, const float* col_scale, int64_t m_alloc, uint8_t* codes,
                                              uint8_t* sfa, int64_t sfa_bytes, int32_t* sfa_offsets, float* s_enc,
                                              void* stream);

/* ---- grouped GLU backward: the up projection's two gradient GEMMs (csrc/glu/dz_bf16.cu) ----
 * For the bf16 grouped GLU with rank r = 64 and w_down stored K-major (design.md section 2; the Triton path's
 * glu_bwd_dz, rewritten in CUDA because odd f leaves dY rows 2-byte aligned):
 *   dz_part[s, i, k] = sum_{n in f-slice s} grad_out[sidx(i), n] * w_down_t[e(i), n, k]   fp32 [slices, m, 64]
 *   dw_down_t[e, n, k] = sum_{i in expert e} grad_out[sidx(i), n] * zw[i, k]              bf16 [E, f, 64]
 * One CTA per (row tile, f-slice), the tiles numbered expert-major: tile e < num_experts is expert e's first
 * (none of its rows for an empty expert), tile num_experts + j the j-th tile past the experts' first ones;
 * xtile_cum int32 [num_experts] holds the inclusive counts per expert of its 64-row tiles past the first (sum of
 * max(ceil(rows_e / 64) - 1, 0)) and max_tiles >= num_experts + its last entry (the grid's bound, e.g.
 * ceil(m / 64) + num_experts). dw_down_t is written only for the experts of 0 to 64 rows (their first tile holds
 * all their rows; zeros for an empty expert, whose w_down is not read); the other experts' blocks (more than 64
 * rows) are left as they are: the caller reduces them over row chunks. grad_out: bf16 [grad_rows, f];
 * scatter_idx: int64 [m] (routed row i reads grad_out row scatter_idx[i]; an index outside [0, grad_rows) reads a
 * zero row) or NULL (row i reads row i); offs: int32 [num_experts] cumulative END offsets (non-decreasing,
 * offs[E-1] <= m); w_down_t: bf16 [E, f, 64]; zw: bf16 [m, 64] (z times the row weight). Slice s covers the
 * 64-column steps [s*n/S, (s+1)*n/S) of n = ceil(f/64); the caller sums the slices (fixed order: deterministic).
 * Rows at or past offs[E-1] are not written; dw_down_t may be NULL (not computed). r must be 64,
 * 1 <= slices <= min(16, ceil(f/64)), max_tiles * slices < 2^31; grad_out, w_down_t, zw, dz_part, dw_down_t
 * 16-byte aligned, scatter_idx 8-byte, offs and xtile_cum 4-byte; grad_out may be NULL when grad_rows == 0;
 * nothing is launched when m, num_experts or max_tiles is 0. The kernel (tsctk_glu_bwd_dz_bf16) needs
 * 101,376 bytes of shared memory per block (sm_80, sm_90, sm_100, sm_120); a device with less gives
 * cudaErrorInvalidConfiguration with a detail. Stream-ordered, no host sync. */
TSCT_API int tsct_glu_bwd_dz_bf16(const void* grad_out, int64_t grad_rows, int64_t f, const int64_t* scatter_idx,
                                  const int32_t* offs, const int32_t* xtile_cum, int64_t num_experts, int64_t m,
                                  int64_t max_tiles, const void* w_down_t, const void* zw, int64_t r, int64_t slices,
                                  float* dz_part, void* dw_down_t, void* stream);

/* ---- low-bit grouped GLU forward: the down projection with NVFP4 w_gate / w_up (csrc/glu/down_nvfp4.cu) ----
 * For routed row i of expert e (rows sorted by expert; design.md section 2) with x row xi = x[gather_idx[i]] (or
 * x[i] when gather_idx is NULL) and W_hat = e2m1 * block scale / s_enc (docs/decisions/0002):
 *   hg[i, :] = xi @ W_gate_hat[e],  hu[i, :] = xi @ W_up_hat[e]                           fp32 [m, 64]
 *   z[i, :]  = silu(hg * s_gate[e]) * (hu * s_up[e]) * row_weight[i]                       bf16 [m, 64]
 * (a NULL s_gate / s_up / row_weight is 1; s_gate / s_up [E, 64] are fp32, or bf16 when scales_bf16 is 1, and
 * are widened to fp32 exactly). x: bf16 rows of stride_x elements (a multiple of 8), x_rows rows;
 * offs: int32 [num_experts] cumulative END offsets (non-decreasing, offs[E-1] <= m); tile_cum: int32
 * [num_experts] inclusive counts of 64-row tiles per expert (sum of ceil(rows_e / 64)), max_tiles >= its last
 * entry (the grid; extra CTAs exit). Factor e of gate / up: codes u8 [E, 64, d/2] (the [E, d, 64] factor stored
 * N-major, K-contiguous, even k in the low nibble), scales raw UE4M3 bytes [E, 64, d/16] (linear layout),
 * s_enc fp32 [E]. hg / hu: both NULL (not written) or both given. Rows at or past offs[E-1] are not written.
 * r must be 64, d a positive multiple of 64; x and the codes 16-byte aligned, gather_idx 8-byte, the rest
 * 4-byte (z and bf16 scales 2-byte). gather_idx entries are not checked (the caller validates them). Needs
 * 71,680 bytes of shared memory per block: else cudaErrorInvalidConfiguration with a detail. Stream-ordered, no
 * host sync. */
TSCT_API int tsct_glu_down_fwd_nvfp4(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx,
                                     const int32_t* offs, const int32_t* tile_cum, int64_t num_experts, int64_t m,
                                     int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                                     const float* gate_s_enc, const void* up_codes, const void* up_scales,
                                     const float* up_s_enc, const void* s_gate, const void* s_up,
                                     int32_t scales_bf16, const float* row_weight, void* z, float* hg, float* hu,
                                     int64_t max_tiles, void* stream);
/* The same with sign w_gate / w_up (docs/formats.md; W = (+-1) a[k] b[n]): gate_codes / up_codes are the bits u8
 * [E, 64, d/8] (8-byte aligned), gate_scales / up_scales are a fp32 [E, d] (16-byte aligned), gate_s_enc / up_s_enc
 * are b fp32 [E, 64]. +-a[k] is rounded to bf16 before the product (the Triton path's rounding); b scales hg / hu. */
TSCT_API int tsct_glu_down_fwd_sign(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx,
                                    const int32_t* offs, const int32_t* tile_cum, int64_t num_experts, int64_t m,
                                    int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                                    const float* gate_s_enc, const void* up_codes, const void* up_scales,
                                    const float* up_s_enc, const void* s_gate, const void* s_up,
                                    int32_t scales_bf16, const float* row_weight, void* z, float* hg, float* hu,
                                    int64_t max_tiles, void* stream);
/* The same with FP8 w_gate / w_up (docs/decisions/0021-fp8-format.md; W = e4m3 * scale_n[n]): gate_codes / up_codes
 * are the E4M3 codes as bytes u8 [E, 64, d] (16-byte aligned), gate_scales / up_scales must be NULL, gate_s_enc /
 * up_s_enc are scale_n fp32 [E, 64]. e4m3 is exact in bf16 (the codes 0x7F / 0xFF are NaN); scale_n scales hg / hu.
 * Needs 67,584 bytes of shared memory per block. */
TSCT_API int tsct_glu_down_fwd_fp8(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx,
                                   const int32_t* offs, const int32_t* tile_cum, int64_t num_experts, int64_t m,
                                   int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                                   const float* gate_s_enc, const void* up_codes, const void* up_scales,
                                   const float* up_s_enc, const void* s_gate, const void* s_up, int32_t scales_bf16,
                                   const float* row_weight, void* z, float* hg, float* hu, int64_t max_tiles,
                                   void* stream);
/* The same with ternary w_gate / w_up (docs/decisions/0022-ternary-format.md; W = q * scale_n[n], or
 * (q * scale_k[k]) * scale_n[n] with the rank-1 scaling; q = 0 / +1 / NaN / -1 for the codes 0b00 / 0b01 / 0b10 /
 * 0b11): gate_codes / up_codes are the codes u8 [E, 64, d/4] (16-byte aligned), gate_scales / up_scales both NULL
 * (absmean scaling) or both scale_k fp32 [E, d] (16-byte aligned), gate_s_enc / up_s_enc scale_n fp32 [E, 64].
 * q * scale_k[k] is rounded to bf16 before the product (the Triton path's rounding); scale_n scales hg / hu. Needs
 * 75,776 bytes of shared memory per block. */
TSCT_API int tsct_glu_down_fwd_ternary(const void* x, int64_t x_rows, int64_t stride_x, const int64_t* gather_idx,
                                       const int32_t* offs, const int32_t* tile_cum, int64_t num_experts, int64_t m,
                                       int64_t d, int64_t r, const void* gate_codes, const void* gate_scales,
                                       const float* gate_s_enc, const void* up_codes, const void* up_scales,
                                       const float* up_s_enc, const void* s_gate, const void* s_up,
                                       int32_t scales_bf16, const float* row_weight, void* z, float* hg, float* hu,
                                       int64_t max_tiles, void* stream);

/* ---- low-bit grouped GLU forward: the up projection with an NVFP4 w_down (csrc/glu/up_nvfp4.cu) ----
 *   y[i, n] = (z[i] @ W_down_hat[e])[n] * row_weight[i]      bf16 [m, ldy], n < f; columns [f, ldy) get the same
 *   product with zero weights ((z[i] . 0) * row_weight[i]: 0 for finite z and row weights)
 * z: bf16 [m, 64] (rows sorted by expert); offs, tile_cum, max_tiles as for tsct_glu_down_fwd_nvfp4 (64-row tiles);
 * w_down [E, 64, f] stored N-major: codes u8 [E, f, 32], scales raw UE4M3 bytes [E, f, 4] (linear), s_enc fp32 [E];
 * row_weight fp32 [m] or NULL (1). y: ldy >= f, a multiple of 8, below 2^31 - 64. Rows at or past offs[E-1] are not written. r must be
 * 64; z, the codes and y 16-byte aligned, the rest 4-byte. Needs 53,248 bytes of shared memory per block.
 * Stream-ordered, no host sync. */
TSCT_API int tsct_glu_up_fwd_nvfp4(const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum,
                                   int64_t num_experts, int64_t f, int64_t r, const void* codes, const void* scales,
                                   const float* s_enc, const float* row_weight, void* y, int64_t ldy, int64_t max_tiles,
                                   void* stream);
/* The same with a sign w_down: codes = bits u8 [E, f, 8] (8-byte aligned), scales = a fp32 [E, 64] (16-byte
 * aligned), s_enc = b fp32 [E, f]: y = ((z @ (+-bf16(a)))[n] * b[n]) * row_weight. */
TSCT_API int tsct_glu_up_fwd_sign(const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum,
                                  int64_t num_experts, int64_t f, int64_t r, const void* codes, const void* scales,
                                  const float* s_enc, const float* row_weight, void* y, int64_t ldy, int64_t max_tiles,
                                  void* stream);
/* The same with an FP8 w_down: codes = E4M3 codes u8 [E, f, 64] (16-byte aligned), scales NULL, s_enc = scale_n
 * fp32 [E, f]: y = ((z @ e4m3)[n] * scale_n[n]) * row_weight. Needs 57,088 bytes of shared memory per block. */
TSCT_API int tsct_glu_up_fwd_fp8(const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum,
                                 int64_t num_experts, int64_t f, int64_t r, const void* codes, const void* scales,
                                 const float* s_enc, const float* row_weight, void* y, int64_t ldy, int64_t max_tiles,
                                 void* stream);
/* The same with a ternary w_down: codes u8 [E, f, 16] (16-byte aligned), scales NULL (absmean) or scale_k fp32
 * [E, 64] (16-byte aligned), s_enc = scale_n fp32 [E, f]: y = ((z @ bf16(q * scale_k))[n] * scale_n[n]) *
 * row_weight. Needs 49,152 bytes of shared memory per block. */
TSCT_API int tsct_glu_up_fwd_ternary(const void* z, int64_t m, const int32_t* offs, const int32_t* tile_cum,
                                     int64_t num_experts, int64_t f, int64_t r, const void* codes, const void* scales,
                                     const float* s_enc, const float* row_weight, void* y, int64_t ldy,
                                     int64_t max_tiles, void* stream);

/* ---- sm_120 NVFP4 grouped GEMMs: CuTeDSL kernels exported ahead of time (cutedsl/, decisions 0006, 0009) ----
 * Linked into this library when it was built with TSCT_CUTEDSL=ON (else every entry returns
 * TSCT_ERR_NOT_BUILT). sm_120a cubins only: they run on compute capability 12.0, not 12.1 (an sm_121a
 * build would be needed). The cubins are loaded (cudaLibraryLoadData) on the first call, never at load
 * time. NOT executed on any GPU yet (docs/sm120.md). */
enum tsct_sm120_variant {
  TSCT_SM120_NVFP4_ALPHA = 0,      /* tsct_nvfp4_grouped_alpha_sm120:     c = alpha[e] * acc */
  TSCT_SM120_NVFP4_GLU = 1,        /* tsct_nvfp4_grouped_glu_sm120:       c[:, j] = silu(g_j) * u_j, b rows interleaved */
  TSCT_SM120_NVFP4_ROW_WEIGHT = 2  /* tsct_nvfp4_grouped_rowweight_sm120: c = alpha[e] * acc * ep0[row] */
};
/* *built = 1 if the CuTeDSL kernels are linked in (host only: no CUDA call). */
TSCT_API int tsct_sm120_built(int* built);
/* One grouped NVFP4 GEMM (cutedsl/tsct_cutedsl/nvfp4_gemm_sm120.py, Nvfp4GemmSm120.grouped):
 *   a: E2M1 codes [m_alloc, k/2] bytes (routed rows sorted by expert; m_alloc >= offs[E-1] + 31);
 *   b: E2M1 codes [num_experts, n, k/2] (glu: n = 2r, rows 2j = gate j, 2j+1 = up j);
 *   sfa: sfa_bytes of per-expert swizzled UE4M3 scales at sfa_offsets[e] (tsct_nvfp4_quantize_rows_grouped);
 *   sfb: sfb_bytes = num_experts * pad128(n) * Kbp swizzled UE4M3 scales of b;
 *   c: bf16 [c_rows, c_cols] with row stride ldc elements (glu: c_cols = n/2); rows outside every expert
 *      are NOT written; offs int32 [E]; tile_expert/tile_row int32 [num_tiles] (tsct.emulation.plan.tile_map);
 *   alpha fp32 [E]; ep0/ep1 fp32 [ep_rows, ep_cols] with row stride ep_ld (glu: s_gate/s_up per rank divided
 *   by the factor's encode scale, [E, n/2]; row_weight: ep0 = row weights as [c_rows, 1] with ep_ld = 1, ep1
 *   = ep0; alpha: unused, pass any valid pair). k % 64 == 0; every size < 2^31. */
TSCT_API int tsct_sm120_nvfp4_grouped(int variant, const void* a, int64_t m_alloc, int64_t k, const void* b, int64_t n,
                                      int64_t num_experts, const void* sfa, int64_t sfa_bytes, const int32_t* sfa_offsets,
                                      const void* sfb, int64_t sfb_bytes, void* c, int64_t c_rows, int64_t c_cols,
                                      int64_t ldc, const int32_t* offs, const int32_t* tile_expert,
                                      const int32_t* tile_row, int64_t num_tiles, const float* alpha, const float* ep0,
                                      int64_t ep_rows, int64_t ep_cols, int64_t ep_ld, const float* ep1, void* stream);

/* One grouped sign GEMM (Nvfp4GemmSm120(sign=True).grouped_sign; 1-bit factor expanded to E2M1 +-1 in registers).
 * P = 2 copies for TSCT_SM120_SIGN_GLU (gate, up), else 1; every P-indexed operand has P outermost:
 *   a: [P, m_alloc, k/2] E2M1 codes of NVFP4(x * a_p[e]) (tsct_nvfp4_quantize_rows_grouped with col_scale);
 *   bits: [P, num_experts, n, k/8] (SignTensor.bits); sfa: [P, sfa_bytes] (copy p's expert e block at
 *   sfa_offsets[e], one offset table for every copy; sfa_bytes % 16 == 0); col_scale: fp32 [P, num_experts, n]
 *   (SignTensor.scale_n); alpha: fp32 [num_experts, P] (P contiguous: 1 / s_enc of copy p);
 *   c, offs, tile map, ep0/ep1 as for tsct_sm120_nvfp4_grouped (glu: c_cols = n, ep0/ep1 = s_gate/s_up [E, n]
 *   without encode scales; row_weight: ep0 = row weights [c_rows, 1], ep_ld = 1). k % 64 == 0. */
enum tsct_sm120_sign_variant {
  TSCT_SM120_SIGN_ALPHA = 0,      /* tsct_sign_grouped_alpha_sm120 */
  TSCT_SM120_SIGN_GLU = 1,        /* tsct_sign_grouped_glu_sm120 (P = 2) */
  TSCT_SM120_SIGN_ROW_WEIGHT = 2  /* tsct_sign_grouped_rowweight_sm120 */
};
TSCT_API int tsct_sm120_sign_grouped(int variant, const void* a, int64_t m_alloc, int64_t k, const void* bits, int64_t n,
                                     int64_t num_experts, const void* sfa, int64_t sfa_bytes, const int32_t* sfa_offsets,
                                     const float* col_scale, void* c, int64_t c_rows, int64_t c_cols, int64_t ldc,
                                     const int32_t* offs, const int32_t* tile_expert, const int32_t* tile_row,
                                     int64_t num_tiles, const float* alpha, const float* ep0, int64_t ep_rows,
                                     int64_t ep_cols, int64_t ep_ld, const float* ep1, void* stream);

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
