"""Master factors for low-bit training (docs/decisions/0008-lowbit-training.md).

The masters are the user's parameters (in the optimizer); packed containers are derived from them with
``quantize_master``, which caches one container per (master, format, layout) and re-quantizes when the
master's version counter moved (every in-place update, e.g. ``optimizer.step()``, bumps it), so a cached
container cannot outlive an optimizer step. ``tsct.ops.grouped_glu(..., masters=...)`` refuses a container
that ``quantize_master`` made from an older version of the master it is paired with (``check_master``).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["quantize_master", "mark_masters_updated", "check_master"]

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


def _version(t: Tensor) -> tuple:
    """A master's stamp: (torch version counter, tsct update epoch of its owner, dtype, device). Any of them
    moving means "changed" (a view shares its base's version counter; ``module.to`` swaps a parameter's ``.data``
    for a cast or moved copy without moving the counter)."""
    return (t._version, _epochs.get(_owner(t), 0), t.dtype, t.device)


def mark_masters_updated(*masters: Tensor) -> None:
    """Declare that these master factors changed in a way torch's version counter does not record, so
    the next ``quantize_master`` re-quantizes and older containers are refused.

    Needed after writes through ``p.data`` (``p.data.copy_``, ``p.data = other``, ``vector_to_parameters``) or any
    kernel that updates storage outside autograd; a ``.data`` replaced by one of another dtype or device (what
    ``module.to`` does) is seen without it. Optimizer steps need
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
        region, once per step). A master made under ``torch.inference_mode`` has no version counter: it is
        quantized on every call, uncached (``GroupedGLUExperts.freeze`` stores the packed factors once instead);
        any other master quantized under ``torch.inference_mode`` (an evaluation pass) gives a container of normal
        tensors, cached and fit for the next training step.

    Raises:
        TypeError / ValueError naming ``master`` or ``backend`` (wrong dtype or rank, K not a multiple of the block,
            an unknown backend), or ``fmt`` / ``layout``.
    """
    from tsct import quant
    from tsct.quant import _backend
    from tsct.quant.api import check_format, k_multiple

    if not isinstance(master, Tensor):
        raise TypeError(f"quantize_master: master must be a torch.Tensor, got {type(master).__name__}")
    check_format(fmt, "quantize_master")
    if fmt != "nvfp4" and layout != "linear":
        raise ValueError(f"quantize_master: layout={layout!r} applies to NVFP4 block scales only; fmt={fmt!r} "
                         "has no layout choice (leave layout='linear')")
    opts = {"layout": layout} if fmt == "nvfp4" else {}

    def quantized():  # checked here, on a miss: a cached container's master had the same dtype, shape and backend
        _backend.check_factor("quantize_master", "master", master, k_multiple(fmt), fmt)
        _backend.check_backend("quantize_master", backend)
        # a normal master gives normal tensors even inside torch.inference_mode: the container is cached, and an
        # evaluation pass must not hand inference tensors to the next training step's autograd
        normal = contextlib.nullcontext() if master.is_inference() else torch.inference_mode(False)
        with torch.no_grad(), normal:
            return quant.quantize(master.detach(), fmt, backend=backend, **opts)

    if master.is_inference():  # made under torch.inference_mode: no version counter to cache on, no training
        return quantized()
    _ensure_step_hook()
    owner, geom = _owner(master), _geometry(master)
    key = (fmt, layout, backend, geom)
    ver = _version(master)
    with _cache_lock:
        hit = _master_cache.get(owner, {}).get(key)
        if hit is not None and hit[0] == ver:
            return hit[1]
    q = quantized()
    with _cache_lock:
        # a replaced container keeps its record (it is dropped with the container), so a caller still holding it
        # is refused as stale, not taken for one made otherwise
        _master_cache.setdefault(owner, {})[key] = (ver, q)
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
                         f"{_version(master)}, e.g. an optimizer step or a cast) since it was quantized; call "
                         "tsct.ops.quantize_master again")


