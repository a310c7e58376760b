"""examples/train_moe_lm.py on the CPU: a tiny configuration trains every arm for a few steps and writes its JSON;
two runs with the same seed give the same losses; the gate pairs tsct-bf16 with the exact layer on its own
trajectory and fails a layer whose gradient is wrong; the replicate arm starts one part in a million away."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import pytest
import torch

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
    assert "intermediates='fp32'" in res["arms"]["exact"]["layer"]
    gate, paired = res["gate"], res["arms"]["tsct-bf16"]["paired"]
    assert gate["arm"] == "tsct-bf16" and gate["reference"] == "exact" and gate["threshold"] == 0.01
    assert len(paired["val_loss_exact_layer"]) == len(paired["grad_rel_error"]) == 2
    # fp32 on the CPU: the two layers compute the same numbers up to the order of fp32 sums
    assert gate["pass"] is True
    assert gate["paired_val_max_abs_rel_gap"] < 1e-5 and gate["paired_grad_max_rel_error"] < 1e-4
    assert gate["noise_band"] == res["gaps"]["exact-replicate"]["max_abs_rel_gap"]
    assert gate["trajectory_max_abs_rel_gap"] == res["gaps"]["tsct-bf16"]["max_abs_rel_gap"]
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


def test_gate_fails_a_layer_with_a_wrong_gradient(lm, tmp_path, monkeypatch):
    """s_up detached: the forward is right (the validation loss through the exact layer agrees), the gradient is not."""
    from tsct.nn import GroupedGLUExperts

    class NoScaleGradient(GroupedGLUExperts):
        def scales(self, dtype):
            s_gate, s_up = super().scales(dtype)
            return s_gate, s_up.detach()

    real = lm.make_experts

    def make(cfg, arm):
        if arm == "tsct-bf16":
            return lambda: NoScaleGradient(cfg.experts, cfg.d, cfg.r, cfg.f)
        return real(cfg, arm)

    monkeypatch.setattr(lm, "make_experts", make)
    out = tmp_path / "o"
    argv = ["--preset", "cpu", "--steps", "2", "--eval-every", "2", "--arms", "tsct-bf16", "--out", str(out)]
    assert lm.main(argv + ["--require-gate"]) == 1
    (path,) = out.glob("*.json")
    gate = json.loads(path.read_text())["gate"]
    assert gate["pass"] is False and gate["paired_val_max_abs_rel_gap"] < 1e-5
    assert gate["paired_grad_max_rel_error"] == pytest.approx(1.0)  # no gradient at all for s_up
    assert gate["trajectory_max_abs_rel_gap"] is None and gate["noise_band"] is None  # no exact arm run


def test_replicate_arm_starts_one_part_in_a_million_away(lm):
    cfg = lm.Config(**lm.PRESETS["cpu"])
    exact, tsct, rep = (lm.Arm(cfg, arm, 4).model for arm in ("exact", "tsct-bf16", "exact-replicate"))
    for (name, p), q, r in zip(exact.named_parameters(), tsct.parameters(), rep.parameters()):
        assert torch.equal(p, q), name  # the arms share their initial weights
        if p.abs().max() > 0:
            d = ((r - p).norm() / p.norm()).item()
            assert 1e-7 < d < 1e-5, (name, d)


def test_bad_arguments_are_one_line_errors_before_any_training(lm, tmp_path, capsys):
    """Each bad argument is argparse's usage error (exit status 2) naming the flag, not a traceback from inside the
    training; an unwritable --out is refused before the first step."""
    not_json = tmp_path / "notes.txt"
    not_json.write_text("no JSON here")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cpu = ["--preset", "cpu", "--out", str(tmp_path / "out")]
    cases = [(cpu + ["--topk", "9"], "--topk (9) must not exceed --experts (8)"),
             (cpu + ["--experts", "0"], "--experts must be >= 1, got 0"),
             (cpu + ["--steps", "0"], "--steps must be >= 1, got 0"),
             (cpu + ["--heads", "3"], "--d (64) must be a multiple of --heads (3)"),
             (cpu + ["--impl", "bogus"], "--impl must be 'auto' or one of"),
             (["--preset", "cpu", "--out", str(a_file / "sub")], f"--out {a_file / 'sub'}:"),
             (["--plot", str(tmp_path / "missing.json")], "not a readable result JSON"),
             (["--plot", str(not_json)], "not a readable result JSON")]
    if not torch.cuda.is_available():
        cases.append((["--preset", "gpu", "--out", str(tmp_path / "out")], "needs a CUDA GPU; --preset cpu runs"))
    for argv, want in cases:
        with pytest.raises(SystemExit) as e:
            lm.main(argv)
        assert e.value.code == 2, argv
        assert want in capsys.readouterr().err, argv
