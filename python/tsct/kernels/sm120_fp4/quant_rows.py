"""The grouped activation quantizer of the sm_120 fp4 path: routed rows -> NVFP4 per expert.

The A operand of the grouped block-scaled GEMMs (CuTeDSL ``tsct_nvfp4_grouped_*_sm120``): routed rows
sorted by expert (``offs`` = int32 cumulative END offsets, as ``torch.nn.functional.grouped_mm``), each
expert's rows quantized as one NVFP4 matrix (E2M1 codes, UE4M3 block scales per 16 along K;
TransformerEngine's reference recipe, docs/decisions/0002) with

* codes ``[m_alloc, K/2]`` at the routed row (rows past ``offs[-1]`` and past M are 0);
* block scales in ONE flat buffer, expert e's ``[pad128(m_e), Kbp]`` block in the swizzled_128x4 layout
  (``tsct.quant.layout``) from byte ``sfa_offsets[e]`` (``tsct.emulation.plan.sfa_layout``), every
  other byte 0: each expert's rows padded to 128, the per-group layout CUTLASS/cuBLAS grouped
  block-scaled GEMMs read;
* the second-level scale: ONE fp32 encode scale per EXPERT, ``s_enc[e] = min(2688 / amax_e, FLT_MAX)``.

Why per expert (docs/sm120.md): the grouped GEMMs' epilogue takes one scalar per group
(``alpha[e] = 1 / (s_enc_x[e] * s_enc_w[e])``, CuTeDSL ``alpha [E]``), the
factors already carry one per expert, and the amax costs one pass with one atomic per (warp,
expert). Per tensor would let one expert's outlier flatten every other expert's block scales to
UE4M3's subnormal range; per row would need a per-row vector in every epilogue and a per-row amax
pass (better accuracy, a later option: the row_weight epilogue already loads a per-row vector).

``quantize_rows_grouped(..., backend="native")`` runs the CUDA kernel (``tsct.native``), ``"torch"``
the reference below, built from ``tsct.quant.quantize_nvfp4`` (one call per expert, a host loop:
an oracle, not a fast path). They agree bit for bit (tests/kernels/test_sm120_quant_rows_gpu.py; the
kernel's per-item code also runs on the CPU through a host harness, tests/kernels/test_sm120_quant_rows.py).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tsct.emulation import plan as _plan
from tsct.emulation.grouped_glu import QuantizedRows
from tsct.quant.nvfp4 import quantize_nvfp4

__all__ = ["QuantizedRows", "quantize_rows_grouped", "quantize_rows_grouped_torch"]


def _check(x: Tensor, offs: Tensor, gather_idx: Optional[Tensor], col_scale: Optional[Tensor]):
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [rows, K], got {getattr(x, 'shape', type(x))}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.shape[1] % 16:
        raise ValueError(f"x: K={x.shape[1]} must be a multiple of 16 for NVFP4")
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError(f"offs must be a 1-D int32 tensor (cumulative end offsets), got "
                        f"{getattr(offs, 'dtype', type(offs))} {list(getattr(offs, 'shape', []))}")
    if gather_idx is not None and (not isinstance(gather_idx, Tensor) or gather_idx.dim() != 1
                                   or gather_idx.dtype not in (torch.int32, torch.int64)):
        raise TypeError("gather_idx must be a 1-D int32/int64 tensor")
    if col_scale is not None and (not isinstance(col_scale, Tensor) or col_scale.dtype != torch.float32
                                  or tuple(col_scale.shape) != (offs.shape[0], x.shape[1])):
        raise ValueError(f"col_scale must be float32 [E, K] = [{offs.shape[0]}, {x.shape[1]}], got "
                         f"{getattr(col_scale, 'dtype', None)} {list(getattr(col_scale, 'shape', []))}")


def quantize_rows_grouped_torch(x: Tensor, offs: Tensor, *, gather_idx: Optional[Tensor] = None,
                                col_scale: Optional[Tensor] = None, m: Optional[int] = None,
                                m_alloc: Optional[int] = None) -> QuantizedRows:
    """Pure-torch reference of the grouped activation quantizer (same recipe, layout and bytes).

    Arguments and outputs as ``quantize_rows_grouped``. Reads ``offs`` on the host (a reference);
    a gather index out of range raises IndexError (the CUDA kernel poisons the block instead).
    """
    _check(x, offs, gather_idx, col_scale)
    rows_avail = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    m = rows_avail if m is None else m
    m_alloc = m if m_alloc is None else m_alloc
    if not 0 <= m <= rows_avail or m_alloc < m:
        raise ValueError(f"need 0 <= m <= {rows_avail} and m_alloc >= m, got m={m}, m_alloc={m_alloc}")
    k = x.shape[1]
    e_count = offs.shape[0]
    dev = x.device
    codes = torch.zeros(m_alloc, k // 2, dtype=torch.uint8, device=dev)
    sfa = torch.zeros(_plan.sfa_bytes_bound(m, e_count, k), dtype=torch.uint8, device=dev)
    s_enc = torch.ones(e_count, dtype=torch.float32, device=dev)
    sfa_offsets, _ = _plan.sfa_layout(offs, k)
    bounds = [0] + offs.tolist()
    offs_host = sfa_offsets.tolist()
    for e in range(e_count):
        lo, hi = bounds[e], bounds[e + 1]
        if hi <= lo:
            continue
        idx = torch.arange(lo, hi, device=dev)
        rows = x[gather_idx[idx].long()] if gather_idx is not None else x[lo:hi]
        if col_scale is not None:
            rows = rows.float() * col_scale[e].float()
        q = quantize_nvfp4(rows.t(), layout="swizzled_128x4", backend="torch")  # logical [K, m_e]
        codes[lo:hi] = q.codes[0]
        sw = q.block_scale[0].view(torch.uint8)  # [pad128(m_e) * Kbp]
        sfa[offs_host[e]:offs_host[e] + sw.numel()] = sw
        s_enc[e] = q.global_scale[0]
    return QuantizedRows(codes=codes, sfa=sfa.view(torch.float8_e4m3fn), sfa_offsets=sfa_offsets, s_enc=s_enc,
                         m=m, k=k)


def quantize_rows_grouped(x: Tensor, offs: Tensor, *, gather_idx: Optional[Tensor] = None,
                          col_scale: Optional[Tensor] = None, m: Optional[int] = None,
                          m_alloc: Optional[int] = None, backend: str = "auto") -> QuantizedRows:
    """NVFP4 of routed rows grouped by expert, laid out for the grouped block-scaled GEMMs.

    Args:
        x: ``[M, K]`` routed rows sorted by expert, or with ``gather_idx`` token-major ``[T, K]``;
            float32 / bfloat16 / float16; K % 16 == 0.
        offs: int32 ``[E]`` cumulative END offsets; rows at or past ``offs[-1]`` are padding.
        gather_idx: optional int32/int64 ``[M]``: routed row i reads ``x[gather_idx[i]]``.
        col_scale: optional float32 ``[E, K]``: row i of expert e is multiplied by it (fp32) first.
        m: routed rows (default: ``len(gather_idx)`` or ``x.shape[0]``).
        m_alloc: rows of the codes buffer (>= m; the GEMMs need ``plan.a_rows_alloc(m, tile_m)``).
        backend: "native" (CUDA kernel; RuntimeError if it cannot run), "torch" (reference, any
            device), "auto" (native for CUDA tensors when the library is available).
    Returns:
        ``QuantizedRows(codes [m_alloc, K/2] uint8, sfa float8_e4m3fn [plan.sfa_bytes_bound(M, E, K)],
        sfa_offsets int32 [E], s_enc float32 [E], m, k)``; the same bytes from both backends.
    Raises:
        TypeError / ValueError naming the argument; RuntimeError (native backend unavailable).
    """
    if backend not in ("auto", "native", "torch"):
        raise ValueError(f"backend must be 'auto', 'native' or 'torch', got {backend!r}")
    if backend == "auto":
        from tsct import native
        backend = "native" if x.device.type == "cuda" and native.available() else "torch"
    if backend == "torch":
        return quantize_rows_grouped_torch(x, offs, gather_idx=gather_idx, col_scale=col_scale, m=m,
                                           m_alloc=m_alloc)
    from tsct import native
    codes, sfa, sfa_offsets, s_enc = native.nvfp4_quantize_rows_grouped(
        x, offs, gather_idx=gather_idx, col_scale=col_scale, m=m, m_alloc=m_alloc)
    rows = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    return QuantizedRows(codes=codes, sfa=sfa, sfa_offsets=sfa_offsets, s_enc=s_enc,
                         m=rows if m is None else m, k=x.shape[1])
