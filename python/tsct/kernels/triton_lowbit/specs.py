"""The variant table of the low-bit kernels (``_kernels.py``): ONE table for the host launches (``glu.py``)
and the AOT build (``triton_common/aot_build.py``, family "lowbit"). Only what differs from the bf16 family
lives here (kernels, which pointer each format flag enables, the PTX targets, the pruned variant set);
the key format, ``Spec``, ``KernelInfo``, the type names, the tile configs and the arch limits are
``triton_common.specs``'s, so the run-time lookup is ``tsct.kernels.aot.kernel(arch, key)`` in the same
``tsct/_aot/<arch>/index.json`` as the other families (kernel names never collide).

Importing this module imports neither Triton nor torch (the AOT build loads it by path after
registering ``triton_common/specs.py`` as ``tsct.kernels.triton_common.specs``).

Which variants ship (per arch; everything else runs through Triton JIT when it is importable, else the
launch raises naming the missing key):
  * activations bf16 only (fp16 activations: JIT);
  * factor formats: uniform NVFP4 (FMT 1,1,1), uniform sign (2,2,2) and the GPU tests' mix
    NVFP4 gate / sign up / NVFP4 down (1,2,1); fp8 and ternary (``tsct.dispatch.FORCED_ONLY``: never taken by
    ``auto``), rank-1 ternary and every other mix (dense + packed...): JIT;
  * every flag combination the host code uses (gather/scatter absent or int64, scales, row weight,
    the backward's gradient subsets, Y_PAD of the up kernel = scatter given or f % 8 == 0), aligned and generic
    launches;
    generic ones only for the triples that can launch them (``always_aligned``: an NVFP4 w_down with an NVFP4
    w_gate or w_up makes d and r multiples of 16, and the host code copies a tensor at an odd offset).
Host rules that keep the table small (exact): the rank block of the four low-bit kernels is always
``SharedTiles.br_max`` (64; masked below), the up-projection does the whole rank in one K step when the
launch is aligned and r <= 128 (BK 16/32/64/128) and loops BK 64 otherwise (as the bf16 family);
scales / row weights fp32 and int64 indices as in ``triton_common.runtime``. The weight-free kernels the
low-bit host launches (``glu_bwd_epi``, the chunked dW kernels, ``combine_rows``, ``zero_tail_rows``, the tile map)
are ``triton_common``'s, in the glu family's table (``triton_glu.specs``).

Arches: sm_90a, sm_100a (built only when asked) and plain sm_120 like the bf16 family (bf16 ``mma.sync`` / wgmma on
decoded tiles needs no block-scaled MMA; a plain sm_120 cubin loads on 12.0 and 12.1).
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from tsct.kernels.triton_common.specs import (  # noqa: F401  (re-exported: one format for every family)
    CONFIGS, DTYPE_TYPES, MAX_SHARED, SCRATCH_PARAMS, TRITON_VERSION, UNUSED, Config, KernelInfo, Spec, key_file_stem,
    next_pow2,
)
from tsct.kernels.triton_common.specs import is_used as _base_is_used, make_spec as _base_spec
from tsct.kernels.triton_common.specs import spec_key as _base_spec_key

# artifact arch (directory under tsct/_aot) -> (GPUTarget capability, the ptxas arch name to emit)
PTX_ARCH: dict[str, tuple[int, str]] = {"sm_90a": (90, "sm_90a"), "sm_100a": (100, "sm_100a"),
                                        "sm_120": (120, "sm_120")}
AOT_ARCHS: tuple[str, ...] = ("sm_90a", "sm_100a", "sm_120")

# factor formats (the kernels' FMT constexprs; _kernels.py): TERNARY is the absmean scaling, TERNARY_R1 the rank-1 one
DENSE, NVFP4, SIGN, FP8, TERNARY, TERNARY_R1 = 0, 1, 2, 3, 4, 5
#: the formats the byte-plane variants decode (``_kernels._w_plane``)
PLANE_FORMATS = (NVFP4, SIGN)
#: format triples (gate, up, down) with cubins. The forced-only formats (fp8, ternary: ``tsct.dispatch.FORCED_ONLY``)
#: have none: ``impl="triton-lowbit"`` runs them through Triton JIT (docs/decisions/0005)
AOT_FORMATS: tuple[tuple[int, int, int], ...] = ((NVFP4, NVFP4, NVFP4), (SIGN, SIGN, SIGN), (NVFP4, SIGN, NVFP4))
AOT_DTYPES: tuple[str, ...] = ("bf16",)
#: the K multiple each format's container guarantees (``tsct.quant``): NVFP4 16, sign 8, ternary 4, FP8 and dense 1
K_MULTIPLE: dict[int, int] = {DENSE: 1, NVFP4: 16, SIGN: 8, FP8: 1, TERNARY: 4, TERNARY_R1: 4}


def always_aligned(fmt_g: int, fmt_u: int, fmt_d: int) -> bool:
    """Every launch of this format triple is aligned, so its generic variants are never launched: d (the K of w_gate
    and w_up) and r (the K of w_down) are multiples of 16 by the formats, and ``glu._dense16`` gives the kernels
    contiguous, 16-byte aligned x, grad_out and factor storage (a copy where the caller's is a view at an odd
    offset). True for an NVFP4 w_down with an NVFP4 w_gate or w_up."""
    return math.lcm(K_MULTIPLE[fmt_g], K_MULTIPLE[fmt_u]) % 16 == 0 and K_MULTIPLE[fmt_d] % 16 == 0


# Warps of the kernels that decode: with 4 warps the decode temporaries push the sm_90 down / dz / dx
# kernels to 255 registers plus stack spills (Triton 3.9 + ptxas, cuobjdump); with 8 they fit.
WARPS_DECODE = 8

KERNELS: dict[str, KernelInfo] = {
    "lowbit_down_fwd": KernelInfo(
        params=("x_ptr", "gidx_ptr", "offs_ptr", "cum_ptr", "g0", "g1", "g2", "u0", "u1", "u2", "sg_ptr", "su_ptr",
                "z_ptr", "hg_ptr", "hu_ptr", "rw_ptr", "E", "d", "r", "stride_x"),
        constexprs=("FMT_G", "FMT_U", "HAS_GATHER", "HAS_SG", "HAS_SU", "HAS_RW", "BWD", "PLANES", "BM", "BR", "BK",
                    "BLOCK_E"),
        ints=("E", "d", "r", "stride_x"),
        used_if={"gidx_ptr": "HAS_GATHER", "g1": "FMT_G", "g2": "FMT_G", "u1": "FMT_U", "u2": "FMT_U",
                 "sg_ptr": "HAS_SG", "su_ptr": "HAS_SU", "hg_ptr": "BWD", "hu_ptr": "BWD", "rw_ptr": ("BWD", "HAS_RW")},
        hinted=("x_ptr", "g0", "u0", "z_ptr", "hg_ptr", "hu_ptr", "d", "r", "stride_x"),
    ),
    "lowbit_up_fwd": KernelInfo(
        params=("z_ptr", "offs_ptr", "cum_ptr", "d0", "d1", "d2", "rw_ptr", "y_ptr", "E", "r", "f", "ldy"),
        constexprs=("FMT_D", "HAS_RW", "SINGLE_K", "Y_PAD", "DEC16", "PLANES", "BM", "BN", "BK", "BLOCK_E"),
        ints=("E", "r", "f", "ldy"),
        used_if={"d1": "FMT_D", "d2": "FMT_D", "rw_ptr": "HAS_RW"},
        hinted=("z_ptr", "d0", "y_ptr", "r"),
    ),
    "lowbit_bwd_dz": KernelInfo(
        params=("dy_ptr", "sidx_ptr", "offs_ptr", "xcum_ptr", "d0", "d1", "d2", "zw_ptr", "part_ptr", "dwd_ptr",
                "hg_ptr", "hu_ptr", "sg_ptr", "su_ptr", "rw_ptr", "dhg_ptr", "dhu_ptr", "dsgp_ptr", "dsup_ptr",
                "drw_ptr", "E", "M", "r", "f", "f_slice"),
        constexprs=("FMT_D", "HAS_SCATTER", "DO_DWD", "FUSE_EPI", "HAS_SG", "HAS_SU", "HAS_RW", "BM", "BR", "BN",
                    "BLOCK_E"),
        ints=("E", "M", "r", "f", "f_slice"),
        used_if={"sidx_ptr": "HAS_SCATTER", "d1": "FMT_D", "d2": "FMT_D", "dwd_ptr": "DO_DWD", "part_ptr": "!FUSE_EPI",
                 **{p: "FUSE_EPI" for p in ("hg_ptr", "hu_ptr", "dhg_ptr", "dhu_ptr", "drw_ptr")},
                 "sg_ptr": ("FUSE_EPI", "HAS_SG"), "su_ptr": ("FUSE_EPI", "HAS_SU"), "rw_ptr": ("FUSE_EPI", "HAS_RW"),
                 "dsgp_ptr": ("FUSE_EPI", "HAS_SG"), "dsup_ptr": ("FUSE_EPI", "HAS_SG")},
        hinted=("dy_ptr", "d0", "zw_ptr", "part_ptr", "dwd_ptr", "hg_ptr", "hu_ptr", "dhg_ptr", "dhu_ptr", "r"),
    ),
    "lowbit_bwd_dx_dw": KernelInfo(
        params=("x_ptr", "gidx_ptr", "offs_ptr", "xcum_ptr", "g0", "g1", "g2", "u0", "u1", "u2", "dhg_ptr", "dhu_ptr",
                "dx_ptr", "dwg_ptr", "dwu_ptr", "E", "d", "r", "stride_x"),
        constexprs=("FMT_G", "FMT_U", "HAS_GATHER", "DO_DX", "DO_DW", "BM", "BD", "BR", "NDB", "BLOCK_E"),
        ints=("E", "d", "r", "stride_x"),
        used_if={"gidx_ptr": "HAS_GATHER", "g1": "FMT_G", "g2": "FMT_G", "u1": "FMT_U", "u2": "FMT_U",
                 "dx_ptr": "DO_DX", "dwg_ptr": "DO_DW", "dwu_ptr": "DO_DW"},
        hinted=("x_ptr", "g0", "u0", "dhg_ptr", "dhu_ptr", "dx_ptr", "dwg_ptr", "dwu_ptr", "d", "r", "stride_x"),
    ),
}


def is_used(kernel: str, param: str, constexprs: dict) -> bool:
    return _base_is_used(kernel, param, constexprs, KERNELS)


def spec_key(kernel: str, types: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: bool,
             maxnreg: int = 0) -> str:
    """``triton_common.specs.spec_key`` on this table (same format)."""
    return _base_spec_key(kernel, types, constexprs, num_warps, num_stages, aligned, KERNELS, maxnreg)


# ---- the host-side rules glu.py follows (shape -> constexprs) -------------------------------------

def rank_block(cfg) -> int:
    """BR of the four low-bit kernels: always ``cfg.shared.br_max`` (64; a multiple of 16, so an NVFP4 scale block
    never straddles a rank block; smaller r is masked). The bf16 epilogue keeps its own rule."""
    return cfg.shared.br_max


def up_dec16(cfg, bk: int) -> bool:
    """DEC16 of lowbit_up_fwd: the bf16 tile decode where the arch's config enables it and the K step is
    wider than 16 (at BK = 16, Triton 3.6 and 3.9 fail to compile it for compute capability 10.0, 10.3
    and 11.0: "Illegal shared layout" in OptimizeDotOperands; review of 2026-11-30)."""
    return bool(cfg.lowbit.dec16_up_lb) and bk > 16


def up_planes(cfg, fmt: int, single_k: bool, bk: int) -> bool:
    """PLANES of lowbit_up_fwd: a packed w_down decoded in byte planes where the arch's config enables it
    (``LowbitTiles.planes_up_lb``: sm_120), NVFP4 or sign, and the rank is one K step of 64 (aligned r in 33..64; the
    TTGIR then holds no shared-memory copy of the decoded tile, tests/kernels/test_triton_lowbit_aot.py; at BK = 128 it
    still does)."""
    return bool(cfg.lowbit.planes_up_lb) and fmt in PLANE_FORMATS and single_k and bk == 64


# Arches whose table also ships lowbit_down_fwd's byte-plane variants (``down_planes``), off by default there, for
# ``TSCT_TRITON_GLU_CFG=planes_down_lb=1`` on the card itself (the H200 cannot time sm_120; docs/performance.md)
OPT_IN_PLANES_DOWN: tuple[str, ...] = ("sm_120",)


def down_planes_ok(fmt_g: int, fmt_u: int, bk: int) -> bool:
    """lowbit_down_fwd can run in byte planes: w_gate and w_up both NVFP4 or sign, a K step of 64 over d."""
    return fmt_g in PLANE_FORMATS and fmt_u in PLANE_FORMATS and bk == 64


def down_planes(cfg, fmt_g: int, fmt_u: int, bk: int) -> bool:
    """PLANES of lowbit_down_fwd: both factors decoded in byte planes where the config enables it
    (``LowbitTiles.planes_down_lb``; off everywhere by default) and ``down_planes_ok``; the x tile is loaded whole and
    split into the same planes in registers (``_kernels._t_planes``). On sm_120 the TTGIR of the b1 variants then
    allocates no shared memory for a register tensor (no decoded tile; sign's packed code bytes still pass one
    layout conversion through shared memory: tests/kernels/test_triton_lowbit_aot.py)."""
    return bool(cfg.lowbit.planes_down_lb) and down_planes_ok(fmt_g, fmt_u, bk)


# Constexprs whose code only the pinned Triton (TRITON_VERSION, the AOT build's) is known to compile correctly: Triton
# 3.6 JIT with mma.sync (an H200 with DISABLE_MMA_V3=1, the sm_120 proxy) computes wrong products in both byte-plane
# kernels, while Triton 3.9's mma.sync cubins pass the GPU suites (docs/performance.md).
PINNED_TRITON_ONLY: dict[str, tuple[str, ...]] = {"lowbit_up_fwd": ("PLANES",), "lowbit_down_fwd": ("PLANES",)}


def jit_consts(kernel: str, consts: dict, triton_version: str) -> dict:
    """The constexprs a JIT launch of ``kernel`` compiles with ``triton_version`` (``launch.Family``): as given
    under the pinned Triton; else each of ``PINNED_TRITON_ONLY[kernel]`` off (the byte planes fall back to the
    joined tile: the same products up to fp32 summation order, a shared-memory copy of the decoded tile on the
    way). Any other version string (a 3.9.x, an rc, a git build) counts as another Triton: slower, never wrong."""
    off = [c for c in PINNED_TRITON_ONLY.get(kernel, ()) if consts.get(c)]
    if not off or triton_version == TRITON_VERSION:
        return consts
    return {k: (False if k in off else v) for k, v in consts.items()}


def down_planes_shipped(cfg, arch: str, fmt_g: int, fmt_u: int, bk: int) -> list[bool]:
    """The PLANES values of lowbit_down_fwd that ``arch``'s table ships: the config's, and on the
    ``OPT_IN_PLANES_DOWN`` arches the byte planes too where they can run."""
    return sorted({down_planes(cfg, fmt_g, fmt_u, bk), arch in OPT_IN_PLANES_DOWN and down_planes_ok(fmt_g, fmt_u, bk)})


def up_k(r: int, aligned: bool) -> tuple[bool, int]:
    """(SINGLE_K, BK) of the up kernel: the whole rank in one step for aligned launches with r <= 128."""
    if aligned and r <= 128:
        return True, max(16, next_pow2(r))
    return False, 64


def factor_types(fmt: int, dtype: str) -> tuple[str, str, str]:
    """Triton types of a factor's three pointers (p0, p1, p2) for a format; unread ones ``*i8``."""
    if fmt == DENSE:
        return "*" + dtype, UNUSED, UNUSED
    if fmt == NVFP4:
        return "*u8", "*u8", "*fp32"
    if fmt in (FP8, TERNARY):
        return "*u8", UNUSED, "*fp32"
    return "*u8", "*fp32", "*fp32"


def fuse_dz_epi(cfg, fmt_d: int, e: int, m: int, r: int) -> bool:
    """Whether lowbit_bwd_dz runs the GLU backward itself (FUSE_EPI) for a w_down of format ``fmt_d``, E = ``e``
    experts, M = ``m`` routed rows and rank ``r``: one f slice, so each program holds its rows' complete dz0 (no part
    buffer, no ``glu_bwd_epi`` launch), where the arch's table turns it on (``LowbitTiles.fuse_tiles_lb``) for an
    NVFP4 w_down, the rank is at least ``LowbitTiles.fuse_rank_lb`` (64: below it the part buffer fusing saves
    shrinks with r while its one f slice still walks all of f; slower at r 16 and 32, docs/performance.md) and the
    pass has enough row tiles to fill the GPU without f slices (at least ``fuse_tiles_lb``, estimated as
    max(E, cdiv(M, bm)): an expert of up to bm rows is one tile). The same shape gives the same choice on every GPU
    of an arch."""
    return (fused_variants(cfg, fmt_d) and r >= cfg.lowbit.fuse_rank_lb
            and max(e, -(-m // cfg.shared.bm)) >= cfg.lowbit.fuse_tiles_lb)


def fused_variants(cfg, fmt_d: int) -> bool:
    """Whether the arch's table can fuse the GLU backward into lowbit_bwd_dz for this w_down format (the AOT build
    then compiles those variants too)."""
    return cfg.lowbit.fuse_tiles_lb > 0 and fmt_d == NVFP4


def dz_maxnreg(cfg, fused: bool) -> int:
    """The register cap of a lowbit_bwd_dz variant: ``LowbitTiles.regs_dz_lb`` where it runs the GLU backward (the
    epilogue's [BM, BR] fp32 tiles would otherwise set the kernel's register count: 153 at b1 on sm_90a, one CTA per
    SM), none otherwise."""
    return cfg.lowbit.regs_dz_lb if fused else 0


def dxdw_ndb(cfg, fmt_g: int, fmt_u: int) -> int:
    """d blocks per program (row tile) of lowbit_bwd_dx_dw: factors with a column scale (sign, fp8, ternary: the
    kernel walks their d blocks with the one-block body, not holding dh and its scaled copy across them, whose
    registers cost sign an SM's second CTA) take ``LowbitTiles.ndb_dxdw_sign_lb``, the others
    ``LowbitTiles.ndb_dxdw_lb``."""
    return cfg.lowbit.ndb_dxdw_sign_lb if max(fmt_g, fmt_u) >= SIGN else cfg.lowbit.ndb_dxdw_lb


_IDX = (None, "i64")
_DXDW = ((True, False), (False, True), (True, True))


def enumerate_specs(arch: str, formats: tuple = AOT_FORMATS) -> Iterator[Spec]:
    """Every specialization ``glu.py`` launches on ``arch`` for the AOT_FORMATS and AOT_DTYPES (module
    docstring): 128 per arch (lowbit_bwd_dx_dw with one d-block count per format triple, ``dxdw_ndb``; the mixed
    triple shares its up / dz variants with uniform NVFP4; no generic variants for the ``always_aligned`` triples,
    uniform NVFP4 and the mix), 24 more where lowbit_bwd_dz can run the GLU backward (``fused_variants``: its 4
    NVFP4 w_down variants six times more, over the scale dtypes and row weights), plus 48 on the OPT_IN_PLANES_DOWN
    arches (lowbit_down_fwd's byte-plane variants: 24 for uniform sign, 12 for each always aligned triple).
    ``formats``: other format triples, for development tools that compile JIT-only formats the same way."""
    cfg = CONFIGS[arch]
    sh, lt = cfg.shared, cfg.lowbit
    br = rank_block(cfg)
    seen = set()
    for dt, (fg, fu, fd), aligned in itertools.product(AOT_DTYPES, formats, (True, False)):
        if not aligned and always_aligned(fg, fu, fd):
            continue
        D = "*" + dt
        g0, g1, g2 = factor_types(fg, dt)
        u0, u1, u2 = factor_types(fu, dt)
        d0, d1, d2 = factor_types(fd, dt)
        out = []
        for g, s, (bwd, rw) in itertools.product(_IDX, (False, True), ((False, False), (True, False), (True, True))):
            types = dict(x_ptr=D, gidx_ptr=f"*{g}" if g else UNUSED, offs_ptr="*i32", cum_ptr="*i32", g0=g0, g1=g1,
                         g2=g2, u0=u0, u1=u1, u2=u2, sg_ptr="*fp32", su_ptr="*fp32", z_ptr=D,
                         hg_ptr="*fp32" if bwd else D, hu_ptr="*fp32" if bwd else D, rw_ptr="*fp32")
            for planes in down_planes_shipped(cfg, arch, fg, fu, sh.bk):
                consts = dict(FMT_G=fg, FMT_U=fu, HAS_GATHER=g is not None, HAS_SG=s, HAS_SU=s, HAS_RW=rw, BWD=bwd,
                              PLANES=planes, BM=sh.bm, BR=br, BK=sh.bk, BLOCK_E=sh.block_e)
                out.append(_base_spec("lowbit_down_fwd", types, consts, WARPS_DECODE, lt.stages_down_lb, aligned,
                                      KERNELS))
        ups = sorted({up_k(r, aligned) for r in (16, 32, 48, 64, 128, 129)})
        for rw, (single, bk), ypad in itertools.product((False, True), ups, (False, True)):
            types = dict(z_ptr=D, offs_ptr="*i32", cum_ptr="*i32", d0=d0, d1=d1, d2=d2, rw_ptr="*fp32", y_ptr=D)
            consts = dict(FMT_D=fd, HAS_RW=rw, SINGLE_K=single, Y_PAD=ypad, DEC16=up_dec16(cfg, bk),
                          PLANES=up_planes(cfg, fd, single, bk), BM=sh.bm,
                          BN=lt.bn_up_lb, BK=bk, BLOCK_E=sh.block_e)
            out.append(_base_spec("lowbit_up_fwd", types, consts, lt.warps_up_lb, lt.stages_up_lb, aligned,
                                  KERNELS))
        # and fused with the GLU backward where the table allows it for this w_down (fused_variants): for every
        # scale dtype the epilogue reads (none, fp32, x's: runtime.scales_in), with and without row weights
        epis = [None]
        if fused_variants(cfg, fd):
            epis += list(itertools.product(sorted({None, "*fp32", D}, key=str), (False, True)))
        for sc, dwd, epi in itertools.product(_IDX, (False, True), epis):
            st, rw = epi or (None, False)
            types = dict(dy_ptr=D, sidx_ptr=f"*{sc}" if sc else UNUSED, offs_ptr="*i32", xcum_ptr="*i32", d0=d0, d1=d1,
                         d2=d2, zw_ptr=D, part_ptr="*fp32", dwd_ptr=D, hg_ptr="*fp32", hu_ptr="*fp32",
                         sg_ptr=st or UNUSED, su_ptr=st or UNUSED, rw_ptr="*fp32", dhg_ptr=D, dhu_ptr=D,
                         dsgp_ptr="*fp32", dsup_ptr="*fp32", drw_ptr="*fp32")
            consts = dict(FMT_D=fd, HAS_SCATTER=sc is not None, DO_DWD=dwd, FUSE_EPI=epi is not None,
                          HAS_SG=st is not None, HAS_SU=st is not None, HAS_RW=rw, BM=sh.bm, BR=br, BN=lt.bn_dz_lb,
                          BLOCK_E=sh.block_e)
            out.append(_base_spec("lowbit_bwd_dz", types, consts, WARPS_DECODE, lt.stages_dz_lb, aligned, KERNELS,
                                  maxnreg=dz_maxnreg(cfg, epi is not None)))
        for g, (dx, dw) in itertools.product(_IDX, _DXDW):
            types = dict(x_ptr=D, gidx_ptr=f"*{g}" if g else UNUSED, offs_ptr="*i32", xcum_ptr="*i32", g0=g0, g1=g1,
                         g2=g2, u0=u0, u1=u1, u2=u2, dhg_ptr=D, dhu_ptr=D, dx_ptr=D, dwg_ptr=D, dwu_ptr=D)
            consts = dict(FMT_G=fg, FMT_U=fu, HAS_GATHER=g is not None, DO_DX=dx, DO_DW=dw, BM=sh.bm,
                          BD=lt.bd_dxdw_lb, BR=br, NDB=dxdw_ndb(cfg, fg, fu), BLOCK_E=sh.block_e)
            out.append(_base_spec("lowbit_bwd_dx_dw", types, consts, WARPS_DECODE, lt.stages_dxdw_lb, aligned,
                                  KERNELS))
        for s in out:
            if s.key not in seen:
                seen.add(s.key)
                yield s
