"""The CUDA combine (csrc/glu/combine.cu, ``tsct.native.combine_rows``) on a GPU.

Each case: fresh random rows holding NaN / +-inf as well, a CSR built by the op's own ``_csr`` from random
targets (padding rows with garbage targets, empty targets, targets with 1, 2, 5 and 40 rows, so more than the
kernel's four hoisted rows), the caching allocator poisoned with NaN before the call. Checked:
- bit for bit against the Triton ``combine_rows`` (the same fp32 sum in the same order), NaNs included;
- against a float64 torch sum within the dtype's rounding (one rounding of an fp32 sum);
- a second run gives the same bits.
Widths cover every 16-byte phase of the out rows (odd ncols: 1, 3, 7, 9, 37, 5461) and aligned ones (8, 64,
2048), with src rows padded past ncols (the padded y of the forward) whose pad columns hold NaN and must
not leak. bf16, fp16 and fp32.
Also: the op's forward and backward on sm_90 take it (backend counts), with the same bits as the Triton
combine (``TSCT_TRITON_GLU_CFG`` cannot change a loaded config, so the test flips the Config field).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import native  # noqa: E402

if not native.available():
    pytest.skip(f"native library not available: {native.load_error()}", allow_module_level=True)

from tsct.kernels.triton_glu import glu as G  # noqa: E402

DEV = torch.device("cuda")
CAP = torch.cuda.get_device_capability()


def poison() -> None:
    blob = torch.empty(min(int(torch.cuda.mem_get_info()[0] * 0.5), 8 << 30), dtype=torch.uint8, device=DEV)
    blob.fill_(0xFF)  # NaN in fp32, bf16 and fp16
    del blob


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype])


def make(n_out, ncols, dtype, seed, counts_extra=True, pad=5):
    """src [m, ld] with ld padded to 16 bytes (pad columns NaN), targets per row, offs (one 'expert')."""
    g = torch.Generator().manual_seed(seed)
    per16 = 16 // torch.finfo(dtype).bits * 8
    ld = -(-ncols // per16) * per16 + (per16 if seed % 2 else 0)  # sometimes one extra pad chunk
    tgt = [int(v) for v in torch.randint(0, n_out, (2 * n_out,), generator=g)]
    if counts_extra and n_out > 3:
        tgt += [1] * 5 + [2] * 40  # target 1: 5+ rows, target 2: 40+ rows (past the 4 hoisted rows)
        tgt = [t for t in tgt if t != 3]  # target 3: no rows (zeros)
    mv = len(tgt)
    m = mv + pad
    idx = torch.tensor(tgt + [n_out + 7, -2, 0, 10**6, n_out][:pad], dtype=torch.int64)  # padding: garbage
    src = torch.randn(m, ld, generator=g).to(dtype)
    src[:, ncols:] = float("nan")
    flat = src.view(-1)
    special = torch.randint(0, flat.numel(), (6,), generator=g)
    for i, v in zip(special.tolist(), [float("nan"), float("inf"), -float("inf"), float("nan"), 1e30, -0.0]):
        if i % ld < ncols:
            flat[i] = v
    offs = torch.tensor([mv], dtype=torch.int32)
    return src.to(DEV), idx.to(DEV), offs.to(DEV)


def reference(src, idx, offs, n_out, ncols):
    mv = int(offs[-1])
    out = torch.zeros(n_out, ncols, dtype=torch.float64, device=src.device)
    out.index_add_(0, idx[:mv], src[:mv, :ncols].double())
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("ncols", [1, 3, 7, 8, 9, 37, 64, 2048, 5461])
def test_combine_rows_matches_triton_bits_and_fp64(dtype, ncols):
    n_out = 37 if ncols > 64 else 203  # not a multiple of the CTA's 8 rows; every phase of t * ncols
    src, idx, offs = make(n_out, ncols, dtype, seed=ncols * 7 + len(str(dtype)))
    cfg = G._config(CAP)
    order, ptr = G._csr(idx, offs, src.shape[0], n_out, CAP)
    poison()
    got = native.combine_rows(src, order, ptr, ncols)
    assert got.shape == (n_out, ncols) and got.dtype == dtype and got.is_contiguous()
    tri_cfg = G.dataclasses.replace(cfg, combine_native=0)
    tri = G._combine(src, idx, offs, n_out, tri_cfg, CAP, ncols=ncols, csr=(order, ptr))
    assert torch.equal(_bits(got), _bits(tri)), "bits differ from the Triton combine_rows"
    ref = reference(src, idx, offs, n_out, ncols)
    finite = torch.isfinite(ref)
    # NaN / inf positions agree with the fp64 sum (inf - inf = NaN; 1e30 overflows fp16 to inf: skip those)
    if dtype != torch.float16:
        assert torch.equal(torch.isnan(got.double()), torch.isnan(ref))
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    g, r = got.double()[finite], ref[finite]
    ok = torch.isfinite(g)
    assert torch.all((g[ok] - r[ok]).abs() <= tol * r[ok].abs() + 1e-30)
    assert torch.all(got[3] == 0) if n_out > 3 and ncols else True  # the target with no rows
    again = native.combine_rows(src, order, ptr, ncols)
    assert torch.equal(_bits(again), _bits(got))


def test_combine_rows_edge_sizes():
    """No targets, no columns, no source rows (every target empty: zeros)."""
    src = torch.randn(4, 8, device=DEV).bfloat16()
    order = torch.zeros(0, dtype=torch.int64, device=DEV)
    assert native.combine_rows(src, order, torch.zeros(1, dtype=torch.int64, device=DEV)).shape == (0, 8)
    assert native.combine_rows(src, order, torch.zeros(6, dtype=torch.int64, device=DEV), 0).shape == (5, 0)
    empty = torch.empty(0, 8, device=DEV, dtype=torch.bfloat16)
    poison()
    out = native.combine_rows(empty, order, torch.zeros(10, dtype=torch.int64, device=DEV), 5)
    assert out.shape == (9, 5) and torch.all(out == 0)


def test_combine_rows_rejects_bad_arguments():
    src = torch.randn(4, 8, device=DEV).bfloat16()
    order = torch.arange(4, device=DEV)
    ptr = torch.tensor([0, 2, 4], device=DEV)
    with pytest.raises(TypeError, match="order"):
        native.combine_rows(src, order.int(), ptr)
    with pytest.raises(ValueError, match="16 bytes"):
        native.combine_rows(torch.randn(4, 7, device=DEV).bfloat16(), order, ptr)
    with pytest.raises(ValueError, match="ncols"):
        native.combine_rows(src, order, ptr, 9)
    with pytest.raises(ValueError, match="16-byte aligned"):
        native.combine_rows(torch.randn(40, device=DEV).bfloat16()[1:33].view(4, 8), order, ptr)


@pytest.mark.skipif(CAP != (9, 0), reason="the CUDA combine is on in sm_90a's config only")
def test_op_takes_the_native_combine_with_the_triton_bits(monkeypatch):
    """grouped_glu forward + backward with gather and scatter: both combines run the CUDA kernel, and the
    output and dX equal (bit for bit) those of the same call with the Triton combine."""
    from tsct.ops import grouped_glu
    from _glu_oracle import make_problem

    p = make_problem(tokens=300, topk=2, experts=7, d=64, r=64, f=5461, empty=(2,), device=DEV,
                     dtype=torch.bfloat16, pad_rows=3)

    def run():
        x = p["x"].clone().requires_grad_()
        y = grouped_glu(x, p["offs"], p["w_gate"], p["w_up"], p["w_down"], p["s_gate"], p["s_up"],
                        row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                        num_out_rows=300, impl="triton-bf16")
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(y))
        return y.detach(), x.grad

    before = G.backend_counts().get(("native", "combine_rows"), 0)
    y1, dx1 = run()
    assert G.backend_counts().get(("native", "combine_rows"), 0) == before + 2
    monkeypatch.setitem(G._CONFIGS, "sm_90a", G.dataclasses.replace(G._CONFIGS["sm_90a"], combine_native=0))
    y0, dx0 = run()
    assert G.backend_counts().get(("native", "combine_rows"), 0) == before + 2
    assert torch.equal(_bits(y1), _bits(y0)) and torch.equal(_bits(dx1), _bits(dx0))
