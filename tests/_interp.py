"""Check scripts run under Triton's interpreter, each in a subprocess: TRITON_INTERPRET must be set before Triton is
imported, and the test process may already have imported it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, cfg: Optional[str] = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python <script> <args>`` (``script`` relative to the repository) with TRITON_INTERPRET=1, python/ and tests/
    on PYTHONPATH and, unless ``cfg`` is None, the Triton GLU config override TSCT_TRITON_GLU_CFG=cfg; output
    captured as text."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "python"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    if cfg is not None:
        env["TSCT_TRITON_GLU_CFG"] = cfg
    return subprocess.run([sys.executable, str(ROOT / script), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def run_json(script: str, out: Path, *args: str, cfg: Optional[str] = None, timeout: int = 900):
    """``run(script, "--json", out, *args)`` and the JSON the script wrote to ``out``; the test fails with the output
    tails when it wrote none (a crash)."""
    p = run(script, "--json", str(out), *args, cfg=cfg, timeout=timeout)
    if not out.exists():
        pytest.fail(f"{script} crashed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return json.loads(out.read_text())


def assert_ok(p: subprocess.CompletedProcess) -> None:
    """The script exited 0 (else the output tails)."""
    assert p.returncode == 0, f"rc {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
