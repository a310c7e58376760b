"""An emulated stand-in for the native sm_120 GEMM entry, for tests on machines without sm_120.

``emulated_gemm`` (and ``emulated_sign_gemm`` for ``tsct.native.sm120_sign_grouped``) takes exactly the arguments of ``tsct.native.sm120_nvfp4_grouped`` (the C entry
``tsct_sm120_nvfp4_grouped``), checks the entry's argument contract (tsct.h), and computes the GEMM with
``tsct.emulation.grouped_gemm_emulated`` (the block-scaled m16n8k64 math read through the kernel's
addressing: tile map, per-expert swizzled scale offsets, interleaved gate/up rows) on the CPU, writing
the rows of every expert into ``c`` on c's device (other rows untouched, as the kernel does).

``glu.forward(..., gemm=emulated_gemm)`` then runs the whole sm120-fp4 forward with everything real
except the MMA kernels: the CUDA activation quantizer (``quant_backend="native"``), the host plan, the
combine. On a GPU that is design.md section 6's "the same math checked through an emulated path" for
every piece but the GEMM kernels' own fragment code (tests/kernels/test_sm120_fp4_emulated_gpu.py); on the
CPU it checks the host preparation (tests/kernels/test_sm120_fp4_dispatch.py). An oracle, never a fast
path (one host loop per tile).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tsct.emulation import plan
from tsct.emulation.nvfp4_mma import grouped_gemm_emulated, grouped_sign_gemm_emulated

TILE_M = 32


def emulated_gemm(variant: str, a: Tensor, b: Tensor, sfa: Tensor, sfa_offsets: Tensor, sfb: Tensor, c: Tensor,
                  offs: Tensor, tile_expert: Tensor, tile_row: Tensor, alpha: Tensor, ep0: Tensor,
                  ep1: Tensor) -> Tensor:
    """``tsct.native.sm120_nvfp4_grouped`` computed by the emulation (same arguments, same effect on c).

    Raises AssertionError if an argument breaks the C entry's contract (shapes, dtypes, the A row
    padding of the last tile, the [rows, 1] row-weight view of stride 1).
    """
    e, n, half_k = b.shape
    assert a.dtype == b.dtype == torch.uint8 and a.shape[1] == half_k and (2 * half_k) % 64 == 0, "a/b"
    assert c.dtype == torch.bfloat16 and c.stride(1) == 1, "c"
    assert offs.dtype == sfa_offsets.dtype == tile_expert.dtype == tile_row.dtype == torch.int32, "int32 args"
    assert alpha.shape == (e,) and alpha.dtype == torch.float32, "alpha"
    for t in (a, b, sfa, sfa_offsets, sfb, offs, tile_expert, tile_row, alpha, ep0, ep1):
        assert t.device == c.device and t.is_contiguous(), "one device, contiguous"
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    offs_c = cpu(offs)
    valid = int(offs_c[-1]) if e else 0
    assert a.shape[0] >= valid + TILE_M - 1, "A rows must cover the last tile's reads"
    assert sfb.view(torch.uint8).numel() == e * plan.sfb_bytes(1, n, 2 * half_k), "sfb size"
    if variant == "glu":
        assert c.shape[1] == n // 2 and ep0.shape == ep1.shape == (e, n // 2), "glu ep0/ep1"
        kw = dict(ep0=cpu(ep0), ep1=cpu(ep1))
    else:
        assert variant == "row_weight" and ep0.shape == (c.shape[0], 1) and ep0.stride(0) == 1, "row weights"
        kw = dict(ep0=cpu(ep0)[:, 0])  # the kernel reads ep0[row] through the [rows, 1] layout of stride 1
    sfb_swz = cpu(sfb).view(torch.uint8).reshape(e, -1).view(torch.float8_e4m3fn)
    out = grouped_gemm_emulated(cpu(a), cpu(sfa).view(torch.float8_e4m3fn), cpu(sfa_offsets), cpu(b), sfb_swz, offs_c,
                                cpu(tile_expert), cpu(tile_row), TILE_M, cpu(alpha), epilogue=variant,
                                out_dtype=torch.bfloat16, m_out=c.shape[0], **kw)
    c[:valid] = out[:valid].to(c.device)
    return c


def emulated_sign_gemm(variant: str, a: Tensor, bits: Tensor, sfa: Tensor, sfa_offsets: Tensor, col_scale: Tensor,
                       c: Tensor, offs: Tensor, tile_expert: Tensor, tile_row: Tensor, alpha: Tensor, ep0: Tensor,
                       ep1: Tensor) -> Tensor:
    """``tsct.native.sm120_sign_grouped`` computed by the emulation (same arguments, same effect on c).

    Raises AssertionError if an argument breaks the C entry's contract (P copies outermost, alpha [E, P]
    with P contiguous, sfa copy stride % 16, the [rows, 1] row-weight view).
    """
    p, e, n, k8 = bits.shape
    assert p == (2 if variant == "glu" else 1), "copies"
    assert a.dtype == bits.dtype == torch.uint8 and a.shape[0] == p and a.shape[2] == 4 * k8 and (8 * k8) % 64 == 0
    assert sfa.shape[0] == p and sfa.shape[1] % 16 == 0, "sfa copies"
    assert col_scale.shape == (p, e, n) and alpha.shape == (e, p), "col_scale / alpha"
    assert c.dtype == torch.bfloat16 and c.stride(1) == 1 and c.shape[1] == n, "c"
    for t in (a, bits, sfa, sfa_offsets, col_scale, offs, tile_expert, tile_row, alpha, ep0, ep1):
        assert t.device == c.device and t.is_contiguous(), "one device, contiguous"
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    offs_c = cpu(offs)
    valid = int(offs_c[-1]) if e else 0
    assert a.shape[1] >= valid + TILE_M - 1, "A rows must cover the last tile's reads"
    if variant == "glu":
        assert ep0.shape == ep1.shape == (e, n), "glu ep0/ep1"
        kw = dict(ep0=cpu(ep0), ep1=cpu(ep1))
    else:
        assert ep0.shape == (c.shape[0], 1) and ep0.stride(0) == 1, "row weights"
        kw = dict(ep0=cpu(ep0)[:, 0])
    out = grouped_sign_gemm_emulated(cpu(a), cpu(sfa).view(torch.float8_e4m3fn), cpu(sfa_offsets), cpu(bits),
                                     cpu(col_scale), offs_c, cpu(tile_expert), cpu(tile_row), TILE_M,
                                     cpu(alpha).t().contiguous(), epilogue=variant, out_dtype=torch.bfloat16,
                                     m_out=c.shape[0], **kw)
    c[:valid] = out[:valid].to(c.device)
    return c
