"""The backward of both Triton families under skewed routing (Triton's interpreter, fp32, one subprocess).

``tests/_bwd_skew_check.py`` runs: the backward maps (tile map, chunk map, workspace slots) against torch; every
gradient against the float64 oracle with one expert holding almost all rows and many empty experts, at chunk sizes
that give several workspace slots, a few or none, with the experts found by a binary search; bitwise repeatability;
two chunk sizes (dW within the documented fp32 tolerance, the other gradients the same bits). About 3 minutes.
"""

from __future__ import annotations

import pytest

import _interp

pytest.importorskip("triton")

CASES = ["oracle_hot_ch64", "oracle_hot_ch128_bsearch", "oracle_hot_ch512", "oracle_hot_ch64_regcap",
         "oracle_hot_ch64_regcap_rowmajor",
         "oracle_many_empty_nogather", "oracle_hot_r80", "oracle_lowbit_nvfp4_ch64", "oracle_lowbit_mixed_bsearch",
         "oracle_one_tile", "oracle_one_tile_r80_nogather", "oracle_lowbit_one_tile", "maps_e9500", "repeat_bf16",
         "repeat_lowbit", "chunks_bf16", "chunks_lowbit", "selftest_bf16", "selftest_lowbit_mixed"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd_skew") / "res.json"
    return {r["name"]: r for r in _interp.run_json("tests/_bwd_skew_check.py", out, cfg="", timeout=1200)}


@pytest.mark.parametrize("case", CASES)
def test_backward_under_skew(results, case):
    assert case in results, f"case {case} did not run: {sorted(results)}"
    assert results[case]["ok"], results[case]["why"]
