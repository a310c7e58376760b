// Per-item bodies of the grouped activation quantizer (rows_grouped.cu), shared with the host harness
// (tools/host_rows_grouped.cpp) so the CPU tests run the exact indexing and arithmetic of the GPU.
//
// What it computes (docs/decisions/0002 recipe, docs/sm120.md "activation quantizer"): routed rows
// sorted by expert (offs = int32 cumulative END offsets, as torch grouped_mm), each expert's rows
// NVFP4-quantized as ONE matrix [m_e, K] with its own encode scale s_enc[e] = 2688 / amax_e (amax over
// the expert's finite |x|; 1 for an expert with no rows or amax 0), codes row-major [m_alloc, K/2]
// at the routed row, block scales in the swizzled_128x4 layout per expert, rows padded to 128, the
// block of expert e starting at byte sfa_offsets[e] = sum_{j<e} pad128(m_j) * Kbp.
// Optional: gather (routed row i reads x[gather[i]]) and a per-expert column scale (row i of expert e
// is multiplied in fp32 by col_scale[e, :] before quantizing: the sign path's x * a[e]).
#pragma once

#include <stdint.h>

#include "common/formats.cuh"
#include "quant/quant_impl.cuh"

namespace tsct {
namespace quant {

struct RowsGroupedArgs {
  const void* x;              // [x_rows, k] of T
  int64_t x_rows;             // rows of x (bounds the gather)
  const int64_t* gather;      // [m] or nullptr
  const int32_t* offs;        // [num_experts]
  const float* col_scale;     // [num_experts, k] or nullptr
  int64_t num_experts, m, m_alloc, k, kb, kbp;
  uint8_t* codes;             // [m_alloc, k/2]
  uint8_t* sfa;               // [sfa_bytes]
  int64_t sfa_bytes;
  int32_t* sfa_offsets;       // [num_experts]
  float* s_enc;               // [num_experts]; holds the amax bits (uint32) between the passes
  int vec;                    // x 16-byte aligned (rows are, since k % 16 == 0): 128-bit loads
};

// The arguments of tsct_nvfp4_quantize_rows_grouped (tsct.h) as RowsGroupedArgs: the CUDA entry
// (rows_grouped.cu) and the host harness (tools/host_rows_grouped.cpp) both fill it here. k must be a
// multiple of 16 (the entry checks); vec: x is 16-byte aligned, so 128-bit loads (the harness passes false).
inline RowsGroupedArgs make_rows_grouped_args(const void* x, int64_t x_rows, int64_t k, const int64_t* gather,
                                              const int32_t* offs, int64_t num_experts, int64_t m,
                                              const float* col_scale, int64_t m_alloc, uint8_t* codes, uint8_t* sfa,
                                              int64_t sfa_bytes, int32_t* sfa_offsets, float* s_enc, bool vec) {
  RowsGroupedArgs a = {};
  a.x = x;
  a.x_rows = x_rows;
  a.gather = gather;
  a.offs = offs;
  a.col_scale = col_scale;
  a.num_experts = num_experts;
  a.m = m;
  a.m_alloc = m_alloc;
  a.k = k;
  a.kb = k / tsct::fmt::kNvfp4Block;
  a.kbp = tsct::fmt::round_up(a.kb, 4);
  a.codes = codes;
  a.sfa = sfa;
  a.sfa_bytes = sfa_bytes;
  a.sfa_offsets = sfa_offsets;
  a.s_enc = s_enc;
  a.vec = vec ? 1 : 0;
  return a;
}

// Expert of routed row `row` (first e with offs[e] > row), its first row, and whether the row is a
// real row of that expert. Rows at or past min(offs[E-1], m) are padding. Never reads out of bounds,
// whatever offs holds (the caller validates it: non-decreasing, offs[E-1] <= m).
TSCT_HD bool expert_of_row(const RowsGroupedArgs& a, int64_t row, int64_t* e_out, int64_t* local_out) {
  if (row < 0 || row >= a.m || a.num_experts <= 0) return false;
  int64_t lo = 0, hi = a.num_experts;  // upper_bound
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(a.offs[mid]) > row) hi = mid; else lo = mid + 1;
  }
  if (lo >= a.num_experts) return false;
  const int64_t start = lo > 0 ? static_cast<int64_t>(a.offs[lo - 1]) : 0;
  if (row < start) return false;  // non-monotone offs: never in this expert
  *e_out = lo;
  *local_out = row - start;
  return true;
}

// The 16 fp32 inputs of block (row, kbi): x[src] (times col_scale[e] if given). A gather index out
// of [0, x_rows) yields NaNs: the block is visibly poisoned (NaN scale), never a wild read.
template <typename T>
TSCT_HD void load_row_block(const RowsGroupedArgs& a, int64_t row, int64_t e, int64_t kbi,
                            float (&v)[fmt::kNvfp4Block]) {
  const int64_t src = a.gather ? a.gather[row] : row;
  if (src < 0 || src >= a.x_rows) {
TSCT_UNROLL
    for (int i = 0; i < fmt::kNvfp4Block; ++i) v[i] = fmt::u2f(0x7FC00000u);
    return;
  }
  load_f32<T, fmt::kNvfp4Block>(static_cast<const T*>(a.x) + src * a.k + kbi * fmt::kNvfp4Block, a.vec != 0, v);
  if (a.col_scale) {
    const float* cs = a.col_scale + e * a.k + kbi * fmt::kNvfp4Block;
TSCT_UNROLL
    for (int i = 0; i < fmt::kNvfp4Block; ++i) v[i] = fmt::mul_rn(v[i], cs[i]);
  }
}

// Pass 1, item t over (m, kb): the block's finite amax as uint32 bits (order-preserving for values
// >= 0), or 0, and its expert (-1 for padding). The kernel max-reduces the bits into s_enc[e].
template <typename T>
TSCT_HD uint32_t rows_amax_item(const RowsGroupedArgs& a, int64_t t, int64_t* e_out) {
  const int64_t kbi = t % a.kb;
  const int64_t row = t / a.kb;
  int64_t e, local;
  *e_out = -1;
  if (!expert_of_row(a, row, &e, &local)) return 0;
  float v[fmt::kNvfp4Block];
  load_row_block<T>(a, row, e, kbi, v);
  float amax = 0.0f;
TSCT_UNROLL
  for (int i = 0; i < fmt::kNvfp4Block; ++i) {
    const float m = fmt::abs_f(v[i]);
    if (fmt::is_finite(v[i]) && m > amax) amax = m;
  }
  *e_out = e;
  return fmt::f2u(amax);
}

// Pass 2 (one thread): amax bits -> s_enc in place (0002 steps 1-2, exactly as
// tsct.quant.nvfp4.nvfp4_encode_scale), and the per-expert scale-block offsets (as
// tsct.emulation.plan.sfa_layout: counts clamped at 0, rows padded to 128).
TSCT_HD void rows_finalize(const RowsGroupedArgs& a) {
  int64_t off = 0;
  int64_t prev = 0;
  for (int64_t e = 0; e < a.num_experts; ++e) {
    const float amax = fmt::u2f(fmt::f2u(a.s_enc[e]));
    float s = 1.0f;
    if (amax != 0.0f) {
      s = fmt::div_rn(2688.0f, amax);  // 448 * 6
      if (!(s <= 3.4028234663852886e38f)) s = 3.4028234663852886e38f;  // inf -> FLT_MAX
    }
    a.s_enc[e] = s;
    a.sfa_offsets[e] = static_cast<int32_t>(off);
    const int64_t end = a.offs[e];
    const int64_t count = end - prev > 0 ? end - prev : 0;
    prev = end;
    off += fmt::round_up(count, 128) * a.kbp;
  }
}

// Pass 3, item t over (m_alloc, kb): quantize block (row, kbi) with s_enc[e(row)], write its 8 code
// bytes and its scale byte; padding rows (and rows past m) get zero codes. Scale padding stays as
// the entry point's memset left it (0).
template <typename T>
TSCT_HD void rows_quantize_item(const RowsGroupedArgs& a, int64_t t) {
  const int64_t kbi = t % a.kb;
  const int64_t row = t / a.kb;
  uint8_t packed[fmt::kNvfp4Block / 2] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t e, local;
  if (expert_of_row(a, row, &e, &local)) {
    float v[fmt::kNvfp4Block];
    load_row_block<T>(a, row, e, kbi, v);
    uint8_t sf;
    fmt::nvfp4_quantize_block(v, a.s_enc[e], &sf, packed);
    const int64_t so = static_cast<int64_t>(a.sfa_offsets[e]) + fmt::swizzled_offset(local, kbi, a.kbp);
    if (so >= 0 && so < a.sfa_bytes) a.sfa[so] = sf;  // always true for valid offs
  }
  uint8_t* c = a.codes + row * (a.k / 2) + kbi * (fmt::kNvfp4Block / 2);
#if defined(__CUDA_ARCH__)
  uint2 w;
  memcpy(&w, packed, 8);
  *reinterpret_cast<uint2*>(c) = w;  // codes is 8-byte aligned (checked by the entry point)
#else
  for (int i = 0; i < fmt::kNvfp4Block / 2; ++i) c[i] = packed[i];
#endif
}

}  // namespace quant
}  // namespace tsct
