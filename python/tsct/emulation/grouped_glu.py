"""Emulated sm_120 W4A4 grouped GLU: the two grouped NVFP4 GEMMs with their epilogues, end to end.

    z = silu((Xq @ Wg_q) * s_gate) * ((Xq @ Wu_q) * s_up)     kernel 1: grouped, epilogue "glu"
    Y = (Zq @ Wd_q) * row_weight                              kernel 2: grouped, epilogue "row_weight"

Xq: the routed rows quantized to NVFP4 per expert (TE recipe, one s_enc per expert over its rows);
Zq: z (bf16, as kernel 1 writes it) quantized the same way; factors quantized per expert
(``tsct.quant``). Operands are laid out exactly as the kernels take them (``plan.py``), and the
GEMMs run through ``nvfp4_mma.grouped_gemm_emulated``. No gather/scatter: ``[M, d]`` -> ``[M, f]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from tsct.emulation import plan as _plan
from tsct.emulation.nvfp4_mma import grouped_gemm_emulated
from tsct.quant.layout import to_swizzled
from tsct.quant.nvfp4 import NVFP4Tensor, quantize_nvfp4

__all__ = ["QuantizedRows", "quantize_rows_grouped", "dequantize_rows_grouped", "GluFactors",
           "prepare_glu_factors", "grouped_glu_w4a4"]


@dataclass
class QuantizedRows:
    """Activations as the grouped kernel reads them: codes ``[M_alloc, K/2]``, per-expert swizzled
    scales in one flat buffer at ``sfa_offsets[e]``, encode scales ``s_enc [E]``."""
    codes: Tensor
    sfa: Tensor
    sfa_offsets: Tensor
    s_enc: Tensor
    m: int
    k: int


def quantize_rows_grouped(x: Tensor, offs: Tensor, tile_m: int) -> QuantizedRows:
    """Quantize rows ``x [M, K]`` (sorted by expert) to NVFP4 with one s_enc per expert (emulation: host loop)."""
    m, k = x.shape
    e_count = offs.shape[0]
    sfa_offsets, padded = _plan.sfa_layout(offs, k)
    codes = torch.zeros(_plan.a_rows_alloc(m, tile_m), k // 2, dtype=torch.uint8)
    sfa = torch.zeros(max(_plan.sfa_bytes_bound(m, e_count, k), 1), dtype=torch.uint8)
    s_enc = torch.ones(e_count, dtype=torch.float32)
    bounds = [0] + offs.tolist()
    for e in range(e_count):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        q = quantize_nvfp4(x[lo:hi].t(), layout="swizzled_128x4", backend="torch")  # logical [K, m_e]
        codes[lo:hi] = q.codes[0]
        sw = q.block_scale[0].view(torch.uint8)  # [pad128(m_e) * Kbp]
        o = int(sfa_offsets[e])
        assert sw.numel() == int(padded[e]) * (-(-(k // 16) // 4) * 4)
        sfa[o:o + sw.numel()] = sw
        s_enc[e] = q.global_scale[0]
    return QuantizedRows(codes=codes, sfa=sfa.view(torch.float8_e4m3fn), sfa_offsets=sfa_offsets, s_enc=s_enc,
                         m=m, k=k)


def dequantize_rows_grouped(q: QuantizedRows, offs: Tensor) -> Tensor:
    """fp32 ``[M, K]``: what the quantized rows represent (through the swizzled addressing)."""
    from tsct.emulation.nvfp4_mma import decode_codes, gather_scales_swizzled

    out = torch.zeros(q.m, q.k, dtype=torch.float32)
    bounds = [0] + offs.tolist()
    for e in range(offs.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        vals = decode_codes(q.codes[lo:hi]).reshape(hi - lo, q.k // 16, 16)
        sf = gather_scales_swizzled(q.sfa, int(q.sfa_offsets[e]), torch.arange(hi - lo), q.k)
        out[lo:hi] = torch.div(vals * sf.unsqueeze(-1), q.s_enc[e]).reshape(hi - lo, q.k)
    return out


@dataclass
class GluFactors:
    """The three factors as the kernels take them, plus their NVFP4 containers (for dequantizing)."""
    gu_codes: Tensor  # [E, 2r, d/2], rows interleaved gate/up
    gu_sfb: Tensor  # [E, Np*Kbp] swizzled
    gate: NVFP4Tensor
    up: NVFP4Tensor
    down: NVFP4Tensor  # logical [E, r, f]: codes [E, f, r/2]
    down_sfb: Tensor  # [E, Np*Kbp] swizzled


def prepare_glu_factors(w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> GluFactors:
    """Quantize dense factors (``[E, d, r]``, ``[E, d, r]``, ``[E, r, f]``) and lay them out for the kernels."""
    gate = quantize_nvfp4(w_gate, layout="linear", backend="torch")
    up = quantize_nvfp4(w_up, layout="linear", backend="torch")
    down = quantize_nvfp4(w_down, layout="swizzled_128x4", backend="torch")
    gu_codes = _plan.interleave_rows(gate.codes, up.codes)
    gu_lin = _plan.interleave_rows(gate.block_scale.view(torch.uint8), up.block_scale.view(torch.uint8))
    gu_sfb = to_swizzled(gu_lin.view(torch.float8_e4m3fn))
    return GluFactors(gu_codes=gu_codes, gu_sfb=gu_sfb, gate=gate, up=up, down=down, down_sfb=down.block_scale)


def grouped_glu_w4a4(x: Tensor, offs: Tensor, factors: GluFactors, s_gate: Optional[Tensor] = None,
                     s_up: Optional[Tensor] = None, row_weight: Optional[Tensor] = None, *, tile_m: int = 32,
                     return_intermediates: bool = False):
    """The emulated fp4 path: ``x [M, d]`` rows sorted by expert -> ``[M, f]`` bf16 (padding rows 0)."""
    m, d = x.shape
    r = factors.gate.n
    f = factors.down.n
    p1 = _plan.make_plan(offs, m, 2 * r, d, tile_m=tile_m, tile_n=2 * r)
    xq = quantize_rows_grouped(x.float(), offs, tile_m)
    ep0, ep1 = _plan.glu_scales(factors.gate.global_scale, factors.up.global_scale, s_gate, s_up, r)
    z = grouped_gemm_emulated(xq.codes, xq.sfa, xq.sfa_offsets, factors.gu_codes, factors.gu_sfb, offs,
                              p1.tile_expert, p1.tile_row, tile_m, _plan.alpha_from_encode_scales(xq.s_enc),
                              epilogue="glu", ep0=ep0, ep1=ep1, out_dtype=torch.bfloat16, m_out=m)
    p2 = _plan.make_plan(offs, m, f, r, tile_m=tile_m, tile_n=32)
    zq = quantize_rows_grouped(z.float(), offs, tile_m)
    rw = row_weight.float() if row_weight is not None else torch.ones(m, dtype=torch.float32)
    y = grouped_gemm_emulated(zq.codes, zq.sfa, zq.sfa_offsets, factors.down.codes, factors.down_sfb, offs,
                              p2.tile_expert, p2.tile_row, tile_m,
                              _plan.alpha_from_encode_scales(zq.s_enc, factors.down.global_scale),
                              epilogue="row_weight", ep0=rw, out_dtype=torch.bfloat16, m_out=m)
    if return_intermediates:
        return y, {"xq": xq, "z": z, "zq": zq, "plan1": p1, "plan2": p2}
    return y
