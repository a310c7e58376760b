"""The developer harnesses in tools/ (outside the installed package), for tests that use a piece of one."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load(name: str):
    """The module ``tools/<name>.py`` (imported once; tools/ is put on sys.path for its sibling imports)."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return importlib.import_module(name)
