"""examples/train_moe_lm.py on the CPU: a tiny configuration trains every arm for a few steps and writes its JSON;
two runs with the same seed give the same losses."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lm():
    spec = importlib.util.spec_from_file_location("train_moe_lm", ROOT / "examples" / "train_moe_lm.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def _run(lm, out, *extra):
    assert lm.main(["--preset", "cpu", "--steps", "4", "--eval-every", "2", "--out", str(out), *extra]) == 0
    (path,) = out.glob("*_cpu_moe-lm_*.json")
    return path, json.loads(path.read_text())


def test_tiny_run_writes_the_curves_of_every_arm_and_repeats_bit_for_bit(lm, tmp_path):
    path, res = _run(lm, tmp_path / "a")
    assert list(res["arms"]) == list(lm.ARMS)
    meta = res["meta"]
    assert meta["steps"] == 4 and meta["device"] and meta["commit"] and meta["date"].endswith("Z")
    assert path.name.startswith(meta["date"][:10]) and path.name.endswith(f"_{meta['commit']}.json")
    assert res["data"]["files_train"] > 10 * res["data"]["files_val"] > 0  # split by file
    params = {a["params"] for a in res["arms"].values()}
    assert len(params) == 1  # one parameter layout for every expert layer
    for name, a in res["arms"].items():
        assert len(a["train_loss"]) == 4 and a["val_step"] == [2, 4], name
        assert all(math.isfinite(v) and 2.0 < v < 6.5 for v in a["train_loss"] + a["val_loss"]), name
        assert a["train_loss"][-1] < a["train_loss"][0], name  # it learns
        assert a["tokens_per_s"] > 0 and a["peak_memory_bytes"] is None
    drop = res["arms"]["padded-bmm"]["dropped_fraction"]
    assert len(drop) == 4 and all(0 <= v < 1 for v in drop)
    assert set(res["gaps"]) == set(lm.ARMS) - {"exact"}
    assert res["gate"]["arm"] == "tsct-bf16" and res["gate"]["pass"] in (True, False)
    png = path.with_suffix(".png")
    assert png.exists() == (importlib.util.find_spec("matplotlib") is not None)

    _, again = _run(lm, tmp_path / "b", "--arms", "tsct-bf16,padded-bmm")
    for name in ("tsct-bf16", "padded-bmm"):  # same seed, same batches: the same losses
        assert again["arms"][name]["train_loss"] == res["arms"][name]["train_loss"], name
        assert again["arms"][name]["val_loss"] == res["arms"][name]["val_loss"], name


def test_arguments_are_checked(lm, tmp_path, capsys):
    with pytest.raises(SystemExit):
        lm.main(["--preset", "cpu", "--arms", "tsct-fp8", "--out", str(tmp_path)])
    assert "unknown ['tsct-fp8']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lm.main(["--preset", "cpu"])  # no --out
