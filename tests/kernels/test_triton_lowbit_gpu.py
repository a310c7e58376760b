"""The Triton low-bit grouped GLU (path "triton-lowbit") against tsct.reference on the DEQUANTIZED factors,
on a CUDA GPU, bf16 activations. 96 passed on an H200 through Triton 3.6 JIT (2026-11-29,
archive/2026-12:docs/evidence/2026-11-29_h200_lowbit_full.log); scripts/gpu_suite.sh lowbit runs it again on the AOT cubins
(TSCT_TRITON_BACKEND=aot: every launch of the NVFP4 / sign cases has a variant, tests/kernels/test_triton_lowbit_aot.py;
the fp8 / ternary ones have no cubins and skip there) and through JIT.

Same harness as tests/kernels/test_triton_glu_gpu.py (its cases, NaN-poisoned allocator, determinism), with
the factors quantized to NVFP4 / sign / fp8 / ternary (absmean, rank-1) / mixes. The reference runs in fp32 on
the factors decoded to fp32 (same math), so the bf16 tolerance of the dense path applies. Factor-slot gradients
are the gradients w.r.t. the decoded factors (the STE gradient of the masters).

    python3 -m pytest -q tests/kernels/test_triton_lowbit_gpu.py      (scripts/gpu_suite.sh lowbit)
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

pytestmark = pytest.mark.gpu

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.kernels import triton_lowbit as TL  # noqa: E402
from _cuda_graph import gc_paused  # noqa: E402

import importlib.util  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402

import sys  # noqa: E402

_spec = importlib.util.spec_from_file_location("_tg", pathlib.Path(__file__).with_name("test_triton_glu_gpu.py"))
TG = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = TG  # dataclasses look their module up in sys.modules
_spec.loader.exec_module(TG)  # reuse its Case list, input maker and helpers (not its tests)

DEV = TG.DEV
TOL = 1e-2
NAMES = TG.NAMES
# "ternary_r1": ternary with the rank-1 scaling; "mixed_decoded": fp8 gate, rank-1 ternary up, NVFP4 down
FMTS = {"nvfp4": ("nvfp4",) * 3, "sign": ("sign",) * 3, "mixed": ("nvfp4", "sign", "nvfp4"), "fp8": ("fp8",) * 3,
        "ternary": ("ternary",) * 3, "ternary_r1": ("ternary_r1",) * 3,
        "mixed_decoded": ("fp8", "ternary_r1", "nvfp4")}
_K_MULTIPLE = {"nvfp4": 16, "sign": 8, "fp8": 1, "ternary": 4, "ternary_r1": 4}
DECODED = ("fp8", "ternary", "ternary_r1", "mixed_decoded")  # run only when forced (tsct.dispatch.FORCED_ONLY)
AOT_ONLY = os.environ.get("TSCT_TRITON_BACKEND") == "aot"


def _needs_jit(fmt):
    """The forced-only formats ship no cubins (docs/decisions/0005): with JIT forbidden they cannot run here."""
    if AOT_ONLY and fmt in DECODED:
        pytest.skip(f"{fmt} factors have no cubins (Triton JIT: stage lowbit-jit runs them)")


def _ok(c, fmt):
    k_gate, k_down = c.d, c.r
    need = max(_K_MULTIPLE[f] for f in FMTS[fmt])
    return c.dtype == torch.bfloat16 and k_gate % need == 0 and k_down % need == 0


CASES = [(c, fmt) for c in TG.CASES if c.name not in ("d4096_r4096",) for fmt in FMTS if _ok(c, fmt)]


def _quantize(p: dict, fmt: str) -> dict:
    q = dict(p)
    for key, f in zip(("w_gate", "w_up", "w_down"), FMTS[fmt]):
        if f == "ternary_r1":
            q[key] = quant.quantize(p[key].float(), "ternary", scaling="rank1")
        else:
            q[key] = quant.quantize(p[key].float(), f)
    return q


def _deq(q: dict) -> dict:
    return {k: (quant.dequantize(v, dtype=torch.float32, backend="torch") if quant.is_quantized(v) else v)
            for k, v in q.items()}


_cache: dict = {}


def results(c, fmt):
    _needs_jit(fmt)
    key = (c.name, fmt)
    if key in _cache:
        return _cache[key]
    p = TG.make_inputs(c, seed=zlib.crc32(c.name.encode()) % 10000)
    q = _quantize(p, fmt)
    ref_args = TG.args_of(_deq(q), fp32=True)
    ref = R.grouped_glu_forward(*ref_args)
    go = torch.randn(ref.shape, device=DEV).to(c.dtype)
    ref_grads = R.grouped_glu_backward(go.float(), *ref_args, [True] * 7)
    runs = []
    for _ in range(2):
        TG.poison()
        out = TL.grouped_glu_forward(*TG.args_of(q))
        TG.poison()
        grads = TL.grouped_glu_backward(go, *TG.args_of(q), [True] * 7)
        torch.cuda.synchronize()
        runs.append((out, grads))
    _cache.clear()
    _cache[key] = (p, q, ref, ref_grads, runs)
    return _cache[key]


@pytest.mark.parametrize("c,fmt", CASES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_forward(c, fmt):
    p, q, ref, _, runs = results(c, fmt)
    out = runs[0][0]
    assert out.shape == ref.shape and out.dtype == c.dtype
    assert not out.isnan().any()
    err = TG.rel_err(out, ref)
    assert err < TOL, err
    if not c.scatter and c.pad:
        assert (out[-c.pad:] == 0).all()


@pytest.mark.parametrize("c,fmt", CASES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_backward(c, fmt):
    p, q, _, ref_grads, runs = results(c, fmt)
    grads = runs[0][1]
    for i, (name, g, rg) in enumerate(zip(NAMES, grads, ref_grads)):
        if rg is None:
            assert g is None, name
            continue
        assert g is not None and tuple(g.shape) == tuple(rg.shape), name
        assert not g.isnan().any(), f"{name}: NaN (unwritten?)"
        err = TG.rel_err(g, rg)
        assert err < TOL, f"{name}: rel err {err:.3e}"
    counts = torch.diff(p["offs"], prepend=p["offs"].new_zeros(1))
    empty = counts == 0
    if empty.any():
        for i in (1, 2, 3, 4, 5):
            if grads[i] is not None:
                assert (grads[i][empty] == 0).all(), NAMES[i]
    if c.pad and grads[6] is not None:
        assert (grads[6][-c.pad:] == 0).all()


@pytest.mark.parametrize("c,fmt", CASES, ids=lambda v: v if isinstance(v, str) else v.name)
def test_deterministic(c, fmt):
    _, _, _, _, runs = results(c, fmt)
    (o1, g1), (o2, g2) = runs
    assert torch.equal(o1, o2)
    for name, a, b in zip(NAMES, g1, g2):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), name


def test_cuda_graph_capture():
    c = TG.Case("graph", T=512, k=2, E=64, d=256, r=64, f=5461, pad=3)
    p = TG.make_inputs(c, seed=1)
    q = _quantize(p, "nvfp4")
    go = torch.randn(c.T, c.f, device=DEV).to(c.dtype)
    args = TG.args_of(q)
    TL.grouped_glu_forward(*args)
    TL.grouped_glu_backward(go, *args, [True] * 7)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        g_out = TL.grouped_glu_forward(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_out, TL.grouped_glu_forward(*args))


# (format, which factors get a master): a packed factor without one is frozen and gets no gradient
STE_CASES = [("mixed", (True, False, True)), ("fp8", (True,) * 3), ("ternary", (True,) * 3),
             ("mixed_decoded", (True,) * 3)]


@pytest.mark.parametrize("fmt,with_master", STE_CASES, ids=[f for f, _ in STE_CASES])
def test_ste_masters(fmt, with_master):
    """Packed factors through ``tsct.ops.grouped_glu(impl="triton-lowbit", masters=...)``: the forward and dX
    match the reference on the dequantized factors, and each master gets the dequantized factor's dW (STE)."""
    from tsct.ops import grouped_glu

    if AOT_ONLY:  # tsct.ops asks the status, which serves "mixed" (any mix) and fp8 / ternary factors by JIT only
        pytest.skip(f"{fmt} factors through tsct.ops need Triton JIT")
    c = TG.CASES[2]
    p = TG.make_inputs(c, seed=11)
    q = _quantize(p, fmt)
    masters = [p[n].float().clone().requires_grad_(True) if want else None
               for n, want in zip(("w_gate", "w_up", "w_down"), with_master)]
    x = p["x"].clone().requires_grad_(True)
    out = grouped_glu(x, p["offs"], q["w_gate"], q["w_up"], q["w_down"], p["s_gate"], p["s_up"],
                      row_weight=p["row_weight"], gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"],
                      num_out_rows=p["num_out_rows"], impl="triton-lowbit", masters=masters)
    go = torch.randn_like(out)
    out.backward(go)
    ref_args = TG.args_of(_deq(q), fp32=True)
    assert TG.rel_err(out, R.grouped_glu_forward(*ref_args)) < TOL
    ref_grads = R.grouped_glu_backward(go.float(), *ref_args, [True] * 7)
    assert TG.rel_err(x.grad, ref_grads[0]) < TOL
    for i, m in enumerate(masters):
        if m is not None:
            assert TG.rel_err(m.grad, ref_grads[1 + i]) < TOL, i


@pytest.mark.parametrize("fmt", ["fp8", "ternary", "ternary_r1"])
def test_nan_codes_decode_to_nan(fmt):
    """A non-finite master element gets the format's NaN code (fp8 0x7F, ternary 0b10; rank-1 ternary keeps its
    scale_k finite): the kernels' decode gives NaN exactly where the reference on the dequantized factors does
    (the outputs of that expert's rows in that column), and the same values elsewhere."""
    _needs_jit(fmt)
    c = TG.CASES[2]  # f37_empty: expert 1 has 30 rows
    p = TG.make_inputs(c, seed=13)
    p["w_down"] = p["w_down"].clone()
    p["w_down"][1, 3, 5] = float("nan")
    q = _quantize(p, fmt)
    ref = R.grouped_glu_forward(*TG.args_of(_deq(q), fp32=True))
    out = TL.grouped_glu_forward(*TG.args_of(q))
    nan = ref.isnan()
    assert nan.any() and not nan.all()
    assert torch.equal(out.isnan(), nan)
    assert TG.rel_err(out[~nan], ref[~nan]) < TOL


def test_status():
    assert TL.status((9, 0), "nvfp4")[0]
    for fmt in ("fp8", "ternary"):  # no cubins: Triton JIT (importable here), refused when JIT is forbidden
        ok, why = TL.status((9, 0), fmt)
        assert (ok, why) == ((False, f"TSCT_TRITON_BACKEND=aot but this install has no cubin for {fmt} factors "
                                     f"(Triton JIT runs them)") if AOT_ONLY else (True, "Triton JIT"))
    assert not TL.status((7, 5), "nvfp4")[0]


def test_tile_decode_exhaustive():
    """The NVFP4 tile decoder (every E2M1 code at every nibble position under every UE4M3 block scale), the FP8 and
    the ternary ones (every byte at every position): the bf16 pair decoders and the fp32 decoders all give the exact
    values' bits (Triton JIT; the interpreter gets the bf16 ones' multiplies wrong)."""
    import _tools

    mismatches = _tools.load("triton_lowbit_decode_check").tile_mismatches("cuda")
    assert mismatches == dict.fromkeys(mismatches, 0)
