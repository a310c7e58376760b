"""The ctypes wrappers of the CUDA low-bit projections (``tsct.native.glu_down_fwd_lowbit`` /
``glu_up_fwd_lowbit``) and the dispatch's storage predicate, on the CPU.

The kernels need a GPU (tests/native/test_glu_lowbit_native_gpu.py); here the wrappers run with the device check
and the library call replaced by a recorder, so what they validate and what they pass to the C entry (entry name,
argument order, pointers, sizes, the outputs' shapes) is checked for every format without one.
"""

from __future__ import annotations

import pytest
import torch

from tsct import quant
from tsct.kernels.triton_lowbit import glu as L
from tsct.native import _ops

E, D, R, F, M = 3, 128, 64, 40, 10


@pytest.fixture
def calls(monkeypatch):
    rec = []
    monkeypatch.setattr(_ops, "_cuda", lambda name, t, device=None: None)
    monkeypatch.setattr(_ops, "_call", lambda fn, device, *args: rec.append((fn, args)))
    return rec


# (the C entry's format, quantize options): ternary_r1 is the ternary entry with the rank-1 scaling's scale_k
FMTS = {"nvfp4": ("nvfp4", {}), "sign": ("sign", {}), "fp8": ("fp8", {}), "ternary": ("ternary", {}),
        "ternary_r1": ("ternary", {"scaling": "rank1"})}


def packed(w, fmt):
    name, opts = FMTS[fmt]
    return tuple(L._factor_args("w", quant.quantize(w, name, **opts), torch.bfloat16)[1])


def ptr(a):
    return a.value if a is not None and hasattr(a, "value") else a


def ptrs(ts):
    return [t.data_ptr() if t is not None else None for t in ts]


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("save", [False, True])
@pytest.mark.parametrize("scales", [None, torch.float32, torch.bfloat16], ids=["no_scales", "fp32", "bf16"])
def test_down_wrapper_marshals(calls, fmt, save, scales):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, D, generator=g).bfloat16()
    gate, up = packed(torch.randn(E, D, R, generator=g), fmt), packed(torch.randn(E, D, R, generator=g), fmt)
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)
    rw = torch.rand(M, generator=g)
    sg = su = None
    if scales is not None:
        sg, su = (torch.rand(E, R, generator=g).to(scales) for _ in range(2))
    z, hg, hu = _ops.glu_down_fwd_lowbit(x, offs, cum, gate, up, fmt=FMTS[fmt][0], m=M, max_tiles=5, s_gate=sg,
                                         s_up=su,
                                         row_weight=rw, save=save)
    assert z.shape == (M, R) and z.dtype == torch.bfloat16
    assert (hg is not None) == save and (hg is None or (hg.shape == (M, R) and hg.dtype == torch.float32))
    (fn, args), = calls
    assert fn == f"tsct_glu_down_fwd_{FMTS[fmt][0]}"
    assert len(args) == 24  # the C entry's 25 arguments less the stream (added by _call)
    v = [ptr(a) for a in args]
    assert v[:10] == [x.data_ptr(), M, D, None, offs.data_ptr(), cum.data_ptr(), E, M, D, 64]
    assert v[10:16] == ptrs((*gate, *up))
    assert (v[11] is None) == (fmt in ("fp8", "ternary"))  # no second storage tensor: a null pointer
    # s_gate, s_up as given (no copy), then scales_bf16
    want = [None, None, 0] if sg is None else [sg.data_ptr(), su.data_ptr(), int(scales == torch.bfloat16)]
    assert v[16:19] == want
    assert v[19] == rw.data_ptr() and v[20] == z.data_ptr() and v[23] == 5
    assert v[21:23] == ([hg.data_ptr(), hu.data_ptr()] if save else [None, None])


def test_down_wrapper_rejects_mixed_or_other_scale_dtypes(calls):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, D, generator=g).bfloat16()
    nv = packed(torch.randn(E, D, R, generator=g), "nvfp4")
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)
    s32, s16 = torch.rand(E, R, generator=g), torch.rand(E, R, generator=g).bfloat16()
    with pytest.raises(TypeError, match="s_gate and s_up must share a dtype"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, nv, nv, fmt="nvfp4", m=M, max_tiles=5, s_gate=s32, s_up=s16)
    with pytest.raises(TypeError, match="s_up must have dtype"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, nv, nv, fmt="nvfp4", m=M, max_tiles=5, s_gate=s32, s_up=s32.half())
    assert not calls


@pytest.mark.parametrize("fmt", list(FMTS))
def test_up_wrapper_marshals(calls, fmt):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(M, R, generator=g).bfloat16()
    wd = packed(torch.randn(E, R, F, generator=g), fmt)
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)
    y = torch.empty(M, 40, dtype=torch.bfloat16)
    out = _ops.glu_up_fwd_lowbit(z, offs, cum, wd, y, fmt=FMTS[fmt][0], f=F, max_tiles=5)
    assert out is y
    (fn, args), = calls
    assert fn == f"tsct_glu_up_fwd_{FMTS[fmt][0]}"
    v = [ptr(a) for a in args]
    assert v == [z.data_ptr(), M, offs.data_ptr(), cum.data_ptr(), E, F, 64, *ptrs(wd), None, y.data_ptr(), 40, 5]


def test_storage_shapes_follow_the_format(calls):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(M, D, generator=g).bfloat16()
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)
    nv = packed(torch.randn(E, D, R, generator=g), "nvfp4")
    sg = packed(torch.randn(E, D, R, generator=g), "sign")
    with pytest.raises(ValueError, match=r"gate\[0\] must have shape .*bits"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, nv, sg, fmt="sign", m=M, max_tiles=5)
    with pytest.raises(TypeError, match=r"up\[1\] must have dtype"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, nv, (nv[0], sg[1][:, :8].contiguous(), nv[2]), fmt="nvfp4", m=M,
                                 max_tiles=5)
    with pytest.raises(ValueError, match="fmt must be one of"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, nv, nv, fmt="int4", m=M, max_tiles=5)
    f8 = packed(torch.randn(E, D, R, generator=g), "fp8")
    tr = packed(torch.randn(E, D, R, generator=g), "ternary")
    t1 = packed(torch.randn(E, D, R, generator=g), "ternary_r1")
    with pytest.raises(ValueError, match=r"gate\[0\] must have shape .*E4M3 code bytes"):  # ternary codes as fp8's
        _ops.glu_down_fwd_lowbit(x, offs, cum, tr, f8, fmt="fp8", m=M, max_tiles=5)
    with pytest.raises(ValueError, match=r"up\[1\] must be None \(fp8"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, f8, (f8[0], t1[1], f8[2]), fmt="fp8", m=M, max_tiles=5)
    with pytest.raises(ValueError, match=r"up\[1\] must have shape .*scale_k"):  # scale_k over K = d
        _ops.glu_down_fwd_lowbit(x, offs, cum, t1, (t1[0], t1[1][:, :64].contiguous(), t1[2]), fmt="ternary", m=M,
                                 max_tiles=5)
    with pytest.raises(ValueError, match="both given .* or both None"):  # one scaling per kernel
        _ops.glu_down_fwd_lowbit(x, offs, cum, t1, tr, fmt="ternary", m=M, max_tiles=5)
    with pytest.raises(TypeError, match=r"gate\[2\] must have dtype"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, (tr[0], None, tr[2].double()), tr, fmt="ternary", m=M, max_tiles=5)
    buf = torch.zeros(t1[1].numel() * 4 + 16, dtype=torch.uint8)
    k_off = buf[4: 4 + t1[1].numel() * 4].view(torch.float32).view(t1[1].shape)
    with pytest.raises(ValueError, match=r"gate\[1\] \(scale_k\) must be 16-byte aligned"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, (t1[0], k_off, t1[2]), t1, fmt="ternary", m=M, max_tiles=5)
    wd = packed(torch.randn(E, R, F, generator=g), "fp8")
    with pytest.raises(ValueError, match=r"w_down\[0\] must have shape"):
        _ops.glu_up_fwd_lowbit(torch.randn(M, R).bfloat16(), offs, cum, (wd[0][:, :, :32].contiguous(), None, wd[2]),
                               torch.empty(M, 40, dtype=torch.bfloat16), fmt="fp8", f=F, max_tiles=5)
    assert not calls


@pytest.mark.parametrize("fmt", list(FMTS))
def test_validate_false_marshals_the_same_and_skips_checks(calls, fmt):
    """validate=False (the dispatch's call) passes the C entries the same arguments and skips the Python
    checks (a float32 x is passed through: the C entry's own checks are what remain), but not the fmt check."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(M, D, generator=g).bfloat16()
    gate, up = packed(torch.randn(E, D, R, generator=g), fmt), packed(torch.randn(E, D, R, generator=g), fmt)
    wd = packed(torch.randn(E, R, F, generator=g), fmt)
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)
    out = (torch.empty(M, R, dtype=torch.bfloat16), torch.empty(M, R), torch.empty(M, R))
    for validate in (True, False):
        _ops.glu_down_fwd_lowbit(x, offs, cum, gate, up, fmt=FMTS[fmt][0], m=M, max_tiles=5, save=True, out=out,
                                 validate=validate)
        _ops.glu_up_fwd_lowbit(out[0], offs, cum, wd, torch.empty(M, 40, dtype=torch.bfloat16), fmt=FMTS[fmt][0],
                               f=F, max_tiles=5, validate=validate)
    (d1, a1), (u1, b1), (d2, a2), (u2, b2) = calls
    assert (d1, u1) == (d2, u2) == (f"tsct_glu_down_fwd_{FMTS[fmt][0]}", f"tsct_glu_up_fwd_{FMTS[fmt][0]}")
    assert [ptr(a) for a in a1] == [ptr(a) for a in a2]
    assert [ptr(a) for a in b1][:-4] == [ptr(a) for a in b2][:-4]  # y differs (a new tensor each call)
    with pytest.raises(TypeError, match="x must have dtype"):
        _ops.glu_down_fwd_lowbit(x.float(), offs, cum, gate, up, fmt=FMTS[fmt][0], m=M, max_tiles=5)
    _ops.glu_down_fwd_lowbit(x.float(), offs, cum, gate, up, fmt=FMTS[fmt][0], m=M, max_tiles=5,
                             out=out[:1] + (None, None), validate=False)
    with pytest.raises(ValueError, match="fmt must be one of"):
        _ops.glu_down_fwd_lowbit(x, offs, cum, gate, up, fmt="int8", m=M, max_tiles=5, validate=False)
    with pytest.raises(ValueError, match="fmt must be one of"):
        _ops.glu_up_fwd_lowbit(out[0], offs, cum, wd, torch.empty(M, 40, dtype=torch.bfloat16), fmt="int4", f=F,
                               max_tiles=5, validate=False)


def test_dispatch_storage_predicate(monkeypatch):
    """The CUDA projections take a format where the dispatch has their row (sm_90a; ``TSCT_CUDA_KERNELS`` turns it off)
    and its storage is aligned as they read it: NVFP4 16-byte codes, sign 8-byte bits and 16-byte a, fp8 and ternary
    16-byte codes (ternary's rank-1 scale_k 16-byte too)."""
    from tsct import config

    monkeypatch.setattr(config, "cuda_kernels", "auto")
    g = torch.Generator().manual_seed(3)
    sm90, sm120 = (9, 0), (12, 0)
    nv = list(packed(torch.randn(E, D, R, generator=g), "nvfp4"))
    sg = list(packed(torch.randn(E, D, R, generator=g), "sign"))
    for kernel in ("lowbit_down_fwd", "lowbit_up_fwd"):
        assert L._native_packed(kernel, sm90, L.NVFP4, nv, nv)
        assert L._native_packed(kernel, sm90, L.SIGN, sg)
        assert not L._native_packed(kernel, sm120, L.NVFP4, nv, nv)  # no row for sm_120
        assert not L._native_packed(kernel, (8, 9), L.SIGN, sg)  # nor for a JIT arch
    buf = torch.zeros(sg[1].numel() * 4 + 16, dtype=torch.uint8)
    a_off = buf[4: 4 + sg[1].numel() * 4].view(torch.float32).view(sg[1].shape)
    assert a_off.data_ptr() % 16 == 4
    assert not L._native_packed("lowbit_down_fwd", sm90, L.SIGN, [sg[0], a_off, sg[2]])
    assert not L._native_packed("lowbit_down_fwd", sm90, L.DENSE, [torch.zeros(4)])
    for fmt, code in (("fp8", L.FP8), ("ternary", L.TERNARY), ("ternary_r1", L.TERNARY_R1)):
        st = list(packed(torch.randn(E, D, R, generator=g), fmt))
        assert L.factor_format(quant.quantize(torch.randn(E, D, R), *FMTS[fmt][:1], **FMTS[fmt][1])) == code
        assert L._native_packed("lowbit_up_fwd", sm90, code, st, st)
        assert not L._native_packed("lowbit_up_fwd", sm120, code, st, st)
        buf = torch.zeros(st[0].numel() + 16, dtype=torch.uint8)
        c_off = buf[8: 8 + st[0].numel()].view(st[0].shape)
        assert c_off.data_ptr() % 16 == 8 and not L._native_packed("lowbit_up_fwd", sm90, code, [c_off, st[1], st[2]])
        if st[1] is not None:
            buf = torch.zeros(st[1].numel() * 4 + 16, dtype=torch.uint8)
            k_off = buf[4: 4 + st[1].numel() * 4].view(torch.float32).view(st[1].shape)
            assert not L._native_packed("lowbit_up_fwd", sm90, code, [st[0], k_off, st[2]])
    # the developer switch: rows off by name, or all
    monkeypatch.setattr(config, "cuda_kernels", "lowbit_up_fwd")
    assert L._native_packed("lowbit_up_fwd", sm90, L.NVFP4, nv) and not L._native_packed("lowbit_down_fwd", sm90,
                                                                                          L.NVFP4, nv, nv)
    monkeypatch.setattr(config, "cuda_kernels", "none")
    assert not L._native_packed("lowbit_up_fwd", sm90, L.NVFP4, nv)


def test_int64_offs_rejected_by_name():
    """The module's direct entry points (not re-validated by tsct.ops) name int64 offs instead of handing them to
    kernels that read int32 (the CUDA ones run without their wrappers' checks)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(M, D, generator=g).bfloat16()
    wg, wu = (quant.quantize(torch.randn(E, D, R, generator=g), "nvfp4") for _ in range(2))
    wd = quant.quantize(torch.randn(E, R, F, generator=g), "nvfp4")
    offs = torch.tensor([3, 3, M], dtype=torch.int64)
    with pytest.raises(TypeError, match="offs must be int32"):
        L.grouped_glu_forward(x, offs, wg, wu, wd)
    with pytest.raises(TypeError, match="offs must be int32"):
        L.down_forward(x, offs, wg, wu)
    with pytest.raises(TypeError, match="offs must be int32"):
        L.grouped_glu_backward(torch.zeros(M, F), x, offs, wg, wu, wd, None, None, None, None, None, None,
                               [True] + [False] * 6)


def test_stream_capture_id_names_a_bad_stream():
    with pytest.raises(TypeError, match="stream must be a torch.cuda.Stream"):
        _ops.stream_capture_id(0)


def test_sizes_out_and_fmt_rejected_by_name(calls):
    """m, max_tiles and f are ints >= 0 (f >= 1), offs is 1-D, out a 3-tuple and fmt a format name: each refused by
    name before the library call (the C entry got a float or negative grid bound, or torch a negative size)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(M, D, generator=g).bfloat16()
    f8 = packed(torch.randn(E, D, R, generator=g), "fp8")
    wd = packed(torch.randn(E, R, F, generator=g), "ternary")
    z, y = torch.randn(M, R, generator=g).bfloat16(), torch.empty(M, 40, dtype=torch.bfloat16)
    offs = torch.tensor([3, 3, M], dtype=torch.int32)
    cum = torch.tensor([1, 1, 2], dtype=torch.int32)

    def down(**kw):
        args = dict(fmt="fp8", m=M, max_tiles=5) | kw
        return _ops.glu_down_fwd_lowbit(x, args.pop("offs", offs), cum, f8, f8, **args)

    def up(**kw):
        args = dict(fmt="ternary", f=F, max_tiles=5) | kw
        return _ops.glu_up_fwd_lowbit(z, args.pop("offs", offs), cum, wd, y, **args)

    for bad in (-1, 2.5, None, True, torch.tensor(5)):
        with pytest.raises(ValueError, match="max_tiles must be an int >= 0"):
            down(max_tiles=bad)
        with pytest.raises(ValueError, match="max_tiles must be an int >= 0"):
            up(max_tiles=bad)
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="m must be an int >= 0"):
            down(m=bad)
    with pytest.raises(ValueError, match="f must be a positive int"):
        up(f=True)
    for fn in (down, up):
        with pytest.raises(ValueError, match=r"offs must be 1-D"):
            fn(offs=offs[:, None])
        with pytest.raises(ValueError, match=r"offs must be 1-D"):
            fn(offs=offs[2])
        with pytest.raises(ValueError, match="fmt must be one of"):
            fn(fmt=["fp8"])
    with pytest.raises(TypeError, match=r"out must be a tuple \(z, hg, hu\)"):
        down(out=(torch.empty(M, R, dtype=torch.bfloat16), None))
    assert not calls
    down(m=0, max_tiles=0)  # nothing to do: no call, an empty z
    assert not calls
