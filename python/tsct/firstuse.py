"""Crash-safe first use of a kernel family: its self-test runs in a child process, the verdict is cached.

A kernel family that has never executed on this compute capability (``tsct.dispatch.EXECUTED_ON``:
the Triton families on 12.x, 10.x and any JIT arch; sm120-fp4 everywhere) may fault, hang or compute
nonsense there. A fault kills the CUDA context, and with it the training run, so the first time a
process would use such a path, tsct.ops (``tsct.ops._select``, after ``tsct.dispatch.select`` returned it)
asks ``verdict(device_index, path, fmt)``, which runs the
path's self-test (``tsct.selftest``: forward and backward against a float64 oracle; sm120-fp4's
forward against the emulation of its W4A4 math) in a CHILD process (``python -m tsct.selftest_child``,
spawned with fork+exec by ``subprocess``, never a bare fork of a process with CUDA state), pinned to
the parent's GPU through ``CUDA_VISIBLE_DEVICES``. The parent's CUDA context never runs the kernel
before the child said "pass":

    child verdict "pass"                        -> the path is used
    "fail" (rel. error > tol, an exception)     -> the path is disabled: counted, warned (tsct.dispatch)
    died by a signal / nonzero exit, no verdict -> "crash", disabled ("self-test child died with SIGSEGV")
    still running after the timeout (killed)    -> "timeout", disabled
    "not-runnable" (no kernel for this GPU)     -> disabled

The native library's quantize / decode kernels (csrc/quant, which ``tsct.quant``'s ``backend="auto"`` runs on any
CUDA tensor) are gated the same way under the pseudo-path ``dispatch.NATIVE_QUANT`` ("native-quant": its row of
``EXECUTED_ON``, its self-test ``tsct.selftest.native_quant``, bit for bit against the torch backend); tsct.quant
asks (``tsct.quant._backend``) and serves a CUDA call with the torch backend, the same bytes, unless it passed.
So are ``tsct.ops.sort_by_expert``'s Triton routing kernels, under the pseudo-path ``dispatch.ROUTING``
("triton-routing", self-test ``tsct.selftest.sort_by_expert``, bit for bit against a stable argsort): tsct.ops.routing
asks and serves the call with torch's sort, the same result, unless it passed (during a CUDA graph capture it starts
no child: a verdict not known yet means torch's sort for that call). ``gate`` is the one place that turns a verdict
into the status every caller acts on.

The verdict is cached in the process (per device index, path and format) and on disk, in
``<cache dir>/selftest.json`` (``cache_dir()``: ``$TSCT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tsct``,
else ``~/.cache/tsct``), keyed by ``identity()`` (tsct version, the native library's path, size and
SHA-256, the driver, the GPU name and compute capability, the Triton version a JIT launch would use)
plus path and format: a new wheel, driver, GPU or Triton re-tests. An unwritable cache dir keeps the
verdict in the process only (never an error). Failures are cached too (delete the file to re-test),
except that a timeout or an out-of-memory failure is kept on disk only while the processes asking at the same time
may still read it (the timeout plus a minute), so a later process tests again. Processes that ask for
the same verdict at once (the ranks of a job on GPUs of one model) run one child: a lock file per key
(``fcntl.flock`` in the cache dir) makes the others wait for its verdict on disk; saves of the file take a lock too.

``TSCT_SM120_FP4`` (read on every call, ``tsct.config``) concerns sm120-fp4 only: unset or "auto" = the above;
"0" = path off; "1" = on WITHOUT the self-test (for developers of its kernels: a faulting kernel
then takes the process down). ``TSCT_SELFTEST_TIMEOUT``: seconds a child may run (default 300: it
starts Python, imports torch, creates a CUDA context, may JIT-compile, runs a small problem).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from tsct import config, dispatch

ENV_TIMEOUT = "TSCT_SELFTEST_TIMEOUT"  # read by config.selftest_timeout
DEFAULT_TIMEOUT_S = config.DEFAULT_SELFTEST_TIMEOUT_S
CACHE_FILE = "selftest.json"
CACHE_SCHEMA = 2
#: seconds a process waits for another's save of the cache file (a read, a merge and a rename) before saving anyway
WRITE_LOCK_WAIT_S = 10.0
#: seconds beyond the self-test's timeout that a process waits for another process's child of the same key
CHILD_LOCK_MARGIN_S = 60.0
CHILD_MODULE = "tsct.selftest_child"
#: set in the child's environment: inside it, tsct.ops runs the path under test without asking again
ENV_IN_CHILD = config.ENV_SELFTEST_CHILD
#: the child prints exactly one line starting with this, followed by the verdict as JSON
VERDICT_MARKER = "TSCT_SELFTEST_VERDICT "
#: the format the verdict of a kernel family whose self-test covers every format is keyed by (dispatch.NATIVE_QUANT,
#: dispatch.ROUTING)
FAMILY_FMT = "bf16"
#: child exit statuses (selftest_child.py)
EXIT_PASS, EXIT_FAIL, EXIT_NOT_RUNNABLE = 0, 1, 3

OUTCOMES = ("pass", "fail", "crash", "timeout", "not-runnable", "forced", "disabled")
# sources
RAN_NOW = "ran now in a child process"
CACHED_PROCESS = "cached in this process"
CACHED_DISK = "cached on disk"
FORCED = "set by the environment"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The first-use self-test's answer for one (GPU, path, format).

    ok: whether the path may be used. outcome: one of ``OUTCOMES``. detail: what happened (the
    self-test's error figure, the signal, the exception). source: where the verdict came from
    (``RAN_NOW``, ``CACHED_PROCESS``, ``CACHED_DISK`` + the file, ``FORCED``). seconds: how long the
    child ran (0 for a cached or forced verdict). key: the cache key (None when not tested).
    """
    ok: bool
    outcome: str
    detail: str
    source: str
    seconds: float = 0.0
    key: Optional[str] = None

    def describe(self) -> str:
        """One line for dispatch reasons and the probe: outcome, where it came from, what happened."""
        return f"{self.outcome} ({self.source}): {self.detail}"


@dataclasses.dataclass(frozen=True)
class ChildResult:
    """What a child runner reports: exit status (negative = killed by that signal; None after a
    timeout), its stdout and stderr, whether it timed out, and its wall time."""
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


Runner = Callable[[list, dict, float], ChildResult]


def env_mode(path: str = "sm120-fp4") -> tuple[str, str]:
    """How the environment sets ``path``'s first use, as (mode, why): "auto" (run the child), "off"
    (``TSCT_SM120_FP4=0``), "on" (``=1``: no self-test), or "invalid" (another value: the path stays
    off and ``why`` names the accepted values). Only sm120-fp4 has a switch (``sm120_fp4.env_mode``);
    other paths are "auto"."""
    if path != "sm120-fp4":
        return "auto", "first-use self-test in a child process"
    from tsct.kernels import sm120_fp4

    return sm120_fp4.env_mode()


def in_child(path: Optional[str] = None) -> bool:
    """True inside a self-test child (it runs the path under test directly); with ``path``, only inside the child that
    tests ``path`` (or one that does not name its path: ``TSCT_SELFTEST_CHILD=1``)."""
    child = config.selftest_child_path()
    return child is not None and (path is None or child in ("1", path))


# ---- where the verdicts live ----------------------------------------------------------------------

def cache_dir() -> Path:
    """``$TSCT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tsct``, else ``~/.cache/tsct`` (not created here)."""
    return config.cache_dir()


def cache_file() -> Path:
    """The JSON file holding the on-disk verdicts (it may not exist)."""
    return cache_dir() / CACHE_FILE


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


@contextlib.contextmanager
def _held(lock_file: Path, wait: float):
    """An exclusive advisory lock (``fcntl.flock``) on ``lock_file`` for the block, across processes, waiting up to
    ``wait`` seconds for it. Yields True when held, False when it is not (no ``fcntl``, a directory that cannot be
    written, a file system without locks, the wait ran out): the caller then goes on without it. A lock file another
    user made (a cache dir shared between users) is opened read-only, which ``flock`` takes as well."""
    fd = None
    try:
        import fcntl

        lock_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            fd = os.open(lock_file, os.O_RDONLY)
    except (ImportError, OSError):
        pass
    if fd is None:
        yield False
        return
    try:
        held = _flock(fd, wait)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _flock(fd: int, wait: float) -> bool:
    """Take the exclusive lock on ``fd``, polling up to ``wait`` seconds; False if it could not be taken."""
    import fcntl

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        except OSError:
            return False


def _write_cache(path: Path, key: str, entry: dict) -> Optional[str]:
    """Merge one entry into the file atomically (temp file + rename), under the file's lock (``_held``) so that two
    processes saving different entries at once keep both. Returns None, or why it could not."""
    with _held(path.with_name("." + path.name + ".lock"), WRITE_LOCK_WAIT_S):
        return _merge_entry(path, key, entry)


def _merge_entry(path: Path, key: str, entry: dict) -> Optional[str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read_cache(path)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(prefix=".selftest.", dir=str(path.parent))
        try:
            os.fchmod(fd, 0o644)  # as a plain file would be (mkstemp makes 0600): a shared cache dir stays readable
            with os.fdopen(fd, "w") as f:
                json.dump({"schema": CACHE_SCHEMA, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ---- identity: what a verdict is valid for ------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def library_identity() -> str:
    """``<path> <size> sha256:<hex>`` of the native library that would be loaded, or "none"."""
    from tsct import native

    p = native.library_path()
    if not p:
        return "none"
    try:
        st = os.stat(p)
        return f"{p} {st.st_size} sha256:{_file_digest(p, st.st_size, st.st_mtime_ns)}"
    except OSError as exc:
        return f"{p} unreadable ({type(exc).__name__})"


@functools.lru_cache(maxsize=1)
def driver_identity() -> str:
    """Driver release (``/proc/driver/nvidia/version``) and CUDA driver API version (cuDriverGetVersion)."""
    release = "?"
    try:
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d[\w.]*)", Path("/proc/driver/nvidia/version").read_text())
        if m:
            release = m.group(1)
    except OSError:
        pass
    api = "?"
    try:
        import ctypes
        v = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
            api = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except (OSError, AttributeError):
        pass
    return f"{release} (CUDA {api})"


def _triton_version() -> str:
    """The installed Triton's version (what a JIT launch would compile with), or "none"."""
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # noqa: BLE001 (not installed, or broken metadata)
        return "none"


@functools.lru_cache(maxsize=1)
def tested_identity() -> str:
    """What the verdicts of this install test with: the first 16 hex digits of the SHA-256 of the self-test's sources
    (``selftest.py``, ``selftest_child.py``) and of every installed Triton cubin index (``<aot_dir>/<arch>/index.json``,
    which holds each cubin's SHA-256). A source install whose version and native library did not change but whose
    self-test or cubins did then tests again."""
    from tsct.kernels import aot

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("selftest.py", "selftest_child.py"):
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    root = aot.aot_dir()
    for idx in sorted(root.glob("*/index.json")) if root.is_dir() else []:
        h.update(idx.parent.name.encode() + b"\0" + idx.read_bytes())
    return h.hexdigest()[:16]


def identity(device_index: int) -> dict:
    """What a cached verdict for CUDA device ``device_index`` (this process's numbering) is valid for:
    tsct version, library identity, driver, GPU name, compute capability, the installed Triton and the self-test and
    cubins it ran (``tested_identity``). Queries the device's properties (torch caches them); raises what torch raises
    for a bad index."""
    import torch

    import tsct

    props = torch.cuda.get_device_properties(device_index)
    return {"tsct": tsct.__version__, "library": library_identity(), "driver": driver_identity(), "gpu": props.name,
            "capability": f"{props.major}.{props.minor}", "triton": _triton_version(), "tested": tested_identity()}


def cache_key(ident: dict, path: str, fmt: str) -> str:
    """Stable key of (identity, path, format): the first 24 hex digits of the SHA-256 of their sorted JSON."""
    blob = json.dumps({"identity": ident, "path": path, "fmt": fmt}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


# ---- running the child --------------------------------------------------------------------------

def child_visible_devices(device_index: int, parent_value: Optional[str] = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child that must see exactly the parent's device ``device_index``
    as its device 0: the index-th entry of the parent's list (``parent_value``, default the parent's
    environment), or the index itself when the parent's list is unset or shorter."""
    if device_index < 0:
        raise ValueError(f"device_index must be >= 0, got {device_index}")
    cur = config.cuda_visible_devices() if parent_value is None else parent_value
    if cur is not None and cur.strip():
        toks = [t.strip() for t in cur.split(",") if t.strip()]
        if device_index < len(toks):
            return toks[device_index]
    return str(device_index)


def _package_root() -> str:
    """The directory holding this ``tsct`` package (the child must import the same one)."""
    return str(Path(__file__).resolve().parents[3])


# `python -c` with sys.path[0] replaced: the child imports THIS tsct, never one from its cwd
_BOOT = ("import sys; sys.path[0] = sys.argv.pop(1); "
         f"from {CHILD_MODULE} import main; raise SystemExit(main(sys.argv[1:]))")


def child_command(path: str, fmt: str, expect: Optional[dict] = None) -> list:
    """argv of the self-test child for ``path`` with ``fmt`` factors, optionally told which device
    (``{"gpu": name, "capability": "12.0"}``) it must see."""
    argv = [sys.executable, "-c", _BOOT, _package_root(), "--path", path, "--fmt", fmt]
    if expect:
        argv += ["--expect-name", expect["gpu"], "--expect-capability", expect["capability"]]
    return argv


def run_subprocess(argv: list, env: dict, timeout: float) -> ChildResult:
    """The default runner: ``subprocess.run`` (fork+exec), output captured, killed after ``timeout`` s."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return ChildResult(None, out, err, True, time.perf_counter() - t0)
    return ChildResult(p.returncode, p.stdout, p.stderr, False, time.perf_counter() - t0)


def _tail(text: str, n: int = 300) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    s = " | ".join(lines[-3:])
    return s[-n:] if s else "no output"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def interpret(res: ChildResult, timeout: float) -> tuple[bool, str, str]:
    """A child's result -> (ok, outcome, detail). Pure: tests feed it synthetic results."""
    if res.timed_out:
        return False, "timeout", f"self-test child still running after {timeout:g} s, killed ({_tail(res.stderr)})"
    rc = res.returncode
    if rc is not None and rc < 0:
        return False, "crash", f"self-test child died with {_signal_name(-rc)} ({_tail(res.stderr)})"
    payload = None
    for line in (res.stdout or "").splitlines():
        if line.startswith(VERDICT_MARKER):
            try:
                payload = json.loads(line[len(VERDICT_MARKER):])
            except ValueError:
                payload = None
    if not isinstance(payload, dict) or payload.get("verdict") not in ("pass", "fail", "not-runnable"):
        return False, "crash", f"self-test child exited with status {rc} without a verdict ({_tail(res.stderr)})"
    verdict, detail = payload["verdict"], str(payload.get("detail", ""))
    want_rc = {"pass": EXIT_PASS, "fail": EXIT_FAIL, "not-runnable": EXIT_NOT_RUNNABLE}[verdict]
    if rc != want_rc:
        return False, "crash", f"self-test child reported {verdict!r} but exited with status {rc} ({detail})"
    return verdict == "pass", verdict, detail


# ---- the verdict ----------------------------------------------------------------------------------

_lock = threading.Lock()
_run_lock = threading.Lock()  # one child at a time: two threads asking together get one test
_memo: dict[tuple[int, str, str], Verdict] = {}  # (device index, path, fmt) -> verdict, this process


def reset_for_tests() -> None:
    """Forget this process's verdicts (the disk cache is untouched)."""
    with _lock:
        _memo.clear()


def timeout_s() -> float:
    """``$TSCT_SELFTEST_TIMEOUT`` (seconds, > 0), else ``DEFAULT_TIMEOUT_S``."""
    return config.selftest_timeout()


def _decided(device_index: int, path: str, fmt: str) -> Optional[Verdict]:
    """The verdict the environment sets (``TSCT_SM120_FP4``) or this process already has for
    (GPU, path, format); None otherwise. No I/O."""
    mode, why = env_mode(path)
    if mode == "on":
        return Verdict(True, "forced", why, FORCED)
    if mode in ("off", "invalid"):
        return Verdict(False, "disabled", why, FORCED)
    with _lock:
        v = _memo.get((device_index, path, fmt))
    return None if v is None else dataclasses.replace(v, source=CACHED_PROCESS, seconds=0.0)


def peek(device_index: int, path: str, fmt: str, *, ident: Optional[dict] = None) -> Optional[Verdict]:
    """The verdict known without running anything: forced/disabled by the environment, this process's,
    or the disk cache's; None if the self-test has not run for this (GPU, path, format). For the probe."""
    v = _decided(device_index, path, fmt)
    if v is not None:
        return v
    ident = ident if ident is not None else identity(device_index)
    key = cache_key(ident, path, fmt)
    file = cache_file()
    e = _read_cache(file).get(key)
    if not isinstance(e, dict) or e.get("outcome") not in OUTCOMES:
        return None
    expires = e.get("expires")
    if expires is not None and not (isinstance(expires, (int, float)) and time.time() < expires):
        return None  # a transient failure of another process, past its window: test again
    return Verdict(bool(e.get("ok")), e["outcome"], str(e.get("detail", "")), f"{CACHED_DISK} ({file})", 0.0, key)


def is_transient(outcome: str, detail: str) -> bool:
    """A failure that says more about the moment than about the kernels: a timeout (a busy GPU) or an
    out-of-memory error (the child's own CUDA context next to a full parent). Kept in the process, and on disk only
    for the self-test's timeout plus ``CHILD_LOCK_MARGIN_S`` (the processes asking at the same time, which waited on
    the lock, take it instead of testing one after another), so a later process tests again."""
    return outcome == "timeout" or (outcome == "fail" and "out of memory" in detail.lower())


#: the formats a self-test runs (``canonical_format``'s values, the child's ``--fmt`` choices)
SELFTEST_FORMATS = ("bf16", "nvfp4", "sign", "mixed", "fp8", "ternary", "mixed-decoded")


#: the dense formats a self-test runs as "bf16"
DENSE_FORMATS = ("bf16", "fp16", "fp32")


def canonical_format(fmt: str) -> str:
    """The format a self-test runs for a storage format: dense formats (bf16, fp16, fp32) test as "bf16".
    ValueError naming ``fmt`` for anything else but ``SELFTEST_FORMATS``."""
    if fmt in SELFTEST_FORMATS:
        return fmt
    if fmt in DENSE_FORMATS:
        return "bf16"
    raise ValueError(f"fmt must be one of {list(dict.fromkeys(SELFTEST_FORMATS + DENSE_FORMATS))}, got {fmt!r}")


def verdict(device_index: int, path: str, fmt: str, *, runner: Optional[Runner] = None,
            ident: Optional[dict] = None, timeout: Optional[float] = None) -> Verdict:
    """The first-use verdict of ``path`` on CUDA device ``device_index`` with ``fmt`` factors.

    Order: the environment (``TSCT_SM120_FP4`` for sm120-fp4), this process's memo, the disk cache
    (same ``identity``), else run the child now (``runner``, default ``run_subprocess``) and store the
    verdict in both caches (disk: best effort). sm120-fp4 serves "nvfp4" and "sign" only (ValueError
    otherwise), and any ``path`` without a self-test (``dispatch.SELF_TESTED``). Never raises for what the child
    does: a crash is a verdict.
    """
    if path not in dispatch.SELF_TESTED:
        raise ValueError(f"path must be one of {list(dispatch.SELF_TESTED)} (those with a first-use self-test), "
                         f"got {path!r}")
    if path == "sm120-fp4" and fmt not in ("nvfp4", "sign"):
        raise ValueError(f"fmt must be 'nvfp4' or 'sign' (the formats sm120-fp4 serves), got {fmt!r}")
    fmt = canonical_format(fmt)
    v = _decided(device_index, path, fmt)
    if v is not None:
        return v
    ident = ident if ident is not None else identity(device_index)
    cached = peek(device_index, path, fmt, ident=ident)  # on disk: no wait behind another thread's child
    if cached is not None:
        return _remember((device_index, path, fmt), cached)
    with _run_lock:
        return _verdict_locked(device_index, path, fmt, runner, ident, timeout)


def _remember(memo: tuple, v: Verdict) -> Verdict:
    """Keep ``v`` as this process's verdict for ``memo`` = (device index, path, fmt); returns it."""
    with _lock:
        _memo[memo] = v
    return v


def _verdict_locked(device_index: int, path: str, fmt: str, runner: Optional[Runner], ident: dict,
                    timeout: Optional[float]) -> Verdict:
    v = _decided(device_index, path, fmt)
    if v is not None:  # another thread ran it while this one waited
        return v
    key = cache_key(ident, path, fmt)
    t = timeout if timeout is not None else timeout_s()
    # Processes asking for one key at once (the ranks of a job on GPUs of one model) get one child: the others wait
    # for its verdict on disk instead of testing beside it. Without the lock (_held) each tests for itself.
    with _held(cache_dir() / f".selftest-{key}.lock", t + CHILD_LOCK_MARGIN_S):
        cached = peek(device_index, path, fmt, ident=ident)  # another process may have tested while this one waited
        if cached is None:
            return _run_child(device_index, path, fmt, runner, ident, key, t)
    return _remember((device_index, path, fmt), cached)


def _run_child(device_index: int, path: str, fmt: str, runner: Optional[Runner], ident: dict, key: str,
               t: float) -> Verdict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=child_visible_devices(device_index), **{ENV_IN_CHILD: path})
    try:
        res = (runner or run_subprocess)(child_command(path, fmt, ident), env, t)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # no child at all: this process only
        return _remember((device_index, path, fmt),
                         Verdict(False, "fail", f"could not start the self-test child: {type(exc).__name__}: {exc}",
                                 RAN_NOW + ", not saved (the child did not start)", 0.0, key))
    ok, outcome, detail = interpret(res, t)
    file = cache_file()
    entry = {"ok": ok, "outcome": outcome, "detail": detail, "identity": ident, "path": path, "fmt": fmt,
             "seconds": round(res.seconds, 3), "tested_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    transient = is_transient(outcome, detail)
    if transient:  # shared with the processes asking now (they wait on the lock), tested again after that
        entry["expires"] = time.time() + t + CHILD_LOCK_MARGIN_S
    err = _write_cache(file, key, entry)
    if transient:
        source = RAN_NOW + (f", kept on disk for {t + CHILD_LOCK_MARGIN_S:.0f} s only (a timeout or out-of-memory "
                            f"failure may not recur)" if err is None else f", not saved ({err})")
    else:
        source = RAN_NOW + (f", saved to {file}" if err is None else f", not saved ({err})")
    return _remember((device_index, path, fmt), Verdict(ok, outcome, detail, source, res.seconds, key))


# ---- the gate: a verdict as the status tsct.ops (a path, the routing kernels) and tsct.quant act on -------------

def gate(path: str, capability: Optional[tuple[int, int]], fmt: str,
         device_index: Optional[int] = None) -> "dispatch.Status":
    """Whether ``path`` (a ``dispatch.PATHS`` entry, ``dispatch.NATIVE_QUANT`` or ``dispatch.ROUTING``) may run on
    CUDA device ``device_index`` (default: the current device) of compute capability ``capability`` with ``fmt``
    factors, as a ``dispatch.Status``, recorded in ``dispatch.first_use_results()``.

    ``Status(True, "")`` without asking anything where the path executed on this arch class
    (``dispatch.needs_first_use``: also for ``capability`` None, the CPU) and inside the self-test child of ``path``
    (the path under test runs directly: no recursion). Inside the child of another path nothing is asked either, and
    the status is not ok: a kernel family that child does not test (the native quantizers under a Triton path's
    self-test) does not run there, so that its fault is never taken for the tested path's. Otherwise the verdict
    (``verdict``: run in a child process now, or cached in the process / on disk, or set by the environment): ok
    only for "pass" or "forced"; the reason
    ("first-use self-test on sm120 FAILED: crash: self-test child died with SIGSEGV ...") names the outcome and
    never where the verdict came from, so a fallback counter keyed by it does not change once it is cached.
    Raises only what ``verdict`` raises for bad arguments (a ValueError) and what torch raises for a bad index.
    """
    if not dispatch.needs_first_use(path, capability) or in_child(path):
        return dispatch.Status(True, "")
    if in_child():
        return dispatch.Status(False, f"not asked inside the self-test child of {config.selftest_child_path()} "
                                      f"(it tests that path only)")
    cls = dispatch.arch_class(capability)
    if device_index is None:
        import torch

        device_index = torch.cuda.current_device()
    v = verdict(device_index, path, fmt)
    if v.outcome == "forced":
        st = dispatch.Status(True, f"first-use self-test on {cls} skipped: {v.detail}")
    else:
        word = "passed" if v.ok else "FAILED"
        where = ""
        if not v.ok and v.outcome not in ("disabled", "not-runnable"):
            where = (" (kept briefly: a later process tests again)" if is_transient(v.outcome, v.detail)
                     else f" (verdict cached in {cache_file()}: delete it to test again)")
        st = dispatch.Status(v.ok, f"first-use self-test on {cls} {word}: {v.outcome}: {v.detail}{where}")
    return dispatch.record_first_use(path, capability, fmt, st, device_index)
