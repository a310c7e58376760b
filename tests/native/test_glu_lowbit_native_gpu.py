"""The CUDA low-bit projections (csrc/glu/down_nvfp4.cu, up_nvfp4.cu: ``tsct.native.glu_down_fwd_lowbit``,
``glu_up_fwd_lowbit``) on a GPU, for NVFP4, sign, FP8 and ternary (absmean and rank-1 scaling) factors.

Each case: fresh random inputs, factors of the format from ``tsct.quant``, the caching allocator poisoned with NaN
before the call and the outputs passed in NaN-filled (``out=``). hg, hu are compared with x @ W_hat in fp64 (bf16 operands and exact decoded weights, fp32
accumulation: relative Frobenius error ~1e-6, tolerance 1e-4; sign: +-a[k] is rounded to bf16 as on the
Triton path, ~1e-3 against the fp32 dequantized factor, tolerance 1e-2, and 1e-4 against the Triton kernel), z with the fp64 GLU of the reference
(one bf16 rounding: tolerance 1e-2), and both with the Triton kernel ``lowbit_down_fwd`` on the same inputs.
Rows at or past offs[-1] stay unwritten (NaN poison survives); a second run gives the same bits.
Shapes: experts with 0, 1, 7, 63, 64, 65 and 150 rows (partial n8 tiles, several 64-row tiles), gather or
not, scales and row weights or not, d = 64 and 2048, a NaN x row and a NaN block scale (0x7F).
Up projection: y against (z @ W_hat) * row_weight in fp64 (one bf16 rounding: tolerance 1e-2) and against the
Triton kernel ``lowbit_up_fwd``; pad columns [f, ldy) zero, rows past offs[-1] unwritten, same bits twice; f = 5461,
37, 64 and 200 (odd, partial 64-column steps), experts with 0 to 150 rows, a NaN z row.
Also: the low-bit forward takes these kernels where the dispatch has their rows (``tsct.dispatch.CUDA_KERNELS``;
backend counts), and bad arguments raise errors that name them. FP8 and ternary: products whose fp32 sums are
exact (small integer x, codes of few significant bits) give the Triton kernels' bits (hg, hu and y: the same
decoded values and scale multiplies; only the summation order differs), and the NaN codes (fp8 0x7F / 0xFF,
ternary 0b10) poison exactly their rank / column.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import tsct  # noqa: E402
from tsct import config, native, quant  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_lowbit import glu as L  # noqa: E402

if not native.available():
    pytest.skip(f"native library not available: {native.load_error()}", allow_module_level=True)

DEV = torch.device("cuda")
R = 64


@contextlib.contextmanager
def triton_only():
    """The Triton kernels, not their CUDA rows of the dispatch (``tsct.config.cuda_kernels``), inside the block."""
    saved = config.cuda_kernels
    config.cuda_kernels = "none"
    try:
        yield
    finally:
        config.cuda_kernels = saved


def native_on(kernel: str, q) -> bool:
    """The dispatch has the CUDA row of the Triton kernel ``kernel`` for q's format on this GPU."""
    return C.cuda_kernel(kernel, C.device_capability(DEV), L._FMT_NAMES[L.factor_format(q)])


def poison() -> None:
    blob = torch.empty(min(int(torch.cuda.mem_get_info()[0] * 0.5), 8 << 30), dtype=torch.uint8, device=DEV)
    blob.fill_(0xFF)  # NaN in fp32 and bf16
    del blob


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# the formats the kernels take (ternary_r1: the ternary entry with the rank-1 scaling's scale_k)
FMTS = ["nvfp4", "sign", "fp8", "ternary", "ternary_r1"]
_QUANT = {"ternary_r1": ("ternary", {"scaling": "rank1"})}


def qz(w, fmt):
    """w quantized to ``fmt`` (a name of FMTS)."""
    name, opts = _QUANT.get(fmt, (fmt, {}))
    return quant.quantize(w, name, **opts)


def native_fmt(fmt):
    """The C entry's format name of ``fmt``."""
    return _QUANT.get(fmt, (fmt,))[0]


def make(counts, d, pad=0, gather=True, scales=True, rw=True, seed=0, fmt="nvfp4"):
    g = torch.Generator().manual_seed(seed)
    e, mv = len(counts), sum(counts)
    m = mv + pad
    t = max(m, 1) + 5
    x = torch.randn(t, d, generator=g).bfloat16()
    gidx = torch.randint(0, t, (m,), generator=g) if gather else None
    wg = torch.randn(e, d, R, generator=g) * 0.05
    wu = torch.randn(e, d, R, generator=g) * 0.05
    wg[0, :16, 3] *= 1e-3  # a block with a small scale (UE4M3 subnormal range)
    qg, qu = qz(wg.to(DEV), fmt), qz(wu.to(DEV), fmt)
    p = dict(fmt=fmt, x=x.to(DEV), offs=torch.tensor(counts).cumsum(0).to(torch.int32).to(DEV), qg=qg, qu=qu, m=m,
             gidx=gidx.to(DEV) if gather else None,
             sg=(torch.rand(e, R, generator=g) + 0.5).to(DEV) if scales else None,
             su=(torch.rand(e, R, generator=g) + 0.5).to(DEV) if scales else None,
             rw=torch.rand(m, generator=g).to(DEV) if rw else None)
    return p


def args(q):
    """The packed storage the kernels take (the dispatch's own ``_factor_args``): NVFP4 (codes, scale bytes,
    s_enc), sign (bits, a, b)."""
    return tuple(L._factor_args("w", q, torch.bfloat16)[1])


def run_native(p, save):
    """The kernel into NaN-filled outputs (``out=``): an element it does not write stays NaN."""
    cum = C.tile_cum(p["offs"], native.GLU_DOWN_TILE)
    e, m = p["offs"].shape[0], p["m"]
    out = (torch.full((m, R), float("nan"), device=DEV, dtype=torch.bfloat16),
           torch.full((m, R), float("nan"), device=DEV) if save else None,
           torch.full((m, R), float("nan"), device=DEV) if save else None)
    return native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, args(p["qg"]), args(p["qu"]),
                                     fmt=native_fmt(p["fmt"]), m=m, max_tiles=-(-m // 64) + e,
                                     gather_idx=p["gidx"], s_gate=p["sg"],
                                     s_up=p["su"], row_weight=p["rw"] if save else None, save=save, out=out)


def reference(p, save):
    """fp64: hg, hu = x_rows @ W_hat; z = silu(hg s_g) (hu s_u) [* rw]."""
    offs = p["offs"].cpu().tolist()
    mv = offs[-1] if offs else 0
    xr = (p["x"][p["gidx"]] if p["gidx"] is not None else p["x"][: p["m"]]).double()
    wg = quant.dequantize(p["qg"], dtype=torch.float32, backend="torch").double()
    wu = quant.dequantize(p["qu"], dtype=torch.float32, backend="torch").double()
    hg = torch.zeros(mv, R, dtype=torch.float64, device=DEV)
    hu = torch.zeros_like(hg)
    lo = 0
    for e, hi in enumerate(offs):
        hg[lo:hi] = xr[lo:hi] @ wg[e]
        hu[lo:hi] = xr[lo:hi] @ wu[e]
        lo = hi
    eidx = torch.repeat_interleave(torch.arange(len(offs), device=DEV),
                                   torch.diff(p["offs"].long(), prepend=p["offs"].new_zeros(1).long()))
    gv = hg * p["sg"].double()[eidx] if p["sg"] is not None else hg
    uv = hu * p["su"].double()[eidx] if p["su"] is not None else hu
    z = gv * torch.sigmoid(gv) * uv
    if save and p["rw"] is not None:
        z = z * p["rw"][:mv].double()[:, None]
    return hg, hu, z


CASES = [
    ("mixed_d2048", [0, 1, 7, 63, 64, 65, 150, 0, 32], 2048, 3, True, True, True),
    ("d64_noscale", [5, 0, 64, 1], 64, 0, False, False, False),
    ("b1_like", [33, 31, 29, 40, 0, 35, 27, 33] * 4, 2048, 0, True, True, True),
    ("one_expert_many_rows", [300], 256, 2, True, True, False),
]


# hg, hu against the fp32 dequantized factors (sign, rank-1 ternary: a / q * scale_k rounded to bf16; fp8 and
# absmean ternary decode exactly)
HTOL = {"nvfp4": 1e-4, "sign": 1e-2, "fp8": 1e-4, "ternary": 1e-4, "ternary_r1": 1e-2}
# z / y against the Triton kernel (same decoded weights and scales, another fp32 accumulation order, one bf16
# rounding each): sign and the newer formats tighter, so that a misplaced a[k] (~1 % off at large f) cannot hide
TTOL = {"nvfp4": 1e-2, "sign": 5e-3, "fp8": 5e-3, "ternary": 5e-3, "ternary_r1": 5e-3}


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("save", [False, True], ids=["plain", "save"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_against_reference_and_triton(case, save, fmt):
    _, counts, d, pad, gather, scales, rw = case
    p = make(counts, d, pad, gather, scales, rw, seed=len(counts) + d, fmt=fmt)
    mv = sum(counts)
    poison()
    z, hg, hu = run_native(p, save)
    torch.cuda.synchronize()
    rhg, rhu, rz = reference(p, save)
    assert z.dtype == torch.bfloat16 and z.shape == (p["m"], R)
    if mv:
        assert torch.isfinite(z[:mv]).all()
        assert rel(z[:mv], rz) < 1e-2
    if pad:
        assert torch.isnan(z[mv:].float()).all()  # padding rows never written
    if save:
        assert rel(hg[:mv], rhg) < HTOL[fmt] and rel(hu[:mv], rhu) < HTOL[fmt]
        if pad:
            assert torch.isnan(hg[mv:]).all() and torch.isnan(hu[mv:]).all()
    # the Triton kernel on the same inputs (forced: the dispatch would pick the CUDA kernel on sm_90)
    tcfg = C.tile_config(C.device_capability(DEV))
    zt = torch.empty_like(z)
    hgt = torch.empty_like(hg) if save else None
    hut = torch.empty_like(hu) if save else None
    pg, pu = list(args(p["qg"])), list(args(p["qu"]))
    e = p["offs"].shape[0]
    fc = L.factor_format(p["qg"])
    with triton_only():
        bm = tcfg.shared.bm
        L._down(p["x"], p["gidx"], p["offs"], C.tile_cum(p["offs"], bm), -(-p["m"] // bm) + e, fc, pg, fc, pu,
                p["sg"], p["su"], p["rw"] if save else None, zt, hgt, hut, p["m"], tcfg, True,
                C.device_capability(DEV))
    if mv:
        assert rel(z[:mv], zt[:mv]) < TTOL[fmt]
        if save:
            assert rel(hg[:mv], hgt[:mv]) < 1e-4
    # same bits on a second run
    z2, hg2, _ = run_native(p, save)
    assert torch.equal(z[:mv].view(torch.int16), z2[:mv].view(torch.int16))
    if save:
        assert torch.equal(hg[:mv].view(torch.int32), hg2[:mv].view(torch.int32))


@pytest.mark.parametrize("fmt", FMTS)
def test_bf16_scales_read_as_given(fmt):
    """bf16 s_gate / s_up (the C entry's scales_bf16): the same bits as the same values passed as fp32, through the
    kernel and through the op's dispatch (which hands them over without a conversion kernel), save and plain."""
    p = make(CASES[0][1], 2048, 3, True, True, True, seed=77, fmt=fmt)
    p["sg"], p["su"] = p["sg"].bfloat16(), p["su"].bfloat16()
    q = dict(p, sg=p["sg"].float(), su=p["su"].float())
    mv = sum(CASES[0][1])
    for save in (False, True):
        a, b = run_native(p, save), run_native(q, save)
        for u, v in zip(a, b):
            if u is not None:
                assert torch.equal(u[:mv], v[:mv])
    x, offs = p["x"], p["offs"]
    wd = qz((torch.randn(offs.shape[0], R, 200) * 0.1).to(DEV), fmt)
    outs = [tsct.ops.grouped_glu(x, offs, p["qg"], p["qu"], wd, s["sg"], s["su"], gather_idx=p["gidx"],
                                 impl="triton-lowbit") for s in (p, q)]
    assert torch.equal(outs[0][:mv], outs[1][:mv]) and torch.isfinite(outs[0][:mv].float()).all()


def test_nan_row_and_nan_block_scale():
    p = make([20, 20], 128, gather=False, scales=False, rw=False, seed=3)
    p["x"][5, 7] = float("nan")
    z, hg, _ = run_native(p, True)
    assert torch.isnan(z[5].float()).all() and torch.isfinite(z[torch.arange(40, device=DEV) != 5].float()).all()
    # NaN block scale of expert 1, rank 9, k 16..31: that rank goes NaN for expert 1's rows only
    p["x"][5, 7] = 1.0
    q = p["qg"]
    bs = q.block_scale.view(torch.uint8).clone()
    bs[1, 9, 1] = 0x7F
    p["qg"] = dataclasses.replace(q, block_scale=bs.view(torch.float8_e4m3fn))
    z, hg, _ = run_native(p, True)
    assert torch.isnan(hg[20:, 9]).all() and torch.isfinite(hg[:20]).all()
    assert torch.isfinite(hg[20:, torch.arange(R, device=DEV) != 9]).all()


@pytest.mark.parametrize("fmt", FMTS)
def test_dispatch_counts(fmt):
    p = make([10, 40, 0, 70], 256, seed=1, fmt=fmt)
    if not native_on("lowbit_down_fwd", p["qg"]):
        pytest.skip("no CUDA row of lowbit_down_fwd for this format on this arch (tsct.dispatch.CUDA_KERNELS)")
    e = p["offs"].shape[0]
    wd = qz((torch.randn(e, R, 96) * 0.05).to(DEV), fmt)
    before = L.backend_counts().get(("native", "lowbit_down_fwd"), 0)
    y = L.grouped_glu_forward(p["x"], p["offs"], p["qg"], p["qu"], wd, p["sg"], p["su"], p["rw"], p["gidx"])
    assert L.backend_counts().get(("native", "lowbit_down_fwd"), 0) == before + 1
    assert torch.isfinite(y[: int(p["offs"][-1])].float()).all()


def test_bad_arguments():
    p = make([4, 4], 128, seed=2)
    cum = C.tile_cum(p["offs"], 64)
    g, u = args(p["qg"]), args(p["qu"])
    with pytest.raises(TypeError, match="x must have dtype"):
        native.glu_down_fwd_lowbit(p["x"].float(), p["offs"], cum, g, u, fmt="nvfp4", m=8, max_tiles=3)
    with pytest.raises(ValueError, match="multiple of 64"):
        native.glu_down_fwd_lowbit(p["x"][:, :96], p["offs"], cum, g, u, fmt="nvfp4", m=8, max_tiles=3)
    with pytest.raises(ValueError, match=r"gate\[0\]"):
        native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, (g[0][:, :32], g[1], g[2]), u, fmt="nvfp4", m=8,
                                   max_tiles=3)
    with pytest.raises(ValueError, match="gather_idx"):
        native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, g, u, fmt="nvfp4", m=9, max_tiles=3, gather_idx=p["gidx"])
    with pytest.raises(ValueError, match=r"out\[1\]"):
        native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, g, u, fmt="nvfp4", m=8, max_tiles=3, save=True,
                                  out=(torch.empty(8, R, device=DEV, dtype=torch.bfloat16), None, None))
    with pytest.raises(ValueError, match="fmt must be one of"):
        native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, g, u, fmt="int4", m=8, max_tiles=3)
    ps = make([4, 4], 128, seed=2, fmt="sign")
    gs, us = args(ps["qg"]), args(ps["qu"])
    with pytest.raises(ValueError, match=r"gate\[1\] must have shape"):  # a over K = d
        native.glu_down_fwd_lowbit(ps["x"], ps["offs"], cum, (gs[0], gs[1][:, :64].contiguous(), gs[2]), us,
                                   fmt="sign", m=8, max_tiles=3)
    with pytest.raises(TypeError, match=r"gate\[1\] must have dtype"):  # NVFP4 scale bytes passed as sign's a
        native.glu_down_fwd_lowbit(ps["x"], ps["offs"], cum, (gs[0], g[1], gs[2]), us, fmt="sign", m=8, max_tiles=3)


# ---- up projection -------------------------------------------------------------------------------------

UP_CASES = [
    ("b1_like_f5461", [33, 31, 29, 40, 0, 35, 27, 33] * 2, 5461, 3, True),
    ("f37_edges", [0, 1, 7, 64, 65, 150, 0], 37, 2, True),
    ("f64_norw", [5, 0, 64, 1], 64, 0, False),
    ("f200_many", [300, 12], 200, 1, True),
    # the up kernel stores y four 64-column steps at a time: 5 steps (a one-step last segment), 8 (two whole ones)
    ("f300_segment_edge", [17, 64, 3], 300, 1, True),
    ("f512_two_segments", [40, 0, 9], 512, 0, True),
]


def make_up(counts, f, pad, rw, seed, fmt="nvfp4"):
    g = torch.Generator().manual_seed(seed)
    e, mv = len(counts), sum(counts)
    m = mv + pad
    z = torch.randn(m, R, generator=g).bfloat16()
    z[mv:] = float("nan")  # padding rows of z are never read into written rows
    wd = torch.randn(e, R, f, generator=g) * 0.05
    return dict(z=z.to(DEV), offs=torch.tensor(counts).cumsum(0).to(torch.int32).to(DEV),
                qd=qz(wd.to(DEV), fmt), fmt=fmt, m=m, mv=mv, f=f,
                rw=torch.rand(m, generator=g).to(DEV) if rw else None)


def up_args(q):
    return args(q)


def run_up(p, ldy):
    cum = C.tile_cum(p["offs"], native.GLU_DOWN_TILE)
    y = torch.full((p["m"], ldy), float("nan"), device=DEV, dtype=torch.bfloat16)
    return native.glu_up_fwd_lowbit(p["z"], p["offs"], cum, up_args(p["qd"]), y, fmt=native_fmt(p["fmt"]),
                                    f=p["f"],
                                   max_tiles=-(-p["m"] // 64) + p["offs"].shape[0], row_weight=p["rw"])


def up_reference(p):
    offs = p["offs"].cpu().tolist()
    wd = quant.dequantize(p["qd"], dtype=torch.float32, backend="torch").double()
    y = torch.zeros(p["mv"], p["f"], dtype=torch.float64, device=DEV)
    lo = 0
    for e, hi in enumerate(offs):
        y[lo:hi] = p["z"][lo:hi].double() @ wd[e]
        lo = hi
    if p["rw"] is not None:
        y = y * p["rw"][: p["mv"]].double()[:, None]
    return y


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("case", UP_CASES, ids=lambda c: c[0])
def test_up_against_reference_and_triton(case, fmt):
    _, counts, f, pad, rw = case
    p = make_up(counts, f, pad, rw, seed=f + len(counts), fmt=fmt)
    ldy = -(-f // 8) * 8
    mv = p["mv"]
    poison()
    y = run_up(p, ldy)
    torch.cuda.synchronize()
    assert rel(y[:mv, :f], up_reference(p)) < 1e-2
    assert torch.isfinite(y[:mv].float()).all()
    assert (y[:mv, f:] == 0).all()  # pad columns: 0 * row weight
    if pad:
        assert torch.isnan(y[mv:].float()).all()  # padding rows never written
    cfg = C.tile_config(C.device_capability(DEV))
    yt = torch.full_like(y, float("nan"))
    e = p["offs"].shape[0]
    with triton_only():
        bm = cfg.shared.bm
        L._up(p["z"], p["offs"], C.tile_cum(p["offs"], bm), -(-p["m"] // bm) + e, L.factor_format(p["qd"]),
              list(up_args(p["qd"])), p["rw"], yt, f, p["m"], cfg, True, C.device_capability(DEV), pad=True)
    assert rel(y[:mv, :f], yt[:mv, :f]) < TTOL[fmt]
    y2 = run_up(p, ldy)
    assert torch.equal(y[:mv].view(torch.int16), y2[:mv].view(torch.int16))


@pytest.mark.parametrize("fmt", FMTS)
def test_up_nan_row(fmt):
    p = make_up([20, 20], 100, 0, True, seed=4, fmt=fmt)
    p["z"][25, 3] = float("nan")
    y = run_up(p, 104)
    rows = torch.arange(40, device=DEV)
    assert torch.isnan(y[25, :100].float()).all() and torch.isfinite(y[rows != 25].float()).all()


@pytest.mark.parametrize("fmt", FMTS)
def test_up_dispatch_counts(fmt):
    p = make([10, 40, 0, 70], 256, seed=1, fmt=fmt)
    if not native_on("lowbit_up_fwd", p["qg"]):
        pytest.skip("no CUDA row of lowbit_up_fwd for this format on this arch (tsct.dispatch.CUDA_KERNELS)")
    e = p["offs"].shape[0]
    wd = qz((torch.randn(e, R, 96) * 0.05).to(DEV), fmt)
    before = L.backend_counts().get(("native", "lowbit_up_fwd"), 0)
    sidx = torch.randperm(p["m"], device=DEV)
    y = L.grouped_glu_forward(p["x"], p["offs"], p["qg"], p["qu"], wd, p["sg"], p["su"], p["rw"], p["gidx"], sidx,
                              p["m"])
    assert L.backend_counts().get(("native", "lowbit_up_fwd"), 0) == before + 1
    assert torch.isfinite(y.float()).all()


def test_up_bad_arguments():
    p = make_up([4, 4], 40, 0, True, seed=2)
    cum = C.tile_cum(p["offs"], 64)
    a = up_args(p["qd"])
    y = torch.empty(8, 40, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        native.glu_up_fwd_lowbit(p["z"], p["offs"], cum, a, torch.empty(8, 42, device=DEV, dtype=torch.bfloat16),
                                 fmt="nvfp4", f=40, max_tiles=3)
    with pytest.raises(ValueError, match=r"w_down\[0\]"):
        native.glu_up_fwd_lowbit(p["z"], p["offs"], cum, (a[0][:, :39].contiguous(), a[1], a[2]), y, fmt="nvfp4",
                                 f=40, max_tiles=3)
    with pytest.raises(TypeError, match="row_weight must have dtype"):
        native.glu_up_fwd_lowbit(p["z"], p["offs"], cum, a, y, fmt="nvfp4", f=40, max_tiles=3,
                                 row_weight=p["rw"].double())


def _misaligned(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t whose storage starts `offset` bytes into a buffer (a view at an odd offset)."""
    buf = torch.empty(t.numel() * t.element_size() + 16, dtype=torch.uint8, device=t.device)
    return buf[offset: offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape).copy_(t)


@pytest.mark.parametrize("fmt", FMTS)
def test_down_edge_layouts(fmt):
    """40 experts (the search's narrowing loop), d = 320 (a partial last code stage), x rows strided past d,
    NVFP4 scale rows 4 bytes off 16-byte alignment (the 4-byte scale copies), a grid 50 tiles too large."""
    g = torch.Generator().manual_seed(11)
    counts = torch.randint(0, 70, (40,), generator=g).tolist()
    p = make(counts, 320, pad=2, seed=12, fmt=fmt)
    wide = torch.randn(p["x"].shape[0], 384, generator=g).bfloat16().to(DEV)
    wide[:, :320] = p["x"]
    p["x"] = wide[:, :320]
    ga, ua = args(p["qg"]), args(p["qu"])
    if fmt == "nvfp4":
        ga = (ga[0], _misaligned(ga[1], 4), ga[2])
        assert ga[1].data_ptr() % 16 == 4
    cum = C.tile_cum(p["offs"], 64)
    mv = sum(counts)
    z, hg, hu = native.glu_down_fwd_lowbit(p["x"], p["offs"], cum, ga, ua, fmt=native_fmt(fmt), m=p["m"],
                                           max_tiles=-(-p["m"] // 64) + 40 + 50,
                                          gather_idx=p["gidx"], s_gate=p["sg"], s_up=p["su"], row_weight=p["rw"],
                                          save=True)
    rhg, rhu, rz = reference(p, True)
    assert rel(hg[:mv], rhg) < HTOL[fmt] and rel(hu[:mv], rhu) < HTOL[fmt] and rel(z[:mv], rz) < 1e-2


@pytest.mark.parametrize("fmt", FMTS)
def test_up_edge_layouts(fmt):
    """40 experts, f = 100 written into ldy = 232 (two whole pad steps), a grid 50 tiles too large."""
    g = torch.Generator().manual_seed(13)
    counts = torch.randint(0, 70, (40,), generator=g).tolist()
    p = make_up(counts, 100, 1, True, seed=14, fmt=fmt)
    cum = C.tile_cum(p["offs"], 64)
    y = torch.full((p["m"], 232), float("nan"), device=DEV, dtype=torch.bfloat16)
    native.glu_up_fwd_lowbit(p["z"], p["offs"], cum, up_args(p["qd"]), y, fmt=native_fmt(fmt), f=100,
                            max_tiles=-(-p["m"] // 64) + 40 + 50, row_weight=p["rw"])
    mv = p["mv"]
    assert rel(y[:mv, :100], up_reference(p)) < 1e-2
    assert (y[:mv, 100:] == 0).all() and torch.isnan(y[mv:].float()).all()


def test_sign_nan_scales():
    """A NaN a[k] of expert 1 (gate) poisons every rank of that expert's rows; a NaN b[n] only rank n."""
    p = make([20, 20], 128, gather=False, scales=False, rw=False, seed=5, fmt="sign")
    q = p["qg"]
    a, b = q.scale_k.clone(), q.scale_n.clone()
    a[1, 70] = float("nan")
    b[0, 9] = float("nan")
    p["qg"] = dataclasses.replace(q, scale_k=a, scale_n=b)
    _, hg, hu = run_native(p, True)
    assert torch.isnan(hg[20:]).all() and torch.isnan(hg[:20, 9]).all()
    assert torch.isfinite(hg[:20, torch.arange(R, device=DEV) != 9]).all() and torch.isfinite(hu).all()


def test_mixed_and_misaligned_stay_on_triton():
    """Gate NVFP4 + up sign (one kernel takes one format) and sign storage off its alignment keep the Triton
    down kernel; the results still match the reference."""
    p = make([10, 40, 0, 70], 256, seed=6)
    ps = make([10, 40, 0, 70], 256, seed=6, fmt="sign")
    if not (native_on("lowbit_down_fwd", p["qg"]) and native_on("lowbit_down_fwd", ps["qg"])):
        pytest.skip("no CUDA row of lowbit_down_fwd for NVFP4 and sign on this arch (tsct.dispatch.CUDA_KERNELS)")
    e = p["offs"].shape[0]
    wd = quant.quantize((torch.randn(e, R, 96) * 0.05).to(DEV), "nvfp4")
    before = dict(L.backend_counts())
    L.grouped_glu_forward(p["x"], p["offs"], p["qg"], ps["qu"], wd, p["sg"], p["su"], p["rw"], p["gidx"])
    after = L.backend_counts()
    assert after.get(("native", "lowbit_down_fwd"), 0) == before.get(("native", "lowbit_down_fwd"), 0)
    assert after.get(("aot", "lowbit_down_fwd"), 0) + after.get(("jit", "lowbit_down_fwd"), 0) > \
        before.get(("aot", "lowbit_down_fwd"), 0) + before.get(("jit", "lowbit_down_fwd"), 0)
    pg = args(ps["qg"])
    assert L._native_packed("lowbit_down_fwd", C.device_capability(DEV), L.SIGN, pg)
    assert not L._native_packed("lowbit_down_fwd", C.device_capability(DEV), L.SIGN, [pg[0], _misaligned(pg[1], 4),
                                                                                     pg[2]])


# ---- FP8 and ternary: exact sums give the Triton kernels' bits; NaN codes -------------------------------------------

NEW_FMTS = ["fp8", "ternary", "ternary_r1"]


def exact_factor(e, k, n, fmt, g):
    """A factor [e, k, n] of ``fmt`` whose decoded values have few significant bits (fp8: multiples of 1/4 up to 4
    in magnitude; ternary: q, and for the rank-1 scaling q * scale_k with scale_k a multiple of 1/8 in [1/8, 2]),
    so that products with small integers sum exactly in fp32 in any order; scale_n random."""
    q = qz((torch.randn(e, k, n, generator=g)).to(DEV), fmt)
    if fmt == "fp8":
        v = torch.randint(-16, 17, (e, n, k), generator=g).float() / 4
        return dataclasses.replace(q, codes=v.to(DEV).to(torch.float8_e4m3fn))
    c = torch.randint(0, 256, (e, n, k // 4), generator=g, dtype=torch.uint8)
    m = c & 0x55
    c = m | (((c >> 1) & 0x55 & m) << 1)  # no 0b10 (NaN) pair: clear the high bit where the low one is 0
    ch = dict(codes=c.to(DEV))
    if fmt == "ternary_r1":
        ch["scale_k"] = (torch.randint(1, 17, (e, k), generator=g).float() / 8).to(DEV)
    return dataclasses.replace(q, **ch)


@pytest.mark.parametrize("fmt", NEW_FMTS)
@pytest.mark.parametrize("d", [64, 2048], ids=["d64", "d2048"])
def test_exact_sums_give_the_triton_bits(fmt, d):
    """x of small integers and factors of few significant bits (``exact_factor``): every fp32 partial sum is exact,
    so hg / hu (accumulator times scale_n) and y (times scale_n, times the row weight, one bf16 rounding) are the
    bits of the Triton kernels; odd experts, an empty one, gather indices and row weights."""
    g = torch.Generator().manual_seed(21 + d)
    counts = [1, 0, 7, 63, 65, 33]
    e, m = len(counts), sum(counts)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32).to(DEV)
    x = torch.randint(-4, 5, (m + 9, d), generator=g).bfloat16().to(DEV)
    gidx = torch.randint(0, m + 9, (m,), generator=g).to(DEV)
    qg, qu = exact_factor(e, d, R, fmt, g), exact_factor(e, d, R, fmt, g)
    p = dict(fmt=fmt, x=x, offs=offs, qg=qg, qu=qu, m=m, gidx=gidx, sg=None, su=None, rw=None)
    z, hg, hu = run_native(p, True)
    cfg = C.tile_config(C.device_capability(DEV))
    cap = C.device_capability(DEV)
    hgt, hut, zt = torch.empty_like(hg), torch.empty_like(hu), torch.empty_like(z)
    fc = L.factor_format(qg)
    with triton_only():
        bm = cfg.shared.bm
        L._down(x, gidx, offs, C.tile_cum(offs, bm, cap), -(-m // bm) + e, fc, list(args(qg)), fc,
                list(args(qu)), None, None, None, zt, hgt, hut, m, cfg, True, cap)
    assert torch.isfinite(hg).all() and hg.abs().max() > 0
    assert torch.equal(hg, hgt) and torch.equal(hu, hut)
    # the up projection: z of small integers, the same exact factors
    f = 200
    zi = torch.randint(-4, 5, (m, R), generator=g).bfloat16().to(DEV)
    qd = exact_factor(e, R, f, fmt, g)
    rw = (torch.randint(1, 9, (m,), generator=g).float() / 4).to(DEV)
    pu = dict(z=zi, offs=offs, qd=qd, fmt=fmt, m=m, mv=m, f=f, rw=rw)
    y = run_up(pu, 200)
    yt = torch.full_like(y, float("nan"))
    with triton_only():
        L._up(zi, offs, C.tile_cum(offs, bm, cap), -(-m // bm) + e, L.factor_format(qd), list(args(qd)), rw,
              yt, f, m, cfg, True, cap, pad=True)
    assert torch.isfinite(y.float()).all() and torch.equal(y.view(torch.int16), yt.view(torch.int16))


def _nan_code(q, fmt, ex, n, k):
    """q with the code of (expert ex, column n, k) set to the format's NaN code (fp8 0xFF: the negative one)."""
    if fmt == "fp8":
        c = q.codes.view(torch.uint8).clone()
        c[ex, n, k] = 0xFF
        return dataclasses.replace(q, codes=c.view(torch.float8_e4m3fn))
    c = q.codes.clone()
    c[ex, n, k // 4] = (c[ex, n, k // 4] & (0xFF ^ (3 << (2 * (k % 4))))) | (2 << (2 * (k % 4)))
    return dataclasses.replace(q, codes=c)


@pytest.mark.parametrize("fmt", NEW_FMTS)
def test_nan_codes(fmt):
    """A NaN code of expert 1's w_gate (rank 9, k 37) makes hg[:, 9] NaN for expert 1's rows only (z too), and one
    of w_down (column 70, k 21) y[:, 70] of expert 1's rows only; fp8's 0x7F likewise (w_up, rank 3)."""
    p = make([20, 20], 128, gather=False, scales=False, rw=False, seed=8, fmt=fmt)
    p["qg"] = _nan_code(p["qg"], fmt, 1, 9, 37)
    if fmt == "fp8":
        c = p["qu"].codes.view(torch.uint8).clone()
        c[1, 3, 100] = 0x7F
        p["qu"] = dataclasses.replace(p["qu"], codes=c.view(torch.float8_e4m3fn))
    z, hg, hu = run_native(p, True)
    ranks = torch.arange(R, device=DEV)
    assert torch.isnan(hg[20:, 9]).all() and torch.isfinite(hg[:20]).all()
    assert torch.isfinite(hg[20:, ranks != 9]).all()
    assert torch.isnan(z[20:, 9].float()).all()
    if fmt == "fp8":
        assert torch.isnan(hu[20:, 3]).all() and torch.isfinite(hu[20:, ranks != 3]).all()
        assert torch.isfinite(hu[:20]).all()
    else:
        assert torch.isfinite(hu).all()
    pu = make_up([20, 20], 100, 0, True, seed=9, fmt=fmt)
    pu["qd"] = _nan_code(pu["qd"], fmt, 1, 70, 21)
    y = run_up(pu, 104)
    cols = torch.arange(104, device=DEV)
    assert torch.isnan(y[20:, 70].float()).all() and torch.isfinite(y[:20].float()).all()
    assert torch.isfinite(y[20:][:, cols != 70].float()).all()
    # the reference decode agrees: the fp64 oracle has NaN in exactly that column
    ref = up_reference(pu)
    assert torch.isnan(ref[20:, 70]).all() and torch.isfinite(ref[:, torch.arange(100, device=DEV) != 70]).all()


def test_ternary_mixed_scalings_stay_on_triton():
    """w_gate with the absmean scaling and w_up with the rank-1 one (one kernel takes one scaling) keep the Triton
    down kernel; the result still matches the reference."""
    p = make([10, 40, 0, 70], 256, seed=6, fmt="ternary")
    p1 = make([10, 40, 0, 70], 256, seed=6, fmt="ternary_r1")
    if not native_on("lowbit_down_fwd", p["qg"]):
        pytest.skip("no CUDA row of lowbit_down_fwd for ternary on this arch (tsct.dispatch.CUDA_KERNELS)")
    p["qu"] = p1["qu"]
    before = L.backend_counts().get(("native", "lowbit_down_fwd"), 0)
    z = L.down_forward(p["x"], p["offs"], p["qg"], p["qu"], p["sg"], p["su"], p["gidx"])
    assert L.backend_counts().get(("native", "lowbit_down_fwd"), 0) == before
    mv = int(p["offs"][-1])
    assert rel(z[:mv], reference(p, False)[2]) < 1e-2
