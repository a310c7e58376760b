"""Choosing between the pure-torch quantizers and the native CUDA kernels (``tsct.native``).

``backend="torch"``: pure torch, any device (the reference). ``backend="native"``: the CUDA kernels of
``csrc/quant/`` through ``tsct.native`` (bit-exact with torch, decision 0002); RuntimeError with the
reason if they cannot run. ``backend="auto"``: native when the tensor is on CUDA and
``tsct.native.available()``, else torch. A CUDA tensor that falls back to torch under ``auto`` is
counted (``native_fallback_counts()``: its share of ``tsct.dispatch.fallback_counts()``, where every fallback is
counted) and warned once per reason (``tsct.config.warn_fallbacks``).

First use (decision 0010): on a GPU whose arch class the native kernels never executed on
(``tsct.dispatch.EXECUTED_ON[NATIVE_QUANT]``: every class but sm90; 12.x included), the first call that would
run them asks ``tsct.firstuse.gate`` for the verdict of their self-test (``tsct.selftest.native_quant``, every
quantizer and decoder bit for bit against torch) in a CHILD process, cached in the process and on disk; this
process never runs them before the child said "pass". Any other verdict (fail, crash, timeout, not-runnable):
``auto`` serves the call with torch (the same bytes; counted and warned under the verdict's reason) and
``backend="native"`` raises RuntimeError with it, as a forced ``impl=`` of a path does. Inside a self-test child
nothing is asked (no recursion): the native-quant child runs them, another path's child takes the torch backend (a
fault of theirs must not be cached as that path's crash).

``tsct.native`` is imported lazily, inside the call: importing ``tsct.quant`` loads no library.
"""

from __future__ import annotations

import torch

from tsct import dispatch, firstuse


BACKENDS = ("auto", "torch", "native")

#: the ``wanted`` of this family's fallbacks in ``tsct.dispatch.fallback_counts()``, before the function's name
_WANTED = dispatch.NATIVE_QUANT + "/"


def check_backend(caller: str, backend) -> str:
    """``backend`` if it is one of ``BACKENDS``, else ValueError naming ``caller`` and the argument."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{caller}: backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def _native_status(device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, f"the tensor is on {device.type}; the native kernels are CUDA only"
    try:
        from tsct import native
    except ImportError as e:  # not built / not shipped in this install
        return False, f"tsct.native cannot be imported ({e})"
    try:
        ok = bool(native.available())
    except Exception as e:  # noqa: BLE001  (a broken library must not break the torch path)
        return False, f"tsct.native.available() raised {type(e).__name__}: {e}"
    if not ok:
        return False, "tsct.native.available() is False (library or kernel image missing)"
    return True, "native kernels available"


def first_use(device: torch.device) -> tuple[bool, str]:
    """Whether the native kernels may run on CUDA ``device`` in this process: (True, "") where they executed
    (``dispatch.EXECUTED_ON[dispatch.NATIVE_QUANT]``) or inside their own self-test child, else the first-use verdict of
    their self-test (``tsct.firstuse.gate``; a child process the first time per GPU and install) and its reason.
    Call it only once the library loads (``_native_status``): the child tests the library this process would use.
    Raises what torch raises for a bad device index."""
    st = firstuse.gate(dispatch.NATIVE_QUANT, dispatch.device_capability(device), firstuse.FAMILY_FMT, device.index)
    return st.ok, st.reason


def resolve(backend: str, device: torch.device, what: str) -> str:
    """'torch' or 'native' for one call of ``what`` (e.g. "quantize_nvfp4") on ``device``. Under ``torch.compile``
    tracing, ``auto`` is the torch backend (the same bits, decision 0002): dynamo cannot trace the native kernels'
    ctypes calls, and a graph break there would fail ``fullgraph=True``."""
    check_backend(what, backend)
    if backend == "torch" or (backend == "auto" and torch.compiler.is_compiling()):
        return "torch"
    ok, why = _native_status(device)
    if ok:
        ok, why = first_use(device)
    if backend == "native":
        if not ok:
            raise RuntimeError(f"{what}: backend='native' cannot run: {why}")
        return "native"
    if ok:
        return "native"
    if device.type == "cuda":  # a real fallback: a GPU tensor served by the slower torch path
        dispatch.note_fallback(_WANTED + what, "torch", why,
                               f"tsct.quant: {what} uses the torch backend on CUDA: {why}. Counted in "
                               "tsct.quant.native_fallback_counts().",
                               warn_key=(_WANTED, why))  # once per reason, whichever function first
    return "torch"


def native_fallback_counts() -> dict[tuple[str, str], int]:
    """{(function, reason): count} of CUDA calls that ``backend="auto"`` served with torch: this family's share of
    ``tsct.dispatch.fallback_counts()``."""
    return {(w[len(_WANTED):], r): n for (w, _, r), n in dispatch.fallback_counts().items() if w.startswith(_WANTED)}


def reset_native_fallback_counts() -> None:
    dispatch.reset_fallback_counts(dispatch.NATIVE_QUANT)


def native():
    from tsct import native as mod

    return mod


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float_dtype(caller: str, name: str, dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{caller}: {name} must be one of {[str(d) for d in FLOAT_DTYPES]}, got {dtype}")


def check_factor(caller: str, name: str, w, multiple: int, fmt: str) -> None:
    """A factor to quantize: a float tensor ``[E, K, N]`` or ``[K, N]`` with K % multiple == 0; errors name ``caller``
    (the public function) and ``name`` (its argument)."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{caller}: {name} must be a torch.Tensor, got {type(w).__name__}")
    check_float_dtype(caller, f"{name}.dtype", w.dtype)
    if w.dim() not in (2, 3):
        raise ValueError(f"{caller}: {name} must be [E, K, N] or [K, N] (logical factor, K = contraction dim), "
                         f"got {w.dim()}-D shape {list(w.shape)}")
    k = w.shape[-2]
    if k % multiple:
        raise ValueError(f"{caller}: {name}: K = {name}.shape[-2] = {k} must be a multiple of {multiple} for {fmt}")


def chunk_rows(batch: int, per_item: int, budget: int = 1 << 25) -> int:
    """Items per chunk so that one chunk holds about ``budget`` elements (bounds temporaries)."""
    return max(1, min(batch, budget // max(1, per_item)))
