"""tsct.ops.sort_by_expert on the CPU: argument checks, the torch path against a plain stable argsort, the
custom op under torch.compile and opcheck, and the Triton kernels (route_rank, route_place) under Triton's
interpreter (``tests/_route_check.py`` in a subprocess, TRITON_INTERPRET=1).
GPU: tests/ops/test_sort_by_expert_gpu.py."""

from __future__ import annotations

import pytest
import torch

import _interp
import tsct
from tsct.ops import sort_by_expert


def _expected(ids: torch.Tensor, e: int):
    """Straight from the definition: padding key E for ids outside [0, E), stable argsort, counts by loop."""
    flat = ids.reshape(-1).tolist()
    keys = [v if 0 <= v < e else e for v in flat]
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i))
    counts = [keys.count(j) for j in range(e)]
    offs = [sum(counts[: j + 1]) for j in range(e)]
    return order, offs, [i // ids.shape[1] for i in order]


@pytest.mark.parametrize("t,k,e,lo,hi", [(37, 2, 5, 0, 5), (64, 4, 3, -2, 6), (1, 1, 1, 0, 1), (50, 2, 200, 0, 200),
                                         (0, 2, 4, 0, 4), (9, 3, 2, -1, 0)])
def test_matches_the_definition(t, k, e, lo, hi):
    g = torch.Generator().manual_seed(t * 31 + e)
    ids = torch.randint(lo, max(hi, lo + 1), (t, k), generator=g)
    s = sort_by_expert(ids, e)
    order, offs, token = _expected(ids, e)
    assert s.order.dtype == torch.int64 and s.token.dtype == torch.int64 and s.offs.dtype == torch.int32
    assert s.order.tolist() == order and s.offs.tolist() == offs and s.token.tolist() == token


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_row_weight_and_its_gradient(dtype):
    """row_weight is the weights in the sorted order, widened to fp32; d topk_weights = d row_weight scattered
    back (the same as indexing the weights with order), also through the custom op (opcheck)."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(-1, 9, (40, 3), generator=g)
    w = torch.rand(40, 3, generator=g).to(dtype).requires_grad_()
    s = sort_by_expert(ids, 8, w)
    assert s.row_weight.dtype == torch.float32 and torch.equal(s.row_weight, w.detach().reshape(-1)[s.order].float())
    go = torch.randn(120, generator=g)
    (gw,) = torch.autograd.grad(s.row_weight, w, go)
    w2 = w.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(w2.reshape(-1)[s.order].float(), w2, go)
    assert gw.dtype == dtype and torch.equal(gw, want)
    op = torch.ops.tsct.sort_by_expert.default
    torch.library.opcheck(op, (ids, 8, w.detach()))
    # opcheck's AOT-dispatch test sums every output into one scalar to differentiate it, which int64 outputs
    # beside a float one break (its own limit); the others run with the weights requiring grad
    torch.library.opcheck(op, (ids, 8, w), test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert sort_by_expert(ids, 8).row_weight is None


def test_feeds_grouped_glu_like_a_manual_sort():
    """The README's pattern with sort_by_expert gives the same output as argsort + bincount."""
    torch.manual_seed(0)
    t, k, e, d, r, f = 24, 2, 6, 16, 8, 13
    x = torch.randn(t, d)
    wg, wu, wd = torch.randn(e, d, r) / 4, torch.randn(e, d, r) / 4, torch.randn(e, r, f) / 3
    w, ids = torch.softmax(torch.randn(t, e), -1).topk(k)
    s = sort_by_expert(ids, e, w)
    out = tsct.ops.grouped_glu(x, s.offs, wg, wu, wd, row_weight=s.row_weight, gather_idx=s.token,
                               scatter_idx=s.token, num_out_rows=t)
    order = ids.reshape(-1).argsort(stable=True)
    offs = torch.bincount(ids.reshape(-1), minlength=e).cumsum(0).to(torch.int32)
    ref = tsct.ops.grouped_glu(x, offs, wg, wu, wd, row_weight=w.reshape(-1)[order], gather_idx=order // k,
                               scatter_idx=order // k, num_out_rows=t)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("ids,e,exc,words,w", [(*c, None) if len(c) == 4 else c for c in [
    (torch.zeros(4, 2), 3, TypeError, "topk_ids must be an integer tensor"),
    (torch.zeros(4, 2, dtype=torch.bool), 3, TypeError, "topk_ids must be an integer tensor"),
    (torch.zeros(8, dtype=torch.int64), 3, ValueError, "topk_ids must be 2-D"),
    (torch.zeros(4, 2, dtype=torch.int64), 0, ValueError, "num_experts"),
    (torch.zeros(4, 2, dtype=torch.int64), (1 << 20) + 1, ValueError, "num_experts"),
    (torch.zeros(4, 2, dtype=torch.int64), 3.0, TypeError, "num_experts"),
    (torch.zeros(4, 2, dtype=torch.int64), True, TypeError, "num_experts must be an int, got bool"),
    # tensors of one element have __index__: a bool one was taken as E = 1, a shaped one as its value
    (torch.zeros(4, 2, dtype=torch.int64), torch.tensor(True), TypeError, "num_experts must be an int, got Tensor"),
    (torch.zeros(4, 2, dtype=torch.int64), torch.tensor([[4]]), TypeError, "num_experts must be an int, got Tensor"),
    ([[0, 1]], 3, TypeError, "topk_ids"),
    (torch.zeros(4, 2, dtype=torch.int64), 3, TypeError, "topk_weights", torch.zeros(4, 2, dtype=torch.float64)),
    (torch.zeros(4, 2, dtype=torch.int64), 3, TypeError, "topk_weights", [[0.5, 0.5]]),
    (torch.zeros(4, 2, dtype=torch.int64), 3, ValueError, "topk_weights", torch.zeros(4, 3)),
]])
def test_bad_arguments_are_named(ids, e, exc, words, w):
    with pytest.raises(exc, match=f"^sort_by_expert: {words}"):
        sort_by_expert(ids, e, w)


def test_num_experts_accepts_integer_likes():
    np = pytest.importorskip("numpy")
    ids = torch.tensor([[2, 0], [1, 2]])
    want = sort_by_expert(ids, 3)
    for e in (np.int64(3), torch.tensor(3)):
        assert all(torch.equal(a, b) for a, b in zip(sort_by_expert(ids, e)[:3], want[:3]))


def test_large_expert_counts_take_the_torch_path(monkeypatch):
    """The kernels' scratch is (E + 1) counts per chunk of rows: for E large against M / ROUTE_B the op takes
    torch's sort (route.fits), which gives the same result."""
    from tsct.kernels.triton_common import route
    assert route.fits(32768, 1024) and route.fits(200, 50000)  # b1; E >> M but one chunk
    assert not route.fits(262144, 65536) and not route.fits(524288, 1 << 20)
    ids = torch.randint(0, 1 << 20, (3000, 2), generator=torch.Generator().manual_seed(2))
    order, offs, token = _expected_tensors(ids, 1 << 20)
    s = sort_by_expert(ids, 1 << 20)
    assert torch.equal(s.order, order) and torch.equal(s.offs, offs) and torch.equal(s.token, token)


def _expected_tensors(ids, e):
    key = torch.where((ids >= 0) & (ids < e), ids, e).reshape(-1)
    order = torch.argsort(key, stable=True)
    offs = torch.cumsum(torch.bincount(key, minlength=e + 1)[:e], 0).to(torch.int32)
    return order, offs, order // ids.shape[1]


def test_custom_op_compiles_and_passes_opcheck():
    ids = torch.randint(-1, 7, (33, 2), generator=torch.Generator().manual_seed(3))
    w = torch.rand(33, 2, requires_grad=True)
    torch.library.opcheck(torch.ops.tsct.sort_by_expert.default, (ids, 6, None))
    fn = torch.compile(lambda i, w: sort_by_expert(i, 6, w), fullgraph=True, backend="eager")
    got, want = fn(ids, w), sort_by_expert(ids, 6, w)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    (g1,) = torch.autograd.grad(got.row_weight.sum(), w)
    assert torch.equal(g1, torch.ones_like(w))


def test_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    p = _interp.run("tests/_route_check.py")
    _interp.assert_ok(p)
    # eight routing cases, the linked CSR ("links") and the empty input ("T0"): one line each
    assert p.stdout.count(" ok") == 10 and "differs" not in p.stdout, p.stdout
