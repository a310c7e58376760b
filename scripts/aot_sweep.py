"""Development: compile tile-config variants of some glu / lowbit kernels ahead of time, next to a shipped AOT dir.

    python scripts/aot_sweep.py --base SITE/tsct/_aot --out /tmp/sweep_aot \
        --kernels glu_bwd_dz --cfgs "stages_dz_t=3;warps_dz_t=8" [--arch sm_90a] [--jobs 2]

Why: to time tile configs on the cubins the wheel ships (Triton 3.9), not through the H200 image's JIT
(Triton 3.6); docs/performance.md has the sweeps this made. The output dir is a copy of --base's arch
dir plus the bf16 aligned variants of --kernels for each config override; time them on the GPU with
``scripts/pass_profile.py sweep --aot-dirs OUT --cfgs ...`` (cubins only). Run with another Triton
(``--allow-other-triton``) to A/B compilers on the same config (3.6 and 3.9 timed the same).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def _aot_build():
    path = _ROOT / "python/tsct/kernels/triton_common/aot_build.py"
    spec = importlib.util.spec_from_file_location("tsct_aot_build", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tsct_aot_build"] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernels", required=True)
    ap.add_argument("--family", default="glu", choices=("glu", "lowbit"),
                    help="kernel family (both read the per-arch tile configs of triton_common/specs.py)")
    ap.add_argument("--cfgs", required=True, help='";"-separated TSCT_TRITON_GLU_CFG overrides ("" = the table)')
    ap.add_argument("--require", default="", help='"NAME=V,..." constexpr values a variant must have (where it has NAME)')
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--allow-other-triton", action="store_true")
    args = ap.parse_args()

    ab = _aot_build()
    import triton

    specs = ab.family_specs(args.family)
    tables = ab.specs  # the build's triton_common.specs: the per-arch Config table every family reads
    if triton.__version__ != tables.TRITON_VERSION and not args.allow_other_triton:
        raise SystemExit(f"Triton {triton.__version__}, not the pinned {tables.TRITON_VERSION}: pass --allow-other-triton")
    kernels = set(filter(None, args.kernels.split(",")))
    if unknown := kernels - set(specs.KERNELS):
        raise SystemExit(f"--kernels: unknown {sorted(unknown)} ({args.family} family: {sorted(specs.KERNELS)})")
    if args.arch not in tables.CONFIGS:
        raise SystemExit(f"--arch: one of {sorted(tables.CONFIGS)}")
    for over in args.cfgs.split(";"):  # a bad override raises ValueError naming it, before anything is deleted
        dataclasses.replace(tables.CONFIGS[args.arch]).update(over)
    if args.out.resolve() in (args.base.resolve(), *args.base.resolve().parents):
        raise SystemExit("--out must not be --base or a folder above it (it is deleted first)")
    need = {k: int(v) for k, v in (t.split("=") for t in filter(None, args.require.split(",")))}

    def wanted(s) -> bool:
        c = dict(s.constexprs)
        dtype_free = not any(f"*{d}" in s.key for d in ("bf16", "fp16"))  # helpers: index / flag kernels
        return (s.kernel in kernels and (s.aligned or dtype_free) and (dtype_free or f"*{args.dtype}" in s.key)
                and s.key not in seen
                and all(c.get(k, v) == v for k, v in need.items()))

    base_cfg = tables.CONFIGS[args.arch]
    jobs, seen = [], set()
    cache = args.out.with_name(args.out.name + ".cache") / f"t{triton.__version__}"
    cache.mkdir(parents=True, exist_ok=True)
    for over in args.cfgs.split(";"):
        tables.CONFIGS[args.arch] = dataclasses.replace(base_cfg).update(over)
        for s in specs.enumerate_specs(args.arch):
            if wanted(s):
                seen.add(s.key)
                jobs.append((args.family, args.arch, s, str(cache)))
    tables.CONFIGS[args.arch] = base_cfg
    print(f"aot_sweep: {len(jobs)} variants with Triton {triton.__version__}", flush=True)
    if not jobs:
        raise SystemExit("aot_sweep: no variant matches --kernels / --dtype / --require")

    dst = args.out / args.arch
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.base / args.arch, dst)  # only the arch's dir (the carry to the GPU is small)
    index = json.loads((dst / "index.json").read_text())
    with cf.ProcessPoolExecutor(args.jobs, initializer=ab._init_worker) as ex:
        for r in ex.map(ab._compile, *zip(*jobs)):
            (dst / r["file"]).write_bytes(r.pop("_cubin"))
            r.pop("compile_s")
            r["triton_version"] = triton.__version__
            index["kernels"][r["key"]] = r  # replaces the shipped entry of the same key
            print(f"  {r['key'].split('|')[0]} {r['key'].split('|')[2]} {r['key'].split('|')[3]} "
                  f"shared {r['shared']}", flush=True)
    (dst / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
