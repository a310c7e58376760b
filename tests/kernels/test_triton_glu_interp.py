"""The Triton grouped GLU (path "triton-bf16") under Triton's interpreter on the CPU, in fp32.

Runs ``tools/triton_glu_interp_check.py`` in a subprocess (TRITON_INTERPRET must be set before
Triton is imported): every case's forward and seven gradients against ``tsct.reference`` (rel. err
< 1e-5), including a K-major w_down (WD_T kernels, decision 0012) whose dW_down must keep w_down's
strides. Three times: with the shipped tile config, with d blocks of 16 in groups of 3 so that the
backward's pipelined single-tile d loop (NDB) runs several and partial groups on these small shapes,
and with one d block per program (NDB 1: what glu.py launches for few large experts).

Also ``tests/_saved_tails_check.py`` (one more subprocess, ~10 s): the saving forwards of the two Triton
paths (triton-bf16, triton-lowbit) leave no row of their saved tensors undefined (padding rows of hg, hu, z*rw
zero under a poisoned ``torch.empty``, the same bits in two runs), and ``torch.library.opcheck`` of the custom
op passes for each path with padding rows (its dynamic-shape AOT-dispatch check compares two runs).
"""

from __future__ import annotations

import pytest

import _interp

pytest.importorskip("triton")


@pytest.mark.parametrize("cfg", ["", "bd_bwd=16,ndb_bwd=3", "ndb_bwd=1"], ids=["shipped", "bd16_ndb3", "ndb1"])
def test_interpreter_check_passes(cfg):
    p = _interp.run("tools/triton_glu_interp_check.py", cfg=cfg)
    _interp.assert_ok(p)
    for case in ("basic", "multi_tile", "empty_and_one", "r300_d100_f5", "top4", "untouched_targets", "kmajor_wd",
                 "kmajor_wd_multi", "kmajor_wd_r160", "kmajor_wd_nogs_multi", "no_gather_scatter", "saved_csr"):
        assert f"\n{case} " in "\n" + p.stdout, f"case {case} did not run:\n{p.stdout}"
    assert "worst " in p.stdout


SAVED_CASES = ["bf16_saved_gather_scatter", "bf16_saved_no_gather", "bf16_opcheck", "lowbit_saved_gather_scatter",
               "lowbit_saved_no_gather", "lowbit_opcheck", "tile_cum_zero_kernel"]


@pytest.fixture(scope="module")
def saved_tails(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved_tails") / "res.json"
    return {r["name"]: r for r in _interp.run_json("tests/_saved_tails_check.py", out)}


@pytest.mark.parametrize("case", SAVED_CASES)
def test_saved_tensors_defined_on_padding_rows(saved_tails, case):
    assert case in saved_tails, f"case {case} did not run: {sorted(saved_tails)}"
    assert saved_tails[case]["ok"], saved_tails[case]["why"]
