#!/usr/bin/env python3
"""Check that exported CuTeDSL objects carry sm_120 cubins with the NVFP4 block-scaled MMA in SASS.

The object written by ``export_to_c`` is a host ELF that embeds the device cubin as data (it is
loaded with ``cudaLibraryLoadData``), so ``cuobjdump`` does not see it in the ``.o`` directly. This
script finds every embedded CUDA ELF (ELF64, e_machine 190 = EM_CUDA), checks its target arch from
``cuobjdump -lelf``/``-sass`` and counts SASS instructions. A kernel passes when every cubin it
holds is for the expected arch and contains ``OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X``.

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
    return {"arch": arch, "kernels": kernels, "instructions": sum(opcodes.values()), "omma": omma,
            "ldg": sum(v for k, v in opcodes.items() if k.startswith("LDG")),
            "stg": sum(v for k, v in opcodes.items() if k.startswith("STG")),
            "bytes": len(cubin)}


def check_object(obj: Path, arch: str, cuobjdump: str) -> dict:
    cubins = embedded_cubins(obj.read_bytes())
    reports = [sass_report(c, cuobjdump) for c in cubins]
    ok = bool(reports) and all(r["arch"] == [arch] and r["omma"].get(REQUIRED, 0) > 0 for r in reports)
    return {"object": obj.name, "object_bytes": obj.stat().st_size, "cubins": reports, "ok": ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--arch", default="sm_120a")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    index = args.out_dir / "index.json"
    if index.exists():
        objs = [args.out_dir / k["object"] for k in json.loads(index.read_text())["kernels"]]
    else:
        objs = sorted(args.out_dir.glob("*.o"))
    if not objs:
        print(f"no objects in {args.out_dir}", file=sys.stderr)
        return 1
    cuobjdump = find_cuobjdump()
    results = [check_object(o, args.arch, cuobjdump) for o in objs]
    for r in results:
        for c in r["cubins"] or [{}]:
            print(f"{'PASS' if r['ok'] else 'FAIL'} {r['object']}: arch={c.get('arch')} kernels={c.get('kernels')} "
                  f"instructions={c.get('instructions')} {REQUIRED}={c.get('omma', {}).get(REQUIRED, 0)} "
                  f"other OMMA={ {k: v for k, v in c.get('omma', {}).items() if k != REQUIRED} } "
                  f"LDG={c.get('ldg')} STG={c.get('stg')} cubin_bytes={c.get('bytes')}")
    if args.json:
        args.json.write_text(json.dumps({"required": REQUIRED, "arch": args.arch, "objects": results}, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
