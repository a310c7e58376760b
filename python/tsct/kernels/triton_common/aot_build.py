#!/usr/bin/env python3
"""Compile the Triton kernel families ahead of time: cubins + one JSON index per arch.

    python python/tsct/kernels/triton_common/aot_build.py --out DIR [--archs sm_90a,sm_120] [--families glu,lowbit]
                        [--jobs N] [--cache-dir DIR] [--check-sass]

Run by CMake at wheel-build time (option TSCT_TRITON_AOT) with the build environment's Python, which
has the pinned Triton (pyproject.toml [build-system].requires); needs no GPU and no torch.

A *family* is a kernel module, its variant table and its PTX target per arch (``FAMILIES``):

  glu    triton_glu/_kernels.py, triton_glu/specs.py       (bf16 / fp16 grouped GLU, fwd + bwd; and the shared
                                                            kernels of triton_common/_kernels.py, which its table
                                                            and kernel module list)
  lowbit triton_lowbit/_kernels.py, triton_lowbit/specs.py (W4A16 / sign-A16 GLU, fwd + bwd; calls the shared
                                                            helpers of triton_common/_kernels.py)

Both families' modules import the shared ones of this package (``triton_common/specs.py``, ``_kernels.py``), which the
build loads first under their package names (by path: no tsct package, no torch).

For each (family, arch, specialization in ``specs.enumerate_specs(arch)``, the table the host code
launches from) it calls ``triton.compile(ASTSource(fn, signature, constexprs, attrs),
target=GPUTarget("cuda", cc, 32))`` (``specs.compile_variant``, which development tools call too) with an explicit
signature and, for aligned specializations, ``tt.divisibility=16`` on the parameters in ``specs.KERNELS[k].hinted``
that the variant reads (``specs.hinted_params``), and writes

    DIR/<arch>/<kernel>_<hash16>.cubin
    DIR/<arch>/index.json     {"arch", "target", "triton_version", "families", "kernels": {spec key: entry},
                               "sources": {kernel: source fingerprint}}
    DIR/index.json            {"triton_version", "archs": {arch: {"variants": n, "kernels": {name: n}, "bytes"}}}

Every family goes into the same per-arch index (kernel names never collide; the build checks).
An entry holds the kernel name, family, ptx_arch, file, num_warps, num_ctas, num_stages (and maxnreg when capped),
shared bytes, the parameter list in launch order (including Triton's trailing global/profile scratch pointers), the
constexprs, the alignment flag, the cubin's sha256 and the TTGIR's (``ttgir_sha256``). "sources" holds, per kernel
name, ``tsct.kernels.source_key`` of the source it was compiled from (the kernel and its jit callees; the same on
every arch), so an install can tell which source its cubins are without Triton or the source (the sm_120 proxy
verdicts compare it with the source a proxy run launched, ``tsct.kernels.sm120_proxy``). The build fails if a
variant needs scratch memory, more than one CTA, or more shared memory than its arch allows, or if its PTX
target is not the family's, and if a kernel source file changed while it compiled (the fingerprints, taken after
the compiles, would then name a source the cubins were not built from).

PTX targets: Triton names every capability >= 90 "sm_XXa"; the build patches that name per compile
job to the family's ``specs.PTX_ARCH[arch]``: plain sm_120 for the bf16 kernels (an sm_120a cubin
would not load on 12.1 parts; bf16 mma.sync needs no arch-specific feature).

Proxies (``specs.PROXIES``, docs/decisions/0017): ``--archs sm_120_proxy_sm90`` (alone) compiles sm_120's table of
the proxy's families (glu, lowbit) with sm_120's GPUTarget, so the TTGIR, tiles and the 101,376-byte limit are
sm_120's, while LLVM and ptxas emit plain sm_90 (mma.sync; no wgmma can be emitted) so that an H200 loads them. Its
index.json records ``"proxy"``; ``tsct.kernels.aot`` then serves compute capability 9.0 from it with sm_120's tiles.

Incremental: Triton's own cache (``--cache-dir``, default ``DIR.cache``, never shipped) keys on the
kernel source but not on the patched arch name, so each (family, PTX target) has its own cache
directory ``<cache>/<family>/<ptx arch>``; a rebuild with unchanged sources only rewrites the outputs.

``--check-sass`` disassembles every cubin that a ``tsct.native.artifacts.SASS_RULES`` row covers
(cuobjdump: $CUOBJDUMP, PATH, the nvidia-cuda-cuobjdump wheel, or Triton's bundled one), fails on a
rule violation and writes a per-kernel instruction histogram to ``DIR/<arch>/sass_summary.json``
(development; the wheel build does not pass it, ``ci/check_artifacts.py --sass`` checks the install).
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
_KERNELS_DIR = _HERE.parent                       # python/tsct/kernels
_ARTIFACTS = _KERNELS_DIR.parent / "native" / "artifacts.py"


def _load(name: str, path: Path, alias: str | None = None):
    """Load a module by path: the build env has Triton but no torch, so the tsct package (whose
    __init__ imports torch) must not be imported. ``alias``: also register it under that name, so
    that a family's ``from tsct.kernels.triton_common.X import ...`` finds it."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    if alias:
        sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    return mod


# The shared table module first: the families' specs import from it.
specs = _load("_tsct_aot_common_specs", _HERE / "specs.py", alias="tsct.kernels.triton_common.specs")

# family -> (package directory, specs module name, kernels module name); the glu family's names are the ones the
# build has always used for it (the module name is part of Triton's cache key).
FAMILIES: dict[str, tuple[Path, str, str]] = {
    "glu": (_KERNELS_DIR / "triton_glu", "_tsct_aot_specs", "_tsct_aot_kernels"),
    "lowbit": (_KERNELS_DIR / "triton_lowbit", "_tsct_lowbit_specs", "_tsct_lowbit_kernels"),
}


def family_specs(family: str):
    """The variant table module of a family (no Triton, no torch)."""
    d, name, _ = FAMILIES[family]
    return sys.modules.get(name) or _load(name, d / "specs.py")


def family_archs(family: str) -> tuple[str, ...]:
    """The arches a family ships cubins for (default: all of its PTX_ARCH table), and the proxies
    (``specs.PROXIES``) that hold it and proxy one of those arches."""
    fs = family_specs(family)
    archs = tuple(getattr(fs, "AOT_ARCHS", None) or fs.PTX_ARCH)
    return archs + tuple(a for a, p in specs.PROXIES.items() if family in p.families and p.of in archs)


def target(family: str, arch: str) -> tuple[int, str, int]:
    """(Triton's GPUTarget capability, the PTX / ptxas arch to emit, the shared-memory limit in bytes) of a
    family's cubins for an artifact arch: a proxy compiles its ``of`` arch (capability, limit) to its own PTX
    target (docs/decisions/0017)."""
    fs = family_specs(family)
    p = specs.PROXIES.get(arch)
    if p is not None:
        return fs.PTX_ARCH[p.of][0], p.ptx, specs.MAX_SHARED[p.of]
    cap, ptx = fs.PTX_ARCH[arch]
    return cap, ptx, specs.MAX_SHARED[arch]


def proxy_info(arch: str) -> dict | None:
    """What a proxy's index records about it (None for a release arch)."""
    p = specs.PROXIES.get(arch)
    if p is None:
        return None
    return {"of": p.of, "ptx": p.ptx, "capability": list(p.capability), "max_shared": specs.MAX_SHARED[p.of],
            "families": list(p.families),
            "note": f"{p.of}'s variant table and TTGIR compiled for {p.ptx}: runs {p.of}'s kernel logic on compute "
                    f"capability {p.capability[0]}.{p.capability[1]}; a development build, not a release "
                    "(docs/decisions/0017)"}


_state: dict = {}


def _init_worker() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's 3.x default, stated (the JIT uses it too)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # no source line tables: a third of the cubin bytes
    import triton.backends.nvidia.compiler as nvc

    orig = nvc.sm_arch_from_capability
    ptx = _state.setdefault("ptx", {})  # capability -> PTX target of the job being compiled

    def sm_arch(capability: int) -> str:
        return ptx.get(capability) or orig(capability)

    nvc.sm_arch_from_capability = sm_arch
    # Triton's make_ptx sets the PTX .target to sm_<capability>; a proxy job's LLVM and ptxas emit another arch
    # (Proxy.ptx), so its .target must name that one (for every other job this changes nothing)
    orig_ptx = nvc.CUDABackend.make_ptx

    def make_ptx(self, src, metadata, opt, capability):
        out = orig_ptx(self, src, metadata, opt, capability)
        want = ptx.get(capability)
        return re.sub(r"^(\.target\s+)\S+", rf"\g<1>{want}", out, count=1, flags=re.M) if want else out

    nvc.CUDABackend.make_ptx = make_ptx
    _state.update(kernels=_kernel_modules())


def _kernel_modules() -> dict:
    """{family: its loaded kernels module} (imports Triton). The shared sources (``triton_common/_kernels.py``) load
    first, under their package name: every family imports its helpers from there."""
    if "kernels" in _state:
        return _state["kernels"]
    _load("_tsct_aot_common_kernels", _HERE / "_kernels.py", alias="tsct.kernels.triton_common._kernels")
    mods = {fam: _load(kname, d / "_kernels.py") for fam, (d, _, kname) in FAMILIES.items()}
    _state["kernels"] = mods
    return mods


def source_keys(families) -> dict[str, str]:
    """{kernel: source fingerprint} of the families' kernels (``tsct.kernels.source_key``: the kernel's source and
    its jit callees, independent of arch, variant and Triton version); an arch index records them as "sources"."""
    sk = sys.modules.get("_tsct_aot_source_key") or _load("_tsct_aot_source_key", _KERNELS_DIR / "source_key.py")
    mods = _kernel_modules()
    return {k: v for f in families for k, v in sk.source_keys(mods[f], family_specs(f).KERNELS).items()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _kernel_files(families) -> dict[Path, str]:
    """{kernel source file: sha256} of the families' and the shared kernels, read before compiling."""
    files = [_HERE / "_kernels.py"] + [FAMILIES[f][0] / "_kernels.py" for f in families]
    return {f: _sha256(f) for f in files}


def _compile(family: str, arch: str, spec, cache_dir: str) -> dict:
    fs = family_specs(family)
    cap, ptx_arch, max_shared = target(family, arch)
    os.environ["TRITON_CACHE_DIR"] = cache_dir  # read by Triton at each compile
    _state["ptx"].clear()
    _state["ptx"][cap] = ptx_arch
    fn = getattr(_state["kernels"][family], spec.kernel)
    info = fs.KERNELS[spec.kernel]
    consts = dict(spec.constexprs)
    types = dict(spec.types)
    runtime = [a for a in fn.arg_names if a not in consts]
    if tuple(runtime) != info.params or set(consts) != set(info.constexprs):
        raise SystemExit(f"aot_build: {spec.kernel}: parameters {fn.arg_names} do not match the {family} specs.KERNELS")
    hinted = specs.hinted_params(spec, fs.KERNELS)
    t0 = time.perf_counter()
    k = specs.compile_variant(fn, spec, hinted, cap)
    md = k.metadata
    problems = []
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        problems.append(f"needs scratch memory ({md.global_scratch_size}, {md.profile_scratch_size})")
    if md.num_ctas != 1 or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        problems.append("needs a cluster / cooperative / PDL launch")
    if md.shared > max_shared:
        problems.append(f"needs {md.shared} bytes of shared memory (> {max_shared})")
    m = re.search(r"^\.target\s+(\S+)", k.asm.get("ptx", ""), re.M)
    if m is None or m.group(1) != ptx_arch:
        problems.append(f"PTX target {m and m.group(1)}, expected {ptx_arch} (stale Triton cache?)")
    if problems:
        raise SystemExit(f"aot_build: {family} {arch} {spec.key}: " + "; ".join(problems))
    cubin = k.asm["cubin"]
    params = [{"name": p, "type": types[p]} for p in info.params]
    params += [{"name": p, "type": "*i8"} for p in specs.SCRATCH_PARAMS]
    return {
        "key": spec.key,
        "kernel": spec.kernel,
        "family": family,
        "ptx_arch": ptx_arch,
        "function": md.name,
        "file": specs.key_file_stem(spec.key) + ".cubin",
        "num_warps": md.num_warps,
        "num_ctas": md.num_ctas,
        "num_stages": spec.num_stages,
        **({"maxnreg": spec.maxnreg} if spec.maxnreg else {}),  # the register cap it was compiled with
        "shared": md.shared,
        "tmem_size": getattr(md, "tmem_size", 0),
        "params": params,
        "constexprs": consts,
        "aligned": spec.aligned,
        "hinted": hinted,
        "sha256": hashlib.sha256(cubin).hexdigest(),
        # the TTGIR's hash: a proxy's variant has its proxied arch's TTGIR (decision 0017), which two indexes show
        "ttgir_sha256": hashlib.sha256(k.asm["ttgir"].encode()).hexdigest(),
        "compile_s": round(time.perf_counter() - t0, 3),
        "_cubin": cubin,
    }


# ---- --check-sass (development): the SASS_RULES of tsct.native.artifacts on the fresh cubins ---------

_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", re.M)


def _cuobjdump(artifacts) -> str:
    exe = artifacts.find_tool("cuobjdump")
    if exe is None:
        spec = importlib.util.find_spec("triton")
        cand = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump" if spec and spec.origin else None
        exe = str(cand) if cand and cand.is_file() and os.access(cand, os.X_OK) else None
    if exe is None:
        raise SystemExit(f"aot_build: --check-sass needs cuobjdump ({artifacts.CUOBJDUMP_HINT} or set CUOBJDUMP)")
    return exe


def check_sass(out: Path, archs: list[str]) -> dict:
    """Disassemble every cubin a SASS_RULES row covers; fail on a rule; write sass_summary.json per arch:
    {key: {"code_for": "sm_120", "ops": {mnemonic: count}}}."""
    artifacts = _load("_tsct_aot_artifacts", _ARTIFACTS)
    exe = _cuobjdump(artifacts)
    report, bad = {}, []
    for a in archs:
        idx = json.loads((out / a / "index.json").read_text())
        per = {}
        for key, ent in sorted(idx["kernels"].items()):
            if not artifacts.rules_cover(a, ent["kernel"]):
                continue
            text = subprocess.run([exe, "-sass", str(out / a / ent["file"])], check=True, capture_output=True,
                                  text=True).stdout
            codes, funcs = artifacts.cubin_sass(text)
            per[key] = {"code_for": codes[0] if codes else None,
                        "ops": dict(collections.Counter(_OP.findall(text)).most_common())}
            bad += [f"{a} {key} ({kn}): {what}" for kn, what in artifacts.rule_failures(a, funcs)]
            if set(codes) != {artifacts.elf_arch(a, idx)}:
                bad.append(f"{a} {key}: SASS is 'code for' {sorted(set(codes))}")
        (out / a / "sass_summary.json").write_text(json.dumps(per, indent=1, sort_keys=True) + "\n")
        report[a] = per
    if bad:
        raise SystemExit("aot_build: SASS_RULES violated:\n  " + "\n  ".join(bad[:20]))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--archs", default=",".join(specs.RELEASE_ARCHS))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=0, help="compile only the first N variants per family and arch (testing)")
    ap.add_argument("--check-sass", action="store_true", help="apply SASS_RULES to the new cubins (cuobjdump)")
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
        if a not in specs.PTX_ARCH and a not in specs.PROXIES:
            raise SystemExit(f"aot_build: unknown arch {a!r}; expected some of {list(specs.PTX_ARCH)} "
                             f"or a proxy {list(specs.PROXIES)}")
    if any(a in specs.PROXIES for a in archs) and len(archs) > 1:
        # a proxy replaces a release arch at run time: an install holds proxy cubins alone, never mixed
        raise SystemExit(f"aot_build: a proxy arch builds alone, got {archs}")
    families = [f for f in args.families.replace(";", ",").split(",") if f]
    for f in families:
        if f not in FAMILIES:
            raise SystemExit(f"aot_build: unknown kernel family {f!r}; expected some of {list(FAMILIES)}")
    names: dict[str, str] = {}
    for f in families:
        for k in family_specs(f).KERNELS:
            if names.setdefault(k, f) != f:
                raise SystemExit(f"aot_build: kernel {k!r} is in the families {names[k]} and {f}")
    out: Path = args.out.resolve()
    cache = (args.cache_dir or out.with_name(out.name + ".cache")).resolve()

    jobs = []  # (family, arch, spec, cache dir of the family's PTX target)
    for f in families:
        fs = family_specs(f)
        for a in archs:
            if a not in family_archs(f):
                continue
            # Triton's cache keys on the capability, not the emitted arch: a proxy has a directory of its own
            cdir = cache / f / (a if a in specs.PROXIES else fs.PTX_ARCH[a][1])
            cdir.mkdir(parents=True, exist_ok=True)
            table = list(fs.enumerate_specs(specs.table_arch(a)))  # a proxy: its ``of`` arch's table, key for key
            jobs += [(f, a, s, str(cdir)) for s in table[: args.limit or None]]
    t0 = time.time()
    kernel_files = _kernel_files(families)  # the index's "sources" must be of the text the cubins were compiled from
    results: dict[str, dict[str, dict]] = {a: {} for a in archs}
    if args.jobs <= 1:
        _init_worker()
        for j in jobs:
            r = _compile(*j)
            results[j[1]][r["key"]] = r
    else:
        with cf.ProcessPoolExecutor(args.jobs, initializer=_init_worker) as ex:
            futs = {ex.submit(_compile, *j): j[1] for j in jobs}
            for n, fut in enumerate(cf.as_completed(futs), 1):
                r = fut.result()
                results[futs[fut]][r["key"]] = r
                if n % 100 == 0:
                    print(f"aot_build: {n}/{len(jobs)} compiled ({time.time() - t0:.0f} s)", flush=True)

    summary = {"triton_version": triton.__version__, "archs": {}}
    changed = [str(f) for f, h in kernel_files.items() if _sha256(f) != h]
    if changed:
        raise SystemExit(f"aot_build: kernel sources changed during the build ({', '.join(changed)}); build again")
    sources = source_keys(families)
    for a in archs:
        d = out / a
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        entries = {}
        fams: dict[str, dict] = {}
        for key in sorted(results[a]):
            r = dict(results[a][key])
            (d / r["file"]).write_bytes(r.pop("_cubin"))
            r.pop("compile_s")
            entries[key] = r
            fam = fams.setdefault(r["family"], {"ptx_arch": r["ptx_arch"], "variants": 0})
            fam["variants"] += 1
        index = {"arch": a, "target": f"cuda:{specs.PTX_ARCH[specs.table_arch(a)][0]}:32",
                 "triton_version": triton.__version__, "families": fams, "kernels": entries,
                 "sources": {k: sources[k] for k in sorted({r["kernel"] for r in entries.values()})}}
        if proxy_info(a):
            index["proxy"] = proxy_info(a)
        (d / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        per_kernel: dict[str, int] = {}
        for r in entries.values():
            per_kernel[r["kernel"]] = per_kernel.get(r["kernel"], 0) + 1
        summary["archs"][a] = {"variants": len(entries), "kernels": dict(sorted(per_kernel.items())),
                               "bytes": sum((d / r["file"]).stat().st_size for r in entries.values())}
        if proxy_info(a):
            summary["archs"][a]["proxy"] = proxy_info(a)
    (out / "index.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    total = sum(len(v) for v in results.values())
    per_fam = collections.Counter(j[0] for j in jobs)
    print(f"aot_build: {total} cubins ({', '.join(f'{f} {n}' for f, n in per_fam.items())}) for {','.join(archs)} "
          f"with Triton {triton.__version__} in {time.time() - t0:.0f} s ({args.jobs} jobs) -> {out}")
    if args.check_sass:
        for a, per in check_sass(out, archs).items():
            for key, s in per.items():
                mma = {k: v for k, v in s["ops"].items() if "MMA" in k}
                print(f"  {a} code for {s['code_for']}: {key.split('|')[0]} {key.split('|')[2]} "
                      f"{key.split('|')[-1]}: {mma}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
