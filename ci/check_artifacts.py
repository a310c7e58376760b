#!/usr/bin/env python3
"""Check that libtsct_kernels.so holds exactly the device code its manifest.json promises.

    python ci/check_artifacts.py                      # the installed tsct
    python ci/check_artifacts.py --lib path/to/libtsct_kernels.so [--manifest path/to/manifest.json]
    python ci/check_artifacts.py --sass               # also disassemble: kernels and instruction checks

Independently of the build's own fatbinary reader (csrc/tools/gen_build_info.py), it asks NVIDIA's
cuobjdump what is in the library and compares with the manifest:
  * targets: ``--list-elf`` / ``--list-ptx`` and the arch headers of ``--dump-resource-usage`` /
    ``--dump-ptx`` against manifest["gencodes"] (sm_* = SASS, compute_* = PTX);
  * kernels: the functions per SASS target (``--dump-resource-usage``) and the ``.entry`` names per
    PTX target against manifest["kernels"];
  * with ``--sass``: ``--dump-sass`` (needs nvdisasm), every manifest kernel present per SASS
    target, and the SASS_RULES table below (required / forbidden instruction regexes).
Exits 0 if everything matches, 1 on a mismatch (with a report), 2 if it cannot run (no cuobjdump,
no library). cuobjdump comes from PATH, $CUOBJDUMP, or the PyPI package nvidia-cuda-cuobjdump
(nvdisasm: nvidia-cuda-nvdisasm), found inside site-packages.
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


@dataclass(frozen=True)
class SassRule:
    """One instruction expectation: for SASS targets matching `arch` and kernels matching `kernel`."""

    arch: str       # regex on the target name, e.g. r"sm_120[af]"
    kernel: str     # regex on the kernel name
    require: str | None = None  # the kernel's SASS must match this regex
    forbid: str | None = None   # ... and must not match this one
    why: str = ""


# Per-arch SASS expectations. Adding a check is one line, e.g. for the fp4 tensor-core GEMMs:
#   SassRule(r"sm_120[af]", r"^tsctk_.*nvfp4_gemm", require=r"OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X", why="..."),
#   SassRule(r"sm_90a", r"^tsctk_.*_wgmma", require=r"HGMMA\.", why="..."),
SASS_RULES: list[SassRule] = [
    SassRule(r".*", r"^tsctk_(nvfp4|sign)_", forbid=r"\b(STL|LDL)(\.\w+)*\b",
             why="quant kernels keep their 16-element block in registers (no local-memory spills)"),
]


# --- finding things ----------------------------------------------------------------------------
def _site_dirs() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(p)]


def find_tool(name: str, env: str, explicit: str | None) -> str | None:
    """`explicit`, then $env, then PATH, then the nvidia-cuda-* PyPI wheels in site-packages."""
    for cand in (explicit, os.environ.get(env), shutil.which(name)):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    for site in _site_dirs():
        for pat in (f"nvidia/cu*/bin/{name}", f"nvidia/cuda_*/bin/{name}", f"nvidia/*/bin/{name}"):
            for cand in sorted(glob.glob(os.path.join(site, pat)), reverse=True):
                if os.access(cand, os.X_OK):
                    return cand
    return None


def find_library(explicit: str | None) -> Path | None:
    if explicit:
        p = Path(explicit)
        return p / "libtsct_kernels.so" if p.is_dir() else p
    if os.environ.get("TSCT_NATIVE_LIB"):
        p = Path(os.environ["TSCT_NATIVE_LIB"])
        return p / "libtsct_kernels.so" if p.is_dir() else p
    spec = importlib.util.find_spec("tsct")  # locates the installed package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "_lib" / "libtsct_kernels.so"


# --- cuobjdump parsing -------------------------------------------------------------------------
def run(tool: str, args: list[str], lib: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([tool, *args, str(lib)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{os.path.basename(tool)} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.strip()}")
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
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compare libtsct_kernels.so's device code with its manifest.json.")
    ap.add_argument("--lib", help="the .so (or its directory); default: the installed tsct, or $TSCT_NATIVE_LIB")
    ap.add_argument("--manifest", help="default: manifest.json next to the library")
    ap.add_argument("--cuobjdump", help="default: PATH, $CUOBJDUMP, or the nvidia-cuda-cuobjdump wheel")
    ap.add_argument("--sass", action="store_true", help="also check kernels and SASS_RULES in --dump-sass (needs nvdisasm)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON too")
    args = ap.parse_args(argv)

    lib = find_library(args.lib)
    if lib is None or not lib.is_file():
        print(f"check_artifacts: no native library found ({lib}); is tsct installed with its kernels?", file=sys.stderr)
        return 2
    man_path = Path(args.manifest) if args.manifest else lib.parent / "manifest.json"
    try:
        manifest = json.loads(man_path.read_text())
    except (OSError, ValueError) as e:
        print(f"check_artifacts: cannot read manifest {man_path}: {e}", file=sys.stderr)
        return 2
    cuobjdump = find_tool("cuobjdump", "CUOBJDUMP", args.cuobjdump)
    if cuobjdump is None:
        print("check_artifacts: cuobjdump not found (PATH, $CUOBJDUMP, or `pip install nvidia-cuda-cuobjdump`)",
              file=sys.stderr)
        return 2

    gencodes = list(manifest["gencodes"])
    want_sass = [g for g in gencodes if g.startswith("sm_")]
    want_ptx = [g for g in gencodes if g.startswith("compute_")]
    want_kernels = {g: set(v) for g, v in manifest.get("kernels", {}).items()}
    problems: list[str] = []

    print(f"library:   {lib}")
    print(f"manifest:  {man_path} (tsct {manifest.get('version')}, nvcc {manifest.get('nvcc_version')}, "
          f"built {manifest.get('built_at')})")
    print(f"cuobjdump: {cuobjdump}")

    list_elf = parse_list(run(cuobjdump, ["--list-elf"], lib))
    list_ptx = parse_list(run(cuobjdump, ["--list-ptx"], lib))
    elf_kernels = resource_usage_kernels(run(cuobjdump, ["--dump-resource-usage"], lib))
    ptx_k = ptx_kernels(run(cuobjdump, ["--dump-ptx"], lib))

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

    sass = {}
    if args.sass:
        nvdisasm = find_tool("nvdisasm", "NVDISASM", None)
        if nvdisasm is None:
            print("check_artifacts: --sass needs nvdisasm (PATH or `pip install nvidia-cuda-nvdisasm`)", file=sys.stderr)
            return 2
        env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""),
                   NVDISASM_PATH=os.path.dirname(nvdisasm))
        sass = sass_functions(run(cuobjdump, ["--dump-sass"], lib, env=env))

    print()
    print(f"{'target':<12} {'kind':<5} {'cubins':>6} {'kernels (manifest / cuobjdump)':>32}  {'status'}")
    rows = []
    for g in gencodes:
        kind = "SASS" if g.startswith("sm_") else "PTX"
        got = elf_kernels.get(g, set()) if kind == "SASS" else ptx_k.get(g, set())
        want = want_kernels.get(g, set())
        count = list_elf.count(g[:-1] if g.endswith("f") else g) if kind == "SASS" else list_ptx.count("sm_" + g.split("_", 1)[1])
        status = []
        if got != want:
            missing, extra = sorted(want - got), sorted(got - want)
            problems.append(f"{g}: kernels differ: missing {missing}, not in manifest {extra}")
            status.append("KERNELS DIFFER")
        if args.sass and kind == "SASS":
            funcs = sass.get(g, {})
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
                     "kernels_found": len(got), "ok": not status})
        print(f"{g:<12} {kind:<5} {count:>6} {f'{len(want)} / {len(got)}':>32}  {'ok' if not status else ', '.join(sorted(set(status)))}")

    if args.sass:
        print(f"\nSASS rules checked: {len(SASS_RULES)} ({', '.join(r.why for r in SASS_RULES)})")
    if args.json:
        print(json.dumps({"library": str(lib), "targets": rows, "problems": problems}, indent=2))
    if problems:
        print("\nMISMATCH:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("\nartifacts match the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
