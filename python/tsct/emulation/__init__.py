"""tsct.emulation: torch emulations of kernels that cannot run here (sm_120 NVFP4 tensor cores).

    nvfp4_mma.py    the block-scaled m16n8k64 GEMM math and the kernels' operand addressing
    plan.py         host-side launch preparation for the grouped kernels (tile map, scale offsets,
                    workspace sizes, gate/up interleave, alpha folding); sync-free, device-agnostic
    grouped_glu.py  the W4A4 grouped GLU through the two emulated kernels, end to end
    sign_glu.py     the same with 1-bit sign factors (sign kernels; a folded into the activation)

An emulation is an oracle for tests and for comparing fast paths, never a fast path itself, and
agreement with it is "emulated", not "verified on sm_120" (design.md section 6, docs/sm120.md).
Importing this package loads no native library and queries no device.
"""

from tsct.emulation import plan
from tsct.emulation.grouped_glu import grouped_glu_w4a4, prepare_glu_factors, quantize_rows_grouped
from tsct.emulation.nvfp4_mma import (block_scaled_mma, dense_gemm_emulated, grouped_gemm_emulated,
                                      grouped_sign_gemm_emulated, sign_bits_to_codes)
from tsct.emulation.sign_glu import grouped_glu_w4a4_sign, prepare_sign_glu_factors, quantize_scaled_rows

__all__ = ["plan", "block_scaled_mma", "dense_gemm_emulated", "grouped_gemm_emulated", "grouped_glu_w4a4",
           "prepare_glu_factors", "quantize_rows_grouped", "grouped_sign_gemm_emulated", "sign_bits_to_codes",
           "grouped_glu_w4a4_sign", "prepare_sign_glu_factors", "quantize_scaled_rows"]
