"""Eager calls replayed: a path's launch sequence recorded once per call signature, then issued again directly.

An eager call's host time is mostly the Python between the public function and its kernels (argument handling,
tile and kernel choices, resolving each launch's cubin, the backward's plan: docs/performance.md), not the
launches. That Python depends only on the call's signature: shapes, strides, dtypes, which arguments are None,
pointer alignment, which tensors alias, the factor formats, the GPU and the configuration. So the second call of a
signature (the first runs the path plainly: a recording costs about three times its host time, which a shape seen
once should not pay) runs the path while recording what reaches the device:

* its torch ops, in order with the launches (a ``TorchDispatchMode``): the allocations (``torch.empty`` and
  relatives, ``zeros``), the views, the few ops that compute (a dtype conversion, the sort of a combine's index),
* its cubin launches (``tsct.kernels.aot``) and CUDA-row calls (``tsct.native``), with each pointer argument
  resolved to (input or allocation, byte offset), and the launch counts they reported,
* the marks, forks and join of its side work (``runtime.SideWork``: launches beside the caller's stream),
* where its outputs live (an input, an allocation or a view of one).

A later call with the same signature runs the same ops on its own tensors (allocations through the fast torch
factories; views made only to take a pointer, and allocations nothing reads, are left out), issues the same launches
with its own pointers on the current stream (a fork's on the side stream, after the same wait) and returns the same
structure: the same kernels with the same arguments, so the same bits, for a fraction of the host time. A recording
that sees what it cannot repeat leaves its signature to the path, which then runs every time (``stats()`` names the
reason): a Triton JIT launch, a launch on another stream than the caller's outside a fork, a fork on the
high-priority side stream (the combine CSR's sort), a torch op or a CUDA-row call inside a fork, an op on a stream
object, a host read of a device value (the paths are sync-free, so
nothing but the signature steers them; a read would), a per-call counted conversion, a pointer to memory the call
neither received nor allocated, anything it cannot describe.

On unless ``tsct.config.eager_replay`` is off (``TSCT_EAGER_REPLAY=0``); used by the eager route of ``tsct.ops`` only
(``tsct.ops._function``, ``tsct.ops.sort_by_expert``), never under torch.compile or a dispatch mode. Inside a CUDA
graph capture a replay issues the same launches as the path would, so the graph captures those.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from tsct import config
from tsct.kernels import aot, launch, record
from tsct.kernels.triton_common import runtime as C
from tsct.native import _ops

__all__ = ["call", "stats", "clear"]

_aten = torch.ops.aten
_MAX_PROGRAMS = 256  # signatures kept (a training loop has a handful: one per layer shape and direction)
# A signature is recorded at its second call (a recording costs ~3x the path's host time: a call of a new shape each
# time, as with variable token counts, keeps the path's cost); the first sightings are kept up to this many.
_MAX_SEEN = 4096

_lock = threading.Lock()
_programs: dict = {}
_seen: set = set()
_stats = collections.Counter()


class _Unreplayable:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def stats() -> dict:
    """{"first", "recorded", "replayed", "unreplayable": calls} since process start (or ``clear``; "first": a
    signature's first call, which runs the path; the second records), and the reasons of the signatures that are not
    replayed ({reason: signatures})."""
    with _lock:
        out = dict(_stats)
        out["reasons"] = dict(collections.Counter(p.reason for p in _programs.values()
                                                  if isinstance(p, _Unreplayable)))
    return out


def clear() -> None:
    """Forget every recorded signature (tests; a changed environment is caught by the key already)."""
    with _lock:
        _programs.clear()
        _seen.clear()
        _stats.clear()


def _key(tensors: Sequence[Optional[Tensor]], extra: tuple) -> tuple[tuple, list]:
    """The signature and the tensors' addresses (0 for None). The signature: per tensor its dtype, shape, strides,
    pointer alignment (mod 16) and the first earlier tensor at the same address (aliasing); the caller's ``extra``;
    and what steers the paths besides their arguments."""
    seen: dict = {}
    parts = []
    ptrs = []
    for i, t in enumerate(tensors):
        if t is None:
            parts.append(None)
            ptrs.append(0)
            continue
        p = t.data_ptr()
        ptrs.append(p)
        j = seen.setdefault(p, i)
        if j != i and tensors[j] is t:  # the same tensor again (a gather that is the scatter): the same part
            parts.append(parts[j])
        else:
            parts.append((t.dtype, t.shape, t.stride(), p & 15, j))
    return (*parts, *extra, tensors[0].device, aot.generation, config.triton_backend(), config.cuda_kernels,
            config.side_stream, C.config_generation), ptrs


class _Ops(TorchDispatchMode):
    """Reports every torch op of a recording to its log, in issue order with the launches."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.log.append(("op", func, args, kwargs, out))
        return out


class _Slot(NamedTuple):
    """A tensor argument of a replayed step: tensor ``index`` of the replay (inputs first, then each step's
    outputs)."""
    index: int


_NEW, _ZEROS, _OP, _AOT, _NATIVE, _AOT_SIDE, _MARK, _FORK, _JOIN = range(9)  # the kinds of a program's steps
_NULL = ctypes.c_void_p(0)  # a CUDA-row call's null pointer argument


class _Program:
    """What a replay does: the recorded torch ops (factories through their fast torch functions) and launches, in
    order, on this call's tensors; then the result's structure."""

    __slots__ = ("steps", "pad", "outputs", "counts", "forks")

    def __init__(self, steps, n_slots, n_inputs, outputs, counts):
        # [(_NEW, slot, shape, stride, dtype, device) | (_ZEROS, slot, shape, dtype, device) | (_OP, func, args,
        #  kwargs, out slots, addressed) | (_AOT or _AOT_SIDE, kernel, grid, values, fixups) | (_NATIVE, fn, device,
        #  values, fixups) | (_MARK,) | (_FORK, mark index) | (_JOIN,)]; an op's args / kwargs: ``_filler``
        #  functions; fixups: (position, slot, byte offset) of each pointer argument; ``addressed``: whether a launch
        #  points into an output of the op; _AOT_SIDE: a launch on the side stream
        self.steps = steps
        self.pad = [None] * (n_slots - n_inputs)
        self.outputs = _filler(outputs)  # the result's structure from the slots
        self.counts = counts    # [(Family, ((key, launches), ...))]: the launch counts one call adds
        self.forks = any(st[0] == _FORK for st in steps)  # launches beside the caller's stream

    def run(self, tensors: Sequence[Optional[Tensor]], ptrs: list):
        slots = [*tensors, *self.pad]
        addr = [*ptrs, *self.pad]  # each slot's data pointer, where a launch points into it
        try:
            return self._run(slots, addr, tensors)
        except BaseException:
            if self.forks:  # as SideWork: the caller's stream waits for the side stream before the slots go back
                dev = tensors[0].device
                torch.cuda.current_stream(dev).wait_stream(C.side_stream(dev, high=False))
            raise

    def _run(self, slots, addr, tensors):
        stream = side = None
        for step in self.steps:
            kind = step[0]
            if kind == _AOT or kind == _AOT_SIDE:
                values = step[3].copy()
                for pos, i, off in step[4]:
                    values[pos] = addr[i] + off
                if kind == _AOT_SIDE:
                    step[1].launch(step[2], values, side.cuda_stream)
                    continue
                if stream is None:
                    stream = launch.current_stream(tensors[0].device)
                step[1].launch(step[2], values, stream)
            elif kind == _MARK:  # as SideWork: an event after what the caller's stream issued so far
                if side is None:
                    main = torch.cuda.current_stream(tensors[0].device)
                    side = C.side_stream(tensors[0].device, high=False)
                    marks = []
                marks.append(main.record_event())
            elif kind == _FORK:  # the side stream waits for its mark
                side.wait_event(marks[step[1]])
            elif kind == _JOIN:
                main.wait_stream(side)
            elif kind == _NEW:
                t = slots[step[1]] = torch.empty_strided(step[2], step[3], dtype=step[4], device=step[5])
                addr[step[1]] = t.data_ptr()
            elif kind == _NATIVE:
                values = step[3].copy()
                for pos, i, off in step[4]:
                    values[pos] = ctypes.c_void_p(addr[i] + off)
                _ops._call(step[1], step[2], *values)
            elif kind == _ZEROS:
                t = slots[step[1]] = torch.zeros(step[2], dtype=step[3], device=step[4])
                addr[step[1]] = t.data_ptr()
            else:
                _, func, args, kwargs, outs, addressed = step
                res = func(*args(slots), **kwargs(slots))
                for i, t in zip(outs, res if isinstance(res, (list, tuple)) else (res,)):  # as recorded; None too
                    if i is not None:
                        slots[i] = t
                        if addressed:
                            addr[i] = t.data_ptr()
        for fam, delta in self.counts:
            with fam._lock:
                counts = fam.counts
                for k, n in delta:
                    counts[k] += n
        return self.outputs(slots)


def _filler(spec) -> Callable[[list], Any]:
    """A function of the slots that builds ``spec`` (nested lists, tuples and dicts) with each ``_Slot`` replaced by
    its tensor: made once per program, so a replay does not walk the structure."""
    if type(spec) is _Slot:
        i = spec.index
        return lambda slots: slots[i]
    if type(spec) in (list, tuple):
        typ = type(spec)
        if all(type(x) is _Slot for x in spec):
            idx = [x.index for x in spec]
            return lambda slots: typ([slots[i] for i in idx])
        fs = [_filler(x) for x in spec]
        return lambda slots: typ([f(slots) for f in fs])
    if type(spec) is dict:
        items = [(k, _filler(v)) for k, v in spec.items()]
        return lambda slots: {k: f(slots) for k, f in items}
    return lambda slots: spec


def call(fn: Callable[[], Any], tensors: Sequence[Optional[Tensor]], extra: tuple):
    """``fn()``, replayed when this signature was recorded before. ``tensors``: every tensor ``fn`` may read or write
    (what its arguments hold), first one on the device its launches use; ``extra``: the rest of what steers it (sizes
    that no tensor carries, formats, flags) as hashables. ``fn`` runs only to record or where a replay cannot."""
    key, ptrs = _key(tensors, extra)
    prog = _programs.get(key)
    if type(prog) is _Program:
        _stats["replayed"] += 1
        return prog.run(tensors, ptrs)
    if prog is None and key not in _seen:  # a first sighting runs the path: one-off shapes never pay a recording
        if len(_seen) >= _MAX_SEEN:
            _seen.clear()
        _seen.add(key)
        _stats["first"] += 1
        return fn()
    if prog is not None or record.log is not None or not _lock.acquire(blocking=False):
        # not replayable, or another thread records now: the path itself
        _stats["unreplayable"] += 1
        return fn()
    try:
        out, prog = _record(fn, tensors)
        if len(_programs) >= _MAX_PROGRAMS:
            _programs.clear()
        _programs[key] = prog
        _stats["recorded"] += 1
    finally:
        _lock.release()
    return out


def _record(fn, tensors):
    log: list = []
    record.owner, record.log = threading.get_ident(), log
    try:
        with _Ops(log):
            out = fn()
    finally:
        record.log = record.owner = None
    try:
        prog = _program(out, tensors, log)
    except _NotReplayable as e:
        return out, _Unreplayable(str(e))
    except Exception as e:  # the call itself succeeded: its result stands, its signature runs the path from now on
        return out, _Unreplayable(f"recording failed: {e!r}")
    return out, prog


class _NotReplayable(Exception):
    pass


_FACTORIES = {**{f: "new" for f in (_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
                                    _aten.new_empty.default, _aten.new_empty_strided.default)},
              **{f: "zeros" for f in (_aten.zeros.default, _aten.new_zeros.default, _aten.zeros_like.default)}}


_SAME = frozenset({_aten.detach.default, _aten.alias.default})
_HOST_READS = frozenset({_aten._local_scalar_dense.default, _aten.equal.default, _aten.is_nonzero.default})


def _tensors_only(res) -> bool:
    """A result of tensors (or a tensor list / tuple, Nones allowed): no Python number the caller could act on."""
    if res is None or isinstance(res, Tensor):
        return True
    return isinstance(res, (list, tuple)) and all(r is None or isinstance(r, Tensor) for r in res)


def _contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _program(out, tensors, log) -> _Program:
    slots: list[Tensor] = []        # every tensor of the recording, by slot (inputs first)
    by_id: dict = {}                # id(tensor) -> slot
    by_ptr: dict = {}               # data pointer -> first input there
    fresh: list = []                # (storage start, end, slot) of the memory the call's ops made
    for t in tensors:
        if t is not None:
            by_id.setdefault(id(t), len(slots))
            by_ptr.setdefault(t.data_ptr(), len(slots))
        slots.append(t)

    def new_slot(t: Tensor, owns: bool) -> int:
        i = len(slots)
        slots.append(t)
        by_id[id(t)] = i
        if owns:  # new memory: a pointer into it is (this slot, offset)
            st = t.untyped_storage()
            fresh.append((st.data_ptr(), st.data_ptr() + st.nbytes(), i))
        return i

    def spec(a):
        if isinstance(a, Tensor):
            i = by_id.get(id(a))
            if i is None:
                raise _NotReplayable("a torch op on a tensor the call neither received nor made")
            return _Slot(i)
        if isinstance(a, (list, tuple)):
            return type(a)(spec(x) for x in a)
        if isinstance(a, dict):
            return {k: spec(v) for k, v in a.items()}
        return a

    def pointer(p: int) -> tuple:
        i = by_ptr.get(p)
        if i is not None:
            return (i, 0)
        for lo, hi, j in fresh:
            if lo <= p < hi:
                return (j, p - slots[j].data_ptr())
        raise _NotReplayable("a pointer to memory the call neither received nor allocated")

    steps = []
    counts: dict = {}  # Family -> Counter: the launch counts this call added (as the log reported them)
    stream = None      # the caller's stream, as it was and is (looked up at the first launch)
    side = None        # inside a fork (runtime.SideWork): the side stream its launches use
    marks: dict = {}   # id of a SideWork.ready event -> its index among the call's marks
    for entry in log:
        kind = entry[0]
        if kind == "mark":
            marks[id(entry[1])] = len(marks)
            steps.append(["mark"])
            continue
        if kind == "fork":
            if entry[3]:  # the CSR's: its sort is torch ops, which a replay runs on the caller's stream
                raise _NotReplayable("a fork on the high-priority side stream")
            if id(entry[2]) not in marks:
                raise _NotReplayable("a fork after an event the call did not mark")
            side = entry[1]
            steps.append(["fork", marks[id(entry[2])]])
            continue
        if kind == "fork_end":
            side = None
            continue
        if kind == "join":
            if not any(st[0] == "fork" for st in steps):
                raise _NotReplayable("a join without a fork")
            steps.append(["join"])
            continue
        if kind == "jit":
            raise _NotReplayable(f"a Triton JIT launch ({entry[1]})")
        if kind == "count":
            counts.setdefault(entry[1], collections.Counter())[entry[2]] += 1
            continue
        if kind == "unreplayable":
            raise _NotReplayable(entry[1])
        if kind == "op":
            _, func, args, kwargs, res = entry
            if func in _HOST_READS or not _tensors_only(res):  # a value read on the host may steer the call
                raise _NotReplayable(f"a host read of a device value ({func})")
            fac = _FACTORIES.get(func)
            if side is not None and (fac is not None or not func.is_view):  # a replay runs ops on the caller's stream
                raise _NotReplayable(f"a torch op beside the caller's stream ({func})")
            if fac is not None:
                if fac == "zeros" and res.stride() != _contiguous_strides(res.shape):
                    raise _NotReplayable("a zero-filled allocation with other than contiguous strides")
                steps.append([fac, new_slot(res, True), (tuple(res.shape), res.stride(), res.dtype, res.device)])
                continue
            a, kw = spec(args), spec(kwargs)
            if _has_stream((args, kwargs)):  # record_stream: the stream of a replay may be another
                raise _NotReplayable(f"a torch op on a stream object ({func})")
            if func in _SAME and a[0].index >= len(tensors):  # autograd's detach of a tensor the call made: the same
                by_id[id(res)] = a[0].index                      # tensor to a replay
                continue
            outs = [new_slot(t, not func.is_view) if isinstance(t, Tensor) else None
                    for t in (res if isinstance(res, (list, tuple)) else (res,))]
            steps.append(["op", func, a, kw, outs])
            continue
        if stream is None:
            stream = launch.current_stream(tensors[0].device)
        if entry[-1] != (stream if side is None else side):
            raise _NotReplayable("a launch on another stream than the caller's")
        if side is not None and kind != "aot":
            raise _NotReplayable("a CUDA-row call beside the caller's stream")
        tpl = []  # the launch's arguments: numbers as they are, pointers as (slot, byte offset)
        if kind == "aot":
            _, k, grid, values, _ = entry
            for v, ty in zip(values, (p["type"] for p in k.params)):
                if ty.startswith("*") and v:
                    tpl.append(pointer(int(v)))
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    tpl.append(v)
                else:
                    raise _NotReplayable(f"a launch value {v!r} of type {ty}")
            steps.append(["aot", k, grid, tpl, side is not None])
        else:
            _, fn, device, cargs, _ = entry
            for v in cargs:
                if isinstance(v, ctypes.c_void_p):
                    tpl.append(pointer(v.value) if v.value else _NULL)
                elif isinstance(v, int) and not isinstance(v, bool):
                    tpl.append(v)
                else:
                    raise _NotReplayable(f"a native argument {v!r}")
            steps.append(["native", fn, device, tpl, False])
    outputs = spec(out)
    steps = _live(steps, outputs)
    steps = _workspace(steps, outputs, slots, tensors[0].device)
    return _Program(_compiled(steps), len(slots) + 1, len(tensors), outputs,
                    [(fam, tuple(c.items())) for fam, c in counts.items()])


def _compiled(steps: list) -> list:
    """The steps as ``_Program.run`` takes them: a launch's arguments as its numbers with the pointer positions
    to fill; an op's output slots marked when a launch points into them."""
    addressed = {v[0] for st in steps if st[0] in ("aot", "native") for v in st[3] if type(v) is tuple}
    out = []
    for st in steps:
        kind = st[0]
        if kind == "new":
            shape, stride, dtype, device = st[2]
            out.append((_NEW, st[1], shape, stride, dtype, device))
        elif kind == "zeros":
            shape, _, dtype, device = st[2]
            out.append((_ZEROS, st[1], shape, dtype, device))
        elif kind == "op":
            out.append((_OP, st[1], _filler(st[2]), _filler(st[3]), st[4],
                        any(i in addressed for i in st[4] if i is not None)))
        elif kind == "mark":
            out.append((_MARK,))
        elif kind == "fork":
            out.append((_FORK, st[1]))
        elif kind == "join":
            out.append((_JOIN,))
        else:
            values = [0 if type(v) is tuple else v for v in st[3]]
            fixups = tuple((pos, v[0], v[1]) for pos, v in enumerate(st[3]) if type(v) is tuple)
            out.append(((_AOT_SIDE if st[4] else _AOT) if kind == "aot" else _NATIVE, st[1], st[2], values, fixups))
    return out


def _leaves(a):
    """The items of nested lists, tuples and dicts (a ``_Slot`` is an item, not a tuple to walk)."""
    if type(a) is not _Slot and isinstance(a, (list, tuple)):
        for x in a:
            yield from _leaves(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from _leaves(x)
    else:
        yield a


def _has_stream(a) -> bool:
    return any(isinstance(x, (torch.Stream, torch.cuda.Stream)) for x in _leaves(a))


_WORKSPACE_ALIGN = 512  # bytes: the caching allocator's block alignment, so every pointer keeps its alignment


def _workspace(steps: list, outputs, slots: list, device) -> list:
    """The allocations that only launches read or write (no torch op, not the result) carved from one workspace
    allocation, in slot ``len(slots)``: one allocator call per replay instead of one per temporary. Each keeps its
    size, rounded up to ``_WORKSPACE_ALIGN``; all live to the end of the replay, as every allocation of a replay
    does."""
    by_op = _slots_in(outputs, set())
    for st in steps:
        if st[0] == "op":
            _slots_in((st[2], st[3]), by_op)
            by_op.update(i for i in st[4] if i is not None)
    carve = {}  # slot -> byte offset in the workspace
    total, first = 0, None
    for k, st in enumerate(steps):
        if st[0] == "new" and st[1] not in by_op and st[2][3] == device:
            t = slots[st[1]]
            carve[st[1]] = total
            total += -(-t.untyped_storage().nbytes() // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
            first = k if first is None else first
    if len(carve) < 2:
        return steps
    ws = len(slots)
    out = []
    for k, st in enumerate(steps):
        if k == first:
            out.append(["new", ws, ((max(total, 1),), (1,), torch.uint8, device)])
        if st[0] == "new" and st[1] in carve:
            continue
        if st[0] in ("aot", "native"):
            tpl = st[3]
            tpl[:] = [(ws, carve[v[0]] + v[1]) if type(v) is tuple and v[0] in carve else v for v in tpl]
        out.append(st)
    return out


def _slots_in(spec, acc: set) -> set:
    acc.update(x.index for x in _leaves(spec) if type(x) is _Slot)
    return acc


def _live(steps: list, outputs) -> list:
    """The steps that matter, in order: launches, torch ops that write their arguments or return nothing (a
    device-side assert), and the ops and allocations whose tensors those or the result use (a view made only to take
    its pointer is not repeated)."""
    need = _slots_in(outputs, set())
    keep = []
    for st in reversed(steps):
        kind = st[0]
        if kind in ("mark", "fork", "join"):
            keep.append(st)
            continue
        if kind in ("aot", "native"):
            need.update(v[0] for v in st[3] if type(v) is tuple)
        elif kind == "op":
            outs = [i for i in st[4] if i is not None]
            if not (st[1]._schema.is_mutable or not outs or any(i in need for i in outs)):
                continue
            _slots_in((st[2], st[3]), need)
        elif st[1] not in need:
            continue
        keep.append(st)
    return keep[::-1]
