#!/usr/bin/env python3
"""Ahead-of-time build of tsct's CuTeDSL kernels: compile for sm_120a (or sm_121a), export_to_c, write an index.

    python cutedsl/build.py OUT_DIR [--arch sm_120a|sm_121a] [--only NAME ...] [--check]
    python cutedsl/build.py --list [--arch ...]   # the exported names, one per line (no DSL needed; CMake uses it)

One arch per run (the DSL reads CUTE_DSL_ARCH once per process). The sm_121a exports (compute
capability 12.1, e.g. DGX Spark: an sm_120a cubin does not load there) are the same kernels, named
``..._sm121`` instead of ``..._sm120`` (``export_name``) so both sets link into one library; CMake
builds both (docs/decisions/0010). ``--only`` takes the ``VARIANTS`` names (``..._sm120``).

For each kernel variant in ``VARIANTS`` it writes ``OUT_DIR/<name>.o`` (host entry + embedded cubin,
exported with ``export_to_c``) and ``OUT_DIR/<name>.h`` (the C ABI of that entry), then
``OUT_DIR/index.json``: DSL version, arch, and per kernel its symbol prefix, arguments, compile time
and sizes. ``--check`` runs ``check_sass.py`` on the result (OMMA present, arch right).

Runs on a machine with no GPU. Needs the pinned CuTeDSL (``DSL_VERSION``); a different version is
an error, because exported objects are tied to the DSL runtime they were built with
(docs/decisions/0006-cutedsl-build.md).

Two traps this script handles:
* the DSL reads ``CUTE_DSL_ARCH`` once, at import, and silently defaults to sm_100a: the variable is
  set before the import and ``--gpu-arch`` is passed to every compile; the resulting cubin's arch is
  asserted by ``check_sass.py``.
* ``export_to_c`` needs ``libcute_dsl_runtime.so`` (inside the DSL package) loaded to dump the
  plain C object: the script re-executes itself with it in ``LD_PRELOAD``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

DSL_DIST = "nvidia-cutlass-dsl"
DSL_VERSION = "4.8.1"  # pinned: exported objects embed and check this version
DEFAULT_ARCH = "sm_120a"
_PRELOAD_FLAG = "TSCT_CUTEDSL_PRELOADED"
HERE = Path(__file__).resolve().parent


def _runtime_lib() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{DSL_DIST} is not installed (pip install {DSL_DIST}=={DSL_VERSION})")
    root = Path(list(spec.submodule_search_locations)[0])
    libs = sorted(root.glob("cu*/lib/libcute_dsl_runtime.so"))
    if not libs:
        raise SystemExit(f"libcute_dsl_runtime.so not found under {root}")
    return libs[0]


def _reexec_with_preload(arch: str) -> None:
    if os.environ.get(_PRELOAD_FLAG) == "1":
        return
    env = dict(os.environ)
    env[_PRELOAD_FLAG] = "1"
    env["LD_PRELOAD"] = ":".join(filter(None, [str(_runtime_lib()), env.get("LD_PRELOAD")]))
    env["CUTE_DSL_ARCH"] = arch
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


# (name, constructor kwargs, entry point). Tile sizes: tile_m 32 (about 32 rows per expert at b1),
# the GLU tile covers the whole 2r = 128 interleaved gate/up columns.
VARIANTS = {
    "tsct_nvfp4_gemm_dense_sm120": (dict(grouped=False, epilogue="alpha", tile_m=32, tile_n=32), "dense"),
    "tsct_nvfp4_grouped_alpha_sm120": (dict(grouped=True, epilogue="alpha", tile_m=32, tile_n=32), "grouped"),
    "tsct_nvfp4_grouped_glu_sm120": (dict(grouped=True, epilogue="glu", tile_m=32, tile_n=128), "grouped"),
    "tsct_nvfp4_grouped_rowweight_sm120": (dict(grouped=True, epilogue="row_weight", tile_m=32, tile_n=32),
                                           "grouped"),
    # sign factors (1-bit, expanded to E2M1 +-1 in registers; per-column scale in the epilogue). The
    # GLU takes two activations (x*a_gate, x*a_up) and plain [E, r] bits: tile_n 64 covers r = 64.
    "tsct_sign_grouped_alpha_sm120": (dict(grouped=True, sign=True, epilogue="alpha", tile_m=32, tile_n=32),
                                      "grouped_sign"),
    "tsct_sign_grouped_glu_sm120": (dict(grouped=True, sign=True, epilogue="glu", tile_m=32, tile_n=64),
                                    "grouped_sign"),
    "tsct_sign_grouped_rowweight_sm120": (dict(grouped=True, sign=True, epilogue="row_weight", tile_m=32,
                                               tile_n=32), "grouped_sign"),
}


ARCHS = ("sm_120a", "sm_121a")


def export_name(name: str, arch: str) -> str:
    """The exported symbol prefix / file name of variant ``name`` (a ``VARIANTS`` key) for ``arch``:
    the name itself for sm_120a, ``..._sm121`` for sm_121a. ValueError for another arch or name."""
    if name not in VARIANTS:
        raise ValueError(f"name: {name!r} is not a kernel variant (build.py --list)")
    if arch == "sm_120a":
        return name
    if arch == "sm_121a":
        return name[: -len("_sm120")] + "_sm121"
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def _operands(kwargs: dict) -> int:
    """Activations per CTA (the kernel's ``operands``): 2 for the sign GLU (x*a_gate, x*a_up), else 1."""
    return 2 if kwargs.get("sign") and kwargs.get("epilogue") == "glu" else 1


def _fake_args(entry: str, operands: int = 1):
    """Fake tensors (shapes/strides symbolic where they vary at run time) for cute.compile."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor
    from cutlass.runtime import make_fake_stream

    fp4, sf, f32, i32, bf16 = (cutlass.Float4E2M1FN, cutlass.Float8E4M3FN, cutlass.Float32, cutlass.Int32,
                               cutlass.BFloat16)
    m, n = cute.sym_int32(symbol="M"), cute.sym_int32(symbol="N")
    k = cute.sym_int32(divisibility=64, symbol="K")
    ld_k = cute.sym_int64(divisibility=64, symbol="ldK")
    flat = lambda dt, align=16: make_fake_compact_tensor(dt, (cute.sym_int64(),), assumed_align=align)  # noqa: E731
    if entry == "dense":
        l_ = cute.sym_int32(symbol="L")
        a = make_fake_tensor(fp4, (m, k, l_), (ld_k, 1, cute.sym_int64(divisibility=64)), assumed_align=16)
        b = make_fake_tensor(fp4, (n, k, l_), (ld_k, 1, cute.sym_int64(divisibility=64)), assumed_align=16)
        c = make_fake_tensor(bf16, (m, n, l_), (cute.sym_int64(), 1, cute.sym_int64()), assumed_align=2)
        alpha = make_fake_compact_tensor(f32, (l_,), assumed_align=4)
        return [a, b, flat(sf), flat(sf), c, alpha, make_fake_stream()]
    e = cute.sym_int32(symbol="E")
    t = cute.sym_int32(symbol="T")
    if entry == "grouped_sign":
        p = operands  # static: the kernel unrolls over it
        a = make_fake_tensor(fp4, (cute.sym_int32(symbol="Malloc"), k, p),
                             (ld_k, 1, cute.sym_int64(divisibility=64)), assumed_align=16)
        k8 = cute.sym_int32(divisibility=8, symbol="K8")
        bits = make_fake_tensor(cutlass.Uint8, (n, k8, e, p), (cute.sym_int64(divisibility=8), 1, cute.sym_int64(),
                                                               cute.sym_int64()), assumed_align=8)
        sfa = make_fake_tensor(sf, (cute.sym_int64(), p), (1, cute.sym_int64(divisibility=16)), assumed_align=16)
        col_scale = make_fake_tensor(f32, (e, n, p), (cute.sym_int64(), 1, cute.sym_int64()), assumed_align=4)
        alpha = make_fake_tensor(f32, (e, p), (cute.sym_int64(), 1), assumed_align=4)
    else:
        a = make_fake_tensor(fp4, (cute.sym_int32(symbol="Malloc"), k), (ld_k, 1), assumed_align=16)
        b = make_fake_tensor(fp4, (n, k, e), (ld_k, 1, cute.sym_int64(divisibility=64)), assumed_align=16)
        alpha = make_fake_compact_tensor(f32, (e,), assumed_align=4)
    sfa_offsets = make_fake_compact_tensor(i32, (e,), assumed_align=4)
    c = make_fake_tensor(bf16, (m, cute.sym_int32(symbol="Nout")), (cute.sym_int64(), 1), assumed_align=2)
    offs = make_fake_compact_tensor(i32, (e,), assumed_align=4)
    tile_expert = make_fake_compact_tensor(i32, (t,), assumed_align=4)
    tile_row = make_fake_compact_tensor(i32, (t,), assumed_align=4)
    r = cute.sym_int32(symbol="R")
    ep0 = make_fake_tensor(f32, (e, r), (cute.sym_int64(), 1), assumed_align=4)
    ep1 = make_fake_tensor(f32, (e, r), (cute.sym_int64(), 1), assumed_align=4)
    if entry == "grouped_sign":
        return [a, bits, sfa, sfa_offsets, col_scale, c, offs, tile_expert, tile_row, alpha, ep0, ep1,
                make_fake_stream()]
    return [a, b, flat(sf), sfa_offsets, flat(sf), c, offs, tile_expert, tile_row, alpha, ep0, ep1,
            make_fake_stream()]


def _arg_names(entry: str) -> list[str]:
    if entry == "dense":
        return ["a", "b", "sfa", "sfb", "c", "alpha", "stream"]
    if entry == "grouped_sign":
        return ["a", "bits", "sfa", "sfa_offsets", "col_scale", "c", "offs", "tile_expert", "tile_row", "alpha",
                "ep0", "ep1", "stream"]
    return ["a", "b", "sfa", "sfa_offsets", "sfb", "c", "offs", "tile_expert", "tile_row", "alpha", "ep0",
            "ep1", "stream"]


def build(out_dir: Path, arch: str, only: list[str] | None) -> dict:
    installed = importlib.metadata.version(DSL_DIST)
    if installed != DSL_VERSION:
        raise SystemExit(f"{DSL_DIST} {installed} is installed; this build is pinned to {DSL_VERSION}")
    if os.environ.get("CUTE_DSL_ARCH") != arch:
        raise SystemExit(f"CUTE_DSL_ARCH must be {arch} before the DSL is imported, "
                         f"got {os.environ.get('CUTE_DSL_ARCH')!r}")
    sys.path.insert(0, str(HERE))
    import cutlass.cute as cute
    from tsct_cutedsl.nvfp4_gemm_sm120 import Nvfp4GemmSm120

    out_dir.mkdir(parents=True, exist_ok=True)
    index = {"dsl": {"dist": DSL_DIST, "version": installed}, "arch": arch, "host": platform.machine(),
             "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kernels": []}
    for name, (kwargs, entry) in VARIANTS.items():
        if only and name not in only:
            continue
        kernel = Nvfp4GemmSm120(**kwargs)
        t0 = time.perf_counter()
        compiled = cute.compile(getattr(kernel, entry), *_fake_args(entry, _operands(kwargs)),
                                options=f"--gpu-arch {arch}")
        t1 = time.perf_counter()
        ename = export_name(name, arch)
        compiled.export_to_c(file_path=str(out_dir), file_name=ename, function_prefix=ename)
        t2 = time.perf_counter()
        obj, hdr = out_dir / f"{ename}.o", out_dir / f"{ename}.h"
        index["kernels"].append({
            "name": ename, "variant": name, "arch": arch, "entry": entry,
            "params": {k: (v if isinstance(v, (int, str, bool)) else str(v)) for k, v in kwargs.items()},
            "threads": kernel.threads, "operands": kernel.operands, "args": _arg_names(entry), "object": obj.name,
            "header": hdr.name,
            "object_bytes": obj.stat().st_size, "compile_s": round(t1 - t0, 3), "export_s": round(t2 - t1, 3),
        })
        print(f"built {ename}: compile {t1 - t0:.2f} s, export {t2 - t1:.2f} s, {obj.stat().st_size} B")
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="AOT-build tsct's CuTeDSL kernels")
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--list", action="store_true", help="print the exported names for --arch and exit (no DSL import)")
    ap.add_argument("--arch", default=DEFAULT_ARCH, choices=list(ARCHS))
    ap.add_argument("--only", nargs="*", choices=sorted(VARIANTS))
    ap.add_argument("--check", action="store_true", help="run check_sass.py on the output")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(export_name(n, args.arch) for n in VARIANTS))
        return 0
    if args.out_dir is None:
        ap.error("OUT_DIR is required (except with --list)")
    _reexec_with_preload(args.arch)
    build(args.out_dir, args.arch, args.only)
    if args.check:
        import check_sass
        return check_sass.main([str(args.out_dir), "--arch", args.arch,
                                "--json", str(args.out_dir / "sass_report.json")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
