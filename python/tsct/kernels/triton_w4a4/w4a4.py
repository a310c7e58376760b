"""Host side of the W4A4 kernels: NVFP4 activation quantizer, grouped NVFP4 x NVFP4 down- and up-projections,
the whole pass (forward, and its straight-through backward on the low-bit kernels).

    quantize_rows(x) -> RowNVFP4(codes [M, K/2] u8, block_scale [M, K/16] float8_e4m3fn (linear),
                                 row_scale [M] fp32 encode scales)
    down_forward(x, offs, w_gate, w_up, s_gate, s_up, gather_idx, row_weight, save) -> (z [M, r], saved)
    up_forward(z_q, offs, w_down, row_weight=None, out_dtype=bf16, fsplit=1) -> y [M, f]
    grouped_glu_forward[_saved](x, offs, w_gate, w_up, w_down, ...) / grouped_glu_backward(...)
    glu_forward = grouped_glu_forward (the benchmark arm's entry)

Activation recipe (both GEMMs): decision 0002 with ONE ROW as the matrix (second-level scale per row,
s_row = 2688 / amax(row)), by the ``nvfp4_quant_rows`` kernel, not fused into the GEMMs: x is quantized once
per TOKEN (token-major [T, d]) and the down kernel gathers the codes per routed row (a fused quantizer would
read the gathered bf16 rows twice, amax then quantize: 268 MB at b1 against 67 + 19 + 38 MB); z per routed row.
Factor layout: every factor is K-blocked as ``tl.dot_scaled`` wants (K = d for w_gate / w_up, r for w_down).

``w_down`` is an ``NVFP4Tensor`` of logical shape ``[E, r, f]`` in the LINEAR block-scale layout
(codes ``[E, f, r/2]``, scales ``[E, f, r/16]``, encode scales ``[E]``); a swizzled one is converted
(``tsct.quant.to_layout``), never read as linear.

Launch: every kernel goes through ``_launch`` with its runtime parameters in ``specs.KERNELS`` order,
so the same grids and arguments feed the AOT cubins (``tsct.kernels.aot``, looked up by
``specs.spec_key`` in the arch's index) or Triton JIT (``TSCT_TRITON_BACKEND`` as in triton_glu).
Sync-free: the tile map (``cum``) is built on the device; nothing reads a device value on the host.
CPU tensors run through Triton's interpreter (TRITON_INTERPRET=1; see ``emulation.py`` for the
interpreter's e4m3-scale bug and the patch the CPU tests apply).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tsct.kernels import launch
from tsct.kernels.triton_w4a4 import specs


def backend_counts() -> dict:
    """{("aot" | "jit", kernel): launches} of this package's kernels since process start."""
    return FAMILY.backend_counts()


@dataclasses.dataclass(frozen=True)
class RowNVFP4:
    """Rows quantized to NVFP4 with a per-row second-level (encode) scale; decode:
    x_hat[i, k] = (e2m1(code) * float(block_scale[i, k // 16])) / row_scale[i]."""
    codes: Tensor
    block_scale: Tensor
    row_scale: Tensor

    @property
    def shape(self) -> tuple:
        return (self.codes.shape[0], 2 * self.codes.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        from tsct.quant.nvfp4 import _dequantize_blocks_torch

        m, kh = self.codes.shape
        x = _dequantize_blocks_torch(self.codes.reshape(m, 1, kh), self.block_scale.reshape(m, 1, kh // 8),
                                     self.row_scale)
        return x.reshape(m, 2 * kh).to(dtype)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _capability(device: torch.device) -> tuple:
    from tsct.kernels.triton_glu import glu as G
    return G._capability(device)


def _config(cap) -> specs.Config:
    from tsct.kernels import aot
    from tsct.kernels.triton_glu.specs import table_arch
    arch = table_arch(aot.artifact_arch(tuple(cap))) or ""
    return dataclasses.replace(specs.CONFIGS.get(arch, specs.CONFIGS["sm_90a"]))


FAMILY = launch.Family("triton-w4a4", specs, "tsct.kernels.triton_w4a4._kernels")


def _launch(kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
            cap: tuple, device: torch.device) -> None:
    """Launch through the shared launcher (tsct.kernels.launch): the aligned variant when every hinted
    parameter is 16-divisible, else the generic one; Triton JIT when no cubin fits (TSCT_TRITON_BACKEND)."""
    FAMILY.launch(kernel, grid, args, consts, num_warps, num_stages, True, cap, device)


def quantize_rows(x: Tensor) -> RowNVFP4:
    """NVFP4 codes + linear UE4M3 block scales + per-row encode scales of x [M, K] (K % 16 == 0; unit
    stride along K). The 0002 recipe with one row as the matrix; bit-identical to the torch recipe."""
    if x.dim() != 2 or x.shape[1] % 16 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"quantize_rows: x must be [M, K] with K % 16 == 0 and unit K stride, got "
                         f"{list(x.shape)} strides {list(x.stride())}")
    m, k = x.shape
    codes = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device)
    sf = torch.empty((m, k // 16), dtype=torch.float8_e4m3fn, device=x.device)
    senc = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        cap = _capability(x.device)
        cfg = _config(cap)
        _launch("nvfp4_quant_rows", (_cdiv(m, cfg.quant_bm),), [x, codes, sf.view(torch.uint8), senc, m, k,
                x.stride(0)], dict(BM=cfg.quant_bm, BK=cfg.quant_bk), cfg.warps_quant, 1, cap, x.device)
    return RowNVFP4(codes, sf, senc)


def _tile_cum(offs: Tensor, bm: int, cap: tuple) -> Tensor:
    """The bf16 forward's tile map (inclusive cumulative row tiles per expert): one launch on a GPU."""
    from tsct.kernels.triton_glu import glu as G
    return G._tile_cum(offs, bm, cap)


def up_forward(z_q: RowNVFP4, offs: Tensor, w_down, row_weight: Optional[Tensor] = None,
               out_dtype: torch.dtype = torch.bfloat16, fsplit: int = 1) -> Tensor:
    """y [M, f] = (z_hat @ w_down_hat[e]) * row_weight for rows of expert e, on the NVFP4 codes: the
    products run in ``tl.dot_scaled`` (fp32 accumulation) and the two encode scales and the row
    weight are applied once per row in the epilogue. Rows past offs[-1] are zeros."""
    e, r, f = _nvfp4_dims("w_down", w_down)
    m = z_q.codes.shape[0]
    if z_q.shape[1] != r:
        raise ValueError(f"up_forward: z has {z_q.shape[1]} columns, w_down has r = {r}")
    y = torch.zeros((m, f), dtype=out_dtype, device=z_q.codes.device)  # padding rows stay zero
    if m == 0 or f == 0:
        return y
    cap = _capability(z_q.codes.device)
    _up_launch(z_q, offs, _tile_cum(offs, _config(cap).bm, cap), _nvfp4_args("w_down", w_down), row_weight, y, f,
               fsplit, cap)
    return y


def _up_launch(z_q: RowNVFP4, offs: Tensor, cum: Tensor, wd: list, row_weight: Optional[Tensor], y: Tensor, ldy: int,
               fsplit: int, cap: tuple) -> None:
    cfg = _config(cap)
    e, r, f = wd[3]
    rw = None if row_weight is None else row_weight.float().contiguous()
    grid = (_cdiv(z_q.codes.shape[0], cfg.bm) + e, fsplit)
    _launch("w4a4_up_fwd", grid, [z_q.codes, z_q.block_scale, z_q.row_scale, offs, cum, *wd[:3], rw, y, e, r, f, ldy,
                                  fsplit],
            dict(HAS_RW=rw is not None, SINGLE_K=specs.up_single_k(cfg, r), BM=cfg.bm, BN=cfg.bn_up, BK=cfg.bk,
                 BLOCK_E=cfg.block_e),
            cfg.warps_up, cfg.stages_up, cap, z_q.codes.device)


def _nvfp4_dims(name: str, w) -> tuple[int, int, int]:
    """(E, K, N) of an NVFP4 factor (a 2-D one is a batch of one); TypeError naming the argument otherwise."""
    from tsct.quant import NVFP4Tensor

    if not isinstance(w, NVFP4Tensor):
        raise TypeError(f"{name} must be an NVFP4Tensor for the W4A4 path (tl.dot_scaled multiplies NVFP4 codes), "
                        f"got {type(w).__name__}")
    return (w.batch, w.k, w.n)


def _nvfp4_args(name: str, w) -> list:
    """[codes [E, N, K/2] u8, block scales [E, N, K/16] float8_e4m3fn (LINEAR), encode scales [E] fp32, (E, K, N)]
    as the kernels read them; a swizzled container is converted (``tsct.quant.to_layout``), never read as linear."""
    dims = _nvfp4_dims(name, w)
    if w.layout != "linear":
        from tsct.quant import to_layout

        w = to_layout(w, "linear")
    b, k, n = dims
    return [w.codes.contiguous(), w.block_scale.reshape(b, n, k // 16).contiguous(), w.global_scale.contiguous(), dims]


# ---- down-projection in W4A4 ---------------------------------------------------------------------

def _validate(x: Tensor, w_gate, w_up, w_down, gather_idx: Optional[Tensor]) -> tuple:
    """(E, d, r, f, M) after the W4A4 path's own checks (the rest of ``tsct.ops``' validation is the caller's):
    every factor an NVFP4Tensor, shapes [E, d, r] / [E, d, r] / [E, r, f], x [*, d] in bf16 / fp16 / fp32.
    ``w_down`` None: the down-projection alone (f = 0)."""
    e, d, r = _nvfp4_dims("w_gate", w_gate)
    if _nvfp4_dims("w_up", w_up) != (e, d, r):
        raise ValueError(f"w_up has shape {list(w_up.shape)}, w_gate {list(w_gate.shape)}: both must be [E, d, r]")
    f = 0
    if w_down is not None:
        ed, rd, f = _nvfp4_dims("w_down", w_down)
        if (ed, rd) != (e, r):
            raise ValueError(f"w_down has shape {list(w_down.shape)}; with w_gate {list(w_gate.shape)} it must be "
                             f"[{e}, {r}, f]")
    if x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"x must be [rows, d] with d = {d} (the K of w_gate), got {list(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    return e, d, r, f, m


def _i64(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.to(torch.int64).contiguous()


def _scales(s_gate: Optional[Tensor], s_up: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """Both per-rank scales as fp32 (exact), or neither; a lone scale gets a ones partner (as triton_glu)."""
    if s_gate is None and s_up is None:
        return None, None
    ref = s_gate if s_gate is not None else s_up
    sg = s_gate.float().contiguous() if s_gate is not None else torch.ones_like(ref, dtype=torch.float32)
    su = s_up.float().contiguous() if s_up is not None else torch.ones_like(ref, dtype=torch.float32)
    return sg, su


def down_forward(x: Tensor, offs: Tensor, w_gate, w_up, s_gate: Optional[Tensor] = None,
                 s_up: Optional[Tensor] = None, gather_idx: Optional[Tensor] = None,
                 row_weight: Optional[Tensor] = None, save: bool = False) -> tuple[Tensor, list]:
    """The latent in W4A4: ``z = silu((x_hat @ Wg_hat[e]) * s_gate[e]) * ((x_hat @ Wu_hat[e]) * s_up[e])``.

    x_hat: each row of x quantized to NVFP4 with its own second-level scale (decision 0002 with one row as
    the matrix: ``quantize_rows``, a separate kernel). With ``gather_idx`` the token-major x ``[T, d]`` is
    quantized ONCE per token and the down kernel gathers the codes of routed row i from token gather_idx[i]:
    a row's encoding depends on the row alone, so this equals quantizing every routed row, at 1/top-k of the
    quantizer's work. The products run in ``tl.dot_scaled`` on the codes (e2m1 x e2m1, UE4M3 block scales per
    16 elements of d, fp32 accumulation); the epilogue multiplies by 1 / (s_row * s_w[e]) per row and factor
    (one true division per row), then the per-rank scales and the SiLU-GLU (design.md section 2).

    Args: x [T, d] (with gather_idx) or [M, d], bf16 / fp16 / fp32, any row stride (copied if K is strided);
        offs [E] int32 cumulative END offsets; w_gate, w_up: NVFP4Tensor [E, d, r] (d, their block dimension,
        is a multiple of 16 by the format); s_gate, s_up: [E, r] or None; gather_idx [M] int or None;
        row_weight [M] or None (read with ``save`` only).
    Returns: (z [M, r] in x.dtype, saved): with ``save``, saved = [hg, hu, zw]: hg, hu fp32 [M, r] (x_hat @ W_hat,
        s not applied) and zw = z * row_weight in x.dtype (what the low-bit backward kernels read); else [].
        Rows at or past offs[-1] are left unwritten.
    Raises: TypeError (a factor not an NVFP4Tensor; x's dtype), ValueError (shapes), naming the argument.
    """
    _validate(x, w_gate, w_up, None, gather_idx)
    cap = _capability(x.device)
    return _down(x, offs.contiguous(), None, w_gate, w_up, s_gate, s_up, gather_idx, row_weight, save, cap)


def _saved_like(x: Tensor, r: int, gather_idx: Optional[Tensor]) -> list[Tensor]:
    """[hg, hu] fp32 and z * rw in x.dtype, [M, r] each: the bf16 family's saved tensors without its CSR."""
    from tsct.kernels.triton_glu import glu as G
    return G.saved_like_r(x, r, gather_idx, None, None)


def _down(x, offs, cum, w_gate, w_up, s_gate, s_up, gather_idx, row_weight, save, cap, saved=None):
    """``saved``: the saving forward's buffers when the caller allocated them (to zero their padding rows in the
    tile map's launch), else allocated here."""
    e, d, r = _nvfp4_dims("w_gate", w_gate)
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    dev = x.device
    z = torch.empty(m, r, device=dev, dtype=x.dtype)
    if not save:
        saved = []
    elif saved is None:
        saved = _saved_like(x, r, gather_idx)
    if e == 0 or m == 0 or r == 0:
        return z, saved
    if d == 0:  # no contraction: hg = hu = 0, z = 0 (exact)
        z.zero_()
        for t in saved:
            t.zero_()
        return z, saved
    cfg = _config(cap)
    if cum is None:
        cum = _tile_cum(offs, cfg.bm, cap)
    xq = quantize_rows(x if x.stride(1) == 1 else x.contiguous())  # token-major: once per token
    g, u = _nvfp4_args("w_gate", w_gate), _nvfp4_args("w_up", w_up)
    sg, su = _scales(s_gate, s_up)
    rw = None if (row_weight is None or not save) else row_weight.float().contiguous()
    gidx = _i64(gather_idx)
    hg, hu, zw = saved if save else (None, None, None)
    _launch("w4a4_down_fwd", (_cdiv(m, cfg.bm) + e, _cdiv(r, cfg.br_down)),
            [xq.codes, xq.block_scale, xq.row_scale, gidx, offs, cum, *g[:3], *u[:3], sg, su, rw, z, zw, hg, hu, e, d, r],
            dict(HAS_GATHER=gidx is not None, HAS_S=sg is not None, HAS_RW=rw is not None, SAVE=save, BM=cfg.bm,
                 BR=cfg.br_down, BK=cfg.bk_down, BLOCK_E=cfg.block_e),
            cfg.warps_down, cfg.stages_down, cap, dev)
    return z, saved


# ---- the whole pass: W4A4 down -> quantize z -> W4A4 up -> combine ---------------------------------

def runnable(capability: Optional[tuple]) -> tuple[bool, str]:
    """Whether the W4A4 pass can run here, and how it would run (the label the benchmark reports).

    Only through this install's cubins: sm_90a (Triton's bf16 emulation of ``tl.dot_scaled``: "emulated
    (sm_90)") and sm_120 (native OMMA, built as sm_120f; never executed by us). Triton JIT is not offered:
    the H200 image's Triton 3.6 crashes compiling the sm_90 emulation (decision 0005). An install whose W4A4
    cubins predate the down kernel (``w4a4_down_fwd``) is not runnable."""
    from tsct.kernels import aot

    if capability is None:
        return False, "not runnable: needs a CUDA GPU"
    arch = aot.artifact_arch(capability)
    if aot.proxy(arch) is not None:
        return False, (f"not runnable: this install is a proxy build ({arch}, docs/decisions/0016) without W4A4: "
                       "its sm_120 kernels are the block-scaled OMMA, which this GPU lacks")
    if arch not in specs.AOT_ARCHS:
        return False, (f"not runnable: the W4A4 kernels ship cubins for {', '.join(specs.AOT_ARCHS)} only "
                       f"(compute capability {capability[0]}.{capability[1]})")
    idx = aot.index(arch)
    if not idx or "w4a4" not in (idx.get("families") or {}):
        return False, f"not runnable: this install has no W4A4 cubins for {arch}"
    if not any(isinstance(v, dict) and v.get("kernel") == "w4a4_down_fwd" for v in (idx.get("kernels") or {}).values()):
        return False, f"not runnable: this install's W4A4 cubins for {arch} predate the W4A4 down kernel"
    if arch == "sm_90a":
        return True, "emulated (sm_90): tl.dot_scaled lowered to bf16 HGMMA (e2m1 x UE4M3 decoded in registers)"
    return True, "native (sm_120f OMMA.SF block-scaled MMA); not executed on an sm_120 card by us"


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
    save: bool = True,
) -> tuple[Tensor, list]:
    """The W4A4 grouped GLU forward and what its backward reads: (out, [hg, hu, zw]) (``save``) or (out, []).

    1. ``down_forward``: x quantized per token row (NVFP4, per-row second-level scale), gathered per routed row,
       W4A4 down-projection with SiLU-GLU -> z [M, r] in x.dtype (and hg, hu fp32, z*rw when saving);
    2. ``quantize_rows(z)``: z per routed row to NVFP4 (same recipe; its row scale is the z row's own);
    3. ``w4a4_up_fwd``: y = (z_hat @ Wd_hat[e]) * row_weight in ``tl.dot_scaled``, y in x.dtype;
    4. with ``scatter_idx``: the bf16 path's deterministic combine into ``[num_out_rows, f]``.
    Shapes and conventions as ``tsct.ops.grouped_glu`` (design.md section 2); every factor an ``NVFP4Tensor``.
    Sync-free (the tile map is built on the device), CUDA-graph capturable. Returns x.dtype; rows past
    offs[-1] are zeros without ``scatter_idx`` and contribute nothing with it.

    Raises: TypeError / ValueError naming the argument (``_validate``).
    """
    from tsct.kernels.triton_glu import glu as G

    e, d, r, f, m = _validate(x, w_gate, w_up, w_down, gather_idx)
    n_out = num_out_rows if scatter_idx is not None else m
    dev = x.device
    saved_empty = ([torch.zeros(m, r, device=dev, dtype=torch.float32), torch.zeros(m, r, device=dev,
                    dtype=torch.float32), torch.zeros(m, r, device=dev, dtype=x.dtype)] if save else [])
    if e == 0 or m == 0 or f == 0 or n_out == 0 or r == 0:
        return x.new_zeros(n_out, f), saved_empty
    cap = _capability(dev)
    cfg = _config(cap)
    offs = offs.contiguous()
    if save:  # op outputs (tsct::grouped_glu_q): padding rows defined, zeroed by the tile map's launch
        saved = _saved_like(x, r, gather_idx)
        cum = G.zero_saved_tails(saved, offs, cfg.bm, cap)
    else:
        saved, cum = None, _tile_cum(offs, cfg.bm, cap)
    z, saved = _down(x, offs, cum, w_gate, w_up, s_gate, s_up, gather_idx, row_weight, save, cap, saved)
    zq = quantize_rows(z)
    wd = _nvfp4_args("w_down", w_down)
    if scatter_idx is None:
        y = torch.zeros(m, f, device=dev, dtype=x.dtype)  # padding rows are zeros
        _up_launch(zq, offs, cum, wd, row_weight, y, f, 1, cap)
        return y, saved
    ldy = _cdiv(f, 8) * 8  # padded row stride: the combine's vector loads (pad columns never read)
    y = torch.empty(m, ldy, device=dev, dtype=x.dtype)
    _up_launch(zq, offs, cum, wd, row_weight, y, ldy, 1, cap)
    return G._combine(y, scatter_idx, offs, n_out, G._config(cap), cap, ncols=f), saved


def grouped_glu_forward(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate: Optional[Tensor] = None,
                        s_up: Optional[Tensor] = None, row_weight: Optional[Tensor] = None,
                        gather_idx: Optional[Tensor] = None, scatter_idx: Optional[Tensor] = None,
                        num_out_rows: Optional[int] = None) -> Tensor:
    """Forward only (no autograd, nothing saved): ``grouped_glu_forward_saved(..., save=False)[0]``.
    ``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; x.dtype."""
    return grouped_glu_forward_saved(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                                     scatter_idx, num_out_rows, save=False)[0]


#: the benchmark arm's entry (``tsct.bench.arms.w4a4_arm``); since the W4A4 down kernel the whole pass is W4A4
glu_forward = grouped_glu_forward


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
    """Gradients w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight) of the W4A4 forward, straight through.

    The activation quantizers (x rows, z rows) are passed straight through and the factors' gradients are those
    of the DECODED factors (STE, design.md section 3): the backward is the low-bit (W4A16) path's, evaluated at
    the W4A4 forward's own point: hg, hu and z*rw from ``saved`` (``grouped_glu_forward_saved``; recomputed by
    the W4A4 down kernel when None). Kernels: ``triton_lowbit``'s ``lowbit_bwd_dz`` (dz0 = dY Wd_hat^T per f
    slice, dWd_hat = (z rw)^T dY), ``triton_glu``'s ``glu_bwd_epi`` (GLU backward, d s, d rw), ``triton_lowbit``'s
    ``lowbit_bwd_dx_dw`` (dX = dh W_hat^T through the decoded factors, dW_hat = X^T dh with the unquantized x),
    and the deterministic combine of dX. So: dX and dW_hat use bf16 x / z, not their NVFP4 images; d rw uses z,
    not z_hat (the forward's y used z_hat).

    A factor slot gets dense ``[E, K, N]`` in x.dtype when its ``needs_grad`` flag is set (the STE gradient of
    its master); scales and row weight in their dtypes; None where not needed or the input is None.
    """
    from tsct.kernels.triton_lowbit import glu as L

    inputs = [x, w_gate, w_up, w_down, s_gate, s_up, row_weight]
    want = [bool(n) and t is not None for n, t in zip(needs_grad, inputs)]
    res: list[Optional[Tensor]] = [None] * 7
    if not any(want):
        return res
    e, d, r, f, m = _validate(x, w_gate, w_up, w_down, gather_idx)
    dtype, dev = x.dtype, x.device
    if e == 0 or m == 0 or f == 0 or d == 0 or r == 0:
        for i, t in enumerate(inputs):
            if want[i]:
                res[i] = (torch.zeros_like(t) if isinstance(t, Tensor)
                          else torch.zeros((e, t.k, t.n), device=dev, dtype=dtype))
        return res
    if saved is None or len(saved) != 3:
        _, saved = _down(x.contiguous(), offs.contiguous(), None, w_gate, w_up, s_gate, s_up, gather_idx, row_weight,
                         True, _capability(dev))
    # the low-bit backward at this forward's saved point (it reads hg, hu, z*rw instead of recomputing them)
    return L.grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                                  scatter_idx, num_out_rows, needs_grad, saved=list(saved))
