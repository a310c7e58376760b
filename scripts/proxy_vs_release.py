"""How the sm_120 proxy's cubins differ from the sm_120 release cubins (docs/decisions/0017), on the CPU.

    python scripts/proxy_vs_release.py [--cache DIR]      (needs the pinned Triton; ~1 minute)

Compiles one aligned bf16 variant per (GEMM kernel, factor format, PLANES) of sm_120's table twice with the AOT
build's own compile setup (``aot_build._init_worker``): as the release does (GPUTarget cuda:120, PTX sm_120) and as
the proxy does (the same GPUTarget, LLVM and ptxas for sm_90). Prints per variant whether the TTGIR is identical,
the sm_120 PTX's packed f32x2 instructions (sm_100+ only), the PTX opcode counts that differ once each packed op
is counted as two scalar ones, and the SASS counts of the matrix, ldmatrix and cp.async instructions of both
cubins (cuobjdump from Triton's package).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tsct" / "kernels" / "triton_common"))
import aot_build as ab  # noqa: E402

GEMMS = ("glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw", "lowbit_down_fwd", "lowbit_up_fwd",
         "lowbit_bwd_dz", "lowbit_bwd_dx_dw")
_PTX_OP = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", re.M)
_SASS = re.compile(r"\b(HMMA\.\S+|HGMMA\S*|LDSM\S*|LDGSTS\S*)")


def compile_variant(family, spec, ptx_arch, cache):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fs = ab.family_specs(family)
    os.environ["TRITON_CACHE_DIR"] = str(cache / family / ptx_arch)
    ab._state["ptx"].clear()
    ab._state["ptx"][120] = ptx_arch
    fn = getattr(ab._state["kernels"][family], spec.kernel)
    info, consts, types = fs.KERNELS[spec.kernel], dict(spec.constexprs), dict(spec.types)
    sig = {a: ("constexpr" if a in consts else types[a]) for a in fn.arg_names}
    hinted = [p for p in info.hinted if spec.aligned and fs.is_used(spec.kernel, p, consts)]
    attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in hinted}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={k: (bool(v) if k.startswith(ab._BOOL_PREFIXES) else v) for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 120, 32),
                          options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages, num_ctas=1,
                                       enable_fp_fusion=True))


def ptx_ops(ptx: str) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for op in _PTX_OP.findall(ptx):
        c[op.replace(".f32x2", ".f32")] += 2 if ".f32x2" in op else 1
    return c


def sass_ops(cubin: bytes) -> dict:
    import triton

    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(exe), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return dict(sorted(collections.Counter(_SASS.findall(text)).items()))


def picks():
    seen = set()
    for family in ("glu", "lowbit"):
        for s in ab.family_specs(family).enumerate_specs("sm_120"):
            c = dict(s.constexprs)
            if s.kernel not in GEMMS or not s.aligned or "*bf16" not in dict(s.types).values() or c.get("BK", 64) != 64:
                continue
            tag = (s.kernel, c.get("FMT_G", c.get("FMT_D")), c.get("PLANES"))
            if tag not in seen:
                seen.add(tag)
                yield family, s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tsct_proxy_vs_release")
    args = ap.parse_args()
    ab._init_worker()
    for family, s in picks():
        a = compile_variant(family, s, "sm_120", args.cache)
        b = compile_variant(family, s, "sm_90", args.cache)
        ha, hb = ptx_ops(a.asm["ptx"]), ptx_ops(b.asm["ptx"])
        packed = sum(1 for op in _PTX_OP.findall(a.asm["ptx"]) if ".f32x2" in op)
        c = dict(s.constexprs)
        print(s.kernel, {k: c[k] for k in ("FMT_G", "FMT_D", "PLANES", "WD_T") if k in c},
              "| TTGIR identical:", a.asm["ttgir"] == b.asm["ttgir"], "| f32x2 ops in the sm_120 PTX:", packed,
              "| PTX opcode counts that differ (sm_120, proxy):",
              {k: (ha[k], hb[k]) for k in sorted(set(ha) | set(hb)) if ha[k] != hb[k]},
              "| SASS sm_120:", sass_ops(a.asm["cubin"]), "proxy:", sass_ops(b.asm["cubin"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
