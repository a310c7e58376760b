"""Path selection for one call: the dispatch table's choice, gated by first-use self-tests.

``tsct.dispatch`` is the table and the selection only; the first-use verdict of a path whose kernels never
executed on this arch class (``dispatch.needs_first_use``) is asked for here, after ``dispatch.select``
returned that path, from ``tsct.firstuse`` (a self-test in a child process, memoized in the process and
on disk), and the selection runs again with it: a failing verdict makes ``auto`` fall back (counted,
warned) and a forced ``impl`` raise. Inside a self-test child the path under test runs without asking.
"""

from __future__ import annotations

from typing import Optional

import torch

from tsct import dispatch, firstuse


def first_use(path: str, capability: tuple[int, int], fmt: str,
              device_index: Optional[int] = None) -> dispatch.Status:
    """The first-use verdict of ``path`` on CUDA device ``device_index`` (None: the current device) as a dispatch
    status (``tsct.firstuse.gate``: run in a child process now, or cached in the process / on disk, or set by the
    environment), recorded in ``dispatch.first_use_results()``. No child for a path that executed on this arch class,
    nor inside a child."""
    return firstuse.gate(path, capability, fmt, device_index)


@torch.compiler.assume_constant_result
def select(impl: str, capability: Optional[tuple[int, int]], fmt: str, activations: str = "bf16",
           x_dtype: str = "bf16", device_index: Optional[int] = None) -> str:
    """``dispatch.select`` for one call (``x_dtype``: x's dtype, ``dispatch.DTYPE_NAMES``), with the first-use verdict
    of each path it returns that needs one: the path to run. ``capability`` is that of CUDA device ``device_index``
    (x's device; None: the current device), whose verdict is asked for. Counts (and warns once) when auto falls back;
    raises what ``dispatch.select`` raises (a forced path that cannot run, or whose self-test failed: RuntimeError).
    Under torch.compile this runs once at trace time (``assume_constant_result``)."""
    verdicts: dict[str, dispatch.Status] = {}
    path = dispatch.select(impl, capability, fmt, activations, x_dtype=x_dtype, first_use=verdicts)
    while dispatch.needs_first_use(path, capability) and path not in verdicts:
        verdicts[path] = first_use(path, capability, fmt, device_index)
        path = dispatch.select(impl, capability, fmt, activations, x_dtype=x_dtype, first_use=verdicts)
    return path


def before_backward(impl_key: str, device: torch.device) -> None:
    """Ask for the first-use verdict a path's backward reads when it runs another path's kernels
    (``dispatch.BACKWARD_VIA``: sm120-fp4's backward on triton-lowbit), where that path can run here."""
    via = dispatch.BACKWARD_VIA.get(impl_key)
    if via is None:
        return
    path, fmt = via
    cap = dispatch.device_capability(device)
    if dispatch.status(path, cap, fmt).ok:
        first_use(path, cap, fmt, device.index)
