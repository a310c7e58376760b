"""Replayed eager calls (``tsct.config.eager_replay``, ``tsct.kernels.replay``) on a CUDA GPU: the same bits as the
path run itself.

For each Triton arm (bf16 with a K-major w_down, NVFP4, sign; STE masters for NVFP4) and a few routings (softmax
top-k through ``sort_by_expert``, skewed with empty experts, padding rows through explicit indices), a layer's
forward and backward run with replay off, then with it on for four calls of the same signature on fresh values
(the first runs the path, the second records, the rest replay): output and every gradient must equal the plain
run's bit for bit, the replay must have been used, and nothing may be unreplayable (but the side-stream forward).

    python3 -m pytest -q tests/kernels/test_replay_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import config, quant  # noqa: E402
from tsct.kernels import replay  # noqa: E402
from tsct.ops import grouped_glu, quantize_master, sort_by_expert  # noqa: E402

DEV = torch.device("cuda")
ARMS = {"bf16-kmajor": "triton-bf16", "nvfp4": "triton-lowbit", "sign": "triton-lowbit", "nvfp4-ste": "triton-lowbit"}


def _weights(arm, e, d, r, f, g):
    wg = (torch.randn(e, d, r, generator=g) / d ** .5).to(DEV, torch.bfloat16)
    wu = (torch.randn(e, d, r, generator=g) / d ** .5).to(DEV, torch.bfloat16)
    wd = (torch.randn(e, f, r, generator=g) / r ** .5).to(DEV, torch.bfloat16).transpose(1, 2)  # K-major
    if arm == "bf16-kmajor":
        return [w.requires_grad_() for w in (wg, wu, wd)], None
    fmt = "sign" if arm == "sign" else "nvfp4"
    if arm == "nvfp4-ste":
        masters = [w.float().contiguous().requires_grad_() for w in (wg, wu, wd)]
        return [quantize_master(m, fmt) for m in masters], masters
    return [quant.quantize(w, fmt) for w in (wg, wu, wd)], None


def _pass(arm, routing, seed, shape):
    """One forward + backward on fresh values (seeded): output and gradients, as tensors."""
    t, k, e, d, r, f = shape
    g = torch.Generator().manual_seed(seed)
    facs, masters = _weights(arm, e, d, r, f, g)
    x = torch.randn(t, d, generator=g).to(DEV, torch.bfloat16).requires_grad_()
    sg = (torch.rand(e, r, generator=g) + 0.5).to(DEV, torch.bfloat16).requires_grad_()
    su = (torch.rand(e, r, generator=g) + 0.5).to(DEV, torch.bfloat16).requires_grad_()
    logits = torch.randn(t, e, generator=g)
    if routing == "skewed":  # a hot expert and empty ones
        logits[:, 0] += 4.0
        logits[:, e // 2:] -= 40.0
    probs, ids = torch.softmax(logits, -1).topk(k)
    probs, ids = probs.to(DEV).requires_grad_(), ids.to(DEV)
    leaves = [x, probs, sg, su] + (facs if masters is None and arm == "bf16-kmajor" else []) + (masters or [])
    if routing == "padded":  # explicit indices with padding rows past offs[-1]
        s = sort_by_expert(ids, e, probs)
        pad = 5
        tok = torch.cat([s.token, torch.zeros(pad, dtype=s.token.dtype, device=DEV)])
        rw = torch.cat([s.row_weight, torch.ones(pad, device=DEV)])
        y = grouped_glu(x, s.offs, *facs, sg, su, row_weight=rw, gather_idx=tok, scatter_idx=tok, num_out_rows=t,
                        impl=ARMS[arm], masters=masters)
    else:
        s = sort_by_expert(ids, e, probs)
        y = grouped_glu(x, s.offs, *facs, sg, su, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                        num_out_rows=t, impl=ARMS[arm], masters=masters)
    dy = torch.randn(y.shape, generator=g).to(DEV, y.dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    return [y.detach(), *grads]


@pytest.mark.parametrize("routing", ["softmax", "skewed", "padded", "padded-one-stream"])
@pytest.mark.parametrize("arm", list(ARMS))
def test_replay_gives_the_paths_bits(arm, routing, monkeypatch):
    shape = (512, 2, 16, 256, 64, 203)  # f not a multiple of 8 (padded y rows); r = 64 takes the CUDA rows on sm_90
    monkeypatch.setattr(config, "check_values", False)
    # indices that are not sort_by_expert's own: the forward builds the combine's CSR (a sort), on a side stream
    # (not replayed: the replay issues on the caller's stream only) or, without it, on the caller's stream (replayed)
    side = routing == "padded"
    monkeypatch.setattr(config, "side_stream", routing != "padded-one-stream")
    routing = routing.split("-")[0]
    monkeypatch.setattr(config, "eager_replay", False)
    want = [_pass(arm, routing, seed, shape) for seed in range(4)]
    replay.clear()
    monkeypatch.setattr(config, "eager_replay", True)
    got = [_pass(arm, routing, seed, shape) for seed in range(4)]  # run, recorded, replayed twice
    torch.cuda.synchronize()
    st = replay.stats()
    # sort_by_expert, the forward and the backward: each run once, recorded once, replayed twice
    if side:  # but the forward runs the path each time
        assert st["reasons"] == {"a fork on the high-priority side stream": 1}, st
        assert st["recorded"] == 3 and st["replayed"] == 4 and st["unreplayable"] == 2, st
    else:
        assert st["reasons"] == {}, st
        assert st["first"] == 3 and st["recorded"] == 3 and st["replayed"] == 6, st
    for seed, (w, o) in enumerate(zip(want, got)):
        assert len(w) == len(o)
        for i, (a, b) in enumerate(zip(w, o)):
            assert a.shape == b.shape and a.dtype == b.dtype, (seed, i)
            assert torch.equal(a, b), (arm, routing, seed, i, (a.float() - b.float()).abs().max().item())


def test_replay_joins_its_side_work(monkeypatch):
    """A replayed backward's forks (the chunked dW kernels on the side stream) start ~50 ms late (a sleep queued on
    the side stream each time a call takes it): its gradients, compared at once on the caller's stream, are still the
    path's."""
    from tsct.kernels.triton_common import runtime as C

    shape = (512, 2, 16, 256, 64, 203)
    monkeypatch.setattr(config, "check_values", False)
    monkeypatch.setattr(config, "eager_replay", False)
    want = [_pass("bf16-kmajor", "skewed", seed, shape) for seed in range(4)]
    side_stream = C.side_stream

    def late(device, high=True):
        s = side_stream(device, high)
        with torch.cuda.stream(s):
            torch.cuda._sleep(100_000_000)
        return s

    monkeypatch.setattr(C, "side_stream", late)
    replay.clear()
    monkeypatch.setattr(config, "eager_replay", True)
    for seed in range(4):  # run, recorded, replayed twice
        got = _pass("bf16-kmajor", "skewed", seed, shape)
        for i, (a, b) in enumerate(zip(want[seed], got)):
            assert torch.equal(a, b), (seed, i)
    st = replay.stats()
    assert st["reasons"] == {} and st["replayed"] == 6, st
