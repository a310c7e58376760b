"""The variant table of the W4A4 kernels (``_kernels.py``): ONE table for JIT (``w4a4.py``) and the AOT
build. Only what differs from the bf16 family lives here (kernels, tiles, PTX targets, arches); the
key format, ``Spec``, ``KernelInfo``, the type names and the arch limits are ``triton_glu.specs``'s, so
the run-time lookup is ``tsct.kernels.aot.kernel(arch, key)`` and the wheel's AOT build
(``triton_glu/aot_build.py``, family "w4a4") writes these cubins into the same
``tsct/_aot/<arch>/index.json`` as the bf16 ones (kernel names never collide).

Importing this module imports neither Triton nor torch (the AOT build loads it by path after
registering ``triton_glu/specs.py`` as ``tsct.kernels.triton_glu.specs``).

Arches. ``tl.dot_scaled`` with e2m1 operands and UE4M3 scales needs the block-scaled MMA, which
plain ``sm_120`` rejects (ptxas: "not supported on .target 'sm_120'"), so the sm_120 artifact of
these kernels is built as the FAMILY target ``sm_120f`` (loads on 12.0 and 12.1, the same devices
as the plain sm_120 bf16 cubins; OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X in its SASS, a SASS_RULES row
of ``tsct.native.artifacts``). It goes into the same artifact directory ("sm_120"); each index entry
records its ptx target. sm_90a: Triton's bf16 emulation (e2m1 -> bf16 decode, scale multiply in bf16,
HGMMA.64x64x16.F32.BF16). sm_100a: tcgen05 block-scaled MMA, not built (``AOT_ARCHS``) nor checked
yet; listed for the integration.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from tsct.kernels.triton_glu.specs import (  # noqa: F401  (re-exported: one format for every family)
    DTYPE_TYPES, MAX_SHARED, SCRATCH_PARAMS, TRITON_VERSION, UNUSED, KernelInfo, Spec, key_file_stem,
)
from tsct.kernels.triton_glu.specs import _spec as _base_spec, is_used as _base_is_used, spec_key as _base_spec_key

# artifact arch (directory under tsct/_aot) -> (GPUTarget capability, the ptxas arch name to emit)
PTX_ARCH: dict[str, tuple[int, str]] = {"sm_90a": (90, "sm_90a"), "sm_100a": (100, "sm_100a"),
                                        "sm_120": (120, "sm_120f")}
# the arches whose W4A4 cubins the wheel ships (sm_100a: no SASS rule, never compiled for yet)
AOT_ARCHS: tuple[str, ...] = ("sm_90a", "sm_120")


@dataclasses.dataclass
class Config:
    bm: int = 64        # rows per tile (tile map shared with the bf16 forward: ~32 rows per expert at b1)
    bn_up: int = 128    # f columns per step
    bk: int = 64        # K elements per dot_scaled step (>= 64: one m16n8k64 per step on sm_120)
    block_e: int = 1024
    warps_up: int = 8
    stages_up: int = 2
    bk_down: int = 64   # d per dot_scaled step of the down kernel (b1: 32 steps; 128 pushed sm_120 to 255 regs + spills)
    br_down: int = 64   # rank block of the down kernel (r = 64 at b1: one block; x codes read once)
    warps_down: int = 8
    stages_down: int = 2
    quant_bm: int = 32
    quant_bk: int = 64
    warps_quant: int = 4


CONFIGS: dict[str, Config] = {"sm_90a": Config(), "sm_100a": Config(), "sm_120": Config()}


KERNELS: dict[str, KernelInfo] = {
    "nvfp4_quant_rows": KernelInfo(
        params=("x_ptr", "codes_ptr", "sf_ptr", "senc_ptr", "M", "K", "stride_x"),
        constexprs=("BM", "BK"),
        ints=("M", "K", "stride_x"),
        used_if={},
        hinted=("x_ptr", "codes_ptr", "sf_ptr", "K", "stride_x"),
    ),
    "w4a4_down_fwd": KernelInfo(
        params=("xc_ptr", "xs_ptr", "xg_ptr", "gidx_ptr", "offs_ptr", "cum_ptr", "gc_ptr", "gs_ptr", "gg_ptr",
                "uc_ptr", "us_ptr", "ug_ptr", "sg_ptr", "su_ptr", "rw_ptr", "z_ptr", "zw_ptr", "hg_ptr", "hu_ptr",
                "E", "d", "r"),
        constexprs=("HAS_GATHER", "HAS_S", "HAS_RW", "SAVE", "BM", "BR", "BK", "BLOCK_E"),
        ints=("E", "d", "r"),
        used_if={"gidx_ptr": "HAS_GATHER", "sg_ptr": "HAS_S", "su_ptr": "HAS_S", "rw_ptr": ("SAVE", "HAS_RW"),
                 "zw_ptr": "SAVE", "hg_ptr": "SAVE", "hu_ptr": "SAVE"},
        hinted=("xc_ptr", "xs_ptr", "gc_ptr", "gs_ptr", "uc_ptr", "us_ptr", "z_ptr", "zw_ptr", "hg_ptr", "hu_ptr",
                "d", "r"),
    ),
    "w4a4_up_fwd": KernelInfo(
        params=("zc_ptr", "zs_ptr", "zg_ptr", "offs_ptr", "cum_ptr", "wc_ptr", "ws_ptr", "wg_ptr", "rw_ptr", "y_ptr",
                "E", "r", "f", "ldy", "fsplit"),
        constexprs=("HAS_RW", "SINGLE_K", "BM", "BN", "BK", "BLOCK_E"),
        ints=("E", "r", "f", "ldy", "fsplit"),
        used_if={"rw_ptr": "HAS_RW"},
        hinted=("zc_ptr", "zs_ptr", "wc_ptr", "ws_ptr", "y_ptr", "r"),
    ),
}


def is_used(kernel: str, param: str, constexprs: dict) -> bool:
    return _base_is_used(kernel, param, constexprs, KERNELS)


def spec_key(kernel: str, types: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: bool) -> str:
    """``triton_glu.specs.spec_key`` on this table (same format)."""
    return _base_spec_key(kernel, types, constexprs, num_warps, num_stages, aligned, KERNELS)


def up_single_k(cfg: Config, r: int) -> bool:
    return r <= cfg.bk


#: activation / output dtypes with cubins: the GLU feeds z in x.dtype (bf16 / fp16); fp32 serves fp32
#: models and the exact checks (fp32 z in, fp32 y out: the GPU test compares with the torch model at 2e-5)
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")


#: (SAVE, HAS_RW) of the down kernel: inference; training without / with row weights
_DOWN_MODES = ((False, False), (True, False), (True, True))


def enumerate_specs(arch: str) -> Iterator[Spec]:
    """Every specialization ``w4a4.py`` launches on ``arch``, per dtype (3) and alignment (2): the quantizer
    (1) + the down kernel (gather absent / int64 x scales x 3 modes = 12) + the up kernel (row weight x
    single/multi K = 4): 6 x 17 = 102 (30 before the down kernel)."""
    cfg = CONFIGS[arch]
    for dt, aligned in itertools.product(DTYPES, (True, False)):
        for g, s, (save, rw) in itertools.product((None, "i64"), (False, True), _DOWN_MODES):
            types = dict(xc_ptr="*u8", xs_ptr="*fp8e4nv", xg_ptr="*fp32", gidx_ptr=f"*{g}" if g else UNUSED,
                         offs_ptr="*i32", cum_ptr="*i32", gc_ptr="*u8", gs_ptr="*fp8e4nv", gg_ptr="*fp32",
                         uc_ptr="*u8", us_ptr="*fp8e4nv", ug_ptr="*fp32", sg_ptr="*fp32", su_ptr="*fp32",
                         rw_ptr="*fp32", z_ptr="*" + dt, zw_ptr="*" + dt, hg_ptr="*fp32", hu_ptr="*fp32")
            consts = dict(HAS_GATHER=g is not None, HAS_S=s, HAS_RW=rw, SAVE=save, BM=cfg.bm, BR=cfg.br_down,
                          BK=cfg.bk_down, BLOCK_E=cfg.block_e)
            yield _base_spec("w4a4_down_fwd", types, consts, cfg.warps_down, cfg.stages_down, aligned, KERNELS)
        yield _base_spec("nvfp4_quant_rows", dict(x_ptr="*" + dt, codes_ptr="*u8", sf_ptr="*u8", senc_ptr="*fp32"),
                         dict(BM=cfg.quant_bm, BK=cfg.quant_bk), cfg.warps_quant, 1, aligned, KERNELS)
        for rw, single in itertools.product((False, True), (True, False)):
            types = dict(zc_ptr="*u8", zs_ptr="*fp8e4nv", zg_ptr="*fp32", offs_ptr="*i32", cum_ptr="*i32",
                         wc_ptr="*u8", ws_ptr="*fp8e4nv", wg_ptr="*fp32", rw_ptr="*fp32", y_ptr="*" + dt)
            consts = dict(HAS_RW=rw, SINGLE_K=single, BM=cfg.bm, BN=cfg.bn_up, BK=cfg.bk, BLOCK_E=cfg.block_e)
            yield _base_spec("w4a4_up_fwd", types, consts, cfg.warps_up, cfg.stages_up, aligned, KERNELS)
