"""One launcher for the Triton kernels (triton_glu, triton_lowbit, triton_common's shared ones): AOT cubin or JIT.

A launch names a kernel of a family's table (``specs.KERNELS``: parameters in order, which pointer
each flag leaves unread, which parameters an aligned launch hints as 16-divisible), its runtime
arguments in that order (``None`` = a pointer the flags leave unread), its constexprs, warps, stages
and whether the caller's shapes allow the aligned variants. ``Family.launch`` then

* with ``TSCT_TRITON_BACKEND`` auto/aot and cubins for the device's arch: looks the specialization
  key up in the shipped index (``tsct.kernels.aot``) and launches the cubin through the native
  library; the aligned variant only when every hinted parameter really is 16-aligned, else the
  generic one;
* otherwise (jit, or auto with no fitting cubin and Triton importable): Triton JIT.

Host cost matters: at b1 one eager forward makes ~6 launches and the GPU work is ~0.85 ms on an H200,
so a launch must cost microseconds, not the ~100 us that building the key string and ctypes cells per
call took (docs/performance.md). The key is resolved once per *launch signature* (kernel,
arch, argument dtypes / None-ness, constexprs, warps, stages, aligned) and cached; a cached launch
checks the hinted pointers' alignment, reads the data pointers and packs them with a precompiled
``struct`` layout (``AotKernel.launch``).
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import threading
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tsct import config
from tsct.kernels import aot, record
from tsct.native._ops import current_stream as _stream_of_index

BACKEND_ENV = "TSCT_TRITON_BACKEND"


def backend_mode() -> str:
    """``TSCT_TRITON_BACKEND``: "auto" (default), "aot" or "jit"; anything else raises ValueError."""
    mode = config.triton_backend()
    if mode not in ("auto", "aot", "jit"):
        raise ValueError(f"{BACKEND_ENV}={mode!r}: expected auto, aot or jit")
    return mode


_triton_ok: Optional[bool] = None


def triton_importable() -> bool:
    global _triton_ok
    if _triton_ok is None:
        _triton_ok = importlib.util.find_spec("triton") is not None
    return _triton_ok


def without_cubins(capability: tuple[int, int], shipped: Optional[str], uncovered: Optional[str]) -> tuple[bool, str]:
    """The status (ok, reason) of a Triton path on a GPU whose launches the installed cubins do not serve: Triton JIT
    where ``TSCT_TRITON_BACKEND`` allows it and Triton is importable, else not runnable, naming the reason (so
    ``auto`` takes the next path, counted, and a forced path raises it). ``shipped``: the artifact arch when this
    install has cubins for the GPU (``uncovered`` then names what they lack: "fp16 activations", "fp8 factors"), else
    None. Every family's status ends here (``triton_glu.status``, ``triton_lowbit.status``)."""
    mode = backend_mode()
    where = f"compute capability {capability[0]}.{capability[1]}"
    if mode == "aot":
        if shipped is None or uncovered is None:
            return False, f"TSCT_TRITON_BACKEND=aot but this install has no AOT cubins for {where}"
        return False, f"TSCT_TRITON_BACKEND=aot but this install has no cubin for {uncovered} (Triton JIT runs them)"
    if not triton_importable():
        if mode == "jit":
            return False, "TSCT_TRITON_BACKEND=jit but Triton is not importable"
        if shipped is None or uncovered is None:
            return False, f"no AOT cubins for {where} in this install and Triton is not importable (JIT)"
        return False, f"no cubin for {uncovered} in this install; Triton JIT is not available"
    return True, "Triton JIT"


def type_of(v: Any, dtype_types: dict, unused: str) -> str:
    """Triton's type string of an argument: ``*bf16`` for a bf16 tensor, ``i32`` for an int, ``unused``
    for None."""
    if v is None:
        return unused
    if isinstance(v, Tensor):
        return dtype_types[str(v.dtype).rsplit(".", 1)[-1]]
    return "i32"


def current_stream(dev: torch.device) -> int:
    """The current CUDA stream of ``dev`` as an int (cudaStream_t; ``tsct.native``'s query)."""
    return _stream_of_index(dev.index if dev.index is not None else torch.cuda.current_device())


_UNRESOLVED = object()


class _Resolved:
    """What a launch signature resolved to: the aligned and generic AOT kernels (None = none shipped),
    the positions of the hinted parameters that are read, and the key (for messages)."""

    __slots__ = ("k_aligned", "k_generic", "hinted", "key_aligned", "key_generic")

    def __init__(self, k_aligned, k_generic, hinted, key_aligned, key_generic):
        self.k_aligned, self.k_generic, self.hinted = k_aligned, k_generic, hinted
        self.key_aligned, self.key_generic = key_aligned, key_generic


class Family:
    """The launcher of one kernel family.

    Args:
        name: the path name used in error messages ("triton-bf16", "triton-lowbit").
        specs: the family's specs module: ``KERNELS``, ``DTYPE_TYPES``, ``UNUSED``, ``is_used(kernel,
            param, consts)`` and ``spec_key(kernel, types, consts, num_warps, num_stages, aligned, maxnreg=0)``.
        jit_module: the module holding the ``@triton.jit`` functions (imported on the first JIT launch).

    A specs module may also define ``jit_consts(kernel, consts, triton_version) -> consts``: the constexprs a JIT
    launch compiles with this Triton (those only the pinned Triton compiles correctly turned off; not applied under
    Triton's interpreter, which compiles nothing).
    """

    def __init__(self, name: str, specs, jit_module: str):
        self.name = name
        self.specs = specs
        self.jit_module = jit_module
        self._resolved: dict[tuple, _Resolved] = {}
        self._archs: dict[tuple, Optional[str]] = {}  # compute capability -> aot.artifact_arch (reads index files)
        self._generation: tuple = ()  # (aot.generation, aot.kernel, aot.artifact_arch) the caches were built on
        self._lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()  # (backend, kernel) -> launches

    def backend_counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)

    def count(self, backend: str, kernel: str) -> None:
        """Record one launch that bypassed ``launch`` (e.g. a native CUDA kernel: backend "native")."""
        with self._lock:
            self.counts[(backend, kernel)] += 1
        if record.log is not None:
            self._report((backend, kernel))

    def _report(self, key: tuple) -> None:
        """Tell a recording on this thread (``tsct.kernels.replay``) that a launch was counted: a replay counts it."""
        log = record.active()
        if log is not None:
            log.append(("count", self, key))

    def _resolve(self, kernel: str, arch: str, args: Sequence[Any], consts: dict, num_warps: int,
                 num_stages: int, aligned: bool, maxnreg: int) -> _Resolved:
        s = self.specs
        info = s.KERNELS[kernel]
        types = {p: type_of(v, s.DTYPE_TYPES, s.UNUSED) for p, v in zip(info.params, args)}
        key_g = s.spec_key(kernel, types, consts, num_warps, num_stages, False, maxnreg=maxnreg)
        key_a = s.spec_key(kernel, types, consts, num_warps, num_stages, True, maxnreg=maxnreg) if aligned else ""
        hinted = tuple(i for i, p in enumerate(info.params) if p in info.hinted and s.is_used(kernel, p, consts))
        # the generic variant is looked up when a launch needs it (_UNRESOLVED until then)
        return _Resolved(aot.kernel(arch, key_a) if aligned else None, _UNRESOLVED, hinted, key_a, key_g)

    def launch(self, kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
               aligned: bool, cap: tuple, device: torch.device, maxnreg: int = 0) -> str:
        """Launch ``kernel`` on the current stream of ``device``; returns "aot" or "jit". ``maxnreg``: the
        registers per thread the kernel was compiled to (PTX .maxnreg; 0: the compiler's choice), part of the key.

        Raises RuntimeError when the AOT cubins have no variant for the launch and JIT is not allowed
        (``TSCT_TRITON_BACKEND=aot``) or Triton is not importable; ValueError for a bad backend name.
        """
        mode = backend_mode()
        if mode != "jit":
            if self._generation != (aot.generation, aot.kernel, aot.artifact_arch):  # a reset index, a test's stand-in
                with self._lock:
                    self._resolved.clear()
                    self._archs.clear()
                    self._generation = (aot.generation, aot.kernel, aot.artifact_arch)
            arch = self._archs.get(cap, _UNRESOLVED)
            if arch is _UNRESOLVED:
                arch = self._archs[cap] = aot.artifact_arch(cap)
            if arch is not None:
                # host time per launch matters (module docstring): one list per pass over the arguments
                sig = (kernel, arch, aligned, num_warps, num_stages, maxnreg, *consts.items(),
                       *[v.dtype if isinstance(v, Tensor) else v is None for v in args])
                res = self._resolved.get(sig)
                if res is None:
                    res = self._resolve(kernel, arch, args, consts, num_warps, num_stages, aligned, maxnreg)
                    with self._lock:
                        self._resolved[sig] = res
                values = [v.data_ptr() if isinstance(v, Tensor) else 0 if v is None else v for v in args]
                k = res.k_aligned
                if k is not None:
                    for i in res.hinted:
                        if values[i] % 16:
                            k = None  # a hinted pointer or int is not 16-divisible: the generic variant
                            break
                if k is None:
                    if res.k_generic is _UNRESOLVED:
                        res.k_generic = aot.kernel(arch, res.key_generic)
                    k = res.k_generic
                if k is not None:
                    k.launch(grid, values, current_stream(device))
                    with self._lock:
                        self.counts[("aot", kernel)] += 1
                    if record.log is not None:
                        self._report(("aot", kernel))
                    return "aot"
                if mode == "aot" or not triton_importable():
                    why = (f"the {arch} AOT cubins have no variant {res.key_aligned or res.key_generic}"
                           if aot.index(arch) is not None else f"no AOT cubins for compute capability {cap[0]}.{cap[1]}")
                    raise RuntimeError(f"tsct {self.name}: {why}"
                                       + ("" if mode == "aot" else "; and Triton is not importable (JIT)"))
            elif mode == "aot" or not triton_importable():
                raise RuntimeError(f"tsct {self.name}: no AOT cubins for compute capability {cap[0]}.{cap[1]}"
                                   + ("" if mode == "aot" else "; and Triton is not importable (JIT)"))
        log = record.active()
        if log is not None:  # a JIT launch cannot be replayed (tsct.kernels.replay)
            log.append(("jit", kernel))
        K = importlib.import_module(self.jit_module)
        jit_consts = getattr(self.specs, "jit_consts", None)
        if jit_consts is not None and not config.triton_interpret():  # the interpreter compiles nothing
            consts = jit_consts(kernel, consts, K.triton.__version__)
        dummy = next(v for v in args if isinstance(v, Tensor))
        opts = dict(maxnreg=maxnreg) if maxnreg else {}
        getattr(K, kernel)[grid](*[dummy if v is None else v for v in args], **consts, num_warps=num_warps,
                                 num_stages=num_stages, **opts)
        with self._lock:
            self.counts[("jit", kernel)] += 1
        return "jit"
