"""Random factors, their storage formats, and the rotating input sets of a run (all made outside timing).

Scales are chosen so every intermediate is O(1): x ~ N(0, 1); w_gate, w_up ~ N(0, 1/d); w_down ~ N(0, 1/r)
(normal / sqrt(fan_in)); s_gate, s_up ~ U(0.5, 1.5); router weights sum to 1 per token. The output
rows are then O(0.1..1). Nothing is zero, so unwritten outputs cannot hide.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from tsct.bench import routing
from tsct.bench.config import BenchConfig

FACTOR_NAMES = ("w_gate", "w_up", "w_down")
SCALE_NAMES = ("s_gate", "s_up")


@dataclasses.dataclass
class Factors:
    """One storage format of the expert bank. ``w_*`` are tensors (dense) or tsct.quant containers."""

    fmt: str                  # "bf16" / "fp16" / "fp32" for dense (tsct.quant.storage_format), or a packed format
    w_gate: object
    w_up: object
    w_down: object
    s_gate: Tensor
    s_up: Tensor

    @property
    def dense(self) -> bool:
        return isinstance(self.w_gate, Tensor)

    def factors(self) -> tuple:
        return (self.w_gate, self.w_up, self.w_down)

    def storage_bytes(self) -> int:
        """Bytes of the three factors in their storage format (``.nbytes`` of a container) + both scales."""
        total = 0
        for w in self.factors():
            total += w.numel() * w.element_size() if isinstance(w, Tensor) else int(w.nbytes)
        return total + sum(s.numel() * s.element_size() for s in (self.s_gate, self.s_up))

    def leaves(self) -> list[Tensor]:
        """The tensors a backward differentiates: dense factors and the scales (packed factors hold no
        master weights, so their gradient does not flow; tsct.ops.grouped_glu docstring)."""
        ws = [w for w in self.factors() if isinstance(w, Tensor)]
        return ws + [self.s_gate, self.s_up]

    def leaf_names(self) -> list[str]:
        names = [n for n, w in zip(FACTOR_NAMES, self.factors()) if isinstance(w, Tensor)]
        return names + list(SCALE_NAMES)

    def dequantized(self, dtype: torch.dtype, backend: str = "torch") -> "Factors":
        """Dense copy (detached) with every factor decoded to ``dtype``; scales cast to ``dtype``.

        Decoding uses tsct.quant's pure-torch backend by default: the references must not depend on the
        native kernels a benchmark may be exercising for the first time.
        """
        from tsct import quant

        ws = [w.dequantize(dtype, backend) if quant.is_quantized(w) else w.detach().to(dtype) for w in self.factors()]
        return Factors(quant.storage_format(ws[0]), *ws, self.s_gate.detach().to(dtype), self.s_up.detach().to(dtype))


#: Bytes of fp32 factor values the reference holds at once for a packed factor (decoded a chunk of experts at a
#: time): the whole bank in fp32 is 40 GB at E 16384 with b1's d, r, f, more than an 80 GB GPU has beside the run.
REFERENCE_CHUNK_BYTES = 1 << 30


class _Fp32Experts:
    """``w[e]`` ([K, N], fp32) of a packed factor for the reference's per-expert loop: the values
    ``w.dequantize(torch.float32, "torch")`` holds, decoded ``chunk`` experts at a time (no fp32 copy of the
    whole bank)."""

    def __init__(self, w, chunk: int):
        self.w, self.shape, self.chunk = w, tuple(w.shape), chunk
        self._e0, self._vals = 0, None

    def __getitem__(self, e: int) -> Tensor:
        if self._vals is None or not self._e0 <= e < self._e0 + self._vals.shape[0]:
            self._e0 = e - e % self.chunk
            e1 = min(self._e0 + self.chunk, self.shape[0])
            # [chunk, K, N], contiguous as dequantize() gives it: a product over one or two rows rounds by layout
            self._vals = self.w._decode_torch(self._e0, e1).transpose(-1, -2).contiguous()
        return self._vals[e - self._e0]


def reference_output(fac: Factors, x: Tensor, ids: Tensor, weights: Tensor, experts: int) -> Tensor:
    """The whole pass by the fp32 reference (``tsct.reference.glu``: each expert's products in fp32, the fixed-order
    combine), routed by ``tsct.ops.sort_by_expert`` as the timed arms are: ``[T, f]`` fp32. The factors are read in
    fp32 one expert at a time (dense ones upcast exactly; packed ones decoded by the torch backend,
    ``REFERENCE_CHUNK_BYTES`` at a time), so a bank far larger than the GPU's free memory in fp32 still has its
    reference. Same values as the reference call on ``fac.dequantized(torch.float32)``."""
    from tsct.ops import sort_by_expert
    from tsct.reference import glu as R

    def fp32(w):
        if isinstance(w, Tensor):
            return w.detach()  # the reference takes w[e].float() per expert
        return _Fp32Experts(w, max(1, REFERENCE_CHUNK_BYTES // (4 * w.k * w.n)))

    with torch.no_grad():
        s = sort_by_expert(ids, experts, weights.detach().float())
        return R.grouped_glu_forward(x.detach().float(), s.offs, fp32(fac.w_gate), fp32(fac.w_up), fp32(fac.w_down),
                                     fac.s_gate.detach(), fac.s_up.detach(), s.row_weight, s.token, s.token,
                                     x.shape[0])


def make_dense_factors(cfg: BenchConfig) -> Factors:
    """Dense factors in the compute dtype, requiring grad (the master weights of the benchmark)."""
    from tsct import quant

    dev, dt = cfg.torch_device, cfg.torch_dtype
    g = torch.Generator(device=dev).manual_seed(cfg.seed)
    e, d, r, f = cfg.experts, cfg.d, cfg.r, cfg.f

    def normal(shape, fan_in):
        w = torch.randn(shape, generator=g, device=dev, dtype=torch.float32).mul_(fan_in ** -0.5)
        return w.to(dt).requires_grad_(True)

    def scale():
        return (torch.rand((e, r), generator=g, device=dev, dtype=torch.float32) + 0.5).to(dt).requires_grad_(True)

    wg, wu, wd = normal((e, d, r), d), normal((e, d, r), d), normal((e, r, f), r)
    sg, su = scale(), scale()
    return Factors(quant.storage_format(wg), wg, wu, wd, sg, su)


def quantize_factors(dense: Factors, fmt: str) -> Factors:
    """The bank in a packed format, quantized ONCE (here, untimed) from the dense factors' values.

    Quantization uses tsct.quant's pure-torch backend (the reference bytes of decision 0002). The
    scales stay dense (they are tiny and differentiable).
    """
    from tsct import quant

    if fmt not in quant.FORMATS:
        raise ValueError(f"no quantizer for format {fmt!r}")
    ws = []
    with torch.no_grad():
        for name, w in zip(("w_gate", "w_up", "w_down"), dense.factors()):
            try:
                ws.append(quant.quantize(w.detach(), fmt, backend="torch"))
            except ValueError as e:  # e.g. K % 16: say which factor and which flag sets K
                raise ValueError(_factor_error(fmt, name, w.shape, e)) from e
    return Factors(fmt, *ws, dense.s_gate, dense.s_up)


def _factor_error(fmt: str, name: str, shape, e: Exception) -> str:
    """A quantizer's error on factor ``name`` of ``shape``, with the flag that sets its K."""
    k_flag = "--d" if name != "w_down" else "--r"
    why = str(e).removeprefix(f"quantize_{fmt}: ")  # the quantizer's own name says nothing here
    return f"{fmt} {name} {list(shape)}: {why} (K is set by {k_flag})"


def storage_problem(cfg, fmt: str) -> Optional[str]:
    """Why the factors of ``cfg``'s shape cannot be stored as ``fmt`` (``quantize_factors``'s error, from the shapes
    alone: no tensor is made), or None. Lets ``--list-arms`` agree with the run."""
    from tsct import quant
    from tsct.quant import _backend

    if fmt not in quant.FORMATS:
        return None
    mult = quant.k_multiple(fmt)
    for name, shape in (("w_gate", (cfg.experts, cfg.d, cfg.r)), ("w_down", (cfg.experts, cfg.r, cfg.f))):
        try:
            _backend.check_factor(f"quantize_{fmt}", "w", torch.empty(shape, device="meta"), mult, fmt)
        except ValueError as e:
            return f"cannot store the factors as {fmt}: {_factor_error(fmt, name, shape, e)}"
    return None


@dataclasses.dataclass
class InputSet:
    """One set of pass inputs: token-major x, router output, and a fixed random grad_out."""

    x: Tensor              # [T, d], requires grad
    ids: Tensor            # [T, k] int64
    weights: Tensor        # [T, k], requires grad (the router needs its gradient)
    grad_out: Tensor       # [T, f]


def make_input_sets(cfg: BenchConfig, n: Optional[int] = None) -> list[InputSet]:
    n = cfg.input_sets if n is None else n
    dev, dt = cfg.torch_device, cfg.torch_dtype
    g = torch.Generator(device=dev).manual_seed(cfg.seed + 1_000_003)
    sets = []
    for _ in range(n):
        ids, w = routing.route(cfg.tokens, cfg.experts, cfg.topk, routing=cfg.routing,
                               zipf_exponent=cfg.zipf_exponent, generator=g, device=dev, dtype=dt)
        x = torch.randn(cfg.tokens, cfg.d, generator=g, device=dev, dtype=torch.float32).to(dt)
        go = torch.randn(cfg.tokens, cfg.f, generator=g, device=dev, dtype=torch.float32).to(dt)
        sets.append(InputSet(x.requires_grad_(True), ids, w.requires_grad_(True), go))
    return sets


def input_set_bytes(cfg: BenchConfig) -> int:
    es = torch.empty((), dtype=cfg.torch_dtype).element_size()
    return cfg.tokens * (cfg.d + cfg.f + cfg.topk) * es + cfg.tokens * cfg.topk * 8
