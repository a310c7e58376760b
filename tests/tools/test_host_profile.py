"""tools/host_profile.py runs the eager pass's host code against an installed wheel's sm_90a cubin index on the CPU:
every launch resolves to a shipped cubin, the low-bit forward takes the sm_90a CUDA rows (native calls), and the
table it prints counts torch ops, launches and host time per pass."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsct
from tsct.kernels import aot

ROOT = Path(__file__).resolve().parents[2]
NO_CUBINS = aot.index("sm_90a") is None


def _tool_env() -> dict:
    """The environment for the tool: the tsct this test imported first on the path (a relative PYTHONPATH entry
    would not resolve from the tool's working directory)."""
    path = [str(Path(tsct.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))


def _tool():
    spec = importlib.util.spec_from_file_location("tsct_host_profile_tool", ROOT / "tools" / "host_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(NO_CUBINS, reason="no AOT cubins for sm_90a in this install")
def test_host_profile_counts_the_pass(tmp_path):
    env = _tool_env()
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "host_profile.py"), "--aot-dir", str(aot.aot_dir()),
                          "--passes", "3", "--fmt", "bf16", "nvfp4", "--layers"], capture_output=True, text=True,
                         env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.rsplit(maxsplit=5)
        if len(parts) == 6 and parts[0] in ("bf16 forward", "bf16 forward+backward", "nvfp4 forward",
                                            "nvfp4 forward+backward"):
            rows[parts[0]] = [float(v) for v in parts[1:]]
    assert len(rows) == 4, out.stdout
    for name, (us, floor, ops, launches, native_calls) in rows.items():
        assert us > 0 and ops > 0 and launches >= 3, (name, rows[name])
        # the replay of the same launches and torch ops alone is cheaper than the pass (its Python is left out)
        assert 0 < floor < us, (name, rows[name])
    # the backward adds launches and torch ops to its forward
    for fmt in ("bf16", "nvfp4"):
        assert rows[f"{fmt} forward+backward"][2] > rows[f"{fmt} forward"][2]
        assert rows[f"{fmt} forward+backward"][3] > rows[f"{fmt} forward"][3]
    # sm_90a's CUDA rows: the low-bit down and up projections (native), none in the bf16 forward
    assert rows["nvfp4 forward"][4] == 2 and rows["bf16 forward"][4] == 0
    # --layers: per layer, the four passes' inclusive host us in the table's column order
    hp = _tool()
    layers = {}
    for line in out.stdout.splitlines():
        for label, _, _ in hp.LAYERS:
            if line.startswith(label + " "):
                layers[label] = [float(v) for v in line[len(label):].split()]
    assert set(layers) == {label for label, _, _ in hp.LAYERS}, out.stdout
    for col, bwd in enumerate((False, True, False, True)):
        t = {label: v[col] for label, v in layers.items()}
        assert t["sort_by_expert (public)"] > 0 and t["grouped_glu (public)"] > t["  argument checks"] > 0
        assert t["replay run (every replayed call)"] > 0  # the third pass on is a replay
        if bwd:
            assert t["torch.autograd.grad"] > t["  backward (records to gradients)"] > 0
        else:
            assert t["torch.autograd.grad"] == 0 and t["  backward (records to gradients)"] == 0


@pytest.mark.skipif(NO_CUBINS, reason="no AOT cubins for sm_90a in this install")
def test_host_profile_restores_the_process(monkeypatch):
    """After the dressed block the process is as before: patched attributes (an inherited one is not left copied onto
    the class), the environment, and the native library's cached shared-memory answers (the stand-in's 0 bytes)."""
    import torch
    from tsct.native import _ops

    hp = _tool()
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    env_before = os.environ.get("TSCT_AOT_DIR")
    own_before = set(vars(torch.Tensor))
    with hp.as_h200(str(aot.aot_dir())) as lib:
        assert torch.zeros(1).is_cuda and os.environ["TSCT_TRITON_BACKEND"] == "aot"
        step = hp._pass("nvfp4", False)
        step()
        assert lib.calls["tsct_kernel_smem_bytes"] > 0  # the native rows asked the stand-in
        launch = aot.AotKernel.launch
        assert hp._launch_floor(step, lib, 3, 2) > 0
        assert aot.AotKernel.launch is launch and lib.log is None  # the recording is undone
    assert not torch.zeros(1).is_cuda and set(vars(torch.Tensor)) == own_before
    assert os.environ.get("TSCT_AOT_DIR") == env_before and "TSCT_TRITON_BACKEND" not in os.environ
    assert _ops.kernel_smem_bytes.cache_info().currsize == 0


@pytest.mark.parametrize("args, what", [(["--aot-dir", "/nonexistent"], "--aot-dir"),
                                        (["--fmt", "fp8"], "--fmt"), (["--passes", "0"], "--passes")])
def test_host_profile_refuses_bad_arguments_by_name(args, what, tmp_path, capsys):
    argv = ["--aot-dir", str(tmp_path)] + args if args[0] != "--aot-dir" else args
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "index.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        _tool().main(argv)
    assert e.value.code == 2 and what in capsys.readouterr().err
