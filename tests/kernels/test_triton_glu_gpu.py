"""The Triton grouped GLU (path "triton-bf16") against tsct.reference in fp32, on a CUDA GPU.

Every check: fresh random inputs, the caching allocator poisoned with NaN before each call (so an
unwritten output element shows as NaN), forward and all seven gradients compared by relative
Frobenius error, padding rows and empty experts checked for exact zeros, and a second run compared
bit for bit (determinism). Tolerance 1e-2: bf16 operands with fp32 accumulation land at a few 1e-3
(METHOD.md); the kernels also round the latent z, dhg/dhu and the routed rows to bf16 once each.

Run on the device machine: ``PYTHONPATH=python python3 -m pytest -q tests/kernels/test_triton_glu_gpu.py`` (Triton JIT);
from an installed wheel with ``TSCT_TRITON_BACKEND=aot`` the same tests run the ahead-of-time cubins
(scripts/gpu_suite.sh aot).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Optional

import pytest
import torch

pytestmark = pytest.mark.gpu

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():  # collection must not touch CUDA on a CPU-only machine
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import reference as R  # noqa: E402
from tsct.kernels import triton_glu as TG  # noqa: E402
from tsct.kernels.layout import to_kmajor  # noqa: E402
from _cuda_graph import gc_paused  # noqa: E402

DEV = torch.device("cuda")
TOL = 1e-2
NAMES = ["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    T: int
    k: int
    E: int
    d: int
    r: int
    f: int
    counts: Optional[tuple] = None  # rows per expert (sum T*k); None: uniform random routing
    pad: int = 0                    # padding rows past offs[-1]
    gather: bool = True
    scatter: bool = True
    s_dtype: Optional[torch.dtype] = torch.float32   # None: no scales
    rw_dtype: Optional[torch.dtype] = torch.float32  # None: no row weight
    idx_dtype: torch.dtype = torch.int64
    dtype: torch.dtype = torch.bfloat16
    kmajor: bool = False            # w_down as the transpose of a contiguous [E, f, r] (decision 0012)


B1 = Case("b1", T=16384, k=2, E=1024, d=2048, r=64, f=5461, pad=0)
CASES = [
    B1,
    Case("b1_pad_bf16scales_i32", T=4096, k=2, E=1024, d=2048, r=64, f=5461, pad=37,
         s_dtype=torch.bfloat16, rw_dtype=torch.bfloat16, idx_dtype=torch.int32),
    Case("f37_empty", T=50, k=2, E=6, d=64, r=16, f=37, counts=(0, 30, 21, 0, 48, 1), pad=7,
         s_dtype=torch.bfloat16, rw_dtype=torch.bfloat16, idx_dtype=torch.int32),
    Case("one_row_experts", T=12, k=1, E=8, d=40, r=24, f=100, counts=(1, 1, 0, 1, 7, 1, 0, 1), pad=3),
    Case("all_in_one_nogather", T=100, k=2, E=4, d=128, r=32, f=200, counts=(0, 0, 200, 0), pad=9,
         gather=False, scatter=False),
    Case("d16_r16_noscales", T=64, k=2, E=8, d=16, r=16, f=72, s_dtype=None, rw_dtype=None),
    Case("d4096_f5461", T=256, k=2, E=8, d=4096, r=64, f=5461, pad=5),
    Case("r4096", T=40, k=2, E=3, d=256, r=4096, f=96, pad=2),
    Case("d4096_r4096", T=16, k=2, E=2, d=4096, r=4096, f=48),
    Case("fp16", T=128, k=2, E=16, d=256, r=64, f=5461, dtype=torch.float16, s_dtype=torch.float16,
         rw_dtype=torch.float16),
    Case("top4_f129", T=64, k=4, E=8, d=128, r=32, f=129, pad=4),
    Case("scatter_only", T=96, k=2, E=5, d=96, r=48, f=257, pad=6, gather=False),
    Case("gather_only", T=96, k=2, E=5, d=96, r=48, f=257, pad=6, scatter=False),
    Case("r100_d200", T=64, k=2, E=6, d=200, r=100, f=333, counts=(0, 64, 0, 60, 3, 1)),
    # K-major w_down: the WD_T kernels (aligned d, r), and the row-major fallback when r is unaligned
    Case("b1_kmajor", T=16384, k=2, E=1024, d=2048, r=64, f=5461, kmajor=True),
    Case("f37_empty_kmajor", T=50, k=2, E=6, d=64, r=16, f=37, counts=(0, 30, 21, 0, 48, 1), pad=7,
         idx_dtype=torch.int32, kmajor=True),
    Case("multi_tile_kmajor_r160", T=120, k=2, E=3, d=64, r=160, f=129, counts=(0, 200, 40), pad=3, kmajor=True),
    Case("fp16_kmajor_nogather", T=128, k=2, E=16, d=256, r=32, f=5461, dtype=torch.float16,
         s_dtype=torch.float16, rw_dtype=torch.float16, gather=False, scatter=False, pad=5, kmajor=True),
    Case("r100_kmajor_fallback", T=64, k=2, E=6, d=200, r=100, f=333, counts=(0, 64, 0, 60, 3, 1), kmajor=True),
    # bf16, r = 64, K-major: the CUDA glu_bwd_dz on sm_90 (csrc/glu/dz_bf16.cu); > 64 rows: several row chunks
    Case("f37_r64_kmajor_chunks", T=100, k=2, E=6, d=64, r=64, f=37, counts=(0, 70, 1, 0, 120, 9), pad=5,
         kmajor=True),
    Case("f5461_r64_kmajor_nogather", T=128, k=2, E=8, d=128, r=64, f=5461, counts=(0, 64, 65, 1, 30, 40, 56, 0),
         gather=False, scatter=False, pad=3, kmajor=True),
    # no scatter into rows of f % 8 == 0 (the forward_counts seam): the up projection's vector-store (Y_PAD) variant,
    # K-major, experts of several row tiles, padding rows past offs[-1] left zero
    Case("f64_kmajor_noscatter", T=120, k=2, E=3, d=64, r=32, f=64, counts=(0, 200, 40), pad=5, scatter=False,
         kmajor=True),
]


def make_inputs(c: Case, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    valid = c.T * c.k
    m = valid + c.pad
    if c.counts is None:
        ids = torch.randint(0, c.E, (c.T, c.k), generator=g)
    else:
        assert sum(c.counts) == valid
        ids = torch.repeat_interleave(torch.arange(c.E), torch.tensor(c.counts))[torch.randperm(valid, generator=g)]
        ids = ids.view(c.T, c.k)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    token = order // c.k
    offs = torch.bincount(flat, minlength=c.E).cumsum(0).to(torch.int32)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    p = dict(
        x=rnd(c.T, c.d) if c.gather else rnd(m, c.d),
        offs=offs,
        w_gate=rnd(c.E, c.d, c.r, scale=c.d ** -0.5),
        w_up=rnd(c.E, c.d, c.r, scale=c.d ** -0.5),
        w_down=rnd(c.E, c.r, c.f, scale=c.r ** -0.5),
        s_gate=(1 + 0.1 * rnd(c.E, c.r)) if c.s_dtype else None,
        s_up=(1 + 0.1 * rnd(c.E, c.r)) if c.s_dtype else None,
        row_weight=torch.cat([torch.rand(valid, generator=g), torch.full((c.pad,), float("nan"))])
        if c.rw_dtype else None,
        # padding entries of the index vectors hold out-of-range garbage: they must never be used
        gather_idx=torch.cat([token, torch.full((c.pad,), 1 << 30)]) if c.gather else None,
        scatter_idx=torch.cat([token, torch.full((c.pad,), -3)]) if c.scatter else None,
        num_out_rows=c.T if c.scatter else None,
    )
    for key in ("x", "w_gate", "w_up", "w_down"):
        p[key] = p[key].to(c.dtype)
    if c.kmajor:
        p["w_down"] = to_kmajor(p["w_down"])
    for key in ("s_gate", "s_up"):
        if p[key] is not None:
            p[key] = p[key].to(c.s_dtype)
    if p["row_weight"] is not None:
        p["row_weight"] = p["row_weight"].to(c.rw_dtype)
    for key in ("gather_idx", "scatter_idx"):
        if p[key] is not None:
            p[key] = p[key].to(c.idx_dtype)
    return {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in p.items()}


ARGS = ["x", "offs", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight", "gather_idx", "scatter_idx",
        "num_out_rows"]


def args_of(p: dict, fp32: bool = False) -> list:
    out = []
    for k in ARGS:
        v = p[k]
        if fp32 and isinstance(v, torch.Tensor) and v.is_floating_point():
            v = v.float()
        out.append(v)
    return out


def poison() -> None:
    """Fill the caching allocator's free blocks with NaN bits, so unwritten outputs read as NaN."""
    free = torch.cuda.mem_get_info()[0]
    nbytes = min(int(free * 0.5), 24 << 30)
    blob = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    blob.fill_(0xFF)  # all-ones: NaN in fp32, bf16 and fp16
    small = [torch.full((1 << 18,), float("nan"), device=DEV) for _ in range(64)]  # the small-block pool
    del blob, small


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_kernels(p: dict, go: torch.Tensor):
    poison()
    out = TG.grouped_glu_forward(*args_of(p))
    poison()
    grads = TG.grouped_glu_backward(go, *args_of(p), [True] * 7)
    torch.cuda.synchronize()
    return out, grads


_cache: dict = {}


def results(c: Case):
    """Kernel outputs (two runs) and fp32 reference outputs for one case, computed once."""
    if c.dtype == torch.float16 and os.environ.get("TSCT_TRITON_BACKEND") == "aot":
        pytest.skip("fp16 activations have no cubins (Triton JIT: stage glu-jit runs them)")
    if c.name in _cache:
        return _cache[c.name]
    p = make_inputs(c, seed=zlib.crc32(c.name.encode()) % 10000)
    ref = R.grouped_glu_forward(*args_of(p, fp32=True))
    go = torch.randn(ref.shape, device=DEV).to(c.dtype)
    ref_grads = R.grouped_glu_backward(go.float(), *args_of(p, fp32=True), [True] * 7)
    out1, grads1 = run_kernels(p, go)
    out2, grads2 = run_kernels(p, go)
    _cache.clear()  # keep one case's tensors alive at a time
    _cache[c.name] = (p, ref, ref_grads, (out1, grads1), (out2, grads2))
    return _cache[c.name]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_forward(c: Case):
    p, ref, _, (out, _), _ = results(c)
    assert out.shape == ref.shape and out.dtype == c.dtype
    assert not out.isnan().any(), "unwritten or NaN output elements"
    assert rel_err(out, ref) < TOL, rel_err(out, ref)
    if not c.scatter and c.pad:
        assert (out[-c.pad:] == 0).all(), "padding rows must be exact zeros"


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_backward(c: Case):
    p, _, ref_grads, (_, grads), _ = results(c)
    inputs = [p[n] for n in NAMES]
    for name, t, g, rg in zip(NAMES, inputs, grads, ref_grads):
        if t is None:
            assert g is None, name
            continue
        assert g is not None and g.shape == t.shape and g.dtype == t.dtype, name
        assert not g.isnan().any(), f"{name}: NaN (unwritten?)"
        err = rel_err(g, rg)
        assert err < TOL, f"{name}: rel err {err:.3e}"
    if c.kmajor and c.d % 16 == 0 and c.r % 16 == 0:  # WD_T writes dW_down in w_down's own layout
        assert grads[3].stride() == p["w_down"].stride(), (grads[3].stride(), p["w_down"].stride())
    counts = torch.diff(p["offs"], prepend=p["offs"].new_zeros(1))
    empty = counts == 0
    if empty.any():
        for i in (1, 2, 3, 4, 5):
            if grads[i] is not None:
                assert (grads[i][empty] == 0).all(), f"{NAMES[i]}: empty experts need exact zero grads"
    if c.pad:
        if not c.gather:
            assert (grads[0][-c.pad:] == 0).all(), "padding rows need zero dX"
        if grads[6] is not None:
            assert (grads[6][-c.pad:] == 0).all(), "padding rows need zero d row_weight"


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_deterministic(c: Case):
    _, _, _, (out1, grads1), (out2, grads2) = results(c)
    assert torch.equal(out1, out2)
    for name, a, b in zip(NAMES, grads1, grads2):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), f"{name} differs between runs"


@pytest.mark.parametrize("impl", ["triton-bf16", "bmm"])
def test_empty_experts_ignore_nan_factors_and_scales(impl):
    """NaN in every factor and scale of the empty experts: the output and every other expert's gradients stay
    finite, and the empty experts' gradients are exact zeros (through the op, both GPU paths)."""
    from tsct.ops import grouped_glu

    c = next(c for c in CASES if c.name == "f37_empty")
    p = make_inputs(c, seed=11)
    empty = torch.diff(p["offs"], prepend=p["offs"].new_zeros(1)) == 0
    leaves = {}
    for n in ("w_gate", "w_up", "w_down", "s_gate", "s_up"):
        t = p[n].detach().clone()
        t[empty] = float("nan")
        leaves[n] = t.requires_grad_()
    poison()
    y = grouped_glu(p["x"], p["offs"], *(leaves[n] for n in ("w_gate", "w_up", "w_down", "s_gate", "s_up")),
                    row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                    num_out_rows=p["num_out_rows"], impl=impl)
    assert torch.isfinite(y).all()
    y.backward(torch.randn_like(y))
    for n, t in leaves.items():
        assert torch.equal(t.grad[empty], torch.zeros_like(t.grad[empty])), n
        assert torch.isfinite(t.grad[~empty]).all() and t.grad[~empty].abs().sum() > 0, n


def test_needs_grad_subset():
    c = CASES[2]
    p = make_inputs(c, seed=5)
    go = torch.randn(c.T, c.f, device=DEV).to(c.dtype)
    full = TG.grouped_glu_backward(go, *args_of(p), [True] * 7)
    for need in ([True] + [False] * 6, [False, False, False, True, False, False, False],
                 [False, True, True, False, False, False, True]):
        part = TG.grouped_glu_backward(go, *args_of(p), need)
        for i, (n, a, b) in enumerate(zip(need, part, full)):
            if n:
                assert torch.equal(a, b), NAMES[i]
            else:
                assert a is None, NAMES[i]


def test_cuda_graph_capture():
    """Sync-free: forward and backward capture in a CUDA graph and replay on new inputs."""
    c = Case("graph", T=512, k=2, E=64, d=256, r=64, f=5461, pad=3)
    p = make_inputs(c, seed=1)
    go = torch.randn(c.T, c.f, device=DEV).to(c.dtype)
    args = args_of(p)
    out = TG.grouped_glu_forward(*args)  # compile outside the capture
    TG.grouped_glu_backward(go, *args, [True] * 7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        TG.grouped_glu_forward(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        g_out = TG.grouped_glu_forward(*args)
        g_grads = TG.grouped_glu_backward(go, *args, [True] * 7)
    q = make_inputs(c, seed=2)  # new routing and values, same shapes
    for k in ARGS:
        if isinstance(p[k], torch.Tensor):
            p[k].copy_(q[k])
    graph.replay()
    torch.cuda.synchronize()
    want = TG.grouped_glu_forward(*args_of(q))
    want_grads = TG.grouped_glu_backward(go, *args_of(q), [True] * 7)
    assert torch.equal(g_out, want)
    for name, a, b in zip(NAMES, g_grads, want_grads):
        assert torch.equal(a, b), name


def test_rows_times_f_past_2_31():
    """M * f just past 2^31 elements: offsets must be 64-bit. Checks the first and last experts."""
    f, E, d, r = 4099, 32, 16, 16
    m = (1 << 31) // f + 2048
    counts = torch.full((E,), m // E)
    counts[-1] += m - int(counts.sum())
    g = torch.Generator().manual_seed(3)
    x = torch.randn(m, d, generator=g).to(torch.bfloat16).to(DEV)
    wg = (torch.randn(E, d, r, generator=g) / 4).to(torch.bfloat16).to(DEV)
    wu = (torch.randn(E, d, r, generator=g) / 4).to(torch.bfloat16).to(DEV)
    wd = (torch.randn(E, r, f, generator=g) / 4).to(torch.bfloat16).to(DEV)
    offs = counts.cumsum(0).to(torch.int32).to(DEV)
    out = TG.grouped_glu_forward(x, offs, wg, wu, wd)
    go = torch.randn(m, f, device=DEV, dtype=torch.bfloat16)
    grads = TG.grouped_glu_backward(go, x, offs, wg, wu, wd, None, None, None, None, None, None,
                                    [False, False, False, True, False, False, False])
    bounds = [0] + offs.tolist()
    for e in (0, E - 1):
        xe = x[bounds[e]:bounds[e + 1]].float()
        z = torch.nn.functional.silu(xe @ wg[e].float()) * (xe @ wu[e].float())
        assert rel_err(out[bounds[e]:bounds[e + 1]], z @ wd[e].float()) < TOL, e
        assert rel_err(grads[3][e], z.T @ go[bounds[e]:bounds[e + 1]].float()) < TOL, e


def test_status():
    assert TG.status((9, 0), "bf16")[0]
    if os.environ.get("TSCT_TRITON_BACKEND", "auto") != "aot":  # forced AOT: no cubins for sm_80
        assert TG.status((8, 0), "fp16")[0]
    assert not TG.status((7, 5), "bf16")[0]
    assert not TG.status((9, 0), "nvfp4")[0]
    assert not TG.status(None, "bf16")[0]


def test_op_saves_forward_tensors():
    """tsct.ops.grouped_glu(impl="triton-bf16"): the custom op saves hg, hu, z*rw in the forward and
    the backward skips its recompute; gradients match the reference, bits repeat, and the saved
    backward equals the recomputing one bit for bit."""
    from tsct.ops import grouped_glu

    c = Case("op_saved", T=256, k=2, E=16, d=256, r=64, f=5461, pad=5)
    p = make_inputs(c, seed=11)
    go = torch.randn(c.T, c.f, device=DEV).to(c.dtype)
    leaves = ["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"]

    def run():
        q = {k: (v.detach().clone().requires_grad_(k in leaves) if isinstance(v, torch.Tensor) else v)
             for k, v in p.items()}
        out = grouped_glu(q["x"], q["offs"], q["w_gate"], q["w_up"], q["w_down"], q["s_gate"], q["s_up"],
                          row_weight=q["row_weight"], gather_idx=q["gather_idx"], scatter_idx=q["scatter_idx"],
                          num_out_rows=q["num_out_rows"], impl="triton-bf16")
        out.backward(go)
        return out.detach(), [q[k].grad for k in leaves]

    out1, g1 = run()
    out2, g2 = run()
    assert torch.equal(out1, out2)
    ref = R.grouped_glu_forward(*args_of(p, fp32=True))
    ref_grads = R.grouped_glu_backward(go.float(), *args_of(p, fp32=True), [True] * 7)
    assert rel_err(out1, ref) < TOL
    direct = TG.grouped_glu_backward(go, *args_of(p), [True] * 7)  # recomputes hg, hu, z*rw
    for name, a, b, rg, d in zip(NAMES, g1, g2, ref_grads, direct):
        assert torch.equal(a, b), name
        assert rel_err(a, rg) < TOL, name
        assert torch.equal(a, d.to(a.dtype)), f"{name}: saved and recomputed backward differ"


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "sign"])
def test_one_index_tensor_reuses_the_combine_csr(fmt, monkeypatch):
    """One index tensor as gather_idx and scatter_idx (a token-choice MoE layer): the op's backward reuses the
    forward's combine CSR for dX instead of sorting again, with the same bits as with two equal index tensors
    (which build their own), and dX matches the reference on the dequantized factors."""
    from tsct import quant
    from tsct.kernels.triton_common import runtime as C
    from tsct.ops import grouped_glu

    c = Case("one_index", T=192, k=2, E=12, d=128, r=64, f=5461, pad=3)
    p = make_inputs(c, seed=17)
    tok = p["gather_idx"].clone()
    tok[c.T * c.k:] = 0  # padding rows' entries: valid for both uses (never read either way)
    facs = [p["w_gate"], p["w_up"], p["w_down"]]
    impl = "triton-bf16"
    if fmt != "bf16":
        facs, impl = [quant.quantize(w, fmt) for w in facs], "triton-lowbit"
    built = []
    csr = C._csr
    monkeypatch.setattr(C, "_csr", lambda *a: built.append(1) or csr(*a))

    def run(gi, si):
        x = p["x"].detach().clone().requires_grad_(True)
        out = grouped_glu(x, p["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"], gather_idx=gi,
                          scatter_idx=si, num_out_rows=c.T, impl=impl)
        poison()
        out.backward(go)
        return out.detach(), x.grad

    go = torch.randn(c.T, c.f, device=DEV).to(c.dtype)
    built.clear()
    out1, dx1 = run(tok, tok)
    n_one = len(built)
    built.clear()
    out2, dx2 = run(tok, tok.clone())
    assert (n_one, len(built)) == (1, 2), "CSRs built: one index tensor / two equal ones"
    assert torch.equal(out1, out2) and torch.equal(dx1, dx2)
    dense = [w if fmt == "bf16" else quant.dequantize(w, torch.float32) for w in facs]
    args = [p["x"], p["offs"], *dense, p["s_gate"], p["s_up"], p["row_weight"], tok, tok, c.T]
    args = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    ref = R.grouped_glu_backward(go.float(), *args, [True] + [False] * 6)[0]
    assert rel_err(dx1, ref) < TOL
