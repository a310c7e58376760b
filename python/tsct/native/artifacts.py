"""Check that the installed device code is exactly what the manifest.json promises: the fatbinary of
libtsct_kernels.so and the Triton AOT cubins (tsct/_aot/<arch>/, docs/decisions/0005-triton-aot.md).

    verify(lib=None, manifest=None, cuobjdump=None, sass=False, aot_dir=None, all_variants=False) -> dict
    python -m tsct.native.artifacts [--lib PATH] [--manifest PATH] [--aot-dir DIR] [--cuobjdump PATH]
                                    [--sass [--all-variants]] [--json]
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
and, when the manifest has a "triton_aot" section, the cubins (no cuobjdump needed for the first two):
  * the manifest's archs / variants / kernel counts == the per-arch index.json files (and the
    top-level index.json), same Triton version; no cubin on disk that no index lists;
  * every cubin an index lists exists with the sha256 it records, and the PTX target its entry
    records (``ptx_arch``) is its arch directory's (plain sm_120 in sm_120: it loads on 12.0 and 12.1;
    never sm_120a, which loads on 12.0 only), or for a proxy arch (docs/decisions/0017) the target its
    index's "proxy" record names;
  * ``--list-elf`` of every cubin names exactly its arch (a proxy's: the target it was assembled for);
  * with ``sass=True``: for every (arch, kernel) that a SASS_RULES row covers, one variant (the first
    aligned bf16 one), or every cubin with ``all_variants=True`` / ``--all-variants`` (minutes), is
    disassembled: its "code for" arch, its function, and SASS_RULES; and every cubin of an arch STACK_BUDGET
    covers (sm_90a, sm_120) keeps its local memory (``--dump-resource-usage`` STACK) within STACK_BUDGET.
and, when the manifest has a "cutedsl" section (CuTeDSL sm_120 kernels linked into the library,
docs/decisions/0009): the cubins those exported objects embed as data (found as CUDA ELF images in the
library outside its .nv_fatbin section) number exactly the manifest's kernels; with ``sass=True`` each
is disassembled: 'code for' one of the manifest's archs (sm_120a, and sm_121a since decision 0010; the
count per arch must equal the manifest's) and ``CUTEDSL_REQUIRED_SASS`` (the NVFP4 block-scaled MMA,
OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X) present in every one.
The cubins are found at ``aot_dir`` / ``--aot-dir``, else $TSCT_AOT_DIR, else next to the library
(site-packages/<manifest triton_aot.dir> for an install, <build dir>/triton_aot for a build tree).
``main`` exits 0 if everything matches, 1 on a mismatch (with a report), 2 if it cannot run (no
cuobjdump, no library, unreadable manifest). cuobjdump comes from the explicit argument, $CUOBJDUMP,
PATH, or the PyPI package nvidia-cuda-cuobjdump (nvdisasm: $NVDISASM, PATH, nvidia-cuda-nvdisasm),
found inside site-packages.

Standard library only, and importing it loads no library and touches no GPU (ci/check_artifacts.py
loads this file by path, without importing tsct or torch).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


# Per-arch SASS expectations, checked by verify(sass=True) on the library's SASS targets and on the
# Triton AOT cubins (target = the cubin's arch directory: sm_90a, sm_100a, sm_120; kernel = its function).
# Also used by `triton_common/aot_build.py --check-sass` on freshly built cubins.
# Adding a check is one line, e.g.:
#   SassRule(r"sm_120[af]", r"^tsctk_.*nvfp4_gemm", require=r"OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X", why="..."),
# No no-spill rule for the Triton kernels: some variants spill (generic, unaligned variants; mma.sync kernels on sm_120
# that hold their accumulators in registers; tiles capped by measurement): STACK_BUDGET below bounds them instead.
_TRITON_GEMM = r"^(glu|lowbit)_(down_fwd|up_fwd|bwd_dz|bwd_dx_dw)$"  # bf16 and low-bit (W4A16) families
_CUDA_LOWBIT = r"^tsctk_glu_(down|up)_fwd_(nvfp4|sign|fp8|ternary|ternary_r1)$"  # the CUDA low-bit projections
SASS_RULES: list[SassRule] = [
    SassRule(r".*", r"^tsctk_(nvfp4|sign|fp8|ternary)_", forbid=r"\b(STL|LDL)(\.\w+)*\b",
             why="quant kernels keep their 16-element block in registers (no local-memory spills)"),
    SassRule(r"sm_(80|90a|100a|120a|120f|120)", r"^tsctk_glu_bwd_dz_bf16$",
             require=r"\bHMMA\.16816\.F32\.BF16\b", forbid=r"\b(STL|LDL)(\.\w+)*\b",
             why="the CUDA glu_bwd_dz runs bf16 mma.sync with fp32 accumulate and keeps its tiles without spills"),
    SassRule(r"sm_(80|100a|120a|120f|120)", _CUDA_LOWBIT,
             require=r"\bHMMA\.16816\.F32\.BF16\b", forbid=r"\b(STL|LDL)(\.\w+)*\b",
             why="the CUDA low-bit GLU projections decode NVFP4 / sign / FP8 / ternary into bf16 mma.sync fragments "
                 "(fp32 accumulate), without spills"),
    SassRule(r"sm_90a", _CUDA_LOWBIT, require=r"\bHGMMA\.64x(32|64)x16\.F32\.BF16\b",
             forbid=r"\b(STL|LDL)(\.\w+)*\b|\bHMMA\.",
             why="on sm_90a the CUDA low-bit GLU projections issue bf16 wgmma with the decoded factors in registers "
                 "(the mma.sync path compiled out), without spills"),
    SassRule(r"sm_(90a|100a|120a|120f)", r"^tsctk_glu_up_fwd_(nvfp4|sign|fp8|ternary|ternary_r1)$", require=r"\bSTSM\b",
             why="the up projection stages y with stmatrix on sm_90+ (the scalar-store fallback is sm_80's)"),
    SassRule(r"sm_90a", _TRITON_GEMM, require=r"\bHGMMA\.", why="Triton GEMMs use wgmma on sm_90a"),
    SassRule(r"sm_100a", _TRITON_GEMM, require=r"\bUTCHMMA\b", why="Triton GEMMs use tcgen05 MMA on sm_100a"),
    SassRule(r"sm_120", _TRITON_GEMM, require=r"\bHMMA\.16816\.F32",
             why="Triton GEMMs use mma.sync (fp32 accumulate) on plain sm_120"),
    SassRule(r"sm_120_proxy_sm90", _TRITON_GEMM, require=r"\bHMMA\.16816\.F32", forbid=r"\bHGMMA\.",
             why="the sm_120 proxy (decision 0017): sm_120's mma.sync kernels assembled for plain sm_90, no wgmma"),
]


#: Local memory (stack bytes per thread, ``cuobjdump --dump-resource-usage``) a Triton AOT cubin may use, per
#: (arch, kernel, "aligned" | "generic" variant): the spills of the shipped tables (the release wheel of 793d75d,
#: bench/results/2026-12-06_cpu_cubin-spills_793d75d.txt; docs/sm120.md); 0 for a kernel without a row. Checked by
#: verify(sass=True) on the arches named here (a proxy or sm_100a build is not): a table or kernel change that adds
#: local memory on a card nobody here can time fails CI until this table says why. Lower a row when a change removes
#: spills.
STACK_BUDGET: dict[tuple[str, str, str], int] = {
    ("sm_90a", "glu_bwd_dw", "generic"): 112,
    ("sm_90a", "glu_bwd_dwd", "aligned"): 24,       # the row-major scatter variant at rank block 32
    ("sm_90a", "glu_bwd_dx_dw", "generic"): 504,
    ("sm_90a", "glu_bwd_dz", "generic"): 216,
    ("sm_90a", "glu_down_fwd", "generic"): 288,
    ("sm_90a", "glu_up_fwd", "aligned"): 176,       # K-major w_down without scatter (BN 256, 8 warps)
    ("sm_90a", "glu_up_fwd", "generic"): 168,
    ("sm_90a", "lowbit_bwd_dx_dw", "generic"): 56,
    ("sm_90a", "lowbit_bwd_dz", "aligned"): 448,    # the fused NVFP4 dz capped at 80 registers (measured faster)
    ("sm_90a", "lowbit_up_fwd", "aligned"): 384,    # the CUDA up projections serve these launches on sm_90a
    ("sm_90a", "lowbit_up_fwd", "generic"): 280,
    ("sm_120", "bwd_slot_reduce", "aligned"): 8,
    ("sm_120", "glu_bwd_dw", "generic"): 280,
    ("sm_120", "glu_bwd_dwd", "aligned"): 48,       # rank blocks 16 and 32 at 4 warps
    ("sm_120", "glu_bwd_dwd", "generic"): 120,
    ("sm_120", "glu_bwd_dx_dw", "generic"): 784,
    ("sm_120", "glu_bwd_dz", "generic"): 616,
    ("sm_120", "glu_down_fwd", "generic"): 304,
    ("sm_120", "glu_up_fwd", "aligned"): 96,        # K-major w_down without scatter at 4 warps
    ("sm_120", "glu_up_fwd", "generic"): 160,
    ("sm_120", "lowbit_bwd_dx_dw", "aligned"): 192,  # sign and the NVFP4-sign mix at a d block of 64
    ("sm_120", "lowbit_bwd_dx_dw", "generic"): 256,
    ("sm_120", "lowbit_down_fwd", "generic"): 24,   # the opt-in byte-plane variants
    ("sm_120", "lowbit_up_fwd", "generic"): 16,
}
_STACK_ARCHS = frozenset(a for a, _, _ in STACK_BUDGET)


def stack_of(resource_usage: str) -> int | None:
    """The STACK bytes of the one function in ``cuobjdump --dump-resource-usage`` output of a cubin, or None."""
    m = re.search(r"\bSTACK:(\d+)", resource_usage)
    return int(m.group(1)) if m else None


def stack_over_budget(arch: str, kernel: str, aligned: bool, stack: int) -> str | None:
    """Why a cubin's ``stack`` bytes exceed ``STACK_BUDGET`` (None if within it, or the arch is not covered)."""
    if arch not in _STACK_ARCHS:
        return None
    kind = "aligned" if aligned else "generic"
    budget = STACK_BUDGET.get((arch, kernel, kind), 0)
    if stack <= budget:
        return None
    return (f"{kernel} ({kind}) uses {stack} bytes of stack (spilled registers), {budget} allowed "
            f"(STACK_BUDGET in tsct/native/artifacts.py: raise it only with the measurement that justifies it)")


#: every CuTeDSL sm_120 kernel linked into the library must hold this SASS instruction (design.md section 4)
CUTEDSL_REQUIRED_SASS = r"\bOMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X\b"
_EM_CUDA = 190


class _CannotRun(Exception):
    """verify() cannot do its check (missing tool / library / manifest, a tool failing)."""


# --- finding things ----------------------------------------------------------------------------
def _site_dirs() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(p)]


def _executable(path: str | None) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _config():
    """tsct.config (every environment variable tsct reads): imported when this module is tsct.native.artifacts;
    loaded from its file when this file runs without the package (ci/check_artifacts.py, the AOT build's
    --check-sass), so that nothing imports tsct or torch there (both files use the standard library only)."""
    if __package__ == "tsct.native":
        from tsct import config
        return config
    name = "_tsct_config_standalone"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "config.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def find_tool(name: str, explicit: str | None = None) -> str | None:
    """`name` ("cuobjdump" or "nvdisasm"): `explicit` (a path or a name on PATH; if given, nothing else is
    tried), else $CUOBJDUMP / $NVDISASM (``tsct.config.tool_path``), PATH, and the nvidia-cuda-* PyPI wheels
    in site-packages. None if not found."""
    if explicit:
        cand = explicit if os.sep in explicit else (shutil.which(explicit) or explicit)
        return cand if _executable(cand) else None
    for cand in (_config().tool_path(name), shutil.which(name)):
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
    for cand in (explicit, _config().native_lib()):
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


def _split_functions(body: str) -> dict[str, str]:
    """function -> SASS text of a dump's 'Function : name' blocks."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", body, flags=re.M)
    got: dict[str, str] = {}
    for i in range(1, len(parts) - 1, 2):
        got[parts[i]] = got.get(parts[i], "") + parts[i + 1]
    return got


def sass_functions(text: str) -> dict[str, dict[str, str]]:
    """arch -> kernel -> SASS text, from `--dump-sass` of a fatbinary."""
    got: dict[str, dict[str, str]] = {}
    for arch, body in split_sections(text, "elf"):
        funcs = got.setdefault(arch, {})
        for name, sass in _split_functions(body).items():
            funcs[name] = funcs.get(name, "") + sass
    return got


def cubin_sass(text: str) -> tuple[list[str], dict[str, str]]:
    """`--dump-sass` of a lone cubin: (the archs of its 'code for sm_XX' lines, function -> SASS)."""
    return re.findall(r"^\s*code for (\S+)\s*$", text, re.M), _split_functions(text)


def rule_failures(target: str, funcs: dict[str, str]) -> list[tuple[str, str]]:
    """(kernel, what is wrong) for every SASS_RULES row that applies to `target` and fails."""
    out = []
    for rule in SASS_RULES:
        if not re.fullmatch(rule.arch, target):
            continue
        for kname, text in sorted(funcs.items()):
            if not re.search(rule.kernel, kname):
                continue
            if rule.require and not re.search(rule.require, text):
                out.append((kname, f"SASS lacks /{rule.require}/ ({rule.why})"))
            if rule.forbid and (m := re.search(rule.forbid, text)):
                out.append((kname, f"SASS has forbidden '{m.group(0)}' /{rule.forbid}/ ({rule.why})"))
    return out


def rules_cover(target: str, kernel: str) -> bool:
    return any(re.fullmatch(r.arch, target) and re.search(r.kernel, kernel) for r in SASS_RULES)


def _listed_name(target: str) -> str:
    """How --list-elf names an SASS target: cuobjdump 13.x drops the f of sm_XXf (not the a of sm_XXa)."""
    return target[:-1] if target.endswith("f") else target


def elf_arch(arch: str, index: dict | None = None) -> str:
    """The SASS arch the cubins of an AOT arch directory are for, as cuobjdump names it ("code for", --list-elf):
    the directory's name, or for a proxy (its index.json has a "proxy" record, docs/decisions/0017) the
    target it was assembled for (sm_120_proxy_sm90: sm_90)."""
    ptx = ((index or {}).get("proxy") or {}).get("ptx")
    return _listed_name(str(ptx) if ptx else arch)


def proxy_archs(aot_section: dict | None) -> dict[str, dict]:
    """{arch: its "proxy" record} of a manifest's triton_aot section: the archs that are proxies (development
    builds of another arch's kernels for a GPU we have, decision 0017), empty for a release build."""
    archs = (aot_section or {}).get("archs")
    return {a: v["proxy"] for a, v in (archs or {}).items() if isinstance(v, dict) and v.get("proxy")}


def _run_each(tool: str, args: list[str], paths: list[Path], env: dict[str, str] | None = None
              ) -> list[tuple[str | None, str | None]]:
    """run_tool on each path, a few at a time: (stdout, None) or (None, why it failed)."""
    def one(path: Path) -> tuple[str | None, str | None]:
        try:
            return run_tool(tool, args, path, env), None
        except _CannotRun as e:
            return None, str(e)

    if len(paths) <= 1:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as ex:
        return list(ex.map(one, paths))


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


def find_aot_dir(explicit: str | os.PathLike | None, lib: Path, section: dict | None = None) -> Path:
    """`explicit`, else $TSCT_AOT_DIR, else next to the library: site-packages/<section["dir"]> for an
    install (tsct/_lib/libtsct_kernels.so -> tsct/_aot), <dir of the .so>/triton_aot for a build tree.
    The directory may not exist."""
    for cand in (explicit, _config().aot_dir()):
        if cand:
            return Path(cand).expanduser()
    rel = str((section or {}).get("dir") or "tsct/_aot")
    cands = [lib.parent.parent.parent / rel, lib.parent / "triton_aot"]
    return next((c for c in cands if c.is_dir()), cands[0])


def _capped(lines: list[str], limit: int = 12) -> list[str]:
    return lines if len(lines) <= limit else lines[:limit] + [f"... and {len(lines) - limit} more like these"]


def _count(problems: list[str]) -> int:
    """The problems a (possibly _capped) list stands for."""
    return sum(int(m.group(1)) if (m := re.fullmatch(r"\.\.\. and (\d+) more like these", p)) else 1
               for p in problems)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify_aot(res: dict[str, Any], man: dict, lib: Path, aot_arg, cuobjdump: str, sass: bool,
                all_variants: bool, env: dict[str, str] | None) -> list[str]:
    """The Triton AOT cubins against the manifest's "triton_aot" section. Fills res["triton_aot"]
    (None when the manifest has no such section) and returns the problems."""
    sec = man.get("triton_aot")
    if sec is None:
        res["triton_aot"] = None
        return []
    if not isinstance(sec, dict) or not isinstance(sec.get("archs"), dict):
        res["triton_aot"] = {"dir": None, "triton_version": None, "cubins": 0, "sass_checked": 0, "archs": []}
        return ["triton AOT: the manifest's triton_aot section has no 'archs' table"]
    root = find_aot_dir(aot_arg, lib, sec)
    want_archs: dict[str, dict] = sec["archs"]
    info: dict[str, Any] = {"dir": str(root), "triton_version": sec.get("triton_version"), "all_variants": all_variants,
                            "cubins": sum(int(a.get("variants") or 0) for a in want_archs.values()),
                            "sass_checked": 0, "archs": [], "proxy": proxy_archs(sec)}
    res["triton_aot"] = info
    problems: list[str] = []
    if not root.is_dir():
        return [f"triton AOT: no cubin directory {root} (the manifest lists {info['cubins']} cubins in "
                f"{len(want_archs)} archs; set --aot-dir or $TSCT_AOT_DIR?)"]

    top = root / "index.json"  # the build's summary of all archs, if there is one
    if top.is_file():
        try:
            t = json.loads(top.read_text())
            tarchs = t.get("archs") or {}
            if t.get("triton_version") != sec.get("triton_version"):
                problems.append(f"triton AOT: {top} is for Triton {t.get('triton_version')}, "
                                f"the manifest {sec.get('triton_version')}")
            if sorted(tarchs) != sorted(want_archs):
                problems.append(f"triton AOT: {top} lists archs {sorted(tarchs)}, the manifest {sorted(want_archs)}")
            for a in sorted(set(tarchs) & set(want_archs)):
                if (tarchs[a].get("variants"), tarchs[a].get("kernels")) != (want_archs[a].get("variants"),
                                                                             want_archs[a].get("kernels")):
                    problems.append(f"triton AOT {a}: {top} counts differ from the manifest's")
        except (OSError, ValueError, AttributeError) as e:
            problems.append(f"triton AOT: cannot read {top}: {e}")
    extra = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name not in want_archs)
    if extra:
        problems.append(f"triton AOT: directories not in the manifest: {extra}")

    elf_jobs: list[tuple[dict, str, Path]] = []    # (row, expected --list-elf name, cubin)
    stack_jobs: list[tuple[dict, dict, Path]] = []  # (row, entry, cubin): local memory against STACK_BUDGET
    sass_jobs: list[tuple[dict, str, dict, Path, str]] = []  # (row, arch, entry, cubin, its SASS arch)
    per_arch: dict[str, list[str]] = {}
    for arch in sorted(want_archs):
        want = want_archs[arch] if isinstance(want_archs[arch], dict) else {}
        row: dict[str, Any] = {"arch": arch, "cubins_manifest": want.get("variants"), "cubins_index": 0,
                               "present": 0, "sha256_ok": 0, "elf_ok": 0, "sass_checked": 0, "kernels": {},
                               "status": set()}
        info["archs"].append(row)
        bad = per_arch.setdefault(arch, [])
        idx_path = root / arch / "index.json"
        try:
            idx = json.loads(idx_path.read_text())
            entries = idx["kernels"]
            if not isinstance(entries, dict):
                raise ValueError("'kernels' is not a table")
        except (OSError, ValueError, KeyError, TypeError) as e:
            bad.append(f"triton AOT {arch}: cannot read {idx_path}: {e}")
            row["status"].add("NO INDEX")
            continue
        row["cubins_index"] = len(entries)
        elf = elf_arch(arch, idx)
        row["elf_arch"] = elf
        if bool(idx.get("proxy")) != (arch in proxy_archs(sec)):
            bad.append(f"triton AOT {arch}: the index and the manifest disagree on whether it is a proxy")
            row["status"].add("INDEX")
        ptx_ok = (str(idx["proxy"].get("ptx")),) if idx.get("proxy") else (arch,)
        if idx.get("arch", arch) != arch:
            bad.append(f"triton AOT {arch}: {idx_path} says arch {idx.get('arch')}")
            row["status"].add("INDEX")
        if idx.get("triton_version") != sec.get("triton_version"):
            bad.append(f"triton AOT {arch}: index.json is for Triton {idx.get('triton_version')}, "
                       f"the manifest {sec.get('triton_version')}")
            row["status"].add("INDEX")
        counts: dict[str, int] = {}
        by_kernel: dict[str, list[dict]] = {}
        for key in sorted(entries):
            e = entries[key] if isinstance(entries[key], dict) else {}
            kname = str(e.get("kernel") or str(key).split("|", 1)[0])
            counts[kname] = counts.get(kname, 0) + 1
            by_kernel.setdefault(kname, []).append(e)
        row["kernels"] = dict(sorted(counts.items()))
        if len(entries) != want.get("variants"):
            bad.append(f"triton AOT {arch}: index.json lists {len(entries)} cubins, the manifest "
                       f"{want.get('variants')}")
            row["status"].add("COUNTS")
        if want.get("kernels") is not None and row["kernels"] != dict(sorted(want["kernels"].items())):
            diff = sorted(k for k in set(counts) | set(want["kernels"]) if counts.get(k) != want["kernels"].get(k))
            bad.append(f"triton AOT {arch}: cubins per kernel differ from the manifest for {diff}")
            row["status"].add("COUNTS")

        listed = set()
        file_bad: list[str] = []
        for key in sorted(entries):
            e = entries[key] if isinstance(entries[key], dict) else {}
            fname = str(e.get("file") or "")
            if not fname or os.sep in fname or fname.startswith("."):
                file_bad.append(f"triton AOT {arch}: index entry {key!r} has no usable file name ({fname!r})")
                row["status"].add("INDEX")
                continue
            listed.add(fname)
            ptx = e.get("ptx_arch")
            if ptx is not None and ptx not in ptx_ok:
                file_bad.append(f"triton AOT {arch}/{fname}: built for PTX target {ptx!r}, expected one of "
                                f"{list(ptx_ok)}")
                row["status"].add("ELF ARCH")
            path = root / arch / fname
            if not path.is_file():
                file_bad.append(f"triton AOT {arch}/{fname}: missing (index key {key})")
                row["status"].add("MISSING")
                continue
            row["present"] += 1
            got = _sha256(path)
            if got != e.get("sha256"):
                file_bad.append(f"triton AOT {arch}/{fname}: sha256 {got[:16]}... != index.json's "
                                f"{str(e.get('sha256'))[:16]}...")
                row["status"].add("SHA256")
            else:
                row["sha256_ok"] += 1
            elf_jobs.append((row, elf, path))
            if sass and arch in _STACK_ARCHS:
                stack_jobs.append((row, e, path))
        bad += _capped(file_bad)
        stray = sorted(p.name for p in (root / arch).glob("*.cubin") if p.name not in listed)
        if stray:
            bad.append(f"triton AOT {arch}: cubins no index.json lists: {_capped(stray, 5)}")
            row["status"].add("STRAY")

        if sass:
            for kname, es in sorted(by_kernel.items()):
                es = [e for e in es if (root / arch / str(e.get("file") or "")).is_file() and e.get("file")]
                if not es:
                    continue
                if all_variants:
                    picks = es
                elif rules_cover(arch, str(es[0].get("function") or kname)):
                    picks = [next((e for e in es if e.get("aligned") and "*bf16" in str(e.get("key", ""))), es[0])]
                else:
                    picks = []
                sass_jobs += [(row, arch, e, root / arch / str(e["file"]), elf) for e in picks]

    # --list-elf of every present cubin: exactly one ELF, of its arch
    elf_bad: dict[str, list[str]] = {}
    for (row, elf, path), (out, err) in zip(elf_jobs, _run_each(cuobjdump, ["--list-elf"], [j[2] for j in elf_jobs])):
        got = parse_list(out) if out is not None else None
        if got == [elf]:
            row["elf_ok"] += 1
            continue
        arch = row["arch"]
        elf_bad.setdefault(arch, []).append(
            f"triton AOT {arch}/{path.name}: " + (err or f"--list-elf shows {got}, expected ['{elf}']"))
        row["status"].add("ELF ARCH")
    for arch, lines in elf_bad.items():
        per_arch[arch] += _capped(lines)

    # local memory of every present cubin against STACK_BUDGET (sass: the thorough check)
    stack_bad: dict[str, list[str]] = {}
    outs = _run_each(cuobjdump, ["--dump-resource-usage"], [p for _, _, p in stack_jobs])
    for (row, e, path), (out, err) in zip(stack_jobs, outs):
        arch = row["arch"]
        stack = stack_of(out) if out is not None else None
        why = (err or "no STACK in --dump-resource-usage") if stack is None else \
            stack_over_budget(arch, str(e.get("kernel") or ""), bool(e.get("aligned")), stack)
        if why:
            stack_bad.setdefault(arch, []).append(f"triton AOT {arch}/{path.name}: {why}")
            row["status"].add("STACK")
    for arch, lines in stack_bad.items():
        per_arch[arch] += _capped(lines)

    # SASS: the arch of the code, the function, SASS_RULES
    sass_bad: dict[str, list[str]] = {}
    outs = _run_each(cuobjdump, ["--dump-sass"], [j[3] for j in sass_jobs], env=env)
    for (row, arch, e, path, elf), (out, err) in zip(sass_jobs, outs):
        row["sass_checked"] += 1
        info["sass_checked"] += 1
        lines = sass_bad.setdefault(arch, [])
        where = f"triton AOT {arch}/{path.name}"
        if out is None:
            lines.append(f"{where}: {err}")
            row["status"].add("NO SASS")
            continue
        codes, funcs = cubin_sass(out)
        if not codes or set(codes) != {elf}:
            lines.append(f"{where}: SASS is 'code for' {sorted(set(codes))}, expected {elf}")
            row["status"].add("ELF ARCH")
        fn = str(e.get("function") or e.get("kernel") or "")
        if fn not in funcs:
            lines.append(f"{where}: no SASS for function {fn!r} (found {sorted(funcs)})")
            row["status"].add("NO SASS")
        for kname, what in rule_failures(arch, funcs):
            lines.append(f"{where} ({kname}): {what}")
            row["status"].add("RULE")
    for arch, lines in sass_bad.items():
        per_arch[arch] += _capped(lines)

    for row in info["archs"]:
        st = row.pop("status")
        row.update(ok=not st, status="ok" if not st else ", ".join(sorted(st)))
    for arch in sorted(per_arch):
        problems += per_arch[arch]
    return problems


def _section_range(data: bytes, name: str) -> tuple[int, int] | None:
    """(offset, end) of an ELF64 section by name, or None."""
    import struct
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx][4]
    for h in hdrs:
        end = data.index(b"\0", strtab + h[0])
        if data[strtab + h[0]:end].decode(errors="replace") == name:
            return h[4], h[4] + h[5]
    return None


def embedded_cuda_elfs(data: bytes, skip: tuple[int, int] | None = None) -> list[bytes]:
    """Every ELF64 CUDA image (e_machine 190) inside ``data``, outside the byte range ``skip``, sized
    from its section and program header tables (how the CuTeDSL exports embed their cubins)."""
    import struct
    out, i = [], -1
    while True:
        i = data.find(b"\x7fELF", i + 1)
        if i < 0:
            return out
        if skip and skip[0] <= i < skip[1]:
            i = skip[1] - 1
            continue
        if i + 64 > len(data) or data[i + 4] != 2 or data[i + 5] != 1:
            continue
        if struct.unpack_from("<H", data, i + 18)[0] != _EM_CUDA:
            continue
        e_phoff, e_shoff = struct.unpack_from("<QQ", data, i + 32)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, i + 54)
        size = max(e_shoff + e_shnum * e_shentsize, e_phoff + e_phnum * e_phentsize)
        for j in range(e_shnum):
            off = i + e_shoff + j * e_shentsize
            if off + 64 > len(data):
                break
            sh_type, = struct.unpack_from("<I", data, off + 4)
            sh_offset, sh_size = struct.unpack_from("<QQ", data, off + 24)
            if sh_type != 8:  # SHT_NOBITS occupies no bytes
                size = max(size, sh_offset + sh_size)
        out.append(data[i:i + size])
        i += max(size, 1) - 1


def _verify_cutedsl(res: dict[str, Any], man: dict, lib: Path, cuobjdump: str, sass: bool,
                    env: dict[str, str] | None) -> list[str]:
    """The CuTeDSL cubins embedded in the library against the manifest's "cutedsl" section. Fills
    res["cutedsl"] (None without the section) and returns the problems."""
    import tempfile
    sec = man.get("cutedsl")
    if not sec:
        res["cutedsl"] = None
        return []
    want = [k["name"] for k in sec.get("kernels", [])]
    arch = sec.get("arch", "sm_120a")
    archs = list(sec.get("archs") or [arch])  # one export per arch (sm_120a, sm_121a; decision 0010)
    want_per_arch = collections.Counter(k.get("arch", arch) for k in sec.get("kernels", []))
    data = lib.read_bytes()
    cubins = embedded_cuda_elfs(data, _section_range(data, ".nv_fatbin"))
    info = {"dsl": sec.get("dsl"), "arch": ",".join(archs), "kernels": len(want), "cubins": len(cubins),
            "sass_checked": 0, "omma_ok": 0, "per_arch": {}}
    res["cutedsl"] = info
    problems = []
    if len(cubins) != len(want):
        problems.append(f"cutedsl: the library embeds {len(cubins)} CUDA images outside .nv_fatbin, the manifest "
                        f"lists {len(want)} CuTeDSL kernels")
    if sass:
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for n, blob in enumerate(cubins):
                p = Path(tmp) / f"cutedsl_{n}.cubin"
                p.write_bytes(blob)
                paths.append(p)
            for n, (out, err) in enumerate(_run_each(cuobjdump, ["--dump-sass"], paths, env=env)):
                info["sass_checked"] += 1
                if out is None:
                    problems.append(f"cutedsl cubin {n}: {err}")
                    continue
                codes, funcs = cubin_sass(out)
                if len(set(codes)) != 1 or codes[0] not in archs:
                    problems.append(f"cutedsl cubin {n}: SASS is 'code for' {sorted(set(codes))}, expected one of "
                                    f"{archs}")
                else:
                    info["per_arch"][codes[0]] = info["per_arch"].get(codes[0], 0) + 1
                if re.search(CUTEDSL_REQUIRED_SASS, out):
                    info["omma_ok"] += 1
                else:
                    problems.append(f"cutedsl cubin {n} ({', '.join(sorted(funcs))[:80]}): SASS lacks "
                                    f"/{CUTEDSL_REQUIRED_SASS}/ (the NVFP4 block-scaled MMA)")
        if not problems and info["per_arch"] != dict(want_per_arch):
            problems.append(f"cutedsl: cubins per arch {info['per_arch']}, the manifest lists {dict(want_per_arch)}")
    return problems


def _cutedsl_summary(info: dict | None, problems: list[str], sass: bool) -> str:
    if info is None:
        return "; cutedsl: none"
    s = f"; cutedsl: {info['cubins']}/{info['kernels']}" + (" OMMA" if sass else "")
    return s + (f": {_count(problems)} problems" if problems else " ok")


def _verdict(problems: list[str], sass: bool) -> str:
    if problems:
        n = _count(problems)
        return f": {n} problem{'s' if n != 1 else ''}"
    return " match, rules ok" if sass else " match"


def _summary(gencodes: list[str], want: dict[str, set[str]], sass: bool, lib_problems: list[str],
             aot: dict | None, aot_problems: list[str]) -> str:
    """One short line, e.g. 'library: 6 targets x 12 kernels match; triton AOT: 714 cubins, 3 archs match'."""
    counts = sorted({len(want.get(g, ())) for g in gencodes})
    kern = str(counts[0]) if len(counts) == 1 else (f"{counts[0]}-{counts[-1]}" if counts else "0")
    s = f"library: {len(gencodes)} targets x {kern} kernels" + _verdict(lib_problems, sass)
    if aot is None:
        return s + "; triton AOT: none in the manifest"
    n = len(aot["archs"])
    s += f"; triton AOT: {aot['cubins']} cubins, {n} arch{'s' if n != 1 else ''}" + _verdict(aot_problems, sass)
    if sass and aot.get("sass_checked"):
        s += f" ({aot['sass_checked']} disassembled)"
    for arch, p in sorted((aot.get("proxy") or {}).items()):
        s += f"; PROXY BUILD, not a release: {arch} = {p.get('of')}'s kernels assembled for {p.get('ptx')}"
    return s


def verify(lib: str | os.PathLike | None = None, manifest: str | os.PathLike | dict | None = None,
           cuobjdump: str | None = None, sass: bool = False, aot_dir: str | os.PathLike | None = None,
           all_variants: bool = False) -> dict[str, Any]:
    """Compare the library's device code and the Triton AOT cubins (per cuobjdump) with the manifest.
    Prints nothing, never raises.

    lib: the .so or its directory (default: $TSCT_NATIVE_LIB, else the installed tsct's).
    manifest: a path, or the manifest as a dict (default: manifest.json next to the library).
    cuobjdump: the tool's path (default: $CUOBJDUMP, PATH, the nvidia-cuda-cuobjdump wheel).
    sass: also disassemble (needs nvdisasm): every library kernel has SASS, one cubin per
        (arch, kernel) that a rule covers is disassembled, and SASS_RULES hold.
    aot_dir: the directory holding <arch>/index.json (default: $TSCT_AOT_DIR, else next to the library).
    all_variants: with sass, disassemble every cubin instead of one per (arch, kernel) (minutes).

    Returns {"ok", "status" ("match" | "mismatch" | "error"), "library", "manifest", "cuobjdump",
    "nvdisasm", "sass", "all_variants", "targets" (one row per manifest gencode), "triton_aot" (None
    without a manifest section, else {"dir", "triton_version", "cubins", "sass_checked", "archs": one
    row per arch}), "problems" (str each), "detail" (one line: the summary, or why the check could not
    run), "build" (version, nvcc, built_at from the manifest)}. A missing tool, library or manifest, or
    a failing tool on the library, gives ok False, status "error" and a detail saying what is missing
    and how to get it; so does an unexpected failure of the checker itself.
    """
    res: dict[str, Any] = {"ok": False, "status": "error", "library": None, "manifest": None, "cuobjdump": None,
                           "nvdisasm": None, "sass": bool(sass), "all_variants": bool(all_variants), "targets": [],
                           "triton_aot": None, "cutedsl": None, "problems": [], "detail": "",
                           "build": {}}
    try:
        _verify(res, lib, manifest, cuobjdump, sass, aot_dir, all_variants)
    except _CannotRun as e:
        res.update(ok=False, status="error", detail=str(e))
    except Exception as e:  # a bug in the checker (or a malformed manifest) must not take the caller down
        res.update(ok=False, status="error", detail=f"the artifact check failed: {type(e).__name__}: {e}")
    return res


def _verify(res: dict[str, Any], lib_arg, manifest_arg, cuobjdump_arg, sass: bool, aot_arg,
            all_variants: bool) -> None:
    lib = find_library(lib_arg)
    res["library"] = str(lib) if lib is not None else None
    if lib is None or not lib.is_file():
        raise _CannotRun(f"no native library found ({lib}); is tsct installed with its kernels?")
    man, res["manifest"] = _load_manifest(manifest_arg, lib)
    res["build"] = {k: man.get(k) for k in ("version", "nvcc_version", "built_at")}

    cuobjdump = find_tool("cuobjdump", cuobjdump_arg)
    if cuobjdump is None:
        where = (f"{cuobjdump_arg!r} is not an executable" if cuobjdump_arg
                 else "not on PATH, $CUOBJDUMP or in site-packages")
        raise _CannotRun(f"cuobjdump not found ({where}); get it with `{CUOBJDUMP_HINT}`")
    res["cuobjdump"] = cuobjdump
    env = None
    if sass:
        nvdisasm = find_tool("nvdisasm")
        if nvdisasm is None:
            raise _CannotRun(f"the SASS check needs nvdisasm (not on PATH, $NVDISASM or in site-packages); "
                             f"get it with `{NVDISASM_HINT}`")
        res["nvdisasm"] = nvdisasm
        env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm))  # the child's: ours, nvdisasm's dir first
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")

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
    expect_listed = sorted({_listed_name(g) for g in want_sass})
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
            count = list_elf.count(_listed_name(g))
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
            for kname, what in rule_failures(g, funcs):
                problems.append(f"{g}/{kname}: {what}")
                status.append("RULE")
        rows.append({"target": g, "kind": kind, "cubins": count, "kernels_manifest": len(want),
                     "kernels_found": len(got), "ok": not status,
                     "status": "ok" if not status else ", ".join(sorted(set(status)))})

    aot_problems = _verify_aot(res, man, lib, aot_arg, cuobjdump, sass, all_variants, env)
    cdsl_problems = _verify_cutedsl(res, man, lib, cuobjdump, sass, env)
    everything = problems + aot_problems + cdsl_problems
    res.update(ok=not everything, status="mismatch" if everything else "match", targets=rows, problems=everything,
               detail=_summary(gencodes, want_kernels, sass, problems, res["triton_aot"], aot_problems)
               + _cutedsl_summary(res.get("cutedsl"), cdsl_problems, sass))


# --- the report --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compare libtsct_kernels.so's device code and the Triton AOT cubins "
                                             "with manifest.json.")
    ap.add_argument("--lib", help="the .so (or its directory); default: the installed tsct, or $TSCT_NATIVE_LIB")
    ap.add_argument("--manifest", help="default: manifest.json next to the library")
    ap.add_argument("--aot-dir", help="the Triton cubins (<dir>/<arch>/index.json); default: $TSCT_AOT_DIR, "
                                      "else next to the library")
    ap.add_argument("--cuobjdump", help="default: $CUOBJDUMP, PATH, or the nvidia-cuda-cuobjdump wheel")
    ap.add_argument("--sass", action="store_true", help="also check kernels and SASS_RULES in --dump-sass (needs nvdisasm)")
    ap.add_argument("--all-variants", action="store_true",
                    help="with --sass, disassemble every Triton cubin, not one per (arch, kernel) (minutes)")
    ap.add_argument("--json", action="store_true",
                    help="print the findings as JSON on stdout (the human report then goes to stderr)")
    args = ap.parse_args(argv)
    if args.all_variants and not args.sass:
        ap.error("--all-variants needs --sass")

    r = verify(lib=args.lib, manifest=args.manifest, cuobjdump=args.cuobjdump, sass=args.sass,
               aot_dir=args.aot_dir, all_variants=args.all_variants)
    if r["status"] == "error":
        print(f"check_artifacts: {r['detail']}", file=sys.stderr)
        if args.json:
            print(json.dumps(r, indent=2))
        return 2

    if args.json:  # JSON alone on stdout, so it parses; the report for people on stderr
        with contextlib.redirect_stdout(sys.stderr):
            rc = _report(r)
        print(json.dumps(r, indent=2))
        return rc
    return _report(r)


def _report(r: dict) -> int:
    """Print the human-readable report of ``verify``'s result; 1 on a mismatch, else 0."""
    b = r["build"]
    print(f"library:   {r['library']}")
    print(f"manifest:  {r['manifest']} (tsct {b.get('version')}, nvcc {b.get('nvcc_version')}, built {b.get('built_at')})")
    print(f"cuobjdump: {r['cuobjdump']}")
    print()
    print(f"{'target':<12} {'kind':<5} {'cubins':>6} {'kernels (manifest / cuobjdump)':>32}  {'status'}")
    for row in r["targets"]:
        kern = f"{row['kernels_manifest']} / {row['kernels_found']}"
        print(f"{row['target']:<12} {row['kind']:<5} {row['cubins']:>6} {kern:>32}  {row['status']}")
    aot = r["triton_aot"]
    if aot is None:
        print("\ntriton AOT: the manifest has no triton_aot section (built with TSCT_TRITON_AOT=OFF?)")
    else:
        print(f"\ntriton AOT: {aot['dir']} (Triton {aot['triton_version']})")
        for arch, p in sorted((aot.get("proxy") or {}).items()):
            print(f"PROXY BUILD (not a release): {arch}: {p.get('note') or p}")
        print(f"{'arch':<12} {'cubins (manifest / index)':>26} {'present':>8} {'sha256':>7} {'elf arch':>9} "
              f"{'SASS':>5}  status")
        for row in aot["archs"]:
            n = f"{row['cubins_manifest']} / {row['cubins_index']}"
            print(f"{row['arch']:<12} {n:>26} {row['present']:>8} {row['sha256_ok']:>7} {row['elf_ok']:>9} "
                  f"{row['sass_checked']:>5}  {row['status']}")
    if r["sass"]:
        print(f"\nSASS rules checked ({len(SASS_RULES)}):")
        for rule in SASS_RULES:
            what = (f"requires /{rule.require}/" if rule.require else "") + \
                   (" and " if rule.require and rule.forbid else "") + (f"forbids /{rule.forbid}/" if rule.forbid else "")
            print(f"  {rule.arch:<10} {rule.kernel:<52} {what}: {rule.why}")
    cd = r.get("cutedsl")
    if cd is None:
        print("\ncutedsl: the manifest has no cutedsl section (built with TSCT_CUTEDSL=OFF, or AUTO without the DSL)")
    else:
        print(f"\ncutedsl ({(cd.get('dsl') or {}).get('version')}, {cd['arch']}): {cd['cubins']} embedded cubins for "
              f"{cd['kernels']} kernels" + (f", OMMA.SF.16864...UE4M3.4X in {cd['omma_ok']}" if r["sass"] else ""))
    print(f"\n{r['detail']}")
    if r["problems"]:
        print("\nMISMATCH:")
        for p in r["problems"]:
            print(f"  - {p}")
        return 1
    print("artifacts match the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
