#!/usr/bin/env python3
"""Fetch and verify the pinned CUTLASS C++ headers for csrc/cutlass (decision 0007), build time only.

    fetch_headers.py DEST [--python PY] [--no-fetch]      -> prints DEST; exit 0 when DEST is verified
    fetch_headers.py --tree-hash DIR                       -> prints DIR's tree hash

DEST ends up holding ``include/`` and ``tools/util/include/`` of CUTLASS commit b46b16d0 ("4.5.0"),
extracted from the hash-pinned flashinfer-python wheel that ``headers-requirements.txt`` names
(``pip download --no-deps --require-hashes``; the wheel is never installed). A DEST that already
exists (a previous build, or headers the caller points at with TSCT_CUTLASS_HEADERS) is accepted only
if its TREE HASH equals ``TREE_SHA256`` below: sha256 over the sorted lines
``<sha256 of the file>  <path relative to DEST>`` of every file under the two directories. So both
routes are pinned by content: the download by the wheel's sha256, the extracted tree by its own.

Used by cmake/tsct_cutlass.cmake (TSCT_CUTLASS=AUTO|ON) and csrc/cutlass/build_check.sh. Exit 1 with a
one-line reason on stderr when the headers cannot be had (no network, no pip, a different tree).
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
REQUIREMENTS = HERE / "headers-requirements.txt"
WHEEL_PREFIX = "flashinfer/data/cutlass/"
SUBDIRS = ("include", "tools/util/include")
VERSION = "4.5.0"
#: tree hash of include/ + tools/util/include/ extracted from flashinfer-python 0.7.2.post1 (2026-11-29)
TREE_SHA256 = "70e93af679fa67957bfae1db44c5ab1a2cf65bff935206123a7f7bb0ab9024ef"


def tree_hash(root: pathlib.Path) -> str:
    """sha256 over '<file sha256>  <relative path>' lines (sorted by path) of the files under SUBDIRS."""
    lines = []
    for sub in SUBDIRS:
        base = root / sub
        if not base.is_dir():
            continue
        for p in base.rglob("*"):
            if p.is_file():
                lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root).as_posix()}\n")
    return hashlib.sha256("".join(sorted(lines, key=lambda s: s.split("  ", 1)[1])).encode()).hexdigest()


def version_of(root: pathlib.Path) -> str | None:
    """'MAJOR.MINOR.PATCH' from include/cutlass/version.h, or None."""
    try:
        text = (root / "include/cutlass/version.h").read_text()
    except OSError:
        return None
    parts = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "#define" and f[1] in ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"):
            parts[f[1]] = f[2]
    if len(parts) != 3:
        return None
    return f"{parts['CUTLASS_MAJOR']}.{parts['CUTLASS_MINOR']}.{parts['CUTLASS_PATCH']}"


def verify(root: pathlib.Path) -> str | None:
    """None if `root` holds exactly the pinned tree, else why not."""
    ver = version_of(root)
    if ver is None:
        return f"{root} has no include/cutlass/version.h"
    if ver != VERSION:
        return f"{root} holds CUTLASS {ver}, the build is pinned to {VERSION}"
    got = tree_hash(root)
    if got != TREE_SHA256:
        return f"{root}: tree hash {got[:16]}... != pinned {TREE_SHA256[:16]}... (not the pinned header tree)"
    return None


def fetch(dest: pathlib.Path, python: str) -> None:
    """Download the pinned wheel and extract the two header directories into dest (replaced)."""
    with tempfile.TemporaryDirectory(prefix="tsct-cutlass-") as tmp:
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", str(REQUIREMENTS),
               "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = " ".join((proc.stderr or proc.stdout).split())[-300:]
            raise RuntimeError(f"pip download of the pinned header wheel failed ({python}): {err}")
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        stage = pathlib.Path(tmp) / "stage"
        keep = tuple(WHEEL_PREFIX + s + "/" for s in SUBDIRS)
        with zipfile.ZipFile(wheel) as z:
            for n in z.namelist():
                if n.startswith(keep) and not n.endswith("/"):
                    p = stage / n[len(WHEEL_PREFIX):]
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(z.read(n))
        why = verify(stage)
        if why:
            raise RuntimeError(f"the downloaded wheel's headers fail the check: {why}")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(stage), str(dest))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", nargs="?")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable,
                    help="interpreter whose pip downloads the wheel (default: $PYTHON, else this one)")
    ap.add_argument("--no-fetch", action="store_true", help="only verify DEST, never download")
    ap.add_argument("--tree-hash", metavar="DIR", help="print DIR's tree hash and exit")
    args = ap.parse_args(argv)
    if args.tree_hash:
        print(tree_hash(pathlib.Path(args.tree_hash)))
        return 0
    if not args.dest:
        ap.error("DEST is required")
    dest = pathlib.Path(args.dest).resolve()
    why = verify(dest) if dest.exists() else f"{dest} does not exist"
    if why and not args.no_fetch:
        try:
            fetch(dest, args.python)
            why = None
        except (RuntimeError, OSError, StopIteration) as e:
            why = f"{why}; fetching: {e}"
    if why:
        print(f"fetch_headers: {why}", file=sys.stderr)
        return 1
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
