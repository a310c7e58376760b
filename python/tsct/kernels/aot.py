"""Run-time side of the Triton kernels compiled ahead of time (docs/decisions/0005-triton-aot.md).

The wheel ships ``tsct/_aot/<arch>/*.cubin`` with ``index.json`` per arch (written at build time by
``tsct/kernels/triton_common/aot_build.py``; one index for every kernel family: triton_glu, with the shared kernels of
triton_common, and triton_lowbit).
This module picks the arch for a device, looks a specialization key up in the index, packs the
arguments by the recorded parameter list and launches through the native library (``tsct_triton_load``
/ ``tsct_triton_launch``). It needs no Triton and no compiler; importing it loads nothing and touches
no GPU.

    artifact_arch(capability) -> "sm_90a" | "sm_100a" | "sm_120" | None   (exact table; or a proxy arch)
    proxy(arch) -> dict | None               the "proxy" record of an installed proxy arch (docs/decisions/0017)
    aot_dir() -> Path                        $TSCT_AOT_DIR, else tsct/_aot of the installed package
    index(arch) -> dict | None               the arch's index.json (cached), None if absent
    available(capability) -> bool            cubins for this capability are shipped (no GPU touched)
    kernel(arch, key) -> AotKernel | None    the entry for a specialization key (not loaded yet)
    sources() -> {kernel: fingerprint} | None  the kernel sources the installed cubins were built from
    pack_args(params, values) -> (array, keepalive)   Triton's ABI: one pointer per parameter
"""

from __future__ import annotations

import ctypes
import json
import struct
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

from tsct import config
from tsct.kernels import record as _record
from tsct.kernels.triton_common.specs import ARTIFACT_ARCH, PROXIES

ENV_DIR = "TSCT_AOT_DIR"

_lock = threading.Lock()
_indexes: dict[str, Optional[dict]] = {}
_kernels: dict[tuple[str, str], "AotKernel"] = {}
generation = 0  # bumped by _reset_for_tests: caches built on the index (tsct.kernels.launch) drop themselves


def artifact_arch(capability: Optional[tuple[int, int]]) -> Optional[str]:
    """Exact: sm_90a only on 9.0, sm_100a only on 10.0, sm_120 on 12.0 and 12.1; else None. An install built
    as a proxy (``specs.PROXIES``: its index.json says "proxy") serves the proxy's capability instead: on 9.0
    "sm_120_proxy_sm90", sm_120's kernels assembled for sm_90 (docs/decisions/0017)."""
    if capability is None:
        return None
    cap = tuple(capability)
    for name, p in PROXIES.items():
        if p.capability == cap and proxy(name) is not None:
            return name
    return ARTIFACT_ARCH.get(cap)


def proxy(arch: str) -> Optional[dict]:
    """The "proxy" record of ``arch``'s index.json when this install holds that arch as a proxy build (the arch
    it proxies, the target it was assembled for, the capability it loads on), else None. Reads the index only."""
    idx = index(arch) if arch in PROXIES else None
    rec = idx.get("proxy") if isinstance(idx, dict) else None
    return rec if isinstance(rec, dict) else None


def aot_dir() -> Path:
    env = config.aot_dir()
    if env is not None:
        return env
    return Path(__file__).resolve().parent.parent / "_aot"


def index(arch: str) -> Optional[dict]:
    """The parsed ``<aot_dir>/<arch>/index.json``, or None when this build has no cubins for ``arch``."""
    try:  # every launch asks (artifact_arch): a hit needs no lock
        return _indexes[arch]
    except KeyError:
        pass
    with _lock:
        if arch not in _indexes:
            p = aot_dir() / arch / "index.json"
            try:
                _indexes[arch] = json.loads(p.read_text())
            except (OSError, ValueError):
                _indexes[arch] = None
        return _indexes[arch]


def available(capability: Optional[tuple[int, int]]) -> bool:
    arch = artifact_arch(capability)
    idx = index(arch) if arch else None
    return bool(idx and idx.get("kernels"))


def _reset_for_tests() -> None:
    global generation
    with _lock:
        _indexes.clear()
        _kernels.clear()
        generation += 1


# ---- argument packing (Triton's kernel ABI) -------------------------------------------------------

_SCALAR_CTYPES = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
                  "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
                  "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "fp64": ctypes.c_double}
_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1), "u32": (0, (1 << 32) - 1)}


def _ctype_of(ty: str):
    if ty.startswith("*"):
        return ctypes.c_uint64  # a device address
    try:
        return _SCALAR_CTYPES[ty]
    except KeyError:
        raise ValueError(f"unsupported Triton parameter type {ty!r}") from None


def pack_args(params: Sequence[dict], values: Sequence[Any]):
    """``(void*[n], keepalive)`` for a kernel whose index entry lists ``params`` (name, type).

    ``values``: one per parameter before the trailing scratch pointers (which get NULL): an int device
    address (or None = NULL) for pointer types, an int / float for scalars. Range-checks integers.
    """
    n_user = len(params) - 2
    if len(values) != n_user:
        raise ValueError(f"expected {n_user} arguments, got {len(values)}")
    cells = []
    for p, v in zip(params, list(values) + [None, None]):
        ty = p["type"]
        ct = _ctype_of(ty)
        if ty.startswith("*"):
            cells.append(ct(0 if v is None else int(v)))
        else:
            if ty in _RANGES:
                lo, hi = _RANGES[ty]
                if not lo <= int(v) <= hi:
                    raise OverflowError(f"parameter {p['name']} = {v} does not fit {ty}")
            cells.append(ct(v))
    arr = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
    return arr, cells


# One 8-byte slot per parameter, the value in its low bytes (little-endian): the layout the fast path
# packs with one struct call into a buffer whose slot addresses are the kernel's argument array.
_SLOT_FORMATS = {"i1": "b7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u8": "B7x", "u16": "H6x",
                 "u32": "I4x", "u64": "Q", "fp32": "f4x", "fp64": "d"}


def slot_format(params: Sequence[dict]) -> str:
    """The ``struct`` format of a kernel's argument slots (pointers as u64, scratch pointers included)."""
    out = []
    for p in params:
        ty = p["type"]
        if ty.startswith("*"):
            out.append("Q")
        elif ty in _SLOT_FORMATS:
            out.append(_SLOT_FORMATS[ty])
        else:
            raise ValueError(f"unsupported Triton parameter type {ty!r}")
    return "<" + "".join(out)


# ---- kernels ----------------------------------------------------------------------------------------

_loader = None  # tsct.native._loader, imported on the first launch (importing this module loads nothing)


def _lib():
    """The native library (``tsct.native._loader.get_lib``: opened once, then cached there)."""
    global _loader
    if _loader is None:
        from tsct.native import _loader as mod

        _loader = mod
    return _loader.get_lib()


class AotKernel:
    """One cubin of the index, loaded into the native library on the first launch."""

    def __init__(self, arch: str, entry: dict):
        self.arch = arch
        self.entry = entry
        self.params = entry["params"]
        self.block_x = 32 * int(entry["num_warps"])
        self.shared = int(entry["shared"])
        self._handle: Optional[ctypes.c_void_p] = None
        # the fast launch: values packed into persistent slots (the driver copies them at launch, so
        # the buffer is reusable as soon as the call returns; the lock covers concurrent launchers)
        self._struct = struct.Struct(slot_format(self.params))
        self._buf = ctypes.create_string_buffer(8 * len(self.params))
        base = ctypes.addressof(self._buf)
        self._slots = (ctypes.c_void_p * len(self.params))(*[base + 8 * i for i in range(len(self.params))])
        self._n_params = len(self.params)
        self._n_user = self._n_params - 2  # the two trailing scratch pointers get NULL
        self._launch_lock = threading.Lock()

    @property
    def path(self) -> Path:
        return aot_dir() / self.arch / self.entry["file"]

    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            from tsct.native._loader import error_message, get_lib

            lib = get_lib()
            image = self.path.read_bytes()
            h = ctypes.c_void_p()
            key = f"{self.arch}/{self.entry['file']}".encode()
            rc = lib.tsct_triton_load(key, image, len(image), self.entry["function"].encode(), len(self.params),
                                      self.shared, self.block_x, ctypes.byref(h))
            if rc != 0:
                raise RuntimeError(error_message("tsct_triton_load", rc))
            self._handle = h
        return self._handle

    def launch(self, grid: Sequence[int], values: Sequence[Any], stream: int) -> None:
        """Launch on ``stream`` (a cudaStream_t as an int) with ``values``: one per parameter before the two trailing
        scratch pointers (device addresses as ints, 0 or None for an unread pointer; scalars as ints / floats). An
        empty grid launches nothing. Raises ValueError / OverflowError / TypeError naming the parameter for a wrong
        count or value, RuntimeError when the native launch fails."""
        gx, gy, gz = (*grid, 1, 1)[:3] if len(grid) < 3 else grid
        if gx <= 0 or gy <= 0 or gz <= 0:
            return
        handle = self._handle if self._handle is not None else self.handle()
        if _record.log is not None and _record.active() is not None:  # tsct.kernels.replay
            _record.log.append(("aot", self, (gx, gy, gz), list(values), stream))
        if len(values) != self._n_user:
            pack_args(self.params, values)  # raises with the counts
        with self._launch_lock:
            try:
                self._struct.pack_into(self._buf, 0, *values, 0, 0)
            except struct.error:  # None for an unread pointer (the family launcher passes 0), or a bad value
                try:
                    self._struct.pack_into(self._buf, 0, *[0 if v is None else v for v in values], 0, 0)
                except struct.error:
                    pack_args(self.params, values)  # raises OverflowError / TypeError naming the parameter
                    raise
            rc = _lib().tsct_triton_launch(handle, gx, gy, gz, stream, self._slots, self._n_params)
        if rc != 0:
            from tsct.native._loader import error_message

            raise RuntimeError(error_message("tsct_triton_launch", rc))

    def info(self) -> dict:
        """Registers, max threads per block and local bytes on the current device (loads the cubin)."""
        from tsct.native._loader import error_message, get_lib

        regs, maxt, local = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        rc = get_lib().tsct_triton_kernel_info(self.handle(), ctypes.byref(regs), ctypes.byref(maxt),
                                               ctypes.byref(local))
        if rc != 0:
            raise RuntimeError(error_message("tsct_triton_kernel_info", rc))
        return {"num_regs": regs.value, "max_threads_per_block": maxt.value, "local_bytes": local.value}


def kernel(arch: str, key: str) -> Optional[AotKernel]:
    """The kernel of specialization ``key`` for ``arch``, or None if this build has no such cubin."""
    k = _kernels.get((arch, key))
    if k is not None:
        return k
    idx = index(arch)
    entry = idx["kernels"].get(key) if idx else None
    if entry is None:
        return None
    with _lock:
        return _kernels.setdefault((arch, key), AotKernel(arch, entry))


def summary() -> dict:
    """{arch: {kernel name: variants}} of the cubins this install ships (reads the index files only)."""
    out = {}
    for arch in sorted(set(ARTIFACT_ARCH.values()) | set(PROXIES)):
        idx = index(arch)
        if idx:
            counts: dict[str, int] = {}
            for e in idx["kernels"].values():
                counts[e["kernel"]] = counts.get(e["kernel"], 0) + 1
            out[arch] = dict(sorted(counts.items()))
    return out


def sources() -> Optional[dict[str, str]]:
    """{kernel name: source fingerprint} (``tsct.kernels.source_key``, recorded by the AOT build as the index's
    "sources") over the installed arch indexes, a proxy's first; {} when the installed indexes predate the
    fingerprints; None when this install has no arch index at all (a source checkout). Reads the index files only."""
    out: dict[str, str] = {}
    seen = False
    for arch in (*PROXIES, *sorted(set(ARTIFACT_ARCH.values()))):
        idx = index(arch)
        if idx:
            seen = True
            for k, v in (idx.get("sources") or {}).items():
                out.setdefault(k, v)
    return out if seen else None
