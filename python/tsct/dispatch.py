"""The dispatch table: (compute capability, storage format, activation precision, built artifacts) -> path.

``impl="auto"`` walks the preference list of the caller's (arch class, storage format, activations)
and takes the first path whose ``status`` says it can run; every step past the first is a counted
fallback with its reason (``fallback_counts()``), warned once per (path, reason) per process.
``impl=<path>`` forces a path and raises ``RuntimeError`` with the reason if it cannot run.

Paths (design.md section 4):
    reference      pure torch, per expert, fp32: the oracle; only when forced (``impl="reference"``)
    bmm            factors decoded to bf16, rows laid out per expert, torch.bmm (tsct.bmm): CPU and any GPU;
                   the last resort of every row; bf16 or NVFP4 activations
    triton-bf16    Triton grouped GEMM + fused GLU, bf16/fp16 factors (AOT cubins for sm_90a/sm_120)
    triton-lowbit  Triton with NVFP4 / sign factors decoded in registers, bf16 activations; FP8 and ternary
                   factors (and mixes with them) too, but only when forced (``FORCED_ONLY``): those
                   kernels have not yet passed the whole GPU suite, so every ``auto`` row sends them to
                   ``bmm`` (decoded to bf16 once per call)
    sm120-fp4      NVFP4 block-scaled mma.sync on 12.0 / 12.1 (CuTeDSL, tsct.kernels.sm120_fp4): NVFP4
                   activations, so only when the caller asks for them (``activations="nvfp4"``)

Within the Triton paths, three Triton kernels have CUDA C++ stand-ins, rows of ``CUDA_KERNELS`` by artifact arch and
storage format (sm_90a: the bf16 backward's dz, the low-bit down and up projections); the kernels' host code asks
``cuda_kernel`` per call and checks the call's shape.

Numerics never depend on the GPU: each path computes one activation precision (``COMPUTES``), and
``auto`` only chooses among the paths that compute the precision the caller asked for. The same
request on a GPU without the NVFP4 tensor cores, or on the CPU, runs ``bmm`` with the activations
quantized by the same recipe (docs/decisions/0019).

A kernel family that has never executed on this compute capability (``EXECUTED_ON``) runs its first
use in a CHILD process (``tsct.firstuse``) against a float64 oracle, forward and backward: a fault, a
hang or a wrong answer there disables the path for this GPU (counted, warned, cached on disk) and the
caller's CUDA context never runs the untested kernel. This module only holds the table and selects:
``tsct.ops`` asks for the verdict of a path ``select`` returned when ``needs_first_use`` says so, and
selects again with it (``tsct.ops._select``). Nothing here imports the layers above it (ops,
firstuse, selftest, nn, bench; tests/package/test_import_graph.py).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import os
import sys
import threading
import warnings
from typing import Callable, Mapping, Optional

import torch

from tsct import config

REFERENCE = "reference"
BMM = "bmm"
TRITON_BF16 = "triton-bf16"
TRITON_LOWBIT = "triton-lowbit"
SM120_FP4 = "sm120-fp4"
PATHS = (REFERENCE, BMM, TRITON_BF16, TRITON_LOWBIT, SM120_FP4)
#: not a path: the native library's quantize / decode kernels (csrc/quant), which ``tsct.quant``'s ``backend="auto"``
#: runs on any CUDA tensor, inside or outside a path. Its row of ``EXECUTED_ON`` gates their first use like a path's
#: (``tsct.quant._backend``); its self-test (``tsct.selftest.native_quant``) covers every format at once
NATIVE_QUANT = "native-quant"
#: not a path either: ``tsct.ops.sort_by_expert``'s Triton routing kernels (route_rank, route_place), which it runs on
#: any GPU the Triton kernels serve. Its row of ``EXECUTED_ON`` gates their first use like a path's
#: (``tsct.ops.routing``); its self-test (``tsct.selftest.sort_by_expert``) covers every variant at once
ROUTING = "triton-routing"
#: what has a first-use self-test (``tsct.selftest``, run by ``tsct.selftest_child --path``): every path with kernels
#: of its own, and the two kernel families that are not paths
SELF_TESTED = (TRITON_BF16, TRITON_LOWBIT, SM120_FP4, NATIVE_QUANT, ROUTING)

FORMATS = ("bf16", "nvfp4", "sign", "fp8", "ternary")  # storage formats with a row in the table; others use bmm
#: formats ``auto`` runs only after decoding them to dense factors (``bmm``); triton-lowbit decodes them in
#: registers when forced (``FORCED_ONLY``)
DECODED_FORMATS = ("fp8", "ternary")
#: the format of a mix of factors that includes a DECODED_FORMATS one ("mixed" is the mix triton-lowbit reads)
MIXED_DECODED = "mixed-decoded"
ACTIVATIONS = ("bf16", "nvfp4")
#: the activations' dtype (x's) by name: the Triton paths ship cubins for bf16 only, so their status depends on it
DTYPE_NAMES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
#: paths whose kernels read packed factors themselves; every other path gets them decoded
READS_PACKED = frozenset({TRITON_LOWBIT, SM120_FP4})
#: path -> storage formats it serves only when forced (``impl=<path>``), never from ``auto``: its kernels read
#: them, but have not yet passed the whole GPU suite for them. ``preferences`` leaves these (path, format) pairs out
#: of every row; a row for them moves into ``TABLE`` once the GPU tests pass (tests/kernels/test_triton_lowbit_gpu.py).
FORCED_ONLY: dict[str, frozenset] = {TRITON_LOWBIT: frozenset({*DECODED_FORMATS, MIXED_DECODED})}

#: the activation precision each path computes (the ``activations=`` values it serves)
COMPUTES: dict[str, frozenset] = {
    REFERENCE: frozenset({"bf16"}),
    BMM: frozenset({"bf16", "nvfp4"}),
    TRITON_BF16: frozenset({"bf16"}),
    TRITON_LOWBIT: frozenset({"bf16"}),
    SM120_FP4: frozenset({"nvfp4"}),
}

# Exact compute capability -> arch class. Anything not listed is "unknown": no artifact was built
# for it, so only bmm runs (a (10,3) part cannot load sm_100a cubins, for example).
ARCH_CLASSES: dict[tuple[int, int], str] = {
    (8, 0): "sm80", (8, 6): "sm80", (8, 7): "sm80", (8, 9): "sm80",
    (9, 0): "sm90",
    (10, 0): "sm100",
    (12, 0): "sm120",
    (12, 1): "sm120",  # covered by the sm_120f family target
}

_DENSE_GPU = [TRITON_BF16, BMM]
_LOWBIT_GPU = [TRITON_LOWBIT, BMM]
# (arch class, storage format) -> paths in order of preference, bf16 activations. Missing rows
# (cpu, unknown, fp32 factors) mean [BMM]. FP8 / ternary rows are bmm while FORCED_ONLY holds them.
TABLE: dict[tuple[str, str], list[str]] = {
    **{(cls, fmt): list(_DENSE_GPU) for cls in ("sm80", "sm90", "sm100", "sm120") for fmt in ("bf16", "fp16")},
    # packed factors; "mixed" = packed and dense together, or NVFP4 with sign: only triton-lowbit reads them
    **{(cls, fmt): list(_LOWBIT_GPU) for cls in ("sm80", "sm90", "sm100", "sm120")
       for fmt in ("nvfp4", "sign", "mixed")},
    **{(cls, fmt): [BMM] for cls in ("cpu", "unknown") for fmt in FORMATS},
    **{(cls, fmt): [BMM] for cls in ("sm80", "sm90", "sm100", "sm120") for fmt in (*DECODED_FORMATS, MIXED_DECODED)},
}
# The same with NVFP4 activations: the tensor-core path on 12.x, bmm (same recipe) everywhere.
TABLE_NVFP4_ACTIVATIONS: dict[tuple[str, str], list[str]] = {
    ("sm120", "nvfp4"): [SM120_FP4, BMM],
    ("sm120", "sign"): [SM120_FP4, BMM],
}


# ---- CUDA C++ kernels inside the Triton paths ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CudaKernel:
    """A CUDA C++ kernel of the native library (csrc/glu) that a Triton path runs in place of one of its Triton
    kernels (decisions 0013, 0014): on the artifact arches where it has run and was the faster (docs/performance.md),
    for the storage formats listed. Each call still checks its own shape and alignment (the family's host code) and
    that the library loads; anything else runs the Triton kernel."""

    replaces: str               # the Triton kernel it stands in for
    source: str                 # its file in csrc/
    formats: frozenset          # storage formats it reads (the factors' format; "ternary": both scalings)
    archs: frozenset            # artifact arches (tsct.kernels.aot.artifact_arch; a proxy install is not one)
    calls: str                  # the calls it takes, in words


_PACKED = frozenset({"nvfp4", "sign", "fp8", "ternary"})
#: the rows: one per Triton kernel with a CUDA stand-in. An arch without cubins (JIT: sm_80, ...) and a proxy install
#: (docs/decisions/0017: it runs sm_120's kernels) take none; sm_100 has the shared memory all three need, but none
#: has run there.
CUDA_KERNELS: tuple[CudaKernel, ...] = (
    CudaKernel("glu_bwd_dz", "csrc/glu/dz_bf16.cu", frozenset({"bf16"}), frozenset({"sm_90a"}),
               "bf16, r = 64, K-major w_down, 64-row tiles"),
    CudaKernel("lowbit_down_fwd", "csrc/glu/down_nvfp4.cu", _PACKED, frozenset({"sm_90a"}),
               "w_gate and w_up of one format, storage aligned, bf16 x, r = 64, d % 64 == 0"),
    CudaKernel("lowbit_up_fwd", "csrc/glu/up_nvfp4.cu", _PACKED, frozenset({"sm_90a"}),
               "storage aligned, bf16 z, r = 64, y rows 16-byte aligned"),
)


@functools.lru_cache(maxsize=8)
def _cuda_kernels_on(setting: str) -> frozenset:
    """The Triton kernels whose CUDA rows ``setting`` (``tsct.config.cuda_kernels``) leaves on."""
    names = {k.replaces for k in CUDA_KERNELS}
    s = setting.strip().lower()
    if s in ("", "auto"):
        return frozenset(names)
    if s in ("0", "off", "none"):
        return frozenset()
    chosen = {t.strip() for t in s.split(",") if t.strip()}
    if not chosen or not chosen <= names:  # "," names no kernel: a typo, not "none"
        words = chosen & {"", "auto", "0", "off", "none"}
        why = (f"{sorted(words)} cannot be combined with kernel names" if words else
               f"unknown {sorted(chosen - names)}" if chosen else "it names no kernel")
        raise ValueError(f"TSCT_CUDA_KERNELS / tsct.config.cuda_kernels = {setting!r}: expected auto, none or a comma "
                         f"list of {sorted(names)}; {why}")
    return frozenset(chosen)


def cuda_kernel(replaces: str, arch: Optional[str], fmt: str) -> bool:
    """Whether the Triton kernel ``replaces`` runs as its CUDA C++ row (``CUDA_KERNELS``) on artifact arch ``arch``
    (None: no cubins for this GPU) for factors of storage format ``fmt`` ("bf16", "nvfp4", "sign", "fp8",
    "ternary"), less the rows ``tsct.config.cuda_kernels`` turns off (``TSCT_CUDA_KERNELS``: kernel development, A/B
    against the Triton kernels). The call's shape is the caller's to check. Raises ValueError for a bad setting and for
    a ``replaces`` that no row names."""
    on = _cuda_kernels_on(config.cuda_kernels)
    if replaces not in on:
        if all(k.replaces != replaces for k in CUDA_KERNELS):
            raise ValueError(f"cuda_kernel: replaces={replaces!r} is no row of CUDA_KERNELS "
                             f"({sorted(k.replaces for k in CUDA_KERNELS)})")
        return False
    return any(k.replaces == replaces and arch in k.archs and fmt in k.formats for k in CUDA_KERNELS)


def cuda_kernels_by_arch(archs) -> dict[str, list[str]]:
    """{artifact arch: ["<Triton kernel> (<formats>)", ...] of the CUDA rows the dispatch takes there} for ``archs``
    (after ``tsct.config.cuda_kernels``): what the probe prints."""
    on = _cuda_kernels_on(config.cuda_kernels)
    return {a: [f"{k.replaces} ({', '.join(sorted(k.formats))}; {k.calls})" for k in CUDA_KERNELS
                if a in k.archs and k.replaces in on] for a in archs}


def arch_class(capability: Optional[tuple[int, int]]) -> str:
    """``None`` (CPU) -> "cpu"; an exact entry of ARCH_CLASSES; else "unknown"."""
    if capability is None:
        return "cpu"
    return ARCH_CLASSES.get(tuple(capability), "unknown")


def preferences(capability: Optional[tuple[int, int]], fmt: str, activations: str = "bf16") -> list[str]:
    """The paths ``auto`` tries, in order, for this capability, storage format and activation precision."""
    _check_activations(activations)
    table = TABLE if activations == "bf16" else TABLE_NVFP4_ACTIVATIONS
    return [p for p in table.get((arch_class(capability), fmt), [BMM]) if fmt not in FORCED_ONLY.get(p, ())]


def _check_activations(activations: str) -> None:
    if activations not in ACTIVATIONS:
        raise ValueError(f"grouped_glu: activations must be one of {list(ACTIVATIONS)}, got {activations!r}")


# ---- path status ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Status:
    ok: bool
    reason: str


def _reference_status(capability, fmt, x_dtype) -> Status:
    return Status(True, "pure torch; runs everywhere")


def _bmm_status(capability, fmt, x_dtype) -> Status:
    return Status(True, "torch.bmm on factors decoded to bf16; runs everywhere")


def _triton_bf16_status(capability, fmt, x_dtype) -> Status:
    from tsct.kernels import triton_glu
    return Status(*triton_glu.status(capability, fmt, x_dtype))


def _triton_lowbit_status(capability, fmt, x_dtype) -> Status:
    from tsct.kernels import triton_lowbit
    return Status(*triton_lowbit.status(capability, fmt, x_dtype))


def _sm120_fp4_status(capability, fmt, x_dtype) -> Status:
    from tsct.kernels import sm120_fp4
    return Status(*sm120_fp4.status(capability, fmt))


_PURE_TORCH = (REFERENCE, BMM)  # no kernels of their own: no first-use test, CPU and any GPU

# path -> status(capability, fmt, x_dtype)
_STATUS: dict[str, Callable[[Optional[tuple[int, int]], str, str], Status]] = {
    REFERENCE: _reference_status,
    BMM: _bmm_status,
    TRITON_BF16: _triton_bf16_status,
    TRITON_LOWBIT: _triton_lowbit_status,
    SM120_FP4: _sm120_fp4_status,
}


def status(path: str, capability: Optional[tuple[int, int]], fmt: str, x_dtype: str = "bf16") -> Status:
    """Whether ``path`` can run for this capability, storage format and activation dtype (``x_dtype``, a value of
    ``DTYPE_NAMES``: the Triton paths ship cubins for bf16 only and need Triton JIT for the rest), and why (not)."""
    if path not in _STATUS:
        raise ValueError(f"grouped_glu: impl={path!r} is not a path; expected 'auto' or one of {list(PATHS)}")
    st = _STATUS[path](capability, fmt, x_dtype)  # "not in this build" outranks "needs a GPU"
    if st.ok and path not in _PURE_TORCH and capability is None:
        return Status(False, "needs a CUDA GPU")
    return st


# ---- decisions and fallback counting -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Decision:
    path: str
    reason: str
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why it could not run), in preference order


_lock = threading.Lock()


#: the source directories of tsct, torch and Triton (where installed): the frames a fallback warning skips; found
#: when the first warning is issued (not at import)
_library_dirs: Optional[tuple[str, ...]] = None
_fallbacks: collections.Counter = collections.Counter()
_warned: set = set()


def fallback_counts() -> dict[tuple[str, str, str], int]:
    """{(wanted, taken, reason): count} of every fallback since the process started (or the last reset): the paths'
    (wanted and taken are ``PATHS`` entries), the native quantize / decode kernels' (wanted
    ``"native-quant/<function>"``, taken ``"torch"``: ``tsct.quant``) and the routing kernels' (wanted
    ``"triton-routing"``, taken ``"torch"``: ``tsct.ops.sort_by_expert``)."""
    with _lock:
        return dict(_fallbacks)


def fallback_records() -> list[dict]:
    """``fallback_counts`` as the JSON of ``tsct-probe --json``, ``tsct-bench`` and the training example write it
    (key "fallbacks"): a list of {"wanted", "taken", "reason", "count"}."""
    return [{"wanted": w, "taken": t, "reason": r, "count": n} for (w, t, r), n in fallback_counts().items()]


def _of_family(name: str, family: str) -> bool:
    """``name`` (a fallback's ``wanted``) is ``family`` or one of its members ("native-quant/<function>")."""
    return not family or name == family or name.startswith(family.rstrip("/") + "/")


def reset_fallback_counts(family: str = "") -> None:
    """Forget the counts, and which fallbacks were warned about, of ``family`` (a ``wanted`` as in
    ``fallback_counts``, e.g. "triton-bf16", "native-quant" for all of its functions, or
    "native-quant/quantize_sign"); all of them by default."""
    if not isinstance(family, str):
        raise TypeError(f"reset_fallback_counts: family must be a str, got {type(family).__name__}")
    with _lock:
        for key in [k for k in _fallbacks if _of_family(k[0], family)]:
            del _fallbacks[key]
        _warned.difference_update({k for k in _warned if _of_family(k[0], family)})


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` called in ``note_fallback`` that names the innermost frame outside
    tsct, torch and Triton: the caller's line, whichever of tsct's calls met the fallback."""
    global _library_dirs
    if _library_dirs is None:
        triton = importlib.util.find_spec("triton")
        files = [__file__, torch.__file__] + ([triton.origin] if triton is not None and triton.origin else [])
        _library_dirs = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in files)
    level, f = 2, sys._getframe(2)  # level 1 is note_fallback (sys._getframe(1)), level 2 its caller
    while f is not None and f.f_code.co_filename.startswith(_library_dirs):
        level, f = level + 1, f.f_back
    return level


def note_fallback(wanted: str, taken: str, why: str, message: str, *, warn_key: Optional[tuple] = None) -> None:
    """Count one call that ``wanted`` could not serve, served by ``taken``, because of ``why``
    (``fallback_counts()``), and warn ``message`` as a RuntimeWarning the first time this process meets ``warn_key``
    (default ``(wanted, taken, why)``; its first item names the family, as ``wanted`` does) while
    ``tsct.config.warn_fallbacks`` is on. The warning names the caller's line (the innermost frame outside tsct,
    torch and Triton). The one record of fallbacks: every family that falls back calls it. TypeError for a
    ``wanted``, ``taken``, ``why`` or ``message`` that is not a str."""
    for name, v in (("wanted", wanted), ("taken", taken), ("why", why), ("message", message)):
        if not isinstance(v, str):
            raise TypeError(f"note_fallback: {name} must be a str, got {type(v).__name__}")
    key = (wanted, taken, why)
    once = warn_key if warn_key is not None else key
    warn = config.warn_fallbacks
    with _lock:
        _fallbacks[key] += 1
        first = warn and once not in _warned
        if first:  # a fallback met while warnings are off is warned about once they are on again
            _warned.add(once)
    if first:
        warnings.warn(message, RuntimeWarning, stacklevel=_outside_stacklevel())


def decide(capability: Optional[tuple[int, int]], fmt: str, activations: str = "bf16", *, x_dtype: str = "bf16",
           first_use: Optional[Mapping[str, Status]] = None) -> Decision:
    """What ``impl="auto"`` takes for this capability, storage format, activation precision and x's dtype
    (``x_dtype``: see ``status``).

    ``first_use``: first-use verdicts the caller obtained (``tsct.ops._select``), by path; a path that
    ``needs_first_use`` and has a failing verdict there is skipped with the verdict's reason. Without
    (the probe's view) nothing is skipped for want of a verdict. Nothing runs, nothing is counted.
    """
    skipped = []
    for path in preferences(capability, fmt, activations):
        st = status(path, capability, fmt, x_dtype)
        if st.ok and first_use is not None and path in first_use and needs_first_use(path, capability):
            st = first_use[path]
        if st.ok:
            table = TABLE if activations == "bf16" else TABLE_NVFP4_ACTIVATIONS
            if skipped:
                reason = f"fallback: {skipped[0][0]} unavailable ({skipped[0][1]})"
            elif fmt in (*DECODED_FORMATS, MIXED_DECODED) and arch_class(capability) not in ("cpu", "unknown"):
                reason = (f"{fmt} factors: decoded to bf16 once per call, torch.bmm (triton-lowbit decodes them "
                          f"in registers only when forced: impl='triton-lowbit')")
            elif arch_class(capability) == "unknown":
                reason = f"compute capability {capability[0]}.{capability[1]} has no built artifacts"
            elif (arch_class(capability), fmt) not in table:
                reason = (f"no fast path for storage format {fmt!r}" if activations == "bf16" else
                          "NVFP4 activations: quantized by the tensor-core path's recipe, bf16 products")
            else:
                reason = "first choice"
            return Decision(path, reason, tuple(skipped))
        skipped.append((path, st.reason))
    raise RuntimeError(f"no path can run for capability {capability} and format {fmt!r}: {skipped}")


# Where each path's tests have run on real hardware (by arch class), and the native quantize / decode kernels'
# (NATIVE_QUANT) and the routing kernels' (ROUTING). Anywhere else, the first use runs a self-test in a child process
# (tsct.firstuse, asked for by tsct.ops for a path and for ROUTING, by tsct.quant for NATIVE_QUANT) and disables the
# path (or the native kernels: tsct.quant then runs its torch backend, the same bytes; or the routing kernels:
# sort_by_expert then runs torch's sort, the same result) if it fails.
_ALL_CLASSES = frozenset({"cpu", "sm80", "sm90", "sm100", "sm120", "unknown"})
EXECUTED_ON: dict[str, frozenset] = {
    REFERENCE: _ALL_CLASSES,
    BMM: _ALL_CLASSES,  # torch.bmm and torch's own kernels only
    TRITON_BF16: frozenset({"sm90"}),  # the GPU tests (tests/*/test_*_gpu.py) on an H200
    TRITON_LOWBIT: frozenset({"sm90"}),  # the GPU tests on an H200
    SM120_FP4: frozenset(),
    NATIVE_QUANT: frozenset({"sm90"}),  # tests/native/test_native_quant_gpu.py on an H200
    ROUTING: frozenset({"sm90"}),  # tests/ops/test_sort_by_expert_gpu.py on an H200
}
#: a path whose backward runs another path's kernels where that one may run: (path, storage format) whose
#: first-use verdict the backward reads (``first_use_status``); tsct.ops asks for it before the backward runs
BACKWARD_VIA: dict[str, tuple[str, str]] = {SM120_FP4: (TRITON_LOWBIT, "nvfp4")}
#: (path, arch class, fmt, CUDA device index) -> self-test verdict, in the order recorded
_first_use: dict[tuple[str, str, str, Optional[int]], Status] = {}


def needs_first_use(path: str, capability: Optional[tuple[int, int]]) -> bool:
    """Whether using ``path`` on a GPU of ``capability`` needs its first-use verdict: a GPU of an arch
    class the path's kernels never executed on (``EXECUTED_ON``)."""
    return capability is not None and arch_class(capability) not in EXECUTED_ON.get(path, frozenset())


def record_first_use(path: str, capability: tuple[int, int], fmt: str, st: Status,
                     device_index: Optional[int] = None) -> Status:
    """Keep the first-use verdict tsct.ops obtained for (path, arch class of ``capability``, fmt) on CUDA device
    ``device_index``."""
    with _lock:
        key = (path, arch_class(capability), fmt, device_index)
        _first_use.pop(key, None)  # re-inserted: the last recorded of its class comes last
        _first_use[key] = st
    return st


def first_use_status(path: str, capability: Optional[tuple[int, int]], fmt: str,
                     device_index: Optional[int] = None) -> Optional[Status]:
    """The first-use verdict recorded in this process for (path, fmt) on CUDA device ``device_index``; without one,
    the last recorded for the arch class of ``capability``, of whichever GPU asked last (a report: two GPUs of one
    class may be different models with different verdicts). None if none was."""
    cls = arch_class(capability)
    with _lock:
        if device_index is not None:
            return _first_use.get((path, cls, fmt, device_index))
        return _class_view().get((path, cls, fmt))


def _class_view() -> dict[tuple[str, str, str], Status]:
    """(path, arch class, fmt) -> the verdict recorded last among that class's GPUs (under ``_lock``)."""
    return {k[:3]: st for k, st in _first_use.items()}


def first_use_results() -> dict[tuple[str, str, str], Status]:
    """Verdicts of the first-use self-tests asked for in this process, by (path, arch class, fmt): of the GPUs of a
    class, the one recorded last."""
    with _lock:
        return _class_view()


def _count(wanted: str, taken: str, why: str) -> None:
    note_fallback(wanted, taken, why, f"tsct: {wanted} unavailable ({why}); using {taken}. "
                                      "Counted in tsct.dispatch.fallback_counts().")


@torch.compiler.assume_constant_result
def select(impl: str, capability: Optional[tuple[int, int]], fmt: str, activations: str = "bf16", *,
           x_dtype: str = "bf16", first_use: Optional[Mapping[str, Status]] = None) -> str:
    """Resolve ``impl`` for one call to a path name. Counts (and warns once) when auto falls back.

    ``x_dtype``: x's dtype (``DTYPE_NAMES``; see ``status``). ``first_use``: the first-use verdicts obtained for
    this call, by path (see ``decide``). A returned
    path that ``needs_first_use`` and has no verdict in ``first_use`` is pending: nothing is counted,
    and the caller asks for its verdict and selects again with it (``tsct.ops._select.select``). A
    forced path must compute the requested activation precision (``COMPUTES``), else ValueError; one
    that cannot run (its status, or a failing verdict) raises RuntimeError.
    Under torch.compile this runs once at trace time and its answer is baked into the graph
    (``assume_constant_result``); the counters then count traces, not calls.
    """
    _check_activations(activations)
    first_use = first_use or {}
    if impl != "auto":
        st = status(impl, capability, fmt, x_dtype)
        if activations not in COMPUTES[impl]:
            raise ValueError(f"grouped_glu: impl={impl!r} computes {'/'.join(sorted(COMPUTES[impl]))} activations, "
                             f"not activations={activations!r}"
                             + ("; pass activations='nvfp4'" if impl == SM120_FP4 else
                                "; impl='bmm' or 'auto' serve activations='nvfp4' everywhere"))
        if st.ok and impl in first_use and needs_first_use(impl, capability):
            st = first_use[impl]
        if not st.ok:
            where = "CPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
            raise RuntimeError(f"grouped_glu: impl={impl!r} cannot run on {where} with {fmt} factors: {st.reason}")
        return impl
    dec = decide(capability, fmt, activations, x_dtype=x_dtype, first_use=first_use)
    pending = needs_first_use(dec.path, capability) and dec.path not in first_use
    if dec.skipped and not pending:
        _count(dec.skipped[0][0], dec.path, dec.skipped[0][1])
    return dec.path


def device_capability(device: torch.device) -> Optional[tuple[int, int]]:
    """Compute capability of a CUDA device (cached by torch), None for CPU."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


# ---- what the custom op carries --------------------------------------------------------------------

def impl_key(path: str, activations: str = "bf16", static: bool = False) -> str:
    """The string the custom op carries for one call: the path, plus bmm's variant
    (``"bmm/nvfp4-act"`` for NVFP4 activations, ``"/static"`` for the capture-safe layout)."""
    if path != BMM:
        return path
    return path + ("/nvfp4-act" if activations == "nvfp4" else "") + ("/static" if static else "")


class _BmmVariant:
    """tsct.bmm with its activations / static options bound (what ``implementation`` returns for a key)."""

    def __init__(self, activations: str, static: bool):
        from tsct import bmm
        self._bmm, self._kw = bmm, dict(activations=activations, static=static)
        self.saved_like = bmm.saved_like

    def grouped_glu_forward(self, *args):
        return self._bmm.grouped_glu_forward(*args, **self._kw)

    def grouped_glu_forward_saved(self, *args):
        return self._bmm.grouped_glu_forward_saved(*args, **self._kw)

    def grouped_glu_backward(self, *args, saved=None):
        return self._bmm.grouped_glu_backward(*args, saved=saved, **self._kw)


@functools.lru_cache(maxsize=None)
def implementation(key: str):
    """The module (or bound variant) with ``grouped_glu_forward`` / ``grouped_glu_backward`` for an
    ``impl_key``. Imported lazily so ``import tsct`` stays light."""
    path, *opts = key.split("/")
    if path == BMM and set(opts) <= {"nvfp4-act", "static"}:
        return _BmmVariant("nvfp4" if "nvfp4-act" in opts else "bf16", "static" in opts)
    if opts:
        raise RuntimeError(f"path key {key!r} has no implementation in this build")
    if path == REFERENCE:
        from tsct import reference
        return reference
    if path == TRITON_BF16:
        from tsct.kernels import triton_glu
        return triton_glu
    if path == TRITON_LOWBIT:
        from tsct.kernels import triton_lowbit
        return triton_lowbit
    if path == SM120_FP4:
        from tsct.kernels import sm120_fp4
        return sm120_fp4
    raise RuntimeError(f"path {path!r} has no implementation in this build")
