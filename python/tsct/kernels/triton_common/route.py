"""Host side of ``tsct.ops.sort_by_expert`` on a GPU: ``route_rank`` -> ``torch.cumsum`` -> ``route_place``.

A stable counting sort in chunks of ``specs.ROUTE_B`` rows (kernels and the layout of their scratch in
``_kernels.py``): three launches and no host reads, where ``argsort`` + ``bincount`` + ``cumsum`` take about a
dozen small kernels (histogram, scan and two onesweep passes of the radix sort, the counts' scatter, ...).
``route_place`` also writes the combine's CSR over the tokens and links it to the token tensor
(``runtime.link_csr``): a ``grouped_glu`` that scatters through that token tensor with these offs then skips its own
CSR (a stable sort on a side stream).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tsct.kernels import replay
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import specs


def fits(m: int, num_experts: int) -> bool:
    """Whether the kernels suit M rows and E experts: their scratch holds (E + 1) counts per chunk of ``ROUTE_B``
    rows (and every chunk zeroes its E + 1), so for E large against the chunk count it outgrows torch's sort (8 GB
    and 63 ms at E = 2**20, M = 2**19 on the H200, against 0.2 ms); such calls take the torch path."""
    return (num_experts + 1) * C.cdiv(max(m, 1), specs.ROUTE_B) <= max(1 << 17, 4 * m)


def sort_by_expert(ids: Tensor, num_experts: int, weights: Optional[Tensor] = None, replayed: bool = False
                   ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """``(order, offs, token, row_weight)`` of ``tsct.ops.sort_by_expert`` for CUDA ``ids`` ``[T, K]`` (any integer
    dtype) and optional router ``weights`` ``[T, K]`` (bf16 / fp16 / fp32; row_weight fp32, None without
    weights). The caller has checked the arguments. ``replayed``: a plain eager call may repeat the launches recorded
    for its signature (``tsct.kernels.replay``); the CSR link is made either way."""
    if replayed:
        out = replay.call(lambda: _sorted(ids, num_experts, weights), [ids, weights], ("sort_by_expert", num_experts))
    else:
        out = _sorted(ids, num_experts, weights)
    order, offs, token, rw, rows, ptr = out
    if rows is not None:
        C.link_csr(token, offs, rows, ptr)
    return order, offs, token, rw


def _sorted(ids: Tensor, num_experts: int, weights: Optional[Tensor]) -> tuple:
    """The launches of ``sort_by_expert``: its four results and the combine's CSR over the tokens (None, None for
    no rows)."""
    t, k = ids.shape
    m, e, dev = t * k, num_experts, ids.device
    order = torch.empty(m, device=dev, dtype=torch.int64)
    token = torch.empty(m, device=dev, dtype=torch.int64)
    offs = torch.empty(e, device=dev, dtype=torch.int32)
    rw = torch.empty(m, device=dev, dtype=torch.float32) if weights is not None else None
    if m == 0:
        return order, offs.zero_(), token, rw, None, None
    flat = ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        flat = flat.to(torch.int32 if flat.dtype.itemsize < 4 else torch.int64)
    flat = flat.contiguous()
    w = weights.reshape(-1).contiguous() if weights is not None else None
    b = specs.ROUTE_B
    p = C.cdiv(m, b)
    srt = torch.empty(p * b, device=dev, dtype=torch.int32)
    rank = torch.empty(p * b, device=dev, dtype=torch.int32)
    hist = torch.empty((e + 1) * p, device=dev, dtype=torch.int32)
    cap = C.device_capability(dev)
    crank = torch.empty(m, device=dev, dtype=torch.int32)
    C.launch_kernel("route_rank", (p,), [flat, srt, rank, hist, crank, m, e, p, k], dict(B=b, EBLK=specs.ROUTE_EBLK),
                    specs.ROUTE_WARPS, 1, False, cap, dev)
    cum = torch.cumsum(hist, 0, dtype=torch.int32)
    rows = torch.empty(m, device=dev, dtype=torch.int64)  # the combine's CSR over the t tokens (runtime.link_csr)
    ptr = torch.empty(t + 1, device=dev, dtype=torch.int64)
    C.launch_kernel("route_place", (p,),
                    [srt, rank, hist, cum, crank, order, token, offs, w, rw, rows, ptr, m, e, p, k],
                    dict(HAS_W=w is not None, B=b), specs.ROUTE_WARPS, 1, False, cap, dev)
    return order, offs, token, rw, rows, ptr
