"""Host side of the sm_120 fp4 grouped GLU: operand preparation, the two GEMM launches, the combine.

Forward (W4A4, design.md section 4 "sm_120 fp4 tensor core"):

    xq = NVFP4(x[gather] per expert)                         tsct_nvfp4_quantize_rows_grouped (any arch)
    z  = silu(g) * u,  [g | u] = xq @ [w_gate | w_up]         tsct_nvfp4_grouped_glu_sm120 (CuTeDSL, OMMA)
    zq = NVFP4(z per expert)                                  the same quantizer
    y  = (zq @ w_down) * row_weight                           tsct_nvfp4_grouped_rowweight_sm120
    out[scatter_idx[i]] += y[i]                               deterministic combine (sort + segment sum)

The launch plan (tile map, scale offsets, alpha folding, gate/up interleave) is
``tsct.emulation.plan``: the same code the emulation (``tsct.emulation.grouped_glu_w4a4``) runs,
tested on the CPU against it (tests/kernels/test_sm120_fp4_dispatch.py). No host reads of device values.

Sign factors (``SignTensor``, design.md section 3: ``x @ W = ((x * a) @ sign(W)) * b``): the same
steps with the sign kernels (``tsct_sign_grouped_glu_sm120`` / ``_rowweight_sm120``): the activation
quantizer folds each factor's per-K scale ``a`` into the rows (``col_scale``, one s_enc per expert of
the products), so the GLU takes two quantized copies of x (``x * a_gate``, ``x * a_up``) and the down
GEMM ``z * a_down``; ``b`` (per output column) is applied in the kernels' epilogue
(``tsct.emulation.sign_glu`` is the emulation of exactly this).

Backward: the triton-lowbit path's backward (``tsct.kernels.triton_lowbit.grouped_glu_backward``):
bf16 activations, the factors decoded from their packed bytes in registers, gradients w.r.t. the
DECODED factors (STE to the masters, docs/decisions/0008). It does not re-use the forward's fp4
quantization of x and z: the gradient is that of the W4A16 function, not of the W4A4 forward (a
straight-through estimate for the activation quantizer too). Needs Triton (JIT) on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from tsct.emulation import plan as _plan

TILE_M = 32  # cutedsl/build.py: every grouped variant
GLU_TILE_N = 128  # tsct_nvfp4_grouped_glu_sm120 covers 2r = 128 interleaved columns per CTA
DOWN_TILE_N = 32


@dataclass
class GluOperands:
    """The factors as the kernels read them (derived from NVFP4Tensor containers, on their device)."""
    gu_codes: Tensor  # uint8 [E, 2r, d/2], rows 2j = gate j, 2j+1 = up j
    gu_sfb: Tensor  # uint8 [E, pad128(2r) * Kbp(d)] swizzled
    s_enc_gate: Tensor  # fp32 [E]
    s_enc_up: Tensor
    down_codes: Tensor  # uint8 [E, f, r/2]
    down_sfb: Tensor  # uint8 [E, pad128(f) * Kbp(r)] swizzled
    s_enc_down: Tensor
    d: int
    r: int
    f: int


def _linear_scales(w) -> Tensor:
    from tsct.quant.layout import to_linear
    if w.layout == "linear":
        return w.block_scale.view(torch.uint8)
    return to_linear(w.block_scale, w.n, w.k // 16).view(torch.uint8)


def prepare_factors(w_gate, w_up, w_down) -> GluOperands:
    """NVFP4Tensor factors (logical ``[E, d, r]``, ``[E, d, r]``, ``[E, r, f]``) -> kernel operands.

    Gate/up codes and LINEAR block scales are interleaved row by row, then swizzled
    (``plan.interleave_rows``); w_down's scales are swizzled. Raises TypeError / ValueError naming the
    factor for anything else (dense or sign factors: not served by these kernels).
    """
    from tsct.quant.layout import to_swizzled
    from tsct.quant.nvfp4 import NVFP4Tensor

    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if not isinstance(w, NVFP4Tensor):
            raise TypeError(f"{name}: the sm120-fp4 path takes NVFP4Tensor factors, got {type(w).__name__}")
        if w.batch != w_gate.batch:
            raise ValueError(f"{name}: {w.batch} experts, w_gate has {w_gate.batch}")
    d, r = w_gate.k, w_gate.n
    f = w_down.n
    if (w_up.k, w_up.n) != (d, r) or w_down.k != r:
        raise ValueError(f"factor shapes disagree: w_gate [E, {d}, {r}], w_up [E, {w_up.k}, {w_up.n}], "
                         f"w_down [E, {w_down.k}, {f}]")
    if d % 64 or r % 64:
        raise ValueError(f"the sm_120 kernels step K by 64: need d % 64 == 0 and r % 64 == 0, got d={d}, r={r}")
    gu_codes = _plan.interleave_rows(w_gate.codes, w_up.codes)
    gu_sfb = to_swizzled(_plan.interleave_rows(_linear_scales(w_gate), _linear_scales(w_up)))
    down_sfb = w_down.block_scale.view(torch.uint8) if w_down.layout == "swizzled_128x4" else \
        to_swizzled(w_down.block_scale.view(torch.uint8))
    return GluOperands(gu_codes=gu_codes.contiguous(), gu_sfb=gu_sfb.contiguous(), s_enc_gate=w_gate.global_scale,
                       s_enc_up=w_up.global_scale, down_codes=w_down.codes.contiguous(),
                       down_sfb=down_sfb.contiguous(), s_enc_down=w_down.global_scale, d=d, r=r, f=f)


@dataclass
class LaunchArgs:
    """Everything the two GEMM launches take besides the activations (device tensors, host ints)."""
    plan1: _plan.GroupedPlan
    plan2: _plan.GroupedPlan
    ep0: Tensor  # [E, r] s_gate / s_enc_gate
    ep1: Tensor  # [E, r] s_up / s_enc_up
    m: int


def launch_args(offs: Tensor, m: int, ops: GluOperands, s_gate: Optional[Tensor], s_up: Optional[Tensor]
                ) -> LaunchArgs:
    """Plans of both GEMMs and the GLU epilogue's per-rank scales (sync-free; works on ``meta``)."""
    p1 = _plan.make_plan(offs, m, 2 * ops.r, ops.d, tile_m=TILE_M, tile_n=GLU_TILE_N)
    p2 = _plan.make_plan(offs, m, ops.f, ops.r, tile_m=TILE_M, tile_n=DOWN_TILE_N)
    ep0, ep1 = _plan.glu_scales(ops.s_enc_gate, ops.s_enc_up, s_gate, s_up, ops.r)
    return LaunchArgs(plan1=p1, plan2=p2, ep0=ep0.contiguous(), ep1=ep1.contiguous(), m=m)


def combine_rows(y: Tensor, scatter_idx: Tensor, offs: Tensor, num_out_rows: int) -> Tensor:
    """``out[t] = sum of y[i]`` over routed rows i < offs[-1] with scatter_idx[i] == t, in increasing i.

    Deterministic (a stable sort by token, then ``torch.segment_reduce`` over each token's segment,
    no atomics) and sync-free. fp32 accumulation, result in y's dtype.
    """
    m, f = y.shape
    out_dtype = y.dtype
    if num_out_rows == 0 or m == 0:
        return torch.zeros(num_out_rows, f, dtype=out_dtype, device=y.device)
    pos = torch.arange(m, device=y.device)
    key = torch.where(pos < offs[-1].long(), scatter_idx.long(), num_out_rows)
    skey, order = torch.sort(key, stable=True)
    bounds = torch.searchsorted(skey, torch.arange(num_out_rows + 1, device=y.device))
    bounds = torch.cat([bounds, bounds.new_full((1,), m)])
    lengths = torch.diff(bounds)  # num_out_rows + 1 segments: the tokens, then the padding rows
    summed = torch.segment_reduce(y[order].float(), "sum", lengths=lengths, axis=0, unsafe=True)
    return summed[:num_out_rows].to(out_dtype)


def forward(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate: Optional[Tensor], s_up: Optional[Tensor],
            row_weight: Optional[Tensor], gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor],
            num_out_rows: Optional[int], *, gemm=None, quant_backend: str = "native") -> Tensor:
    """The sm_120 fp4 forward (module docstring); inputs validated by ``tsct.ops``.

    ``gemm`` (default ``tsct.native.sm120_nvfp4_grouped``) and ``quant_backend`` exist for the CPU
    tests, which pass an emulated GEMM taking exactly the native entry's arguments
    (tests/kernels/test_sm120_fp4_dispatch.py): the host preparation is then checked end to end.
    """
    from tsct.kernels.sm120_fp4.quant_rows import quantize_rows_grouped
    from tsct.quant.sign import SignTensor

    if all(isinstance(w, SignTensor) for w in (w_gate, w_up, w_down)):
        return forward_sign(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                            num_out_rows, gemm=gemm, quant_backend=quant_backend)
    if gemm is None:
        from tsct import native
        gemm = native.sm120_nvfp4_grouped
    ops = prepare_factors(w_gate, w_up, w_down)
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    la = launch_args(offs, m, ops, s_gate, s_up)
    dev = x.device
    xq = quantize_rows_grouped(x, offs, gather_idx=gather_idx, m=m, m_alloc=la.plan1.a_rows, backend=quant_backend)
    alpha1 = _plan.alpha_from_encode_scales(xq.s_enc).contiguous()
    z = torch.zeros(m, ops.r, dtype=torch.bfloat16, device=dev)  # padding rows stay 0
    p1 = la.plan1
    gemm("glu", xq.codes, ops.gu_codes, xq.sfa, xq.sfa_offsets, ops.gu_sfb, z, offs, p1.tile_expert, p1.tile_row,
         alpha1, la.ep0, la.ep1)
    p2 = la.plan2
    zq = quantize_rows_grouped(z, offs, m_alloc=p2.a_rows, backend=quant_backend)
    alpha2 = _plan.alpha_from_encode_scales(zq.s_enc, ops.s_enc_down).contiguous()
    rw = (row_weight.float() if row_weight is not None else torch.ones(m, dtype=torch.float32, device=dev))
    rw = rw.reshape(m, 1).contiguous()
    y = torch.zeros(m, ops.f, dtype=torch.bfloat16, device=dev)
    gemm("row_weight", zq.codes, ops.down_codes, zq.sfa, zq.sfa_offsets, ops.down_sfb, y, offs, p2.tile_expert,
         p2.tile_row, alpha2, rw, rw)
    if scatter_idx is not None:
        y = combine_rows(y, scatter_idx, offs, num_out_rows)
    return y.to(x.dtype)


SIGN_GLU_TILE_N = 64  # tsct_sign_grouped_glu_sm120 (cutedsl/build.py)


def forward_sign(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate: Optional[Tensor], s_up: Optional[Tensor],
                 row_weight: Optional[Tensor], gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor],
                 num_out_rows: Optional[int], *, gemm=None, quant_backend: str = "native") -> Tensor:
    """The sm_120 forward with ``SignTensor`` factors (module docstring); ``gemm`` defaults to
    ``tsct.native.sm120_sign_grouped`` (tests pass ``emulated.emulated_sign_gemm``)."""
    from tsct.kernels.sm120_fp4.quant_rows import quantize_rows_grouped
    from tsct.quant.sign import SignTensor

    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if not isinstance(w, SignTensor):
            raise TypeError(f"{name}: the sign kernels take SignTensor factors, got {type(w).__name__}")
    d, r, f = w_gate.k, w_gate.n, w_down.n
    if (w_up.k, w_up.n) != (d, r) or w_down.k != r:
        raise ValueError(f"factor shapes disagree: w_gate [E, {d}, {r}], w_up [E, {w_up.k}, {w_up.n}], "
                         f"w_down [E, {w_down.k}, {f}]")
    if d % 64 or r % 64:
        raise ValueError(f"the sm_120 kernels step K by 64: need d % 64 == 0 and r % 64 == 0, got d={d}, r={r}")
    if gemm is None:
        from tsct import native
        gemm = native.sm120_sign_grouped
    e = w_gate.batch
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    dev = x.device
    p1 = _plan.make_plan(offs, m, r, d, tile_m=TILE_M, tile_n=SIGN_GLU_TILE_N)
    xg = quantize_rows_grouped(x, offs, gather_idx=gather_idx, col_scale=w_gate.scale_k.float().contiguous(), m=m,
                               m_alloc=p1.a_rows, backend=quant_backend)
    xu = quantize_rows_grouped(x, offs, gather_idx=gather_idx, col_scale=w_up.scale_k.float().contiguous(), m=m,
                               m_alloc=p1.a_rows, backend=quant_backend)
    ones = torch.ones(e, r, dtype=torch.float32, device=dev)
    ep0 = (ones if s_gate is None else s_gate.float()).contiguous()
    ep1 = (ones if s_up is None else s_up.float()).contiguous()
    alpha1 = torch.stack((_plan.alpha_from_encode_scales(xg.s_enc), _plan.alpha_from_encode_scales(xu.s_enc)),
                         dim=1).contiguous()  # [E, 2], copy index contiguous
    z = torch.zeros(m, r, dtype=torch.bfloat16, device=dev)
    gemm("glu", torch.stack((xg.codes, xu.codes)), torch.stack((w_gate.bits, w_up.bits)),
         torch.stack((xg.sfa.view(torch.uint8), xu.sfa.view(torch.uint8))), xg.sfa_offsets,
         torch.stack((w_gate.scale_n.float(), w_up.scale_n.float())).contiguous(), z, offs, p1.tile_expert,
         p1.tile_row, alpha1, ep0, ep1)
    p2 = _plan.make_plan(offs, m, f, r, tile_m=TILE_M, tile_n=DOWN_TILE_N)
    zq = quantize_rows_grouped(z, offs, col_scale=w_down.scale_k.float().contiguous(), m_alloc=p2.a_rows,
                               backend=quant_backend)
    rw = (row_weight.float() if row_weight is not None else torch.ones(m, dtype=torch.float32, device=dev))
    rw = rw.reshape(m, 1).contiguous()
    y = torch.zeros(m, f, dtype=torch.bfloat16, device=dev)
    gemm("row_weight", zq.codes.unsqueeze(0), w_down.bits.unsqueeze(0).contiguous(),
         zq.sfa.view(torch.uint8).unsqueeze(0), zq.sfa_offsets, w_down.scale_n.float().unsqueeze(0).contiguous(), y,
         offs, p2.tile_expert, p2.tile_row, _plan.alpha_from_encode_scales(zq.s_enc).reshape(e, 1).contiguous(), rw, rw)
    if scatter_idx is not None:
        y = combine_rows(y, scatter_idx, offs, num_out_rows)
    return y.to(x.dtype)
