"""The low-bit kernels' AOT variant table (``tsct/kernels/triton_lowbit/specs.py``), checked without a GPU.

- a dry run of ``triton_lowbit/glu.py``'s host code (CPU tensors, capability patched, launches recorded
  instead of run, ``TSCT_TRITON_BACKEND=aot``) finds a variant for EVERY launch of the GPU-test shapes
  (tests/kernels/test_triton_lowbit_gpu.py and test_lowbit_ops_gpu.py: uniform NVFP4, uniform sign, the
  NVFP4-sign-NVFP4 mix; bf16) and of the b1 shape, on every arch, in the tables the AOT build compiles
  (the low-bit family's own kernels and the bf16 family's weight-free kernels it launches);
- launches outside the table (fp16 activations, fp8 / ternary factors, another mix) miss, so ``aot`` mode refuses
  them by name;
- the table's parameter lists match the Triton sources, its pointer types follow the formats;
- the wheel's index (when this install has one) holds the low-bit family.
"""

from __future__ import annotations

import re

import pytest
import torch

from tsct import quant
from tsct.kernels import aot, launch
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs as glu_specs
from tsct.kernels.triton_lowbit import glu as L
from tsct.kernels.triton_lowbit import specs as LS

from _lowbit_counts import n_lowbit  # tests/ is on sys.path (its conftest.py's folder; pytest's default import mode)
import _tools

CAPS = [(9, 0), (10, 0), (12, 0), (12, 1)]
FMTS = {"nvfp4": ("nvfp4",) * 3, "sign": ("sign",) * 3, "mixed": ("nvfp4", "sign", "nvfp4"), "fp8": ("fp8",) * 3,
        "ternary": ("ternary",) * 3}
# (name, T, k, E, d, r, f, gather, scatter, scales, row weight, index dtype): the bf16 cases of the GPU tests
SHAPES = [
    ("b1_small", 256, 2, 64, 2048, 64, 5461, True, True, True, True, torch.int64),
    ("b1_pad_i32", 128, 2, 64, 2048, 64, 5461, True, True, True, True, torch.int32),
    ("f37_empty", 50, 2, 6, 64, 16, 37, True, True, True, True, torch.int32),
    ("one_row_d40_r24", 12, 1, 8, 40, 24, 100, True, True, True, True, torch.int64),
    ("all_in_one_nogather", 100, 2, 4, 128, 32, 200, False, False, True, True, torch.int64),
    ("d16_r16_noscales", 64, 2, 8, 16, 16, 72, True, True, False, False, torch.int64),
    ("d4096_f5461", 32, 2, 8, 4096, 64, 5461, True, True, True, True, torch.int64),
    ("r4096", 10, 2, 3, 256, 4096, 96, True, True, True, True, torch.int64),
    ("top4_f129", 64, 4, 8, 128, 32, 129, True, True, True, True, torch.int64),
    ("scatter_only", 96, 2, 5, 96, 48, 257, False, True, True, True, torch.int64),
    ("gather_only", 96, 2, 5, 96, 48, 257, True, False, True, True, torch.int64),
    ("r100_d200", 64, 2, 6, 200, 100, 333, True, True, True, True, torch.int64),
    ("r128", 32, 2, 4, 64, 128, 64, True, True, True, False, torch.int64),
    # 768 experts of about one row: enough row tiles for sm_90a's fused dz-and-GLU-backward on an NVFP4 w_down
    ("e768_fused_dz", 768, 1, 768, 64, 64, 128, True, True, True, True, torch.int64),
]
NEEDS = ([True] * 7, [True] + [False] * 6, [False, True, True, False, False, False, False],
         [False, False, False, True, False, False, True], [True, True, False, True, False, False, False])


def _table(arch: str) -> set:
    keys = {s.key for s in glu_specs.enumerate_specs(arch)}
    if arch in LS.AOT_ARCHS:
        keys |= {s.key for s in LS.enumerate_specs(arch)}
    return keys


@pytest.fixture
def dry_run(monkeypatch):
    """Launches look their key up in the AOT tables (not in an install) and are recorded, not run."""
    found, missing = [], []

    class Rec:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            kname = self.key.split("|")[0]
            table = LS.KERNELS if kname in LS.KERNELS else glu_specs.KERNELS
            assert len(values) == len(table[kname].params), self.key
            assert all(int(g) >= 0 for g in grid), (self.key, grid)
            found.append(self.key)

    state = {}

    def kernel(arch, key):
        if key in state["table"]:
            return Rec(key)
        missing.append(key)
        return None

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(aot, "kernel", kernel)
    monkeypatch.setattr(aot, "index", lambda arch: {"kernels": {}})

    def use(cap):
        state["table"] = _table(aot.artifact_arch(cap))
        monkeypatch.setattr(C, "device_capability", lambda dev: cap)

    return use, found, missing


def _inputs(shape, fmt, dtype=torch.bfloat16, seed=0):
    name, T, k, E, d, r, f, gather, scatter, scales, rw, idx_dt = shape
    g = torch.Generator().manual_seed(seed)
    m = T * k
    counts = torch.full((E,), m // E)
    counts[-1] += m - int(counts.sum())
    if E > 2:
        counts[1] += counts[0]
        counts[0] = 0  # an empty expert
    offs = counts.cumsum(0).to(torch.int32)
    x = torch.randn(T if gather else m, d, generator=g).to(dtype)
    facs = [_container(q, E, kk, n, g) for q, (kk, n) in zip(FMTS[fmt], ((d, r), (d, r), (r, f)))]
    sg = torch.rand(E, r, generator=g) if scales else None
    su = torch.rand(E, r, generator=g) if scales else None
    rwt = torch.rand(m, generator=g) if rw else None
    tok = torch.arange(m) // k
    gi = tok.to(idx_dt) if gather else None
    si = tok.to(idx_dt) if scatter else None
    n_out = T if scatter else None
    return [x, offs, *facs, sg, su, rwt, gi, si, n_out]


def _container(fmt, e, k, n, g):
    """A packed factor of logical shape [e, k, n] with random storage (the dry run reads no values)."""
    if fmt == "nvfp4":
        return quant.NVFP4Tensor(torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8),
                                 torch.ones(e, n, k // 16).to(torch.float8_e4m3fn), torch.ones(e), "linear",
                                 (e, k, n))
    if fmt == "fp8":
        codes = torch.randint(0, 256, (e, n, k), generator=g, dtype=torch.uint8)
        return quant.FP8Tensor(codes.view(torch.float8_e4m3fn), torch.ones(e, n), (e, k, n))
    if fmt == "ternary":  # absmean scaling (the one with cubins)
        return quant.TernaryTensor(torch.randint(0, 256, (e, n, k // 4), generator=g, dtype=torch.uint8), None,
                                   torch.ones(e, n), (e, k, n))
    return quant.SignTensor(torch.randint(0, 256, (e, n, k // 8), generator=g, dtype=torch.uint8),
                            torch.ones(e, k), torch.ones(e, n), (e, k, n))


def _valid(shape, fmt) -> bool:
    d, r = shape[4], shape[5]
    need = {"nvfp4": 16, "sign": 8, "ternary": 4, "fp8": 1}[FMTS[fmt][0]] if fmt != "mixed" else 16
    return d % need == 0 and r % need == 0


AOT_FMTS = ("nvfp4", "sign", "mixed")  # the formats with cubins (fp8 / ternary: forced-only, JIT)


@pytest.mark.parametrize("cap", CAPS, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("fmt", AOT_FMTS)
def test_every_lowbit_launch_has_an_aot_variant(dry_run, cap, fmt):
    use, found, missing = dry_run
    use(cap)
    for shape in SHAPES:
        if not _valid(shape, fmt):
            continue
        args = _inputs(shape, fmt)
        n0 = len(found)
        L.grouped_glu_forward(*args)
        go = torch.randn(args[10] if args[9] is not None else args[0].shape[0] if args[8] is None
                         else args[8].shape[0], shape[6]).to(torch.bfloat16)
        for need in NEEDS:
            L.grouped_glu_backward(go, *args, need)
        _, saved = L.grouped_glu_forward_saved(*args)  # what tsct::grouped_glu_q runs, and its backward
        L.grouped_glu_backward(go, *args, NEEDS[0], saved=saved)
        x, offs, wg, wu, _, sg, su, _, gi = args[:9]
        L.down_forward(x, offs, wg, wu, sg, su, gi)  # public: the latent alone (same table entry)
        assert not missing, f"{shape[0]} {fmt}: no AOT variant for {missing[:2]}"
        kinds = {kk.split("|")[0] for kk in found[n0:]}
        assert {"lowbit_down_fwd", "lowbit_up_fwd", "lowbit_bwd_dz", "lowbit_bwd_dx_dw"} <= kinds, (shape[0], kinds)
        # the GLU backward runs inside lowbit_bwd_dz where the table fuses it for this shape, else in glu_bwd_epi
        e, m = args[1].shape[0], int(args[8].shape[0]) if args[8] is not None else args[0].shape[0]
        fused = LS.fuse_dz_epi(C.tile_config(cap), L.factor_format(args[4]), e, m, args[4].shape[1])
        assert ("glu_bwd_epi" in kinds) != fused, (shape[0], kinds)


def test_b1_hot_launches_are_aligned_variants(dry_run):
    use, found, missing = dry_run
    use((9, 0))
    for fmt in ("nvfp4", "sign"):
        found.clear()
        args = _inputs(SHAPES[0], fmt)
        L.grouped_glu_forward(*args)
        lowbit = [k for k in found if k.startswith("lowbit_")]
        assert len(lowbit) == 2 and all(k.endswith("|a16") for k in lowbit), lowbit
        assert "SINGLE_K=1" in lowbit[1] and "BK=64" in lowbit[1]
        want_fmt = "1" if fmt == "nvfp4" else "2"
        assert f"FMT_G={want_fmt},FMT_U={want_fmt}" in lowbit[0] and f"FMT_D={want_fmt}" in lowbit[1]
    assert not missing


def test_launches_outside_the_table_are_refused_by_name(dry_run):
    use, found, missing = dry_run
    use((9, 0))
    args = _inputs(SHAPES[2], "nvfp4", dtype=torch.float16)  # fp16 activations: JIT only
    with pytest.raises(RuntimeError, match=r"tsct triton-lowbit: the sm_90a AOT cubins have no variant "
                                           r"lowbit_down_fwd\|x_ptr:\*fp16"):
        L.grouped_glu_forward(*args)
    dense_mix = _inputs(SHAPES[2], "nvfp4")
    dense_mix[2] = torch.randn(6, 64, 16).to(torch.bfloat16)  # dense gate + NVFP4 up: not an AOT mix
    with pytest.raises(RuntimeError, match="FMT_G=0,FMT_U=1"):
        L.grouped_glu_forward(*dense_mix)
    for fmt, code in (("fp8", 3), ("ternary", 4)):  # the forced-only formats: JIT only
        with pytest.raises(RuntimeError, match=f"lowbit_down_fwd.*FMT_G={code},FMT_U={code}"):
            L.grouped_glu_forward(*_inputs(SHAPES[2], fmt))


def test_table_size_and_pointer_types():
    for arch in LS.AOT_ARCHS:
        specs_ = list(LS.enumerate_specs(arch))
        # n_lowbit: 128 for NVFP4 / sign, plus the opt-in down-plane variants where the arch has them
        assert len(specs_) == len({s.key for s in specs_}) == n_lowbit(arch)
        for s in specs_:
            t = dict(s.types)
            c = dict(s.constexprs)
            for slot, flag in (("g", "FMT_G"), ("u", "FMT_U"), ("d", "FMT_D")):
                if flag not in c:
                    continue
                want = LS.factor_types(c[flag], "bf16")
                assert (t[f"{slot}0"], t[f"{slot}1"], t[f"{slot}2"]) == want, s.key
            assert c.get("BR", 64) == 64
            assert s.key == LS.spec_key(s.kernel, t, c, s.num_warps, s.num_stages, s.aligned, maxnreg=s.maxnreg)
    assert LS.factor_types(LS.NVFP4, "bf16") == ("*u8", "*u8", "*fp32")
    assert LS.factor_types(LS.SIGN, "bf16") == ("*u8", "*fp32", "*fp32")
    assert LS.factor_types(LS.DENSE, "bf16") == ("*bf16", "*i8", "*i8")
    assert not set(LS.KERNELS) & set(glu_specs.KERNELS)  # kernel names never collide in one index


def test_kernel_table_matches_the_triton_sources():
    pytest.importorskip("triton")
    from tsct.kernels.triton_lowbit import _kernels as K

    for name, info in LS.KERNELS.items():
        fn = getattr(K, name)
        assert tuple(a for a in fn.arg_names if a not in info.constexprs) == info.params, name
        assert set(info.constexprs) <= set(fn.arg_names), name


def test_installed_index_holds_the_lowbit_family():
    from tsct import native

    m = native.manifest()
    if m is None or "triton_aot" not in m:
        pytest.skip("this install has no Triton AOT cubins")
    for arch in m["triton_aot"]["archs"]:
        idx = aot.index(arch)
        assert idx is not None
        if arch in LS.AOT_ARCHS:
            assert idx["families"].get("lowbit", {}).get("variants") == n_lowbit(arch), idx["families"]
            keys = {k for k, e in idx["kernels"].items() if e["family"] == "lowbit"}
            assert keys == {s.key for s in LS.enumerate_specs(arch)}


# Per forward kernel: (which b1 variants, the register tensors it may store to shared memory: shape -> what it is,
# the tl.dot count). Nothing decoded is in the allowed sets: only activation planes.
_NO_COPY = {
    "lowbit_up_fwd": (lambda c: c.get("SINGLE_K") and c["BK"] == 64, lambda c: {f"{c['BK'] // 4}x{c['BM']}xbf16"}, 4),
    "lowbit_down_fwd": (lambda c: c["BK"] == 64, lambda c: set(), 8),
}


@pytest.mark.parametrize("kernel", sorted(_NO_COPY))
@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_forward_kernels_decode_into_the_dot_operand_on_sm120(fmt, kernel):
    """The forward kernels' b1 variants in byte planes (packed factors, r = 64, K steps of 64;
    lowbit_down_fwd's are the opt-in ones sm_120's table ships), compiled for sm_120 by Triton on this CPU machine,
    keep no copy of a decoded factor tile in shared memory. lowbit_up_fwd's TTGIR stores only register tensors
    shaped like the z planes ([BK/4, BM] bf16) to shared memory; lowbit_down_fwd's stores none (x arrives by
    cp.async and is read from shared memory straight into its planes); and no layout conversion (which may go
    through shared memory) takes a decoded plane ([BN, BK/4] bf16). What does pass through shared memory besides
    the activations: sign's packed code bytes ([BN, BK/8] i8, a layout conversion) and the outputs' epilogues.
    The byte-plane decode (PLANES, ``_w_plane``, one dot per plane and factor) is what makes that so; the joined
    tile of ``_w_tile_nk`` fails this test."""
    triton = pytest.importorskip("triton")
    if triton.__version__ != CS.TRITON_VERSION:  # the claim is about the cubins the pinned Triton builds
        pytest.skip(f"needs Triton {CS.TRITON_VERSION} (the AOT build's), found {triton.__version__}")
    check = _tools.load("triton_lowbit_compile_check")

    pick, allowed, n_dots = _NO_COPY[kernel]
    found = 0
    for spec in check.variants(fmt, "sm_120", opt_in=True):
        consts = dict(spec.constexprs)
        if spec.kernel != kernel or not pick(consts):
            continue
        k = check.compile_spec(spec, 120)
        assert consts["PLANES"], "sm_120's b1 variants decode in byte planes (specs.up_planes, opt-in down_planes)"
        # every register tensor stored to shared memory, any rank or dtype
        ttgir = k.asm["ttgir"]
        copies = set(re.findall(r"ttg\.local_alloc %\S+ : \(tensor<([^,>]+)", ttgir))
        assert copies <= allowed(consts), (fmt, kernel, consts.get("BWD"), copies)
        plane = f"x{consts['BK'] // 4}xbf16"  # a decoded plane [BN, BK/4] (BN: the factor's rows in this kernel)
        moved = set(re.findall(r"ttg\.convert_layout %\S+ : tensor<([^,>]+)", ttgir))
        assert not {t for t in moved if t.endswith(plane)}, (fmt, kernel, moved)
        assert k.asm["ttgir"].count("tt.dot ") == n_dots, "one dot per byte plane and factor"
        found += 1
    assert found, f"no b1 {kernel} variant in the table"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120"])
@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_compile_check_takes_its_variants_from_the_aot_table(fmt, arch):
    """tools/triton_lowbit_compile_check.py compiles the b1 launches as the AOT build does: each of its variants is an
    entry of the shipped table (same key: types, constexprs, warps, stages, register cap), one per kernel and
    direction, and the dz one is fused exactly where the table fuses b1 (``fuse_dz_epi``)."""
    check = _tools.load("triton_lowbit_compile_check")
    table = {s.key for s in LS.enumerate_specs(arch)}
    got = check.variants(fmt, arch)
    assert all(s.key in table for s in got)
    assert sorted(s.kernel for s in got) == ["lowbit_bwd_dx_dw", "lowbit_bwd_dz", "lowbit_down_fwd", "lowbit_down_fwd",
                                             "lowbit_up_fwd"]
    dz = next(s for s in got if s.kernel == "lowbit_bwd_dz")
    f = check.FMT[fmt]
    fused = LS.fuse_dz_epi(glu_specs.CONFIGS[arch], f, 1024, 32768, 64)  # b1's E, M and r
    assert bool(dict(dz.constexprs)["FUSE_EPI"]) == fused
    assert dz.maxnreg == LS.dz_maxnreg(glu_specs.CONFIGS[arch], fused)


def test_first_use_selftest_shape_takes_the_sm120_byte_plane_kernels():
    """The first-use self-test (``tsct.selftest``, run on an sm_120 card before triton-lowbit serves there) must run
    the code the b1 shapes run: its problem's rank is one K step of 64 for the up projection, which sm_120 decodes in
    byte planes for both packed formats, and its d is at least one K step of 64 (the opt-in down planes)."""
    from tsct import selftest

    p64, _, _ = selftest._problem(torch.device("cpu"), torch.bfloat16)
    d, r = p64["w_gate"].shape[1:]
    cfg = glu_specs.CONFIGS["sm_120"]
    single, bk = LS.up_k(r, aligned=d % 16 == 0 and r % 16 == 0)
    assert single and bk == 64, (d, r)
    assert LS.up_planes(cfg, LS.NVFP4, single, bk) and LS.up_planes(cfg, LS.SIGN, single, bk)
    assert d >= cfg.shared.bk and LS.down_planes_ok(LS.NVFP4, LS.SIGN, cfg.shared.bk)


def test_dz_fuses_the_glu_backward_by_format_and_shape():
    """sm_90a's table fuses the GLU backward into lowbit_bwd_dz for an NVFP4 w_down from 768 row tiles (estimated as
    max(E, cdiv(M, 64))) and r 64 (``fuse_rank_lb``); not sign (slower fused), not E 256 at b1's rows (512 tiles),
    not r 16 or 32, not sm_120's table; an override of 0 turns it off, one of the rank threshold moves it."""
    sm90, sm120 = CS.CONFIGS["sm_90a"], CS.CONFIGS["sm_120"]
    assert LS.fuse_dz_epi(sm90, LS.NVFP4, 1024, 32768, 64)      # b1
    assert LS.fuse_dz_epi(sm90, LS.NVFP4, 4096, 32768, 64)      # E 4096
    assert LS.fuse_dz_epi(sm90, LS.NVFP4, 256, 131072, 64)      # 512 rows per expert: 2048 tiles
    assert not LS.fuse_dz_epi(sm90, LS.NVFP4, 256, 32768, 64)  # E 256: 512 tiles
    assert not LS.fuse_dz_epi(sm90, LS.SIGN, 1024, 32768, 64)
    assert not LS.fuse_dz_epi(sm120, LS.NVFP4, 1024, 32768, 64)
    assert not LS.fuse_dz_epi(sm90.update("fuse_tiles_lb=0"), LS.NVFP4, 1024, 32768, 64)
    assert LS.fuse_dz_epi(sm90, LS.NVFP4, 1024, 32768, 128)     # r 128: two full rank blocks
    assert not LS.fuse_dz_epi(sm90, LS.NVFP4, 1024, 32768, 32)  # r 32 and 16: below fuse_rank_lb
    assert not LS.fuse_dz_epi(sm90, LS.NVFP4, 1024, 32768, 16)
    assert LS.fuse_dz_epi(sm90.update("fuse_rank_lb=16"), LS.NVFP4, 1024, 32768, 16)  # a developer override
    assert LS.dz_maxnreg(sm90, True) == 80 and LS.dz_maxnreg(sm90, False) == 0
    with pytest.raises(ValueError, match="fuse_tiles_lb must be 0"):
        sm90.update("fuse_tiles_lb=-1")
    with pytest.raises(ValueError, match="regs_dz_lb must be one of"):
        sm90.update("regs_dz_lb=100")
