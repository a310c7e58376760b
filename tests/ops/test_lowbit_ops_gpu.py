"""``tsct.ops.grouped_glu`` with packed factors on a CUDA GPU: the wired "triton-lowbit" path.

- ``impl="auto"`` takes triton-lowbit for NVFP4 / sign / mixed factors (and the launches happen); fp8 / ternary
  factors (and mixes with them) run there only when forced (``dispatch.FORCED_ONLY``; auto takes bmm);
- forward and all gradients through the ``tsct::grouped_glu_q`` custom op against ``tsct.reference`` on the
  DEQUANTIZED factors in fp32 (same math), with masters receiving the STE gradient;
- torch.compile(fullgraph=True): forward and backward equal eager;
- the AOT cubins (``TSCT_TRITON_BACKEND=aot``: nothing JITs) at the b1 shape and the test shapes, when this
  install ships the "lowbit" family; then JIT (``=jit``) of the same for comparison;
- quantize_master across optimizer steps; CUDA graph capture of the whole call.

    python3 -m pytest -q tests/ops/test_lowbit_ops_gpu.py          (scripts/gpu_suite.sh lowbit-ops)
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import config, dispatch, quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.kernels import triton_lowbit as TL  # noqa: E402
from tsct.kernels.triton_lowbit import glu as L  # noqa: E402
from tsct.ops import grouped_glu, quantize_master  # noqa: E402
from _cuda_graph import captured  # noqa: E402

DEV = torch.device("cuda")
CAP = tuple(torch.cuda.get_device_capability())
TOL = 1e-2  # rel Frobenius, bf16 activations vs fp32 on the same decoded factors (the dense path's tolerance)
FMTS = {"nvfp4": ("nvfp4",) * 3, "sign": ("sign",) * 3, "mixed": ("nvfp4", "sign", "nvfp4"),
        "dense_gate": ("dense", "nvfp4", "sign"), "fp8": ("fp8",) * 3, "ternary": ("ternary",) * 3,
        "mixed_decoded": ("fp8", "ternary", "nvfp4")}
AUTO_FMTS = ("nvfp4", "sign", "mixed", "dense_gate")  # the formats auto sends to triton-lowbit
DECODED_FMTS = ("fp8", "ternary", "mixed_decoded")  # triton-lowbit only when forced
NAMES = ("w_gate", "w_up", "w_down")

# the CUDA projections (rows of tsct.dispatch.CUDA_KERNELS, decision 0014) replace the two forward Triton
# kernels for packed factors at r = 64 where the dispatch has those rows; TSCT_TRITON_BACKEND governs Triton only
NATIVE = {("native", "lowbit_down_fwd"), ("native", "lowbit_up_fwd")}

def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def problem(T, k, E, d, r, f, fmt, pad=3, seed=0, dtype=torch.bfloat16):
    """Routing sorted by expert (one expert empty), gather/scatter indices with padding rows, masters fp32."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (T, k), generator=g)
    ids[ids == 1] = 2
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    tok = order // k
    tok = torch.cat([tok, torch.zeros(pad, dtype=tok.dtype)])
    gd = torch.Generator(device=DEV).manual_seed(seed)  # the b1 factors are made on the device
    masters = [torch.randn(E, d, r, generator=gd, device=DEV) / d ** 0.5,
               torch.randn(E, d, r, generator=gd, device=DEV) / d ** 0.5,
               torch.randn(E, r, f, generator=gd, device=DEV) / r ** 0.5]
    facs = [m.to(dtype) if q == "dense" else quant.quantize(m, q) for m, q in zip(masters, FMTS[fmt])]
    rw = torch.cat([torch.rand(T * k, generator=g), torch.full((pad,), float("nan"))])
    p = dict(x=torch.randn(T, d, generator=g).to(DEV, dtype), offs=offs.to(DEV),
             s_gate=(1 + 0.1 * torch.randn(E, r, generator=g)).to(DEV), s_up=(1 + 0.1 * torch.randn(E, r, generator=g)).to(DEV),
             row_weight=rw.to(DEV), gather_idx=tok.to(DEV), scatter_idx=tok.to(DEV), num_out_rows=T)
    return p, masters, facs


def decoded(facs):
    return [quant.dequantize(w, dtype=torch.float32) if quant.is_quantized(w) else w.float() for w in facs]


def run(p, facs, masters=None, **kw):
    return grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                       gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                       masters=masters, **kw)


def ref_grads(p, facs, go):
    args = [p["x"].float(), p["offs"], *decoded(facs), p["s_gate"], p["s_up"], p["row_weight"], p["gather_idx"],
            p["scatter_idx"], p["num_out_rows"]]
    return R.grouped_glu_forward(*args), R.grouped_glu_backward(go.float(), *args, [True] * 7)


def train_call(p, facs, ms, go, **kw):
    """One forward+backward with x, masters (packed slots) / dense factors, scales and row weights as leaves."""
    x = p["x"].clone().requires_grad_(True)
    sg = p["s_gate"].clone().requires_grad_(True)
    su = p["s_up"].clone().requires_grad_(True)
    rw = p["row_weight"].clone().requires_grad_(True)
    leaves = [w.clone().requires_grad_(True) if isinstance(w, torch.Tensor) else w for w in facs]
    mm = [None if isinstance(w, torch.Tensor) else m.clone().requires_grad_(True) for w, m in zip(facs, ms)]
    y = grouped_glu(x, p["offs"], *leaves, sg, su, row_weight=rw, gather_idx=p["gather_idx"],
                    scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], masters=mm, **kw)
    y.backward(go)
    wgrads = [m.grad if m is not None else w.grad for m, w in zip(mm, leaves)]
    return y.detach(), [x.grad, *wgrads, sg.grad, su.grad, rw.grad]


@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "mixed", "dense_gate"])
def test_auto_takes_triton_lowbit(fmt):
    want = "mixed" if fmt in ("mixed", "dense_gate") else fmt
    assert dispatch.decide(CAP, want).path == dispatch.TRITON_LOWBIT, dispatch.decide(CAP, want)
    p, _, facs = problem(64, 2, 8, 128, 32, 96, fmt)
    before = sum(L.launch_counts().values())
    dispatch.reset_fallback_counts()
    y = run(p, facs)
    torch.cuda.synchronize()
    assert sum(L.launch_counts().values()) >= before + 2  # down + up kernels of this package ran
    assert not dispatch.fallback_counts()
    assert y.shape == (64, 96) and y.dtype == torch.bfloat16 and torch.isfinite(y).all()


CASES = [  # (T, k, E, d, r, f)
    (64, 2, 8, 128, 32, 96),
    (50, 2, 6, 64, 16, 37),
    (256, 2, 64, 2048, 64, 5461),
    (16, 2, 3, 96, 48, 257),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("fmt", [*AUTO_FMTS, *DECODED_FMTS])
def test_forward_backward_vs_reference_with_masters(case, fmt):
    p, ms, facs = problem(*case, fmt, seed=sum(case))
    go = torch.randn(case[0], case[5], device=DEV).to(torch.bfloat16)
    kw = {}
    if fmt in DECODED_FMTS:  # forced; auto stays on bmm for them
        want = "mixed-decoded" if fmt == "mixed_decoded" else fmt
        assert dispatch.decide(CAP, want).path == dispatch.BMM
        kw = dict(impl="triton-lowbit")
    before = sum(L.launch_counts().values())
    y, grads = train_call(p, facs, ms, go, **kw)
    torch.cuda.synchronize()
    assert sum(L.launch_counts().values()) >= before + 4  # down, up, dz, dx-dw of this package ran
    want_y, want = ref_grads(p, facs, go)
    assert rel(y, want_y) < TOL
    for name, g, w in zip(("x",) + NAMES + ("s_gate", "s_up", "row_weight"), grads, want):
        assert g is not None and g.shape == w.shape, name
        if name == "row_weight":
            assert (g[-3:] == 0).all()  # padding rows: zero gradient
            g, w = g[:-3], w[:-3]
        assert rel(g, w) < TOL, f"{name}: {rel(g, w):.3e}"
    for i, (w, m) in enumerate(zip(facs, ms)):  # masters (fp32) get fp32 gradients
        if not isinstance(w, torch.Tensor):
            assert grads[1 + i].dtype == torch.float32


def test_fullgraph_compile_equals_eager():
    torch._dynamo.reset()
    p, ms, facs = problem(128, 2, 16, 256, 64, 300, "mixed", seed=11)
    mm = [m.clone().requires_grad_(True) for m in ms]

    def step(x, f0, f1, f2, m0, m1, m2):
        return grouped_glu(torch.tanh(x), p["offs"], f0, f1, f2, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                           gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=128,
                           masters=(m0, m1, m2))

    y0 = step(p["x"], *facs, *mm)
    y0.float().sum().backward()
    g0 = [m.grad.clone() for m in mm]
    for m in mm:
        m.grad = None
    saved = config.check_values
    try:
        y1 = torch.compile(step, fullgraph=True)(p["x"], *facs, *mm)
        y1.float().sum().backward()
    finally:
        config.check_values = saved
    torch.testing.assert_close(y1, y0, rtol=2e-2, atol=1e-3)  # inductor may fuse the tanh differently
    for a, b in zip([m.grad for m in mm], g0):
        assert rel(a, b) < 1e-2
    torch._dynamo.reset()


def _has_lowbit_cubins():
    return TL.aot_arch(CAP) is not None


@pytest.mark.skipif(not _has_lowbit_cubins(), reason="this install has no 'lowbit' AOT cubins for this GPU")
@pytest.mark.parametrize("fmt", ["nvfp4", "sign", "mixed", "fp8", "ternary"])
@pytest.mark.parametrize("case", [(16384, 2, 1024, 2048, 64, 5461), (50, 2, 6, 64, 16, 37), (12, 1, 8, 40, 24, 100)],
                         ids=["b1", "f37", "d40_r24"])
def test_aot_cubins_only(monkeypatch, fmt, case):
    if case[0] > 1000 and fmt in ("mixed", "fp8", "ternary"):
        pytest.skip("b1 runs the two uniform formats with cubins (time); the others run at the small shapes")
    """TSCT_TRITON_BACKEND=aot: every launch comes from a cubin (built with Triton 3.9 on a CPU machine)."""
    if (case[3] % 16 or case[4] % 16) and "nvfp4" in FMTS[fmt]:
        pytest.skip("NVFP4 needs d and r multiples of 16")
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    if fmt in ("mixed", "fp8", "ternary"):  # status is per format: "mixed" may be any mix, and fp8 / ternary ship no
        ok, why = TL.status(CAP, fmt)      # cubins (forced-only: Triton JIT), so AOT-only mode refuses them by name
        assert not ok and f"no cubin for {fmt} factors" in why, why
        p, ms, facs = problem(*case, fmt, pad=3, seed=5)
        go = torch.randn(case[0], case[5], device=DEV).to(torch.bfloat16)
        with pytest.raises(RuntimeError, match=fmt):
            train_call(p, facs, ms, go, impl="triton-lowbit")
        return
    assert TL.status(CAP, fmt) == (True, f"AOT cubins for {TL.aot_arch(CAP)}")
    before = dict(L.backend_counts())
    p, ms, facs = problem(*case, fmt, pad=0 if case[0] > 1000 else 3, seed=5)
    go = torch.randn(case[0], case[5], device=DEV).to(torch.bfloat16)
    y, grads = train_call(p, facs, ms, go, impl="triton-lowbit")
    after = L.backend_counts()
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert new and all(k[0] == "aot" or k in NATIVE for k in new), new
    assert {k[1] for k in new} == {"lowbit_down_fwd", "lowbit_up_fwd", "lowbit_bwd_dz", "lowbit_bwd_dx_dw"}
    if case[0] > 1000:  # b1: compare a slice of tokens with the reference (the full fp32 backward is slow)
        assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads)
        return
    want_y, want = ref_grads(p, facs, go)
    assert rel(y, want_y) < TOL
    for g, w in zip(grads[:6], want[:6]):
        assert rel(g, w) < TOL


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_jit_backend_matches_reference(monkeypatch, fmt):
    pytest.importorskip("triton")
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "jit")
    before = dict(L.backend_counts())
    p, ms, facs = problem(64, 2, 8, 256, 64, 300, fmt, seed=9)
    go = torch.randn(64, 300, device=DEV).to(torch.bfloat16)
    y, grads = train_call(p, facs, ms, go)
    new = {k for k, v in L.backend_counts().items() if v != before.get(k, 0)}
    assert new and all(k[0] == "jit" or k in NATIVE for k in new), new
    want_y, want = ref_grads(p, facs, go)
    assert rel(y, want_y) < TOL and rel(grads[0], want[0]) < TOL and rel(grads[3], want[3]) < TOL


def test_quantize_master_across_optimizer_steps():
    p, ms, _ = problem(64, 2, 8, 128, 32, 96, "nvfp4", seed=2)
    masters = [torch.nn.Parameter(m.clone()) for m in ms]
    opt = torch.optim.SGD(masters, lr=0.5)  # CPU reference run of the same loop: loss falls ~40% in 2 steps
    losses, seen = [], []
    for _ in range(3):
        facs = [quantize_master(m, "nvfp4") for m in masters]
        assert quantize_master(masters[0], "nvfp4") is facs[0]  # cached within the step
        seen.append(facs[0])
        y = run(p, facs, masters=masters)
        loss = y.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        assert all(m.grad is not None and torch.isfinite(m.grad).all() for m in masters)
        opt.step()
        losses.append(loss.item())
        with pytest.raises(ValueError, match="stale"):
            run(p, facs, masters=masters)  # the step moved the masters: the old containers are refused
    assert seen[0] is not seen[1] is not seen[2]
    assert losses[-1] < losses[0]


def test_cuda_graph_capture_of_the_op():
    p, _, facs = problem(512, 2, 64, 256, 64, 5461, "nvfp4", seed=4)
    y = run(p, facs)
    graph, yg = captured(lambda: run(p, facs))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)
