"""Host side of the Triton grouped GLU: allocation, the device-side schedule, launches.

Same signatures and semantics as ``tsct.reference.glu`` (inputs already validated by ``tsct.ops``).
Sync-free: nothing here reads a device value on the host, so a call can be captured in a CUDA graph.
The tile map, the CSR of each combine and the padding bounds are built on the device
(``torch.cumsum``, ``torch.sort(stable=True)``, ``torch.searchsorted``) and read by the kernels.

Precision: bf16/fp16 operands, fp32 accumulation everywhere. The intermediates that feed a matrix
product (the latent z, dhg, dhu, z*rw) and the routed rows before a combine (y, dx) are stored in
x.dtype; each combine sums in fp32 and rounds once more. float32 inputs run too (the matrix products
then use TF32 on the GPU).

Determinism: no atomics. Per-expert reductions run inside one program in a fixed order; combines sum
each target's rows in increasing row order (a stable sort), so every run gives the same bits.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
import triton
from torch import Tensor

from tsct.kernels.triton_glu import _kernels as K

__all__ = ["grouped_glu_forward", "grouped_glu_backward", "Config", "CONFIG"]


class Config:
    """Tile sizes (one place; per-arch tables go here when the AOT build lands). Chosen from the
    sm_90 resource report of Triton 3.9 (registers, spills, shared memory; bench/notes.md) and the
    H200 timings. ``TSCT_TRITON_GLU_CFG="bn_bwd=64,warps_up=4"`` overrides fields (experiments)."""

    bm = 64          # rows per tile (forward tile map and backward row loop); ~32 rows/expert at b1
    br_max = 64      # rank block of the down projection / backward main kernel
    bk = 64          # K step over d
    bn_up = 128      # column block of the up projection (f = 5461 rows are not 16-byte aligned:
                     # scalar loads, so wide tiles cost registers)
    fsplit_up = 1    # column-block stripes per row tile (grid axis 1 of the up kernel)
    bn_bwd = 64      # f step of the backward dz kernel
    fs_bwd = 8       # f slices of the backward dz kernel (grid axis 2; partial sums reduced in order)
    bd_bwd = 64      # d block of the dX / dW kernel
    bn_combine = 1024
    warps_down = 4
    warps_up = 8
    warps_bwd_dz = 4
    warps_bwd_epi = 8
    warps_bwd_dxdw = 4
    stages_down = 3
    stages_up = 3
    stages_bwd_dz = 1
    stages_bwd_dxdw = 1

    def update(self, spec: str) -> None:
        """Apply "name=int,name=int" (no validation beyond the field existing)."""
        for item in filter(None, (t.strip() for t in spec.split(","))):
            key, val = item.split("=")
            if not hasattr(Config, key):
                raise KeyError(f"unknown Triton GLU config field {key!r}")
            setattr(self, key, int(val))


CONFIG = Config()
if os.environ.get("TSCT_TRITON_GLU_CFG"):
    CONFIG.update(os.environ["TSCT_TRITON_GLU_CFG"])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rank_block(r: int) -> int:
    return max(16, min(CONFIG.br_max, triton.next_power_of_2(r)))


def _tile_cum(offs: Tensor, bm: int) -> Tensor:
    """Inclusive cumulative count of row tiles per expert, int32 on the device."""
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    ntiles = torch.div(counts + (bm - 1), bm, rounding_mode="floor")
    return torch.cumsum(ntiles, 0, dtype=torch.int32)


def _csr(idx: Tensor, offs: Tensor, m: int, n_out: int) -> tuple[Tensor, Tensor]:
    """Rows grouped by target: target t owns rows order[ptr[t]:ptr[t+1]], in increasing row order.

    Rows at or past offs[-1] get the key n_out (past every target), so their idx entries are never
    used (they may hold anything).
    """
    pos = torch.arange(m, device=idx.device, dtype=torch.int32)
    key = torch.where(pos < offs[-1], idx.to(torch.int32), n_out)  # int32 keys: half the radix passes
    skey, order = torch.sort(key, stable=True)
    ptr = torch.searchsorted(skey, torch.arange(n_out + 1, device=idx.device, dtype=torch.int32))
    return order, ptr


def _combine(src: Tensor, idx: Tensor, offs: Tensor, n_out: int, ncols: Optional[int] = None) -> Tensor:
    """out[t] = sum of src[i, :ncols] over the rows i < offs[-1] with idx[i] == t, in increasing i."""
    m, ld = src.shape
    ncols = ld if ncols is None else ncols
    out = torch.empty(n_out, ncols, device=src.device, dtype=src.dtype)
    if n_out == 0 or ncols == 0:
        return out
    order, ptr = _csr(idx, offs, m, n_out)
    bn = min(CONFIG.bn_combine, triton.next_power_of_2(ncols))
    K.combine_rows[(n_out, _cdiv(ncols, bn))](src, order, ptr, out, ncols, ld, BN=bn, num_warps=4)
    return out


def _zero_tail(out: Tensor, offs: Tensor, e: int) -> None:
    m, ncols = out.shape
    if m == 0 or ncols == 0:
        return
    bm, bn = 32, min(256, triton.next_power_of_2(ncols))
    K.zero_tail_rows[(_cdiv(m, bm), _cdiv(ncols, bn))](out, offs, e, m, ncols, BM=bm, BN=bn, num_warps=4)


def grouped_glu_forward(
    x: Tensor,
    offs: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
) -> Tensor:
    """Triton forward: ``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; dtype x.dtype."""
    e, d, r = w_gate.shape
    f = w_down.shape[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    n_out = num_out_rows if scatter_idx is not None else m
    dtype = x.dtype
    if e == 0 or m == 0 or f == 0 or n_out == 0 or d == 0 or r == 0:
        return x.new_zeros(n_out, f)
    x = x.contiguous()
    w_gate, w_up, w_down = w_gate.contiguous(), w_up.contiguous(), w_down.contiguous()
    offs = offs.contiguous()
    cfg = CONFIG
    bm, br, bk = cfg.bm, _rank_block(r), cfg.bk
    cum = _tile_cum(offs, bm)
    max_tiles = _cdiv(m, bm) + e
    block_e = min(1024, triton.next_power_of_2(e))
    dummy = offs

    z = torch.empty(m, r, device=x.device, dtype=dtype)
    K.glu_down_fwd[(max_tiles, _cdiv(r, br))](
        x, gather_idx if gather_idx is not None else dummy, offs, cum, w_gate, w_up,
        s_gate if s_gate is not None else x, s_up if s_up is not None else x, z, z, z, x,
        e, d, r, x.stride(0),
        HAS_GATHER=gather_idx is not None, HAS_SG=s_gate is not None, HAS_SU=s_up is not None, HAS_RW=False,
        BWD=False, BM=bm, BR=br, BK=bk, BLOCK_E=block_e, num_warps=cfg.warps_down, num_stages=cfg.stages_down,
    )
    single_k = r <= 128
    bk_up = max(16, triton.next_power_of_2(r)) if single_k else 64
    bn = cfg.bn_up
    fsplit = max(1, min(cfg.fsplit_up, _cdiv(f, bn)))
    if scatter_idx is not None:
        # internal buffer: pad the row stride to 16 bytes so its stores and the combine's loads vectorize
        ldy = _cdiv(f, 8) * 8
        y = torch.empty(m, ldy, device=x.device, dtype=dtype)
    else:
        ldy = f
        y = torch.empty(m, f, device=x.device, dtype=dtype)
    K.glu_up_fwd[(max_tiles, fsplit)](
        z, offs, cum, w_down, row_weight if row_weight is not None else x, y,
        e, r, f, ldy,
        HAS_RW=row_weight is not None, FSPLIT=fsplit, SINGLE_K=single_k,
        BM=bm, BN=bn, BK=bk_up, BLOCK_E=block_e, num_warps=cfg.warps_up, num_stages=cfg.stages_up,
    )
    if scatter_idx is not None:
        return _combine(y, scatter_idx, offs, n_out, ncols=f)
    _zero_tail(y, offs, e)
    return y


def grouped_glu_backward(
    grad_out: Tensor,
    x: Tensor,
    offs: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    needs_grad: Sequence[bool],
) -> list[Optional[Tensor]]:
    """Gradients w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight), each in its input's
    dtype, None where not needed or the input is None. Recomputes hg, hu from x (the custom op saves
    only its inputs)."""
    inputs = [x, w_gate, w_up, w_down, s_gate, s_up, row_weight]
    want = [bool(n) and t is not None for n, t in zip(needs_grad, inputs)]
    res: list[Optional[Tensor]] = [None] * 7
    if not any(want):
        return res
    e, d, r = w_gate.shape
    f = w_down.shape[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    dtype = x.dtype
    dev = x.device
    if e == 0 or m == 0 or f == 0 or d == 0 or r == 0:
        for i, t in enumerate(inputs):
            if want[i]:
                res[i] = torch.zeros_like(t)
        return res
    x = x.contiguous()
    w_gate, w_up, w_down = w_gate.contiguous(), w_up.contiguous(), w_down.contiguous()
    offs = offs.contiguous()
    go = grad_out.to(dtype).contiguous()
    cfg = CONFIG
    bm, br, bk = cfg.bm, _rank_block(r), cfg.bk
    nrb = _cdiv(r, br)
    dummy = offs

    do_dwd = want[3]
    has_g, has_s = gather_idx is not None, scatter_idx is not None
    # 1. recompute hg, hu (fp32) and z*rw (x.dtype): the forward's down kernel in backward mode
    cum = _tile_cum(offs, bm)
    max_tiles = _cdiv(m, bm) + e
    hg = torch.empty(m, r, device=dev, dtype=torch.float32)
    hu = torch.empty(m, r, device=dev, dtype=torch.float32)
    zw = torch.empty(m, r, device=dev, dtype=dtype)
    K.glu_down_fwd[(max_tiles, nrb)](
        x, gather_idx if has_g else dummy, offs, cum, w_gate, w_up,
        s_gate if s_gate is not None else x, s_up if s_up is not None else x, zw, hg, hu,
        row_weight if row_weight is not None else x,
        e, d, r, x.stride(0),
        HAS_GATHER=has_g, HAS_SG=s_gate is not None, HAS_SU=s_up is not None, HAS_RW=row_weight is not None,
        BWD=True, BM=bm, BR=br, BK=bk, BLOCK_E=min(1024, triton.next_power_of_2(e)),
        num_warps=cfg.warps_down, num_stages=cfg.stages_down,
    )
    # 2. dz0 partials over f slices (and dWd), one program per (expert, rank block, f slice)
    bn = cfg.bn_bwd
    n_fs = max(1, min(cfg.fs_bwd, _cdiv(f, bn)))
    f_slice = _cdiv(_cdiv(f, bn), n_fs) * bn
    n_fs = _cdiv(f, f_slice)
    part = torch.empty(n_fs, m, r, device=dev, dtype=torch.float32)
    dwd = torch.empty_like(w_down) if do_dwd else zw
    K.glu_bwd_dz[(e, nrb, n_fs)](
        go, scatter_idx if has_s else dummy, offs, w_down, zw, part, dwd,
        m, r, f, f_slice,
        HAS_SCATTER=has_s, DO_DWD=do_dwd, BM=bm, BR=br, BN=bn,
        num_warps=cfg.warps_bwd_dz, num_stages=cfg.stages_bwd_dz,
    )
    # 3. the GLU backward per expert: dhg, dhu, d rw, d sg, d su
    dhg = torch.empty(m, r, device=dev, dtype=dtype)
    dhu = torch.empty(m, r, device=dev, dtype=dtype)
    dsg = torch.empty(e, r, device=dev, dtype=torch.float32)
    dsu = torch.empty(e, r, device=dev, dtype=torch.float32)
    drw = torch.zeros(nrb, m, device=dev, dtype=torch.float32)  # padding rows stay 0
    K.glu_bwd_epi[(e, nrb)](
        hg, hu, part, offs, s_gate if s_gate is not None else x, s_up if s_up is not None else x,
        row_weight if row_weight is not None else x, dhg, dhu, dsg, dsu, drw,
        m, r, n_fs, m * r,
        HAS_SG=s_gate is not None, HAS_SU=s_up is not None, HAS_RW=row_weight is not None,
        BM=bm, BR=br, num_warps=cfg.warps_bwd_epi,
    )
    if do_dwd:
        res[3] = dwd
    if want[4]:
        res[4] = dsg.to(s_gate.dtype)
    if want[5]:
        res[5] = dsu.to(s_up.dtype)
    if want[6]:
        res[6] = (drw[0] if nrb == 1 else drw.sum(0)).to(row_weight.dtype)

    do_dx, do_dw = want[0], want[1] or want[2]
    if do_dx or do_dw:
        dwg = torch.empty_like(w_gate) if do_dw else dhg
        dwu = torch.empty_like(w_up) if do_dw else dhg
        dx_rows = torch.empty(m, d, device=dev, dtype=dtype) if do_dx else dhg
        bd = min(cfg.bd_bwd, max(16, triton.next_power_of_2(d)))
        K.glu_bwd_dx_dw[(e, _cdiv(d, bd))](
            x, gather_idx if gather_idx is not None else dummy, offs, w_gate, w_up, dhg, dhu, dx_rows, dwg, dwu,
            d, r, x.stride(0),
            HAS_GATHER=gather_idx is not None, DO_DX=do_dx, DO_DW=do_dw,
            BM=bm, BD=bd, BR=br, num_warps=cfg.warps_bwd_dxdw, num_stages=cfg.stages_bwd_dxdw,
        )
        if do_dx:
            if gather_idx is not None:
                res[0] = _combine(dx_rows, gather_idx, offs, x.shape[0])
            else:
                _zero_tail(dx_rows, offs, e)
                res[0] = dx_rows
        if want[1]:
            res[1] = dwg
        if want[2]:
            res[2] = dwu
    return res
