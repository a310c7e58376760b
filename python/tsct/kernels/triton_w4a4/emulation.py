"""Torch model of the W4A4 kernels' math, and the interpreter patch the CPU tests need.

``up_forward_model`` computes what ``w4a4_up_fwd`` computes, in torch: decode both NVFP4 operands
WITHOUT their encode scales (e2m1 * UE4M3 block scale: exact in fp32, as in the bf16 emulation on
sm_90 and the OMMA on sm_120), per-expert fp64 matmul (a stand-in for fp32 accumulation in any
order), then ``* alpha_row`` with alpha = rw / (s_row * s_w[e]) (true division, fp32).

``down_forward_model`` is the same for ``w4a4_down_fwd`` (x rows and w_gate / w_up decoded without their
encode scales, fp64 products, then 1 / (s_row * s_w[e]) per row in fp32, per-rank scales, SiLU-GLU in fp32).
``w4a4_full_model`` is the whole W4A4 pass as quantize-then-multiply on dequantized values (x rows and z rows
quantized per row, factors dequantized, fp64 products); ``ste_grads_model`` the gradients the backward is
meant to return (straight-through: the W4A4 forward's values, the dequantized-factor graph's derivatives).

``w4a4_glu_model`` is the issue's "emulation of the quantize-then-multiply math": z from the fp32
reference GLU latent, quantized per row (decision 0002 recipe, one row = one matrix), dequantized,
multiplied by the dequantized w_down, times the row weight.

Triton 3.9's interpreter decodes ``tl.dot_scaled`` scales as E8M0 (``bits << 23``) whatever their
type, so float8e4nv scales come out ~1e-38 (checked: the output is ~1e-34 instead of ~1e2).
``patch_interpreter_e4m3_scales()`` replaces that one helper so that float8e4nv scales decode as
UE4M3; everything else of the kernel (pointer math, masks, tile map, epilogue) runs as written.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def decode_unscaled(codes: Tensor, block_scale: Tensor) -> Tensor:
    """[..., N, K/2] codes and [..., N, K/16] UE4M3 scales -> fp32 [..., N, K] = e2m1 * sf (exact)."""
    from tsct.quant.formats import e2m1_decode, unpack_nibbles

    v = e2m1_decode(unpack_nibbles(codes))
    sh = v.shape
    v = v.reshape(*sh[:-1], sh[-1] // 16, 16) * block_scale.float().unsqueeze(-1)
    return v.reshape(sh)


def up_forward_model(z_q, offs: Tensor, w_down, row_weight: Optional[Tensor] = None) -> Tensor:
    """fp32 [M, f]: the w4a4_up_fwd math in torch (rows past offs[-1] are zeros)."""
    from tsct.quant import to_layout

    if w_down.layout != "linear":
        w_down = to_layout(w_down, "linear")
    m = z_q.codes.shape[0]
    a = decode_unscaled(z_q.codes, z_q.block_scale)                      # [M, r]
    b = decode_unscaled(w_down.codes, w_down.block_scale)                # [E, f, r]
    e_count, f = b.shape[0], b.shape[1]
    y = torch.zeros(m, f, dtype=torch.float32)
    bounds = [0] + [int(v) for v in offs.tolist()]
    for e in range(e_count):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        acc = (a[lo:hi].double() @ b[e].double().T).float()
        num = row_weight[lo:hi].float() if row_weight is not None else torch.ones(hi - lo)
        alpha = torch.div(num, z_q.row_scale[lo:hi] * w_down.global_scale[e])
        y[lo:hi] = acc * alpha[:, None]
    return y


def quantize_rows_torch(x: Tensor):
    """The recipe of ``nvfp4_quant_rows`` in torch (0002, one row = one matrix): (codes, scales, s_row)."""
    from tsct.quant.nvfp4 import _quantize_blocks_torch, nvfp4_encode_scale

    m, k = x.shape
    x3 = x.reshape(m, 1, k)
    s = nvfp4_encode_scale(x3)
    codes, sf = _quantize_blocks_torch(x3, s)
    return codes.reshape(m, k // 2), sf.reshape(m, k // 16), s


def w4a4_glu_model(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None) -> Tensor:
    """fp32 [M, f]: z = the reference GLU latent (fp32, dense gate/up), quantized per row to NVFP4, then
    (z_hat @ w_down_hat[e]) * rw with w_down an NVFP4Tensor (dequantized)."""
    from tsct.kernels.triton_w4a4.w4a4 import RowNVFP4

    m = x.shape[0]
    z = torch.zeros(m, w_gate.shape[2])
    bounds = [0] + [int(v) for v in offs.tolist()]
    for e in range(w_gate.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            g = x[lo:hi].float() @ w_gate[e].float()
            u = x[lo:hi].float() @ w_up[e].float()
            if s_gate is not None:
                g = g * s_gate[e].float()
            if s_up is not None:
                u = u * s_up[e].float()
            z[lo:hi] = torch.nn.functional.silu(g) * u
    zq = RowNVFP4(*quantize_rows_torch(z))
    zh = zq.dequantize(torch.float32)
    wd = w_down.dequantize(torch.float32)                                # [E, r, f]
    y = torch.zeros(m, wd.shape[2])
    for e in range(w_gate.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            y[lo:hi] = (zh[lo:hi].double() @ wd[e].double()).float()
    if row_weight is not None:
        y[: bounds[-1]] *= row_weight[: bounds[-1]].float()[:, None]
    return y


def _bounds(offs: Tensor) -> list:
    return [0] + [int(v) for v in offs.tolist()]


def down_forward_model(x_q, offs: Tensor, w_gate, w_up, s_gate: Optional[Tensor] = None,
                       s_up: Optional[Tensor] = None, gather_idx: Optional[Tensor] = None):
    """(hg, hu, z) fp32 [M, r]: what ``w4a4_down_fwd`` computes, in torch. ``x_q``: a ``RowNVFP4`` of the
    token-major x (rows gathered through gather_idx) or of the routed rows. Rows past offs[-1] are zeros."""
    from tsct.quant import to_layout

    wg = w_gate if w_gate.layout == "linear" else to_layout(w_gate, "linear")
    wu = w_up if w_up.layout == "linear" else to_layout(w_up, "linear")
    idx = gather_idx.long() if gather_idx is not None else torch.arange(x_q.codes.shape[0])
    a = decode_unscaled(x_q.codes, x_q.block_scale)[idx]                   # [M, d]
    s_row = x_q.row_scale[idx]
    bg = decode_unscaled(wg.codes, wg.block_scale).reshape(wg.batch, wg.n, wg.k)   # [E, r, d]
    bu = decode_unscaled(wu.codes, wu.block_scale).reshape(wu.batch, wu.n, wu.k)
    m, r = idx.shape[0], wg.n
    hg, hu, z = (torch.zeros(m, r) for _ in range(3))
    b = _bounds(offs)
    for e in range(wg.batch):
        lo, hi = b[e], b[e + 1]
        if hi <= lo:
            continue
        one = torch.ones(hi - lo)
        g = (a[lo:hi].double() @ bg[e].double().T).float() * torch.div(one, s_row[lo:hi] * wg.global_scale[e])[:, None]
        u = (a[lo:hi].double() @ bu[e].double().T).float() * torch.div(one, s_row[lo:hi] * wu.global_scale[e])[:, None]
        hg[lo:hi], hu[lo:hi] = g, u
        if s_gate is not None:
            g = g * s_gate[e].float()
            u = u * s_up[e].float()
        z[lo:hi] = g * torch.sigmoid(g) * u
    return hg, hu, z


def _dense_factors(w_gate, w_up, w_down):
    return tuple(w.dequantize(torch.float32).reshape(w.batch, w.k, w.n).double() for w in (w_gate, w_up, w_down))


def w4a4_full_model(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None,
                    gather_idx: Optional[Tensor] = None) -> Tensor:
    """fp32 [M, f]: the W4A4 pass as quantize-then-multiply on DEQUANTIZED values, in fp64 where it multiplies:
    x_hat = each routed row of x quantized to NVFP4 (0002, one row = one matrix) and dequantized; z from
    x_hat and the dequantized gate / up factors; z_hat = z (fp32) quantized per row and dequantized;
    y = (z_hat @ Wd_hat[e]) * rw. Independent of the kernels' factoring of the scales (alpha per row)."""
    from tsct.kernels.triton_w4a4.w4a4 import RowNVFP4

    xr = x[gather_idx.long()] if gather_idx is not None else x
    xh = RowNVFP4(*quantize_rows_torch(xr.float())).dequantize(torch.float32).double()
    wg, wu, wd = _dense_factors(w_gate, w_up, w_down)
    m = xr.shape[0]
    z = torch.zeros(m, wg.shape[2])
    b = _bounds(offs)
    for e in range(wg.shape[0]):
        lo, hi = b[e], b[e + 1]
        if hi > lo:
            g = (xh[lo:hi] @ wg[e]).float()
            u = (xh[lo:hi] @ wu[e]).float()
            if s_gate is not None:
                g, u = g * s_gate[e].float(), u * s_up[e].float()
            z[lo:hi] = torch.nn.functional.silu(g) * u
    zh = RowNVFP4(*quantize_rows_torch(z)).dequantize(torch.float32).double()
    y = torch.zeros(m, wd.shape[2])
    for e in range(wg.shape[0]):
        lo, hi = b[e], b[e + 1]
        if hi > lo:
            y[lo:hi] = (zh[lo:hi] @ wd[e]).float()
    if row_weight is not None:
        y[: b[-1]] *= row_weight[: b[-1]].float()[:, None]
    return y


def ste_grads_model(grad_out: Tensor, x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate=None, s_up=None,
                    row_weight=None, gather_idx=None, scatter_idx=None, num_out_rows=None,
                    hg_w4a4: Optional[Tensor] = None, hu_w4a4: Optional[Tensor] = None) -> list:
    """fp64 gradients (x, Wg_hat, Wu_hat, Wd_hat, s_gate, s_up, rw) of the straight-through W4A4 pass by torch
    autograd: hg = x @ Wg_hat + (hg_w4a4 - x @ Wg_hat).detach() (the W4A4 value, the unquantized derivative; hu
    alike), z = silu(hg s_g) (hu s_u), y = (z @ Wd_hat) rw (z_hat's effect on the value does not matter here:
    no gradient reads y). ``hg_w4a4`` / ``hu_w4a4`` [M, r]: the forward's values (default: the model's,
    ``down_forward_model`` on the torch-quantized x rows). Entries None where the input is None."""
    from tsct.kernels.triton_w4a4.w4a4 import RowNVFP4

    wg, wu, wd = (t.clone().requires_grad_(True) for t in _dense_factors(w_gate, w_up, w_down))
    xd = x.double().clone().requires_grad_(True)
    sg = s_gate.double().clone().requires_grad_(True) if s_gate is not None else None
    su = s_up.double().clone().requires_grad_(True) if s_up is not None else None
    rw = row_weight.double().clone().requires_grad_(True) if row_weight is not None else None
    if hg_w4a4 is None:
        xq = RowNVFP4(*quantize_rows_torch(x.float()))
        hg_w4a4, hu_w4a4, _ = down_forward_model(xq, offs, w_gate, w_up, None, None, gather_idx)
    xr = xd[gather_idx.long()] if gather_idx is not None else xd
    b = _bounds(offs)
    m, f = xr.shape[0], wd.shape[2]
    rows = []
    for e in range(wg.shape[0]):
        lo, hi = b[e], b[e + 1]
        if hi <= lo:
            continue
        lg, lu = xr[lo:hi] @ wg[e], xr[lo:hi] @ wu[e]
        g = lg + (hg_w4a4[lo:hi].double() - lg).detach()
        u = lu + (hu_w4a4[lo:hi].double() - lu).detach()
        if sg is not None:
            g, u = g * sg[e], u * su[e]
        y = (torch.nn.functional.silu(g) * u) @ wd[e]
        if rw is not None:
            y = y * rw[lo:hi, None]
        rows.append(y)
    y = torch.cat(rows + [xd.new_zeros(m - b[-1], f)], 0)
    if scatter_idx is not None:
        y = xd.new_zeros(num_out_rows, f).index_add(0, scatter_idx[: b[-1]].long(), y[: b[-1]])
    (y * grad_out.double()).sum().backward()
    return [t.grad if t is not None else None for t in (xd, wg, wu, wd, sg, su, rw)]


def patch_interpreter_e4m3_scales() -> None:
    """Make Triton 3.9's interpreter decode float8e4nv dot_scaled scales as UE4M3 (E8M0 kept as is)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as I

    if getattr(I._dot_scaled_scale_to_f32, "_tsct_patched", False):
        return
    orig = I._dot_scaled_scale_to_f32

    def scale_to_f32(scale_handle, compute_type):
        if scale_handle.dtype == tl.float8e4nv:
            raw = np.ascontiguousarray(scale_handle.data).view(np.uint8)
            vals = torch.from_numpy(raw.copy()).view(torch.float8_e4m3fn).float().numpy()
            return np.where((raw & 0x7F) == 0x7F, np.float32("nan"), vals).astype(np.float32)
        return orig(scale_handle, compute_type)

    scale_to_f32._tsct_patched = True
    I._dot_scaled_scale_to_f32 = scale_to_f32
