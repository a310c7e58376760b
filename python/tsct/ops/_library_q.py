"""torch.library registration of the grouped GLU with QUANTIZED factors (``tsct::grouped_glu_q``).

Why a second op: ``tsct::grouped_glu`` takes factors as Tensors; a packed factor (``NVFP4Tensor``,
``SignTensor``) is a container of several tensors plus a format, which a custom op cannot take. Here
each factor slot travels as

    w_<slot>: Optional[Tensor]   the gradient carrier of the slot:
                                   dense factor   -> the factor itself (read by the forward);
                                   packed factor  -> its MASTER (fp32/bf16, logical shape [E, K, N]), or
                                                     None (frozen packed weight, no gradient). A master
                                                     is never read by the forward: it only receives the
                                                     straight-through (STE) gradient, which is the
                                                     gradient w.r.t. the DECODED factor.
    q_<slot>: list[Tensor]       the packed storage: [] for dense; [codes, block_scale, global_scale]
                                   for NVFP4, the UE4M3 block scales as their raw bytes (a uint8 view:
                                   float8 tensors trip torch.library's CPU checks); [bits, scale_k,
                                   scale_n] for sign (the containers' ``_STORAGE`` order, never copied)
    formats: str                 "<gate>,<up>,<down>", each "dense" | "nvfp4" (linear block scales) |
                                   "nvfp4-swizzled_128x4" | "sign"

The op body rebuilds the containers (``unpack_factor``) and calls the PATH's implementation module,
``tsct.dispatch.implementation(impl)``, generically. So any path that serves quantized factors plugs in
by giving ``dispatch.implementation(path)`` these two functions (triton-lowbit does; sm120-fp4 will):

    grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                        gather_idx, scatter_idx, num_out_rows) -> Tensor
        w_gate, w_up ``[E, d, r]`` and w_down ``[E, r, f]`` (logical shapes): each a dense Tensor of
        x.dtype, an ``NVFP4Tensor`` (block-scale layout as the caller stored it: "linear" or
        "swizzled_128x4"; the path converts what it cannot read, counted) or a ``SignTensor``.
        Returns ``[num_out_rows, f]`` with scatter_idx, else ``[M, f]``, dtype x.dtype; padding rows 0.
    grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, needs_grad) -> list of 7
        gradients w.r.t. (x, w_gate, w_up, w_down, s_gate, s_up, row_weight); ``needs_grad`` is 7 bools;
        None where not needed. A factor slot holds the gradient w.r.t. the DECODED factor, dense
        ``[E, K, N]`` (any float dtype; this op casts it to the carrier's dtype). dX must be computed
        through the decoded factors.

Inputs arrive validated (``tsct.ops._validate``) and with the path already chosen (``impl`` is a
resolved path name, baked into a compiled graph like ``tsct::grouped_glu``'s). The reference path
never comes here (``tsct.ops.grouped_glu`` decodes to dense and calls ``tsct::grouped_glu``).

Two ops, like ``_library.py``: ``tsct::grouped_glu_q`` (forward) and ``tsct::grouped_glu_q_backward``
(all seven gradients); the autograd formula of the forward calls the backward op, so a compiled graph
holds two opaque nodes. Fake implementations give shapes and dtypes only (f is read from w_down's
carrier or from its codes/bits' shape [E, f, ...]).

Masters and re-quantization (docs/decisions/0008-lowbit-training.md): the masters are the user's
parameters (in the optimizer); packed containers are derived from them with ``quantize_master``, which
caches one container per (master, format, layout) and re-quantizes when the master's version counter
moved (every in-place update, e.g. ``optimizer.step()``, bumps it), so a cached container cannot
outlive an optimizer step. ``tsct.ops.grouped_glu(..., masters=...)`` refuses a container that
``quantize_master`` made from an older version of the master it is paired with.
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from tsct import dispatch
from tsct.ops import _eager, _select
from tsct.ops._library import _no_double_backward, backward_outputs, fake_grads, path_forward

__all__ = ["grouped_glu_q_op", "grouped_glu_q_backward_op", "pack_factor", "unpack_factor", "quantize_master",
           "check_master", "FACTOR_TAGS"]

#: the format tags a factor slot may carry
FACTOR_TAGS = ("dense", "nvfp4", "nvfp4-swizzled_128x4", "sign")


# ---- containers <-> (tag, storage tensors) ----------------------------------------------------------

def pack_factor(name: str, w) -> tuple[str, list[Tensor]]:
    """``(tag, storage)`` of one factor: ("dense", []) for a Tensor (it travels as its own carrier),
    ("nvfp4" | "nvfp4-swizzled_128x4", [codes, block_scale as uint8 bytes, global_scale]) for an NVFP4Tensor,
    ("sign", [bits, scale_k, scale_n]) for a SignTensor. TypeError (naming ``name``) for anything else."""
    from tsct.quant import NVFP4Tensor, SignTensor

    if isinstance(w, Tensor):
        return "dense", []
    if isinstance(w, NVFP4Tensor):
        tag = "nvfp4" if w.layout == "linear" else f"nvfp4-{w.layout}"
        return tag, [w.codes, w.block_scale.view(torch.uint8), w.global_scale]
    if isinstance(w, SignTensor):
        return "sign", [w.bits, w.scale_k, w.scale_n]
    raise TypeError(f"grouped_glu: {name} must be a torch.Tensor, NVFP4Tensor or SignTensor, got {type(w).__name__}")


def unpack_factor(name: str, tag: str, carrier: Optional[Tensor], storage: Sequence[Tensor]):
    """The factor the path's implementation receives: the dense carrier, or the rebuilt container
    (logical shape ``[E, K, N]`` read from the codes / bits ``[E, N, K/2 | K/8]``)."""
    from tsct.quant import NVFP4Tensor, SignTensor

    if tag == "dense":
        if carrier is None or len(storage):
            raise ValueError(f"grouped_glu_q: {name}: a dense factor travels as its carrier, with no storage")
        return carrier
    if len(storage) != 3:
        raise ValueError(f"grouped_glu_q: {name}: format {tag!r} needs 3 storage tensors, got {len(storage)}")
    e, n, kb = storage[0].shape
    if tag == "sign":
        return SignTensor(storage[0], storage[1], storage[2], (e, 8 * kb, n))
    if tag == "nvfp4" or tag.startswith("nvfp4-"):
        layout = "linear" if tag == "nvfp4" else tag[len("nvfp4-"):]
        return NVFP4Tensor(storage[0], storage[1].view(torch.float8_e4m3fn), storage[2], layout, (e, 2 * kb, n))
    raise ValueError(f"grouped_glu_q: {name}: unknown format tag {tag!r}; expected one of {list(FACTOR_TAGS)}")


def _factors(formats: str, carriers, storages):
    tags = formats.split(",")
    if len(tags) != 3:
        raise ValueError(f"grouped_glu_q: formats must be '<gate>,<up>,<down>', got {formats!r}")
    return tags, [unpack_factor(n, t, c, s) for n, t, c, s in zip(("w_gate", "w_up", "w_down"), tags, carriers,
                                                                     storages)]


def _n_out(x: Tensor, formats: str, w_down: Optional[Tensor], q_down: Sequence[Tensor], gather_idx, num_out_rows):
    f = w_down.shape[2] if formats.split(",")[2] == "dense" else q_down[0].shape[1]
    if num_out_rows is not None:
        return (num_out_rows, f)
    return (gather_idx.shape[0] if gather_idx is not None else x.shape[0], f)


# ---- the ops -----------------------------------------------------------------------------------------

@torch.library.custom_op("tsct::grouped_glu_q", mutates_args=())
def grouped_glu_q_op(
    x: Tensor,
    offs: Tensor,
    w_gate: Optional[Tensor],
    w_up: Optional[Tensor],
    w_down: Optional[Tensor],
    q_gate: list[Tensor],
    q_up: list[Tensor],
    q_down: list[Tensor],
    formats: str,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    impl: str,
) -> tuple[Tensor, list[Tensor]]:
    """Forward of the grouped GLU with factors given as (carrier, storage, tag) per slot (module docstring):
    ``(out, saved)``, ``saved`` what the path's backward would otherwise recompute (empty for a path
    without ``grouped_glu_forward_saved``); it travels to the backward op unchanged."""
    return _forward_impl(x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight,
                         gather_idx, scatter_idx, num_out_rows, impl)


def _forward_impl(x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight, gather_idx,
                  scatter_idx, num_out_rows, impl, save: bool = True) -> tuple[Tensor, list[Tensor]]:
    _, facs = _factors(formats, (w_gate, w_up, w_down), (q_gate, q_up, q_down))
    return path_forward(impl, (x, offs, *facs, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows), save)


def grouped_glu_q(x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight, gather_idx,
                  scatter_idx, num_out_rows, impl) -> Tensor:
    """``tsct::grouped_glu_q``, or for a plain eager CUDA call the same functions through ``_EagerGluQ``
    (no dispatcher; ``tsct.ops._eager``)."""
    args = (x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight, gather_idx,
            scatter_idx, num_out_rows, impl)
    if not _eager.direct_ok(x, w_gate, w_up, w_down):
        return grouped_glu_q_op(*args)[0]
    if _eager.needs_grad(x, w_gate, w_up, w_down, s_gate, s_up, row_weight):
        return _eager.run("tsct::grouped_glu_q", _EagerGluQ.apply, x, offs, w_gate, w_up, w_down, formats, s_gate,
                          s_up, row_weight, gather_idx, scatter_idx, num_out_rows, impl,
                          (len(q_gate), len(q_up), len(q_down)), *q_gate, *q_up, *q_down)
    return _eager.run("tsct::grouped_glu_q", _forward_plain, *args)  # inference: saves nothing


def _forward_plain(*args) -> Tensor:
    """The forward alone (``_forward_impl``'s arguments; nothing saved for a backward)."""
    return _forward_impl(*args, save=False)[0]


@grouped_glu_q_op.register_fake
def _(x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight, gather_idx,
      scatter_idx, num_out_rows, impl):
    like = getattr(dispatch.implementation(impl), "saved_like", None)
    _, facs = _factors(formats, (w_gate, w_up, w_down), (q_gate, q_up, q_down))
    saved = like(x, facs[0], gather_idx, scatter_idx, num_out_rows) if like is not None else []
    return x.new_empty(_n_out(x, formats, w_down, q_down, gather_idx, num_out_rows)), saved


@torch.library.custom_op("tsct::grouped_glu_q_backward", mutates_args=())
def grouped_glu_q_backward_op(
    grad_out: Tensor,
    x: Tensor,
    offs: Tensor,
    w_gate: Optional[Tensor],
    w_up: Optional[Tensor],
    w_down: Optional[Tensor],
    q_gate: list[Tensor],
    q_up: list[Tensor],
    q_down: list[Tensor],
    formats: str,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    impl: str,
    needs_grad: list[bool],
    saved: list[Tensor],
) -> list[Tensor]:
    """The seven gradients (x, w_gate, w_up, w_down, s_gate, s_up, row_weight); a factor slot holds the
    gradient w.r.t. the DECODED factor in its carrier's dtype; an absent one is an empty tensor."""
    return _backward_impl(grad_out, x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up,
                          row_weight, gather_idx, scatter_idx, num_out_rows, impl, needs_grad, saved)


def _backward_impl(grad_out, x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight,
                   gather_idx, scatter_idx, num_out_rows, impl, needs_grad, saved) -> list[Tensor]:
    _, facs = _factors(formats, (w_gate, w_up, w_down), (q_gate, q_up, q_down))
    _select.before_backward(impl, x.device)
    mod = dispatch.implementation(impl)
    args = (grad_out, x, offs, *facs, s_gate, s_up, row_weight, gather_idx, scatter_idx, num_out_rows, needs_grad)
    grads = list(mod.grouped_glu_backward(*args, saved=saved) if saved else mod.grouped_glu_backward(*args))
    for i, carrier in enumerate((w_gate, w_up, w_down), start=1):
        if grads[i] is not None and carrier is not None and grads[i].dtype != carrier.dtype:
            grads[i] = grads[i].to(carrier.dtype)
    return backward_outputs(grads, (x, w_gate, w_up, w_down, s_gate, s_up, row_weight), x)


@grouped_glu_q_backward_op.register_fake
def _(grad_out, x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight,
      gather_idx, scatter_idx, num_out_rows, impl, needs_grad, saved):
    return fake_grads((x, w_gate, w_up, w_down, s_gate, s_up, row_weight), needs_grad, x)


def _setup_context(ctx, inputs, output):
    (x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight, gather_idx,
     scatter_idx, num_out_rows, impl) = inputs
    fwd_saved = output[1]
    ctx.n_q = (len(q_gate), len(q_up), len(q_down))
    ctx.n_saved = len(fwd_saved)
    ctx.save_for_backward(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                          *q_gate, *q_up, *q_down, *fwd_saved)
    ctx.formats = formats
    ctx.num_out_rows = num_out_rows
    ctx.impl = impl


def _backward(ctx, grad_out, _grad_saved=None):
    saved = ctx.saved_tensors
    x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx = saved[:10]
    a, b, c = ctx.n_q
    rest = list(saved[10:])
    q_gate, q_up, q_down = rest[:a], rest[a:a + b], rest[a + b:a + b + c]
    fwd_saved = rest[a + b + c:]
    # ctx.needs_input_grad follows the forward's 16 inputs; the differentiable ones are x, the three
    # carriers, s_gate, s_up, row_weight (storage lists and indices get None)
    n = ctx.needs_input_grad
    direct = getattr(ctx, "direct", False)
    sc = 6 if direct else 9  # where s_gate sits: _EagerGluQ's inputs have `formats` (no storage lists) before it
    needs = [bool(n[0]), bool(n[2]), bool(n[3]), bool(n[4]), bool(n[sc]), bool(n[sc + 1]), bool(n[sc + 2])]
    lists = tuple([None] * k for k in ctx.n_q)  # the storage lists get a list of Nones (same structure)
    if not any(needs):
        return (None,) * (14 + sum(ctx.n_q)) if direct else (None,) * 5 + lists + (None,) * 8
    # the eager Function calls the implementation directly, except under create_graph (the op's
    # registered formula then fails a second derivative by name)
    bwd = _backward_impl if (direct and not torch.is_grad_enabled()) else grouped_glu_q_backward_op
    grads = bwd(
        grad_out.contiguous(), x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, ctx.formats, s_gate, s_up,
        row_weight, gather_idx, scatter_idx, ctx.num_out_rows, ctx.impl, needs, fwd_saved,
    )
    g = [gr if need else None for gr, need in zip(grads, needs)]
    if direct:  # _EagerGluQ's inputs: ..., formats, s_gate, s_up, row_weight, gidx, sidx, n_out, impl, n_q, *q
        return (g[0], None, g[1], g[2], g[3], None, g[4], g[5], g[6], None, None, None, None, None) + (None,) * sum(ctx.n_q)
    return (g[0], None, g[1], g[2], g[3], *lists, None, g[4], g[5], g[6], None, None, None, None)


class _EagerGluQ(torch.autograd.Function):
    """``tsct::grouped_glu_q`` and its autograd formula without the dispatcher (plain eager CUDA calls);
    the storage lists arrive flattened after their lengths ``n_q``."""

    @staticmethod
    def forward(ctx, x, offs, w_gate, w_up, w_down, formats, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                num_out_rows, impl, n_q, *q_flat):
        a, b, _ = n_q
        q_gate, q_up, q_down = list(q_flat[:a]), list(q_flat[a:a + b]), list(q_flat[a + b:])
        inputs = (x, offs, w_gate, w_up, w_down, q_gate, q_up, q_down, formats, s_gate, s_up, row_weight,
                  gather_idx, scatter_idx, num_out_rows, impl)
        out, fwd_saved = _forward_impl(*inputs)
        _setup_context(ctx, inputs, (out, fwd_saved))
        ctx.direct = True
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _backward(ctx, grad_out)


grouped_glu_q_op.register_autograd(_backward, setup_context=_setup_context)


# ---- masters: quantize once per optimizer step ---------------------------------------------------------

_cache_lock = threading.Lock()
# A master is known by its OWNER (the tensor itself, or the base tensor a view such as
# ``p.transpose(1, 2)`` of a parameter was taken from: what an optimizer holds) and the view's geometry,
# so fresh view objects of the same parameter are the same master (K-major w_down, decision 0012).
# owner -> {(fmt, layout, backend, geometry): (master version, container)}; weak on the owner, so a
# dropped parameter frees its containers
_master_cache = WeakIdKeyDictionary()  # by identity (a Tensor's == is elementwise)
# id(container) -> (weakref(owner), geometry, master version when quantized); filled by quantize_master only
_provenance: dict[int, tuple] = {}


# owner -> updates torch's version counter does not see (fused optimizer steps, ``.data`` writes),
# counted by the global optimizer hook below and by ``mark_masters_updated``
_epochs = WeakIdKeyDictionary()
_hook_handle = None


def _owner(t: Tensor) -> Tensor:
    """The tensor an optimizer would hold for master ``t``: its view base, else itself."""
    return t._base if t._base is not None else t


def _geometry(t: Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _version(t: Tensor) -> tuple[int, int]:
    """A master's stamp: (torch version counter, tsct update epoch of its owner). Either moving means
    "changed" (a view shares its base's version counter)."""
    return (t._version, _epochs.get(_owner(t), 0))


def mark_masters_updated(*masters: Tensor) -> None:
    """Declare that these master factors changed in a way torch's version counter does not record, so
    the next ``quantize_master`` re-quantizes and older containers are refused.

    Needed after writes through ``p.data`` (``p.data.copy_``, ``vector_to_parameters``, ``module.to``
    of a parameter's ``.data``) or any kernel that updates storage outside autograd. Optimizer steps need
    no call: ``quantize_master`` registers a global ``torch.optim`` step post-hook that marks every
    master the stepping optimizer holds, which covers fused optimizers (``fused=True`` does not bump the
    version counter).

    Raises:
        TypeError: an argument is not a tensor.
    """
    with _cache_lock:
        for m in masters:
            if not isinstance(m, Tensor):
                raise TypeError(f"mark_masters_updated: expected tensors, got {type(m).__name__}")
            o = _owner(m)
            _epochs[o] = _epochs.get(o, 0) + 1


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    with _cache_lock:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p in _master_cache:
                    _epochs[p] = _epochs.get(p, 0) + 1


def _ensure_step_hook() -> None:
    global _hook_handle
    if _hook_handle is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        _hook_handle = register_optimizer_step_post_hook(_after_optimizer_step)


def quantize_master(master: Tensor, fmt: str, *, layout: str = "linear", backend: str = "auto"):
    """The packed container of a master factor, quantized at most once per version of the master.

    Args:
        master: float32 / bfloat16 / float16 ``[E, K, N]`` master factor (typically an ``nn.Parameter``
            in the optimizer, or a view of one such as ``p.transpose(1, 2)`` of a K-major ``[E, N, K]``
            parameter: views of the same parameter with the same shape and strides are the same master,
            and the parameter's optimizer step retires its containers). Read under ``torch.no_grad``;
            never modified.
        fmt: "nvfp4" (K % 16 == 0), "sign" (K % 8 == 0), "fp8" (any K) or "ternary" (K % 4 == 0; absmean
            scales).
        layout: NVFP4 block-scale layout ("linear": what the Triton low-bit path reads).
        backend: as ``tsct.quant.quantize``.

    Returns:
        An ``NVFP4Tensor`` / ``SignTensor`` / ``FP8Tensor`` / ``TernaryTensor``. The same object while the master
        is unchanged; a new one as soon as the master changes: an in-place update on the tensor (``p.add_``,
        ``p.copy_``) moves its version counter, and every ``torch.optim`` step (fused or not) is seen through a global step
        post-hook registered on the first call, so a cached container never outlives an optimizer step.
        Writes that bypass both (through ``p.data``, ``vector_to_parameters``) are invisible: call
        ``tsct.ops.mark_masters_updated(p)`` after them. Pass the container to ``tsct.ops.grouped_glu``
        with ``masters=`` holding this master: gradients then reach the master (straight-through
        estimator), and a container from an older state is refused (in eager calls; under
        ``torch.compile`` the check is not traced, so call ``quantize_master`` outside the compiled
        region, once per step).

    Raises:
        TypeError / ValueError from ``tsct.quant.quantize`` (wrong dtype, K not a multiple of the block).
    """
    from tsct import quant

    if not isinstance(master, Tensor):
        raise TypeError(f"quantize_master: master must be a torch.Tensor, got {type(master).__name__}")
    if fmt != "nvfp4" and layout != "linear":
        raise ValueError(f"quantize_master: layout={layout!r} applies to NVFP4 block scales only; fmt={fmt!r} "
                         "has no layout choice (leave layout='linear')")
    _ensure_step_hook()
    owner, geom = _owner(master), _geometry(master)
    key = (fmt, layout, backend, geom)
    ver = _version(master)
    with _cache_lock:
        hit = _master_cache.get(owner, {}).get(key)
        if hit is not None and hit[0] == ver:
            return hit[1]
    with torch.no_grad():
        opts = {"layout": layout} if fmt == "nvfp4" else {}
        q = quant.quantize(master.detach(), fmt, backend=backend, **opts)
    with _cache_lock:
        per = _master_cache.setdefault(owner, {})
        old = per.get(key)
        if old is not None:
            _provenance.pop(id(old[1]), None)
        per[key] = (ver, q)
        _provenance[id(q)] = (weakref.ref(owner), geom, ver)
        weakref.finalize(q, _provenance.pop, id(q), None)
    return q


def check_master(name: str, container, master: Tensor) -> None:
    """Refuse a (container, master) pair that cannot be the STE pair of this step: shapes differ, the
    container was made by ``quantize_master`` from another tensor, or from an older version of this one
    (the master moved since: re-quantize). Containers made otherwise (``tsct.quant.quantize``) are
    accepted; keeping them fresh is then the caller's job (docs/decisions/0008)."""
    if not isinstance(master, Tensor):
        raise TypeError(f"grouped_glu: masters[{name}] must be a torch.Tensor or None, got {type(master).__name__}")
    if isinstance(container, Tensor):
        raise ValueError(f"grouped_glu: masters[{name}] is given but {name} is a dense tensor: a dense factor is "
                         "its own leaf, pass no master for it")
    if tuple(master.shape) != tuple(container.shape):
        raise ValueError(f"grouped_glu: masters[{name}] has shape {list(master.shape)}, {name} has logical shape "
                         f"{list(container.shape)}")
    if not master.is_floating_point():
        raise TypeError(f"grouped_glu: masters[{name}] must be a floating-point tensor, got {master.dtype}")
    if master.device != container.device:
        raise ValueError(f"grouped_glu: masters[{name}] is on {master.device}, {name} on {container.device}")
    if torch.compiler.is_compiling():
        return  # ids and version counters are not traced; the eager call checks them
    prov = _provenance.get(id(container))
    if prov is None:
        return
    ref, geom, ver = prov
    if ref() is not _owner(master) or geom != _geometry(master):
        raise ValueError(f"grouped_glu: {name} was quantized (quantize_master) from another tensor than "
                         f"masters[{name}]")
    if _version(master) != ver:
        raise ValueError(f"grouped_glu: {name} is stale: masters[{name}] changed (state {ver} -> "
                         f"{_version(master)}, e.g. an optimizer step) since it was quantized; call "
                         "tsct.ops.quantize_master again")



# Second derivatives are not implemented: say so by name.
grouped_glu_q_backward_op.register_autograd(_no_double_backward)
