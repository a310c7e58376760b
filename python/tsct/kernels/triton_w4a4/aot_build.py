#!/usr/bin/env python3
"""Compile the W4A4 kernels ahead of time (cubins + index.json per arch) and check their SASS.

    python aot_build.py --out DIR [--archs sm_90a,sm_120] [--jobs N] [--check-sass] [--sass-dir DIR]

Same output format as ``tsct/kernels/triton_glu/aot_build.py`` (``DIR/<arch>/<kernel>_<hash16>.cubin``,
``DIR/<arch>/index.json`` keyed by ``specs.spec_key``; entries with params incl. Triton's two trailing
scratch pointers), so ``tsct.kernels.aot`` loads them unchanged, and the two indexes can be merged
(disjoint kernel names). Differences: the table is ``triton_w4a4.specs``; sm_120 is compiled as the
family target ``sm_120f`` (plain sm_120 has no block-scaled MMA; ptxas rejects it), recorded in each
entry as ``"ptx_arch"``; each ptx arch gets its own Triton cache directory (Triton's cache key does not
include the patched arch name: a shared cache would hand an sm_120a cubin to an sm_120f build).

``--check-sass`` disassembles every up-projection cubin (cuobjdump: $CUOBJDUMP, PATH, the nvidia-cu13
wheel, or Triton's bundled one) and fails unless it holds ``specs.REQUIRED_SASS[arch]``; it writes a
per-kernel instruction histogram to ``DIR/<arch>/sass_summary.json``. Pinned to Triton 3.9.0 like the
bf16 build. Needs no GPU and no torch.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


specs = _load("_tsct_w4a4_specs", _HERE / "specs.py")
_state: dict = {}


def _init_worker(cache_root: str, ptx_arch: str, capability: int) -> None:
    os.environ["TRITON_CACHE_DIR"] = str(Path(cache_root) / ptx_arch)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    import triton
    import triton.backends.nvidia.compiler as nvc

    orig = nvc.sm_arch_from_capability
    nvc.sm_arch_from_capability = lambda c: ptx_arch if c == capability else orig(c)
    _state.update(triton=triton, kernels=_load("_tsct_w4a4_kernels", _HERE / "_kernels.py"))


def _compile(arch: str, spec) -> dict:
    triton = _state["triton"]
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(_state["kernels"], spec.kernel)
    info = specs.KERNELS[spec.kernel]
    consts = dict(spec.constexprs)
    types = dict(spec.types)
    runtime = [a for a in fn.arg_names if a not in consts]
    if tuple(runtime) != info.params or set(consts) != set(info.constexprs):
        raise SystemExit(f"aot_build(w4a4): {spec.kernel}: parameters {fn.arg_names} do not match specs.KERNELS")
    signature = {a: ("constexpr" if a in consts else types[a]) for a in fn.arg_names}
    attrs = {}
    if spec.aligned:
        attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in info.hinted
                 if specs.is_used(spec.kernel, p, consts)}
    cx = {k: (bool(v) if k.startswith(("HAS_", "SINGLE_")) else v) for k, v in consts.items()}
    cap, ptx_arch = specs.PTX_ARCH[arch]
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=cx, attrs=attrs),
                       target=GPUTarget("cuda", cap, 32),
                       options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages, num_ctas=1,
                                    enable_fp_fusion=True))
    md = k.metadata
    problems = []
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        problems.append("needs scratch memory")
    if md.num_ctas != 1 or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        problems.append("needs a cluster / cooperative / PDL launch")
    if md.shared > specs.MAX_SHARED[arch]:
        problems.append(f"needs {md.shared} bytes of shared memory (> {specs.MAX_SHARED[arch]})")
    target = re.search(r"^\.target\s+(\S+)", k.asm["ptx"], re.M).group(1)
    if target != ptx_arch:
        problems.append(f"PTX target {target}, expected {ptx_arch} (stale Triton cache?)")
    if problems:
        raise SystemExit(f"aot_build(w4a4): {arch} {spec.key}: " + "; ".join(problems))
    cubin = k.asm["cubin"]
    params = [{"name": p, "type": types[p]} for p in info.params]
    params += [{"name": p, "type": "*i8"} for p in specs.SCRATCH_PARAMS]
    return {"key": spec.key, "kernel": spec.kernel, "function": md.name,
            "file": specs.key_file_stem(spec.key) + ".cubin", "num_warps": md.num_warps, "num_ctas": md.num_ctas,
            "num_stages": spec.num_stages, "shared": md.shared, "tmem_size": getattr(md, "tmem_size", 0),
            "params": params, "constexprs": consts, "aligned": spec.aligned, "ptx_arch": ptx_arch,
            "hinted": [p for p in info.hinted if spec.aligned and specs.is_used(spec.kernel, p, consts)],
            "sha256": hashlib.sha256(cubin).hexdigest(), "compile_s": round(time.perf_counter() - t0, 3),
            "_cubin": cubin}


def find_cuobjdump() -> str:
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel (cu13)
        for p in nvidia.__path__:
            cands.append(str(Path(p) / "cu13" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        cands.append(str(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise SystemExit("aot_build(w4a4): no cuobjdump (set CUOBJDUMP or pip install nvidia-cuda-cuobjdump)")


_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", re.M)


def sass_summary(cuobjdump: str, path: Path) -> dict:
    """{"code_for": "sm_120", "ops": {full mnemonic: count}} of one cubin."""
    out = subprocess.run([cuobjdump, "-sass", str(path)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"code for (sm_\w+)", out)
    return {"code_for": m.group(1) if m else None, "ops": dict(collections.Counter(_OP.findall(out)).most_common())}


def check_sass(out: Path, archs: list[str]) -> dict:
    cuobj = find_cuobjdump()
    report = {}
    for a in archs:
        idx = json.loads((out / a / "index.json").read_text())
        per = {}
        for key, ent in sorted(idx["kernels"].items()):
            s = sass_summary(cuobj, out / a / ent["file"])
            per[key] = s
            need = specs.REQUIRED_SASS.get(a)
            if ent["kernel"] == "w4a4_up_fwd" and need and not any(op.startswith(need) for op in s["ops"]):
                raise SystemExit(f"aot_build(w4a4): {a} {key}: no {need} in the SASS")
        (out / a / "sass_summary.json").write_text(json.dumps(per, indent=1, sort_keys=True) + "\n")
        report[a] = per
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--archs", default="sm_90a,sm_120")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--check-sass", action="store_true")
    ap.add_argument("--allow-other-triton", action="store_true")
    args = ap.parse_args(argv)
    import triton
    if triton.__version__ != specs.TRITON_VERSION and not args.allow_other_triton:
        raise SystemExit(f"aot_build(w4a4): Triton {triton.__version__}; pinned to {specs.TRITON_VERSION}")
    archs = [a for a in args.archs.split(",") if a]
    out = args.out.resolve()
    cache = (args.cache_dir or out.with_name(out.name + ".cache")).resolve()
    t0 = time.time()
    results = {a: {} for a in archs}
    for a in archs:  # one pool per arch: the arch-name patch is per process
        cap, ptx = specs.PTX_ARCH[a]
        todo = list(specs.enumerate_specs(a))
        with cf.ProcessPoolExecutor(max(1, args.jobs), initializer=_init_worker, initargs=(str(cache), ptx, cap)) as ex:
            for r in ex.map(_compile, [a] * len(todo), todo):
                results[a][r["key"]] = r
    summary = {"triton_version": triton.__version__, "archs": {}}
    for a in archs:
        d = out / a
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        entries = {}
        for key in sorted(results[a]):
            r = dict(results[a][key])
            (d / r["file"]).write_bytes(r.pop("_cubin"))
            entries[key] = r
        (d / "index.json").write_text(json.dumps({"arch": a, "target": f"cuda:{specs.PTX_ARCH[a][0]}:32",
                                                  "ptx_arch": specs.PTX_ARCH[a][1], "triton_version": triton.__version__,
                                                  "kernels": entries}, indent=1, sort_keys=True) + "\n")
        summary["archs"][a] = {"variants": len(entries), "compile_s": round(sum(e["compile_s"] for e in entries.values()), 1),
                               "bytes": sum((d / e["file"]).stat().st_size for e in entries.values())}
    (out / "index.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"aot_build(w4a4): {sum(len(v) for v in results.values())} cubins in {time.time() - t0:.0f} s -> {out}")
    print(json.dumps(summary["archs"]))
    if args.check_sass:
        rep = check_sass(out, archs)
        for a, per in rep.items():
            for key, s in per.items():
                mma = {k: v for k, v in s["ops"].items() if "MMA" in k}
                print(f"  {a} code for {s['code_for']}: {key.split('|')[0]} {key.split('|')[2]} "
                      f"{key.split('|')[-1]}: {mma}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
