"""Programmatic dependent launch (``tsct.config.pdl``, docs/decisions/0016-pdl.md) on a GPU of compute capability
9.0 or later: the forward's Triton chain (sort_by_expert's route_rank / route_place, tile_cum, the down and up
projections, the combine or the padding rows' zeroing) launched with PDL gives the same bits as ordinary launches,
forward and every gradient, eager and replayed from a CUDA graph; also when the kernel before the chain (the one
writing its inputs) starts late. The allocator is poisoned with NaN / -1 bytes before each pass, so a kernel that
read its predecessor's output before that predecessor finished would read poison, not the same bits.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("programmatic dependent launch needs compute capability 9.0 or later", allow_module_level=True)

import tsct  # noqa: E402
from _cuda_graph import captured  # noqa: E402
from tsct import config  # noqa: E402
from tsct.kernels.layout import to_kmajor  # noqa: E402
from tsct.ops.routing import _kernels_serve  # noqa: E402

DEV = torch.device("cuda")
if not _kernels_serve(DEV):
    pytest.skip("the Triton kernels do not serve this GPU (no cubins, no Triton)", allow_module_level=True)


def poison() -> None:
    blobs = [torch.empty(1 << 30, dtype=torch.uint8, device=DEV)] + [
        torch.empty(1 << 20, dtype=torch.uint8, device=DEV) for _ in range(64)]
    for b in blobs:
        b.fill_(0xFF)
    del blobs, b


def problem(t, k, e, d, r, f, fmt, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(t, d, generator=g, device=DEV).bfloat16().requires_grad_()
    wg = (torch.randn(e, d, r, generator=g, device=DEV) / d ** 0.5).bfloat16()
    wu = (torch.randn(e, d, r, generator=g, device=DEV) / d ** 0.5).bfloat16()
    wd = (torch.randn(e, r, f, generator=g, device=DEV) / r ** 0.5).bfloat16()
    if fmt == "bf16-kmajor":
        wd = to_kmajor(wd)
    if fmt == "nvfp4":
        facs = [tsct.quant.quantize_nvfp4(w, backend="torch") for w in (wg, wu, wd)]
    else:
        facs = [w.requires_grad_() for w in (wg, wu, wd)]
    sg = (torch.rand(e, r, generator=g, device=DEV) + 0.5).requires_grad_()
    su = (torch.rand(e, r, generator=g, device=DEV) + 0.5).requires_grad_()
    logits = torch.randn(t, e, generator=g, device=DEV)
    logits[: t // 8, 3] += 20.0  # one crowded expert: many row tiles
    w, ids = torch.softmax(logits, -1).topk(k)
    w = w.bfloat16().requires_grad_()
    go = torch.randn(t, f, generator=g, device=DEV, dtype=torch.bfloat16)
    return x, facs, sg, su, ids, w, go


def run(pdl: bool, x, facs, sg, su, ids, w, go, e):
    config.pdl = pdl
    try:
        s = tsct.ops.sort_by_expert(ids, e, w)
        out = tsct.ops.grouped_glu(x, s.offs, *facs, sg, su, row_weight=s.row_weight, gather_idx=s.token,
                                   scatter_idx=s.token, num_out_rows=x.shape[0])
        leaves = [x, w, sg, su] + [p for p in facs if isinstance(p, torch.Tensor) and p.requires_grad]
        return [out, *torch.autograd.grad(out, leaves, go)]
    finally:
        config.pdl = True


@pytest.mark.parametrize("fmt", ["bf16", "bf16-kmajor", "nvfp4"])
def test_pdl_gives_the_same_bits(fmt):
    torch.manual_seed(0)
    e, f = 128, 1365
    args = problem(6144, 2, e, 512, 64, f, fmt, seed=11)
    poison()
    on = run(True, *args, e)
    poison()
    off = run(False, *args, e)
    assert len(on) == len(off) >= 5
    for i, (a, b) in enumerate(zip(on, off)):
        assert torch.equal(a, b), i
    assert torch.isfinite(on[0]).all()
    # and the forward is the op's math, not merely the same wrong bits twice: against the fp32 reference
    x, facs, sg, su, ids, w, _ = args
    s = tsct.ops.sort_by_expert(ids, e, w)
    ref = tsct.ops.grouped_glu(x.float(), s.offs, *[p.float() if isinstance(p, torch.Tensor) else p for p in facs],
                               sg, su, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                               num_out_rows=x.shape[0], impl="reference")
    err = (on[0].float() - ref).abs().max() / ref.abs().max()
    assert err < 2e-2, float(err)


def test_pdl_graph_replay_behind_a_late_producer():
    """Captured: a ~20 ms sleep, then the kernels that write the chain's inputs (ids, x), then the forward with
    PDL. Each replay must see the new inputs: the chain's first kernel waits for the copy before it."""
    e, t = 256, 8192
    x, facs, sg, su, ids, w, _ = problem(t, 2, e, 256, 64, 700, "bf16", seed=3)
    x, w = x.detach(), w.detach()
    facs = [p.detach() for p in facs]
    ids_in, x_in = ids.clone(), x.clone()

    def fwd():
        torch.cuda._sleep(40_000_000)
        ids.copy_(ids_in)
        x.copy_(x_in)
        s = tsct.ops.sort_by_expert(ids, e, w)
        return tsct.ops.grouped_glu(x, s.offs, *facs, sg, su, row_weight=s.row_weight, gather_idx=s.token,
                                    scatter_idx=s.token, num_out_rows=t)

    g, out = captured(fwd)
    for seed in (1, 2):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        ids_in.copy_(torch.randint(0, e, ids.shape, generator=gen, device=DEV))
        x_in.copy_(torch.randn(x.shape, generator=gen, device=DEV))
        poison()
        g.replay()
        torch.cuda.synchronize()
        config.pdl = False
        try:
            want = fwd()
        finally:
            config.pdl = True
        assert torch.equal(out, want), seed
