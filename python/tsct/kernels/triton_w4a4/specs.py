"""The variant table of the W4A4 kernels (``_kernels.py``): ONE table for JIT (``w4a4.py``) and the AOT
build (``aot_build.py``), in the format of ``tsct.kernels.triton_glu.specs`` (same ``spec_key``
string, same index entries), so the run-time lookup is ``tsct.kernels.aot.kernel(arch, key)``.

Importing this module imports neither Triton nor torch.

Arches. ``tl.dot_scaled`` with e2m1 operands and UE4M3 scales needs the block-scaled MMA, which
plain ``sm_120`` rejects (ptxas: "not supported on .target 'sm_120'"), so the sm_120 artifact of
these kernels is built as the FAMILY target ``sm_120f`` (loads on 12.0 and 12.1, the same devices
as the plain sm_120 bf16 cubins; OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X in its SASS). It goes into the
same artifact directory ("sm_120"); the index entry records the ptx target. sm_90a: Triton's bf16
emulation (e2m1 -> bf16 decode, scale multiply in bf16, HGMMA.64x64x16.F32.BF16). sm_100a: tcgen05
block-scaled MMA (not built or checked here; listed for the integration).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from typing import Iterator

TRITON_VERSION = "3.9.0"

# artifact arch (directory under tsct/_aot) -> (GPUTarget capability, the ptxas arch name to emit)
PTX_ARCH: dict[str, tuple[int, str]] = {"sm_90a": (90, "sm_90a"), "sm_100a": (100, "sm_100a"),
                                        "sm_120": (120, "sm_120f")}
MAX_SHARED: dict[str, int] = {"sm_90a": 232448, "sm_100a": 232448, "sm_120": 101376}
# the instruction each arch's up/down cubins must contain (checked by aot_build --check-sass)
REQUIRED_SASS: dict[str, str] = {"sm_90a": "HGMMA.", "sm_120": "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"}


@dataclasses.dataclass
class Config:
    bm: int = 64        # rows per tile (tile map shared with the bf16 forward: ~32 rows per expert at b1)
    bn_up: int = 128    # f columns per step
    bk: int = 64        # K elements per dot_scaled step (>= 64: one m16n8k64 per step on sm_120)
    block_e: int = 1024
    warps_up: int = 8
    stages_up: int = 2
    quant_bm: int = 32
    quant_bk: int = 64
    warps_quant: int = 4


CONFIGS: dict[str, Config] = {"sm_90a": Config(), "sm_100a": Config(), "sm_120": Config()}


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    params: tuple
    constexprs: tuple
    ints: tuple
    used_if: dict
    hinted: tuple


KERNELS: dict[str, KernelInfo] = {
    "nvfp4_quant_rows": KernelInfo(
        params=("x_ptr", "codes_ptr", "sf_ptr", "senc_ptr", "M", "K", "stride_x"),
        constexprs=("BM", "BK"),
        ints=("M", "K", "stride_x"),
        used_if={},
        hinted=("x_ptr", "codes_ptr", "sf_ptr", "K", "stride_x"),
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
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")
UNUSED = "*i8"
DTYPE_TYPES = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "int32": "*i32", "int64": "*i64",
               "uint8": "*u8", "int8": "*i8", "float8_e4m3fn": "*fp8e4nv"}


def is_used(kernel: str, param: str, constexprs: dict) -> bool:
    flag = KERNELS[kernel].used_if.get(param)
    if flag is None:
        return True
    flags = (flag,) if isinstance(flag, str) else flag
    return all(bool(constexprs[f]) for f in flags)


def spec_key(kernel: str, types: dict, constexprs: dict, num_warps: int, num_stages: int, aligned: bool) -> str:
    """Same format as ``triton_glu.specs.spec_key`` (the kernel names do not collide)."""
    info = KERNELS[kernel]
    t = ",".join(f"{p}:{types[p] if is_used(kernel, p, constexprs) else UNUSED}" for p in info.params)
    c = ",".join(f"{k}={int(constexprs[k])}" for k in info.constexprs)
    return f"{kernel}|{t}|{c}|w{num_warps}s{num_stages}|{'a16' if aligned else 'gen'}"


def key_file_stem(key: str) -> str:
    return key.split("|", 1)[0] + "_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def up_single_k(cfg: Config, r: int) -> bool:
    return r <= cfg.bk


@dataclasses.dataclass(frozen=True)
class Spec:
    kernel: str
    types: tuple
    constexprs: tuple
    num_warps: int
    num_stages: int
    aligned: bool

    @property
    def key(self) -> str:
        return spec_key(self.kernel, dict(self.types), dict(self.constexprs), self.num_warps, self.num_stages,
                        self.aligned)


def _spec(kernel, types, consts, warps, stages, aligned) -> Spec:
    info = KERNELS[kernel]
    full = {p: (types.get(p, "i32") if p in info.ints else types[p]) for p in info.params}
    for p in info.params:
        if p not in info.ints and not is_used(kernel, p, consts):
            full[p] = UNUSED
    return Spec(kernel, tuple(full.items()), tuple((k, int(consts[k])) for k in info.constexprs), warps, stages,
                aligned)


def enumerate_specs(arch: str) -> Iterator[Spec]:
    """Every specialization ``w4a4.py`` launches on ``arch``: 2 quantizer inputs dtypes x 2 alignments
    + up kernel (2 output dtypes x row weight x single/multi K x 2 alignments) = 4 + 16 = 20."""
    cfg = CONFIGS[arch]
    for dt, aligned in itertools.product(("bf16", "fp16"), (True, False)):
        yield _spec("nvfp4_quant_rows", dict(x_ptr="*" + dt, codes_ptr="*u8", sf_ptr="*u8", senc_ptr="*fp32"),
                    dict(BM=cfg.quant_bm, BK=cfg.quant_bk), cfg.warps_quant, 1, aligned)
        for rw, single in itertools.product((False, True), (True, False)):
            types = dict(zc_ptr="*u8", zs_ptr="*fp8e4nv", zg_ptr="*fp32", offs_ptr="*i32", cum_ptr="*i32",
                         wc_ptr="*u8", ws_ptr="*fp8e4nv", wg_ptr="*fp32", rw_ptr="*fp32", y_ptr="*" + dt)
            consts = dict(HAS_RW=rw, SINGLE_K=single, BM=cfg.bm, BN=cfg.bn_up, BK=cfg.bk, BLOCK_E=cfg.block_e)
            yield _spec("w4a4_up_fwd", types, consts, cfg.warps_up, cfg.stages_up, aligned)
