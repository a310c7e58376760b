"""The backward of both Triton families under skewed routing (Triton's interpreter, fp32, one subprocess).

``tests/cpu/_bwd_skew_check.py`` runs: the backward maps (tile map, chunk map, workspace slots) against torch; every
gradient against the float64 oracle with one expert holding almost all rows and many empty experts, at chunk sizes
that give several workspace slots, a few or none, with the experts found by a binary search; bitwise repeatability;
two chunk sizes (dW within the documented fp32 tolerance, the other gradients the same bits). About 3 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
CASES = ["oracle_hot_ch64", "oracle_hot_ch128_bsearch", "oracle_hot_ch512", "oracle_many_empty_nogather",
         "oracle_hot_r80", "oracle_lowbit_nvfp4_ch64", "oracle_lowbit_mixed_bsearch", "oracle_one_tile",
         "oracle_one_tile_r80_nogather", "oracle_lowbit_one_tile", "maps_e2500", "repeat_bf16",
         "repeat_lowbit", "chunks_bf16", "chunks_lowbit"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd_skew") / "res.json"
    env = dict(os.environ, TRITON_INTERPRET="1", TSCT_TRITON_GLU_CFG="", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "python"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "cpu" / "_bwd_skew_check.py"), "--json", str(out)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if not out.exists():
        pytest.fail(f"skew check crashed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return {r["name"]: r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("case", CASES)
def test_backward_under_skew(results, case):
    assert case in results, f"case {case} did not run: {sorted(results)}"
    assert results[case]["ok"], results[case]["why"]
