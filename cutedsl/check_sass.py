#!/usr/bin/env python3
"""Check that exported CuTeDSL objects carry sm_120 cubins with the NVFP4 block-scaled MMA in SASS.

The object written by ``export_to_c`` is a host ELF that embeds the device cubin as data (it is
loaded with ``cudaLibraryLoadData``), so ``cuobjdump`` does not see it in the ``.o`` directly. This
script finds every embedded CUDA ELF (ELF64, e_machine 190 = EM_CUDA), checks its target arch from
``cuobjdump -lelf``/``-sass`` and counts SASS instructions. A kernel passes when every cubin it
holds is for the expected arch and contains ``OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X``.

With ``index.json`` (written by ``build.py``) the check is per kernel and stricter:

* the OMMA count equals the expected one: the K loop is not unrolled, so the SASS holds one OMMA per
  (warp, m16 x n8 atom) per k-step and accumulator chain: ``operands * tile_n / 16`` (one m16 atom
  per warp, two warps along N; ``operands`` = 2 for the sign GLU's gate and up chains);
* a sign kernel (``params.sign``) also shows the in-register expansion of the 1-bit factor: the
  E2M1 +1.0 pattern ``0x22222222`` (OR-ed with the shifted bits), the unit UE4M3 block scales
  ``0x38383838`` as an immediate (no scale buffer read), and byte loads (``LDG.E.U8``) of the bits.

Usage::

    python cutedsl/check_sass.py OUT_DIR [--arch sm_120a] [--json report.json]

OUT_DIR is the directory ``cutedsl/build.py`` wrote (it reads ``index.json`` there), or any
directory of ``.o`` files. Exit status 0 only if every object passes. Needs ``cuobjdump``
(``pip install nvidia-cuda-cuobjdump``); no GPU, no CuTeDSL.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REQUIRED = "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"
EM_CUDA = 190
SIGN_IMMEDIATES = ("0x22222222", "0x38383838")  # E2M1 +1.0 x 8 (B codes), UE4M3 1.0 x 4 (B scales)


def find_cuobjdump() -> str:
    """cuobjdump from PATH, CUDA_HOME, or the nvidia-cuda-cuobjdump wheel."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        cand = Path(root) / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    try:
        import nvidia  # the nvidia-* wheels share this namespace package
        for base in nvidia.__path__:
            for cand in Path(base).glob("*/bin/cuobjdump"):
                return str(cand)
    except ImportError:
        pass
    raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump, or set CUDA_HOME")


def embedded_cubins(blob: bytes) -> list[bytes]:
    """Every ELF64 little-endian CUDA image inside ``blob`` (sized from its section-header table)."""
    out, i = [], -1
    while True:
        i = blob.find(b"\x7fELF", i + 1)
        if i < 0:
            return out
        if i + 64 > len(blob) or blob[i + 4] != 2 or blob[i + 5] != 1:
            continue
        if struct.unpack_from("<H", blob, i + 18)[0] != EM_CUDA:
            continue
        e_phoff, e_shoff = struct.unpack_from("<QQ", blob, i + 32)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", blob, i + 54)
        size = max(e_shoff + e_shnum * e_shentsize, e_phoff + e_phnum * e_phentsize)
        # sections may lie past the header table; take the furthest section end
        for s in range(e_shnum):
            off = i + e_shoff + s * e_shentsize
            sh_type = struct.unpack_from("<I", blob, off + 4)[0]
            sh_offset, sh_size = struct.unpack_from("<QQ", blob, off + 24)
            if sh_type != 8:  # SHT_NOBITS occupies no file space
                size = max(size, sh_offset + sh_size)
        out.append(blob[i:i + size])


def sass_report(cubin: bytes, cuobjdump: str) -> dict:
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([cuobjdump, "--dump-sass", str(path)], check=True, capture_output=True,
                              text=True).stdout
    arch = sorted(set(re.findall(r"code for (sm_\w+)", sass)))
    kernels = re.findall(r"Function : (\S+)", sass)
    opcodes = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            opcodes[m.group(1)] += 1
    omma = {k: v for k, v in opcodes.items() if k.startswith("OMMA")}
    immediates = {imm: len(re.findall(rf"\b{imm}\b", sass)) for imm in SIGN_IMMEDIATES}
    return {"arch": arch, "immediates": immediates, "ldg_u8": opcodes.get("LDG.E.U8", 0), "kernels": kernels,
            "instructions": sum(opcodes.values()), "omma": omma,
            "ldg": sum(v for k, v in opcodes.items() if k.startswith("LDG")),
            "stg": sum(v for k, v in opcodes.items() if k.startswith("STG")),
            "bytes": len(cubin)}


def expected_omma(kernel: dict) -> int | None:
    """OMMAs per k-step in the SASS of one ``index.json`` kernel entry (None without its params)."""
    params = kernel.get("params") or {}
    if "tile_n" not in params:
        return None
    return int(kernel.get("operands", 1)) * int(params["tile_n"]) // 16


def check_object(obj: Path, arch: str, cuobjdump: str, kernel: dict | None = None) -> dict:
    cubins = embedded_cubins(obj.read_bytes())
    reports = [sass_report(c, cuobjdump) for c in cubins]
    problems = []
    if not reports:
        problems.append("no embedded cubin")
    for r in reports:
        if r["arch"] != [arch]:
            problems.append(f"arch {r['arch']} != [{arch}]")
        if r["omma"].get(REQUIRED, 0) == 0:
            problems.append(f"no {REQUIRED}")
    want = expected_omma(kernel) if kernel else None
    if want is not None and sum(r["omma"].get(REQUIRED, 0) for r in reports) != want:
        problems.append(f"{REQUIRED} count {[r['omma'].get(REQUIRED, 0) for r in reports]} != {want}")
    is_sign = bool(kernel and (kernel.get("params") or {}).get("sign"))
    if is_sign:
        for imm in SIGN_IMMEDIATES:
            if not any(r["immediates"][imm] for r in reports):
                problems.append(f"sign kernel without the {imm} immediate")
        if not any(r["ldg_u8"] for r in reports):
            problems.append("sign kernel without LDG.E.U8 (bit loads)")
    return {"object": obj.name, "object_bytes": obj.stat().st_size, "cubins": reports, "omma_expected": want,
            "sign": is_sign, "problems": problems, "ok": not problems}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--arch", default="sm_120a")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    index = args.out_dir / "index.json"
    if index.exists():
        kernels = json.loads(index.read_text())["kernels"]
        objs = [args.out_dir / k["object"] for k in kernels]
    else:
        objs = sorted(args.out_dir.glob("*.o"))
        kernels = [None] * len(objs)
    if not objs:
        print(f"no objects in {args.out_dir}", file=sys.stderr)
        return 1
    cuobjdump = find_cuobjdump()
    results = [check_object(o, args.arch, cuobjdump, k) for o, k in zip(objs, kernels)]
    for r in results:
        for c in r["cubins"] or [{}]:
            print(f"{'PASS' if r['ok'] else 'FAIL'} {r['object']}: arch={c.get('arch')} kernels={c.get('kernels')} "
                  f"instructions={c.get('instructions')} {REQUIRED}={c.get('omma', {}).get(REQUIRED, 0)} "
                  f"other OMMA={ {k: v for k, v in c.get('omma', {}).items() if k != REQUIRED} } "
                  f"(expected {r['omma_expected']}) LDG={c.get('ldg')} (U8 {c.get('ldg_u8')}) STG={c.get('stg')} "
                  f"cubin_bytes={c.get('bytes')}" + (f" sign immediates={c.get('immediates')}" if r["sign"] else "")
                  + (f" PROBLEMS: {r['problems']}" if r["problems"] else ""))
    if args.json:
        args.json.write_text(json.dumps({"required": REQUIRED, "arch": args.arch, "objects": results}, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
