"""Host side of the W4A4 kernels: NVFP4 activation quantizer and the grouped NVFP4 x NVFP4 up-projection.

    quantize_rows(x) -> RowNVFP4(codes [M, K/2] u8, block_scale [M, K/16] float8_e4m3fn (linear),
                                 row_scale [M] fp32 encode scales)
    up_forward(z_q, offs, w_down, row_weight=None, out_dtype=bf16, fsplit=1) -> y [M, f]

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

import collections
import dataclasses
import importlib.util
import os
import threading
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tsct.kernels.triton_glu.glu import _type_of  # one type table (specs.DTYPE_TYPES) for every family
from tsct.kernels.triton_w4a4 import specs

BACKEND_ENV = "TSCT_TRITON_BACKEND"
_counts: collections.Counter = collections.Counter()
_lock = threading.Lock()


def backend_counts() -> dict:
    with _lock:
        return dict(_counts)


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
    return (0, 0) if device.type != "cuda" else tuple(torch.cuda.get_device_capability(device))


def _config(cap) -> specs.Config:
    from tsct.kernels.triton_glu.specs import ARTIFACT_ARCH
    return dataclasses.replace(specs.CONFIGS.get(ARTIFACT_ARCH.get(tuple(cap), ""), specs.CONFIGS["sm_90a"]))


def _hints_hold(kernel: str, named: dict, consts: dict) -> bool:
    for p in specs.KERNELS[kernel].hinted:
        if specs.is_used(kernel, p, consts):
            v = named[p]
            if (v.data_ptr() if isinstance(v, Tensor) else int(v)) % 16:
                return False
    return True


def _launch(kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
            cap: tuple, device: torch.device) -> None:
    info = specs.KERNELS[kernel]
    named = dict(zip(info.params, args))
    aligned = _hints_hold(kernel, named, consts)
    mode = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if mode != "jit":  # a CPU tensor's capability is (0, 0): no artifact arch, so JIT (the interpreter)
        from tsct.kernels import aot

        arch = aot.artifact_arch(cap)
        k, key = None, ""
        if arch is not None:
            types = {p: _type_of(named[p]) for p in info.params}
            key = specs.spec_key(kernel, types, consts, num_warps, num_stages, aligned)
            k = aot.kernel(arch, key)
            if k is None and aligned:
                key = specs.spec_key(kernel, types, consts, num_warps, num_stages, False)
                k = aot.kernel(arch, key)
        if k is not None:
            k.launch(grid, [v.data_ptr() if isinstance(v, Tensor) else v for v in args],
                     torch.cuda.current_stream(device).cuda_stream)
            with _lock:
                _counts[("aot", kernel)] += 1
            return
        if mode == "aot" or importlib.util.find_spec("triton") is None:
            raise RuntimeError(f"tsct triton-w4a4: no AOT variant {key or kernel} for compute capability {cap}")
    from tsct.kernels.triton_w4a4 import _kernels as K

    dummy = next(v for v in args if isinstance(v, Tensor))
    getattr(K, kernel)[grid](*[dummy if v is None else v for v in args], **consts, num_warps=num_warps,
                             num_stages=num_stages)
    with _lock:
        _counts[("jit", kernel)] += 1


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


def _tile_cum(offs: Tensor, bm: int) -> Tensor:
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    return torch.cumsum(torch.div(counts + (bm - 1), bm, rounding_mode="floor"), 0, dtype=torch.int32)


def up_forward(z_q: RowNVFP4, offs: Tensor, w_down, row_weight: Optional[Tensor] = None,
               out_dtype: torch.dtype = torch.bfloat16, fsplit: int = 1) -> Tensor:
    """y [M, f] = (z_hat @ w_down_hat[e]) * row_weight for rows of expert e, on the NVFP4 codes: the
    products run in ``tl.dot_scaled`` (fp32 accumulation) and the two encode scales and the row
    weight are applied once per row in the epilogue. Rows past offs[-1] are zeros."""
    from tsct.quant import to_layout

    if w_down.layout != "linear":
        w_down = to_layout(w_down, "linear")
    e, r, f = w_down.shape if len(w_down.shape) == 3 else (1,) + tuple(w_down.shape)
    m = z_q.codes.shape[0]
    if z_q.shape[1] != r:
        raise ValueError(f"up_forward: z has {z_q.shape[1]} columns, w_down has r = {r}")
    cap = _capability(z_q.codes.device)
    cfg = _config(cap)
    y = torch.zeros((m, f), dtype=out_dtype, device=z_q.codes.device)  # padding rows stay zero
    if m == 0 or f == 0:
        return y
    cum = _tile_cum(offs, cfg.bm)
    rw = None if row_weight is None else row_weight.float().contiguous()
    single = specs.up_single_k(cfg, r)
    grid = (_cdiv(m, cfg.bm) + e, fsplit)
    _launch("w4a4_up_fwd", grid, [z_q.codes, z_q.block_scale, z_q.row_scale, offs, cum, w_down.codes,
            w_down.block_scale, w_down.global_scale, rw, y, e, r, f, f, fsplit],
            dict(HAS_RW=rw is not None, SINGLE_K=single, BM=cfg.bm, BN=cfg.bn_up, BK=cfg.bk, BLOCK_E=cfg.block_e),
            cfg.warps_up, cfg.stages_up, cap, z_q.codes.device)
    return y


# ---- the whole forward pass with the W4A4 up-projection (benchmark arm "tsct-w4a4-nvfp4") ------------

def runnable(capability: Optional[tuple]) -> tuple[bool, str]:
    """Whether the W4A4 pass can run here, and how it would run (the label the benchmark reports).

    Only through this install's cubins: sm_90a (Triton's bf16 emulation of ``tl.dot_scaled``: "emulated
    (sm_90)") and sm_120 (native OMMA, built as sm_120f; never executed by us). Triton JIT is not offered:
    the H200 image's Triton 3.6 crashes compiling the sm_90 emulation (decision 0005)."""
    from tsct.kernels import aot

    if capability is None:
        return False, "not runnable: needs a CUDA GPU"
    arch = aot.artifact_arch(capability)
    if arch not in specs.AOT_ARCHS:
        return False, (f"not runnable: the W4A4 kernels ship cubins for {', '.join(specs.AOT_ARCHS)} only "
                       f"(compute capability {capability[0]}.{capability[1]})")
    idx = aot.index(arch)
    if not idx or "w4a4" not in (idx.get("families") or {}):
        return False, f"not runnable: this install has no W4A4 cubins for {arch}"
    if arch == "sm_90a":
        return True, "emulated (sm_90): tl.dot_scaled lowered to bf16 HGMMA (e2m1 x UE4M3 decoded in registers)"
    return True, "native (sm_120f OMMA.SF block-scaled MMA); not executed on an sm_120 card by us"


def glu_forward(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate: Optional[Tensor] = None,
                s_up: Optional[Tensor] = None, row_weight: Optional[Tensor] = None,
                gather_idx: Optional[Tensor] = None, scatter_idx: Optional[Tensor] = None,
                num_out_rows: Optional[int] = None) -> Tensor:
    """Forward only (no autograd): the grouped GLU with the up-projection in W4A4.

    The latent z comes from the low-bit path's down kernel (W4A16: ``triton_lowbit.glu.down_forward``,
    factors decoded in registers), is quantized per row to NVFP4 (``quantize_rows``) and multiplied by
    the NVFP4 ``w_down`` in ``tl.dot_scaled`` (``up_forward``, row weight in the epilogue); with
    ``scatter_idx`` the rows are summed per token by the bf16 path's deterministic combine. Shapes and
    conventions as ``tsct.ops.grouped_glu``; ``w_down`` must be an ``NVFP4Tensor``. Returns x.dtype.

    Raises:
        TypeError: ``w_down`` is not an NVFP4Tensor.
    """
    from tsct.kernels.triton_glu import glu as G
    from tsct.kernels.triton_lowbit import glu as L
    from tsct.quant import NVFP4Tensor

    if not isinstance(w_down, NVFP4Tensor):
        raise TypeError(f"glu_forward: w_down must be an NVFP4Tensor (W4A4), got {type(w_down).__name__}")
    z = L.down_forward(x, offs, w_gate, w_up, s_gate, s_up, gather_idx)
    y = up_forward(quantize_rows(z), offs, w_down, row_weight, out_dtype=x.dtype)
    if scatter_idx is None:
        return y
    cap = G._capability(x.device)
    return G._combine(y, scatter_idx, offs, num_out_rows, G._config(cap), cap)
