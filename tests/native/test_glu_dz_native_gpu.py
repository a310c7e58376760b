"""The CUDA glu_bwd_dz (csrc/glu/dz_bf16.cu, ``tsct.native.glu_bwd_dz_bf16``) against fp32 torch, on a GPU.

Each case: fresh random inputs, the caching allocator poisoned with NaN before the call (an unwritten
output element reads NaN), dz = sum of the slices and dW_down compared by relative Frobenius error with
the fp32 reference (bf16 operands, fp32 accumulation: ~1e-6 for dz, ~2e-3 for dW after its one bf16
rounding; tolerance 1e-2), padding rows of dz_part untouched, dW written for the experts of 1 to 64 rows
(one row tile) and left untouched for the others (empty, or several tiles: the caller's chunked kernels), and a
second run compared bit for bit. The kernel runs one CTA per (row tile, f slice) of the tile map. Shapes: odd f
(1, 37, 65, 5461), experts with 0, 1, 64, 65 and 150 rows (one row tile or several), padding rows, scatter indices
out of range (zero rows), no scatter, every slice count, the last row of grad_out (reads that end at the
buffer's end), a grid larger than the tile count (programs past the last tile exit), one expert of 3000 rows
among many empty ones.
Also: the op's backward takes this kernel for bf16, r = 64, K-major w_down on sm_90 (backend counts).
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

DEV = torch.device("cuda")
R = 64
TOL = 1e-2
DZ_SMEM = native.kernel_smem_bytes("tsctk_glu_bwd_dz_bf16")
if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < DZ_SMEM:
    pytest.skip(f"the CUDA dz needs {DZ_SMEM} bytes of shared memory per block", allow_module_level=True)


def poison() -> None:
    blob = torch.empty(min(int(torch.cuda.mem_get_info()[0] * 0.5), 8 << 30), dtype=torch.uint8, device=DEV)
    blob.fill_(0xFF)  # NaN in fp32 and bf16
    del blob


def make(T, f, counts, pad=0, scatter=True, bad_rows=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    E, mv = len(counts), sum(counts)
    m = mv + pad
    T = T if scatter else m
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    tok = torch.randint(0, T, (m,), generator=g)
    if mv:
        tok[0] = tok[mv - 1] = T - 1  # the last row of grad_out: chunks that end at the buffer's end
    tok[mv:] = -3  # padding: never read
    for i in bad_rows:
        tok[i] = T + 5 if i % 2 else -1
    go = torch.randn(T if scatter else m, f, generator=g).bfloat16()
    wd = (torch.randn(E, f, R, generator=g) * 0.05).bfloat16()
    zw = torch.randn(m, R, generator=g).bfloat16()
    zw[mv:] = float("nan")  # padding rows of zw must never be read
    d = dict(grad_out=go, offs=offs, w_down_t=wd, zw=zw, scatter_idx=tok if scatter else None)
    return {k: (v.to(DEV) if v is not None else None) for k, v in d.items()}, counts, mv, bad_rows


def reference(p, counts, mv, bad_rows):
    go, wd, zw, sidx = p["grad_out"].float(), p["w_down_t"].float(), p["zw"].float(), p["scatter_idx"]
    rows = sidx[:mv].clone() if sidx is not None else torch.arange(mv, device=DEV)
    dy = torch.zeros(mv, go.shape[1], device=DEV)
    ok = (rows >= 0) & (rows < go.shape[0])
    dy[ok] = go[rows[ok]]
    dz = torch.zeros(mv, R, device=DEV)
    dw = torch.zeros_like(wd)
    beg = 0
    for e, c in enumerate(counts):
        if c:
            dz[beg:beg + c] = dy[beg:beg + c] @ wd[e]
            dw[e] = dy[beg:beg + c].t() @ zw[beg:beg + c]
        beg += c
    return dz, dw


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


CASES = [
    # name, T, f, counts, pad, scatter, bad rows
    ("f37_mixed", 300, 37, [0, 1, 150, 5, 0, 40, 64, 65, 16, 17], 7, True, ()),
    ("f5461_150rows", 256, 5461, [150, 0, 1, 70, 2], 3, True, (4, 151)),
    ("f65_multitile", 200, 65, [3, 0, 129, 1], 0, True, ()),
    ("f1", 50, 1, [2, 0, 7], 2, True, ()),
    ("f5461_noscatter", None, 5461, [31, 33, 0, 1, 64, 20], 4, False, ()),
    ("f128_aligned", 100, 128, [33, 1, 0, 64], 2, True, (0, 40)),
    ("f300_skewed", 2000, 300, [0] * 40 + [3000] + [0] * 40 + [1, 2], 5, True, ()),
]


def tile_map(counts):
    """(xtile_cum int32 [E] on the GPU, max_tiles): 64-row tiles per expert past its first, the grid bound
    cdiv(M, 64) + E."""
    tiles = [max(-(-c // 64) - 1, 0) for c in counts]
    return (torch.tensor(tiles).cumsum(0).to(torch.int32).to(DEV),
            -(-sum(counts) // 64) + len(counts) + 3)  # + 3: programs past the last tile must exit


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """The wrapper fills its outputs with 0xA5 bytes before the launch: what stays 0xA5 was not written."""
    from tsct.native import _ops

    monkeypatch.setattr(_ops, "_POISON_OUTPUTS", True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_dz_native_matches_fp32_reference(case, poisoned_outputs):
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < native.kernel_smem_bytes(
            native.GLU_DZ_KERNEL):
        pytest.skip("the kernel needs more shared memory per block")
    name, T, f, counts, pad, scatter, bad = case
    p, counts, mv, bad = make(T, f, counts, pad, scatter, bad, seed=len(name))
    dz_ref, dw_ref = reference(p, counts, mv, bad)
    cum, max_tiles = tile_map(counts)
    one_tile = [c <= 64 for c in counts]  # dW of the experts of at most one tile (zeros for an empty one)
    nsteps = -(-f // 64)
    for slices in sorted({min(s, nsteps) for s in (1, 2, 4, 16)}):
        poison()
        dw = torch.full((len(counts), f, R), -23131, dtype=torch.int16, device=DEV).view(torch.bfloat16)
        part = native.glu_bwd_dz_bf16(p["grad_out"], p["offs"], p["w_down_t"], p["zw"], slices=slices,
                                      xtile_cum=cum, max_tiles=max_tiles, scatter_idx=p["scatter_idx"], dw_out=dw)
        torch.cuda.synchronize()
        assert part.shape == (slices, mv + pad, R)
        dz = part[:, :mv].sum(0)
        assert torch.isfinite(dz).all(), f"{name} S={slices}: NaN"
        assert not (part[:, :mv].view(torch.int32) == -1515870811).any(), "unwritten dz_part (0xA5A5A5A5)"
        assert rel(dz, dz_ref) < TOL, (name, slices, rel(dz, dz_ref))
        if pad:
            assert (part[:, mv:].view(torch.uint8) == 0xA5).all(), "padding rows of dz_part must not be written"
        for e, c in enumerate(counts):
            if one_tile[e]:
                assert not (dw[e].view(torch.int16) == -23131).any(), f"expert {e}: unwritten dW"
                assert rel(dw[e], dw_ref[e]) < TOL, (name, slices, e, rel(dw[e], dw_ref[e]))
            else:
                assert (dw[e].view(torch.int16) == -23131).all(), f"expert {e} ({c} rows): dW must be left untouched"
        # a second run: the same bits
        dw2 = torch.empty_like(dw)
        part2 = native.glu_bwd_dz_bf16(p["grad_out"], p["offs"], p["w_down_t"], p["zw"], slices=slices,
                                       xtile_cum=cum, max_tiles=max_tiles, scatter_idx=p["scatter_idx"], dw_out=dw2)
        assert torch.equal(part2[:, :mv].view(torch.int32), part[:, :mv].view(torch.int32))
        for e in range(len(counts)):
            if one_tile[e]:
                assert torch.equal(dw2[e].view(torch.int16), dw[e].view(torch.int16)), ("dW", e)


def test_dz_native_without_dw_writes_only_dz():
    p, counts, mv, bad = make(300, 37, [0, 1, 150, 5, 0, 40], 3, True, (), seed=3)
    dz_ref, _ = reference(p, counts, mv, bad)
    cum, max_tiles = tile_map(counts)
    poison()
    part = native.glu_bwd_dz_bf16(p["grad_out"], p["offs"], p["w_down_t"], p["zw"], slices=1, xtile_cum=cum,
                                  max_tiles=max_tiles, scatter_idx=p["scatter_idx"])
    assert rel(part[0, :mv], dz_ref) < TOL


def test_op_backward_takes_native_dz_on_sm90():
    """bf16, r = 64, K-major w_down: the Triton path's backward runs the CUDA dz where the dispatch has its row
    (sm_90a, ``tsct.dispatch.CUDA_KERNELS``), and its gradients match the fp32 reference."""
    from tsct import reference as Rf
    from tsct.kernels import triton_glu as TG
    from tsct.kernels.layout import to_kmajor
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu

    cap = torch.cuda.get_device_capability()
    enabled = C.cuda_kernel("glu_bwd_dz", cap, "bf16")
    from tsct import config

    if cap == (9, 0) and config.cuda_kernels.strip().lower() in ("", "auto"):
        assert enabled, "sm_90a has the CUDA dz row"
    g = torch.Generator().manual_seed(7)
    T, E, d, f = 200, 5, 128, 5461
    counts = [0, 100, 70, 1, 229]
    offs = torch.tensor(counts).cumsum(0).to(torch.int32).to(DEV)
    tok = torch.randperm(T * 2, generator=g) // 2
    x = torch.randn(T, d, generator=g).bfloat16().to(DEV)
    wg = (torch.randn(E, d, R, generator=g) * d ** -0.5).bfloat16().to(DEV)
    wu = (torch.randn(E, d, R, generator=g) * d ** -0.5).bfloat16().to(DEV)
    wd = to_kmajor((torch.randn(E, R, f, generator=g) * R ** -0.5).bfloat16()).to(DEV)
    rw = torch.rand(T * 2, generator=g).to(DEV)
    idx = tok.to(DEV)
    args = [x, offs, wg, wu, wd, None, None, rw, idx, idx, T]
    go = torch.randn(T, f, generator=g).bfloat16().to(DEV)
    before = glu.backend_counts().get(("native", "glu_bwd_dz"), 0)
    grads = TG.grouped_glu_backward(go, *args, [True] * 7)
    after = glu.backend_counts().get(("native", "glu_bwd_dz"), 0)
    assert after - before == (1 if enabled else 0)
    f32 = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    ref = Rf.grouped_glu_backward(go.float(), *f32, [True] * 7)
    for name, a, b in zip(["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"], grads, ref):
        if b is None:
            continue
        assert rel(a, b) < TOL, (name, rel(a, b))
    assert grads[3].stride() == wd.stride(), "dW_down keeps w_down's K-major layout"
    assert (grads[3][0] == 0).all(), "empty expert: exact zero dW_down"
