"""The kernel-spec machinery of every Triton kernel family, and the variant table of the kernels they share.

Importing this module imports neither Triton nor torch.

What every family's table (``triton_glu.specs``, ``triton_lowbit.specs``) takes from here:

* the tile tables per family, one record per arch (``SharedTiles``, ``GluTiles``, ``LowbitTiles`` in ``Config``;
  ``CONFIGS``: what the AOT build and the host code of every family read; ``TSCT_TRITON_GLU_CFG`` overrides them at
  run time, ``runtime.py``; docs/decisions/0023), the artifact arches, their PTX targets and
  shared-memory limits, the proxies (docs/decisions/0017);
* the specialization key format: a launch is identified by a *specialization key* (``spec_key``): the kernel name,
  the type of each parameter that the kernel reads under its constexpr flags (``*bf16``, ``*i64``, ``i32``...), the
  constexprs, num_warps, num_stages and whether the launch is *aligned*. An aligned launch guarantees that the
  parameters listed in ``KernelInfo.hinted`` are 16-byte aligned (pointers) or multiples of 16 (integers); it runs a
  cubin compiled with Triton's ``tt.divisibility=16`` on them (vector loads). Anything else runs the *generic*
  variant (no divisibility attributes; fewer tile choices). ``KernelInfo``, ``Spec``, ``make_spec``, ``is_used``,
  ``spec_key`` and ``key_file_stem`` serve every family's ``KERNELS`` table (``kernels=``);
* the host rules the shared kernels follow (``rank_block``, ``combine_tile``, the block constants) and their
  variants (``forward_specs``, ``bwd_dwd_epi_specs``, ``bwd_dw_specs``), which the "glu" family's
  ``enumerate_specs`` yields in its table: the AOT build compiles and indexes the shared kernels as family "glu".

Pruning (docs/decisions/0005-triton-aot.md): the host code normalises its inputs so that fewer variants exist, each
normalisation exact: scales and row weights are passed as fp32 (the kernels convert to fp32 anyway); a lone scale
gets a ones partner (x * 1.0 == x); int32 gather/scatter indices are widened to int64 (the kernels widen every index
anyway); BLOCK_E is 1024, BD is 64 and the combine/zero-tail column blocks come in two/one sizes whatever the shape.
One builder (``aot_build.py``) compiles every family into the same ``tsct/_aot/<arch>/index.json`` (kernel names
never collide).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from typing import Callable, ClassVar, Optional

TRITON_VERSION = "3.9.0"  # the pinned Triton of the AOT build (pyproject.toml [build-system].requires)

# ---- tile tables per family, chosen by arch --------------------------------------------------------
# Chosen from the sm_90 resource report of Triton 3.9 (registers, spills, shared memory; docs/performance.md) and the
# H200 timings. Field names are unique across the three tables, so one override string serves them all
# (``TSCT_TRITON_GLU_CFG="bn_bwd=64,warps_up_lb=4"``, ``Config.update``; an override that leaves the AOT table falls
# back to JIT).


class _Tiles:
    """What every tile table has: its 0/1 switch fields and power-of-two fields (``field_rule``)."""

    SWITCHES: ClassVar[frozenset] = frozenset()   # a kernel variant on or off
    POW2: ClassVar[frozenset] = frozenset()       # tile extents (``tl.arange`` sizes); so are the warps_* fields
    CHOICES: ClassVar[dict] = {}                  # fields with a few built values: name -> the values
    OFF_OR_COUNT: ClassVar[frozenset] = frozenset()  # a threshold that 0 turns off

    @classmethod
    def field_rule(cls, name: str) -> tuple[str, Callable[[int], bool]]:
        """(what the field ``name`` takes, in words; the test of a value): one of its built values (``CHOICES``), a
        0/1 switch, a power of two (tile extents, warps), else a count >= 1 (slices, blocks, stages, chunk rows, MiB,
        programs per SM)."""
        if name in cls.CHOICES:
            vals = cls.CHOICES[name]
            return "one of " + ", ".join(map(str, vals)), lambda v: v in vals
        if name in cls.SWITCHES:
            return "0 or 1", lambda v: v in (0, 1)
        if name in cls.OFF_OR_COUNT:
            return "0 (off) or an integer >= 1", lambda v: v >= 0
        if name in cls.POW2 or name.startswith("warps_"):
            return "a power of two", lambda v: v >= 1 and v & (v - 1) == 0
        return "an integer >= 1", lambda v: v >= 1


@dataclasses.dataclass(frozen=True)
class SharedTiles(_Tiles):
    """The tiles both families share: the row tile map, rank block, K step and expert scan of every GLU kernel, and
    the shared kernels' (combine, zero-tail, the backward's chunked dW reductions, slot sums and epilogue)."""

    POW2: ClassVar[frozenset] = frozenset({"bm", "br_max", "bk", "block_e", "bn_combine", "bn_dwd", "bd_dw"})
    # a register cap lets more CTAs share an SM: 80 at 8 warps is 3 per sm_90 SM (65,536 registers), 64 is 4
    CHOICES: ClassVar[dict] = {"regs_dwd": (0, 64, 72, 80, 96, 128)}

    bm: int = 64          # rows per tile (forward tile map and backward row loop); ~32 rows/expert at b1
    br_max: int = 64      # rank block of the down projection / backward main kernels
    bk: int = 64          # K step over d
    block_e: int = 1024   # experts scanned per step when a program finds its expert
    # combine_rows past 256 columns: BN columns x NB blocks per program (one program per target row up to 6144
    # columns: fewer dependent index loads; an H200 sweep, docs/performance.md)
    bn_combine: int = 2048
    nb_combine: int = 3
    warps_combine: int = 4
    warps_zero: int = 4
    warps_bwd_epi: int = 8
    # The chunked dW reductions of the backward (experts of more than one row tile, _kernels.py "backward"):
    # rows per chunk (a multiple of bm; runtime.chunk_size doubles it until the workspace of the worst case fits
    # ws_bwd_mib MiB), f slices and f step of glu_bwd_dwd, warps / stages of glu_bwd_dwd; d block, warps and stages of
    # glu_bwd_dw (dWg / dWu).
    chunk_bwd: int = 512
    ws_bwd_mib: int = 256
    fs_dwd: int = 16
    bn_dwd: int = 64
    warps_dwd: int = 4
    stages_dwd: int = 1
    regs_dwd: int = 0     # registers per thread of the K-major glu_bwd_dwd (PTX .maxnreg); 0: the compiler's choice
    bd_dw: int = 64
    warps_dw: int = 4
    stages_dw: int = 3
    waves_chunked: int = 4    # programs of the chunked kernels and slot sums per SM (they walk their work items)

    def dwd_maxnreg(self, wd_t: bool) -> int:
        """The register cap of a ``glu_bwd_dwd`` variant: ``regs_dwd`` for K-major w_down (``wd_t``), which fits
        80 registers without spills on sm_90a; none for row-major, whose BR 64 variant spills 112 bytes at 80."""
        return self.regs_dwd if wd_t else 0


@dataclasses.dataclass(frozen=True)
class GluTiles(_Tiles):
    """The bf16 / fp16 family's kernels (``triton_glu``: glu_down_fwd, glu_up_fwd, glu_bwd_dz, glu_bwd_dx_dw)."""

    SWITCHES: ClassVar[frozenset] = frozenset({"vec_up", "vec_dz", "vec_dz_t"})
    POW2: ClassVar[frozenset] = frozenset({"bn_up", "bn_bwd", "bd_bwd", "bn_up_vec", "bn_up_t"})

    bn_up: int = 128      # column block of the up projection (f = 5461: scalar loads, wide tiles cost registers)
    fsplit_up: int = 1    # column-block stripes per row tile (grid axis 1 of the up kernel)
    bn_bwd: int = 64      # f step of the backward dz kernel
    fs_bwd: int = 4       # f slices of the backward dz kernel (grid axis 2; partial sums reduced in order)
    bd_bwd: int = 64      # d block of the dX / dW kernel
    warps_down: int = 4
    warps_up: int = 8
    warps_bwd_dz: int = 4
    warps_bwd_dxdw: int = 4
    stages_down: int = 3
    stages_up: int = 3
    stages_bwd_dz: int = 1
    stages_bwd_dxdw: int = 3  # the NDB d loop is pipelined
    # VEC: w_down / dY rows read as 8-byte words and shifted in registers (_kernels._ld_words), aligned
    # launches only (docs/performance.md).
    vec_up: int = 1
    bn_up_vec: int = 64
    stages_up_vec: int = 1    # the VEC variants prefetch by hand (Triton's cp.async staging of the
    vec_dz: int = 0           # words picked a bank-conflicted shared layout: 4x slower)
    warps_dz_vec: int = 8     # two fp32 accumulators + the word pairs: ~240 registers (4 warps spill)
    stages_dz_vec: int = 1
    # K-major w_down (WD_T; decision 0012): aligned 16-byte tiles, pipelined by Triton
    bn_up_t: int = 256
    warps_up_t: int = 8
    stages_up_t: int = 4
    warps_dz_t: int = 4
    stages_dz_t: int = 1
    vec_dz_t: int = 0         # with WD_T: dY rows as shifted words (w_down tiles stay plain aligned loads)
    ndb_bwd: int = 8          # d blocks per program (row tile) of glu_bwd_dx_dw (the pipelined d loop)
    # f slices of glu_bwd_dz's CUDA stand-in where the dispatch takes it (tsct.dispatch.CUDA_KERNELS; partial sums
    # reduced in order by glu_bwd_epi)
    fs_dz_native: int = 2


@dataclasses.dataclass(frozen=True)
class LowbitTiles(_Tiles):
    """The low-bit family's kernels (``triton_lowbit``: lowbit_down_fwd, lowbit_up_fwd, lowbit_bwd_dz,
    lowbit_bwd_dx_dw; their decode makes other tiles win than the bf16 kernels'). The down and dz kernels run
    ``triton_lowbit.specs.WARPS_DECODE`` warps."""

    SWITCHES: ClassVar[frozenset] = frozenset({"dec16_up_lb", "planes_up_lb", "planes_down_lb"})
    POW2: ClassVar[frozenset] = frozenset({"bn_up_lb", "bn_dz_lb", "bd_dxdw_lb"})
    CHOICES: ClassVar[dict] = {"regs_dz_lb": (0, 80, 96, 128)}
    OFF_OR_COUNT: ClassVar[frozenset] = frozenset({"fuse_tiles_lb"})

    stages_down_lb: int = 4
    # lowbit_down_fwd decodes both factors in byte planes (triton_lowbit.specs.down_planes; the x tile split into
    # planes in registers): no shared-memory copy on sm_120, but 1.66x (NVFP4) / 1.12x (sign) slower on the H200 with
    # mma.sync (docs/performance.md), so off everywhere; sm_120's table ships it for an opt-in (OPT_IN_PLANES_DOWN)
    planes_down_lb: int = 0
    bn_up_lb: int = 128
    warps_up_lb: int = 4
    stages_up_lb: int = 3
    dec16_up_lb: int = 1      # lowbit_up_fwd decodes w_down straight to bf16 (triton_lowbit.specs.up_dec16)
    # lowbit_up_fwd decodes a packed w_down in byte planes (triton_lowbit.specs.up_planes): no shared-memory copy
    # of the decoded tile on sm_120; on sm_90a wgmma still copies the planes and sign was 9 % slower
    planes_up_lb: int = 0
    bn_dz_lb: int = 64        # f step of lowbit_bwd_dz
    fs_dz_lb: int = 4         # its f slices (partial sums reduced in order by glu_bwd_epi)
    stages_dz_lb: int = 1
    # lowbit_bwd_dz over all of f, running the GLU backward itself (no part buffer, no glu_bwd_epi), for an NVFP4
    # w_down when the pass has at least this many row tiles (estimated as max(E, cdiv(M, bm))); 0: never
    # (triton_lowbit.specs.fuse_dz_epi), at regs_dz_lb registers per thread (PTX .maxnreg; 0: the compiler's choice)
    fuse_tiles_lb: int = 0
    # ... and only from this rank (below it the part buffer fusing saves shrinks with r while its one f slice still
    # walks all of f: r 16 and 32 were slower fused on the H100, docs/performance.md)
    fuse_rank_lb: int = 64
    regs_dz_lb: int = 0
    bd_dxdw_lb: int = 64      # d block of lowbit_bwd_dx_dw
    stages_dxdw_lb: int = 1
    # d blocks per program (row tile) of lowbit_bwd_dx_dw; with a column-scaled w_gate or w_up (sign, FP8,
    # ternary): ndb_dxdw_sign_lb, whose programs walk their d blocks with the one-block body (no dh held across
    # them: 128 registers on sm_90a as at one block, where holding them took 161)
    ndb_dxdw_lb: int = 8
    ndb_dxdw_sign_lb: int = 1


_TABLES = ("shared", "glu", "lowbit")


@dataclasses.dataclass(frozen=True)
class Config:
    """The tile tables of one arch (frozen: ``CONFIGS`` is what the AOT build and the host code share): ``shared``
    (``SharedTiles``), ``glu`` (``GluTiles``: the bf16 family) and ``lowbit`` (``LowbitTiles``: the low-bit family).
    Which CUDA C++ kernels replace Triton ones is not a tile question: ``tsct.dispatch.CUDA_KERNELS``."""

    shared: SharedTiles = SharedTiles()
    glu: GluTiles = GluTiles()
    lowbit: LowbitTiles = LowbitTiles()

    def table_of(self, name: str) -> Optional[str]:
        """The table ("shared", "glu", "lowbit") with the field ``name``, None if none has it."""
        return next((t for t in _TABLES if name in {f.name for f in dataclasses.fields(getattr(self, t))}), None)

    def update(self, spec: str) -> "Config":
        """A copy with "name=int,name=int" applied to whichever table has each field (TSCT_TRITON_GLU_CFG's syntax;
        "" changes nothing).

        Raises ValueError naming the item when it is not NAME=INT, NAME is no table's field or INT is not a value of
        the field's kind (``field_rule``: a 0/1 switch, a power of two, or a count >= 1), when a field is given twice,
        and when the result's chunk_bwd is not a multiple of its bm."""
        changes: dict[str, dict[str, int]] = {t: {} for t in _TABLES}
        for item in filter(None, (t.strip() for t in spec.split(","))):
            key, sep, val = (t.strip() for t in item.partition("="))
            table = self.table_of(key)
            if table is None:
                if key.endswith(("_native", "_native_lb")) and key != "fs_dz_native":
                    raise ValueError(f"Triton GLU config override {item!r}: unknown field {key!r}: the CUDA kernels "
                                     "are rows of tsct.dispatch.CUDA_KERNELS, turned off with TSCT_CUDA_KERNELS "
                                     "(docs/decisions/0023)")
                names = sorted(f.name for t in _TABLES for f in dataclasses.fields(getattr(self, t)))
                raise ValueError(f"Triton GLU config override {item!r}: unknown field {key!r} "
                                 f"(fields: {', '.join(names)})")
            try:
                value = int(val) if sep else None
            except ValueError:
                value = None
            if value is None:
                raise ValueError(f"Triton GLU config override {item!r}: expected {key}=<integer>")
            rule, ok = type(getattr(self, table)).field_rule(key)
            if not ok(value):
                raise ValueError(f"Triton GLU config override {item!r}: {key} must be {rule}")
            if key in changes[table]:  # which one was meant is a guess
                raise ValueError(f"Triton GLU config override {spec!r}: {key} is given twice")
            changes[table][key] = value
        out = Config(**{t: dataclasses.replace(getattr(self, t), **changes[t]) for t in _TABLES})
        if out.shared.chunk_bwd % out.shared.bm:
            raise ValueError(f"Triton GLU config override {spec!r}: chunk_bwd ({out.shared.chunk_bwd}) must be a "
                             f"multiple of bm ({out.shared.bm})")
        return out


_TILE_CLASSES = (SharedTiles, GluTiles, LowbitTiles)
#: fields of any table that are 0/1 switches (a kernel variant on or off), and those that are tile extents
SWITCH_FIELDS = frozenset().union(*(c.SWITCHES for c in _TILE_CLASSES))
POW2_FIELDS = frozenset().union(*(c.POW2 for c in _TILE_CLASSES))


def field_rule(name: str) -> tuple[str, Callable[[int], bool]]:
    """``_Tiles.field_rule`` of the table that has the field ``name`` (the count rule for a name no table has)."""
    cls = next((c for c in _TILE_CLASSES if name in {f.name for f in dataclasses.fields(c)}), _Tiles)
    return cls.field_rule(name)


# Exact compute capability -> AOT artifact arch (the directory under tsct/_aot). sm_90a / sm_100a
# cubins load only on exactly 9.0 / 10.0; the plain sm_120 cubin loads on 12.0 and 12.1. An install without an
# arch's directory runs the Triton paths there through JIT (or falls back to bmm without Triton).
ARTIFACT_ARCH: dict[tuple[int, int], str] = {
    (9, 0): "sm_90a",
    (10, 0): "sm_100a",
    (12, 0): "sm_120",
    (12, 1): "sm_120",
}
# artifact arch -> Triton's GPUTarget capability (the sm_120 build patches Triton's "sm_120a" to "sm_120").
TARGET_CAPABILITY: dict[str, int] = {"sm_90a": 90, "sm_100a": 100, "sm_120": 120}
# artifact arch -> (GPUTarget capability, the PTX target the build makes Triton emit) of this family's
# cubins (a family's specs module may emit another target for the same artifact arch).
PTX_ARCH: dict[str, tuple[int, str]] = {"sm_90a": (90, "sm_90a"), "sm_100a": (100, "sm_100a"),
                                        "sm_120": (120, "sm_120")}
# Shared memory a block may use (opt-in maximum), bytes: the build fails a variant that needs more.
MAX_SHARED: dict[str, int] = {"sm_90a": 232448, "sm_100a": 232448, "sm_120": 101376}

# sm_90a / sm_100a: the H200-tuned tiles. sm_120 (RTX 5060 Ti: 36 SMs, 99 KB shared memory per block,
# 448 GB/s): the same row tiles (the ~1 tile per expert at b1 gives >= 1000 programs, plenty for 36
# SMs) with two pipeline stages in the d loop so the down kernel stays well under 99 KB and two CTAs
# fit per SM. Not measured on an sm_120 card (design.md section 6).
CONFIGS: dict[str, Config] = {
    # the chunked dW kernels: 16 programs per SM and 8-warp glu_bwd_dwd (H200, Zipf 1.2 / 1.5, T 65536, E 256:
    # 3-8 % less forward+backward than 4 and 4); the K-major glu_bwd_dwd at 80 registers: 3 CTAs per SM (H200, bf16
    # K-major forward+backward 1-4 % less; docs/performance.md);
    # NVFP4's lowbit_bwd_dz over all of f, running the GLU backward itself, at 80 registers (3 CTAs per SM) where
    # the pass has >= 768 row tiles and r >= 64 (H100, NVFP4 forward+backward: b1 -2 %, E 4096 -3 %; E 256's 512
    # tiles +3 %, r 16 / 32 +3 % / +1 % and sign +2-7 % fused, so none of them is); sign's lowbit_bwd_dx_dw over 4 d
    # blocks per row tile (H100, sign forward+backward: b1 -4 %, T 65536 -6 %, E 16384 -5 %; docs/performance.md)
    "sm_90a": Config(shared=SharedTiles(waves_chunked=16, warps_dwd=8, regs_dwd=80),
                     lowbit=LowbitTiles(fuse_tiles_lb=768, regs_dz_lb=80, ndb_dxdw_sign_lb=4)),
    "sm_100a": Config(),
    # ~99 KB of shared memory per block: fewer stages. Every field an H200 sweep changed
    # stays at its previous value here (nothing has been timed on an sm_120 card; docs/performance.md);
    # 16 GB of device memory: a smaller bound on the backward's reduction workspace
    "sm_120": Config(shared=SharedTiles(ws_bwd_mib=64, stages_dw=1),
                     glu=GluTiles(stages_down=2, stages_up=2, bn_up_t=128, warps_up_t=4, stages_up_t=2, stages_dz_t=2,
                                  fs_bwd=8, stages_bwd_dxdw=1),
                     lowbit=LowbitTiles(stages_down_lb=2, warps_up_lb=8, stages_up_lb=2, planes_up_lb=1, fs_dz_lb=8,
                                        stages_dxdw_lb=1, ndb_dxdw_lb=1)),
}
DEFAULT_ARCH_CONFIG = "sm_90a"  # JIT on any other arch (sm_80, ...) uses these tiles
# The arches a default build compiles (CMake TSCT_TRITON_AOT_ARCHS, aot_build.py --archs): not sm_100a, whose Triton
# kernels never ran (10.0 JITs with sm_100a's tiles; ``TSCT_TRITON_AOT_ARCHS=sm_90a;sm_100a;sm_120`` still builds
# them: docs/decisions/0005, the build's cost)
RELEASE_ARCHS: tuple[str, ...] = ("sm_90a", "sm_120")


@dataclasses.dataclass(frozen=True)
class Proxy:
    """An artifact arch that runs another arch's kernels on a GPU we have (docs/decisions/0017).

    The build compiles ``of``'s variant table (same keys: tiles, warps, stages) from the same TTGIR (Triton's
    target capability of ``of``) and checks each variant against ``of``'s shared-memory limit, but lets LLVM
    and ptxas emit ``ptx`` instead, so the cubins load on ``capability``. At run time an install whose
    ``<proxy>/index.json`` says ``"proxy"`` serves that capability in place of its release arch, with
    ``of``'s tile config (so the dispatch takes the Triton kernels ``of`` runs, never that GPU's CUDA ones).
    A development build (``TSCT_TRITON_AOT_ARCHS=<proxy>``), never a release: the probe and the artifact
    check say "proxy"."""

    of: str                        # the arch whose table and TTGIR it compiles
    ptx: str                       # the PTX target and ptxas arch it emits instead
    capability: tuple[int, int]    # the GPU that loads it
    families: tuple[str, ...]      # the kernel families (aot_build.FAMILIES) it can hold


# sm_120 on an H200: sm_120's Triton kernels are bf16 mma.sync (HMMA.16816), cp.async and ldmatrix, all of
# which sm_90 executes; plain sm_90 (not sm_90a) has no wgmma, so ptxas cannot emit any. W4A4 is left out:
# its tl.dot_scaled is sm_120's block-scaled OMMA, which sm_90 lacks.
PROXIES: dict[str, Proxy] = {
    "sm_120_proxy_sm90": Proxy(of="sm_120", ptx="sm_90", capability=(9, 0), families=("glu", "lowbit")),
}


def table_arch(arch: Optional[str]) -> Optional[str]:
    """The arch whose variant table and tile config an artifact arch uses: ``Proxy.of`` for a proxy, else
    ``arch`` itself (None stays None)."""
    p = PROXIES.get(arch) if arch is not None else None
    return p.of if p is not None else arch


def config_for(capability: Optional[tuple[int, int]]) -> Config:
    """The release tile config of a capability (JIT-only arches get the sm_90a tiles; the host code asks
    ``tsct.kernels.aot.artifact_arch`` instead, which also knows a proxy install)."""
    arch = ARTIFACT_ARCH.get(tuple(capability)) if capability is not None else None
    return CONFIGS[arch or DEFAULT_ARCH_CONFIG]


# ---- kernels: parameters, which ones each flag enables, which ones an aligned launch hints --------

@dataclasses.dataclass(frozen=True)
class KernelInfo:
    params: tuple[str, ...]          # runtime parameters in order (constexprs excluded)
    constexprs: tuple[str, ...]
    ints: tuple[str, ...]            # the integer parameters (all i32)
    used_if: dict                    # pointer param -> constexpr flag (or flags, all True; "!F": F False) that
                                     # makes it read
    hinted: tuple[str, ...]          # params with tt.divisibility=16 in an aligned launch


#: the kernels every family launches (``_kernels.py``), in the order of the glu family's table, which holds them
KERNELS: dict[str, KernelInfo] = {
    "combine_rows": KernelInfo(
        params=("src_ptr", "order_ptr", "ptr_ptr", "out_ptr", "offs_ptr", "E", "ncols", "ld_src"),
        constexprs=("SRC8", "BN", "NB"),
        ints=("E", "ncols", "ld_src"),
        used_if={},
        hinted=("src_ptr", "out_ptr"),
    ),
    "zero_tail_rows": KernelInfo(
        params=("out_ptr", "offs_ptr", "E", "M", "ncols"),
        constexprs=("BM", "BN"),
        ints=("E", "M", "ncols"),
        used_if={},
        hinted=("out_ptr",),
    ),
    "tile_cum": KernelInfo(
        params=("offs_ptr", "cum_ptr", "E", "t0_ptr", "t1_ptr", "t2_ptr", "M", "W01", "W2"),
        constexprs=("BM", "BLOCK", "ZERO", "ZBLOCK"),
        ints=("E", "M", "W01", "W2"),
        used_if={"t0_ptr": "ZERO", "t1_ptr": "ZERO", "t2_ptr": "ZERO"},
        hinted=(),
    ),
    "csr_keys": KernelInfo(
        params=("idx_ptr", "offs_ptr", "key_ptr", "E", "M", "n_out"),
        constexprs=("BLOCK",),
        ints=("E", "M", "n_out"),
        used_if={},
        hinted=(),
    ),
    "route_rank": KernelInfo(
        params=("ids_ptr", "srt_ptr", "rank_ptr", "hist_ptr", "crank_ptr", "M", "E", "P", "K"),
        constexprs=("B", "EBLK"),
        ints=("M", "E", "P", "K"),
        used_if={},
        hinted=(),
    ),
    "route_place": KernelInfo(
        params=("srt_ptr", "rank_ptr", "hist_ptr", "cum_ptr", "crank_ptr", "order_ptr", "token_ptr", "offs_ptr",
                "w_ptr", "rw_ptr", "rows_ptr", "ptr_ptr", "M", "E", "P", "K"),
        constexprs=("HAS_W", "B"),
        ints=("M", "E", "P", "K"),
        used_if={"w_ptr": "HAS_W", "rw_ptr": "HAS_W"},
        hinted=(),
    ),
    "bwd_maps": KernelInfo(
        params=("offs_ptr", "maps_ptr", "E", "CH"),
        constexprs=("BM", "BLOCK", "CARRY"),
        ints=("E", "CH"),
        used_if={},
        hinted=(),
    ),
    "glu_bwd_dwd": KernelInfo(
        params=("dy_ptr", "sidx_ptr", "offs_ptr", "maps_ptr", "zw_ptr", "dwd_ptr", "ws_ptr", "E", "r", "f", "f_slice",
                "n_fs", "CH"),
        constexprs=("HAS_SCATTER", "WD_T", "BM", "BR", "BN", "BLOCK_E"),
        ints=("E", "r", "f", "f_slice", "n_fs", "CH"),
        used_if={"sidx_ptr": "HAS_SCATTER"},
        hinted=("dy_ptr", "zw_ptr", "dwd_ptr", "ws_ptr", "r"),
    ),
    "bwd_slot_reduce": KernelInfo(
        params=("ws_ptr", "maps_ptr", "out_ptr", "E", "S", "NCB"),
        constexprs=("BLOCK", "BLOCK_E"),
        ints=("E", "S", "NCB"),
        used_if={},
        hinted=("ws_ptr", "out_ptr", "S"),
    ),
    "glu_bwd_epi": KernelInfo(
        params=("hg_ptr", "hu_ptr", "part_ptr", "offs_ptr", "xcum_ptr", "sg_ptr", "su_ptr", "rw_ptr", "dhg_ptr",
                "dhu_ptr", "dsgp_ptr", "dsup_ptr", "drw_ptr", "E", "M", "r", "n_fs", "part_stride"),
        constexprs=("HAS_SG", "HAS_SU", "HAS_RW", "BM", "BR", "BLOCK_E"),
        ints=("E", "M", "r", "n_fs", "part_stride"),
        used_if={"sg_ptr": "HAS_SG", "su_ptr": "HAS_SU", "rw_ptr": "HAS_RW", "dsgp_ptr": "HAS_SG",
                 "dsup_ptr": "HAS_SG"},
        hinted=("hg_ptr", "hu_ptr", "part_ptr", "dhg_ptr", "dhu_ptr", "r", "part_stride"),
    ),
    "glu_bwd_sred": KernelInfo(
        params=("dsgp_ptr", "dsup_ptr", "offs_ptr", "xcum_ptr", "dsg_ptr", "dsu_ptr", "E", "r"),
        constexprs=("BR",),
        ints=("E", "r"),
        used_if={},
        hinted=(),
    ),
    "glu_bwd_dw": KernelInfo(
        params=("x_ptr", "gidx_ptr", "offs_ptr", "maps_ptr", "dhg_ptr", "dhu_ptr", "dwg_ptr", "dwu_ptr", "wsg_ptr",
                "wsu_ptr", "E", "d", "r", "stride_x", "CH"),
        constexprs=("HAS_GATHER", "BM", "BD", "BR", "BLOCK_E"),
        ints=("E", "d", "r", "stride_x", "CH"),
        used_if={"gidx_ptr": "HAS_GATHER"},
        hinted=("x_ptr", "dhg_ptr", "dhu_ptr", "dwg_ptr", "dwu_ptr", "wsg_ptr", "wsu_ptr", "d", "r", "stride_x"),
    ),
}

# Triton 3.x kernels take two trailing pointer parameters after the user's: the global scratch and
# the profile scratch (both NULL when their metadata sizes are 0, which the build checks).
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")
UNUSED = "*i8"  # the type recorded for a pointer parameter the flags leave unread


def is_used(kernel: str, param: str, constexprs: dict, kernels: Optional[dict] = None) -> bool:
    """Whether ``param`` is read under ``constexprs`` (``kernels``: the family's table, default this one)."""
    flag = (KERNELS if kernels is None else kernels)[kernel].used_if.get(param)
    if flag is None:
        return True
    flags = (flag,) if isinstance(flag, str) else flag
    return all(not constexprs[f[1:]] if f.startswith("!") else bool(constexprs[f]) for f in flags)


_BOOL_PREFIXES = ("HAS_", "DO_", "BWD", "SINGLE_")  # constexprs passed to Triton as bool


def triton_constexprs(constexprs: dict) -> dict:
    """A variant's constexprs as the AOT build hands them to Triton: flags (``HAS_*``, ``DO_*``, ``BWD``,
    ``SINGLE_*``) as bool, the rest as they are (the values are part of Triton's specialization)."""
    return {k: (bool(v) if k.startswith(_BOOL_PREFIXES) else v) for k, v in constexprs.items()}


def hinted_params(spec, kernels: dict) -> list[str]:
    """The parameters of the table entry ``spec`` that get the 16-byte divisibility hint: none for an unaligned
    variant, else those of its kernel's ``hinted`` (``kernels``: the family's table) that the variant reads."""
    if not spec.aligned:
        return []
    consts = dict(spec.constexprs)
    return [p for p in kernels[spec.kernel].hinted if is_used(spec.kernel, p, consts, kernels)]


def compile_variant(fn, spec, hinted, cap: int):
    """``triton.compile`` of the table entry ``spec`` of the jit function ``fn`` for compute capability ``cap``, as the
    AOT build compiles every variant: ``spec``'s types, warps, stages and register cap, the tt.divisibility hint (16)
    on each parameter in ``hinted`` (``hinted_params``), the constexprs as ``triton_constexprs`` gives them, fp fusion
    on. Imports Triton."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    consts = dict(spec.constexprs)
    types = dict(spec.types)
    signature = {a: ("constexpr" if a in consts else types[a]) for a in fn.arg_names}
    attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in hinted}
    src = ASTSource(fn=fn, signature=signature, constexprs=triton_constexprs(consts), attrs=attrs)
    return compile(src, target=GPUTarget("cuda", cap, 32),
                   options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages, num_ctas=1, enable_fp_fusion=True,
                                **({"maxnreg": spec.maxnreg} if spec.maxnreg else {})))


def _launch_part(num_warps: int, num_stages: int, maxnreg: int) -> str:
    """The key's compile options: ``w8s1``, and ``r80`` after it for a register cap (PTX .maxnreg; none: no part,
    so the keys of uncapped variants are as they always were)."""
    return f"w{num_warps}s{num_stages}" + (f"r{maxnreg}" if maxnreg else "")


def spec_key(kernel: str, types: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: bool,
             kernels: Optional[dict] = None, maxnreg: int = 0) -> str:
    """The canonical specialization key. ``types``: param -> Triton type string (``*bf16``, ``i32``);
    unread pointer params are recorded as ``*i8`` whatever was passed. ``maxnreg``: the register cap (0: none)."""
    info = (KERNELS if kernels is None else kernels)[kernel]
    t = ",".join(f"{p}:{types[p] if is_used(kernel, p, constexprs, kernels) else UNUSED}" for p in info.params)
    c = ",".join(f"{k}={int(constexprs[k])}" for k in info.constexprs)
    return f"{kernel}|{t}|{c}|{_launch_part(num_warps, num_stages, maxnreg)}|{'a16' if aligned else 'gen'}"


def key_file_stem(key: str) -> str:
    return key.split("|", 1)[0] + "_" + hashlib.sha256(key.encode()).hexdigest()[:16]



# ---- the host-side rules the shared kernels follow (shape -> constexprs) ------------------------------

def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def rank_block(cfg: Config, r: int, aligned: bool) -> int:
    """BR: 16/32/64 by r for aligned launches, 64 for generic ones (fewer variants; r < 64 is masked)."""
    if not aligned:
        return cfg.shared.br_max
    return max(16, min(cfg.shared.br_max, next_pow2(r)))


def rank_blocks(cfg: Config, aligned: bool) -> list[int]:
    """Every BR ``rank_block`` gives aligned (or generic) launches, ascending."""
    return sorted({rank_block(cfg, r, aligned) for r in (1, 16, 17, 32, 33, 64, 4096)})


def combine_tile(cfg: Config, ncols: int) -> tuple[int, int, int]:
    """(BN, NB, num_warps) of combine_rows: up to 256 columns one block of 256 (one warp), else the config's wide
    tile (program (t, pn) sums columns [pn * BN * NB, (pn + 1) * BN * NB) of target t)."""
    if ncols <= 256:
        return 256, 1, 1
    return cfg.shared.bn_combine, cfg.shared.nb_combine, cfg.shared.warps_combine


ZERO_TAIL_BM, ZERO_TAIL_BN = 32, 256
TILE_CUM_BLOCK, CSR_KEYS_BLOCK = 1024, 1024
MAPS_CARRY_BLOCK = 4096  # bwd_maps: experts per step of a program's carry (the sum over the experts before it)
# bwd_slot_reduce: elements per step, most column groups per slot, warps; glu_bwd_sred's warps
SLOT_REDUCE_BLOCK, SLOT_REDUCE_GROUPS, SLOT_REDUCE_WARPS, SRED_WARPS = 1024, 64, 4, 2
# tsct.ops.sort_by_expert: rows per chunk (one program each; (E + 2) * ROUTE_B must fit int32: ops/routing.py checks
# it against MAX_EXPERTS at import),
# experts per step of route_rank's zeroing loop, warps of both kernels
ROUTE_B, ROUTE_EBLK, ROUTE_WARPS = 512, 1024, 8
TILE_CUM_ZBLOCK, TILE_CUM_ZPROGRAMS = 2048, 256  # tile_cum's tail zeroing: words per step, most programs

# Triton type strings of torch dtypes (by name, so this module needs no torch).
DTYPE_TYPES = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "int16": "*i16", "int32": "*i32",
               "int64": "*i64", "uint8": "*u8", "int8": "*i8", "float8_e4m3fn": "*fp8e4nv"}

@dataclasses.dataclass(frozen=True)
class Spec:
    kernel: str
    types: tuple            # ((param, type), ...) for the runtime params
    constexprs: tuple       # ((name, value), ...)
    num_warps: int
    num_stages: int
    aligned: bool
    maxnreg: int = 0        # registers per thread (PTX .maxnreg); 0: the compiler's choice

    @property
    def key(self) -> str:
        """``spec_key`` of this specialization: ``types`` / ``constexprs`` are already canonical (table
        order, unread pointers ``*i8``), so the key needs no table (it serves every family)."""
        t = ",".join(f"{p}:{ty}" for p, ty in self.types)
        c = ",".join(f"{k}={int(v)}" for k, v in self.constexprs)
        launch = _launch_part(self.num_warps, self.num_stages, self.maxnreg)
        return f"{self.kernel}|{t}|{c}|{launch}|{'a16' if self.aligned else 'gen'}"


def make_spec(kernel: str, types: dict, consts: dict, warps: int, stages: int, aligned: bool,
              kernels: Optional[dict] = None, maxnreg: int = 0) -> Spec:
    info = (KERNELS if kernels is None else kernels)[kernel]
    full = {p: (types.get(p, "i32") if p in info.ints else types[p]) for p in info.params}
    for p in info.params:  # unread pointers are canonical
        if p not in info.ints and not is_used(kernel, p, consts, kernels):
            full[p] = UNUSED
    return Spec(kernel, tuple(full.items()), tuple((k, int(consts[k])) for k in info.constexprs),
                warps, stages, aligned, maxnreg)


#: the activation dtypes (x, the dense factors, y) with cubins: bf16. fp16 calls run the same kernels through Triton
IDX = (None, "i64")             # gather / scatter index: absent or int64 (the host widens int32 indices)


def forward_specs(cfg: Config, D: str, aligned: bool, once: bool) -> list[Spec]:
    """The shared forward-side kernels' specializations for activations of Triton type ``D``: on aligned launches
    ``combine_rows`` and ``zero_tail_rows`` (they only ever see fresh buffers); ``once`` (one dtype per arch, aligned)
    the dtype-free ``tile_cum``, ``csr_keys`` and the router's sort (``route_rank``, ``route_place``: any index and
    weight dtype)."""
    sh = cfg.shared
    out = []
    if aligned:  # combine / zero-tail only ever see fresh (aligned) buffers
        for ncols, src8 in itertools.product((1, 257), (False, True)):
            bn, nb, warps = combine_tile(cfg, ncols)
            types = dict(src_ptr=D, order_ptr="*i64", ptr_ptr="*i64", out_ptr=D, offs_ptr="*i32")
            out.append(make_spec("combine_rows", types, dict(SRC8=src8, BN=bn, NB=nb), warps, 3, True))
        out.append(make_spec("zero_tail_rows", dict(out_ptr=D, offs_ptr="*i32"),
                             dict(BM=ZERO_TAIL_BM, BN=ZERO_TAIL_BN), sh.warps_zero, 3, True))
    if once:  # dtype-free helpers: once per arch
        for zero in (False, True):  # ZERO: a saving forward's tails (runtime.tile_cum)
            out.append(make_spec("tile_cum", dict(offs_ptr="*i32", cum_ptr="*i32", t0_ptr="*i16",
                                                  t1_ptr="*i16", t2_ptr="*i16"),
                                 dict(BM=sh.bm, BLOCK=TILE_CUM_BLOCK, ZERO=zero, ZBLOCK=TILE_CUM_ZBLOCK),
                                 4, 1, False))
        for it, kt in itertools.product(("*i32", "*i64"), ("*i16", "*i32")):
            out.append(make_spec("csr_keys", dict(idx_ptr=it, offs_ptr="*i32", key_ptr=kt),
                                 dict(BLOCK=CSR_KEYS_BLOCK), 4, 1, False))
        for it in ("*i32", "*i64"):
            out.append(make_spec("route_rank", dict(ids_ptr=it, srt_ptr="*i32", rank_ptr="*i32", hist_ptr="*i32",
                                                    crank_ptr="*i32"),
                                 dict(B=ROUTE_B, EBLK=ROUTE_EBLK), ROUTE_WARPS, 1, False))
        for wt in (None, "*bf16", "*fp16", "*fp32"):  # router weights gathered in the same launch
            out.append(make_spec("route_place", dict(srt_ptr="*i32", rank_ptr="*i32", hist_ptr="*i32",
                                                     cum_ptr="*i32", crank_ptr="*i32", order_ptr="*i64",
                                                     token_ptr="*i64", offs_ptr="*i32", w_ptr=wt or UNUSED,
                                                     rw_ptr="*fp32" if wt else UNUSED, rows_ptr="*i64",
                                                     ptr_ptr="*i64"),
                                 dict(HAS_W=wt is not None, B=ROUTE_B), ROUTE_WARPS, 1, False))
    return out


def bwd_dwd_epi_specs(cfg: Config, D: str, aligned: bool, brs: list[int]) -> list[Spec]:
    """The chunked dWd of the experts of more than one row tile (``glu_bwd_dwd``; a K-major dWd on aligned launches
    only) and the weight-free GLU backward on the row tiles (``glu_bwd_epi``), for activations of Triton type ``D``
    and the rank blocks ``brs``."""
    sh = cfg.shared
    out = []
    wd_ts = (False, True) if aligned else (False,)  # K-major w_down: aligned launches only
    for sc, br, wd_t in itertools.product(IDX, brs, wd_ts):
        types = dict(dy_ptr=D, sidx_ptr=f"*{sc}" if sc else UNUSED, offs_ptr="*i32", maps_ptr="*i32", zw_ptr=D,
                     dwd_ptr=D, ws_ptr="*fp32")
        consts = dict(HAS_SCATTER=sc is not None, WD_T=wd_t, BM=sh.bm, BR=br, BN=sh.bn_dwd, BLOCK_E=sh.block_e)
        out.append(make_spec("glu_bwd_dwd", types, consts, sh.warps_dwd, sh.stages_dwd, aligned,
                             maxnreg=sh.dwd_maxnreg(wd_t)))
    # the epilogue reads [M, r] buffers only: r decides its alignment (runtime.bwd_epilogue), every BR of both rules
    scale_types = sorted({None, "*fp32", D}, key=str)  # s_gate / s_up: none, fp32 or x's dtype (runtime.scales_in)
    for st, rw, br in itertools.product(scale_types, (False, True), brs):
        s = st is not None
        types = dict(hg_ptr="*fp32", hu_ptr="*fp32", part_ptr="*fp32", offs_ptr="*i32", xcum_ptr="*i32",
                     sg_ptr=st or UNUSED, su_ptr=st or UNUSED, rw_ptr="*fp32", dhg_ptr=D, dhu_ptr=D,
                     dsgp_ptr="*fp32", dsup_ptr="*fp32", drw_ptr="*fp32")
        consts = dict(HAS_SG=s, HAS_SU=s, HAS_RW=rw, BM=sh.bm, BR=br, BLOCK_E=sh.block_e)
        # runtime.bwd_epilogue launches the epilogue with Triton's default num_stages (3)
        out.append(make_spec("glu_bwd_epi", types, consts, sh.warps_bwd_epi, 3, aligned))
    return out


def bwd_dw_specs(cfg: Config, D: str, aligned: bool, brs: list[int], once: bool) -> list[Spec]:
    """The chunked dWg / dWu (``glu_bwd_dw``) for activations of Triton type ``D`` and the rank blocks ``brs``; on
    aligned launches the slot sums (``bwd_slot_reduce``, both variants); ``once`` (one dtype per arch, aligned) the
    backward's maps (``bwd_maps``) and the scale sums (``glu_bwd_sred``) of every rank block."""
    sh = cfg.shared
    out = []
    for g, br in itertools.product(IDX, brs):
        types = dict(x_ptr=D, gidx_ptr=f"*{g}" if g else UNUSED, offs_ptr="*i32", maps_ptr="*i32", dhg_ptr=D,
                     dhu_ptr=D, dwg_ptr=D, dwu_ptr=D, wsg_ptr="*fp32", wsu_ptr="*fp32")
        consts = dict(HAS_GATHER=g is not None, BM=sh.bm, BD=sh.bd_dw, BR=br, BLOCK_E=sh.block_e)
        out.append(make_spec("glu_bwd_dw", types, consts, sh.warps_dw, sh.stages_dw, aligned))
    if aligned:  # the slot sum runs on the fresh workspace and gradients (aligned; a generic variant when not)
        for a in (True, False):
            out.append(make_spec("bwd_slot_reduce", dict(ws_ptr="*fp32", maps_ptr="*i32", out_ptr=D),
                                 dict(BLOCK=SLOT_REDUCE_BLOCK, BLOCK_E=sh.block_e), SLOT_REDUCE_WARPS, 1, a))
    if once:  # dtype-free: once per arch
        out.append(make_spec("bwd_maps", dict(offs_ptr="*i32", maps_ptr="*i32"),
                             dict(BM=sh.bm, BLOCK=TILE_CUM_BLOCK, CARRY=MAPS_CARRY_BLOCK), 4, 1, False))
        for br in sorted(set(rank_blocks(cfg, True)) | set(rank_blocks(cfg, False))):
            out.append(make_spec("glu_bwd_sred", dict(dsgp_ptr="*fp32", dsup_ptr="*fp32", offs_ptr="*i32",
                                                      xcum_ptr="*i32", dsg_ptr="*fp32", dsu_ptr="*fp32"),
                                 dict(BR=br), SRED_WARPS, 1, False))
    return out
