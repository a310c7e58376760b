"""Compile the low-bit kernels' b1 variants for a GPU target on a machine WITHOUT a GPU (Triton 3.9 can),
to catch lowering errors the interpreter cannot see (join/reshape/trans layouts, bf16 dots) and to
report shared memory and, when cuobjdump is on PATH, registers / local memory (spills).

    PYTHONPATH=python python tools/triton_lowbit_compile_check.py [--arch 90|120]
        [--fmts nvfp4,sign,dense,fp8,ternary,ternary_r1]
        [--generic] [--opt-in]

The variants get the AOT build's ``tt.divisibility=16`` on ``specs.KERNELS[k].hinted`` (the aligned b1 launches)
unless ``--generic`` (the unaligned ones: other layouts, other register counts).

Exit status 1 if any variant fails to compile or needs more shared memory than the arch allows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import triton

from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs
from tsct.kernels.triton_lowbit.glu import WARPS_DECODE
from tsct.kernels.triton_lowbit.specs import (down_planes, down_planes_shipped, dxdw_ndb, factor_types, up_dec16,
                                              up_planes)

# "ternary": the absmean scaling, "ternary_r1": the rank-1 one
FMT = {"dense": 0, "nvfp4": 1, "sign": 2, "fp8": 3, "ternary": 4, "ternary_r1": 5}


def _ptrs(fmt: str, dt: str) -> list[str]:
    return list(factor_types(FMT[fmt], dt.lstrip("*")))


def variants(fmt: str, arch: str, opt_in: bool = False):
    """(kernel, types by param, constexprs, warps, stages) of the b1 launches (bf16, gather+scatter,
    scales, row weight, r = 64, aligned tiles), forward and backward; ``opt_in``: lowbit_down_fwd's byte-plane
    variants instead of the default ones where the arch's table ships both (``specs.down_planes_shipped``)."""
    cfg = specs.CONFIGS[arch]
    sh, lt = cfg.shared, cfg.lowbit
    dt = "*bf16"
    f = FMT[fmt]
    g = _ptrs(fmt, dt)
    planes = down_planes_shipped(cfg, arch, f, f, sh.bk)[-1] if opt_in else down_planes(cfg, f, f, sh.bk)
    for bwd in (False, True):
        types = [dt, "*i64", "*i32", "*i32", *g, *g, "*fp32", "*fp32", dt,
                 "*fp32" if bwd else "*i8", "*fp32" if bwd else "*i8", "*fp32" if bwd else "*i8",
                 "i32", "i32", "i32", "i32"]
        yield ("lowbit_down_fwd", types,
               dict(FMT_G=f, FMT_U=f, HAS_GATHER=True, HAS_SG=True, HAS_SU=True, HAS_RW=bwd, BWD=bwd,
                    PLANES=planes, BM=sh.bm, BR=64, BK=sh.bk, BLOCK_E=sh.block_e),
               WARPS_DECODE, lt.stages_down_lb)
    yield ("lowbit_up_fwd", [dt, "*i32", "*i32", *g, "*fp32", dt, "i32", "i32", "i32", "i32"],
           dict(FMT_D=f, HAS_RW=True, SINGLE_K=True, Y_PAD=True, DEC16=up_dec16(cfg, 64),
                PLANES=up_planes(cfg, f, True, 64), BM=sh.bm, BN=lt.bn_up_lb, BK=64,
                BLOCK_E=sh.block_e),
           lt.warps_up_lb, lt.stages_up_lb)
    yield ("lowbit_bwd_dz", [dt, "*i64", "*i32", "*i32", *g, dt, "*fp32", dt, "i32", "i32", "i32", "i32", "i32"],
           dict(FMT_D=f, HAS_SCATTER=True, DO_DWD=False, BM=sh.bm, BR=64, BN=lt.bn_dz_lb, BLOCK_E=sh.block_e),
           WARPS_DECODE, lt.stages_dz_lb)
    yield ("lowbit_bwd_dx_dw", [dt, "*i64", "*i32", "*i32", *g, *g, dt, dt, dt, "*i8", "*i8", "i32", "i32", "i32",
                                "i32"],
           dict(FMT_G=f, FMT_U=f, HAS_GATHER=True, DO_DX=True, DO_DW=False, BM=sh.bm, BD=lt.bd_dxdw_lb, BR=64,
                NDB=dxdw_ndb(cfg, f, f), BLOCK_E=sh.block_e),
           WARPS_DECODE, lt.stages_dxdw_lb)


def _resources(cubin: bytes) -> str:
    exe = shutil.which("cuobjdump")
    if exe is None:  # pip's nvidia-cuda-cuobjdump
        import glob
        hits = glob.glob(os.path.join(os.path.dirname(os.path.dirname(triton.__file__)), "nvidia", "*", "bin",
                                      "cuobjdump"))
        exe = hits[0] if hits else None
    if exe is None:
        return "(no cuobjdump: registers unknown)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([exe, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    line = [ln.strip() for ln in out.splitlines() if "REG" in ln]
    return line[0] if line else out.strip()[-200:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="90", choices=["90", "100", "120"])
    ap.add_argument("--fmts", default="nvfp4,sign")
    ap.add_argument("--generic", action="store_true", help="no divisibility hints (the unaligned variants)")
    ap.add_argument("--opt-in", action="store_true", help="lowbit_down_fwd's opt-in byte-plane variants where shipped")
    a = ap.parse_args(argv)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tsct.kernels.triton_lowbit import _kernels as K

    arch = {"90": "sm_90a", "100": "sm_100a", "120": "sm_120"}[a.arch]
    bad = 0
    for fmt in a.fmts.split(","):
        for name, types, consts, warps, stages in variants(fmt, arch, opt_in=a.opt_in):
            fn = getattr(K, name)
            runtime = [p for p in fn.arg_names if p not in consts]
            assert len(runtime) == len(types), (name, runtime, types)
            sig = dict(zip(runtime, types))
            sig.update({c: "constexpr" for c in consts})
            signature = {p: sig[p] for p in fn.arg_names}
            from tsct.kernels.triton_lowbit import specs as LS

            attrs = {} if a.generic else {(fn.arg_names.index(p),): [["tt.divisibility", 16]]
                                           for p in LS.KERNELS[name].hinted}
            src = ASTSource(fn=fn, signature=signature, constexprs=dict(consts), attrs=attrs)
            t0 = time.perf_counter()
            try:
                k = triton.compile(src, target=GPUTarget("cuda", int(a.arch), 32),
                                   options=dict(num_warps=warps, num_stages=stages, num_ctas=1))
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(f"FAIL {fmt:6s} {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            md = k.metadata
            over = md.shared > CS.MAX_SHARED[arch]
            bad += over
            print(f"ok   {fmt:6s} {name:18s} bwd={consts.get('BWD', '-')!s:5s} shared={md.shared:6d}"
                  f"{' OVER' if over else ''} {time.perf_counter() - t0:5.1f}s {_resources(k.asm['cubin'])}",
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
