#!/usr/bin/env python3
"""Compile the Triton grouped-GLU kernels ahead of time: cubins + a JSON index per arch.

    python aot_build.py --out DIR [--archs sm_90a,sm_100a,sm_120] [--jobs N] [--cache-dir DIR]

Run by CMake at wheel-build time (option TSCT_TRITON_AOT) with the build environment's Python, which
has the pinned Triton (pyproject.toml [build-system].requires); needs no GPU. For each arch and each
specialization in ``specs.enumerate_specs(arch)`` (the table glu.py launches from) it calls
``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cc, 32))`` with
an explicit signature and, for aligned specializations, ``tt.divisibility=16`` on the parameters in
``specs.KERNELS[k].hinted``, and writes

    DIR/<arch>/<kernel>_<hash16>.cubin
    DIR/<arch>/index.json     {"arch", "triton_version", "kernels": {spec key: entry}}
    DIR/index.json            {"triton_version", "archs": {arch: {"variants": n, "kernels": {name: n}}}}

An entry holds the kernel name, file, num_warps, num_ctas, num_stages, shared bytes, the parameter
list in launch order (including Triton's trailing global/profile scratch pointers), the constexprs,
the alignment flag and the cubin's sha256. The build fails if a variant needs scratch memory, more
than one CTA, or more shared memory than its arch allows.

sm_120: Triton names every capability >= 90 "sm_XXa"; an sm_120a cubin would not load on 12.1
parts, so this build makes Triton emit plain sm_120 (bf16 mma.sync needs no arch-specific feature).

Incremental: Triton's own cache (``--cache-dir``, default ``DIR.cache``, never shipped) keys on the
kernel source, so a rebuild with unchanged sources only rewrites the outputs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import importlib.util

_HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    """Load a module of this directory by path: the build env has Triton but no torch, so the tsct
    package (whose __init__ imports torch) must not be imported."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


specs = _load("_tsct_aot_specs", _HERE / "specs.py")  # no torch, no triton

_state: dict = {}


def _init_worker(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's 3.x default, stated (the JIT uses it too)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # no source line tables: a third of the cubin bytes
    import triton
    import triton.backends.nvidia.compiler as nvc

    orig = nvc.sm_arch_from_capability

    def sm_arch(capability: int) -> str:
        return "sm_120" if capability == 120 else orig(capability)

    nvc.sm_arch_from_capability = sm_arch
    _state.update(triton=triton, kernels=_load("_tsct_aot_kernels", _HERE / "_kernels.py"))


def _compile(arch: str, spec: specs.Spec) -> dict:
    triton = _state["triton"]
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(_state["kernels"], spec.kernel)
    info = specs.KERNELS[spec.kernel]
    consts = dict(spec.constexprs)
    types = dict(spec.types)
    runtime = [a for a in fn.arg_names if a not in consts]
    if tuple(runtime) != info.params or set(consts) != set(info.constexprs):
        raise SystemExit(f"aot_build: {spec.kernel}: parameters {fn.arg_names} do not match specs.KERNELS")
    signature = {a: ("constexpr" if a in consts else types[a]) for a in fn.arg_names}
    attrs = {}
    if spec.aligned:
        attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in info.hinted
                 if specs.is_used(spec.kernel, p, consts)}
    src = ASTSource(fn=fn, signature=signature, constexprs={k: (bool(v) if k.startswith(("HAS_", "DO_", "BWD",
                    "SINGLE_")) else v) for k, v in consts.items()}, attrs=attrs)
    t0 = time.perf_counter()
    k = triton.compile(src, target=GPUTarget("cuda", specs.TARGET_CAPABILITY[arch], 32),
                       options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages, num_ctas=1,
                                    enable_fp_fusion=True))
    md = k.metadata
    problems = []
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        problems.append(f"needs scratch memory ({md.global_scratch_size}, {md.profile_scratch_size})")
    if md.num_ctas != 1 or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        problems.append("needs a cluster / cooperative / PDL launch")
    if md.shared > specs.MAX_SHARED[arch]:
        problems.append(f"needs {md.shared} bytes of shared memory (> {specs.MAX_SHARED[arch]})")
    if problems:
        raise SystemExit(f"aot_build: {arch} {spec.key}: " + "; ".join(problems))
    cubin = k.asm["cubin"]
    params = [{"name": p, "type": types[p]} for p in info.params]
    params += [{"name": p, "type": "*i8"} for p in specs.SCRATCH_PARAMS]
    return {
        "key": spec.key,
        "kernel": spec.kernel,
        "function": md.name,
        "file": specs.key_file_stem(spec.key) + ".cubin",
        "num_warps": md.num_warps,
        "num_ctas": md.num_ctas,
        "num_stages": spec.num_stages,
        "shared": md.shared,
        "tmem_size": getattr(md, "tmem_size", 0),
        "params": params,
        "constexprs": consts,
        "aligned": spec.aligned,
        "hinted": [p for p in info.hinted if spec.aligned and specs.is_used(spec.kernel, p, consts)],
        "sha256": hashlib.sha256(cubin).hexdigest(),
        "compile_s": round(time.perf_counter() - t0, 3),
        "_cubin": cubin,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--archs", default=",".join(specs.CONFIGS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=0, help="compile only the first N variants per arch (testing)")
    ap.add_argument("--allow-other-triton", action="store_true",
                    help=f"do not insist on Triton {specs.TRITON_VERSION} (development only)")
    args = ap.parse_args(argv)

    try:
        import triton
    except ImportError as e:
        raise SystemExit(f"aot_build: Triton is not importable ({e}); install triton=={specs.TRITON_VERSION} "
                         "or build with -DTSCT_TRITON_AOT=OFF") from None
    if triton.__version__ != specs.TRITON_VERSION and not args.allow_other_triton:
        raise SystemExit(f"aot_build: Triton {triton.__version__} found; the AOT build is pinned to "
                         f"{specs.TRITON_VERSION} (pyproject.toml [build-system].requires)")
    archs = [a for a in args.archs.replace(";", ",").split(",") if a]
    for a in archs:
        if a not in specs.CONFIGS:
            raise SystemExit(f"aot_build: unknown arch {a!r}; expected some of {list(specs.CONFIGS)}")
    out: Path = args.out.resolve()
    cache = (args.cache_dir or out.with_name(out.name + ".cache")).resolve()
    cache.mkdir(parents=True, exist_ok=True)

    jobs = [(a, s) for a in archs for s in list(specs.enumerate_specs(a))[: args.limit or None]]
    t0 = time.time()
    results: dict[str, dict[str, dict]] = {a: {} for a in archs}
    if args.jobs <= 1:
        _init_worker(str(cache))
        done = (_compile(a, s) for a, s in jobs)
        for (a, _), r in zip(jobs, done):
            results[a][r["key"]] = r
    else:
        with cf.ProcessPoolExecutor(args.jobs, initializer=_init_worker, initargs=(str(cache),)) as ex:
            futs = {ex.submit(_compile, a, s): a for a, s in jobs}
            for n, fut in enumerate(cf.as_completed(futs), 1):
                r = fut.result()
                results[futs[fut]][r["key"]] = r
                if n % 100 == 0:
                    print(f"aot_build: {n}/{len(jobs)} compiled ({time.time() - t0:.0f} s)", flush=True)

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
            r.pop("compile_s")
            entries[key] = r
        index = {"arch": a, "target": f"cuda:{specs.TARGET_CAPABILITY[a]}:32", "triton_version": triton.__version__,
                 "kernels": entries}
        (d / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        per_kernel: dict[str, int] = {}
        for r in entries.values():
            per_kernel[r["kernel"]] = per_kernel.get(r["kernel"], 0) + 1
        summary["archs"][a] = {"variants": len(entries), "kernels": dict(sorted(per_kernel.items())),
                               "bytes": sum((d / r["file"]).stat().st_size for r in entries.values())}
    (out / "index.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    total = sum(len(v) for v in results.values())
    print(f"aot_build: {total} cubins for {','.join(archs)} with Triton {triton.__version__} "
          f"in {time.time() - t0:.0f} s ({args.jobs} jobs) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
