"""Host side of the Triton runtime both kernel families use: the tile configs at run time, device and input helpers,
the launcher of the shared kernels (``_kernels.py``) and their host wrappers (tile map, CSR, combine, zero-tail, the
backward's plan and weight-free steps). ``triton_glu.glu`` (bf16 / fp16 factors) and ``triton_lowbit.glu`` (packed
factors) call these; neither calls the other.

Sync-free: nothing here reads a device value on the host, so a call can be captured in a CUDA graph. The tile map,
the CSR of each combine and the padding bounds are built on the device (``torch.cumsum``, ``torch.sort(stable=True)``,
``torch.searchsorted``) and read by the kernels.

Determinism: no atomics. Per-expert reductions (dW, d s) are summed over row tiles or chunks of rows in a fixed order
(``BwdPlan``; the chunk size is a function of the shape); combines sum each target's rows in increasing row order (a
stable sort), so every run gives the same bits.

Launches: every shared kernel goes through ``launch_kernel`` with its runtime parameters in the order of
``specs.KERNELS`` and its constexprs, so the same grids and arguments feed either the ahead-of-time cubins
(``tsct.kernels.aot``; no Triton needed) or Triton JIT (``TSCT_TRITON_BACKEND``). The inputs are normalised first
(exactly: scales and row weights to fp32, int32 indices to int64, a lone scale gets a ones partner: ``scales_f32``,
``scales_in``, ``as_f32``, ``as_i64``) so the AOT table stays small (specs.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from tsct import config, dispatch, native
from tsct.kernels import aot, launch, record
from tsct.kernels.triton_common import specs
from tsct.kernels.triton_common.specs import Config

__all__ = ["ARCH_CONFIGS", "CONFIG", "overridden", "kernel_arch", "tile_config", "cuda_kernel", "FAMILY",
           "backend_counts", "launch_kernel", "cdiv", "device_props", "device_capability", "aligned_launch",
           "native_smem_ok", "scales_f32", "scales_in", "as_f32", "as_i64", "tile_cum", "link_csr", "linked_csr",
           "build_csr", "side_stream", "SideWork", "csr_overlap", "combine", "combine_forward", "dx_csr", "zero_tail",
           "zero_saved_tails", "saved_like_r", "BwdPlan", "chunk_size", "bwd_plan", "chunked_programs", "dwd_chunks",
           "dw_chunks", "EpiOut", "epi_outputs", "bwd_epilogue", "scale_grads", "dx_from_rows"]

# ---- tile configs at run time (specs.CONFIGS: one table per arch, shared with the AOT build) -----------------------

#: {arch: Config} after ``TSCT_TRITON_GLU_CFG`` (``config.triton_glu_cfg``); ``overridden`` changes it in
#: place
def _arch_configs() -> dict[str, Config]:
    try:
        return {a: c.update(config.triton_glu_cfg) for a, c in specs.CONFIGS.items()}
    except ValueError as e:
        raise ValueError(f"TSCT_TRITON_GLU_CFG={config.triton_glu_cfg!r}: {e}") from None


ARCH_CONFIGS: dict[str, Config] = _arch_configs()
# CONFIG: every arch without AOT cubins (JIT: sm_80, sm_86, sm_89, ...) gets sm_90a's tiles (not its CUDA kernels:
# ``kernel_arch`` is None there, and tsct.dispatch.CUDA_KERNELS has rows for artifact arches only)
CONFIG = ARCH_CONFIGS[specs.DEFAULT_ARCH_CONFIG]


#: bumped whenever ``overridden`` changes the tile configs (caches of launch choices key on it: tsct.kernels.replay)
config_generation = 0


@contextlib.contextmanager
def overridden(spec: str):
    """Within the ``with`` block, every arch's tile config (and the JIT-only arches') with ``spec`` applied
    (``TSCT_TRITON_GLU_CFG``'s syntax, ``Config.update``): kernel development, tests. Not thread-safe; restored on
    exit. Raises ValueError for a bad item before anything changes."""
    global CONFIG, config_generation
    saved = dict(ARCH_CONFIGS), CONFIG
    changed = {a: c.update(spec) for a, c in ARCH_CONFIGS.items()}, CONFIG.update(spec)
    ARCH_CONFIGS.update(changed[0])
    CONFIG = changed[1]
    config_generation += 1
    try:
        yield
    finally:
        ARCH_CONFIGS.update(saved[0])
        CONFIG = saved[1]
        config_generation += 1


def kernel_arch(cap: tuple[int, int]) -> Optional[str]:
    """The arch whose kernels this install runs on compute capability ``cap``: its artifact arch's table (a proxy
    install, decision 0017, runs the proxied arch's: sm_120's on 9.0), None for a capability with no artifact arch
    (sm_80, sm_86, 10.3, ...: JIT with ``CONFIG``). A capability with an artifact arch keeps it whether or not this
    install holds its cubins (a source tree on 9.0 runs sm_90a's tiles and CUDA rows through JIT). Keys the tile
    configs (``tile_config``) and the CUDA rows of the dispatch (``tsct.dispatch.cuda_kernel``)."""
    arch = specs.table_arch(aot.artifact_arch(cap))
    return arch if arch in ARCH_CONFIGS else None


def tile_config(cap: tuple[int, int]) -> Config:
    """The tile config of every Triton family on compute capability ``cap``: ``kernel_arch``'s, ``CONFIG`` on an arch
    without cubins."""
    return ARCH_CONFIGS.get(kernel_arch(cap) or "", CONFIG)


def cuda_kernel(replaces: str, cap: tuple[int, int], fmt: str) -> bool:
    """Whether the dispatch runs the Triton kernel ``replaces`` as its CUDA C++ row on compute capability ``cap`` for
    storage format ``fmt`` (``tsct.dispatch.cuda_kernel`` at ``kernel_arch(cap)``); the call's shape is the caller's
    to check."""
    return dispatch.cuda_kernel(replaces, kernel_arch(cap), fmt)


# ---- the launcher of the shared kernels: the AOT cubins (tsct.kernels.aot) or Triton JIT -------------------------
# TSCT_TRITON_BACKEND=auto (default): the AOT cubin of the launch's specialization when this install
# ships one for the device's arch, else Triton JIT when importable. =aot / =jit force one (tests).

FAMILY = launch.Family("triton-common", specs, "tsct.kernels.triton_common._kernels")


def backend_counts() -> dict[tuple[str, str], int]:
    """{(backend, kernel): launches} of the shared kernels since the process started ("aot", "jit"), whichever family
    launched them."""
    return FAMILY.backend_counts()


def launch_kernel(kernel: str, grid: tuple, args: Sequence[Any], consts: dict, num_warps: int, num_stages: int,
                  aligned: bool, cap: tuple[int, int], device: torch.device, maxnreg: int = 0) -> None:
    """Launch the shared kernel ``kernel`` (its runtime parameters in specs.KERNELS order; None = a pointer the flags
    leave unread) on the current stream, through the AOT cubin or Triton JIT (``tsct.kernels.launch``); ``maxnreg``:
    its register cap (0: none)."""
    FAMILY.launch(kernel, grid, args, consts, num_warps, num_stages, aligned, cap, device, maxnreg)


# ---- host-side helpers ----------------------------------------------------------------------------

def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (b > 0)."""
    return -(-a // b)


_props: dict[int, Any] = {}


def device_props(device: torch.device) -> Any:
    """torch.cuda.get_device_properties of a CUDA device, cached per device index."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    props = _props.get(idx)
    if props is None:
        props = _props[idx] = torch.cuda.get_device_properties(idx)
    return props


def device_capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability; (0, 0) for a CPU tensor (Triton's interpreter: JIT only)."""
    if device.type != "cuda":
        return (0, 0)
    props = device_props(device)
    return (props.major, props.minor)


def aligned_launch(d: int, r: int, stride_x: int, *tensors: Optional[Tensor]) -> bool:
    """d, r and x's row stride multiples of 16 and every given tensor 16-byte aligned: the launches may
    use the variants compiled with divisibility attributes (and the finer tile choices)."""
    if d % 16 or r % 16 or stride_x % 16:
        return False
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def native_smem_ok(kernel: str, device: torch.device) -> bool:
    """The native library is present and the device allows the shared memory per block its entry point
    launches ``kernel`` with (``tsct.native.kernel_smem_bytes``: the library's own number)."""
    if not native.available():
        return False
    return device_props(device).shared_memory_per_block_optin >= native.kernel_smem_bytes(kernel)


def scales_f32(s_gate: Optional[Tensor], s_up: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """Both scales as fp32 (exact: the kernels compute in fp32), or neither; a lone scale gets ones."""
    if s_gate is None and s_up is None:
        return None, None
    ref = s_gate if s_gate is not None else s_up
    sg = as_f32(s_gate) if s_gate is not None else torch.ones_like(ref, dtype=torch.float32)
    su = as_f32(s_up) if s_up is not None else torch.ones_like(ref, dtype=torch.float32)
    return sg, su


def scales_in(s_gate: Optional[Tensor], s_up: Optional[Tensor], dtype: torch.dtype
              ) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The scales for glu_down_fwd and glu_bwd_epi, which widen them to fp32 as they load them (exact): both as
    given when they share x's dtype or fp32 (no conversion kernels: two launches on the critical path of a b1
    forward, two more in its backward), else ``scales_f32``."""
    if s_gate is not None and s_up is not None and s_gate.dtype == s_up.dtype and s_gate.dtype in (dtype,
                                                                                                    torch.float32):
        return s_gate.contiguous(), s_up.contiguous()
    return scales_f32(s_gate, s_up)


def as_f32(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` as contiguous fp32 (exact for the scales and row weights the kernels widen anyway), None stays None.
    (A conversion only when needed: ``Tensor.to`` to its own dtype is still a torch op, host time per call.)"""
    if t is None:
        return None
    return (t if t.dtype == torch.float32 else t.float()).contiguous()


def as_i64(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` as contiguous int64 (gather / scatter indices: the kernels widen every index anyway), None stays None."""
    if t is None:
        return None
    return (t if t.dtype == torch.int64 else t.to(torch.int64)).contiguous()


# ---- tile map, CSR, combine, padding rows ------------------------------------------------------------

def tile_cum(offs: Tensor, bm: int, cap=None, zero: Sequence[Tensor] = ()) -> Tensor:
    """Inclusive cumulative count of row tiles per expert, int32 on the device: one launch on a GPU
    (five small torch ops cost more host time than the kernels they feed), torch ops on the CPU
    (Triton's interpreter). ``zero``: a saving forward's [hg, hu, z * rw] ([M, r] each, contiguous), whose rows
    at or past offs[-1] the same launch sets to 0 (``zero_saved_tails``)."""
    cap = device_capability(offs.device) if cap is None else cap
    if cap == (0, 0):
        counts = torch.diff(offs, prepend=offs.new_zeros(1))
        ntiles = torch.div(counts + (bm - 1), bm, rounding_mode="floor")
        for t in zero:  # CPU: reading offs on the host costs no sync
            t[max(int(offs[-1]), 0):].zero_()
        return torch.cumsum(ntiles, 0, dtype=torch.int32)
    e = offs.shape[0]
    cum = torch.empty(e, device=offs.device, dtype=torch.int32)
    consts = dict(BM=bm, BLOCK=specs.TILE_CUM_BLOCK, ZERO=bool(zero), ZBLOCK=specs.TILE_CUM_ZBLOCK)
    if not zero:
        launch_kernel("tile_cum", (1,), [offs, cum, e, None, None, None, 0, 0, 0], consts, 4, 1, False, cap,
                      offs.device)
        return cum
    # the three tensors as 16-bit words (all-zero bits are 0 in every float dtype): one specialization per arch
    t0, t1, t2 = (t.view(torch.int16) for t in zero)
    m, w01, w2 = t0.shape[0], t0.shape[1], t2.shape[1]
    nz = max(1, min(cdiv(m * w01, specs.TILE_CUM_ZBLOCK), specs.TILE_CUM_ZPROGRAMS))
    launch_kernel("tile_cum", (1 + nz,), [offs, cum, e, t0, t1, t2, m, w01, w2], consts, 4, 1, False, cap, offs.device)
    return cum


def _csr(idx: Tensor, offs: Tensor, m: int, n_out: int, cap) -> tuple[Tensor, Tensor]:
    """Rows grouped by target: target t owns rows order[ptr[t]:ptr[t+1]], in increasing row order.

    Rows at or past offs[-1] get the key n_out (past every target), so their idx entries are never
    used (they may hold anything). The keys are int16 when n_out < 2**15 - 1 (the radix sort then makes
    2 passes instead of 4), else int32. The outputs (order int64 [m], ptr int64 [n_out + 1]) are allocated
    before the work is issued, so ``csr_overlap`` can issue it on another stream.
    """
    kdt = torch.int16 if n_out < (1 << 15) - 1 else torch.int32
    order = torch.empty(m, device=idx.device, dtype=torch.int64)
    ptr = torch.empty(n_out + 1, device=idx.device, dtype=torch.int64)
    return order, ptr, lambda: _csr_fill(idx, offs, m, n_out, cap, kdt, order, ptr)


def _csr_fill(idx: Tensor, offs: Tensor, m: int, n_out: int, cap, kdt: torch.dtype, order: Tensor, ptr: Tensor):
    if cap == (0, 0):
        pos = torch.arange(m, device=idx.device, dtype=torch.int32)
        key = torch.where(pos < offs[-1], idx.to(torch.int32), n_out).to(kdt)
    else:
        key = _csr_keys(idx, offs, m, n_out, cap, kdt)
    skey = torch.empty_like(key)
    torch.sort(key, stable=True, out=(skey, order))
    torch.searchsorted(skey, torch.arange(n_out + 1, device=idx.device, dtype=kdt), out=ptr)


_csr_links: Any = None  # token tensor -> _CsrLink (torch.utils.weak.WeakIdKeyDictionary, created on first use)


@dataclasses.dataclass(frozen=True)
class _CsrLink:
    offs: Tensor
    versions: tuple[int, int]       # token's and offs' version counters when linked
    data_ptrs: tuple[int, int]      # and their storage (``set_`` moves it without a version bump)
    stream: Any                     # the stream the CSR was written on (raw cudaStream_t)
    capture: int                    # the CUDA graph capture it was written in (0: none)
    order: Tensor
    ptr: Tensor


def _capture_id(device: torch.device) -> Optional[int]:
    """The CUDA graph capture underway on the device's current stream: 0 when none, None when it cannot be told
    (torch does not expose the id; the native library's ``stream_capture_id`` reads it)."""
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return 0
    try:
        return native.stream_capture_id(torch.cuda.current_stream(device))
    except Exception:  # no native library (a JIT-only install), or the query failed
        return None


def link_csr(token: Tensor, offs: Tensor, order: Tensor, ptr: Tensor) -> None:
    """Record that combining through ``token`` (``sort_by_expert``'s, just written by ``route_place`` together with
    this CSR) with these ``offs`` may use ``(order, ptr)`` instead of building ``_csr``: the same rows in the same
    order per target (plus dropped choices' padding rows, which ``combine_rows`` skips), so the same bits.
    ``linked_csr`` hands it out only while both tensors are the same objects with the same storage and version
    counters, and inside a CUDA graph capture only to the capture that wrote it (a graph replays the CSR it
    captured: one captured with the sort rewrites it on each replay, one that takes the token as an input would
    not). Writes that bypass the version counter (``.data``, DLPack) are not seen, as with autograd's saved
    tensors. Inference tensors have no version counter: not linked."""
    global _csr_links
    if torch.is_inference(token) or torch.is_inference(offs):
        return
    cap = _capture_id(token.device)
    if cap is None:
        return
    if _csr_links is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _csr_links = WeakIdKeyDictionary()
    stream = launch.current_stream(token.device) if token.is_cuda else None  # the raw cudaStream_t
    _csr_links[token] = _CsrLink(offs, (token._version, offs._version), (token.data_ptr(), offs.data_ptr()), stream,
                                 cap, order, ptr)


def linked_csr(idx: Tensor, offs: Tensor, m: int, n_out: int) -> Optional[tuple[Tensor, Tensor]]:
    """The CSR ``link_csr`` recorded for ``idx`` with exactly this ``offs`` object, m rows and n_out targets, while
    still valid (see ``link_csr``); else None (build one). Used on another stream than it was written on, it is
    recorded on that stream (``record_stream``) so its memory outlives the use."""
    link = _csr_links.get(idx) if _csr_links is not None else None
    if link is None or link.offs is not offs or link.order.shape[0] != m or link.ptr.shape[0] != n_out + 1:
        return None
    if (idx._version, offs._version) != link.versions or (idx.data_ptr(), offs.data_ptr()) != link.data_ptrs:
        return None
    if not idx.is_cuda:
        return link.order, link.ptr
    cap = _capture_id(idx.device)
    if cap != 0 and cap != link.capture:  # capturing (or cannot tell): only the capture that wrote it
        return None
    if cap == 0 and link.capture == 0 and launch.current_stream(idx.device) != link.stream:
        stream = torch.cuda.current_stream(idx.device)
        link.order.record_stream(stream)
        link.ptr.record_stream(stream)
    return link.order, link.ptr


def build_csr(idx: Tensor, offs: Tensor, m: int, n_out: int, cap) -> tuple[Tensor, Tensor]:
    """``(order, ptr)`` of ``_csr``, built on the current stream."""
    order, ptr, fill = _csr(idx, offs, m, n_out, cap)
    fill()
    return order, ptr


_side_streams = threading.local()  # per thread: a capture in one thread must not take another thread's work


def side_stream(device: torch.device, high: bool = True) -> torch.cuda.Stream:
    """A side stream per (thread, device, priority). ``high`` (``csr_overlap``): its few latency-bound kernels should
    not queue behind the row kernels' thousands of tiles, which wait for them. Else the default priority, the lowest
    (``SideWork``): the backward's chunked dW kernels, which nothing waits for until the backward ends, get no
    precedence over the row kernels, and being issued after them they take the SMs those leave idle. The streams come
    from torch's stream pools (as every ``torch.cuda.Stream()``), which other components (e.g. communication streams)
    may also draw from: sharing one costs ordering."""
    i = device.index if device.index is not None else torch.cuda.current_device()
    streams = getattr(_side_streams, "by_device", None)
    if streams is None:
        streams = _side_streams.by_device = {}
    s = streams.get((i, high))
    if s is None:
        s = streams[(i, high)] = torch.cuda.Stream(device=i, priority=torch.cuda.Stream.priority_range()[int(high)])
    return s


class SideWork:
    """Launches beside the caller's stream: ``with SideWork(device) as side:`` around a pass; ``ready = side.ready()``
    once the inputs of some side work exist, then ``with side.fork(ready):`` around the side work's launches, whose
    results the caller's stream reads only after the outer block. A fork's launches run on a ``side_stream`` after
    everything the caller's stream issued before ``ready``; leaving the outer block makes the caller's stream wait
    for all of them (on an exception too: no memory they use is handed to other work first). Memory a fork's results
    use is allocated before its ``ready``, on the caller's stream; what a fork allocates inside is the side
    stream's. On the CPU, or with ``tsct.config.side_stream`` off, everything runs on the caller's stream in issue
    order.

    Two uses. The backward's chunked weight gradients (``high`` False: the default priority, the lowest), forked
    after the row kernel they run beside, so that kernel's programs take the SMs first and the side work fills what
    its last wave leaves idle; the row kernels neither read nor write their results. The forward's combine CSR
    (``csr_overlap``, ``high`` True), forked before the projections, whose thousands of tiles the combine would
    otherwise wait behind. ``tsct.kernels.replay`` records the marks, the forks and the join as steps of its own
    (forks of the default priority only)."""

    __slots__ = ("_main", "_side", "_high", "_forked")

    def __init__(self, device: torch.device, high: bool = False):
        self._main = self._side = None
        self._high = high
        self._forked = False
        if device.type == "cuda" and config.side_stream:
            self._main = torch.cuda.current_stream(device)
            self._side = side_stream(device, high=high)

    def __enter__(self) -> "SideWork":
        return self

    def __exit__(self, *exc) -> None:
        self.join()

    def join(self) -> None:
        """The caller's stream waits for every fork so far (nothing without one)."""
        if self._forked:
            self._forked = False
            self._main.wait_stream(self._side)
            log = record.active()
            if log is not None:
                log.append(("join",))

    def ready(self) -> Optional[torch.cuda.Event]:
        """An event on the caller's stream after all it has issued so far (None without a side stream)."""
        if self._side is None:
            return None
        ev = self._main.record_event()
        log = record.active()
        if log is not None:
            log.append(("mark", ev))
        return ev

    @contextlib.contextmanager
    def fork(self, ready: Optional[torch.cuda.Event]):
        if self._side is None:
            yield
            return
        self._side.wait_event(ready)
        self._forked = True
        log = record.active()
        if log is not None:
            log.append(("fork", self._side.cuda_stream, ready, self._high))
        try:
            with torch.cuda.stream(self._side):
                yield
        finally:
            if log is not None:
                log.append(("fork_end",))


class csr_overlap:
    """``with csr_overlap(idx, offs, m, n_out, cap) as c: <projections>``, then ``c.csr`` is ``build_csr(idx, ...)``:
    the CSR is issued on the high-priority side stream (``SideWork``) before the body issues the projections on
    the caller's stream, which waits for it on exit (on an exception too, the fill's own included). Its outputs are
    allocated on the caller's stream, its temporaries on the side stream. The ~0.03 ms of sort kernels at b1 then
    run beside the projections instead of before the combine. ``idx`` None: nothing to build; a CSR linked by
    ``sort_by_expert`` (``linked_csr``): nothing to build either."""

    def __init__(self, idx: Optional[Tensor], offs: Tensor, m: int, n_out: int, cap):
        self.csr: Optional[tuple[Tensor, Tensor]] = None
        self._work = None
        if idx is None:
            return
        self.csr = linked_csr(idx, offs, m, n_out)
        if self.csr is not None:
            return
        order, ptr, fill = _csr(idx, offs, m, n_out, cap)
        self.csr = (order, ptr)
        self._work = SideWork(idx.device, high=True)
        try:
            with self._work.fork(self._work.ready()):
                fill()
        except BaseException:  # some of it may be queued: join before the outputs can be freed
            self._work.join()
            raise

    def __enter__(self) -> "csr_overlap":
        return self

    def __exit__(self, *exc) -> None:
        if self._work is not None:
            self._work.join()


def _csr_keys(idx: Tensor, offs: Tensor, m: int, n_out: int, cap, kdt: torch.dtype = torch.int32) -> Tensor:
    if idx.dtype not in (torch.int32, torch.int64):
        idx = idx.to(torch.int64)
    key = torch.empty(m, device=idx.device, dtype=kdt)
    blk = specs.CSR_KEYS_BLOCK
    launch_kernel("csr_keys", (cdiv(m, blk),), [idx.contiguous(), offs, key, offs.shape[0], m, n_out], dict(BLOCK=blk),
                  4, 1, False, cap, idx.device)
    return key


def combine(src: Tensor, idx: Tensor, offs: Tensor, n_out: int, cfg: Config, cap, ncols: Optional[int] = None,
            csr: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
    """out[t] = sum of src[i, :ncols] over the rows i < offs[-1] with idx[i] == t, in increasing i.
    ``csr``: ``build_csr(idx, offs, m, n_out)`` (or ``linked_csr``'s) if the caller has it (else the linked one or
    one built here)."""
    m, ld = src.shape
    ncols = ld if ncols is None else ncols
    out = torch.empty(n_out, ncols, device=src.device, dtype=src.dtype)
    if n_out == 0 or ncols == 0:
        return out
    if csr is None:
        csr = linked_csr(idx, offs, m, n_out) or build_csr(idx, offs, m, n_out, cap)
    order, ptr = csr
    bn, nb, warps = specs.combine_tile(cfg, ncols)
    launch_kernel("combine_rows", (n_out, cdiv(ncols, bn * nb)), [src, order, ptr, out, offs, offs.shape[0], ncols, ld],
                  dict(SRC8=ld % 8 == 0, BN=bn, NB=nb), warps, 3, True, cap, src.device)
    return out


def combine_forward(y: Tensor, scatter_idx: Tensor, offs: Tensor, n_out: int, f: int, cfg: Config, cap,
                    saved: list[Tensor], save: bool, csr: tuple[Tensor, Tensor]) -> Tensor:
    """The forward's combine of y's first ``f`` columns into ``[n_out, f]`` through ``csr`` (``csr_overlap``'s). A
    saving forward (``save``) appends that CSR (order int64 [M], ptr int64 [n_out + 1]) to ``saved``: the
    backward's dX combine reuses it when it would build the same one (``dx_csr``). A linked CSR (``link_csr``)
    also lists padding rows, which ``combine_rows`` skips."""
    if save:
        saved.extend(csr)
    return combine(y, scatter_idx, offs, n_out, cfg, cap, ncols=f, csr=csr)


def _same_index(a: Tensor, b: Tensor) -> bool:
    """The same index tensor: one object, or views of the same memory with the same dtype, shape and strides (so
    the same values now; autograd's saved-tensor version check rejects an in-place change after the forward)."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
                      and a.stride() == b.stride() and a.device == b.device)


def dx_csr(saved: Optional[Sequence[Tensor]], gather_idx: Tensor, scatter_idx: Optional[Tensor], n_x: int,
           num_out_rows: Optional[int]) -> Optional[tuple[Tensor, Tensor]]:
    """The CSR the dX combine (over ``gather_idx`` into the x's ``n_x`` rows) needs, from the forward's
    (``combine_forward``, entries 3 and 4 of ``saved``) when that is the same one: the same index tensor routes
    and combines (as a token-choice MoE layer passes it) and ``num_out_rows == n_x``. None: build it."""
    if (saved is None or len(saved) != 5 or scatter_idx is None or num_out_rows != n_x
            or not _same_index(gather_idx, scatter_idx)):
        return None
    return saved[3], saved[4]


def zero_tail(out: Tensor, offs: Tensor, e: int, cfg: Config, cap) -> None:
    """Zero the padding rows (>= offs[-1]) of ``out`` [m, ncols] in place on the device (kernel ``zero_tail_rows``;
    no host read of offs). ``e``: len(offs) >= 1; ``cfg``, ``cap``: the launch's tile config and compute capability."""
    m, ncols = out.shape
    if m == 0 or ncols == 0:
        return
    bm, bn = specs.ZERO_TAIL_BM, specs.ZERO_TAIL_BN
    launch_kernel("zero_tail_rows", (cdiv(m, bm), cdiv(ncols, bn)), [out, offs, e, m, ncols], dict(BM=bm, BN=bn),
                  cfg.shared.warps_zero, 3, True, cap, out.device)


def zero_saved_tails(saved: Sequence[Tensor], offs: Tensor, bm: int, cap) -> Tensor:
    """Zero the padding rows (>= offs[-1]) of a saving forward's [hg, hu, z * rw]: outputs of the custom op, so
    their padding rows must be defined (the down kernels write the experts' rows only; torch.library.opcheck
    compares two runs' outputs). Folded into the tile map's launch: returns ``tile_cum(offs, bm)``. No host
    sync."""
    return tile_cum(offs, bm, cap, zero=saved)


def saved_like_r(x: Tensor, r: int, gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor],
                 num_out_rows: Optional[int]) -> list[Tensor]:
    """[hg, hu] fp32 [M, r], z*rw [M, r] in x.dtype, and with ``scatter_idx`` the combine's CSR (order int64 [M],
    ptr int64 [num_out_rows + 1])."""
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    out = [x.new_empty(m, r, dtype=torch.float32), x.new_empty(m, r, dtype=torch.float32), x.new_empty(m, r)]
    if scatter_idx is not None:
        out += [x.new_empty(m, dtype=torch.int64), x.new_empty(num_out_rows + 1, dtype=torch.int64)]
    return out


# ---- the backward's plan and its weight-free steps (both families' backward) ------------------------------

@dataclasses.dataclass(frozen=True)
class BwdPlan:
    """The backward's schedule on the device (``_kernels.py`` "backward"), made by ``bwd_plan``.

    maps: int32 [4, E] (``bwd_maps``): inclusive counts per expert of row tiles (the forward's tile map), of the
    chunked dW kernels' chunks, of workspace slots and of row tiles past the expert's first (the backward row
    kernels' map: program e < E holds expert e's first tile, program E + j the j-th further tile). ch: rows per
    chunk. max_tiles / n_slots: upper bounds of the row programs (E + cdiv(M, BM), the row kernels' grid) and of the
    slots. ws: the fp32 workspace of the slots, ``n_slots * slot_elems``
    elements (one element when no expert can need a slot: ch >= M)."""

    maps: Tensor
    ch: int
    max_tiles: int
    n_slots: int
    ws: Tensor
    cum: Tensor = dataclasses.field(init=False)   # maps[0] and maps[3], taken once (each indexing is a torch op)
    xcum: Tensor = dataclasses.field(init=False)

    def __post_init__(self):
        cum, _, _, xcum = self.maps.unbind(0)  # one torch op for the two views
        object.__setattr__(self, "cum", cum)
        object.__setattr__(self, "xcum", xcum)


def chunk_size(cfg: Config, m: int, slot_elems: int) -> int:
    """Rows per chunk of the chunked dW reductions: ``cfg.shared.chunk_bwd`` (rounded to a multiple of
    ``cfg.shared.bm``), doubled until the workspace the worst routing can need (cdiv(2 m, ch) slots of ``slot_elems``
    fp32: an expert of n >= 2 chunks has more than (n - 1) ch >= n ch / 2 rows) fits ``cfg.shared.ws_bwd_mib`` MiB, or
    no expert can have two chunks (ch >= m). A function of the shape only, so the bits of dW depend on nothing the
    device decides."""
    ch = max(cfg.shared.bm, cfg.shared.chunk_bwd // cfg.shared.bm * cfg.shared.bm)
    while ch < m and cdiv(2 * m, ch) * slot_elems * 4 > cfg.shared.ws_bwd_mib << 20:
        ch *= 2
    return ch


def bwd_plan(offs: Tensor, m: int, slot_elems: int, cfg: Config, cap) -> BwdPlan:
    """The maps of the backward (one ``bwd_maps`` launch, a program per 1,024 experts, no host read) and its
    workspace, for M = ``m`` routed rows and ``slot_elems`` elements per workspace slot (the largest per-expert
    gradient reduced through slots)."""
    e = offs.shape[0]
    ch = chunk_size(cfg, m, slot_elems)
    maps = torch.empty(4, e, device=offs.device, dtype=torch.int32)
    launch_kernel("bwd_maps", (max(1, cdiv(e, specs.TILE_CUM_BLOCK)),), [offs, maps, e, ch],
                  dict(BM=cfg.shared.bm, BLOCK=specs.TILE_CUM_BLOCK, CARRY=specs.MAPS_CARRY_BLOCK), 4, 1, False, cap,
                  offs.device)
    n_slots = cdiv(2 * m, ch) if ch < m else 0
    ws = torch.empty(max(1, n_slots * slot_elems), device=offs.device, dtype=torch.float32)
    return BwdPlan(maps, ch, cdiv(m, cfg.shared.bm) + e, n_slots, ws)


def chunked_programs(cfg: Config, device: torch.device) -> int:
    """Programs of the chunked dW kernels and the slot sums (``cfg.shared.waves_chunked`` per SM): they walk contiguous
    ranges of their work items, whose number only the device knows (none at b1, where every expert fits one row
    tile or is empty; a grid of one program per possible item would be tens of thousands of programs that exit at
    once). Three on the CPU (Triton's interpreter), so that a program walks several items there too."""
    if device.type != "cuda":
        return 3
    return cfg.shared.waves_chunked * device_props(device).multi_processor_count


def _slot_reduce(plan: BwdPlan, ws: Tensor, out: Tensor, per_expert: int, cfg: Config, cap) -> None:
    """out[e] = the sum of expert e's workspace slots in chunk order, for the experts of several chunks
    (``bwd_slot_reduce``); ``out``'s expert blocks are contiguous runs of ``per_expert`` elements."""
    if plan.n_slots == 0:
        return
    ncb = min(specs.SLOT_REDUCE_GROUPS, cdiv(per_expert, specs.SLOT_REDUCE_BLOCK))
    launch_kernel("bwd_slot_reduce", (chunked_programs(cfg, out.device),),
                  [ws, plan.maps, out, plan.maps.shape[1], per_expert, ncb],
                  dict(BLOCK=specs.SLOT_REDUCE_BLOCK, BLOCK_E=cfg.shared.block_e), specs.SLOT_REDUCE_WARPS, 1, True,
                  cap, out.device)


def dwd_chunks(plan: BwdPlan, go: Tensor, sidx: Optional[Tensor], offs: Tensor, zw: Tensor, dwd: Tensor, wd_t: bool,
               r: int, f: int, br: int, cfg: Config, aligned: bool, cap) -> None:
    """dW_down of the experts the dz row kernel leaves out (more than one row tile): ``glu_bwd_dwd`` over
    the chunk map, then ``bwd_slot_reduce`` for the experts of several chunks. ``dwd``: [E, r, f], each expert's
    block contiguous (row-major, or K-major with ``wd_t``). Shared by triton_lowbit (dWd does not involve w_down)."""
    e = offs.shape[0]
    bn = cfg.shared.bn_dwd
    n_fs = max(1, min(cfg.shared.fs_dwd, cdiv(f, bn)))
    f_slice = cdiv(cdiv(f, bn), n_fs) * bn
    n_fs = cdiv(f, f_slice)
    ws = plan.ws[:max(1, plan.n_slots * r * f)]
    launch_kernel("glu_bwd_dwd", (chunked_programs(cfg, go.device),),
                  [go, sidx, offs, plan.maps, zw, dwd, ws, e, r, f, f_slice, n_fs, plan.ch],
                  dict(HAS_SCATTER=sidx is not None, WD_T=wd_t, BM=cfg.shared.bm, BR=br, BN=bn,
                       BLOCK_E=cfg.shared.block_e),
                  cfg.shared.warps_dwd, cfg.shared.stages_dwd, aligned, cap, go.device, cfg.shared.dwd_maxnreg(wd_t))
    _slot_reduce(plan, ws, dwd, r * f, cfg, cap)


def dw_chunks(plan: BwdPlan, x: Tensor, gidx: Optional[Tensor], offs: Tensor, dhg: Tensor, dhu: Tensor, dwg: Tensor,
              dwu: Tensor, d: int, r: int, br: int, cfg: Config, aligned: bool, cap) -> None:
    """dW_gate / dW_up of the experts the dX row kernel leaves out: ``glu_bwd_dw`` over the chunk map, then
    ``bwd_slot_reduce`` of both for the experts of several chunks. Shared by triton_lowbit (X^T dh does not involve
    the factors)."""
    e = offs.shape[0]
    n = plan.n_slots * d * r
    wsg, wsu = (plan.ws[:max(1, n)], plan.ws[n:n + max(1, n)]) if n else (plan.ws, plan.ws)
    launch_kernel("glu_bwd_dw", (chunked_programs(cfg, x.device),),
                  [x, gidx, offs, plan.maps, dhg, dhu, dwg, dwu, wsg, wsu, e, d, r, x.stride(0), plan.ch],
                  dict(HAS_GATHER=gidx is not None, BM=cfg.shared.bm, BD=cfg.shared.bd_dw, BR=br,
                       BLOCK_E=cfg.shared.block_e),
                  cfg.shared.warps_dw, cfg.shared.stages_dw, aligned, cap, x.device)
    _slot_reduce(plan, wsg, dwg, d * r, cfg, cap)
    _slot_reduce(plan, wsu, dwu, d * r, cfg, cap)


class EpiOut(NamedTuple):
    """The GLU backward's outputs on the row tiles: dhg, dhu ([M, r], the activations' dtype), the tiles' d s_gate /
    d s_up partial sums (fp32 [tiles, r], None without scales) and d row_weight (fp32 [nrb, M] or [M] for one rank
    block: one row per rank block, padding rows 0)."""
    dhg: Tensor
    dhu: Tensor
    dsgp: Optional[Tensor]
    dsup: Optional[Tensor]
    drw: Tensor


def epi_outputs(plan: BwdPlan, m: int, r: int, nrb: int, has_s: bool, dtype: torch.dtype,
                device: torch.device) -> EpiOut:
    """Fresh ``EpiOut`` buffers for ``glu_bwd_epi`` or a dz kernel that runs the GLU backward itself (FUSE_EPI)
    over ``nrb`` rank blocks."""
    dsgp = torch.empty(plan.max_tiles, r, device=device, dtype=torch.float32) if has_s else None
    dsup = torch.empty(plan.max_tiles, r, device=device, dtype=torch.float32) if has_s else None
    return EpiOut(torch.empty(m, r, device=device, dtype=dtype), torch.empty(m, r, device=device, dtype=dtype),
                  dsgp, dsup, torch.zeros((nrb, m) if nrb > 1 else (m,), device=device, dtype=torch.float32))


def bwd_epilogue(plan: BwdPlan, hg: Tensor, hu: Tensor, part: Optional[Tensor], offs: Tensor, sg: Optional[Tensor],
                 su: Optional[Tensor], rw: Optional[Tensor], dtype: torch.dtype, want_ds: bool, cfg: Config,
                 cap, fused: Optional[EpiOut] = None) -> tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor],
                                                            Tensor]:
    """The GLU backward on the row tiles (``glu_bwd_epi``: the f-slice partials ``part`` of dz summed in order; or,
    ``fused``, the outputs of a dz kernel that ran it, ``part`` None) and, when ``want_ds``, the per-expert sums of
    the scales' gradients (``glu_bwd_sred``). Returns dhg, dhu ([M, r], ``dtype``), d s_gate, d s_up (fp32 [E, r], or
    None) and d row_weight (fp32 [M]; padding rows 0). Reads only [M, r] buffers, so r alone decides the aligned
    variant. Shared by triton_lowbit."""
    e = offs.shape[0]
    m, r = hg.shape
    al = r % 16 == 0
    br = specs.rank_block(cfg, r, al)
    nrb = cdiv(r, br)
    dev = hg.device
    has_s = sg is not None
    out = fused
    if out is None:
        out = epi_outputs(plan, m, r, nrb, has_s, dtype, dev)
        launch_kernel("glu_bwd_epi", (plan.max_tiles, nrb),
                      [hg, hu, part, offs, plan.xcum, sg, su, rw, *out, e, m, r, part.shape[0], m * r],
                      dict(HAS_SG=has_s, HAS_SU=has_s, HAS_RW=rw is not None, BM=cfg.shared.bm, BR=br,
                           BLOCK_E=cfg.shared.block_e),
                      cfg.shared.warps_bwd_epi, 3, al, cap, dev)
    dsg = dsu = None
    if has_s and want_ds:
        dsg = torch.empty(e, r, device=dev, dtype=torch.float32)
        dsu = torch.empty(e, r, device=dev, dtype=torch.float32)
        launch_kernel("glu_bwd_sred", (e, nrb), [out.dsgp, out.dsup, offs, plan.xcum, dsg, dsu, e, r],
                      dict(BR=br), specs.SRED_WARPS, 1, False, cap, dev)
    drw = out.drw
    return out.dhg, out.dhu, dsg, dsu, (drw if drw.dim() == 1 else drw.sum(0))


def scale_grads(res: list, want: Sequence[bool], dsg: Optional[Tensor], dsu: Optional[Tensor], drw: Tensor,
                s_gate: Optional[Tensor], s_up: Optional[Tensor], row_weight: Optional[Tensor]) -> None:
    """``bwd_epilogue``'s d s_gate, d s_up, d row_weight (fp32) into ``res[4:7]`` in their inputs' dtypes, where
    ``want[4:7]`` asks for them (both families' backward)."""
    for i, g, t in ((4, dsg, s_gate), (5, dsu, s_up), (6, drw, row_weight)):
        if want[i]:
            res[i] = g if g.dtype == t.dtype else g.to(t.dtype)


def dx_from_rows(dx_rows: Tensor, gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor], offs: Tensor,
                 n_x: int, num_out_rows: Optional[int], saved: Optional[Sequence[Tensor]], cfg: Config, cap) -> Tensor:
    """dX from the row kernels' per-routed-row dX ``[M, d]``: summed into x's ``n_x`` rows through ``gather_idx``
    (the forward's CSR when it is the same one: ``dx_csr``), else the rows themselves with padding rows zeroed
    (both families' backward)."""
    if gather_idx is not None:
        return combine(dx_rows, gather_idx, offs, n_x, cfg, cap,
                       csr=dx_csr(saved, gather_idx, scatter_idx, n_x, num_out_rows))
    zero_tail(dx_rows, offs, offs.shape[0], cfg, cap)
    return dx_rows
