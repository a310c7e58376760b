"""Host side of the Triton grouped GLU with bf16 / fp16 factors: allocation, the launches of its four kernels.

Same signatures and semantics as ``tsct.reference.glu`` (inputs already validated by ``tsct.ops``).
Sync-free: nothing here reads a device value on the host, so a call can be captured in a CUDA graph. The schedule
(tile map, CSR of each combine, the backward's plan), the combines, the padding zeroing and the weight-free backward
steps are the Triton runtime's (``tsct.kernels.triton_common.runtime``), shared with the low-bit family.

Precision: bf16/fp16 operands, fp32 accumulation everywhere. The intermediates that feed a matrix
product (the latent z, dhg, dhu, z*rw) and the routed rows before a combine (y, dx) are stored in
x.dtype; each combine sums in fp32 and rounds once more. float32 inputs run too (the matrix products
then use TF32 on the GPU).

Determinism: no atomics (``triton_common.runtime``: fixed-order reductions and combines), so every run gives the
same bits.

Launches: every kernel of this family goes through ``_launch`` with its runtime parameters in the order of
``specs.KERNELS`` and its constexprs, so the same grids and arguments feed either the ahead-of-time
cubins (``tsct.kernels.aot``; no Triton needed) or Triton JIT (``TSCT_TRITON_BACKEND``). The inputs
are normalised first (exactly: scales and row weights to fp32, int32 indices to int64, a lone scale
gets a ones partner) so the AOT table stays small (specs.py).

Tile configs: one per arch (``triton_common.specs.CONFIGS``, ``TSCT_TRITON_GLU_CFG``), shared by both families;
``Config`` and ``overridden`` are re-exported here.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tsct.kernels import launch
from tsct.kernels.layout import is_kmajor
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common.runtime import overridden  # noqa: F401  (re-exported: the tile configs' override)
from tsct.kernels.triton_glu import specs
from tsct.kernels.triton_glu.specs import Config

__all__ = ["grouped_glu_forward", "grouped_glu_forward_saved", "grouped_glu_backward", "saved_like", "Config",
           "backend_counts", "overridden"]

# ---- backends: the AOT cubins (tsct.kernels.aot) or Triton JIT -------------------------------------
# TSCT_TRITON_BACKEND=auto (default): the AOT cubin of the launch's specialization when this install
# ships one for the device's arch, else Triton JIT when importable. =aot / =jit force one (tests).

FAMILY = launch.Family("triton-bf16", specs, "tsct.kernels.triton_glu._kernels")


def backend_counts() -> dict[tuple[str, str], int]:
    """{(backend, kernel): launches} since the process started ("aot", "jit", and "native" for the CUDA
    glu_bwd_dz) of this family's kernels and of the shared ones (``triton_common.runtime.backend_counts``: the
    tile map, combines, zero-tail, routing and weight-free backward kernels, whichever family launched them)."""
    out = dict(C.backend_counts())
    for k, n in FAMILY.backend_counts().items():
        out[k] = out.get(k, 0) + n
    return out


def _launch(kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
            aligned: bool, cap: tuple[int, int], device: torch.device) -> None:
    """Launch ``kernel`` (its runtime parameters in specs.KERNELS order; None = a pointer the flags
    leave unread) on the current stream, through the AOT cubin or Triton JIT (``tsct.kernels.launch``)."""
    FAMILY.launch(kernel, grid, args, consts, num_warps, num_stages, aligned, cap, device)


# ---- host-side helpers ----------------------------------------------------------------------------

def _wd_layout(w_down: Tensor, aligned: bool) -> tuple[Tensor, bool]:
    """(w_down to launch with, WD_T): a K-major w_down (``layout.is_kmajor``: its tiles are 16-byte
    aligned at any f) stays as it is on aligned launches; anything else becomes contiguous (row-major,
    whose rows are only 2-byte aligned at odd f)."""
    if aligned and is_kmajor(w_down):
        return w_down, True
    return w_down.contiguous(), False


def _native_dz(cfg: Config, cap: tuple[int, int], wd_t: bool, r: int, dtype: torch.dtype, go: Tensor,
               zw: Tensor) -> bool:
    """Whether glu_bwd_dz runs as the CUDA kernel (csrc/glu/dz_bf16.cu): a row of the dispatch for this arch
    (``tsct.dispatch.CUDA_KERNELS``), bf16, r = 64, K-major w_down (``wd_t``: only on aligned launches, so
    grad_out is 16-byte aligned already), 16-byte aligned contiguous zw, row tiles of the kernel's 64 rows
    (``cfg.shared.bm``: the tile map is shared), on a GPU with the native library loaded and the kernel's shared
    memory."""
    if not (wd_t and r == 64 and dtype == torch.bfloat16 and go.is_cuda and cfg.shared.bm == 64
            and C.cuda_kernel("glu_bwd_dz", cap, "bf16")):
        return False
    if zw.data_ptr() % 16 or not zw.is_contiguous():
        return False
    from tsct import native

    return C.native_smem_ok(native.GLU_DZ_KERNEL, go.device)


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
    return _forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                    save=False)[0]


def saved_like(x: Tensor, w_gate: Tensor, gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor] = None,
               num_out_rows: Optional[int] = None) -> list[Tensor]:
    """Empty tensors shaped like what ``grouped_glu_forward_saved`` saves (the custom op's fake)."""
    return C.saved_like_r(x, w_gate.shape[2], gather_idx, scatter_idx, num_out_rows)


def grouped_glu_forward_saved(
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
) -> tuple[Tensor, list[Tensor]]:
    """The forward plus what the backward would recompute from x: [hg, hu] (x W, fp32, unscaled) and
    z * row_weight (x.dtype), each [M, r]. Pass the list to ``grouped_glu_backward(saved=...)``: it
    then skips the recompute (reading x and both factors again, 0.16 ms at b1 on the H200). The up
    projection then applies the row weight to z before its bf16 rounding instead of after the
    product (a rounding difference only). With ``scatter_idx`` the list also holds the combine's CSR
    (order, ptr: ``combine_forward``), which the backward's dX combine reuses when ``gather_idx`` is the
    same index tensor and ``num_out_rows`` is x's row count (``dx_csr``)."""
    return _forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                    save=True)


def _forward(
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
    save: bool = False,
) -> tuple[Tensor, list[Tensor]]:
    e, d, r = w_gate.shape
    f = w_down.shape[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    n_out = num_out_rows if scatter_idx is not None else m
    dtype = x.dtype
    if e == 0 or m == 0 or f == 0 or n_out == 0 or d == 0 or r == 0:
        # nothing computed: the saved tensors are never read (the backward returns zeros, or no row is
        # valid: scatter targets need n_out > 0), zeros keep them defined
        return x.new_zeros(n_out, f), ([t.zero_() for t in saved_like(x, w_gate, gather_idx, scatter_idx, n_out)]
                                       if save else [])
    dev = x.device
    cap = C.device_capability(dev)
    cfg = C.tile_config(cap)
    x = x.contiguous()
    w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    offs = offs.contiguous()
    sg, su = C.scales_in(s_gate, s_up, dtype)
    rw = C.as_f32(row_weight)
    gidx = C.as_i64(gather_idx)
    al = C.aligned_launch(d, r, x.stride(0), x, w_gate, w_up, w_down)
    w_down, wd_t = _wd_layout(w_down, al)
    bm, br, bk = cfg.shared.bm, specs.rank_block(cfg, r, al), cfg.shared.bk
    max_tiles = C.cdiv(m, bm) + e
    has_s = sg is not None

    with C.csr_overlap(scatter_idx, offs, m, n_out, cap) as pending:  # the combine's CSR beside the projections
        z = torch.empty(m, r, device=dev, dtype=dtype)
        cum = torch.empty(e, device=dev, dtype=torch.int32)  # the tile map: written by the down kernel
        hg = hu = None
        saved: list[Tensor] = []
        if save:  # the backward's recompute, done here: hg, hu (fp32) and z * rw, padding rows zeroed
            hg = torch.empty(m, r, device=dev, dtype=torch.float32)
            hu = torch.empty(m, r, device=dev, dtype=torch.float32)
            saved = [hg, hu, z]
        _launch("glu_down_fwd", (max_tiles, C.cdiv(r, br)),
                [x, gidx, offs, cum, w_gate, w_up, sg, su, z, hg, hu, rw if save else None, e, m, d, r, x.stride(0)],
                dict(HAS_GATHER=gidx is not None, HAS_SG=has_s, HAS_SU=has_s, HAS_RW=save and rw is not None, BWD=save,
                     BM=bm, BR=br, BK=bk, BLOCK_E=cfg.shared.block_e),
                cfg.glu.warps_down, cfg.glu.stages_down, al, cap, dev)
        if save:
            rw = None  # already in z
        single_k, bk_up = specs.up_k(cfg, r, al)
        vec_up = specs.up_vec(cfg, al, wd_t, dtype.itemsize)
        bn, warps_up, stages_up = specs.up_tiles(cfg, vec_up, wd_t, bk_up)
        fsplit = max(1, min(cfg.glu.fsplit_up, C.cdiv(f, bn)))
        if scatter_idx is not None:
            # internal buffer: row stride padded to 16 bytes (pad columns written, never read as values) so
            # the up kernel's stores and the combine's loads vectorize
            ldy = C.cdiv(f, 8) * 8
            y = torch.empty(m, ldy, device=dev, dtype=dtype)
        else:
            ldy = f
            y = torch.empty(m, f, device=dev, dtype=dtype)
        # Y_PAD (vector stores): the padded buffer, or rows of f % 8 == 0 elements, which have no pad columns
        _launch("glu_up_fwd", (max_tiles, fsplit), [z, offs, cum, w_down, rw, y, e, r, f, ldy],
                dict(HAS_RW=rw is not None, FSPLIT=fsplit, SINGLE_K=single_k, VEC=vec_up, Y_PAD=ldy % 8 == 0,
                     WD_T=wd_t, BM=bm, BN=bn, BK=bk_up, BLOCK_E=cfg.shared.block_e),
                warps_up, stages_up, al, cap, dev)
    if scatter_idx is not None:
        return C.combine_forward(y, scatter_idx, offs, n_out, f, cfg, cap, saved, save, pending.csr), saved
    C.zero_tail(y, offs, e, cfg, cap)
    return y, saved


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
    saved: Optional[Sequence[Tensor]] = None,
) -> list[Optional[Tensor]]:
    """Gradients w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight), each in its input's
    dtype, None where not needed or the input is None. ``saved``: the list ``grouped_glu_forward_saved``
    returned for these inputs; without it hg, hu and z * rw are recomputed from x."""
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
    cap = C.device_capability(dev)
    cfg = C.tile_config(cap)
    x = x.contiguous()
    w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    offs = offs.contiguous()
    go = (grad_out if grad_out.dtype == dtype else grad_out.to(dtype)).contiguous()
    sg, su = C.scales_in(s_gate, s_up, dtype)
    rw = C.as_f32(row_weight)
    gidx, sidx = C.as_i64(gather_idx), C.as_i64(scatter_idx)
    has_s = sg is not None
    al = C.aligned_launch(d, r, x.stride(0), x, w_gate, w_up, w_down, go)
    w_down, wd_t = _wd_layout(w_down, al)
    bm, br, bk = cfg.shared.bm, specs.rank_block(cfg, r, al), cfg.shared.bk
    nrb = C.cdiv(r, br)

    do_dwd = want[3]
    # the schedule: tile map, chunk map, slots (one launch), and the slots' workspace for dWd then dWg / dWu
    plan = C.bwd_plan(offs, m, max(r * f if do_dwd else 0, 2 * d * r if want[1] or want[2] else 0), cfg, cap)
    if saved:
        hg, hu, zw = saved[:3]
    else:  # 1. recompute hg, hu (fp32) and z*rw (x.dtype): the forward's down kernel in backward mode
        cum = torch.empty(e, device=dev, dtype=torch.int32)  # written by the kernel, not read after it
        hg = torch.empty(m, r, device=dev, dtype=torch.float32)
        hu = torch.empty(m, r, device=dev, dtype=torch.float32)
        zw = torch.empty(m, r, device=dev, dtype=dtype)
        _launch("glu_down_fwd", (plan.max_tiles, nrb),
                [x, gidx, offs, cum, w_gate, w_up, sg, su, zw, hg, hu, rw, e, m, d, r, x.stride(0)],
                dict(HAS_GATHER=gidx is not None, HAS_SG=has_s, HAS_SU=has_s, HAS_RW=rw is not None, BWD=True,
                     BM=bm, BR=br, BK=bk, BLOCK_E=cfg.shared.block_e),
                cfg.glu.warps_down, cfg.glu.stages_down, al, cap, dev)
    with C.SideWork(dev) as side:  # the chunked dW kernels beside the row kernels, joined before the return
        # 2. dz0 partials over f slices on the row tiles and the one-tile experts' dWd (the CUDA kernel where the
        # dispatch has its row and the launch fits it, else one Triton program per (row tile, rank block, f slice));
        # beside it the other experts' dWd, chunked. dWd in w_down's layout (K-major stays K-major: the gradient a
        # K-major parameter accumulates as is)
        dwd = torch.empty_like(w_down) if do_dwd else None
        ready = side.ready() if do_dwd else None
        if _native_dz(cfg, cap, wd_t, r, dtype, go, zw):
            from tsct import native

            n_fs = max(1, min(cfg.glu.fs_dz_native, C.cdiv(f, 64)))
            part = native.glu_bwd_dz_bf16(go, offs, w_down.transpose(1, 2), zw, slices=n_fs, scatter_idx=sidx,
                                          xtile_cum=plan.xcum, max_tiles=plan.max_tiles,
                                          dw_out=dwd.transpose(1, 2) if do_dwd else None)  # [E, f, r] view
            FAMILY.count("native", "glu_bwd_dz")
        else:
            bn = cfg.glu.bn_bwd
            n_fs = max(1, min(cfg.glu.fs_bwd, C.cdiv(f, bn)))
            f_slice = C.cdiv(C.cdiv(f, bn), n_fs) * bn
            n_fs = C.cdiv(f, f_slice)
            part = torch.empty(n_fs, m, r, device=dev, dtype=torch.float32)
            vec_dz = specs.dz_vec(cfg, al, wd_t, dtype.itemsize)
            _launch("glu_bwd_dz", (plan.max_tiles, nrb, n_fs),
                    [go, sidx, offs, plan.xcum, w_down, zw, part, dwd, e, m, r, f, f_slice],
                    dict(HAS_SCATTER=sidx is not None, DO_DWD=do_dwd, VEC=vec_dz, WD_T=wd_t, BM=bm, BR=br, BN=bn,
                         BLOCK_E=cfg.shared.block_e),
                    *specs.dz_warps_stages(cfg, vec_dz, wd_t), al, cap, dev)
        if do_dwd:
            with side.fork(ready):
                C.dwd_chunks(plan, go, sidx, offs, zw, dwd, wd_t, r, f, br, cfg, al, cap)
            res[3] = dwd
        # 3. the GLU backward on the row tiles: dhg, dhu, d rw; d sg, d su summed per expert
        dhg, dhu, dsg, dsu, drw = C.bwd_epilogue(plan, hg, hu, part, offs, sg, su, rw, dtype, want[4] or want[5],
                                                 cfg, cap)
        C.scale_grads(res, want, dsg, dsu, drw, s_gate, s_up, row_weight)

        # 4. dX on the row tiles (and dWg / dWu of the one-tile experts), beside it the other experts' dWg / dWu,
        # chunked
        do_dx, do_dw = want[0], want[1] or want[2]
        if do_dx or do_dw:
            dwg = torch.empty_like(w_gate) if do_dw else None
            dwu = torch.empty_like(w_up) if do_dw else None
            dx_rows = torch.empty(m, d, device=dev, dtype=dtype) if do_dx else None
            ready = side.ready() if do_dw else None
            bd, ndb = cfg.glu.bd_bwd, cfg.glu.ndb_bwd
            _launch("glu_bwd_dx_dw", (plan.max_tiles, C.cdiv(d, bd * ndb)),
                    [x, gidx, offs, plan.xcum, w_gate, w_up, dhg, dhu, dx_rows, dwg, dwu, e, d, r, x.stride(0)],
                    dict(HAS_GATHER=gidx is not None, DO_DX=do_dx, DO_DW=do_dw, BM=bm, BD=bd, BR=br, NDB=ndb,
                         BLOCK_E=cfg.shared.block_e),
                    cfg.glu.warps_bwd_dxdw, cfg.glu.stages_bwd_dxdw, al, cap, dev)
            if do_dw:
                with side.fork(ready):
                    C.dw_chunks(plan, x, gidx, offs, dhg, dhu, dwg, dwu, d, r, br, cfg, al, cap)
            if do_dx:
                res[0] = C.dx_from_rows(dx_rows, gather_idx, scatter_idx, offs, x.shape[0], num_out_rows, saved,
                                        cfg, cap)
            if want[1]:
                res[1] = dwg
            if want[2]:
                res[2] = dwu
    return res
