"""What the CuTeDSL build tests share: the interpreter that has the pinned DSL, or a skip with the reason.

The DSL is not a tsct dependency (docs/decisions/0006): it is found here, or through
``TSCT_CUTEDSL_PYTHON=/path/to/venv/bin/python``; the SASS check also needs cuobjdump.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cutedsl"))
import check_sass  # noqa: E402


def dsl_python_or_skip() -> str:
    """The Python to run cutedsl/build.py with; skips the test when there is none or no cuobjdump."""
    exe = os.environ.get("TSCT_CUTEDSL_PYTHON")
    if not exe and importlib.util.find_spec("nvidia_cutlass_dsl") is not None:
        exe = sys.executable
    if not exe:
        pytest.skip("CuTeDSL not installed (set TSCT_CUTEDSL_PYTHON to a python with nvidia-cutlass-dsl==4.8.1)")
    try:
        check_sass.find_cuobjdump()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return exe
