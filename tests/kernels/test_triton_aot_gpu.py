"""The ahead-of-time Triton cubins (docs/decisions/0005) on a CUDA GPU, through the native launcher.

Needs an install that ships cubins for this GPU's arch (the wheel; a source tree has none). The
correctness suite proper is tests/kernels/test_triton_glu_gpu.py run with TSCT_TRITON_BACKEND=aot
(scripts/gpu_suite.sh aot); this file adds what is AOT-specific:

- every cubin of this arch's index loads on the device (cudaFuncGetAttributes through the library);
- the launches really go through the AOT backend, not Triton JIT;
- AOT against the fp32 reference (the tolerance of the JIT tests) on a few shapes, aligned and
  generic variants, and bit-identical across runs;
- AOT against JIT where Triton is importable: both within tolerance of the reference (the H200 has
  Triton 3.6 while the cubins are Triton 3.9, so bitwise equality is not expected; the max difference
  is printed);
- CUDA-graph capture of AOT launches.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collection must not touch CUDA on a CPU-only machine
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import reference as R  # noqa: E402
from tsct.kernels import aot  # noqa: E402
from tsct.kernels.triton_glu import glu  # noqa: E402
from _cuda_graph import gc_paused  # noqa: E402

CAP = tuple(torch.cuda.get_device_capability())
ARCH = aot.artifact_arch(CAP)
if ARCH is None or not aot.available(CAP):
    pytest.skip(f"this install has no AOT cubins for compute capability {CAP}", allow_module_level=True)

DEV = torch.device("cuda")
TOL = 1e-2
HAS_TRITON = importlib.util.find_spec("triton") is not None

# name, T, k, E, d, r, f, gather/scatter, scales, row weight, dtype
CASES = [
    ("b1_slice", 2048, 2, 128, 2048, 64, 5461, True, True, True, torch.bfloat16),
    ("generic_d40_r24", 24, 2, 8, 40, 24, 100, True, True, True, torch.bfloat16),
    ("r16_noscale_nogather", 64, 2, 8, 64, 16, 72, False, False, False, torch.bfloat16),
    ("r128", 128, 2, 16, 256, 128, 333, True, True, True, torch.bfloat16),
    ("r100_d200", 64, 2, 6, 200, 100, 333, True, False, True, torch.bfloat16),
]


def make(case, seed=0):
    name, T, k, E, d, r, f, gs, scales, rw, dt = case
    g = torch.Generator().manual_seed(seed)
    m = T * k
    ids = torch.randint(0, E, (m,), generator=g)
    ids[: m // 8] = 0  # one heavy expert
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=E).cumsum(0).to(torch.int32)
    tok = order // k
    p = dict(
        x=torch.randn(T if gs else m, d, generator=g).to(dt),
        offs=offs,
        w_gate=(torch.randn(E, d, r, generator=g) * d ** -0.5).to(dt),
        w_up=(torch.randn(E, d, r, generator=g) * d ** -0.5).to(dt),
        w_down=(torch.randn(E, r, f, generator=g) * r ** -0.5).to(dt),
        s_gate=(1 + 0.1 * torch.randn(E, r, generator=g)) if scales else None,
        s_up=(1 + 0.1 * torch.randn(E, r, generator=g)) if scales else None,
        row_weight=torch.rand(m, generator=g) if rw else None,
        gather_idx=tok if gs else None,
        scatter_idx=tok if gs else None,
        num_out_rows=T if gs else None,
    )
    p = {kk: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for kk, v in p.items()}
    go = torch.randn(T if gs else m, f, generator=g).to(dt).to(DEV)
    return p, go


ORDER = ["x", "offs", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight", "gather_idx", "scatter_idx",
         "num_out_rows"]
GRADS = ["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"]


def args(p, fp32=False):
    return [(v.float() if fp32 and isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for v in (p[kk] for kk in ORDER)]


def run(p, go, backend, monkeypatch):
    monkeypatch.setenv("TSCT_TRITON_BACKEND", backend)
    out = glu.grouped_glu_forward(*args(p))
    grads = glu.grouped_glu_backward(go, *args(p), [True] * 7)
    torch.cuda.synchronize()
    return out, grads


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def test_every_cubin_loads():
    idx = aot.index(ARCH)
    spills = []
    for key, e in idx["kernels"].items():
        info = aot.kernel(ARCH, key).info()
        assert info["max_threads_per_block"] >= 32 * e["num_warps"], key
        if info["local_bytes"]:
            spills.append((info["local_bytes"], key))
    print(f"{len(idx['kernels'])} {ARCH} cubins load; {len(spills)} use local memory; worst: {sorted(spills)[-3:]}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_aot_matches_reference_and_is_deterministic(case, monkeypatch):
    p, go = make(case)
    before = glu.backend_counts()
    out1, g1 = run(p, go, "aot", monkeypatch)
    after = glu.backend_counts()
    assert not any(b == "jit" and after[(b, k)] != before.get((b, k), 0) for b, k in after), "a JIT launch"
    assert sum(v for (b, _), v in after.items() if b == "aot") > sum(v for (b, _), v in before.items() if b == "aot")
    ref = R.grouped_glu_forward(*args(p, fp32=True))
    ref_g = R.grouped_glu_backward(go.float(), *args(p, fp32=True), [True] * 7)
    assert not out1.isnan().any()
    assert rel_err(out1, ref) < TOL, rel_err(out1, ref)
    for name, a, b in zip(GRADS, g1, ref_g):
        if b is None:
            assert a is None, name
            continue
        assert rel_err(a, b) < TOL, f"{name}: {rel_err(a, b):.3e}"
    out2, g2 = run(p, go, "aot", monkeypatch)
    assert torch.equal(out1, out2)
    for name, a, b in zip(GRADS, g1, g2):
        assert (a is None and b is None) or torch.equal(a, b), f"{name} differs between AOT runs"


@pytest.mark.skipif(not HAS_TRITON, reason="Triton not importable: no JIT to compare with")
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c[0])
def test_aot_and_jit_agree(case, monkeypatch):
    import triton

    p, go = make(case, seed=1)
    oa, ga = run(p, go, "aot", monkeypatch)
    oj, gj = run(p, go, "jit", monkeypatch)
    ref = R.grouped_glu_forward(*args(p, fp32=True))
    assert rel_err(oa, ref) < TOL and rel_err(oj, ref) < TOL
    same = torch.equal(oa, oj)
    print(f"{case[0]}: AOT (Triton 3.9 cubins) vs JIT (Triton {triton.__version__}): forward bit-identical={same}, "
          f"max |diff| {(oa.float() - oj.float()).abs().max().item():.3e}")
    for name, a, b in zip(GRADS, ga, gj):
        if a is not None:
            assert rel_err(a, b) < 2 * TOL, name


def test_aot_cuda_graph(monkeypatch):
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    case = ("graph", 512, 2, 64, 256, 64, 5461, True, True, True, torch.bfloat16)
    p, go = make(case, seed=2)
    a = args(p)
    glu.grouped_glu_forward(*a)  # load the cubins outside the capture
    glu.grouped_glu_backward(go, *a, [True] * 7)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        g_out = glu.grouped_glu_forward(*a)
        g_grads = glu.grouped_glu_backward(go, *a, [True] * 7)
    q, _ = make(case, seed=3)
    for kk in ORDER:
        if isinstance(p[kk], torch.Tensor):
            p[kk].copy_(q[kk])
    graph.replay()
    torch.cuda.synchronize()
    want = glu.grouped_glu_forward(*args(q))
    want_g = glu.grouped_glu_backward(go, *args(q), [True] * 7)
    assert torch.equal(g_out, want)
    for name, x, y in zip(GRADS, g_grads, want_g):
        assert torch.equal(x, y), name


def test_fp16_has_no_cubins_and_auto_takes_bmm_without_jit(monkeypatch):
    """fp16 activations ship no cubins (docs/decisions/0005): with JIT forbidden (``TSCT_TRITON_BACKEND=aot``, as an
    install without Triton) ``impl="auto"`` returns bmm's result and counts the fallback, a forced triton-bf16 raises
    naming the reason; with JIT allowed and Triton importable the same call runs the Triton kernels."""
    from tsct import dispatch
    from tsct.ops import grouped_glu

    assert not any("x_ptr:*fp16" in key for key in aot.index(ARCH)["kernels"])
    p, _ = make(("fp16_r128", 128, 2, 16, 256, 128, 333, True, True, True, torch.float16))
    pos = [p[kk] for kk in ORDER[:7]]
    kw = {kk: p[kk] for kk in ORDER[7:]}
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    dispatch.reset_fallback_counts()
    with pytest.warns(RuntimeWarning, match="fp16 activations"):
        y = grouped_glu(*pos, **kw)
    assert torch.equal(y, grouped_glu(*pos, **kw, impl="bmm"))
    assert [k[:2] for k in dispatch.fallback_counts()] == [(dispatch.TRITON_BF16, dispatch.BMM)]
    with pytest.raises(RuntimeError, match="no cubin for fp16 activations"):
        grouped_glu(*pos, **kw, impl="triton-bf16")
    if HAS_TRITON:
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "auto")
        before = glu.backend_counts()
        yj = grouped_glu(*pos, **kw, impl="triton-bf16")
        after = glu.backend_counts()
        assert any(b == "jit" and n > before.get((b, k), 0) for (b, k), n in after.items()), "no JIT launch"
        ref = R.grouped_glu_forward(*args(p, fp32=True))
        assert rel_err(yj, ref) < TOL and rel_err(y, ref) < TOL
    dispatch.reset_fallback_counts()
