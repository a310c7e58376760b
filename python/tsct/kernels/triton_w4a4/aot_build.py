#!/usr/bin/env python3
"""Compile only the W4A4 kernels ahead of time (development): a thin entry into the one AOT builder.

    python aot_build.py --out DIR [--archs sm_90a,sm_120] [--jobs N] [--check-sass]

Same as ``python ../triton_glu/aot_build.py --families w4a4 --archs sm_90a,sm_120 ...`` (every option
of that builder is accepted). The wheel build (CMake, TSCT_TRITON_AOT) already compiles the W4A4
cubins together with the bf16 ones into ``tsct/_aot/<arch>/index.json``; this entry is for
experiments (e.g. ``--check-sass``: SASS_RULES on the fresh cubins, ``sass_summary.json`` per arch).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_BUILDER = Path(__file__).resolve().parent.parent / "triton_glu" / "aot_build.py"


def main(argv: list[str] | None = None) -> int:
    spec = importlib.util.spec_from_file_location("_tsct_aot_build", _BUILDER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_tsct_aot_build"] = mod
    spec.loader.exec_module(mod)
    args = list(sys.argv[1:] if argv is None else argv)
    return mod.main(["--families", "w4a4", "--archs", ",".join(mod.family_archs("w4a4")), *args])


if __name__ == "__main__":
    sys.exit(main())
