"""Every environment variable tsct reads at run time, in one place: ``VARIABLES`` lists each (name, type,
default, meaning; the README's table is checked against it), the settings below read them.

Settings of the process, changeable at run time (``tsct.config.check_values = False``); ``check_values``,
``warn_fallbacks``, ``eager_replay``, ``triton_glu_cfg`` and ``cuda_kernels`` are read from the environment once, at
import, ``eager_direct`` and ``side_stream`` are set in code only:

``check_values``: whether ``grouped_glu`` validates the VALUES of ``offs``, ``gather_idx`` and
``scatter_idx`` (non-decreasing offsets, indices in range). On a GPU this reads those tensors on the
host, i.e. one device synchronization per call. While a CUDA graph is being captured or torch.compile
traces (values are not known then) the host read is replaced by device-side asserts, so a violation
still fails loudly. Set
``TSCT_CHECK_VALUES=0`` or ``tsct.config.check_values = False`` for sync-free eager calls once a
model's routing is trusted (docs/decisions/0004-validation.md). Shapes, dtypes and devices are
always checked; they cost no sync; so are the values of CPU tensors (``values_checked``): no sync to save there.

``eager_direct``: plain eager calls on CUDA tensors run the path's forward and backward through a
``torch.autograd.Function`` instead of the custom ops' dispatcher (same functions, same results; less
host time per call). torch.compile, FakeTensor, tensor subclasses and dispatch modes always get the
custom ops. ``tsct.config.eager_direct = False`` sends everything through the ops (``tsct.ops._eager``).

``eager_replay``: a plain eager call (the ``eager_direct`` route) of a Triton path or of ``sort_by_expert`` records
what its second call of a signature (shapes, strides, dtypes, alignment, formats, configuration) allocates and
launches, and later calls of that signature issue the same launches with their own tensors, skipping the path's
host code (``tsct.kernels.replay``; same kernels and arguments, same bits). ``TSCT_EAGER_REPLAY=0`` turns it off.

``side_stream``: a GPU path issues two kinds of side work on second CUDA streams, beside the row kernels on the
caller's stream: the forward with ``scatter_idx`` builds the combine's CSR (a stable sort of the targets,
latency-bound kernels) on a high-priority one, and the backward runs its chunked weight-gradient kernels (dW of the
experts of several row tiles and their fixed-order slot sums, which the row kernels do not read) on one of the
default priority, issued after the row kernel they run beside. The caller's stream waits for the
side stream before the combine, and before the backward returns. Same results either way;
``tsct.config.side_stream = False`` keeps everything on the caller's stream. No CSR is built when ``scatter_idx`` is
the token tensor ``tsct.ops.sort_by_expert`` returned (with its offs): the sort's kernels wrote that CSR already.

``warn_fallbacks``: warn (once per path and reason) when ``impl="auto"`` could not take the
preferred path. The counter in ``tsct.dispatch.fallback_counts()`` counts every time regardless.

``triton_glu_cfg``: ``TSCT_TRITON_GLU_CFG``, overrides of the Triton tile configuration ("name=int,...", kernel
development); applied to the per-arch tables when ``tsct.kernels.triton_common.runtime`` is imported.

``cuda_kernels``: ``TSCT_CUDA_KERNELS``, which rows of ``tsct.dispatch.CUDA_KERNELS`` (CUDA C++ stand-ins for three
Triton kernels on sm_90a) the Triton paths take: "auto" (all, the default), "none" (the Triton kernels everywhere:
kernel development, A/B) or a comma list of the Triton kernels to replace; consulted on every launch decision.

Settings read on every call, through the functions below (tests, scripts and the first-use child set them in
the environment of a running process): ``triton_backend()``, ``sm120_fp4()``, ``selftest_timeout()``,
``in_selftest_child()``, ``triton_interpret()``, ``cache_dir()``, ``native_lib()``, ``aot_dir()``, ``tool_path()``,
``cuda_visible_devices()``.

Not read by the installed package at run time, listed in ``BUILD_AND_TOOL_VARIABLES``: the build's options
(CMakeLists.txt, ``ci/build_wheel.sh``, ``tsct.kernels.triton_common.aot_build`` at wheel-build time), the
benchmark's commit override (``tsct.bench.measure``) and the test harness's switches.

Standard library only: ``tsct.native.artifacts`` loads this file by path when it runs without the package
(``ci/check_artifacts.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, Optional


class Variable(NamedTuple):
    name: str
    type: str
    default: str
    meaning: str


#: the run-time environment variables, in the README's order
VARIABLES: tuple[Variable, ...] = (
    Variable("TSCT_CHECK_VALUES", "bool", "1", "`0`: skip the host read of `offs` / index values per call of GPU "
             "tensors (sync-free eager calls; shapes are still checked, CPU tensors' values too); "
             "`sort_by_expert`'s unchanged outputs are never read back; `tsct.config.check_values`"),
    Variable("TSCT_WARN_FALLBACKS", "bool", "1", "`0`: do not warn on fallbacks (they are still counted); "
             "`tsct.config.warn_fallbacks`"),
    Variable("TSCT_EAGER_REPLAY", "bool", "1", "`0`: plain eager calls of the Triton paths and `sort_by_expert` run "
             "their host code every time instead of replaying the launches recorded at the second call of their "
             "signature (the same launches either way; `tsct.kernels.replay`); `tsct.config.eager_replay`"),
    Variable("TSCT_TRITON_BACKEND", "auto\\|aot\\|jit", "auto", "Triton kernels from the installed cubins, else JIT "
             "(`auto`); cubins only; JIT only (read per call)"),
    Variable("TSCT_TRITON_GLU_CFG", "name=int,...", "(empty)", "override fields of the Triton tile configuration "
             "(kernel development; read once)"),
    Variable("TSCT_CUDA_KERNELS", "auto\\|none\\|list", "auto", "which CUDA C++ stand-ins for Triton kernels "
             "(`tsct.dispatch.CUDA_KERNELS`) run: all, none (A/B), or the listed Triton kernels' (read once); "
             "`tsct.config.cuda_kernels`"),
    Variable("TSCT_SM120_FP4", "0\\|1\\|auto", "(unset)", "`sm120-fp4` off; on without its self-test (kernel "
             "development); unset or `auto`: the self-test decides (read per call)"),
    Variable("TSCT_SELFTEST_TIMEOUT", "seconds", "300", "how long a first-use self-test child may run"),
    Variable("TSCT_CACHE_DIR", "directory", "`$XDG_CACHE_HOME/tsct` or `~/.cache/tsct`", "where the first-use "
             "verdicts are cached (`selftest.json`)"),
    Variable("TSCT_SELFTEST_CHILD", "path", "(unset)", "set by tsct in a first-use self-test child: it runs the path "
             "under test without asking again, and no other gated kernel family (not a user setting)"),
    Variable("TSCT_NATIVE_LIB", "file or directory", "the installed `tsct/_lib`", "load this native library "
             "instead of the installed one"),
    Variable("TSCT_AOT_DIR", "directory", "the installed `tsct/_aot`", "load the Triton cubins from this directory"),
    Variable("CUOBJDUMP", "file", "`PATH`, then the nvidia-cuda-cuobjdump wheel", "cuobjdump for "
             "`tsct-probe --verify-artifacts` and `python -m tsct.native.artifacts`"),
    Variable("NVDISASM", "file", "`PATH`, then the nvidia-cuda-nvdisasm wheel", "nvdisasm for the SASS check "
             "(`python -m tsct.native.artifacts --sass`)"),
    Variable("XDG_CACHE_HOME", "directory", "`~/.cache`", "the cache's parent directory when `TSCT_CACHE_DIR` is "
             "unset"),
    Variable("TRITON_INTERPRET", "0\\|1", "0", "Triton's own switch to its interpreter (the CPU checks of the "
             "Triton kernels); tsct then leaves out its JIT-only launch constants"),
    Variable("CUDA_VISIBLE_DEVICES", "list", "(unset)", "read to pin a first-use child to the caller's GPU"),
)

#: variables that are not read by the installed package at run time (the build, the benchmark, the tests)
BUILD_AND_TOOL_VARIABLES: tuple[Variable, ...] = (
    Variable("TSCT_BUILD_CUDA", "ON\\|OFF", "ON", "build the native library (CMake option; OFF: the pure-Python "
             "package)"),
    Variable("TSCT_CUDA_GENCODES", "list", "sm_80;compute_80;sm_90a;sm_120a;sm_120f", "the CUDA targets of "
             "the native library (CMake)"),
    Variable("TSCT_TRITON_AOT", "ON\\|OFF", "ON", "compile the Triton cubins at wheel build (CMake; "
             "`tsct.kernels.triton_common.aot_build`)"),
    Variable("TSCT_TRITON_AOT_ARCHS", "list", "sm_90a;sm_120", "the archs of the Triton cubins (CMake); "
             "`sm_100a` adds 10.0's (JIT there by default); a proxy name builds the sm_120 proxy (docs/decisions/0017)"),
    Variable("TSCT_CUTEDSL", "AUTO\\|ON\\|OFF", "AUTO", "export and link the CuTeDSL sm_120 kernels (CMake)"),
    Variable("TSCT_CUTEDSL_PYTHON", "file", "(unset)", "the Python with nvidia-cutlass-dsl that exports them "
             "(build; CuTeDSL tests)"),
    Variable("TSCT_GIT_COMMIT", "SHA", "`git rev-parse`", "the commit a wheel records when its tree has no `.git` "
             "(CMake; `tsct.__git_commit__`)"),
    Variable("TSCT_CUTEDSL_PRELOADED", "1", "(unset)", "set by `cutedsl/build.py` when it re-runs itself with "
             "the DSL's runtime preloaded (not a user setting)"),
    Variable("TSCT_BENCH_GIT_COMMIT", "SHA", "`git rev-parse`", "the commit `tsct-bench` records when the tree has no "
             "`.git`"),
    Variable("TSCT_EXPECT_NATIVE", "0\\|1", "1", "tests: `0` skips the native-library tests of a TSCT_BUILD_CUDA=OFF "
             "install"),
    Variable("TSCT_GPU_LOG", "file", "(unset)", "GPU tests: append their result lines to this file"),
    Variable("TSCT_LAUNCH_LEDGER", "file", "(unset)", "GPU tests (`-p _launch_ledger`): record every kernel launch "
             "per test"),
)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(name: str, default: bool) -> bool:
    """A boolean variable: 1 / true / yes / on or 0 / false / no / off (any case); unset or empty: ``default``;
    anything else warns and takes ``default`` (a typo such as "disable" must not silently keep checks on)."""
    v = os.environ.get(name, "").strip().lower()
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    if v:
        import warnings

        warnings.warn(f"{name}={os.environ[name]!r} is not a boolean (1/true/yes/on or 0/false/no/off); using the "
                      f"default {int(default)}", RuntimeWarning, stacklevel=2)
    return default


def _env_path(name: str) -> Optional[Path]:
    v = os.environ.get(name)
    return Path(v).expanduser() if v else None


# ---- the process's settings (read once, at import) -----------------------------------------------

check_values: bool = _env_flag("TSCT_CHECK_VALUES", True)
warn_fallbacks: bool = _env_flag("TSCT_WARN_FALLBACKS", True)
eager_direct: bool = True
eager_replay: bool = _env_flag("TSCT_EAGER_REPLAY", True)
side_stream: bool = True
triton_glu_cfg: str = os.environ.get("TSCT_TRITON_GLU_CFG", "")
cuda_kernels: str = os.environ.get("TSCT_CUDA_KERNELS", "auto")

# ---- read on every call ------------------------------------------------------------------------------

ENV_SELFTEST_CHILD = "TSCT_SELFTEST_CHILD"
DEFAULT_SELFTEST_TIMEOUT_S = 300.0
#: the longest wait on a self-test child (a week): subprocess's poll takes milliseconds in a C int (24 days at most)
MAX_SELFTEST_TIMEOUT_S = 7 * 24 * 3600.0


def triton_backend() -> str:
    """``TSCT_TRITON_BACKEND`` lower-cased, "auto" when unset or empty (not validated here:
    ``tsct.kernels.launch.backend_mode`` raises for a value other than auto, aot or jit)."""
    return os.environ.get("TSCT_TRITON_BACKEND", "auto").strip().lower() or "auto"


def triton_interpret() -> bool:
    """Triton's own ``TRITON_INTERPRET`` is on (not "" or "0"): Triton runs kernels in its interpreter (CPU checks),
    which compiles nothing."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm120_fp4() -> Optional[str]:
    """``TSCT_SM120_FP4`` as set (None when unset); ``tsct.kernels.sm120_fp4.env_mode`` interprets it."""
    return os.environ.get("TSCT_SM120_FP4")


def selftest_timeout() -> float:
    """``TSCT_SELFTEST_TIMEOUT`` (seconds, > 0), else ``DEFAULT_SELFTEST_TIMEOUT_S`` (also for a value that is
    not a positive number). At most ``MAX_SELFTEST_TIMEOUT_S`` ("inf" and larger values mean that): the wait on the
    child takes no longer timeout (an OverflowError from the poll otherwise)."""
    raw = os.environ.get("TSCT_SELFTEST_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_SELFTEST_TIMEOUT_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not v > 0:  # 0, negative, nan or not a number: said once per value, then the default
        if raw not in _warned_timeouts:
            _warned_timeouts.add(raw)
            import warnings

            warnings.warn(f"TSCT_SELFTEST_TIMEOUT={raw!r} is not a positive number of seconds; using the default "
                          f"{DEFAULT_SELFTEST_TIMEOUT_S:g} s", RuntimeWarning, stacklevel=2)
        return DEFAULT_SELFTEST_TIMEOUT_S
    return min(v, MAX_SELFTEST_TIMEOUT_S)


_warned_timeouts: set = set()


def selftest_child_path() -> Optional[str]:
    """Inside a first-use self-test child, the path it tests (``tsct.firstuse`` sets ``TSCT_SELFTEST_CHILD`` to it in
    the child's environment; "1": a child that does not name it); None outside one (unset, empty or "0")."""
    v = os.environ.get(ENV_SELFTEST_CHILD, "").strip()
    return v if v not in ("", "0") else None


def in_selftest_child() -> bool:
    """True inside a first-use self-test child (``selftest_child_path``)."""
    return selftest_child_path() is not None


def cache_dir() -> Path:
    """``$TSCT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tsct``, else ``~/.cache/tsct`` (not created here)."""
    d = _env_path("TSCT_CACHE_DIR")
    if d is not None:
        return d
    xdg = _env_path("XDG_CACHE_HOME")
    if xdg is not None:
        return xdg / "tsct"
    return Path.home() / ".cache" / "tsct"


def native_lib() -> Optional[str]:
    """``TSCT_NATIVE_LIB`` (the library file or its directory) as set, None when unset or empty."""
    return os.environ.get("TSCT_NATIVE_LIB") or None


def aot_dir() -> Optional[Path]:
    """``TSCT_AOT_DIR`` (the Triton cubins' directory), None when unset or empty."""
    return _env_path("TSCT_AOT_DIR")


_TOOLS = {"cuobjdump": "CUOBJDUMP", "nvdisasm": "NVDISASM"}


def tool_path(name: str) -> Optional[str]:
    """The path ``$CUOBJDUMP`` / ``$NVDISASM`` gives for the tool ``name`` ("cuobjdump" or "nvdisasm"), or None."""
    if name not in _TOOLS:
        raise ValueError(f"name must be one of {sorted(_TOOLS)}, got {name!r}")
    return os.environ.get(_TOOLS[name]) or None


def cuda_visible_devices() -> Optional[str]:
    """This process's ``CUDA_VISIBLE_DEVICES`` (None when unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def values_checked(t) -> bool:
    """Whether the VALUES of the index / count tensor ``t`` are checked: ``check_values``, or ``t`` is on the CPU
    (where reading them costs no device synchronization)."""
    return check_values or t.device.type == "cpu"
