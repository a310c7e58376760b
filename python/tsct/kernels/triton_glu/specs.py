"""The variant table of the bf16 / fp16 grouped GLU's kernels (``_kernels.py``; family "glu" of the AOT build): ONE
table for the host launches (``glu.py``), the AOT build (``triton_common/aot_build.py``) and ``tsct.kernels.aot``
(what it looks up). Only what is the bf16 family's lives here (its four kernels' parameters, the host rules that pick
their constexprs, the variant set); the key format, ``Spec``, ``KernelInfo``, the type names, the tile configs, the
arch tables and the shared kernels are ``tsct.kernels.triton_common.specs``'s.

The family's table also lists the shared kernels (``triton_common``: tile map, combine, zero-tail, routing, the
weight-free backward): the AOT build compiles and indexes them as family "glu", the family their index entries, spec
keys and sm_120 proxy verdicts (``tsct.kernels.sm120_proxy``, docs/sm120.md) have always been under, so an index and
the proxy records keep naming them the same way.

Importing this module imports neither Triton nor torch.
"""

from __future__ import annotations

import itertools
from typing import Iterator

# names only (``from ... import name``): the AOT build loads these modules by path without the tsct package
from tsct.kernels.triton_common.specs import (  # noqa: F401  (re-exported: one format for every family)
    CONFIGS, DTYPE_TYPES, PTX_ARCH, UNUSED, Config, KernelInfo, Spec, make_spec, next_pow2, rank_block,
)
from tsct.kernels.triton_common.specs import IDX, bwd_dw_specs, bwd_dwd_epi_specs, forward_specs, rank_blocks
from tsct.kernels.triton_common.specs import KERNELS as _SHARED, is_used as _base_is_used, spec_key as _base_spec_key

# the bf16 kernels, and the shared ones the family compiles, in the order its index rows and proxy verdicts list them
KERNELS: dict[str, KernelInfo] = {
    "glu_down_fwd": KernelInfo(
        params=("x_ptr", "gidx_ptr", "offs_ptr", "cum_ptr", "wg_ptr", "wu_ptr", "sg_ptr", "su_ptr", "z_ptr",
                "hg_ptr", "hu_ptr", "rw_ptr", "E", "M", "d", "r", "stride_x"),
        constexprs=("HAS_GATHER", "HAS_SG", "HAS_SU", "HAS_RW", "BWD", "BM", "BR", "BK", "BLOCK_E"),
        ints=("E", "M", "d", "r", "stride_x"),
        used_if={"gidx_ptr": "HAS_GATHER", "sg_ptr": "HAS_SG", "su_ptr": "HAS_SU", "hg_ptr": "BWD",
                 "hu_ptr": "BWD", "rw_ptr": ("BWD", "HAS_RW")},
        hinted=("x_ptr", "wg_ptr", "wu_ptr", "z_ptr", "hg_ptr", "hu_ptr", "d", "r", "stride_x"),
    ),
    "glu_up_fwd": KernelInfo(
        params=("z_ptr", "offs_ptr", "cum_ptr", "wd_ptr", "rw_ptr", "y_ptr", "E", "r", "f", "ldy"),
        constexprs=("HAS_RW", "FSPLIT", "SINGLE_K", "VEC", "Y_PAD", "WD_T", "BM", "BN", "BK", "BLOCK_E"),
        ints=("E", "r", "f", "ldy"),
        used_if={"rw_ptr": "HAS_RW"},
        hinted=("z_ptr", "wd_ptr", "y_ptr", "r"),
    ),
    **{k: _SHARED[k] for k in ("combine_rows", "zero_tail_rows", "tile_cum", "csr_keys", "route_rank", "route_place",
                                 "bwd_maps")},
    "glu_bwd_dz": KernelInfo(
        params=("dy_ptr", "sidx_ptr", "offs_ptr", "xcum_ptr", "wd_ptr", "zw_ptr", "part_ptr", "dwd_ptr", "E", "M", "r",
                "f", "f_slice"),
        constexprs=("HAS_SCATTER", "DO_DWD", "VEC", "WD_T", "BM", "BR", "BN", "BLOCK_E"),
        ints=("E", "M", "r", "f", "f_slice"),
        used_if={"sidx_ptr": "HAS_SCATTER", "dwd_ptr": "DO_DWD"},
        hinted=("dy_ptr", "wd_ptr", "zw_ptr", "part_ptr", "dwd_ptr", "r"),
    ),
    **{k: _SHARED[k] for k in ("glu_bwd_dwd", "bwd_slot_reduce", "glu_bwd_epi", "glu_bwd_sred")},
    "glu_bwd_dx_dw": KernelInfo(
        params=("x_ptr", "gidx_ptr", "offs_ptr", "xcum_ptr", "wg_ptr", "wu_ptr", "dhg_ptr", "dhu_ptr", "dx_ptr",
                "dwg_ptr", "dwu_ptr", "E", "d", "r", "stride_x"),
        constexprs=("HAS_GATHER", "DO_DX", "DO_DW", "BM", "BD", "BR", "NDB", "BLOCK_E"),
        ints=("E", "d", "r", "stride_x"),
        used_if={"gidx_ptr": "HAS_GATHER", "dx_ptr": "DO_DX", "dwg_ptr": "DO_DW", "dwu_ptr": "DO_DW"},
        hinted=("x_ptr", "wg_ptr", "wu_ptr", "dhg_ptr", "dhu_ptr", "dx_ptr", "dwg_ptr", "dwu_ptr", "d", "r",
                "stride_x"),
    ),
    "glu_bwd_dw": _SHARED["glu_bwd_dw"],
}


def is_used(kernel: str, param: str, constexprs: dict) -> bool:
    return _base_is_used(kernel, param, constexprs, KERNELS)


def spec_key(kernel: str, types: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: bool,
             maxnreg: int = 0) -> str:
    """``triton_common.specs.spec_key`` on this table (same format)."""
    return _base_spec_key(kernel, types, constexprs, num_warps, num_stages, aligned, KERNELS, maxnreg)


# ---- the host-side rules glu.py follows (shape -> constexprs) -------------------------------------

def up_k(cfg: Config, r: int, aligned: bool) -> tuple[bool, int]:
    """(SINGLE_K, BK) of the up kernel: the whole rank in one K step when r <= 128 (aligned only)."""
    if aligned and r <= 128:
        return True, max(16, next_pow2(r))
    return False, 64


def up_vec(cfg: Config, aligned: bool, wd_t: bool = False, itemsize: int = 2) -> bool:
    """VEC (w_down rows as shifted words): aligned launches of a row-major w_down of 2-byte elements
    (the words are split into 16-bit halves) only."""
    return aligned and bool(cfg.glu.vec_up) and not wd_t and itemsize == 2


def up_tiles(cfg: Config, vec: bool, wd_t: bool = False, bk: int = 64) -> tuple[int, int, int]:
    """(BN, num_warps, num_stages) of glu_up_fwd: the VEC and K-major (WD_T) variants have their own.
    K steps past 64 (r > 64 in one step) keep at most 2 stages: the shared memory of a stage grows with BK."""
    if wd_t:
        return cfg.glu.bn_up_t, cfg.glu.warps_up_t, (min(cfg.glu.stages_up_t, 2) if bk > 64 else cfg.glu.stages_up_t)
    t = cfg.glu
    return (t.bn_up_vec, t.warps_up, t.stages_up_vec) if vec else (t.bn_up, t.warps_up, t.stages_up)


def dz_vec(cfg: Config, aligned: bool, wd_t: bool = False, itemsize: int = 2) -> bool:
    """VEC of glu_bwd_dz: dY (and a row-major w_down) as shifted words; aligned launches of 2-byte
    elements only."""
    return aligned and bool(cfg.glu.vec_dz_t if wd_t else cfg.glu.vec_dz) and itemsize == 2


def dz_warps_stages(cfg: Config, vec: bool, wd_t: bool = False) -> tuple[int, int]:
    """(num_warps, num_stages) of glu_bwd_dz: the VEC and K-major (WD_T) variants have their own."""
    if wd_t:
        return cfg.glu.warps_dz_t, cfg.glu.stages_dz_t
    return (cfg.glu.warps_dz_vec, cfg.glu.stages_dz_vec) if vec else (cfg.glu.warps_bwd_dz, cfg.glu.stages_bwd_dz)


# ---- every specialization glu.py launches, per arch -----------------------------------------------

#: the activation dtypes (x, the dense factors, y) with cubins: bf16. fp16 calls run the same kernels through Triton
#: JIT; without Triton (or with TSCT_TRITON_BACKEND=aot) the path's status sends them to bmm (docs/decisions/0005)
AOT_DTYPES: tuple[str, ...] = ("bf16",)
_DXDW = ((True, False), (False, True), (True, True))


def enumerate_specs(arch: str) -> Iterator[Spec]:
    """Every (kernel, specialization) glu.py can launch on ``arch`` with ``AOT_DTYPES`` inputs, the shared kernels'
    (``triton_common.specs``; the router's sort with any index and weight dtype) among them."""
    cfg = CONFIGS[arch]
    sh, gt = cfg.shared, cfg.glu
    if gt.fsplit_up != 1:
        raise ValueError("the AOT table assumes fsplit_up == 1")
    seen = set()
    for dt, aligned in itertools.product(AOT_DTYPES, (True, False)):
        D = "*" + dt
        once = aligned and dt == AOT_DTYPES[0]  # the dtype-free shared kernels: once per arch
        brs = rank_blocks(cfg, aligned)
        ups = sorted({up_k(cfg, r, aligned) for r in (1, 16, 17, 32, 33, 64, 65, 128, 129)})
        out = []
        scale_types = sorted({None, "*fp32", D}, key=str)  # s_gate / s_up: none, fp32 or x's dtype (scales_in)
        # glu_down_fwd: forward (z) and the backward's recompute (hg, hu fp32; z*rw)
        for g, st, rw, bwd, br in itertools.product(IDX, scale_types, (False, True), (False, True), brs):
            if rw and not bwd:
                continue  # the forward never passes row_weight to the down kernel
            s = st is not None
            types = dict(x_ptr=D, gidx_ptr=f"*{g}" if g else UNUSED, offs_ptr="*i32", cum_ptr="*i32", wg_ptr=D,
                         wu_ptr=D, sg_ptr=st or UNUSED, su_ptr=st or UNUSED, z_ptr=D, hg_ptr="*fp32" if bwd else D,
                         hu_ptr="*fp32" if bwd else D, rw_ptr="*fp32")
            consts = dict(HAS_GATHER=g is not None, HAS_SG=s, HAS_SU=s, HAS_RW=rw, BWD=bwd, BM=sh.bm, BR=br,
                          BK=sh.bk, BLOCK_E=sh.block_e)
            out.append(_spec("glu_down_fwd", types, consts, gt.warps_down, gt.stages_down, aligned))
        wd_ts = (False, True) if aligned else (False,)  # K-major w_down: aligned launches only
        for rw, (single, bk), ypad, wd_t in itertools.product((False, True), ups, (False, True), wd_ts):
            types = dict(z_ptr=D, offs_ptr="*i32", cum_ptr="*i32", wd_ptr=D, rw_ptr="*fp32", y_ptr=D)
            vec = up_vec(cfg, aligned, wd_t)
            bn, warps, stages = up_tiles(cfg, vec, wd_t, bk)
            consts = dict(HAS_RW=rw, FSPLIT=1, SINGLE_K=single, VEC=vec, Y_PAD=ypad, WD_T=wd_t, BM=sh.bm, BN=bn,
                          BK=bk, BLOCK_E=sh.block_e)
            out.append(_spec("glu_up_fwd", types, consts, warps, stages, aligned))
        out += forward_specs(cfg, D, aligned, once)  # combine, zero-tail; tile map, CSR keys, routing
        for sc, dwd, br, wd_t in itertools.product(IDX, (False, True), brs, wd_ts):
            types = dict(dy_ptr=D, sidx_ptr=f"*{sc}" if sc else UNUSED, offs_ptr="*i32", xcum_ptr="*i32", wd_ptr=D,
                         zw_ptr=D, part_ptr="*fp32", dwd_ptr=D)
            vec = dz_vec(cfg, aligned, wd_t)
            consts = dict(HAS_SCATTER=sc is not None, DO_DWD=dwd, VEC=vec, WD_T=wd_t, BM=sh.bm, BR=br,
                          BN=gt.bn_bwd, BLOCK_E=sh.block_e)
            out.append(_spec("glu_bwd_dz", types, consts, *dz_warps_stages(cfg, vec, wd_t), aligned))
        out += bwd_dwd_epi_specs(cfg, D, aligned, brs)  # the chunked dWd (also the low-bit path's), the epilogue
        for g, (dx, dw), br in itertools.product(IDX, _DXDW, brs):
            types = dict(x_ptr=D, gidx_ptr=f"*{g}" if g else UNUSED, offs_ptr="*i32", xcum_ptr="*i32", wg_ptr=D,
                         wu_ptr=D, dhg_ptr=D, dhu_ptr=D, dx_ptr=D, dwg_ptr=D, dwu_ptr=D)
            consts = dict(HAS_GATHER=g is not None, DO_DX=dx, DO_DW=dw, BM=sh.bm, BD=gt.bd_bwd, BR=br,
                          NDB=gt.ndb_bwd, BLOCK_E=sh.block_e)
            out.append(_spec("glu_bwd_dx_dw", types, consts, gt.warps_bwd_dxdw, gt.stages_bwd_dxdw, aligned))
        out += bwd_dw_specs(cfg, D, aligned, brs, once)  # the chunked dWg / dWu, slot sums, maps, scale sums
        for s in out:
            if s.key not in seen:
                seen.add(s.key)
                yield s


def _spec(kernel: str, types: dict, consts: dict, warps: int, stages: int, aligned: bool) -> Spec:
    return make_spec(kernel, types, consts, warps, stages, aligned, KERNELS)
