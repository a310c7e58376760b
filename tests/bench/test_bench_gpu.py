"""tsct-bench on a CUDA GPU: the CUDA-graph replay timing (``measure.time_graph``) and what the run
records with it.

    python3 -m pytest -q tests/bench/test_bench_gpu.py          (from an installed wheel: scripts/gpu_suite.sh all)
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct.bench import cli, measure  # noqa: E402

DEV = torch.device("cuda")


def test_time_graph_replays_the_captured_work_per_input_set():
    """Each input set gets its own graph; a replay redoes that set's work (the output buffer is rewritten
    with that set's values), and the timings are positive."""
    xs = [torch.randn(1 << 20, device=DEV) for _ in range(2)]
    outs = [torch.empty_like(x) for x in xs]

    def fn(i):
        torch.mul(xs[i], 3.0, out=outs[i])

    st = measure.time_graph(fn, DEV, n_sets=2, warmup=1, replays=6)
    assert st["n"] == 6 and 0 < st["p10"] <= st["median"] <= st["p90"]
    for i in range(2):
        outs[i].fill_(float("nan"))
        xs[i].normal_()  # new values in the captured input: a replay must use them
    torch.cuda.synchronize()
    measure.time_graph(fn, DEV, n_sets=2, warmup=0, replays=2)
    for i in range(2):
        assert torch.equal(outs[i], xs[i] * 3.0)


def test_time_graph_reports_a_capture_failure():
    def sync_inside(i):
        torch.ones(4, device=DEV).sum().item()  # a host sync cannot be captured

    with pytest.raises(Exception):
        measure.time_graph(sync_inside, DEV, n_sets=1, warmup=1, replays=2)
    torch.ones(4, device=DEV).sum().item()  # the device is still usable afterwards


def test_small_run_records_graph_times_for_the_tsct_arms(tmp_path):
    out = tmp_path / "small.json"
    rc = cli.main(["--preset", "small", "--device", "cuda", "--warmup", "1", "--iters", "5", "--copy-mb", "16",
                   "--arms", "padded-bmm,tsct-triton-bf16-*", "--formats", "bf16", "--quiet", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    arms = {a["name"]: a for a in res["arms"]}
    for name in ("padded-bmm", "tsct-triton-bf16-bf16"):
        a = arms[name]
        assert a["status"] == "ran" and a["sync_free"] is True, (name, a.get("reason"))
        for key in ("fwd_graph_ms", "fwdbwd_graph_ms"):
            assert a[key] and a[key]["median"] > 0, (name, key, a[key])
        assert a["rates_from"] == "graph"
        assert not any("CUDA-graph timing failed" in w for w in a["warnings"]), a["warnings"]
