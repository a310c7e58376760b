"""Emulated sm_120 W4A4-sign grouped GLU: 1-bit sign factors on the NVFP4 tensor-core path.

design.md section 3: a sign factor is ``W ~ diag(a) sign(W) diag(b)`` (``tsct.quant.SignTensor``:
bits ``[E, N, K/8]``, ``a = scale_k [E, K]``, ``b = scale_n [E, N]``), so

    x @ W[e] = ((x * a[e]) @ sign(W[e])) * b[e]

and the sign kernel (``Nvfp4GemmSm120(sign=True)``) multiplies NVFP4 activations by E2M1 +-1 codes
with unit block scales, applying ``b`` per output column in the epilogue. Where each scale goes:

* ``b`` (over N): the kernel's epilogue, ``acc * b[e, n] * alpha[e]`` before the GLU / row_weight.
* ``a`` (over K): NOT in the kernel. It is folded into the activation BEFORE the activation's NVFP4
  quantization: the quantizer is given ``x_row * a[e(row)]`` for every routed row of expert e
  (``scale_rows_per_expert``), with one s_enc per expert over those products. Quantizing x first and
  multiplying later is impossible (the product must be an E2M1 code times a block scale).

What that costs. ``a`` differs per expert, so the quantized activation is per (expert, row): with
gathered rows that is the routed-row activation ``[M, K]`` (M = T * top_k), not the token-major
``[T, K]``. The NVFP4 path already quantizes per routed row (its s_enc is per expert), so for w_down
(activation z, per routed row anyway) nothing changes. For w_gate / w_up it is worse: the two
factors have their own ``a``, so the GLU kernel takes TWO quantized activations (``x * a_gate`` and
``x * a_up``) and runs two MMA chains. ``sign_kernel_glu_bytes`` counts it: at b1 (M = 32768 routed
rows, E = 1024, d = 2048) one copy is 32 MiB of codes plus at most 19.9 MiB of block scales (each
expert's rows padded to 128), so the sign GLU writes and then reads about 104 MiB of activation
operands where NVFP4 factors need 52 MiB (the gathered bf16 x would be 128 MiB, x itself 64 MiB).
A jointly fitted ``a`` for gate and up (one rank-1 fit of ``[|W_gate|, |W_up|]``) would need one
copy; tsct's sign quantizer fits each factor alone (decision 0002), so this emulation does too.

Pure torch; an oracle for tests, never a fast path (design.md section 6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from tsct.emulation import plan as _plan
from tsct.emulation.grouped_glu import QuantizedRows, quantize_rows_grouped
from tsct.emulation.nvfp4_mma import grouped_sign_gemm_emulated
from tsct.quant.sign import SignTensor, quantize_sign

__all__ = ["SignGluFactors", "prepare_sign_glu_factors", "scale_rows_per_expert", "quantize_scaled_rows",
           "grouped_glu_w4a4_sign", "sign_kernel_glu_bytes", "SIGN_GLU_TILE_N"]

SIGN_GLU_TILE_N = 64  # cutedsl/build.py: tsct_sign_grouped_glu_sm120 covers r = 64 in one tile


def scale_rows_per_expert(x: Tensor, offs: Tensor, a: Tensor) -> Tensor:
    """fp32 ``x[i, :] * a[e(i), :]`` for rows sorted by expert (``x [M, K]``, ``a [E, K]``): the
    activation quantizer's input for a sign factor with per-K scale ``a``. Rows past ``offs[-1]``
    (padding) give 0. Device-side (``searchsorted``), no host reads."""
    m = x.shape[0]
    rows = torch.arange(m, device=x.device, dtype=offs.dtype)
    e = torch.searchsorted(offs, rows, right=True)  # expert of each row; E for padding rows
    valid = e < offs.shape[0]
    a_rows = a.float()[e.clamp_max(max(offs.shape[0] - 1, 0))]
    return torch.where(valid.unsqueeze(1), x.float() * a_rows, torch.zeros((), device=x.device))


def quantize_scaled_rows(x: Tensor, offs: Tensor, a: Tensor, tile_m: int) -> QuantizedRows:
    """NVFP4 (TE recipe, one s_enc per expert) of ``x * a[e]``: what the sign kernel's A operand holds."""
    return quantize_rows_grouped(scale_rows_per_expert(x, offs, a), offs, tile_m)


@dataclass
class SignGluFactors:
    """The three sign factors and their kernel layouts (P outermost)."""
    gate: SignTensor  # logical [E, d, r]: bits [E, r, d/8]
    up: SignTensor
    down: SignTensor  # logical [E, r, f]: bits [E, f, r/8]
    gu_bits: Tensor  # [2, E, r, d/8]: gate, up
    gu_col: Tensor  # [2, E, r]: b of gate, up


def prepare_sign_glu_factors(w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> SignGluFactors:
    """Sign-quantize dense factors (``[E, d, r]``, ``[E, d, r]``, ``[E, r, f]``) and stack gate/up."""
    gate = quantize_sign(w_gate, backend="torch")
    up = quantize_sign(w_up, backend="torch")
    down = quantize_sign(w_down, backend="torch")
    return SignGluFactors(gate=gate, up=up, down=down, gu_bits=torch.stack((gate.bits, up.bits)),
                          gu_col=torch.stack((gate.scale_n, up.scale_n)))


def grouped_glu_w4a4_sign(x: Tensor, offs: Tensor, factors: SignGluFactors, s_gate: Optional[Tensor] = None,
                          s_up: Optional[Tensor] = None, row_weight: Optional[Tensor] = None, *, tile_m: int = 32,
                          return_intermediates: bool = False):
    """The emulated sign path: ``x [M, d]`` rows sorted by expert -> ``[M, f]`` bf16 (padding rows 0).

    Kernel 1 (``tsct_sign_grouped_glu_sm120``): A = NVFP4(x * a_gate[e]) and NVFP4(x * a_up[e]),
    B = sign bits of w_gate / w_up, epilogue ``z = silu(acc_g*b_g*alpha_g*s_gate) *
    (acc_u*b_u*alpha_u*s_up)``, z in bf16. Kernel 2 (``tsct_sign_grouped_rowweight_sm120``):
    A = NVFP4(z * a_down[e]), B = sign bits of w_down, ``Y = acc*b_down*alpha*row_weight``.
    """
    m, d = x.shape
    r = factors.gate.n
    f = factors.down.n
    e_count = offs.shape[0]
    p1 = _plan.make_plan(offs, m, r, d, tile_m=tile_m, tile_n=SIGN_GLU_TILE_N)
    xg = quantize_scaled_rows(x, offs, factors.gate.scale_k, tile_m)
    xu = quantize_scaled_rows(x, offs, factors.up.scale_k, tile_m)
    ones = torch.ones(e_count, r, dtype=torch.float32, device=x.device)
    ep0 = ones if s_gate is None else s_gate.float()
    ep1 = ones if s_up is None else s_up.float()
    alpha1 = torch.stack((_plan.alpha_from_encode_scales(xg.s_enc), _plan.alpha_from_encode_scales(xu.s_enc)))
    z = grouped_sign_gemm_emulated(torch.stack((xg.codes, xu.codes)), torch.stack((xg.sfa, xu.sfa)),
                                   xg.sfa_offsets, factors.gu_bits, factors.gu_col, offs, p1.tile_expert,
                                   p1.tile_row, tile_m, alpha1, epilogue="glu", ep0=ep0, ep1=ep1,
                                   out_dtype=torch.bfloat16, m_out=m)
    p2 = _plan.make_plan(offs, m, f, r, tile_m=tile_m, tile_n=32)
    zq = quantize_scaled_rows(z.float(), offs, factors.down.scale_k, tile_m)
    rw = row_weight.float() if row_weight is not None else torch.ones(m, dtype=torch.float32, device=x.device)
    y = grouped_sign_gemm_emulated(zq.codes.unsqueeze(0), zq.sfa.unsqueeze(0), zq.sfa_offsets,
                                   factors.down.bits.unsqueeze(0), factors.down.scale_n.unsqueeze(0), offs,
                                   p2.tile_expert, p2.tile_row, tile_m,
                                   _plan.alpha_from_encode_scales(zq.s_enc).unsqueeze(0), epilogue="row_weight",
                                   ep0=rw, out_dtype=torch.bfloat16, m_out=m)
    if return_intermediates:
        return y, {"xq_gate": xg, "xq_up": xu, "z": z, "zq": zq, "plan1": p1, "plan2": p2}
    return y


def sign_kernel_glu_bytes(m: int, num_experts: int, d: int, copies: int = 2) -> dict:
    """Bytes of the quantized activation operands of the first GEMM (host ints; upper bounds for the
    per-expert 128-row scale padding): ``copies`` = 2 for sign factors (x*a_gate, x*a_up), 1 for
    NVFP4 factors. Returns codes, scales (bound) and total bytes, plus the gathered bf16 x for scale."""
    codes = _plan.a_rows_alloc(m, 32) * d // 2
    scales = _plan.sfa_bytes_bound(m, num_experts, d)
    return {"codes": copies * codes, "scales": copies * scales, "total": copies * (codes + scales),
            "bf16_gathered_x": m * d * 2}
