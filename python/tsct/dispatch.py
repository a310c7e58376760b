"""The dispatch table: (compute capability, storage format, built artifacts) -> path. One place.

``impl="auto"`` walks the preference list of the caller's (arch class, storage format) and takes the
first path whose ``status`` says it can run; every step past the first is a counted fallback with
its reason (``fallback_counts()``), warned once per (path, reason) per process. ``impl=<path>``
forces a path and raises ``RuntimeError`` with the reason if it cannot run.

Paths (design.md section 4):
    reference      pure torch (tsct.reference), CPU and any GPU
    triton-bf16    Triton grouped GEMM + fused GLU, bf16/fp16 factors     (issue 3; AOT cubins for sm_90a/sm_100a/sm_120, JIT otherwise)
    triton-lowbit  Triton with NVFP4 / sign factors decoded in registers  (issue 4; AOT cubins for uniform nvfp4 / sign, JIT otherwise)
    sm120-fp4      NVFP4 block-scaled mma.sync on sm_120 (CuTeDSL, tsct.kernels.sm120_fp4) (issue 5; 12.0 with
                   the sm_120a exports, 12.1 with the sm_121a exports; NVFP4 or sign factors)
    triton-w4a4    NVFP4 weights AND activations on tl.dot_scaled (issue 4 item 2; tsct.kernels.triton_w4a4): only
                   when asked for (impl="triton-w4a4", in no preference list): the 4-bit activations change the
                   result (a different op numerically), native OMMA on sm_120 (never executed), emulated on sm_90;
                   runs from the shipped cubins only. Its first-use self-test (off sm_90) compares with the torch
                   model of its quantize-then-multiply math, not with the dense reference.

sm120-fp4 has never executed on an sm_120 card, and a kernel that faults would kill the caller's
CUDA context, so its first-use self-test runs in a CHILD process (``tsct.kernels.sm120_fp4.firstuse``):
on the first ``auto`` (or forced) use in a process the child runs the path against the torch emulation
on the same GPU; "pass" lets the path run, a numerical failure, a crash (signal, exit without a
verdict) or a timeout disables it with the usual counted, warned fallback, the reason saying what
happened. The verdict is cached in the process and on disk (``firstuse.cache_file()``), keyed by tsct
version, library bytes, driver, GPU name and compute capability. ``TSCT_SM120_FP4=0`` turns the path
off, ``=1`` turns it on WITHOUT the self-test (for kernel developers), unset = the above.

A path that is not ready stays out of ``auto`` (its status says why) rather than landing broken.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import warnings
from typing import Callable, Optional

import torch

from tsct import config

REFERENCE = "reference"
TRITON_BF16 = "triton-bf16"
TRITON_LOWBIT = "triton-lowbit"
SM120_FP4 = "sm120-fp4"
TRITON_W4A4 = "triton-w4a4"
PATHS = (REFERENCE, TRITON_BF16, TRITON_LOWBIT, SM120_FP4, TRITON_W4A4)

FORMATS = ("bf16", "nvfp4", "sign")  # storage formats with a row in the table; others use reference

# Exact compute capability -> arch class. Anything not listed is "unknown": no artifact was built
# for it, so only the reference path runs (a (10,3) part cannot load sm_100a cubins, for example).
ARCH_CLASSES: dict[tuple[int, int], str] = {
    (8, 0): "sm80", (8, 6): "sm80", (8, 7): "sm80", (8, 9): "sm80",
    (9, 0): "sm90",
    (10, 0): "sm100",
    (12, 0): "sm120",
    (12, 1): "sm120",  # covered by the sm_120f family target
}

_DENSE_GPU = [TRITON_BF16, REFERENCE]
_LOWBIT_GPU = [TRITON_LOWBIT, REFERENCE]
_LOWBIT_SM120 = [SM120_FP4, TRITON_LOWBIT, REFERENCE]
# (arch class, storage format) -> paths in order of preference. Missing rows (cpu, unknown, fp32
# factors) mean [REFERENCE].
TABLE: dict[tuple[str, str], list[str]] = {
    ("cpu", "bf16"): [REFERENCE],
    ("cpu", "nvfp4"): [REFERENCE],
    ("cpu", "sign"): [REFERENCE],
    ("sm80", "bf16"): _DENSE_GPU,
    ("sm80", "fp16"): _DENSE_GPU,
    ("sm80", "nvfp4"): _LOWBIT_GPU,
    ("sm80", "sign"): _LOWBIT_GPU,
    ("sm90", "bf16"): _DENSE_GPU,
    ("sm90", "fp16"): _DENSE_GPU,
    ("sm90", "nvfp4"): _LOWBIT_GPU,
    ("sm90", "sign"): _LOWBIT_GPU,
    ("sm100", "bf16"): _DENSE_GPU,
    ("sm100", "fp16"): _DENSE_GPU,
    ("sm100", "nvfp4"): _LOWBIT_GPU,
    ("sm100", "sign"): _LOWBIT_GPU,
    ("sm120", "bf16"): _DENSE_GPU,
    ("sm120", "fp16"): _DENSE_GPU,
    ("sm120", "nvfp4"): _LOWBIT_SM120,
    ("sm120", "sign"): _LOWBIT_SM120,
    # packed and dense factors together, or NVFP4 with sign: only the Triton low-bit path reads them
    ("sm80", "mixed"): _LOWBIT_GPU,
    ("sm90", "mixed"): _LOWBIT_GPU,
    ("sm100", "mixed"): _LOWBIT_GPU,
    ("sm120", "mixed"): _LOWBIT_GPU,
    ("unknown", "bf16"): [REFERENCE],
    ("unknown", "nvfp4"): [REFERENCE],
    ("unknown", "sign"): [REFERENCE],
}


def arch_class(capability: Optional[tuple[int, int]]) -> str:
    """``None`` (CPU) -> "cpu"; an exact entry of ARCH_CLASSES; else "unknown"."""
    if capability is None:
        return "cpu"
    return ARCH_CLASSES.get(tuple(capability), "unknown")


def preferences(capability: Optional[tuple[int, int]], fmt: str) -> list[str]:
    return list(TABLE.get((arch_class(capability), fmt), [REFERENCE]))


# ---- path status ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Status:
    ok: bool
    reason: str


def _reference_status(capability, fmt) -> Status:
    return Status(True, "pure torch; runs everywhere")


def _not_built(issue: int, what: str) -> Callable:
    def status(capability, fmt) -> Status:
        return Status(False, f"{what} is not in this build of tsct (tracked in issue {issue})")
    return status


def _triton_bf16_status(capability, fmt) -> Status:
    from tsct.kernels import triton_glu
    return Status(*triton_glu.status(capability, fmt))


def _triton_lowbit_status(capability, fmt) -> Status:
    from tsct.kernels import triton_lowbit
    return Status(*triton_lowbit.status(capability, fmt))


def _triton_w4a4_status(capability, fmt) -> Status:
    from tsct.kernels import triton_w4a4
    return Status(*triton_w4a4.status(capability, fmt))


def _sm120_fp4_status(capability, fmt) -> Status:
    from tsct.kernels import sm120_fp4
    return Status(*sm120_fp4.status(capability, fmt))


# path -> status(capability, fmt). Later paths replace their entry when their kernels land.
_STATUS: dict[str, Callable[[Optional[tuple[int, int]], str], Status]] = {
    REFERENCE: _reference_status,
    TRITON_BF16: _triton_bf16_status,
    # tsct.ops routes packed factors through the tsct::grouped_glu_q custom op (ops/_library_q.py)
    TRITON_LOWBIT: _triton_lowbit_status,
    # Never executed on an sm_120 card: behind the crash-safe (child process) first-use self-test.
    SM120_FP4: _sm120_fp4_status,
    # Explicit only (impl="triton-w4a4"; in no TABLE row): 4-bit activations change the numbers (~17 %
    # vs the dense reference at b1), and it is emulated on sm_90, never executed on sm_120.
    TRITON_W4A4: _triton_w4a4_status,
}


def status(path: str, capability: Optional[tuple[int, int]], fmt: str) -> Status:
    """Whether ``path`` can run for this capability and storage format, and why (not)."""
    if path not in _STATUS:
        raise ValueError(f"grouped_glu: impl={path!r} is not a path; expected 'auto' or one of {list(PATHS)}")
    st = _STATUS[path](capability, fmt)  # "not in this build" outranks "needs a GPU"
    if st.ok and path != REFERENCE and capability is None:
        return Status(False, "needs a CUDA GPU")
    return st


# ---- decisions and fallback counting -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Decision:
    path: str
    reason: str
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why it could not run), in preference order


_lock = threading.Lock()
_fallbacks: collections.Counter = collections.Counter()
_warned: set = set()


def fallback_counts() -> dict[tuple[str, str, str], int]:
    """{(wanted path, taken path, reason): count} since the process started (or the last reset)."""
    with _lock:
        return dict(_fallbacks)


def reset_fallback_counts() -> None:
    with _lock:
        _fallbacks.clear()
        _warned.clear()


def decide(capability: Optional[tuple[int, int]], fmt: str, *, first_use_checks: bool = False) -> Decision:
    """What ``impl="auto"`` takes for this capability and storage format.

    With ``first_use_checks`` (as ``select`` calls it) a path never executed on this arch class
    runs its first-use self-test; without, nothing runs and nothing is counted (the probe's view).
    """
    skipped = []
    for path in preferences(capability, fmt):
        st = status(path, capability, fmt)
        if st.ok and first_use_checks and capability is not None:
            st = _first_use_check(path, capability, fmt)
        if st.ok:
            if skipped:
                reason = f"fallback: {skipped[0][0]} unavailable ({skipped[0][1]})"
            elif arch_class(capability) == "unknown":
                reason = f"compute capability {capability[0]}.{capability[1]} has no built artifacts"
            elif (arch_class(capability), fmt) not in TABLE:
                reason = f"no fast path for storage format {fmt!r}"
            else:
                reason = "first choice"
            return Decision(path, reason, tuple(skipped))
        skipped.append((path, st.reason))
    raise RuntimeError(f"no path can run for capability {capability} and format {fmt!r}: {skipped}")


# Where each path's tests have run on real hardware (by arch class). Anywhere else, the first use
# in a process runs a small self-test against float64 and disables the path if it disagrees.
EXECUTED_ON: dict[str, frozenset] = {
    REFERENCE: frozenset({"cpu", "sm80", "sm90", "sm100", "sm120", "unknown"}),
    TRITON_BF16: frozenset({"sm90"}),  # tests/gpu/test_triton_glu.py on an H200 (2026-11-29)
    TRITON_LOWBIT: frozenset({"sm90"}),  # tests/gpu/test_triton_lowbit_gpu.py on an H200 (2026-11-29, JIT)
    SM120_FP4: frozenset(),
    TRITON_W4A4: frozenset({"sm90"}),  # tests/gpu/test_triton_w4a4_gpu.py on an H200 (emulated dot_scaled, 2026-11-29)
}
_first_use: dict[tuple[str, str, str], Status] = {}  # (path, arch class, fmt) -> self-test verdict
_in_selftest: set = set()


def _first_use_check(path: str, capability, fmt: str) -> Status:
    cls = arch_class(capability)
    key = (path, cls, fmt)
    if cls in EXECUTED_ON.get(path, frozenset()) or key in _in_selftest:
        return Status(True, "")
    if path == SM120_FP4:
        return _sm120_first_use(key, fmt)
    if key not in _first_use:
        from tsct import selftest
        _in_selftest.add(key)
        try:
            dev = torch.device("cuda", torch.cuda.current_device())
            res = selftest.grouped_glu(path, dev, torch.bfloat16,
                                       fmt if fmt in FORMATS or fmt == "mixed" else "bf16")
        finally:
            _in_selftest.discard(key)
        _first_use[key] = Status(res.ok, f"first-use self-test on {cls} {'passed' if res.ok else 'FAILED'}: {res.detail}")
    return _first_use[key]


def _sm120_first_use(key: tuple[str, str, str], fmt: str) -> Status:
    """sm120-fp4's verdict for the current CUDA device: from its child-process self-test (run now,
    or cached in the process / on disk) or forced by TSCT_SM120_FP4 (tsct.kernels.sm120_fp4.firstuse)."""
    from tsct.kernels.sm120_fp4 import firstuse

    v = firstuse.verdict(torch.cuda.current_device(), fmt)
    # no v.source here: the reason keys the fallback counter and must not change once the verdict is cached
    if v.outcome == "forced":
        st = Status(True, f"first-use self-test on {key[1]} skipped: {v.detail}")
    else:
        word = "passed" if v.ok else "FAILED"
        where = ""
        if not v.ok and v.outcome not in ("disabled", "not-runnable"):
            where = (" (not cached: the next process tests again)" if firstuse.is_transient(v.outcome, v.detail)
                     else f" (verdict cached in {firstuse.cache_file()}: delete it to test again)")
        st = Status(v.ok, f"first-use self-test on {key[1]} {word}: {v.outcome}: {v.detail}{where}")
    _first_use[key] = st
    return st


def first_use_results() -> dict[tuple[str, str, str], Status]:
    """Verdicts of the first-use self-tests run in this process."""
    return dict(_first_use)


def _count(wanted: str, taken: str, why: str) -> None:
    key = (wanted, taken, why)
    with _lock:
        _fallbacks[key] += 1
        first = key not in _warned
        _warned.add(key)
    if first and config.warn_fallbacks:
        warnings.warn(f"tsct: {wanted} unavailable ({why}); using {taken}. "
                      "Counted in tsct.dispatch.fallback_counts().", RuntimeWarning, stacklevel=4)


@torch.compiler.assume_constant_result
def select(impl: str, capability: Optional[tuple[int, int]], fmt: str) -> str:
    """Resolve ``impl`` for one call. Counts (and warns once) when auto falls back.

    Under torch.compile this runs once at trace time and its answer is baked into the graph
    (``assume_constant_result``); the counters then count traces, not calls.
    """
    if impl != "auto":
        st = status(impl, capability, fmt)
        if st.ok and capability is not None:
            st = _first_use_check(impl, capability, fmt)
        if not st.ok:
            where = "CPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
            raise RuntimeError(f"grouped_glu: impl={impl!r} cannot run on {where} with {fmt} factors: {st.reason}")
        return impl
    dec = decide(capability, fmt, first_use_checks=True)
    if dec.skipped:
        _count(dec.skipped[0][0], dec.path, dec.skipped[0][1])
    return dec.path


def device_capability(device: torch.device) -> Optional[tuple[int, int]]:
    """Compute capability of a CUDA device (cached by torch), None for CPU."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


# path -> module with forward(...) / backward(...). Imported lazily so `import tsct` stays light.
def implementation(path: str):
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
    if path == TRITON_W4A4:
        from tsct.kernels import triton_w4a4
        return triton_w4a4
    raise RuntimeError(f"path {path!r} has no implementation in this build")
