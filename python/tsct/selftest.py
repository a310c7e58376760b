"""Small self-tests of each runnable path against an independent float64 computation.

Used by ``tsct-probe`` and, for paths never executed on their hardware (sm_120), by dispatch on
first use in a process (design.md section 4). Each test returns a ``Result`` and never raises for a
numerical disagreement: the caller decides what a failure means.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import torch

# rel-Frobenius tolerance per compute dtype: bf16 operands land between 1e-3 and 1e-2 (METHOD.md)
_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@dataclasses.dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float


def _problem(device, dtype, seed=0):
    """A small routed problem with an empty expert, odd f and padding rows; float64 master copy."""
    g = torch.Generator().manual_seed(seed)
    tokens, topk, experts, d, r, f, pad = 24, 2, 5, 64, 16, 37, 3
    ids = torch.randint(0, experts, (tokens * topk,), generator=g)
    ids[ids == 2] = 3  # expert 2 is empty
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    tok = order // topk
    gather = torch.cat([tok, torch.zeros(pad, dtype=tok.dtype)])
    p64 = dict(
        x=torch.randn(tokens, d, generator=g, dtype=torch.float64),
        w_gate=torch.randn(experts, d, r, generator=g, dtype=torch.float64) / math.sqrt(d),
        w_up=torch.randn(experts, d, r, generator=g, dtype=torch.float64) / math.sqrt(d),
        w_down=torch.randn(experts, r, f, generator=g, dtype=torch.float64) / math.sqrt(r),
        s_gate=1 + 0.1 * torch.randn(experts, r, generator=g, dtype=torch.float64),
        s_up=1 + 0.1 * torch.randn(experts, r, generator=g, dtype=torch.float64),
        row_weight=torch.rand(tokens * topk + pad, generator=g, dtype=torch.float64),
    )
    idx = dict(offs=offs, gather_idx=gather, scatter_idx=gather, num_out_rows=tokens)
    return p64, idx, ids[order]


def _expected(p64, idx, expert_of_row):
    """float64 per-row computation, written from design.md section 2 (not the reference path)."""
    valid = int(idx["offs"][-1])
    out = torch.zeros(idx["num_out_rows"], p64["w_down"].shape[2], dtype=torch.float64)
    for i in range(valid):
        e = int(expert_of_row[i])
        xi = p64["x"][int(idx["gather_idx"][i])]
        gg = (xi @ p64["w_gate"][e]) * p64["s_gate"][e]
        uu = (xi @ p64["w_up"][e]) * p64["s_up"][e]
        out[int(idx["scatter_idx"][i])] += ((torch.nn.functional.silu(gg) * uu) @ p64["w_down"][e]) * p64["row_weight"][i]
    return out


def grouped_glu(path: str, device: torch.device, dtype: torch.dtype = torch.bfloat16, fmt: str = "bf16") -> Result:
    """Run ``grouped_glu(impl=path)`` on a small problem and compare with float64.

    ``fmt`` "nvfp4"/"sign" quantizes the factors first; the expectation then uses the dequantized
    factors (same math), so the tolerance stays the compute dtype's.
    """
    from tsct import quant
    from tsct.ops import grouped_glu as op

    t0 = time.perf_counter()
    name = f"grouped_glu[{path}, {fmt}, {str(dtype).replace('torch.', '')}]"
    try:
        p64, idx, eor = _problem(device, dtype)
        p = {k: v.to(device, dtype) for k, v in p64.items()}
        facs = [p["w_gate"], p["w_up"], p["w_down"]]
        if fmt != "bf16":
            qfn = quant.quantize_nvfp4 if fmt == "nvfp4" else quant.quantize_sign
            facs = [qfn(w) for w in facs]
            for k, w in zip(("w_gate", "w_up", "w_down"), facs):
                p64[k] = quant.dequantize(w, dtype=torch.float32).double().cpu()
        ix = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in idx.items()}
        y = op(p["x"], ix["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
               gather_idx=ix["gather_idx"], scatter_idx=ix["scatter_idx"], num_out_rows=ix["num_out_rows"],
               impl=path)
        want = _expected(p64, idx, eor)
        got = y.double().cpu()
        if not torch.isfinite(got).all():
            return Result(name, False, "non-finite output", time.perf_counter() - t0)
        err = ((got - want).norm() / want.norm()).item()
        tol = _TOL[dtype]
        return Result(name, err < tol, f"rel err {err:.2e} (tol {tol:.0e})", time.perf_counter() - t0)
    except Exception as exc:  # a self-test reports, it does not crash the probe
        return Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def native_quant(device: torch.device) -> list[Result]:
    """CUDA quantize/decode kernels against the torch reference, bit for bit, on a small random input."""
    from tsct import quant

    out = []
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(3, 64, 200, generator=g) * torch.logspace(-3, 3, 200)).to(device, torch.bfloat16)
    for layout in ("linear", "swizzled_128x4"):
        t0 = time.perf_counter()
        name = f"nvfp4 quantize+decode native vs torch [{layout}]"
        try:
            a = quant.quantize_nvfp4(w, layout=layout, backend="native")
            b = quant.quantize_nvfp4(w, layout=layout, backend="torch")
            same = (torch.equal(a.codes, b.codes)
                    and torch.equal(a.block_scale.view(torch.uint8), b.block_scale.view(torch.uint8))
                    and torch.equal(a.global_scale, b.global_scale))
            da = quant.dequantize(a, backend="native")
            db = quant.dequantize(b, backend="torch")
            same_dec = torch.equal(da.view(torch.int16), db.view(torch.int16))
            out.append(Result(name, same and same_dec, "bit-exact" if same and same_dec else
                              f"MISMATCH (encode equal: {same}, decode equal: {same_dec})", time.perf_counter() - t0))
        except Exception as exc:
            out.append(Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0))
    t0 = time.perf_counter()
    try:
        a = quant.quantize_sign(w, backend="native")
        b = quant.quantize_sign(w, backend="torch")
        same = torch.equal(a.bits, b.bits) and torch.equal(
            quant.dequantize(a, backend="native").view(torch.int16), quant.dequantize(b, backend="torch").view(torch.int16))
        out.append(Result("sign pack+decode native vs torch", same, "bit-exact" if same else "MISMATCH",
                          time.perf_counter() - t0))
    except Exception as exc:
        out.append(Result("sign pack+decode native vs torch", False, f"{type(exc).__name__}: {exc}",
                          time.perf_counter() - t0))
    return out
