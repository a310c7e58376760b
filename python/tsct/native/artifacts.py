"""Check that libtsct_kernels.so holds exactly the device code its manifest.json promises.

    verify(lib=None, manifest=None, cuobjdump=None, sass=False) -> dict   # never prints
    python -m tsct.native.artifacts [--lib PATH] [--manifest PATH] [--cuobjdump PATH] [--sass] [--json]
    python ci/check_artifacts.py [...]                                    # the same, for CI
    tsct-probe --verify-artifacts                                         # a one-line summary

Independently of the build's own fatbinary reader (csrc/tools/gen_build_info.py), it asks NVIDIA's
cuobjdump what is in the library and compares with the manifest:
  * targets: ``--list-elf`` / ``--list-ptx`` and the arch headers of ``--dump-resource-usage`` /
    ``--dump-ptx`` against manifest["gencodes"] (sm_* = SASS, compute_* = PTX);
  * kernels: the functions per SASS target (``--dump-resource-usage``) and the ``.entry`` names per
    PTX target against manifest["kernels"];
  * with ``sass=True`` / ``--sass``: ``--dump-sass`` (needs nvdisasm), every manifest kernel present
    per SASS target, and the SASS_RULES table below (required / forbidden instruction regexes).
``main`` exits 0 if everything matches, 1 on a mismatch (with a report), 2 if it cannot run (no
cuobjdump, no library, unreadable manifest). cuobjdump comes from the explicit argument, $CUOBJDUMP,
PATH, or the PyPI package nvidia-cuda-cuobjdump (nvdisasm: $NVDISASM, PATH, nvidia-cuda-nvdisasm),
found inside site-packages.

Standard library only, and importing it loads no library and touches no GPU (ci/check_artifacts.py
loads this file by path, without importing tsct or torch).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIB_NAME = "libtsct_kernels.so"
CUOBJDUMP_HINT = "pip install nvidia-cuda-cuobjdump"
NVDISASM_HINT = "pip install nvidia-cuda-nvdisasm"


@dataclass(frozen=True)
class SassRule:
    """One instruction expectation: for SASS targets matching `arch` and kernels matching `kernel`."""

    arch: str       # regex on the target name, e.g. r"sm_120[af]"
    kernel: str     # regex on the kernel name
    require: str | None = None  # the kernel's SASS must match this regex
    forbid: str | None = None   # ... and must not match this one
    why: str = ""


# Per-arch SASS expectations, checked by verify(sass=True). Adding a check is one line, e.g.:
#   SassRule(r"sm_120[af]", r"^tsctk_.*nvfp4_gemm", require=r"OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X", why="..."),
#   SassRule(r"sm_90a", r"^tsctk_.*_wgmma", require=r"HGMMA\.", why="..."),
SASS_RULES: list[SassRule] = [
    SassRule(r".*", r"^tsctk_(nvfp4|sign)_", forbid=r"\b(STL|LDL)(\.\w+)*\b",
             why="quant kernels keep their 16-element block in registers (no local-memory spills)"),
]


class _CannotRun(Exception):
    """verify() cannot do its check (missing tool / library / manifest, a tool failing)."""


# --- finding things ----------------------------------------------------------------------------
def _site_dirs() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(p)]


def _executable(path: str | None) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_tool(name: str, env: str, explicit: str | None = None) -> str | None:
    """`explicit` (a path or a name on PATH; if given, nothing else is tried), else $env, PATH, and
    the nvidia-cuda-* PyPI wheels in site-packages. None if not found."""
    if explicit:
        cand = explicit if os.sep in explicit else (shutil.which(explicit) or explicit)
        return cand if _executable(cand) else None
    for cand in (os.environ.get(env), shutil.which(name)):
        if _executable(cand):
            return cand
    for site in _site_dirs():
        for pat in (f"nvidia/cu*/bin/{name}", f"nvidia/cuda_*/bin/{name}", f"nvidia/*/bin/{name}"):
            for cand in sorted(glob.glob(os.path.join(site, pat)), reverse=True):
                if os.access(cand, os.X_OK):
                    return cand
    return None


def find_library(explicit: str | os.PathLike | None = None) -> Path | None:
    """`explicit` (the .so or its directory), else $TSCT_NATIVE_LIB, else tsct/_lib in the installed
    package (located without importing it). The path may not exist; None if tsct is not installed."""
    for cand in (explicit, os.environ.get("TSCT_NATIVE_LIB")):
        if cand:
            p = Path(cand).expanduser()
            return p / LIB_NAME if p.is_dir() else p
    spec = importlib.util.find_spec("tsct")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "_lib" / LIB_NAME


# --- cuobjdump parsing -------------------------------------------------------------------------
def run_tool(tool: str, args: list[str], lib: Path, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run([tool, *args, str(lib)], capture_output=True, text=True, env=env)
    except OSError as e:
        raise _CannotRun(f"cannot run {tool}: {e}") from e
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split())[:300]
        raise _CannotRun(f"{os.path.basename(tool)} {' '.join(args)} failed ({proc.returncode}): {err}")
    return proc.stdout


def parse_list(text: str) -> list[str]:
    """`--list-elf` / `--list-ptx` lines 'ELF file 1: name.1.sm_90a.cubin' -> ['sm_90a', ...]."""
    return re.findall(r"(?:ELF|PTX) file\s+\d+:\s+\S*?\.((?:sm|compute)_\d+[a-z]?)\.(?:cubin|ptx)", text)


def split_sections(text: str, kind: str) -> list[tuple[str, str]]:
    """(arch, body) for each 'Fatbin <kind> code:' section of a cuobjdump dump."""
    parts = re.split(r"^Fatbin (elf|ptx) code:\s*$", text, flags=re.M)
    out = []
    for i in range(1, len(parts) - 1, 2):
        if parts[i] != kind:
            continue
        m = re.search(r"^arch = (\S+)", parts[i + 1], re.M)
        if m:
            out.append((m.group(1), parts[i + 1]))
    return out


def resource_usage_kernels(text: str) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for arch, body in split_sections(text, "elf"):
        got.setdefault(arch, set()).update(re.findall(r"^\s*Function (\S+?):\s*$", body, re.M))
    return got


def ptx_kernels(text: str) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for arch, body in split_sections(text, "ptx"):
        target = "compute_" + arch.split("_", 1)[1]  # cuobjdump prints a PTX target as sm_XX
        got.setdefault(target, set()).update(re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)", body))
    return got


def sass_functions(text: str) -> dict[str, dict[str, str]]:
    """arch -> kernel -> SASS text, from `--dump-sass`."""
    got: dict[str, dict[str, str]] = {}
    for arch, body in split_sections(text, "elf"):
        funcs = re.split(r"^\s*Function : (\S+)\s*$", body, flags=re.M)
        for i in range(1, len(funcs) - 1, 2):
            got.setdefault(arch, {})[funcs[i]] = got.get(arch, {}).get(funcs[i], "") + funcs[i + 1]
    return got


# --- the check ---------------------------------------------------------------------------------
def _load_manifest(manifest: str | os.PathLike | dict | None, lib: Path) -> tuple[dict, str]:
    if isinstance(manifest, dict):
        return manifest, "<dict>"
    path = Path(manifest).expanduser() if manifest else lib.parent / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _CannotRun(f"cannot read manifest {path}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("gencodes"), list):
        raise _CannotRun(f"manifest {path} has no 'gencodes' list")
    return data, str(path)


def _want_kernels(manifest: dict, gencodes: list[str]) -> dict[str, set[str]]:
    ks = manifest.get("kernels", {})
    if isinstance(ks, dict):
        return {g: set(v) for g, v in ks.items()}
    return {g: set(ks) for g in gencodes}  # a flat list: every target holds them all


def _summary(gencodes: list[str], want: dict[str, set[str]], sass: bool, problems: list[str]) -> str:
    counts = sorted({len(want.get(g, ())) for g in gencodes})
    if len(counts) == 1:
        kern = f"{counts[0]} kernels each"
    else:
        kern = f"{counts[0]}-{counts[-1]} kernels" if counts else "no kernels"
    s = f"{len(gencodes)} targets, {kern}"
    if sass:
        s += f", SASS + {len(SASS_RULES)} rule{'s' if len(SASS_RULES) != 1 else ''}"
    if not problems:
        return s + ": match"
    return s + f": {len(problems)} problem{'s' if len(problems) != 1 else ''}"


def verify(lib: str | os.PathLike | None = None, manifest: str | os.PathLike | dict | None = None,
           cuobjdump: str | None = None, sass: bool = False) -> dict[str, Any]:
    """Compare the library's device code (per cuobjdump) with its manifest. Prints nothing.

    lib: the .so or its directory (default: $TSCT_NATIVE_LIB, else the installed tsct's).
    manifest: a path, or the manifest as a dict (default: manifest.json next to the library).
    cuobjdump: the tool's path (default: $CUOBJDUMP, PATH, the nvidia-cuda-cuobjdump wheel).
    sass: also disassemble (needs nvdisasm): every kernel has SASS, and SASS_RULES hold.

    Returns {"ok", "status" ("match" | "mismatch" | "error"), "library", "manifest", "cuobjdump",
    "nvdisasm", "sass", "targets" (one row per manifest gencode), "problems" (str each),
    "detail" (one line: the summary, or why the check could not run), "build" (version, nvcc,
    built_at from the manifest)}. A missing tool, library or manifest, or a failing tool, gives
    ok False, status "error" and a detail saying what is missing and how to get it; never raises
    for those.
    """
    res: dict[str, Any] = {"ok": False, "status": "error", "library": None, "manifest": None, "cuobjdump": None,
                           "nvdisasm": None, "sass": bool(sass), "targets": [], "problems": [], "detail": "",
                           "build": {}}
    try:
        _verify(res, lib, manifest, cuobjdump, sass)
    except _CannotRun as e:
        res.update(ok=False, status="error", detail=str(e))
    return res


def _verify(res: dict[str, Any], lib_arg, manifest_arg, cuobjdump_arg, sass: bool) -> None:
    lib = find_library(lib_arg)
    res["library"] = str(lib) if lib is not None else None
    if lib is None or not lib.is_file():
        raise _CannotRun(f"no native library found ({lib}); is tsct installed with its kernels?")
    man, res["manifest"] = _load_manifest(manifest_arg, lib)
    res["build"] = {k: man.get(k) for k in ("version", "nvcc_version", "built_at")}

    cuobjdump = find_tool("cuobjdump", "CUOBJDUMP", cuobjdump_arg)
    if cuobjdump is None:
        where = (f"{cuobjdump_arg!r} is not an executable" if cuobjdump_arg
                 else "not on PATH, $CUOBJDUMP or in site-packages")
        raise _CannotRun(f"cuobjdump not found ({where}); get it with `{CUOBJDUMP_HINT}`")
    res["cuobjdump"] = cuobjdump
    env = None
    if sass:
        nvdisasm = find_tool("nvdisasm", "NVDISASM")
        if nvdisasm is None:
            raise _CannotRun(f"the SASS check needs nvdisasm (not on PATH, $NVDISASM or in site-packages); "
                             f"get it with `{NVDISASM_HINT}`")
        res["nvdisasm"] = nvdisasm
        env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""),
                   NVDISASM_PATH=os.path.dirname(nvdisasm))

    gencodes = [str(g) for g in man["gencodes"]]
    want_sass = [g for g in gencodes if g.startswith("sm_")]
    want_ptx = [g for g in gencodes if g.startswith("compute_")]
    want_kernels = _want_kernels(man, gencodes)
    problems: list[str] = []

    list_elf = parse_list(run_tool(cuobjdump, ["--list-elf"], lib))
    list_ptx = parse_list(run_tool(cuobjdump, ["--list-ptx"], lib))
    elf_kernels = resource_usage_kernels(run_tool(cuobjdump, ["--dump-resource-usage"], lib))
    ptx_k = ptx_kernels(run_tool(cuobjdump, ["--dump-ptx"], lib))
    funcs_by_arch = sass_functions(run_tool(cuobjdump, ["--dump-sass"], lib, env=env)) if sass else {}

    # --list-elf names an sm_XXf cubin "sm_XX" (cuobjdump 13.x); the dump headers keep the suffix.
    listed = sorted(set(list_elf))
    expect_listed = sorted({g[:-1] if g.endswith("f") else g for g in want_sass})
    if listed != expect_listed:
        problems.append(f"--list-elf targets {listed} != manifest SASS targets {expect_listed} (f suffix dropped)")
    if sorted(set(list_ptx)) != sorted({"sm_" + g.split("_", 1)[1] for g in want_ptx}):
        problems.append(f"--list-ptx targets {sorted(set(list_ptx))} != manifest PTX targets {want_ptx}")
    if sorted(elf_kernels) != sorted(want_sass):
        problems.append(f"SASS targets in the fatbinary {sorted(elf_kernels)} != manifest {sorted(want_sass)}")
    if sorted(ptx_k) != sorted(want_ptx):
        problems.append(f"PTX targets in the fatbinary {sorted(ptx_k)} != manifest {sorted(want_ptx)}")

    rows = []
    for g in gencodes:
        kind = "SASS" if g.startswith("sm_") else "PTX"
        got = elf_kernels.get(g, set()) if kind == "SASS" else ptx_k.get(g, set())
        want = want_kernels.get(g, set())
        if kind == "SASS":
            count = list_elf.count(g[:-1] if g.endswith("f") else g)
        else:
            count = list_ptx.count("sm_" + g.split("_", 1)[1])
        status: list[str] = []
        if got != want:
            missing, extra = sorted(want - got), sorted(got - want)
            problems.append(f"{g}: kernels differ: missing {missing}, not in manifest {extra}")
            status.append("KERNELS DIFFER")
        if sass and kind == "SASS":
            funcs = funcs_by_arch.get(g, {})
            absent = sorted(want - set(funcs))
            if absent:
                problems.append(f"{g}: kernels with no SASS in --dump-sass: {absent}")
                status.append("NO SASS")
            for rule in SASS_RULES:
                if not re.fullmatch(rule.arch, g):
                    continue
                for kname, text in sorted(funcs.items()):
                    if not re.search(rule.kernel, kname):
                        continue
                    if rule.require and not re.search(rule.require, text):
                        problems.append(f"{g}/{kname}: SASS lacks /{rule.require}/ ({rule.why})")
                        status.append("RULE")
                    if rule.forbid and (m := re.search(rule.forbid, text)):
                        problems.append(f"{g}/{kname}: SASS has forbidden '{m.group(0)}' /{rule.forbid}/ ({rule.why})")
                        status.append("RULE")
        rows.append({"target": g, "kind": kind, "cubins": count, "kernels_manifest": len(want),
                     "kernels_found": len(got), "ok": not status,
                     "status": "ok" if not status else ", ".join(sorted(set(status)))})

    res.update(ok=not problems, status="mismatch" if problems else "match", targets=rows, problems=problems,
               detail=_summary(gencodes, want_kernels, sass, problems))


# --- the report --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compare libtsct_kernels.so's device code with its manifest.json.")
    ap.add_argument("--lib", help="the .so (or its directory); default: the installed tsct, or $TSCT_NATIVE_LIB")
    ap.add_argument("--manifest", help="default: manifest.json next to the library")
    ap.add_argument("--cuobjdump", help="default: $CUOBJDUMP, PATH, or the nvidia-cuda-cuobjdump wheel")
    ap.add_argument("--sass", action="store_true", help="also check kernels and SASS_RULES in --dump-sass (needs nvdisasm)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON too")
    args = ap.parse_args(argv)

    r = verify(lib=args.lib, manifest=args.manifest, cuobjdump=args.cuobjdump, sass=args.sass)
    if r["status"] == "error":
        print(f"check_artifacts: {r['detail']}", file=sys.stderr)
        if args.json:
            print(json.dumps(r, indent=2))
        return 2

    b = r["build"]
    print(f"library:   {r['library']}")
    print(f"manifest:  {r['manifest']} (tsct {b.get('version')}, nvcc {b.get('nvcc_version')}, built {b.get('built_at')})")
    print(f"cuobjdump: {r['cuobjdump']}")
    print()
    print(f"{'target':<12} {'kind':<5} {'cubins':>6} {'kernels (manifest / cuobjdump)':>32}  {'status'}")
    for row in r["targets"]:
        kern = f"{row['kernels_manifest']} / {row['kernels_found']}"
        print(f"{row['target']:<12} {row['kind']:<5} {row['cubins']:>6} {kern:>32}  {row['status']}")
    if r["sass"]:
        print(f"\nSASS rules checked: {len(SASS_RULES)} ({', '.join(rule.why for rule in SASS_RULES)})")
    if args.json:
        print(json.dumps(r, indent=2))
    if r["problems"]:
        print("\nMISMATCH:")
        for p in r["problems"]:
            print(f"  - {p}")
        return 1
    print("\nartifacts match the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
