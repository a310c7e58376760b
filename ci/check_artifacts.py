#!/usr/bin/env python3
"""Check that libtsct_kernels.so holds exactly the device code its manifest.json promises.

    python ci/check_artifacts.py                      # the installed tsct
    python ci/check_artifacts.py --lib path/to/libtsct_kernels.so [--manifest path/to/manifest.json]
    python ci/check_artifacts.py --sass               # also disassemble: kernels and instruction checks

A thin wrapper around tsct.native.artifacts.main (python/tsct/native/artifacts.py: the checks, the
SASS_RULES table, the flags, exit codes 0 match / 1 mismatch / 2 cannot run); the same as
``python -m tsct.native.artifacts``. It runs this checkout's copy of that module, loaded by path
(standard library only: no tsct or torch import, and edits to SASS_RULES count without reinstalling),
against the installed library; outside a checkout it uses the installed tsct.native.artifacts.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "python" / "tsct" / "native" / "artifacts.py"


def _artifacts():
    if _SRC.is_file():
        spec = importlib.util.spec_from_file_location("_tsct_native_artifacts", _SRC)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up in sys.modules
        spec.loader.exec_module(mod)
        return mod
    from tsct.native import artifacts
    return artifacts


def main(argv: list[str] | None = None) -> int:
    return _artifacts().main(argv)


if __name__ == "__main__":
    sys.exit(main())
