"""Host side of the low-bit grouped GLU (path "triton-lowbit"): factors read packed, decoded in registers.

Signatures and semantics as ``tsct.reference`` / ``tsct.kernels.triton_glu``, except that each of
``w_gate``, ``w_up``, ``w_down`` may be an ``NVFP4Tensor``, a ``SignTensor``, an ``FP8Tensor``, a
``TernaryTensor`` or a dense tensor (any mix).
The result equals the reference run on ``tsct.quant.dequantize``'d factors (same math; the tests
check it in fp32 with the interpreter and in bf16 on the GPU).

Shared with the bf16 path (``tsct.kernels.triton_common``, the Triton runtime both families use): tile configs per
arch, the tile map (``runtime.tile_cum``), the deterministic combines (``runtime.combine``), the padding zeroing
(``runtime.zero_tail``), the backward's plan, its chunked dW kernels and the weight-free backward epilogue
(``glu_bwd_epi``), all through the runtime's launcher (AOT cubin or JIT). The four kernels that touch factors are this
package's (``_kernels.py``); ``_launch`` here runs them from the AOT cubins of the "lowbit" family (``specs.py``: the
variant table, built into the wheel by ``triton_common/aot_build.py``) when the install has the launch's
specialization, else through Triton JIT (``TSCT_TRITON_BACKEND=auto|aot|jit`` as the bf16 path; ``backend_counts()``
counts which ran).

Layout: NVFP4 block scales must be ``"linear"`` here; a ``"swizzled_128x4"`` container is converted
with ``tsct.quant.to_layout`` on every call (an explicit, counted conversion: ``layout_conversions()``;
store linear for this path). 2-D containers are a batch of one (E = 1).

Training (STE, design.md section 3). ``grouped_glu_backward`` returns, in the factor slots, the
gradient with respect to the DECODED factor, dense ``[E, K, N]`` in x.dtype, for every factor whose
``needs_grad`` flag is set (a packed container has no ``.grad`` of its own). Under STE that IS the
gradient of the master factor, so there are two ways to train:

1. Masters in the graph (simplest, bf16 bytes): ``w_hat = tsct.quant.fake_quantize(master, fmt)`` each
   step, then ``tsct.ops.grouped_glu(x, offs, w_hat, ...)`` on the dense path; autograd carries dW to
   the master through fake_quantize's identity backward.
2. Packed forward, STE to the masters (this path's bytes): ``wq = tsct.ops.quantize_master(master, fmt)``
   (cached per master version: re-quantized once per optimizer step) and
   ``tsct.ops.grouped_glu(x, offs, wq_g, wq_u, wq_d, ..., masters=(wg, wu, wd))`` (decision 0008). The
   backward reads the packed factors for dX and returns dW_hat (this module's backward) as the masters'
   gradient. Without ``masters`` the packed factors get no gradient and the op still returns dX,
   d s_gate, d s_up and d row_weight (what a frozen low-bit model fine-tuning the router or scales needs).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tsct import native
from tsct.kernels import launch, record
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_lowbit import specs as LS
from tsct.quant import FP8Tensor, NVFP4Tensor, SignTensor, TernaryTensor, to_layout

__all__ = ["grouped_glu_forward", "grouped_glu_forward_saved", "saved_like", "grouped_glu_backward", "down_forward",
           "factor_format", "layout_conversions", "launch_counts", "backend_counts"]

DENSE, NVFP4, SIGN, FP8, TERNARY, TERNARY_R1 = LS.DENSE, LS.NVFP4, LS.SIGN, LS.FP8, LS.TERNARY, LS.TERNARY_R1
_FMT_NAMES = {DENSE: "dense", NVFP4: "nvfp4", SIGN: "sign", FP8: "fp8", TERNARY: "ternary", TERNARY_R1: "ternary"}
# Warps of the kernels that decode (the bf16 tiles otherwise): specs.WARPS_DECODE (8; 4 spill on sm_90).
WARPS_DECODE = LS.WARPS_DECODE

_lock = threading.Lock()
_conversions: collections.Counter = collections.Counter()
FAMILY = launch.Family("triton-lowbit", LS, "tsct.kernels.triton_lowbit._kernels")


def layout_conversions() -> dict[str, int]:
    """{factor name: swizzled -> linear block-scale conversions done by this path} since process start."""
    with _lock:
        return dict(_conversions)


def launch_counts() -> dict[str, int]:
    """{kernel: launches (AOT or JIT)} of this package's kernels since process start."""
    out: collections.Counter = collections.Counter()
    for (_, kernel), n in FAMILY.backend_counts().items():
        out[kernel] += n
    return dict(out)


def backend_counts() -> dict[tuple[str, str], int]:
    """{("aot" | "jit", kernel): launches} of this package's kernels since process start."""
    return FAMILY.backend_counts()


def factor_format(w) -> int:
    """The kernels' FMT constexpr of a factor (``specs``: DENSE .. TERNARY_R1); TypeError for anything else."""
    if isinstance(w, NVFP4Tensor):
        return NVFP4
    if isinstance(w, SignTensor):
        return SIGN
    if isinstance(w, FP8Tensor):
        return FP8
    if isinstance(w, TernaryTensor):
        return TERNARY if w.scale_k is None else TERNARY_R1
    if isinstance(w, Tensor):
        return DENSE
    raise TypeError(f"a factor must be a torch.Tensor, NVFP4Tensor, SignTensor, FP8Tensor or TernaryTensor, got "
                    f"{type(w).__name__}")


def _factor_shape(w) -> tuple[int, int, int]:
    if isinstance(w, Tensor):
        return tuple(w.shape)
    return (w.batch, w.k, w.n)


def _dense16(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` contiguous, with its rows packed (row stride = row length) and 16-byte aligned: ``t`` itself when it
    is, else a copy (exact). A view at an odd offset (a slice of a larger buffer, the gradient of a torch.cat)
    would otherwise run the generic variants, which the AOT table leaves out where the formats make every shape
    aligned (``specs.always_aligned``)."""
    if t is None:
        return None
    if t.is_contiguous() and t.data_ptr() % 16 == 0 and (t.dim() < 2 or t.stride(-2) == t.shape[-1]):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _factor_args(name: str, w, dtype: torch.dtype) -> tuple[int, list]:
    """(FMT, [p0, p1, p2]) of one factor, as ``_kernels.py`` reads it: each tensor contiguous and 16-byte aligned
    (``_dense16``; the kernels read NVFP4 codes as 32-bit words)."""
    fmt = factor_format(w)
    if fmt == DENSE:
        return fmt, [_dense16(w if w.dtype == dtype else w.to(dtype)), None, None]
    if fmt == NVFP4:
        if w.layout != "linear":
            w = to_layout(w, "linear")
            with _lock:
                _conversions[name] += 1
            log = record.active()
            if log is not None:  # counted per call: a replay would not count it (store linear for this path)
                log.append(("unreplayable", "a block-scale layout conversion"))
        # a linear block scale is [E, N, K/16] (a 2-D factor's too: stored as a batch of one, NVFP4Tensor)
        p = [w.codes, w.block_scale.view(torch.uint8), w.global_scale]
    elif fmt == FP8:  # E4M3 codes as their raw bytes (decoded by bits in the kernels)
        p = [w.codes.view(torch.uint8), None, w.scale_n]
    elif fmt in (TERNARY, TERNARY_R1):
        p = [w.codes, None if fmt == TERNARY else w.scale_k, w.scale_n]  # scale_k: the rank-1 scaling's
    else:
        p = [w.bits, w.scale_k, w.scale_n]
    return fmt, [_dense16(t) for t in p]


def _launch(kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
            aligned: bool, cap: tuple, device: torch.device, maxnreg: int = 0) -> None:
    """Launch one of this package's kernels (runtime parameters in ``specs.KERNELS`` order; None = a
    pointer the flags leave unread) on the current stream: the AOT cubin of its specialization when the
    install has it (``TSCT_TRITON_BACKEND`` not "jit"), else Triton JIT; "aot" never JITs. ``maxnreg``: the
    variant's register cap (0: none)."""
    FAMILY.launch(kernel, grid, args, consts, num_warps, num_stages, aligned, cap, device, maxnreg)


def _dims(x, offs, w_gate, w_down, gather_idx):
    """(E, d, r, f, M); TypeError unless offs is int32 (the kernels' index type; ``tsct.ops`` checks it too, this
    module's direct callers are not re-validated otherwise)."""
    if offs.dtype != torch.int32:
        raise TypeError(f"offs must be int32 (cumulative END offsets, tsct.ops.grouped_glu), got {offs.dtype}")
    e, d, r = _factor_shape(w_gate)
    f = _factor_shape(w_down)[2]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    return e, d, r, f, m


def _aligned(x: Tensor, d: int, r: int, *packed: list) -> bool:
    """The aligned variants may run: d, r, x's row stride multiples of 16 and the factor storage 16-byte
    aligned (``_launch`` re-checks the hinted pointers of each kernel)."""
    return C.aligned_launch(d, r, x.stride(0), x, *[t for p in packed for t in p if isinstance(t, Tensor)])


# Alignment (bytes) the CUDA kernels need of each packed storage tensor (_factor_args order; None slots unread), by
# format.
_NATIVE_ALIGN = {NVFP4: (16, 4, 4), SIGN: (8, 16, 4), FP8: (16, 1, 4), TERNARY: (16, 1, 4), TERNARY_R1: (16, 16, 4)}


def _native_packed(kernel: str, cap: tuple[int, int], fmt: int, *packed: list) -> bool:
    """The dispatch has the CUDA row of the Triton kernel ``kernel`` for this format on this arch
    (``tsct.dispatch.CUDA_KERNELS``) and the packed storage is aligned as the CUDA kernel reads it."""
    if fmt not in _NATIVE_ALIGN or not C.cuda_kernel(kernel, cap, _FMT_NAMES[fmt]):
        return False
    return all(t is None or t.data_ptr() % a == 0 for p in packed for t, a in zip(p, _NATIVE_ALIGN[fmt]))


def _native_down(cap: tuple[int, int], fg: int, fu: int, x: Tensor, r: int, d: int, pg: list, pu: list) -> bool:
    """Whether lowbit_down_fwd runs as the CUDA kernel (csrc/glu/down_nvfp4.cu): a row of the dispatch for this
    arch and format (``_native_packed``), w_gate and w_up of one format (NVFP4, sign, fp8 or ternary with one
    scaling) with their packed storage aligned as the kernel reads it, bf16 x with 16-byte aligned rows, r = 64,
    d % 64 == 0, on a GPU with the native library loaded and the kernel's shared memory (offs: int32 and
    contiguous, as ``_dims`` and every entry point make sure)."""
    if not (fg == fu and r == 64 and d % 64 == 0 and x.is_cuda and x.dtype == torch.bfloat16
            and x.stride(0) % 8 == 0 and x.stride(0) >= d and x.data_ptr() % 16 == 0
            and _native_packed("lowbit_down_fwd", cap, fg, pg, pu)):
        return False
    return C.native_smem_ok(f"tsctk_glu_down_fwd_{_FMT_NAMES[fg]}", x.device)


def _native_tiles(offs: Tensor, cum: Tensor, max_tiles: int, m: int, cfg, cap) -> tuple[Tensor, int]:
    """The tile map of the CUDA kernels (``native.GLU_DOWN_TILE`` rows per tile) from the Triton path's
    (``cfg.shared.bm`` rows): the same one when the sizes agree, else counted again."""
    if cfg.shared.bm == native.GLU_DOWN_TILE:
        return cum, max_tiles
    return C.tile_cum(offs, native.GLU_DOWN_TILE, cap), C.cdiv(m, native.GLU_DOWN_TILE) + offs.shape[0]


def _down(x, gidx, offs, cum, max_tiles, fg, pg, fu, pu, sg, su, rw, z, hg, hu, m, cfg, aligned, cap) -> None:
    """The down projection + GLU into ``z`` (and hg, hu when given: the BWD mode, whose z carries
    ``rw``): the CUDA kernel where ``_native_down`` allows, else the Triton kernel ``lowbit_down_fwd``.
    ``sg`` / ``su``: ``runtime.scales_in``'s (fp32 or x's dtype; the CUDA kernel reads either, the Triton one fp32).
    ``cum`` / ``max_tiles``: the tile map of ``cfg.shared.bm`` rows (the CUDA kernel's tiles are 64 rows)."""
    e, r, d = offs.shape[0], z.shape[1], x.shape[1]
    if _native_down(cap, fg, fu, x, r, d, pg, pu):
        cum, max_tiles = _native_tiles(offs, cum, max_tiles, m, cfg, cap)
        native.glu_down_fwd_lowbit(x, offs, cum, tuple(pg), tuple(pu), fmt=_FMT_NAMES[fg], m=m, max_tiles=max_tiles,
                                   gather_idx=gidx, s_gate=sg, s_up=su, row_weight=rw, save=hg is not None,
                                   out=(z, hg, hu), validate=False)  # _native_down and the op checked them
        FAMILY.count("native", "lowbit_down_fwd")
        return
    if sg is not None and sg.dtype != torch.float32:  # the Triton kernel's scales are fp32
        sg, su = C.scales_f32(sg, su)
    br = LS.rank_block(cfg)
    bwd = hg is not None
    _launch("lowbit_down_fwd", (max_tiles, C.cdiv(r, br)),
            [x, gidx, offs, cum, *pg, *pu, sg, su, z, hg, hu, rw, e, d, r, x.stride(0)],
            dict(FMT_G=fg, FMT_U=fu, HAS_GATHER=gidx is not None, HAS_SG=sg is not None, HAS_SU=su is not None,
                 HAS_RW=rw is not None, BWD=bwd, PLANES=LS.down_planes(cfg, fg, fu, cfg.shared.bk), BM=cfg.shared.bm,
                 BR=br, BK=cfg.shared.bk, BLOCK_E=cfg.shared.block_e),
            WARPS_DECODE, cfg.lowbit.stages_down_lb, aligned, cap, x.device)


def _native_up(cap: tuple[int, int], fd: int, z: Tensor, y: Tensor, r: int, pd: list) -> bool:
    """Whether lowbit_up_fwd runs as the CUDA kernel (csrc/glu/up_nvfp4.cu): a row of the dispatch for this arch
    and w_down's format (``_native_packed``: NVFP4, sign, fp8, ternary) with its packed storage aligned as the
    kernel reads it, r = 64, bf16 z, y rows 16-byte aligned (the padded y of the combine, or f % 8 == 0), on a GPU
    with the native library and the kernel's shared memory (offs as for ``_native_down``)."""
    if not (r == 64 and z.is_cuda and z.dtype == torch.bfloat16 and y.shape[1] % 8 == 0 and y.data_ptr() % 16 == 0
            and z.data_ptr() % 16 == 0 and _native_packed("lowbit_up_fwd", cap, fd, pd)):
        return False
    return C.native_smem_ok(f"tsctk_glu_up_fwd_{_FMT_NAMES[fd]}", z.device)


def _up(z, offs, cum, max_tiles, fd, pd, rw, y, f, m, cfg, aligned, cap, pad: bool) -> None:
    """The up projection into ``y`` ([m, ldy]; ``pad``: ldy is a multiple of 8 and the columns [f, ldy), if any, may
    be written: the combine's padded buffer, or rows of f % 8 == 0 elements): the CUDA kernel where ``_native_up``
    allows, else the Triton kernel ``lowbit_up_fwd``.
    ``rw`` (fp32 or None) multiplies each row; ``cum`` / ``max_tiles``: the tile map of ``cfg.shared.bm`` rows."""
    e, r = offs.shape[0], z.shape[1]
    if _native_up(cap, fd, z, y, r, pd):
        cum, max_tiles = _native_tiles(offs, cum, max_tiles, m, cfg, cap)
        native.glu_up_fwd_lowbit(z, offs, cum, tuple(pd), y, fmt=_FMT_NAMES[fd], f=f, max_tiles=max_tiles,
                                 row_weight=rw, validate=False)  # _native_up and the op checked them
        FAMILY.count("native", "lowbit_up_fwd")
        return
    single_k, bk_up = LS.up_k(r, aligned)
    _launch("lowbit_up_fwd", (max_tiles,), [z, offs, cum, *pd, rw, y, e, r, f, y.shape[1]],
            dict(FMT_D=fd, HAS_RW=rw is not None, SINGLE_K=single_k, Y_PAD=pad, DEC16=LS.up_dec16(cfg, bk_up),
                 PLANES=LS.up_planes(cfg, fd, single_k, bk_up),
                 BM=cfg.shared.bm, BN=cfg.lowbit.bn_up_lb, BK=bk_up, BLOCK_E=cfg.shared.block_e),
            cfg.lowbit.warps_up_lb, cfg.lowbit.stages_up_lb, aligned, cap, z.device)


def grouped_glu_forward(
    x: Tensor,
    offs: Tensor,
    w_gate,
    w_up,
    w_down,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
) -> Tensor:
    """Forward: ``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; dtype x.dtype. Factors may
    be dense tensors, NVFP4Tensor (linear block scales preferred), SignTensor, FP8Tensor or TernaryTensor, in
    any mix."""
    return _forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                    save=False)[0]


def saved_like(x: Tensor, w_gate, gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor] = None,
               num_out_rows: Optional[int] = None) -> list[Tensor]:
    """Empty tensors shaped like what ``grouped_glu_forward_saved`` saves (the custom op's fake)."""
    return C.saved_like_r(x, _factor_shape(w_gate)[2], gather_idx, scatter_idx, num_out_rows)


def grouped_glu_forward_saved(
    x: Tensor,
    offs: Tensor,
    w_gate,
    w_up,
    w_down,
    s_gate: Optional[Tensor] = None,
    s_up: Optional[Tensor] = None,
    row_weight: Optional[Tensor] = None,
    gather_idx: Optional[Tensor] = None,
    scatter_idx: Optional[Tensor] = None,
    num_out_rows: Optional[int] = None,
) -> tuple[Tensor, list[Tensor]]:
    """The forward plus what the backward would recompute: [hg, hu] (fp32, [M, r], second-level scales
    applied) and z * row_weight (x.dtype, [M, r]). Pass the list to ``grouped_glu_backward(saved=...)``:
    it then skips re-running the down kernel (reading x and both packed factors again). As on the bf16
    path, the up projection then applies the row weight to z before its rounding (a rounding difference
    only), and with ``scatter_idx`` the list also holds the combine's CSR for the dX combine
    (``triton_common.runtime.combine_forward`` / ``dx_csr``)."""
    return _forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
                    save=True)


def _forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows,
             save: bool) -> tuple[Tensor, list[Tensor]]:
    e, d, r, f, m = _dims(x, offs, w_gate, w_down, gather_idx)
    n_out = num_out_rows if scatter_idx is not None else m
    dtype = x.dtype
    if e == 0 or m == 0 or f == 0 or n_out == 0 or d == 0 or r == 0:
        # nothing computed; zeros keep the saved tensors defined (the backward returns zeros then)
        return x.new_zeros(n_out, f), ([t.zero_() for t in saved_like(x, w_gate, gather_idx, scatter_idx, n_out)]
                                       if save else [])
    dev = x.device
    cap = C.device_capability(dev)
    cfg = C.tile_config(cap)
    x = _dense16(x)
    offs = offs.contiguous()
    fg, pg = _factor_args("w_gate", w_gate, dtype)
    fu, pu = _factor_args("w_up", w_up, dtype)
    fd, pd = _factor_args("w_down", w_down, dtype)
    sg, su = C.scales_in(s_gate, s_up, dtype)
    rw = C.as_f32(row_weight)
    gidx = C.as_i64(gather_idx)
    bm = cfg.shared.bm
    aligned = _aligned(x, d, r, pg, pu, pd)
    max_tiles = C.cdiv(m, bm) + e

    with C.csr_overlap(scatter_idx, offs, m, n_out, cap) as pending:  # the combine's CSR beside the projections
        z = torch.empty(m, r, device=dev, dtype=dtype)
        saved: list[Tensor] = []
        if save:  # the backward's recompute, done here (the down kernel's BWD mode): hg, hu and z * rw
            hg = torch.empty(m, r, device=dev, dtype=torch.float32)
            hu = torch.empty(m, r, device=dev, dtype=torch.float32)
            saved = [hg, hu, z]
            cum = C.zero_saved_tails(saved, offs, bm, cap)  # op outputs: padding rows defined
            _down(x, gidx, offs, cum, max_tiles, fg, pg, fu, pu, sg, su, rw, z, hg, hu, m, cfg, aligned, cap)
            rw = None  # already in z
        else:
            cum = C.tile_cum(offs, bm, cap)
            _down(x, gidx, offs, cum, max_tiles, fg, pg, fu, pu, sg, su, None, z, None, None, m, cfg, aligned, cap)
        if scatter_idx is not None:
            ldy = C.cdiv(f, 8) * 8  # padded row stride: vector stores and combine loads
            y = torch.empty(m, ldy, device=dev, dtype=dtype)
        else:
            ldy = f
            y = torch.empty(m, f, device=dev, dtype=dtype)
        _up(z, offs, cum, max_tiles, fd, pd, rw, y, f, m, cfg, aligned, cap, pad=ldy % 8 == 0)
    if scatter_idx is not None:
        return C.combine_forward(y, scatter_idx, offs, n_out, f, cfg, cap, saved, save, pending.csr), saved
    C.zero_tail(y, offs, e, cfg, cap)
    return y, saved


def down_forward(x: Tensor, offs: Tensor, w_gate, w_up, s_gate: Optional[Tensor] = None,
                 s_up: Optional[Tensor] = None, gather_idx: Optional[Tensor] = None) -> Tensor:
    """The latent alone: ``z = silu(x W_gate s_g) * (x W_up s_u)``, ``[M, r]`` in x.dtype, for the rows of
    each expert (rows at or past ``offs[-1]`` are left unwritten). The first kernel of
    ``grouped_glu_forward``."""
    e, d, r, _, m = _dims(x, offs, w_gate, w_gate, gather_idx)
    z = torch.empty(m, r, device=x.device, dtype=x.dtype)
    if e == 0 or m == 0 or d == 0 or r == 0:
        return z.zero_()
    cap = C.device_capability(x.device)
    cfg = C.tile_config(cap)
    x = _dense16(x)
    fg, pg = _factor_args("w_gate", w_gate, x.dtype)
    fu, pu = _factor_args("w_up", w_up, x.dtype)
    sg, su = C.scales_in(s_gate, s_up, x.dtype)
    gidx = C.as_i64(gather_idx)
    offs = offs.contiguous()
    bm = cfg.shared.bm
    _down(x, gidx, offs, C.tile_cum(offs, bm), C.cdiv(m, bm) + e, fg, pg, fu, pu, sg, su, None, z, None,
          None, m, cfg, _aligned(x, d, r, pg, pu), cap)
    return z


def grouped_glu_backward(
    grad_out: Tensor,
    x: Tensor,
    offs: Tensor,
    w_gate,
    w_up,
    w_down,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    needs_grad: Sequence[bool],
    saved: Optional[Sequence[Tensor]] = None,
) -> list[Optional[Tensor]]:
    """Gradients w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight).

    ``saved``: the list ``grouped_glu_forward_saved`` returned for these inputs ([hg, hu, z * rw]);
    without it the down kernel runs again to recompute them.

    dX is computed through the decoded factors (read packed, decoded in registers). A factor slot gets
    the gradient w.r.t. the DECODED factor, dense ``[E, K, N]`` (a dense factor's dtype, else x.dtype),
    when its flag is set: the STE gradient of its master (module docstring). Scales and row weights
    as the bf16 path. None where not needed or the input is None.
    """
    inputs = [x, w_gate, w_up, w_down, s_gate, s_up, row_weight]
    want = [bool(n) and t is not None for n, t in zip(needs_grad, inputs)]
    res: list[Optional[Tensor]] = [None] * 7
    if not any(want):
        return res
    e, d, r, f, m = _dims(x, offs, w_gate, w_down, gather_idx)
    dtype = x.dtype
    dev = x.device

    def wdtype(w):
        return w.dtype if isinstance(w, Tensor) else dtype

    if e == 0 or m == 0 or f == 0 or d == 0 or r == 0:
        for i, t in enumerate(inputs):
            if want[i]:
                res[i] = (torch.zeros_like(t) if isinstance(t, Tensor)
                          else torch.zeros(_factor_shape(t), device=dev, dtype=dtype))
        return res
    cap = C.device_capability(dev)
    cfg = C.tile_config(cap)
    x = _dense16(x)
    offs = offs.contiguous()
    go = _dense16(grad_out if grad_out.dtype == dtype else grad_out.to(dtype))
    fg, pg = _factor_args("w_gate", w_gate, dtype)
    fu, pu = _factor_args("w_up", w_up, dtype)
    fd, pd = _factor_args("w_down", w_down, dtype)
    sg, su = C.scales_in(s_gate, s_up, dtype)  # glu_bwd_epi and _down read them as given
    rw = C.as_f32(row_weight)
    gidx, sidx = C.as_i64(gather_idx), C.as_i64(scatter_idx)
    bm, br = cfg.shared.bm, LS.rank_block(cfg)
    nrb = C.cdiv(r, br)
    aligned = _aligned(x, d, r, pg, pu, pd)

    do_dwd = want[3]
    do_dx, do_dw = want[0], want[1] or want[2]
    # the schedule (the shared runtime's: tile map, chunk map, slots) and the slots' workspace
    plan = C.bwd_plan(offs, m, max(r * f if do_dwd else 0, 2 * d * r if do_dw else 0), cfg, cap)
    if saved:
        hg, hu, zw = saved[:3]
    else:  # 1. recompute hg, hu (fp32, second-level scales applied) and z*rw
        hg = torch.empty(m, r, device=dev, dtype=torch.float32)
        hu = torch.empty(m, r, device=dev, dtype=torch.float32)
        zw = torch.empty(m, r, device=dev, dtype=dtype)
        _down(x, gidx, offs, plan.cum, plan.max_tiles, fg, pg, fu, pu, sg, su, rw, zw, hg, hu, m, cfg, aligned, cap)
    with C.SideWork(dev) as side:  # the chunked dW kernels beside the row kernels, joined before the return
        # 2. dz0 partials over f slices on the row tiles (and dWd_hat of the one-tile experts); beside it the other
        #    experts' dWd_hat (no factor involved: the shared chunked kernels on dense tensors). With one f slice
        #    (LS.fuse_dz_epi) the dz kernel runs step 3's GLU backward on its complete dz0 instead of storing it.
        al_dense = C.aligned_launch(d, r, x.stride(0), x)  # the chunked kernels read only dense tensors
        dwd = torch.empty((e, r, f), device=dev, dtype=wdtype(w_down)) if do_dwd else None
        ready = side.ready() if do_dwd else None
        bn = cfg.lowbit.bn_dz_lb
        fuse = LS.fuse_dz_epi(cfg, fd, e, m, r)
        n_fs = 1 if fuse else max(1, min(cfg.lowbit.fs_dz_lb, C.cdiv(f, bn)))
        f_slice = C.cdiv(C.cdiv(f, bn), n_fs) * bn
        n_fs = C.cdiv(f, f_slice)
        epi = C.epi_outputs(plan, m, r, nrb, sg is not None, dtype, dev) if fuse else None
        part = None if fuse else torch.empty(n_fs, m, r, device=dev, dtype=torch.float32)
        has_s, has_rw = fuse and sg is not None, fuse and rw is not None
        _launch("lowbit_bwd_dz", (plan.max_tiles, nrb, n_fs),
                [go, sidx, offs, plan.xcum, *pd, zw, part, dwd,
                 *((hg, hu, sg, su, rw, *epi) if fuse else (None,) * 10), e, m, r, f, f_slice],
                dict(FMT_D=fd, HAS_SCATTER=sidx is not None, DO_DWD=do_dwd, FUSE_EPI=fuse, HAS_SG=has_s, HAS_SU=has_s,
                     HAS_RW=has_rw, BM=bm, BR=br, BN=bn, BLOCK_E=cfg.shared.block_e),
                WARPS_DECODE, cfg.lowbit.stages_dz_lb, aligned, cap, dev, LS.dz_maxnreg(cfg, fuse))
        if do_dwd:
            with side.fork(ready):
                C.dwd_chunks(plan, go, sidx, offs, zw, dwd, False, r, f, CS.rank_block(cfg, r, al_dense), cfg,
                             al_dense, cap)
            res[3] = dwd
        # 3. the GLU backward on the row tiles (unless step 2 ran it), the scale sums: the shared weight-free kernels
        dhg, dhu, dsg, dsu, drw = C.bwd_epilogue(plan, hg, hu, part, offs, sg, su, rw, dtype, want[4] or want[5],
                                                 cfg, cap, fused=epi)
        C.scale_grads(res, want, dsg, dsu, drw, s_gate, s_up, row_weight)
        # 4. dX through the decoded factors on the row tiles (and dWg_hat, dWu_hat of the one-tile experts), beside
        #    it the other experts' dWg_hat, dWu_hat, chunked
        if do_dx or do_dw:
            dwg = torch.empty((e, d, r), device=dev, dtype=wdtype(w_gate)) if do_dw else None
            dwu = torch.empty((e, d, r), device=dev, dtype=wdtype(w_up)) if do_dw else None
            dx_rows = torch.empty(m, d, device=dev, dtype=dtype) if do_dx else None
            ready = side.ready() if do_dw else None
            bd = cfg.lowbit.bd_dxdw_lb
            ndb = LS.dxdw_ndb(cfg, fg, fu)
            _launch("lowbit_bwd_dx_dw", (plan.max_tiles, C.cdiv(d, bd * ndb)),
                    [x, gidx, offs, plan.xcum, *pg, *pu, dhg, dhu, dx_rows, dwg, dwu, e, d, r, x.stride(0)],
                    dict(FMT_G=fg, FMT_U=fu, HAS_GATHER=gidx is not None, DO_DX=do_dx, DO_DW=do_dw, BM=bm, BD=bd,
                         BR=br, NDB=ndb, BLOCK_E=cfg.shared.block_e),
                    WARPS_DECODE, cfg.lowbit.stages_dxdw_lb, aligned, cap, dev)
            if do_dw:
                with side.fork(ready):
                    C.dw_chunks(plan, x, gidx, offs, dhg, dhu, dwg, dwu, d, r, CS.rank_block(cfg, r, al_dense), cfg,
                                al_dense, cap)
            if do_dx:
                res[0] = C.dx_from_rows(dx_rows, gather_idx, scatter_idx, offs, x.shape[0], num_out_rows, saved,
                                        cfg, cap)
            if want[1]:
                res[1] = dwg
            if want[2]:
                res[2] = dwu
    return res
