"""scripts/ep_run.py end to end on the CPU: 2 gloo processes at the bench's small shape; the JSON it writes says the
run matched the single-process layer bit-stably, its exchanged bytes are those of the routing (recounted here from
the same seeds), and every timing field is there and positive."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def ep_run(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the spawned ranks import the script by name, with this sys.path
    import ep_run

    return ep_run


def test_two_gloo_ranks_match_the_single_process_layer_and_count_their_bytes(ep_run, tmp_path):
    argv = ["--device", "cpu", "--small", "--world", "2", "--warmup", "1", "--iters", "3"]
    path = tmp_path / "ep.json"
    assert ep_run.main(argv + ["--json", str(path)]) == 0
    res = json.loads(path.read_text())
    a = ep_run.parse(argv)
    w, t, k, e, d, f = 2, a.tokens, a.topk, a.experts, a.d, a.f
    n = e // w
    assert res["passed"] is True and res["world_size"] == w and res["backend"] == "gloo"
    assert res["env"]["NCCL_NVLS_ENABLE"] == "0" and res["commit"]["commit"] and res["date"]
    assert res["shape"]["experts_per_rank"] == n and res["shape"]["tokens_per_rank"] == t == 256
    assert res["tolerance"] == 1e-2 and res["timing"]["clock"] == "perf_counter"

    # rows from rank i to rank j, recounted from the seeds
    ids = [ep_run.rank_inputs(j, a, "cpu")[1] for j in range(w)]
    rows = torch.stack([torch.bincount(i.flatten() // n, minlength=w) for i in ids])
    assert int(rows.sum()) == w * t * k
    names = {"y", "x.grad", "topk_weights.grad"} | {f"experts.{p}.grad" for p in ("w_gate", "w_up", "w_down",
                                                                                   "s_gate", "s_up")}
    for me, r in enumerate(res["ranks"]):
        assert r["rank"] == me and r["correct"] is True and r["bits_equal"] is True
        assert set(r["rel_err"]) == names
        assert all(math.isfinite(v) and 0 <= v < 1e-2 for v in r["rel_err"].values()), r["rel_err"]

        out, into = rows[me], rows[:, me]
        assert r["rows_sent_to"] == out.tolist() and r["rows_received_from"] == into.tolist()
        off_out, off_in = int(out.sum() - out[me]), int(into.sum() - into[me])
        assert off_out > 0 and off_in > 0  # the routing really crosses ranks
        b = r["bytes"]
        assert b["forward"]["dispatch"] == {"sent": t * k * d * 2, "received": int(into.sum()) * d * 2}
        assert b["forward"]["combine"] == {"sent": int(into.sum()) * f * 2, "received": t * k * f * 2}
        assert b["forward"]["counts"] == {"sent": e * 8, "received": e * 8}
        assert b["forward"]["weights"] == {"sent": t * k * 4, "received": int(into.sum()) * 4}  # fp32, one per row
        for ph in ("dispatch", "weights", "combine"):  # each gradient goes back the way its value came
            assert b["backward"][ph] == {"sent": b["forward"][ph]["received"], "received": b["forward"][ph]["sent"]}
        both = (t * k + int(into.sum())) * ((d + f) * 2 + 4) + e * 8
        assert b["step"] == {"sent": both, "received": both}
        off = (off_out + off_in) * ((d + f) * 2 + 4) + (w - 1) * n * 8
        assert b["step_off_rank"] == {"sent": off, "received": off}
        assert all(v > 0 for v in r["forward_off_rank_GBps"].values())

        for part in (r["ep"], r["layer"]):
            for key in ("forward", "backward", "step"):
                assert part[key]["n"] == 3 and part[key]["median"] > 0, key
        assert r["ep_marked_step"]["median"] > 0
        for way in ("forward", "backward"):
            assert set(r["ep_phases"][way]) == set(ep_run.PHASES)
            for ph, st in r["ep_phases"][way].items():
                assert st["n"] == 3 and st["median"] > 0 and st["p10"] <= st["median"] <= st["p90"], (way, ph)


def test_arguments_are_checked(ep_run, capsys, tmp_path):
    for argv, msg in ((["--world", "3"], "--experts 1024 must split evenly over --world 3"),
                      (["--json", str(tmp_path / "no" / "ep.json")], "not a file in a writable directory"),
                      (["--json", str(tmp_path)], "not a file in a writable directory"),
                      (["--tokens", "0"], "--tokens must be >= 1"),
                      (["--topk", "9", "--small"], "--topk 9 must not exceed --experts 8")):
        with pytest.raises(SystemExit):
            ep_run.parse(["--device", "cpu"] + argv)
        assert msg in capsys.readouterr().err
