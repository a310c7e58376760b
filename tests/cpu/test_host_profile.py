"""tools/host_profile.py runs the eager pass's host code against an installed wheel's sm_90a cubin index on the CPU:
every launch resolves to a shipped cubin, the low-bit forward takes the sm_90a CUDA rows (native calls), and the
table it prints counts torch ops, launches and host time per pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsct.kernels import aot

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(aot.index("sm_90a") is None, reason="no AOT cubins for sm_90a in this install")
def test_host_profile_counts_the_pass(tmp_path):
    env = dict(os.environ, TSCT_TRITON_BACKEND="aot")  # a launch without a cubin raises instead of JIT
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "host_profile.py"), "--aot-dir", str(aot.aot_dir()),
                          "--passes", "3", "--fmt", "bf16", "nvfp4"], capture_output=True, text=True, env=env,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.rsplit(maxsplit=4)
        if len(parts) == 5 and parts[0] in ("bf16 forward", "bf16 forward+backward", "nvfp4 forward",
                                            "nvfp4 forward+backward"):
            rows[parts[0]] = [float(v) for v in parts[1:]]
    assert len(rows) == 4, out.stdout
    for name, (us, ops, launches, native_calls) in rows.items():
        assert us > 0 and ops > 0 and launches >= 3, (name, rows[name])
    # the backward adds launches and torch ops to its forward
    for fmt in ("bf16", "nvfp4"):
        assert rows[f"{fmt} forward+backward"][1] > rows[f"{fmt} forward"][1]
        assert rows[f"{fmt} forward+backward"][2] > rows[f"{fmt} forward"][2]
    # sm_90a's CUDA rows: the low-bit down and up projections (native), none in the bf16 forward
    assert rows["nvfp4 forward"][3] == 2 and rows["bf16 forward"][3] == 0
