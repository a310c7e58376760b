"""Expert layers: dual-latent GLU experts (design.md section 2) as ``nn.Module``\\ s.

``GroupedGLUExperts`` runs the expert pass through ``tsct.ops.sort_by_expert`` and ``tsct.ops.grouped_glu``;
``PaddedBmmGLUExperts`` is the capacity-padded ``torch.bmm`` layer users run today. Both hold the same
parameters (``GLUExpertBank``): swapping one for the other in a model changes neither the parameter count nor
the state_dict keys, so an A/B is a one-line change::

    experts = GroupedGLUExperts(E, d, r, f)            # tsct
    experts = PaddedBmmGLUExperts(E, d, r, f)          # padded bmm, capacity factor 2 (drops rows)
    experts = PaddedBmmGLUExperts(E, d, r, f, capacity_factor=None)   # padded bmm that drops nothing
    experts = PaddedBmmGLUExperts(E, d, r, f, capacity_factor=None, intermediates="fp32")  # the oracle's math
    y = experts(x, topk_ids, topk_weights)              # x [T, d] -> y [T, f]

The layers return the combined FFN-width output ``[T, f]``; the shared down-projection ``[f, d]`` that follows
is an ordinary ``nn.Linear`` of the caller's model (design.md section 2).

Parameters (plain 3-D tensors, so FSDP2 shards them along E like any other):

    w_gate, w_up  [E, d, r]   the two rank-r down-projections
    w_down        [E, f, r]   the up-projection, stored K-major: ``w_down[e]`` is ``nn.Linear(r, f).weight``; the
                              op gets the logical ``[E, r, f]`` as ``w_down.transpose(1, 2)`` (docs/decisions/0012)
    s_gate, s_up  [E, r]      per-rank scales (``scales=False`` drops them)

Precision: the layers compute in the autocast dtype when autocast is on for the input's device, else in
``x.dtype``; the parameters (any float dtype, e.g. fp32 masters) are cast to it in the forward. The router
weights and the combine stay in fp32. ``PaddedBmmGLUExperts(intermediates="fp32")`` keeps everything after the
operands in fp32 (the float oracle's math, ``tsct.reference``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
from torch import Tensor, nn

from tsct import config, quant
from tsct.quant._backend import check_float_dtype
from tsct.quant._container import _FLOAT8_FIELDS, bytes_as_float8, float8_as_bytes
from tsct.nn.capacity import capacity_slots, expert_counts

__all__ = ["GLUExpertBank", "GroupedGLUExperts", "PaddedBmmGLUExperts", "STORAGES", "ACTIVATIONS", "INTERMEDIATES",
           "compute_dtype"]

#: factor storage of ``GroupedGLUExperts``
STORAGES = ("bf16", "nvfp4", "sign")
#: activation precision passed to ``tsct.ops.grouped_glu``
ACTIVATIONS = ("bf16", "nvfp4")
#: precision of ``PaddedBmmGLUExperts``' products and elementwise results
INTERMEDIATES = ("compute", "fp32", "tensor-core")
FACTORS = ("w_gate", "w_up", "w_down")
_K_MULTIPLE = {"nvfp4": 16, "sign": 8}  # the contraction dim K (d for w_gate/w_up, r for w_down) must divide
_PACKED_FIELDS = {"nvfp4": ("codes", "block_scale", "global_scale"), "sign": ("bits", "scale_k", "scale_n")}


# Optimizer steps taken in this process (every torch.optim optimizer; counted by a global step post-hook). A layer
# re-quantizes its masters after any step: FSDP2 writes the gathered parameters into its unsharded tensors without
# moving their version counters (torch.autograd._unsafe_preserve_version_counter in its all-gather copy-out), and
# the optimizer steps the sharded parameters, not those, so neither stamp of ``quantize_master`` would see it.
_optimizer_steps = 0
_step_hook = None


def _count_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


def _ensure_step_counter() -> None:
    global _step_hook
    if _step_hook is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        _step_hook = register_optimizer_step_post_hook(_count_step)


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the expert layers compute in for input ``x``: the autocast dtype of ``x``'s device type when
    autocast is on there, else ``x.dtype``."""
    dev = x.device.type
    try:
        on = torch.is_autocast_enabled(dev)
    except RuntimeError:  # a device type without autocast (meta: shape inference)
        return x.dtype
    return torch.get_autocast_dtype(dev) if on else x.dtype


def _local(t: Tensor) -> Tensor:
    """A DTensor parameter's local shard (torchtitan's expert parallelism distributes expert parameters as
    ``Shard(0)`` DTensors and hands the experts local rows); any other tensor as it is."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _in_graph(x: Tensor) -> bool:
    """torch.compile traces, or a CUDA graph is being captured: host-side caches and reads are not replayed."""
    return torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_int(who: str, name: str, v, lo: int = 1) -> int:
    """``v`` as a Python int (``tsct.ops._validate.as_int``: NumPy integers, 0-d integer tensors; not bool)."""
    from tsct.ops._validate import as_int

    v = as_int(who, name, v)
    if v < lo:
        raise ValueError(f"{who}: {name} must be >= {lo}, got {v}")
    return v


class GLUExpertBank(nn.Module):
    """The parameters of E dual-latent GLU experts and their initialisation, shared by every expert layer here.

    Args:
        num_experts: E >= 1.
        d: model width (input rows ``[T, d]``).
        r: latent rank of each expert.
        f: FFN width (output rows ``[T, f]``); any size, e.g. odd.
        scales: hold the per-rank scales ``s_gate``, ``s_up`` ``[E, r]`` (initialised to 1); without them the
            op runs unscaled.
        device, dtype: of the parameters (``dtype`` defaults to torch's default dtype, like ``nn.Linear``; fp32
            parameters are the usual masters of bf16 training).

    Initialisation (``reset_parameters``): each expert's projections as ``nn.Linear``'s default, i.e.
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` with fan_in = d for ``w_gate``/``w_up`` and r for
    ``w_down``; scales 1.

    Raises:
        TypeError / ValueError: a size that is not a positive int, a ``dtype`` that is not a float dtype (the message
            names it).
    """

    def __init__(self, num_experts: int, d: int, r: int, f: int, *, scales: bool = True, device=None, dtype=None):
        super().__init__()
        who = type(self).__name__
        self.num_experts = _check_int(who, "num_experts", num_experts)
        self.d, self.r, self.f = (_check_int(who, n, v) for n, v in (("d", d), ("r", r), ("f", f)))
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"{who}: dtype must be a floating-point torch.dtype (of the parameters), got {dtype}")
        kw = {"device": device, "dtype": dtype}
        e, d, r, f = self.num_experts, self.d, self.r, self.f
        self.w_gate = nn.Parameter(torch.empty(e, d, r, **kw))
        self.w_up = nn.Parameter(torch.empty(e, d, r, **kw))
        self.w_down = nn.Parameter(torch.empty(e, f, r, **kw))  # K-major: the op reads w_down.transpose(1, 2)
        if scales:
            self.s_gate = nn.Parameter(torch.empty(e, r, **kw))
            self.s_up = nn.Parameter(torch.empty(e, r, **kw))
        else:
            self.register_parameter("s_gate", None)
            self.register_parameter("s_up", None)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``nn.Linear``'s default initialisation per expert projection (class docstring); scales 1."""
        for name, fan_in in (("w_gate", self.d), ("w_up", self.d), ("w_down", self.r)):
            p = self._parameters.get(name)
            if p is not None:
                bound = 1.0 / math.sqrt(fan_in)
                nn.init.uniform_(p, -bound, bound)
        for s in (self.s_gate, self.s_up):
            if s is not None:
                nn.init.ones_(s)

    def factor_views(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(w_gate, w_up, w_down.transpose(1, 2))``: the three factors in the op's logical shapes
        ``[E, d, r]``, ``[E, d, r]``, ``[E, r, f]`` (w_down K-major), as local tensors (DTensor shards unwrapped)."""
        return _local(self.w_gate), _local(self.w_up), _local(self.w_down).transpose(1, 2)

    def scales(self, dtype: torch.dtype) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """``(s_gate, s_up)`` in ``dtype`` (None without scales)."""
        return tuple(_local(s).to(dtype) if s is not None else None for s in (self.s_gate, self.s_up))

    def _check_routing(self, x: Tensor, topk_ids: Tensor, topk_weights: Optional[Tensor]) -> None:
        who = type(self).__name__
        for name, t in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if t is None and name == "topk_weights":
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
            want_float = name != "topk_ids"
            if t.dtype.is_complex or t.dtype == torch.bool or t.dtype.is_floating_point != want_float:
                kind = "a floating-point" if want_float else "an integer"
                raise TypeError(f"{who}: {name} must be {kind} tensor, got {t.dtype}")
        if x.dim() != 2 or x.shape[1] != self.d:
            what = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{who}: x must be [T, d] with d = {self.d}, got {what}")
        if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
            what = list(topk_ids.shape)
            raise ValueError(f"{who}: topk_ids must be [T, k] with T = x.shape[0] = {x.shape[0]}, got {what}")
        if topk_weights is not None and topk_weights.shape != topk_ids.shape:
            what = list(topk_weights.shape)
            raise ValueError(f"{who}: topk_weights must have topk_ids' shape {list(topk_ids.shape)}, got {what}")
        for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if t is not None and t.device != x.device:
                raise ValueError(f"{who}: {name} must be on x's device {x.device}, got {t.device}")

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, d={self.d}, r={self.r}, f={self.f}, "
                f"scales={self.s_gate is not None}")


class GroupedGLUExperts(GLUExpertBank):
    """E dual-latent GLU experts run by ``tsct.ops.grouped_glu``: the drop-in expert layer.

    ``forward(x, topk_ids, topk_weights)`` takes a top-k router's output and returns each token's combined
    expert output, sorting with ``tsct.ops.sort_by_expert`` and fusing gather, router weights and combine into
    the op; ``forward_counts`` serves engines that hand the experts rows already grouped by expert with
    per-expert counts (torchtitan, Megatron; docs/distributed.md); ``grouped_glu`` is the op itself with this
    layer's factors, for any other layout.

    Args:
        num_experts, d, r, f, scales, device, dtype: as ``GLUExpertBank`` (the parameters and their init).
        storage: how the factors reach the kernels.
            "bf16": dense factors in the compute dtype (the parameters, cast).
            "nvfp4" / "sign": the parameters are MASTER factors; each forward quantizes them with
            ``tsct.ops.quantize_master`` (cached per master version: once per optimizer step, also across
            micro-batches) and the op reads the packed factors, the masters receiving the straight-through
            gradient (docs/decisions/0008). The cache is also dropped after every ``torch.optim`` step and on
            ``load_state_dict`` / ``reset_parameters``, so it holds under FSDP2 too, which rewrites the
            unsharded masters without moving their version counters; after any other write to the masters call
            ``requantize()``. While torch.compile traces or a CUDA graph is captured, the quantization runs in
            the graph instead (``tsct.quant.fake_quantize``: the same decoded values as dense factors,
            re-quantized on every replay), since a host-side cache would freeze the factors of the first step.
            NVFP4 needs d and r multiples of 16, sign multiples of 8; the masters are float32, bfloat16 or
            float16.
        frozen: low-bit inference: no masters, the packed factors are buffers (``w_gate_codes``, ...; see
            ``freeze``), serialised by ``state_dict``. Holds zeros until a state_dict is loaded; ``freeze()``
            turns a trained layer into this form. Needs storage "nvfp4" or "sign".
        impl: ``tsct.ops.grouped_glu``'s ``impl`` ("auto" or a path name), passed through.
        activations: ``tsct.ops.grouped_glu``'s activation precision ("bf16" or "nvfp4": x and z quantized to
            NVFP4 in the products, straight-through in the backward; needs d and r multiples of 16), passed
            through.

    Raises:
        ValueError: an unknown storage, activations or impl; frozen with storage "bf16"; d or r not a multiple
            of the low-bit block (16 for NVFP4 factors or activations, 8 for sign factors).
        TypeError: low-bit storage with parameters of another dtype than float32, bfloat16 or float16 (float64:
            at construction, or at the forward after a ``.double()``).
    """

    def __init__(self, num_experts: int, d: int, r: int, f: int, *, storage: str = "bf16", frozen: bool = False,
                 scales: bool = True, impl: str = "auto", activations: str = "bf16", device=None, dtype=None):
        from tsct import dispatch

        if storage not in STORAGES:
            raise ValueError(f"GroupedGLUExperts: storage must be one of {list(STORAGES)}, got {storage!r}")
        if activations not in ACTIVATIONS:
            raise ValueError(f"GroupedGLUExperts: activations must be one of {list(ACTIVATIONS)}, got {activations!r}")
        if not isinstance(impl, str) or (impl != "auto" and impl not in dispatch.PATHS):
            raise ValueError(f"GroupedGLUExperts: impl must be 'auto' or one of {list(dispatch.PATHS)}, got {impl!r}")
        if frozen and storage == "bf16":
            raise ValueError("GroupedGLUExperts: frozen=True needs storage 'nvfp4' or 'sign' (a frozen bf16 layer is "
                             "this layer with requires_grad_(False))")
        m = max(_K_MULTIPLE.get(storage, 1), 16 if activations == "nvfp4" else 1)
        if m > 1:
            for name, v in (("d", d), ("r", r)):
                v = _check_int("GroupedGLUExperts", name, v)
                if v % m:
                    raise ValueError(f"GroupedGLUExperts: storage {storage!r} with activations {activations!r} needs "
                                     f"{name} to be a multiple of {m} (a contraction dim), got {name} = {v}")
        super().__init__(num_experts, d, r, f, scales=scales, device=device, dtype=dtype)
        if storage != "bf16" and not frozen:  # masters quantize_master takes; a frozen layer has none
            check_float_dtype(f"GroupedGLUExperts(storage={storage!r})", "dtype", self.w_gate.dtype)
        self.storage, self.impl, self.activations = storage, impl, activations
        self.frozen = False
        self._generation = 0  # moves on load_state_dict / reset_parameters / requantize
        self._quantized_at = None  # (optimizer steps, generation) of the last quantization
        if storage != "bf16":
            _ensure_step_counter()
        if frozen:
            dev = self.w_gate.device
            for name, (k, n) in zip(FACTORS, self._kn()):
                del self._parameters[name]
                for field, t in zip(_PACKED_FIELDS[storage], _empty_packed(storage, num_experts, k, n, dev)):
                    self.register_buffer(f"{name}_{field}", t)
            self.frozen = True

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.requantize()

    def requantize(self) -> None:
        """Drop the cached packed factors: the next forward quantizes the masters again. Needed only after a
        write to the masters that is neither an in-place op on them, a ``torch.optim`` step, ``load_state_dict``
        nor ``reset_parameters`` (e.g. through ``.data``, or into FSDP2's sharded parameters)."""
        self._generation = getattr(self, "_generation", 0) + 1

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.requantize()

    def _kn(self) -> tuple[tuple[int, int], ...]:
        """(K, N) of each factor's logical shape."""
        return (self.d, self.r), (self.d, self.r), (self.r, self.f)

    def _packed_names(self) -> list[str]:
        if not self.frozen:
            return []
        return [f"{n}_{fld}" for n in FACTORS for fld in _PACKED_FIELDS[self.storage]]

    def packed_factors(self) -> tuple:
        """The three factors as ``tsct.quant`` containers (logical ``[E, K, N]``) of a frozen layer."""
        if not self.frozen:
            raise RuntimeError("GroupedGLUExperts.packed_factors: the layer is not frozen (see freeze())")
        out = []
        for name, (k, n) in zip(FACTORS, self._kn()):
            t = [getattr(self, f"{name}_{fld}") for fld in _PACKED_FIELDS[self.storage]]
            shape = (t[0].shape[0], k, n)
            out.append(quant.NVFP4Tensor(*t, "linear", shape) if self.storage == "nvfp4"
                       else quant.SignTensor(*t, shape))
        return tuple(out)

    @torch.no_grad()
    def freeze(self) -> "GroupedGLUExperts":
        """Quantize the master factors once and keep only the packed factors (buffers), in place; returns self.

        For inference: the layer then holds ``<factor>_codes``, ``_block_scale``, ``_global_scale`` (NVFP4;
        E2M1 codes ``[E, N, K/2]`` uint8, UE4M3 block scales ``[E, N, K/16]`` float8_e4m3fn in the linear
        layout, fp32 encode scales ``[E]``) or ``<factor>_bits``, ``_scale_k``, ``_scale_n`` (sign), as
        ``tsct.quant`` defines them (docs/formats.md); the scales ``s_gate``/``s_up`` stay parameters. The
        forward then gives what the straight-through layer gave with the same masters.

        Raises:
            ValueError: storage "bf16" (nothing to quantize).
        """
        if self.frozen:
            return self
        if self.storage == "bf16":
            raise ValueError("GroupedGLUExperts.freeze: storage 'bf16' has no packed form")
        views = [v.detach() for v in self.factor_views()]
        for name, v in zip(FACTORS, views):
            q = quant.quantize(v, self.storage)
            del self._parameters[name]
            for fld in _PACKED_FIELDS[self.storage]:
                self.register_buffer(f"{name}_{fld}", getattr(q, fld).contiguous())
        self.frozen = True
        return self

    def __getstate__(self) -> dict:
        """The module's state for pickle, a frozen NVFP4 layer's float8 block scales as their bytes (plain ``pickle``
        cannot read a float8 tensor back: ``tsct.quant._container.float8_as_bytes``)."""
        state = super().__getstate__()
        buffers, dtypes = float8_as_bytes(state["_buffers"])
        return {**state, "_buffers": buffers, _FLOAT8_FIELDS: dtypes} if dtypes else state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        dtypes = state.pop(_FLOAT8_FIELDS, None)
        if dtypes:
            state["_buffers"] = bytes_as_float8(state["_buffers"], dtypes)
        super().__setstate__(state)

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (``.to``, ``.cuda``, ``.half``, ...), except that packed buffers keep their
        dtype: a cast would reinterpret codes and scales (only their device follows). The masters' cached packed
        factors are dropped (``requantize``): they were quantized from the masters before the cast or move."""
        packed = {n: self._buffers[n] for n in self._packed_names()}
        super()._apply(fn, recurse)
        for n, old in packed.items():
            new = self._buffers[n]
            if new.dtype != old.dtype:
                self._buffers[n] = old.to(new.device)
        self.requantize()
        return self

    def _op_factors(self, dt: torch.dtype, x: Tensor) -> tuple[tuple, Optional[tuple]]:
        """(factors for the op, masters or None)."""
        if self.frozen:
            return self.packed_factors(), None
        views = self.factor_views()
        if self.storage == "bf16":
            return tuple(v.to(dt) for v in views), None
        if _in_graph(x):
            from tsct.kernels.layout import to_kmajor
            deq = [quant.fake_quantize(v, self.storage).to(dt) for v in views]
            deq[2] = to_kmajor(deq[2])  # fake_quantize returns a contiguous [E, r, f]; keep the K-major layout
            return tuple(deq), None
        from tsct.ops import mark_masters_updated, quantize_master
        check_float_dtype(f"GroupedGLUExperts(storage={self.storage!r})",
                          "the parameters' dtype (after .to() / .double())", views[0].dtype)
        stamp = (_optimizer_steps, self._generation)
        if stamp != self._quantized_at:
            mark_masters_updated(*views)
            self._quantized_at = stamp
        return tuple(quantize_master(v, self.storage) for v in views), views

    def grouped_glu(self, x: Tensor, offs: Tensor, *, row_weight: Optional[Tensor] = None,
                    gather_idx: Optional[Tensor] = None, scatter_idx: Optional[Tensor] = None,
                    num_out_rows: Optional[int] = None) -> Tensor:
        """``tsct.ops.grouped_glu`` with this layer's factors, storage, ``impl`` and ``activations``.

        Arguments and result as ``tsct.ops.grouped_glu``'s (``x [M or T, d]``, ``offs [E]`` int32 end offsets,
        optional ``row_weight``, ``gather_idx``, ``scatter_idx`` with ``num_out_rows``); ``x`` and the factors are
        cast to the compute dtype (``compute_dtype``), ``row_weight`` to fp32 unless it has that dtype.
        """
        from tsct import ops

        dt = compute_dtype(x)
        x = x.to(dt)
        facs, masters = self._op_factors(dt, x)
        s_gate, s_up = self.scales(dt)
        if row_weight is not None and row_weight.dtype not in (dt, torch.float32):
            _check_float_row_weight("GroupedGLUExperts.grouped_glu", row_weight)
            row_weight = row_weight.float()
        return ops.grouped_glu(x, offs, *facs, s_gate, s_up, row_weight=row_weight, gather_idx=gather_idx,
                               scatter_idx=scatter_idx, num_out_rows=num_out_rows, impl=self.impl,
                               activations=self.activations, masters=masters)

    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Optional[Tensor] = None) -> Tensor:
        """Each token's weighted sum of its top-k experts' outputs.

        Args:
            x: ``[T, d]`` token-major input; its compute dtype (``compute_dtype``) must be float32, bfloat16 or
                float16.
            topk_ids: ``[T, k]`` integer expert ids; an id outside ``[0, E)`` (e.g. -1) drops that choice.
            topk_weights: optional ``[T, k]`` router weights of a float dtype (another than bf16, fp16 or fp32,
                float64 say, is cast to fp32, as ``forward_counts`` and ``PaddedBmmGLUExperts`` take it; gradients
                reach them).

        Returns:
            ``[T, f]`` in the compute dtype: ``sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])``.
            Deterministic (same bits every run); sync-free on CUDA on the Triton paths (the routing is its own
            ``sort_by_expert``'s, whose values ``grouped_glu`` does not read back; the ``bmm`` path reads its layout
            plan on the host every call).

        Raises:
            TypeError: an argument that is not a tensor, a non-float ``x`` or ``topk_weights``, non-integer
                ``topk_ids`` (the message names it); ``tsct.ops.grouped_glu``'s for another float dtype.
            ValueError: ``x`` not ``[T, d]``, ``topk_ids`` / ``topk_weights`` not ``[T, k]``.
        """
        from tsct.ops import sort_by_expert
        from tsct.ops.routing import WEIGHT_DTYPES

        self._check_routing(x, topk_ids, topk_weights)
        if topk_weights is not None and topk_weights.dtype not in WEIGHT_DTYPES:
            topk_weights = topk_weights.float()  # what sort_by_expert takes
        s = sort_by_expert(topk_ids, self.num_experts, topk_weights)
        return self.grouped_glu(x, s.offs, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                                num_out_rows=x.shape[0])

    def forward_counts(self, x: Tensor, num_tokens_per_expert: Tensor, row_weight: Optional[Tensor] = None) -> Tensor:
        """The experts on rows already grouped by expert, with per-expert row counts on the device.

        The seam of engines that dispatch tokens themselves: torchtitan's ``GroupedExperts(x,
        num_tokens_per_expert)``, Megatron's experts ``(permuted_hidden, tokens_per_expert, permuted_probs)``,
        DeepEP's low-latency receive buffer (docs/distributed.md). The counts are read on the device only.

        Args:
            x: either ``[M, d]``: expert e's rows are ``x[start_e : start_e + n_e]`` with ``start`` the exclusive
                cumulative sum of the counts; rows at or past ``sum(n)`` (a static receive buffer's unused tail)
                may hold anything, NaN included, and get zero output and zero gradient. Or ``[E, C, d]``: C row
                slots per expert, expert e's rows are ``x[e, :n_e]``, the other slots are ignored the same way.
            num_tokens_per_expert: ``[E]`` integer tensor on ``x``'s device (``n_e``; in the ``[E, C, d]`` form
                each ``<= C``).
            row_weight: optional ``[M]`` (or ``[E, C]``) weight multiplied into each row's output (Megatron's
                ``permuted_probs``); gradients reach it.

        Returns:
            ``[M, f]`` (or ``[E, C, f]``) in the compute dtype: row i's expert output, zeros past the counts.

        Raises:
            TypeError / ValueError: wrong shapes, dtypes or devices (naming the argument); with
                ``tsct.config.check_values`` a count outside ``[0, C]`` (read on the host in eager calls, a
                device-side assert under torch.compile or CUDA-graph capture), or, in the ``[M, d]`` form, a
                negative count or counts summing past M (``tsct.ops.grouped_glu``'s checks of ``offs``, the
                counts' cumulative sum; the message names ``num_tokens_per_expert``).
        """
        from tsct.ops import sort_by_expert

        counts = num_tokens_per_expert
        e = self.num_experts
        if not isinstance(x, Tensor) or x.dim() not in (2, 3) or x.shape[-1] != self.d:
            what = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"GroupedGLUExperts.forward_counts: x must be [M, d] or [E, C, d] with d = {self.d}, "
                             f"got {what}")
        if not isinstance(counts, Tensor) or counts.dtype.is_floating_point or counts.dtype.is_complex \
                or counts.dtype == torch.bool:
            what = counts.dtype if isinstance(counts, Tensor) else type(counts).__name__
            raise TypeError(f"GroupedGLUExperts.forward_counts: num_tokens_per_expert must be an integer tensor, "
                            f"got {what}")
        if tuple(counts.shape) != (e,) or counts.device != x.device:
            raise ValueError(f"GroupedGLUExperts.forward_counts: num_tokens_per_expert must be [E] = [{e}] on "
                             f"{x.device}, got {list(counts.shape)} on {counts.device}")
        rows = tuple(x.shape[:-1])
        if row_weight is not None and (not isinstance(row_weight, Tensor) or tuple(row_weight.shape) != rows):
            what = list(row_weight.shape) if isinstance(row_weight, Tensor) else type(row_weight).__name__
            raise ValueError(f"GroupedGLUExperts.forward_counts: row_weight must be {list(rows)} (one per row of x), "
                             f"got {what}")
        if row_weight is not None:
            _check_float_row_weight("GroupedGLUExperts.forward_counts", row_weight)
        if x.dim() == 2:
            # summed in int64 and clamped to [-1, M + 1] before the int32 cast: a count that would wrap int32 (2^32 + 3
            # read as 3) stays out of range, where grouped_glu's checks of offs catch it (no host read here)
            offs = torch.cumsum(counts, 0, dtype=torch.int64).clamp_(-1, x.shape[0] + 1).to(torch.int32)
            try:
                return self.grouped_glu(x, offs, row_weight=row_weight)
            except ValueError as err:  # the caller passed counts, not offs: name them
                if not str(err).startswith("grouped_glu: offs"):
                    raise
                raise ValueError(f"GroupedGLUExperts.forward_counts: num_tokens_per_expert must be >= 0 and sum to "
                                 f"at most M = {x.shape[0]} (the rows of x); as offsets (their cumulative sum, "
                                 f"clamped to [-1, M + 1]): {err}") from None
        if x.shape[0] != e:
            raise ValueError(f"GroupedGLUExperts.forward_counts: x of the [E, C, d] form must have E = {e}, got "
                             f"{list(x.shape)}")
        c = x.shape[1]
        _check_counts_within(counts, c)
        # expert e for its first n_e slots, E (a dropped id: a padding row) for the rest, then the stable sort
        # puts the rows expert-major with the unused slots last
        slot_rank = torch.arange(c, device=x.device)
        expert = torch.arange(e, device=x.device).unsqueeze(1)
        key = torch.where(slot_rank < counts.unsqueeze(1), expert, e).reshape(-1, 1)
        rw = None
        if row_weight is not None:  # as ``grouped_glu`` casts it in the [M, d] form
            rw = (row_weight if row_weight.dtype in (x.dtype, torch.float32) else row_weight.float()).reshape(-1, 1)
        s = sort_by_expert(key, e, rw)
        y = self.grouped_glu(x.reshape(e * c, self.d), s.offs, row_weight=s.row_weight, gather_idx=s.token,
                             scatter_idx=s.token, num_out_rows=e * c)
        return y.view(e, c, y.shape[-1])

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", storage={self.storage!r}" + (", frozen" if self.frozen else "")
                + f", impl={self.impl!r}, activations={self.activations!r}")


def _check_float_row_weight(fn: str, row_weight: Tensor) -> None:
    """A row weight is a routing probability: a floating-point tensor (an integer or bool one would be cast)."""
    if not row_weight.dtype.is_floating_point:
        raise TypeError(f"{fn}: row_weight must be a floating-point tensor, got {row_weight.dtype}")


def _empty_packed(fmt: str, e: int, k: int, n: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """Storage tensors of a zero factor ``[E, K, N]`` in ``fmt`` (what ``tsct.quant`` gives for all-zero input)."""
    u8 = {"dtype": torch.uint8, "device": device}
    f32 = {"dtype": torch.float32, "device": device}
    if fmt == "nvfp4":
        return (torch.zeros(e, n, k // 2, **u8), torch.zeros(e, n, k // 16, **u8).view(torch.float8_e4m3fn),
                torch.ones(e, **f32))
    return torch.zeros(e, n, k // 8, **u8), torch.zeros(e, k, **f32), torch.zeros(e, n, **f32)


def _check_within(t: Tensor, hi: int, what: str) -> None:
    """``0 <= t <= hi`` (``tsct.config.check_values``): a host read in an eager call, a device-side assert while
    torch.compile traces or a CUDA graph is captured (as ``tsct.ops.grouped_glu`` checks ``offs``). ``what``
    starts the ValueError's message ("<layer>: <argument> must lie in ...")."""
    from tsct.ops._validate import _values_readable

    if not config.values_checked(t) or t.device.type == "meta" or t.numel() == 0:
        return
    if _values_readable(t):
        lo, top = (int(v) for v in torch.stack([t.min(), t.max()]).cpu())
        if lo < 0 or top > hi:
            raise ValueError(f"{what}, found values in [{lo}, {top}]")
    else:
        torch._assert_async(((t >= 0) & (t <= hi)).all(), what)


def _check_counts_within(counts: Tensor, capacity: int) -> None:
    _check_within(counts, capacity, f"GroupedGLUExperts.forward_counts: num_tokens_per_expert must lie in [0, C = "
                                     f"{capacity}] (the slots per expert of x)")


class _RoundValue(torch.autograd.Function):
    """Forward: ``x`` rounded to ``dtype`` (held in x's dtype); backward: the gradient unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _RoundGrad(torch.autograd.Function):
    """Forward: ``x`` unchanged; backward: the gradient rounded to ``dtype`` (held in its dtype)."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.dtype = dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.to(ctx.dtype).to(grad.dtype), None


class PaddedBmmGLUExperts(GLUExpertBank):
    """The same experts as a capacity-padded ``torch.bmm``: the layer MoE code runs today, for A/B comparisons.

    Every expert gets C row slots, C = ceil(capacity_factor * T * k / E); its rows past the C-th (in token
    order) are DROPPED (they contribute nothing to their token's output). The routed rows are placed in an
    ``[E, C, d]`` buffer, the three projections are ``torch.bmm`` over it, and each token sums its kept rows
    times their router weights (in fp32). ``capacity_factor=None`` drops nothing: C is the busiest expert's row
    count of the step (one host read per forward), the exact dropless layer; that read is a data-dependent size,
    which ``torch.compile(fullgraph=True)`` refuses (a capacity factor compiles).

    Args:
        num_experts, d, r, f, scales, device, dtype: as ``GLUExpertBank`` (the same parameters as
            ``GroupedGLUExperts``).
        capacity_factor: C / (T * k / E), > 0; or None (drop nothing).
        intermediates: the precision after the operands, which are always x, the factors and the scales in the
            compute dtype (``compute_dtype``).
            "compute": every product and every elementwise result in the compute dtype (under bf16 autocast
            ``torch.bmm`` rounds g and u to bf16, then g * s, silu(g), z and y are bf16 too, forward and
            backward): what MoE code runs today.
            "fp32": the products accumulated and kept in fp32, GLU, router weights and combine in fp32, one
            rounding of the output: the math of tsct's float oracle (``tsct.reference``), whatever autocast
            says. The products of 16-bit operands are exact in fp32 (and in TF32), so an fp32 GEMM gives the
            oracle's numbers up to the order of its sums. With ``capacity_factor=None`` this is the exact
            layer that ``GroupedGLUExperts`` is compared with (examples/train_moe_lm.py).
            "tensor-core": as "fp32", but rounded where tsct's bf16 GPU kernels round: the row weight folded
            into z and the product rounded to the compute dtype as the w_down product's operand, each routed
            row's y rounded before the fp32 combine, and in the backward the gradients of the w_gate and w_up
            products (dg * s_gate, du * s_up) before they are multiplied again. The
            same math with the roundings every bf16 GPU kernel makes: the gap between it and "fp32" is the
            rounding noise a GPU implementation is measured against (examples/train_moe_lm.py).

    After each forward, ``dropped_fraction`` holds the fraction of routed rows dropped (a 0-d fp32 tensor on
    the device, read without a host sync only when the caller reads it).

    The gradient of ``x`` is summed by ``index_select``'s backward (atomic adds on CUDA: not bit-reproducible),
    as in the code this layer stands for.
    """

    def __init__(self, num_experts: int, d: int, r: int, f: int, *, capacity_factor: Optional[float] = 2.0,
                 intermediates: str = "compute", scales: bool = True, device=None, dtype=None):
        if intermediates not in INTERMEDIATES:
            raise ValueError(f"PaddedBmmGLUExperts: intermediates must be one of {list(INTERMEDIATES)}, got "
                             f"{intermediates!r}")
        if capacity_factor is not None:
            if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) \
                    or not math.isfinite(capacity_factor) or capacity_factor <= 0:
                raise ValueError(f"PaddedBmmGLUExperts: capacity_factor must be a finite number > 0 or None, got "
                                 f"{capacity_factor!r}")
        super().__init__(num_experts, d, r, f, scales=scales, device=device, dtype=dtype)
        self.capacity_factor, self.intermediates = capacity_factor, intermediates
        self.dropped_fraction: Optional[Tensor] = None

    def capacity(self, topk_ids: Tensor) -> int:
        """Row slots per expert for this routing: ceil(capacity_factor * T * k / E) (at least 1), or with
        ``capacity_factor=None`` the largest expert load (a host read)."""
        m = topk_ids.numel()
        if self.capacity_factor is None:
            return max(1, int(expert_counts(topk_ids.reshape(-1), self.num_experts).max())) if m else 1
        return max(1, math.ceil(self.capacity_factor * m / self.num_experts))

    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Optional[Tensor] = None) -> Tensor:
        """As ``GroupedGLUExperts.forward`` (``[T, d]`` and the router's ``[T, k]`` ids and weights in, ``[T, f]``
        out, the same TypeError / ValueError), except that rows past an expert's capacity are dropped and ids must
        lie in ``[0, E)``: with ``tsct.config.check_values`` another id is a ValueError (one host read in an eager
        call, a device-side assert under torch.compile or CUDA-graph capture)."""
        self._check_routing(x, topk_ids, topk_weights)
        _check_within(topk_ids, self.num_experts - 1,
                      f"PaddedBmmGLUExperts: topk_ids must lie in [0, E = {self.num_experts}) (this layer has no "
                      "padding rows; GroupedGLUExperts drops such choices)")
        e, c, (t, k) = self.num_experts, self.capacity(topk_ids), topk_ids.shape
        dt = compute_dtype(x)
        it = dt if self.intermediates == "compute" else torch.float32  # the dtype of everything after the operands
        tc = self.intermediates == "tensor-core"
        # operands rounded to the compute dtype first (as every path computes them), then held in ``it``
        wg, wu, wd = (v.to(dt).to(it) for v in self.factor_views())
        s_gate, s_up = (s.to(it) if s is not None else None for s in self.scales(dt))
        cap = capacity_slots(topk_ids, e, c)
        keep = cap.keep.to(torch.float32)
        w = keep if topk_weights is None else topk_weights.reshape(-1).float() * keep  # dropped rows weigh 0
        # autocast would cast bmm's fp32 operands back to the autocast dtype
        with torch.autocast(x.device.type, enabled=False) if it != dt else contextlib.nullcontext():
            xin = x.to(dt).to(it)
            if t == 0:  # the empty slots read row 0: give them a zero row
                xin = nn.functional.pad(xin, (0, 0, 0, 1))
            xbuf = xin.index_select(0, cap.src).view(e, c, self.d)
            # empty slots (they read token 0) as zero rows: a non-finite token 0 must not reach other experts'
            # weight gradients through them
            slot = torch.where(cap.keep, cap.slot, e * c)  # dropped rows: a spare slot
            filled = torch.zeros(e * c + 1, dtype=torch.bool, device=x.device).scatter_(0, slot, True)[:e * c]
            xbuf = torch.where(filled.view(e, c, 1), xbuf, 0)
            g = torch.bmm(xbuf, wg)
            u = torch.bmm(xbuf, wu)
            if tc:  # their gradients are operands of dX and dW
                g, u = _RoundGrad.apply(g, dt), _RoundGrad.apply(u, dt)
            if s_gate is not None:
                g = g * s_gate.unsqueeze(1)
                u = u * s_up.unsqueeze(1)
            z = nn.functional.silu(g) * u
            if tc:  # as the kernels: the row weight folded into z, rounded as the w_down product's operand, and
                # each routed row's y written in the compute dtype before the fp32 combine
                wbuf = torch.zeros(e * c + 1, dtype=it, device=x.device).index_put((slot,), w)[:e * c]
                z = _RoundValue.apply(z * wbuf.view(e, c, 1), dt)
                ybuf = _RoundValue.apply(torch.bmm(z, wd), dt).view(e * c, self.f)
            else:
                ybuf = torch.bmm(z, wd).view(e * c, self.f)
        y = ybuf.index_select(0, cap.slot).float()  # a dropped row reads slot 0: zeroed, not multiplied by 0
        y = torch.where(cap.keep.unsqueeze(1), y if tc else y * w.unsqueeze(1), 0)
        self.dropped_fraction = (1.0 - keep.mean()).detach() if keep.numel() else keep.new_zeros(())
        return y.view(t, k, self.f).sum(1).to(dt)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", capacity_factor={self.capacity_factor}, intermediates={self.intermediates!r}"
