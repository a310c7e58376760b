"""The sm120-fp4 first-use self-test machinery end to end on a real CUDA device that is NOT sm_120
(the H200 here): the parent initialises CUDA, the verdict runs the REAL child module
(``tsct.selftest_child``) in a subprocess pinned to the parent's device, and

* without ``--force`` the child answers the clean "not-runnable" verdict (no sm120-fp4 kernel for this
  compute capability), exit status 3, recorded in the on-disk cache; the child saw the same GPU;
* with ``--force`` the child runs the forward anyway: the library must refuse cleanly (no kernel image
  for this GPU, or not built with the CuTeDSL kernels), i.e. a "fail" verdict with exit status 1, not
  a crash;
* the parent's CUDA context still works after both.

    pytest -s -m gpu tests/package/test_sm120_firstuse_gpu.py     (TSCT_GPU_LOG=path appends the lines)
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from _gpu_log import log

from tsct import firstuse

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def parent_cuda(monkeypatch, tmp_path):
    """A parent with a live CUDA context, a private verdict cache and no TSCT_SM120_FP4."""
    monkeypatch.setenv("TSCT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TSCT_SM120_FP4", raising=False)
    firstuse.reset_for_tests()
    idx = torch.cuda.current_device()
    cap = torch.cuda.get_device_capability(idx)
    if cap[0] == 12:
        pytest.skip(f"compute capability {cap[0]}.{cap[1]}: this is an sm_120 card, where the child runs the real "
                    "self-test (tsct-probe shows its verdict)")
    a = torch.randn(256, 256, device="cuda")
    want = (a @ a).sum().item()
    yield idx, a, want
    firstuse.reset_for_tests()


def _parent_still_works(a, want):
    torch.cuda.synchronize()
    got = (a @ a).sum().item()
    b = torch.arange(1000, device="cuda", dtype=torch.float32)
    return abs(got - want) <= 1e-3 * max(1.0, abs(want)) and b.sum().item() == 499500.0


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_real_child_says_not_runnable_and_parent_survives(parent_cuda, fmt):
    idx, a, want = parent_cuda
    ident = firstuse.identity(idx)
    v = firstuse.verdict(idx, "sm120-fp4", fmt)  # the real runner, the real child command, this device pinned
    alive = _parent_still_works(a, want)
    log(f"[{'PASS' if v.outcome == 'not-runnable' and alive else 'FAIL'}] sm120-fp4 first-use child on "
        f"{ident['gpu']} (cc {ident['capability']}), {fmt}: {v.outcome} in {v.seconds:.1f} s ({v.detail}); "
        f"parent CUDA ok: {alive}")
    assert v.outcome == "not-runnable" and not v.ok, v
    assert f"compute capability {ident['capability']}" in v.detail and "did not pin" not in v.detail, v
    assert v.source.startswith(firstuse.RAN_NOW) and "saved to" in v.source, v
    assert alive
    entry = json.loads(firstuse.cache_file().read_text())["entries"][v.key]
    assert entry["outcome"] == "not-runnable" and entry["identity"] == ident
    firstuse.reset_for_tests()
    assert firstuse.verdict(idx, "sm120-fp4", fmt).source.startswith(firstuse.CACHED_DISK)


def test_forced_child_fails_cleanly_on_this_gpu(parent_cuda):
    idx, a, want = parent_cuda
    ident = firstuse.identity(idx)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=firstuse.child_visible_devices(idx))
    res = firstuse.run_subprocess(firstuse.child_command("sm120-fp4", "nvfp4", ident) + ["--force"], env, firstuse.timeout_s())
    ok, outcome, detail = firstuse.interpret(res, firstuse.timeout_s())
    alive = _parent_still_works(a, want)
    clean = outcome == "fail" and res.returncode == firstuse.EXIT_FAIL
    log(f"[{'PASS' if clean and alive else 'FAIL'}] forced sm120-fp4 child on {ident['gpu']}: exit {res.returncode}, "
        f"{outcome}: {detail}; parent CUDA ok: {alive}")
    assert clean, (res.returncode, outcome, detail, res.stderr[-2000:])
    assert not ok and "rel err" not in detail  # it must not have produced numbers on a GPU without a kernel
    assert alive
