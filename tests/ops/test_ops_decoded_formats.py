"""FP8 and ternary factors through ``tsct.ops.grouped_glu``: decoded for the ``bmm`` and ``reference`` paths, sent to
``bmm`` by every dispatch row (triton-lowbit reads them only when forced: ``dispatch.FORCED_ONLY``), refused by the
other kernel paths, trained through masters."""

from __future__ import annotations

import pytest
import torch

from tsct import dispatch, quant
from tsct.ops import grouped_glu, quantize_master
from tsct.ops.grouped_glu import _storage_format
from _glu_oracle import make_problem, oracle_forward, rel_err

NAMES = ("w_gate", "w_up", "w_down")
GPU_CAPS = [(8, 0), (9, 0), (10, 0), (12, 0), (12, 1)]


def _problem(seed=0):
    return make_problem(tokens=12, topk=2, experts=4, d=32, r=16, f=21, empty=(1,), pad_rows=2, seed=seed)


def _call(p, facs, **kw):
    return grouped_glu(p["x"], p["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                       gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"], **kw)


FORMAT_SETS = [("fp8",) * 3, ("ternary",) * 3, ("fp8", "ternary", "nvfp4"), ("dense", "fp8", "sign")]


@pytest.mark.parametrize("fmts", FORMAT_SETS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("impl", ["auto", "bmm", "reference"])
def test_packed_factors_equal_their_decoded_values(fmts, impl):
    p = _problem()
    facs = [p[n] if f == "dense" else quant.quantize(p[n], f, backend="torch") for n, f in zip(NAMES, fmts)]
    # what the op decodes, with the same strides: storage order for bmm, contiguous for the reference
    dense = [quant.dequantize(w, torch.float32, contiguous=impl == "reference") for w in facs]
    y = _call(p, facs, impl=impl)
    assert torch.equal(y, _call(p, dense, impl="bmm" if impl == "auto" else impl))
    args = {**p, **dict(zip(NAMES, dense))}
    want = oracle_forward(*(args[k] for k in ("x", "offs", *NAMES, "s_gate", "s_up", "row_weight", "gather_idx",
                                               "scatter_idx", "num_out_rows", "expert_of_row")))
    assert rel_err(y, want) < 1e-5


def test_storage_format_of_mixes():
    p = _problem()
    q = {f: quant.quantize(p["w_gate"], f) for f in quant.FORMATS}
    assert _storage_format([q["fp8"]] * 3) == "fp8" and _storage_format([q["ternary"]] * 3) == "ternary"
    assert _storage_format([q["nvfp4"], q["sign"], p["w_gate"]]) == "mixed"  # what triton-lowbit reads
    for other in (q["nvfp4"], q["sign"], p["w_gate"], q["ternary"]):
        assert _storage_format([q["fp8"], other, other]) == dispatch.MIXED_DECODED
    assert _storage_format([q["ternary"], q["nvfp4"], q["nvfp4"]]) == dispatch.MIXED_DECODED


@pytest.mark.parametrize("cap", [None, *GPU_CAPS, (13, 0)])
@pytest.mark.parametrize("fmt", ["fp8", "ternary", dispatch.MIXED_DECODED])
@pytest.mark.parametrize("act", ["bf16", "nvfp4"])
def test_every_row_sends_them_to_bmm(cap, fmt, act):
    assert dispatch.preferences(cap, fmt, act) == [dispatch.BMM]
    d = dispatch.decide(cap, fmt, act)
    assert d.path == dispatch.BMM and not d.skipped
    if cap in GPU_CAPS:
        assert "decoded to bf16 once per call" in d.reason and "only when forced" in d.reason


@pytest.mark.parametrize("fmt", ["fp8", "ternary", dispatch.MIXED_DECODED])
def test_triton_lowbit_takes_them_only_when_forced(monkeypatch, fmt):
    """Where triton-lowbit can run, auto still takes bmm for them and ``impl="triton-lowbit"`` takes the kernels."""
    ok = dispatch.Status(True, "runs here")
    monkeypatch.setitem(dispatch._STATUS, dispatch.TRITON_LOWBIT, lambda cap, f, x: ok)
    assert fmt in dispatch.FORCED_ONLY[dispatch.TRITON_LOWBIT]
    for cap in GPU_CAPS:
        assert dispatch.TRITON_LOWBIT not in dispatch.preferences(cap, fmt)
        assert dispatch.select("auto", cap, fmt, first_use={dispatch.TRITON_LOWBIT: ok}) == dispatch.BMM
        assert dispatch.select(dispatch.TRITON_LOWBIT, cap, fmt, first_use={dispatch.TRITON_LOWBIT: ok}) == \
            dispatch.TRITON_LOWBIT
    from tsct.kernels import triton_lowbit
    _, why = triton_lowbit.status((9, 0), fmt)
    assert "not served" not in why, why


@pytest.mark.parametrize("fmt", ["fp8", "ternary", dispatch.MIXED_DECODED])
@pytest.mark.parametrize("path", [dispatch.TRITON_BF16, dispatch.SM120_FP4])
def test_kernel_paths_refuse_them(fmt, path):
    for cap in GPU_CAPS:
        st = dispatch.status(path, cap, fmt)
        assert not st.ok and fmt in st.reason, (cap, st)
    act = "nvfp4" if path == dispatch.SM120_FP4 else "bf16"
    with pytest.raises(RuntimeError, match=f"cannot run on compute capability 9.0 with {fmt} factors"):
        dispatch.select(path, (9, 0), fmt, act)


def test_forcing_a_kernel_path_on_the_cpu_is_a_clear_error():
    p = _problem()
    facs = [quant.quantize(p[n], "ternary") for n in NAMES]
    with pytest.raises(RuntimeError, match="impl='triton-lowbit' cannot run"):
        _call(p, facs, impl="triton-lowbit")


@pytest.mark.parametrize("fmt", ["fp8", "ternary"])
def test_ste_through_masters_on_bmm(fmt):
    """Masters receive the gradient with respect to the decoded factor (straight-through estimator)."""
    p = _problem(seed=1)
    ms = [p[n].clone().requires_grad_(True) for n in NAMES]
    facs = [quantize_master(m, fmt, backend="torch") for m in ms]
    assert quantize_master(ms[0], fmt, backend="torch") is facs[0]  # cached per master version
    x = p["x"].clone().requires_grad_(True)
    y = grouped_glu(x, p["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                    gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                    masters=ms)
    go = torch.randn_like(y)
    y.backward(go)
    leaves = [quant.dequantize(w, torch.float32, contiguous=False).detach().requires_grad_(True) for w in facs]
    xr = p["x"].clone().requires_grad_(True)
    yr = grouped_glu(xr, p["offs"], *leaves, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                     gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                     impl="bmm")
    yr.backward(go)
    assert torch.equal(y.detach(), yr.detach())
    for m, leaf in zip(ms, leaves):
        assert torch.equal(m.grad, leaf.grad) and m.grad.abs().sum() > 0
    assert torch.equal(x.grad, xr.grad)
