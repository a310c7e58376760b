"""Calls the installed cubins do not serve (docs/decisions/0005): fp16 activations and the forced-only low-bit formats
(fp8, ternary) have no cubins and run the same kernels through Triton JIT. Where Triton is not importable, or
``TSCT_TRITON_BACKEND=aot`` forbids JIT, the Triton paths' status says so: ``impl="auto"`` takes bmm (a counted,
warned fallback) and never raises; a forced Triton path raises naming the reason.

A fake install with sm_90a cubins of both families (an index.json, no cubin is loaded: nothing launches on the CPU),
compute capability 9.0 patched in, Triton's importability patched.
"""

from __future__ import annotations

import json

import pytest
import torch

from tsct import dispatch
from tsct.kernels import aot, launch
from tsct.kernels import triton_glu as TG
from tsct.kernels import triton_lowbit as TL
from tsct.ops import grouped_glu

NO_JIT = "no cubin for {} in this install; Triton JIT is not available"


@pytest.fixture
def sm90_install(monkeypatch, tmp_path):
    """An install with sm_90a cubins of both kernel families (index only), compute capability 9.0, no Triton,
    backend auto, fresh fallback counters; the CUDA backward dz's note left out of the reason."""
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "index.json").write_text(json.dumps(
        {"arch": "sm_90a", "families": {"glu": {}, "lowbit": {}}, "kernels": {"k": {}}}))
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    monkeypatch.setattr(launch, "triton_importable", lambda: False)
    monkeypatch.setattr(TG, "_native_dz_note", lambda cap: "")
    monkeypatch.setattr(dispatch, "device_capability", lambda device: (9, 0))
    aot._reset_for_tests()
    dispatch.reset_fallback_counts()
    yield
    aot._reset_for_tests()
    dispatch.reset_fallback_counts()


def test_status_names_what_the_cubins_lack(sm90_install, monkeypatch):
    cap = (9, 0)
    assert TG.status(cap, "bf16", "bf16") == (True, "AOT cubins for sm_90a")
    assert TG.status(cap, "fp16", "fp16") == (False, NO_JIT.format("fp16 activations"))
    assert TL.status(cap, "nvfp4", "bf16") == (True, "AOT cubins for sm_90a")
    assert TL.status(cap, "sign", "fp16") == (False, NO_JIT.format("fp16 activations"))
    assert TL.status(cap, "nvfp4", "fp32") == (False, NO_JIT.format("fp32 activations"))
    for fmt in ("fp8", "ternary"):
        assert TL.status(cap, fmt, "bf16") == (False, NO_JIT.format(f"{fmt} factors"))
    # JIT forbidden: the same calls, another reason
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    assert TG.status(cap, "fp16", "fp16") == (
        False, "TSCT_TRITON_BACKEND=aot but this install has no cubin for fp16 activations (Triton JIT runs them)")
    assert TL.status(cap, "fp8", "bf16") == (
        False, "TSCT_TRITON_BACKEND=aot but this install has no cubin for fp8 factors (Triton JIT runs them)")
    assert TG.status(cap, "bf16", "bf16")[0] and TL.status(cap, "sign", "bf16")[0]
    # with Triton: JIT serves them
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "auto")
    monkeypatch.setattr(launch, "triton_importable", lambda: True)
    assert TG.status(cap, "fp16", "fp16") == (True, "Triton JIT")
    assert TL.status(cap, "ternary", "bf16") == (True, "Triton JIT")
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "jit")
    monkeypatch.setattr(launch, "triton_importable", lambda: False)
    assert TG.status(cap, "bf16", "bf16") == (False, "TSCT_TRITON_BACKEND=jit but Triton is not importable")


def _problem(dtype, seed=0):
    """A small routed problem (2 experts, one row of padding) with fresh random values."""
    g = torch.Generator().manual_seed(seed)
    m, e, d, r, f = 9, 2, 32, 16, 24
    x = torch.randn(m, d, generator=g).to(dtype)
    offs = torch.tensor([5, 8], dtype=torch.int32)
    ws = [(torch.randn(e, d, r, generator=g) / 4).to(dtype), (torch.randn(e, d, r, generator=g) / 4).to(dtype),
          (torch.randn(e, r, f, generator=g) / 4).to(dtype)]
    return x, offs, ws


@pytest.mark.parametrize("backend", ["auto", "aot"])
def test_auto_runs_fp16_activations_on_bmm_and_counts_it(sm90_install, monkeypatch, backend):
    """fp16 x and factors on a 9.0 install without Triton (or with JIT forbidden): auto returns bmm's result, counts
    and warns the fallback once; bf16 still selects the cubins."""
    monkeypatch.setenv("TSCT_TRITON_BACKEND", backend)
    x, offs, ws = _problem(torch.float16)
    with pytest.warns(RuntimeWarning, match="triton-bf16 unavailable .*fp16 activations"):
        y = grouped_glu(x, offs, *ws)
    want = grouped_glu(x, offs, *ws, impl="bmm")
    assert y.dtype == torch.float16 and torch.equal(y, want)
    assert y[8:].abs().sum() == 0 and y[:8].abs().sum() > 0  # padding row zero, the rest computed
    reason = TG.status((9, 0), "fp16", "fp16")[1]
    assert dispatch.fallback_counts() == {(dispatch.TRITON_BF16, dispatch.BMM, reason): 1}
    assert dispatch.select("auto", (9, 0), "bf16", x_dtype="bf16") == dispatch.TRITON_BF16


def test_auto_runs_fp16_activations_with_packed_factors_on_bmm(sm90_install):
    """NVFP4 factors with fp16 x: the low-bit cubins are bf16-only, so auto takes bmm (counted) instead of raising."""
    from tsct import quant

    x, offs, ws = _problem(torch.float16, seed=1)
    packed = [quant.quantize(w.float(), "nvfp4") for w in ws]
    with pytest.warns(RuntimeWarning, match="triton-lowbit unavailable .*fp16 activations"):
        y = grouped_glu(x, offs, *packed)
    assert torch.equal(y, grouped_glu(x, offs, *packed, impl="bmm"))
    assert dispatch.fallback_counts() == {
        (dispatch.TRITON_LOWBIT, dispatch.BMM, NO_JIT.format("fp16 activations")): 1}


@pytest.mark.parametrize("fmt", ["fp8", "ternary"])
def test_forced_only_formats_run_on_bmm_from_auto_and_a_forced_impl_names_the_reason(sm90_install, fmt):
    from tsct import quant

    x, offs, ws = _problem(torch.bfloat16, seed=2)
    packed = [quant.quantize(w.float(), fmt) for w in ws]
    y = grouped_glu(x, offs, *packed)  # FORCED_ONLY: bmm is auto's first choice, no fallback
    assert torch.equal(y, grouped_glu(x, offs, *packed, impl="bmm")) and dispatch.fallback_counts() == {}
    with pytest.raises(RuntimeError, match=f"impl='triton-lowbit' cannot run on compute capability 9.0 with {fmt} "
                                           f"factors: no cubin for {fmt} factors in this install; Triton JIT is "
                                           f"not available"):
        grouped_glu(x, offs, *packed, impl="triton-lowbit")


def test_forced_fp16_raises_naming_the_reason(sm90_install):
    x, offs, ws = _problem(torch.float16, seed=3)
    with pytest.raises(RuntimeError, match="impl='triton-bf16' cannot run on compute capability 9.0 with fp16 "
                                           "factors: no cubin for fp16 activations in this install; Triton JIT is "
                                           "not available"):
        grouped_glu(x, offs, *ws, impl="triton-bf16")
