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

from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs
from tsct.kernels.triton_lowbit import specs as LS

# "ternary": the absmean scaling, "ternary_r1": the rank-1 one
FMT = {"dense": 0, "nvfp4": 1, "sign": 2, "fp8": 3, "ternary": 4, "ternary_r1": 5}
_B1 = dict(E=1024, M=32768, r=64)  # b1's experts, routed rows and rank: whether its dz runs the GLU backward


def _b1(spec, f: int, arch: str, opt_in: bool, generic: bool) -> bool:
    """Whether ``spec`` (an entry of the AOT table) is one of the b1 launches of format ``f``: bf16, gather and
    scatter, fp32 scales, row weights, r = 64, aligned (``generic``: the unaligned variant), forward and backward."""
    cfg = specs.CONFIGS[arch]
    c = dict(spec.constexprs)
    t = dict(spec.types)
    if spec.aligned == generic or t.get("x_ptr", t.get("z_ptr", t.get("dy_ptr"))) != "*bf16":
        return False
    if any(c.get(k, f) != f for k in ("FMT_G", "FMT_U", "FMT_D")):
        return False
    if spec.kernel == "lowbit_down_fwd":
        planes = LS.down_planes_shipped(cfg, arch, f, f, cfg.shared.bk)[-1] if opt_in else \
            LS.down_planes(cfg, f, f, cfg.shared.bk)
        return (c["HAS_GATHER"] and c["HAS_SG"] and c["HAS_RW"] == c["BWD"] and c["PLANES"] == planes)
    if spec.kernel == "lowbit_up_fwd":
        return c["HAS_RW"] and c["Y_PAD"] and (c["SINGLE_K"], c["BK"]) == LS.up_k(64, True)
    if spec.kernel == "lowbit_bwd_dz":
        fused = LS.fuse_dz_epi(cfg, f, _B1["E"], _B1["M"], _B1["r"])
        return (c["HAS_SCATTER"] and not c["DO_DWD"] and c["FUSE_EPI"] == fused
                and (not fused or (c["HAS_SG"] and c["HAS_RW"] and t["sg_ptr"] == "*fp32")))
    if spec.kernel == "lowbit_bwd_dx_dw":
        return c["HAS_GATHER"] and c["DO_DX"] and not c["DO_DW"]
    return False


def variants(fmt: str, arch: str, opt_in: bool = False, generic: bool = False) -> list:
    """The b1 launches of ``fmt`` on ``arch`` as the AOT build compiles them (``triton_lowbit.specs.enumerate_specs``:
    the same types, constexprs, warps, stages and register cap; formats outside its AOT_FORMATS, which run through
    Triton JIT, as they would be compiled), one per kernel and direction; ``opt_in``:
    lowbit_down_fwd's byte-plane variants where the arch's table ships both (``specs.down_planes_shipped``)."""
    f = FMT[fmt]
    found = [s for s in LS.enumerate_specs(arch, formats=((f, f, f),)) if _b1(s, f, arch, opt_in, generic)]
    if not found:
        raise SystemExit(f"no b1 variant of {fmt} for {arch}")
    return found


def compile_spec(spec, cap: int, hints: bool = True):
    """``triton.compile`` of one table entry for compute capability ``cap`` as ``triton_common.aot_build`` compiles it
    (``triton_common.specs.compile_variant``), to Triton's own PTX target for ``cap`` (the build emits sm_120 where
    Triton says sm_120a); ``hints`` False: no divisibility hints."""
    from tsct.kernels.triton_lowbit import _kernels as K

    hinted = CS.hinted_params(spec, LS.KERNELS) if hints else []
    return CS.compile_variant(getattr(K, spec.kernel), spec, hinted, cap)


def _resources(cubin: bytes) -> str:
    exe = shutil.which("cuobjdump")
    if exe is None:  # pip's nvidia-cuda-cuobjdump
        import glob

        import triton
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
    unknown = [f for f in a.fmts.split(",") if f not in FMT]
    if unknown:
        ap.error(f"--fmts: unknown format(s) {unknown}; known: {', '.join(FMT)}")
    arch = {"90": "sm_90a", "100": "sm_100a", "120": "sm_120"}[a.arch]
    bad = 0
    for fmt in a.fmts.split(","):
        for spec in variants(fmt, arch, opt_in=a.opt_in, generic=a.generic):
            c = dict(spec.constexprs)
            t0 = time.perf_counter()
            try:
                k = compile_spec(spec, int(a.arch))
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(f"FAIL {fmt:6s} {spec.kernel}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            md = k.metadata
            over = md.shared > CS.MAX_SHARED[arch]
            bad += over
            what = f"bwd={bool(c['BWD'])}" if "BWD" in c else f"fused={bool(c['FUSE_EPI'])}" if "FUSE_EPI" in c else ""
            print(f"ok   {fmt:6s} {spec.kernel:18s} {what:11s} shared={md.shared:6d}{' OVER' if over else ''}"
                  f" {time.perf_counter() - t0:5.1f}s {_resources(k.asm['cubin'])}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
