"""When an eager call may skip the torch.library dispatcher (``tsct.config.eager_direct``).

The custom ops (``tsct::grouped_glu``, ``tsct::sort_by_expert``) are what torch.compile, FakeTensor,
``opcheck`` and other dispatcher-level tools see. A plain eager call on CUDA tensors gains nothing from
that layer but pays for it on every call (schema defaults, pytree flattening, the aliasing check, the
redispatch: ~0.2-0.4 ms of host time per forward + backward on the H200's host, where the whole b1
forward is ~0.85 ms of GPU time; docs/performance.md). So such a call runs the SAME forward and
backward functions without them (``tsct.ops._function.GroupedGLU.apply``); everything else keeps the ops.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from tsct import config

_PLAIN = (Tensor, torch.nn.Parameter)


def _functorch_active() -> bool:
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def direct_ok(x: Tensor, *others: Optional[Tensor]) -> bool:
    """True for a plain eager call: ``tsct.config.eager_direct`` on, CUDA inputs of the plain Tensor
    type (no subclass such as DTensor or a FakeTensor), not compiling or tracing, no torch function or
    dispatch mode active (FakeTensorMode, FlopCounterMode, ...), no functorch transform (vmap, grad)."""
    if not (config.eager_direct and x.is_cuda and type(x) in _PLAIN):
        return False
    for t in others:
        if t is not None and type(t) not in _PLAIN:
            return False
    return not (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
                or torch._C._len_torch_dispatch_stack() or _functorch_active())


def needs_grad(*tensors: Optional[Tensor]) -> bool:
    """Grad mode is on and some input requires grad: the forward must save for a backward. Otherwise
    (inference, ``torch.no_grad``) the direct route runs the path's plain forward, which writes nothing
    for a backward (on the low-bit path that is ~0.05 ms less at b1 on the H200)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def run(name: str, fn, *args):
    """``fn(*args)``, inside a ``record_function(name)`` range when the profiler is on (so the op's name
    still shows in traces without the dispatcher), else with nothing around it."""
    if not torch.autograd._profiler_enabled():
        return fn(*args)
    with torch.autograd.profiler.record_function(name):
        return fn(*args)


_SAME_DEVICE = contextlib.nullcontext()


def on_device(device: torch.device):
    """A context making CUDA ``device`` current for the kernels of one call (they launch on the current device's
    streams, as Triton's do), entered only when another device is current: a tensor on ``cuda:1`` while ``cuda:0`` is
    current (layers on several GPUs in one process). Nothing to do for other devices or the current one."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return _SAME_DEVICE
    return torch.cuda.device(device.index)
