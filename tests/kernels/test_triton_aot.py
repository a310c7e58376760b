"""Triton kernels ahead of time (docs/decisions/0005), checked without a GPU.

- the artifact selection table is exact per compute capability;
- the install holds a cubin for every variant the manifest's "triton_aot" section lists, each with
  the sha256, parameter list and limits its index records;
- a sample of cubins per (arch, GEMM kernel) disassembles (cuobjdump from nvidia-cuda-cuobjdump, else
  skipped) to the arch's matrix instructions: HGMMA on sm_90a, HMMA (mma.sync) on sm_120, tcgen05
  (UTCHMMA) on sm_100a;
- the argument packer lays out Triton's ABI for an index entry;
- a dry run of glu.py's host code (CPU tensors, launches recorded instead of run) finds an AOT
  variant for every launch of the GPU test shapes on every arch, with the right argument count;
- the launch ledger of both families' host code over every input class it tells apart is exactly the tables the
  build compiles (``_aot_ledger``);
- the status reasons of path "triton-bf16".
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tsct.kernels import aot, launch
from tsct.kernels.layout import to_kmajor
from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs
from tsct.kernels.triton_lowbit import specs as lowbit_specs

import _aot_ledger  # tests/ is on sys.path (its conftest.py's folder; pytest's default import mode)
from _lowbit_counts import n_lowbit

GEMM_KERNELS = ("glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw")
MMA = {"sm_90a": r"HGMMA", "sm_120": r"HMMA", "sm_100a": r"UTCHMMA"}


def _manifest():
    from tsct import native
    return native.manifest()


def _aot_section():
    m = _manifest()
    if m is None:
        pytest.skip("no native library manifest in this install (TSCT_BUILD_CUDA=OFF or a source tree)")
    if "triton_aot" not in m:
        pytest.skip("this build has no Triton AOT cubins (TSCT_TRITON_AOT=OFF)")
    return m["triton_aot"]


def test_artifact_arch_is_exact():
    want = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120", (12, 1): "sm_120"}
    for cap, arch in want.items():
        assert aot.artifact_arch(cap) == arch
    for cap in [(8, 0), (8, 6), (8, 9), (9, 1), (10, 1), (10, 3), (11, 0), (12, 2), (13, 0), (7, 5)]:
        assert aot.artifact_arch(cap) is None, cap
    assert aot.artifact_arch(None) is None


def test_release_arches_are_the_build_default_and_sm100a_stays_buildable():
    """A default build compiles ``CS.RELEASE_ARCHS`` (the CMake default and the documented one agree); sm_100a is
    not among them (10.0 runs the Triton paths through JIT) but keeps its tables, so TSCT_TRITON_AOT_ARCHS=sm_100a
    still builds it."""
    import re
    from pathlib import Path

    from tsct import config

    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    default = re.search(r'set\(TSCT_TRITON_AOT_ARCHS "([^"]*)" CACHE', cmake).group(1)
    assert default.split(";") == list(CS.RELEASE_ARCHS) == ["sm_90a", "sm_120"]
    assert next(v.default for v in config.BUILD_AND_TOOL_VARIABLES if v.name == "TSCT_TRITON_AOT_ARCHS") == default
    assert "sm_100a" in specs.PTX_ARCH and "sm_100a" in lowbit_specs.AOT_ARCHS and "sm_100a" in specs.CONFIGS
    assert aot.artifact_arch((10, 0)) == "sm_100a"  # an install built with it loads it there


def test_config_overrides_apply_and_bad_ones_name_the_item():
    cfg = CS.config_for((9, 0)).update(" stages_dz_t=3, warps_up_lb=2 , bm=32")
    assert (cfg.glu.stages_dz_t, cfg.lowbit.warps_up_lb, cfg.shared.bm) == (3, 2, 32)  # each field in its table
    assert [cfg.table_of(n) for n in ("stages_dz_t", "warps_up_lb", "bm", "bm_down")] == ["glu", "lowbit", "shared",
                                                                                           None]
    assert CS.config_for((9, 0)).update("") == specs.CONFIGS["sm_90a"]  # "" changes nothing
    for bad, words in (("stages_dz=3", "unknown field 'stages_dz'"), ("stages_dz_t", "expected stages_dz_t=<integer"),
                       ("stages_dz_t=two", "expected stages_dz_t=<integer"), ("=3", "unknown field ''"),
                       ("bm=-64", "bm must be a power of two"), ("warps_up=-1", "warps_up must be a power of two"),
                       ("bm=0", "bm must be a power of two"), ("bn_up=96", "bn_up must be a power of two"),
                       ("warps_dwd=6", "warps_dwd must be a power of two"), ("vec_up=2", "vec_up must be 0 or 1"),
                       ("fs_dz_native=0", "fs_dz_native must be an integer >= 1"),
                       ("regs_dwd=70", "regs_dwd must be one of 0, 64, 72, 80, 96, 128"),
                       ("stages_up=0", "stages_up must be an integer >= 1"),
                       ("chunk_bwd=96", r"chunk_bwd \(96\) must be a multiple of bm \(64\)"),
                       ("bm=128,chunk_bwd=64", r"chunk_bwd \(64\) must be a multiple of bm \(128\)"),
                       ("bm=32,warps_up=2,bm=64", "bm is given twice")):
        with pytest.raises(ValueError, match=words):
            CS.config_for((9, 0)).update(bad)
    # counts need not be powers of two; switches take 0 and 1
    assert CS.config_for((9, 0)).update("ndb_bwd=3,fs_dwd=12,vec_up=0").glu.ndb_bwd == 3
    for retired in ("dz_native=0", "down_native_lb=0", "sign_native_lb=1"):  # the CUDA stand-ins are dispatch rows
        with pytest.raises(ValueError, match=r"unknown field .*rows of tsct.dispatch.CUDA_KERNELS.*TSCT_CUDA_KERNELS"):
            CS.config_for((9, 0)).update(retired)
    # blanks around "=" as around the items
    assert CS.config_for((9, 0)).update(" bm = 32 ,warps_up= 2").shared.bm == 32


def test_every_arch_config_obeys_the_override_rules():
    """The shipped tables hold only values an override could set (the rules describe the fields as they are)."""
    names = [f.name for t in (CS.SharedTiles, CS.GluTiles, CS.LowbitTiles) for f in dataclasses.fields(t)]
    assert len(names) == len(set(names))  # one override string names any field of any table
    assert CS.SWITCH_FIELDS <= set(names) and CS.POW2_FIELDS <= set(names)
    for arch, cfg in CS.CONFIGS.items():
        for table in (cfg.shared, cfg.glu, cfg.lowbit):
            for f in dataclasses.fields(table):
                rule, ok = CS.field_rule(f.name)
                assert ok(getattr(table, f.name)), f"{arch}: {f.name}={getattr(table, f.name)} is not {rule}"
        assert cfg.shared.chunk_bwd % cfg.shared.bm == 0, arch


def test_config_override_from_the_environment_is_named(monkeypatch):
    from tsct import config
    from tsct.kernels.triton_common import runtime

    monkeypatch.setattr(config, "triton_glu_cfg", "bm=32")
    assert {c.shared.bm for c in runtime._arch_configs().values()} == {32}
    monkeypatch.setattr(config, "triton_glu_cfg", "bm_down=32")
    with pytest.raises(ValueError, match=r"TSCT_TRITON_GLU_CFG='bm_down=32': .*unknown field 'bm_down'"):
        runtime._arch_configs()


def test_install_holds_every_manifest_cubin():
    sec = _aot_section()
    assert sec["triton_version"] == CS.TRITON_VERSION
    assert set(sec["archs"]) == set(CS.RELEASE_ARCHS)  # a default build
    for arch, info in sec["archs"].items():
        idx = aot.index(arch)
        assert idx is not None, f"{aot.aot_dir() / arch / 'index.json'} missing"
        entries = idx["kernels"]
        assert len(entries) == info["variants"]
        counts: dict = {}
        for key, e in entries.items():
            counts[e["kernel"]] = counts.get(e["kernel"], 0) + 1
            assert e["key"] == key
            data = (aot.aot_dir() / arch / e["file"]).read_bytes()
            assert data[:4] == b"\x7fELF", e["file"]
            assert hashlib.sha256(data).hexdigest() == e["sha256"], e["file"]
            assert e["num_ctas"] == 1 and 1 <= e["num_warps"] <= 32
            assert e["shared"] <= CS.MAX_SHARED[arch]
            names = [p["name"] for p in e["params"]]
            fam_name, fam = next((n, f) for n, f in (("glu", specs), ("lowbit", lowbit_specs))
                                 if e["kernel"] in f.KERNELS)
            assert names == list(fam.KERNELS[e["kernel"]].params) + list(CS.SCRATCH_PARAMS), key
            assert e["family"] == fam_name and e["ptx_arch"] == fam.PTX_ARCH[arch][1], key
        assert counts == info["kernels"]
        # the index holds exactly the tables' specializations (bf16 family, + low-bit on its arches)
        want = {s.key for s in specs.enumerate_specs(arch)}
        fams = {"glu": len(want)}
        if arch in lowbit_specs.AOT_ARCHS:
            keys = {s.key for s in lowbit_specs.enumerate_specs(arch)}
            want |= keys
            fams["lowbit"] = len(keys)
        assert set(entries) == want
        assert fams.get("lowbit", n_lowbit(arch)) == n_lowbit(arch), fams
        assert {f: v["variants"] for f, v in idx["families"].items()} == fams, idx["families"]


def _cuobjdump():
    exe = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not exe:
        for d in sys.path:
            hits = glob.glob(os.path.join(d, "nvidia", "*", "bin", "cuobjdump"))
            if hits:
                exe = hits[0]
                break
    return exe


def test_cubins_have_the_arch_matrix_instructions():
    sec = _aot_section()
    exe = _cuobjdump()
    if not exe:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    for arch in sec["archs"]:
        entries = aot.index(arch)["kernels"]
        cc = CS.TARGET_CAPABILITY[arch]
        for kname in GEMM_KERNELS:
            # one aligned and one generic variant per kernel (the full set takes minutes; bf16: no fp16 cubins)
            sample = [e for e in entries.values() if e["kernel"] == kname]
            picks = [next(e for e in sample if e["aligned"] and "bf16" in e["key"]),
                     next(e for e in sample if not e["aligned"] and "bf16" in e["key"])]
            for e in picks:
                sass = subprocess.run([exe, "-sass", str(aot.aot_dir() / arch / e["file"])], check=True,
                                      capture_output=True, text=True).stdout
                assert f"code for sm_{cc}" in sass or f"arch = sm_{cc}" in sass, (arch, e["file"])
                assert MMA[arch] in sass, f"{arch} {e['key']}: no {MMA[arch]} in the SASS"
                if arch == "sm_120":
                    assert "code for sm_120a" not in sass  # plain sm_120: loads on 12.0 and 12.1


def test_pack_args_layout():
    params = [{"name": "a_ptr", "type": "*bf16"}, {"name": "n", "type": "i32"}, {"name": "b_ptr", "type": "*i8"},
              {"name": "big", "type": "i64"}, {"name": "global_scratch", "type": "*i8"},
              {"name": "profile_scratch", "type": "*i8"}]
    arr, keep = aot.pack_args(params, [0x7F0012345600, -7, None, 1 << 40])
    assert len(arr) == 6
    assert ctypes.c_uint64.from_address(arr[0]).value == 0x7F0012345600
    assert ctypes.c_int32.from_address(arr[1]).value == -7
    assert ctypes.sizeof(keep[1]) == 4 and ctypes.sizeof(keep[0]) == 8
    assert ctypes.c_uint64.from_address(arr[2]).value == 0
    assert ctypes.c_int64.from_address(arr[3]).value == 1 << 40
    assert ctypes.c_uint64.from_address(arr[4]).value == 0 and ctypes.c_uint64.from_address(arr[5]).value == 0
    with pytest.raises(OverflowError):
        aot.pack_args(params, [0, 1 << 31, None, 0])
    with pytest.raises(ValueError):
        aot.pack_args(params, [0, 1])


def test_pack_args_matches_a_real_index_entry():
    sec = _aot_section()
    idx = aot.index(next(iter(sec["archs"])))
    e = next(v for v in idx["kernels"].values() if v["kernel"] == "glu_down_fwd")
    vals = [0x1000 * (i + 1) if p["type"].startswith("*") else i for i, p in enumerate(e["params"][:-2])]
    arr, _ = aot.pack_args(e["params"], vals)
    assert len(arr) == len(specs.KERNELS["glu_down_fwd"].params) + 2
    for i, p in enumerate(e["params"][:-2]):
        ct = ctypes.c_uint64 if p["type"].startswith("*") else ctypes.c_int32
        assert ct.from_address(arr[i]).value == vals[i], p


class _FakeLib:
    """tsct_triton_load / tsct_triton_launch recording the argument slots (what the driver would copy)."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def tsct_triton_load(self, key, image, size, fn, nparams, shared, block_x, out):
        return 0

    def tsct_triton_launch(self, handle, gx, gy, gz, stream, args, nargs):
        assert nargs == self.n
        self.calls.append(((gx, gy, gz), stream, [bytes((ctypes.c_char * 8).from_address(args[i])) for i in range(nargs)]))
        return 0


def test_fast_launch_writes_the_same_argument_bytes_as_pack_args(monkeypatch, tmp_path):
    from tsct.native import _loader

    params = [{"name": "a_ptr", "type": "*bf16"}, {"name": "n", "type": "i32"}, {"name": "b_ptr", "type": "*i8"},
              {"name": "big", "type": "i64"}, {"name": "s", "type": "fp32"}, {"name": "u", "type": "u32"},
              {"name": "global_scratch", "type": "*i8"}, {"name": "profile_scratch", "type": "*i8"}]
    (tmp_path / "k.cubin").write_bytes(b"\0")
    monkeypatch.setattr(aot, "aot_dir", lambda: tmp_path.parent)
    k = aot.AotKernel(tmp_path.name, {"params": params, "num_warps": 4, "shared": 0, "file": "k.cubin",
                                      "function": "k"})
    lib = _FakeLib(len(params))
    monkeypatch.setattr(_loader, "get_lib", lambda: lib)
    for vals in ([0x7F0012345600, -7, None, 1 << 40, 1.5, 3], [16, (1 << 31) - 1, 32, -(1 << 63), -0.0, 0]):
        k.launch((3, 2), vals, 77)
        grid, stream, got = lib.calls[-1]
        arr, _ = aot.pack_args(params, vals)
        want = [bytes((ctypes.c_char * ctypes.sizeof(c)).from_address(arr[i])) for i, c in enumerate(_)]
        assert grid == (3, 2, 1) and stream == 77
        for g, w, p in zip(got, want, params):
            assert g[:len(w)] == w, p["name"]  # the value in the slot's low bytes (little-endian ABI)
    with pytest.raises(OverflowError, match="n = 2147483648"):
        k.launch((1,), [0, 1 << 31, None, 0, 0.0, 0], 0)
    with pytest.raises(ValueError, match="expected 6 arguments"):
        k.launch((1,), [0, 1], 0)
    n = len(lib.calls)
    k.launch((0, 5), [0, 1, None, 0, 0.0, 0], 0)  # an empty grid launches nothing
    assert len(lib.calls) == n


def test_family_takes_the_generic_variant_when_a_hinted_pointer_is_misaligned(monkeypatch):
    """The launch cache keeps the alignment check per call: the same signature with a 2-byte-offset
    pointer must run the generic cubin, and a cached signature does not look the index up again."""
    looked_up, ran = [], []

    class _K:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            ran.append(self.key.rsplit("|", 1)[-1])

    def kernel(arch, key):
        looked_up.append(key)
        return _K(key)

    fam = launch.Family("test", specs, "tsct.kernels.triton_glu._kernels")
    monkeypatch.setattr(aot, "artifact_arch", lambda cap: "sm_90a")
    monkeypatch.setattr(aot, "kernel", kernel)
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    buf = torch.zeros(64, dtype=torch.bfloat16)
    out_ok, out_bad = buf[:32], buf[1:33]  # 64-byte aligned storage start vs +2 bytes
    assert out_ok.data_ptr() % 16 == 0 and out_bad.data_ptr() % 16 == 2
    offs = torch.zeros(4, dtype=torch.int32)
    consts = dict(BM=64, BN=64)
    for out in (out_ok, out_bad, out_ok):
        fam.launch("zero_tail_rows", (1, 1), [out, offs, 4, 8, 8], consts, 4, 3, True, (9, 0), torch.device("cpu"))
    assert ran == ["a16", "gen", "a16"]
    assert len(looked_up) == 2  # aligned + generic keys, once
    fam.launch("zero_tail_rows", (1, 1), [out_ok, offs, 4, 8, 7], consts, 4, 3, True, (9, 0), torch.device("cpu"))
    assert ran[-1] == "a16"  # ncols is not a hinted parameter: an odd value keeps the aligned variant
    assert fam.backend_counts()[("aot", "zero_tail_rows")] == 4


def test_register_cap_is_part_of_the_key_and_reaches_the_compiler(monkeypatch):
    """A launch with a register cap (``maxnreg``, ``SharedTiles.regs_dwd``) looks up the variant whose key ends its
    compile options with ``r<N>``, a separate entry from the uncapped one (whose key is as it always was), and a JIT
    launch passes the cap to Triton; without a cap nothing is passed. The field takes only its built values."""
    import sys
    import types

    tys = dict(out_ptr="*bf16", offs_ptr="*i32", E="i32", M="i32", ncols="i32")
    assert CS.spec_key("zero_tail_rows", tys, dict(BM=64, BN=64), 4, 3, True).endswith("|w4s3|a16")
    capped = CS.spec_key("zero_tail_rows", tys, dict(BM=64, BN=64), 4, 3, True, maxnreg=80)
    assert capped.endswith("|w4s3r80|a16")
    spec = CS.make_spec("zero_tail_rows", dict(out_ptr="*bf16", offs_ptr="*i32"), dict(BM=64, BN=64), 4, 3, True,
                        maxnreg=80)
    assert spec.key == capped and spec.maxnreg == 80

    looked_up = []
    monkeypatch.setattr(aot, "artifact_arch", lambda cap: "sm_90a")
    monkeypatch.setattr(aot, "kernel", lambda arch, key: looked_up.append(key))
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "auto")
    seen = []

    class _Jit:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

    fake = types.ModuleType("tsct_test_fake_jit_regs")
    fake.triton = types.SimpleNamespace(__version__=CS.TRITON_VERSION)
    fake.zero_tail_rows = _Jit()
    monkeypatch.setitem(sys.modules, "tsct_test_fake_jit_regs", fake)
    monkeypatch.setattr(launch, "triton_importable", lambda: True)
    fam = launch.Family("test", CS, "tsct_test_fake_jit_regs")
    out, offs = torch.zeros(64, 8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int32)
    for regs in (80, 0):
        assert fam.launch("zero_tail_rows", (1, 1), [out, offs, 4, 64, 8], dict(BM=64, BN=64), 4, 3, True, (9, 0),
                          torch.device("cpu"), regs) == "jit"  # no such cubin (the stub): JIT
    assert looked_up[0] == capped and looked_up[-1].endswith("|w4s3|gen")
    assert seen[0]["maxnreg"] == 80 and "maxnreg" not in seen[1]
    assert CS.CONFIGS["sm_90a"].update("regs_dwd=80").shared.regs_dwd == 80
    with pytest.raises(ValueError, match="regs_dwd"):
        CS.CONFIGS["sm_90a"].update("regs_dwd=81")


def test_family_jit_launch_compiles_the_consts_the_specs_allow_for_that_triton(monkeypatch):
    """A JIT launch under a Triton other than the pinned one turns off what only the pinned Triton compiles correctly
    (the low-bit byte planes: wrong products under Triton 3.6 with mma.sync); a JIT launch under the
    pinned Triton, and one under Triton's interpreter, keep them."""
    import sys
    import types

    LS = lowbit_specs
    seen = []

    class _Jit:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

    for version, interp, planes in (("3.6.0", "0", False), (CS.TRITON_VERSION, "0", True), ("3.6.0", "1", True)):
        monkeypatch.setenv("TRITON_INTERPRET", interp)
        fake = types.ModuleType("tsct_test_fake_jit")
        fake.triton = types.SimpleNamespace(__version__=version)
        fake.lowbit_up_fwd = _Jit()
        monkeypatch.setitem(sys.modules, "tsct_test_fake_jit", fake)
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "jit")
        fam = launch.Family("test", LS, "tsct_test_fake_jit")
        t = torch.zeros(8, dtype=torch.bfloat16)
        fam.launch("lowbit_up_fwd", (1,), [t] + [None] * 7 + [1, 64, 8, 8],
                   dict(FMT_D=1, PLANES=True, SINGLE_K=True, BK=64), 8, 2, True, (12, 0), torch.device("cpu"))
        assert seen[-1]["PLANES"] is planes and seen[-1]["FMT_D"] == 1 and seen[-1]["BK"] == 64, (version, interp)
    assert LS.jit_consts("lowbit_bwd_dz", dict(FMT_D=1), "3.6.0") == dict(FMT_D=1)
    assert LS.jit_consts("lowbit_down_fwd", dict(PLANES=True, BM=64), "3.6.0") == dict(PLANES=False, BM=64)


# ---- dry run of glu.py's host code on the CPU -----------------------------------------------------

# the shapes of tests/kernels/test_triton_glu_gpu.py (name, T, k, E, d, r, f, gather, scatter, scales, rw, idx,
# dtype); its fp16 cases have no cubins (JIT: tests/package/test_dispatch_no_cubins.py)
_CASES = [
    ("b1_small", 256, 2, 64, 2048, 64, 5461, True, True, torch.float32, torch.float32, torch.int64, torch.bfloat16),
    ("bf16scales_i32", 64, 2, 16, 2048, 64, 5461, True, True, torch.bfloat16, torch.bfloat16, torch.int32,
     torch.bfloat16),
    ("f37", 50, 2, 6, 64, 16, 37, True, True, torch.bfloat16, torch.bfloat16, torch.int32, torch.bfloat16),
    ("d40_r24", 12, 1, 8, 40, 24, 100, True, True, torch.float32, torch.float32, torch.int64, torch.bfloat16),
    ("nogather", 100, 2, 4, 128, 32, 200, False, False, torch.float32, torch.float32, torch.int64, torch.bfloat16),
    ("d16_r16_noscales", 64, 2, 8, 16, 16, 72, True, True, None, None, torch.int64, torch.bfloat16),
    ("r4096", 40, 2, 3, 256, 4096, 96, True, True, torch.float32, torch.float32, torch.int64, torch.bfloat16),
    ("r100_d200", 64, 2, 6, 200, 100, 333, True, True, torch.float32, torch.float32, torch.int64, torch.bfloat16),
    ("r128", 32, 2, 4, 64, 128, 64, True, True, torch.float32, None, torch.int64, torch.bfloat16),
    ("r32_gather_only", 96, 2, 5, 96, 48, 257, True, False, torch.float32, torch.float32, torch.int64,
     torch.bfloat16),
    ("one_scale", 32, 2, 4, 64, 32, 64, False, True, torch.float32, None, torch.int64, torch.bfloat16),
    # ~256 rows per expert: experts of several row tiles (their dW through the chunked kernels)
    ("few_large_experts", 512, 2, 4, 128, 32, 40, True, True, torch.float32, torch.float32, torch.int64,
     torch.bfloat16),
]


@pytest.mark.parametrize("cap", [(9, 0), (10, 0), (12, 0), (12, 1)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_every_glu_launch_has_an_aot_variant(cap, monkeypatch):
    arch = aot.artifact_arch(cap)
    if aot.index(arch) is None:
        pytest.skip(f"no AOT cubins for {arch} in this install")
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu

    launched = []

    def record(self, grid, values, stream):
        assert len(values) == len(self.params) - 2
        assert all(int(g) >= 0 for g in grid)
        launched.append(self.entry["key"])

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(C, "device_capability", lambda dev: cap)
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(aot.AotKernel, "launch", record)
    g = torch.Generator().manual_seed(0)
    for (name, T, k, E, d, r, f, gather, scatter, s_dt, rw_dt, idx_dt, dt) in _CASES:
        m = T * k
        counts = torch.full((E,), m // E)
        counts[-1] += m - int(counts.sum())
        offs = counts.cumsum(0).to(torch.int32)
        x = torch.randn(T if gather else m, d, generator=g).to(dt)
        wg, wu = torch.randn(E, d, r).to(dt), torch.randn(E, d, r).to(dt)
        wd_rowmajor = torch.randn(E, r, f).to(dt)
        sg = torch.rand(E, r).to(s_dt) if s_dt else None
        su = (torch.rand(E, r).to(s_dt) if s_dt else None) if name != "one_scale" else None
        rw = torch.rand(m).to(rw_dt) if rw_dt else None
        tok = torch.arange(m) // k
        gi = tok.to(idx_dt) if gather else None
        si = tok.to(idx_dt) if scatter else None
        n_out = T if scatter else None
        # w_down row-major, then K-major (the transpose of a contiguous [E, f, r]: WD_T when aligned)
        for wd in (wd_rowmajor, to_kmajor(wd_rowmajor)):
            launched.clear()
            glu.grouped_glu_forward(x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out)
            _, saved = glu.grouped_glu_forward_saved(x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out)  # the op's
            go = torch.randn(T if scatter else m, f).to(dt)
            for need in ([True] * 7, [True] + [False] * 6, [False, True, True, False, False, False, False],
                         [False, False, False, True, False, False, True]):
                glu.grouped_glu_backward(go, x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out, need)
                glu.grouped_glu_backward(go, x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out, need, saved=saved)
            assert len(launched) >= 4, name
            names = {kk.split("|")[0] for kk in launched}
            assert names >= {"glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_epi"}, name
            assert "tile_cum" not in names, name  # the down kernel forms the tile map itself
            assert not scatter or any(kk.startswith("csr_keys|") for kk in launched), name
            wd_t = {kk.split("|")[0] for kk in launched if "WD_T=1" in kk}
            kmajor_aligned = not wd.is_contiguous() and d % 16 == 0 and r % 16 == 0
            # the chunked dW_down of experts with several row tiles writes the K-major layout too
            want = {"glu_up_fwd", "glu_bwd_dz"} | ({"glu_bwd_dwd"} & names)
            assert wd_t == (want if kmajor_aligned else set()), (name, wd_t)


def _dry_run_against_tables(monkeypatch, cap, families) -> tuple[list, list]:
    """Launches on compute capability ``cap`` resolve against the AOT tables of ``families`` (their specs modules,
    ``enumerate_specs``; no install needed) and run nothing: returns the lists (``launched``, ``missing``) of the keys
    launched and of the keys no table holds, filled as the host code runs. Each launch is checked for one value per
    kernel parameter and a grid of no negative extent."""
    from tsct.kernels.triton_common import runtime as C

    arch = aot.artifact_arch(cap)
    table = {s.key for f in families for s in f.enumerate_specs(arch)}
    params = {k: info.params for f in families for k, info in f.KERNELS.items()}
    launched, missing = [], []

    class _Rec:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            assert len(values) == len(params[self.key.split("|")[0]]), self.key
            assert all(int(g) >= 0 for g in grid), (self.key, grid)
            launched.append(self.key)

    def kernel(arch_, key):
        if key in table:
            return _Rec(key)
        missing.append(key)
        return None

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(C, "device_capability", lambda dev: cap)
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(aot, "kernel", kernel)
    monkeypatch.setattr(aot, "index", lambda arch_: {"kernels": {}})
    return launched, missing


@pytest.mark.parametrize("cap", [(9, 0), (10, 0), (12, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_every_glu_launch_is_in_the_table(cap, monkeypatch):
    """The same dry run against the AOT table itself (``specs.enumerate_specs``; no install needed), with a skewed
    routing (one expert holding most rows, empty experts) and chunks of one row tile, so that the backward's chunked
    dW kernels, their workspace slots and the slot sums launch too."""
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu

    arch = aot.artifact_arch(cap)
    launched, missing = _dry_run_against_tables(monkeypatch, cap, (specs,))
    monkeypatch.setitem(C.ARCH_CONFIGS, arch, C.ARCH_CONFIGS[arch].update("chunk_bwd=64"))
    g = torch.Generator().manual_seed(1)
    dwd_keys = []
    for (name, T, k, E, d, r, f, gather, scatter, s_dt, rw_dt, idx_dt, dt) in _CASES:
        m = T * k
        counts = torch.zeros(E, dtype=torch.int64)
        counts[E // 2] = m - (E - 1) // 2  # most rows in one expert, every other expert empty
        counts[1::2][: (E - 1) // 2] = 1
        offs = counts.cumsum(0).to(torch.int32)
        x = torch.randn(T if gather else m, d, generator=g).to(dt)
        wg, wu, wd = torch.randn(E, d, r).to(dt), torch.randn(E, d, r).to(dt), torch.randn(E, r, f).to(dt)
        sg = torch.rand(E, r).to(s_dt) if s_dt else None
        su = (torch.rand(E, r).to(s_dt) if s_dt else None) if name != "one_scale" else None
        rw = torch.rand(m).to(rw_dt) if rw_dt else None
        tok = torch.arange(m) // k
        gi = tok.to(idx_dt) if gather else None
        si = tok.to(idx_dt) if scatter else None
        n_out = T if scatter else None
        go = torch.randn(T if scatter else m, f).to(dt)
        for w_down in (wd, to_kmajor(wd)):
            launched.clear()
            _, saved = glu.grouped_glu_forward_saved(x, offs, wg, wu, w_down, sg, su, rw, gi, si, n_out)
            for need in ([True] * 7, [True] + [False] * 6, [False, True, True, True, False, False, False]):
                glu.grouped_glu_backward(go, x, offs, wg, wu, w_down, sg, su, rw, gi, si, n_out, need, saved=saved)
            names = {kk.split("|")[0] for kk in launched}
            want = {"bwd_maps", "glu_bwd_dz", "glu_bwd_dwd", "glu_bwd_epi", "glu_bwd_dx_dw", "glu_bwd_dw"}
            assert names >= want | ({"bwd_slot_reduce"} if m > 64 else set()), (name, names)
            # the register cap of the arch's table on the K-major glu_bwd_dwd only (SharedTiles.dwd_maxnreg)
            dwd_keys += [kk for kk in launched if kk.startswith("glu_bwd_dwd|")]
    assert not missing, f"{len(missing)} launches have no variant in the {arch} table, e.g. {missing[:3]}"
    # the arch's register cap on the K-major glu_bwd_dwd only (SharedTiles.dwd_maxnreg: sm_90a's 80), both launched
    regs = C.ARCH_CONFIGS[arch].shared.regs_dwd
    caps = {(("WD_T=1" in kk), int(re.fullmatch(r"w\d+s\d+(?:r(\d+))?", kk.split("|")[-2]).group(1) or 0))
            for kk in dwd_keys}
    assert caps == {(True, regs), (False, 0)}, caps


def _selftest_dry_run(monkeypatch, cap) -> tuple[list, list]:
    """``_dry_run_against_tables`` of both families on ``cap``, set for the first-use self-test and the layers on the
    CPU: ``impl="auto"`` is triton-bf16 (no dispatch row here), the self-test's tolerance passes anything (nothing
    computes) so its backward runs, memory is zeroed, and calls take a plain eager call's route on a GPU (the custom
    op's forward saves always; an inference forward then runs the plain one), without replay."""
    from tsct import config, selftest
    from tsct.ops import _eager, _select

    found = _dry_run_against_tables(monkeypatch, cap, (specs, lowbit_specs))
    real_empty = torch.empty
    monkeypatch.setattr(_select, "select", lambda impl, cap_, fmt, *a, **k: "triton-bf16" if impl == "auto" else impl)
    monkeypatch.setattr(selftest, "_TOL", {torch.bfloat16: float("inf")})
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).zero_())
    monkeypatch.setattr(_eager, "direct_ok", lambda x, *others: True)
    monkeypatch.setattr(config, "eager_replay", False)
    return found


@pytest.mark.parametrize("cap", [(9, 0), (12, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_first_use_selftest_launches_only_compiled_variants(cap, monkeypatch):
    """The first-use self-test (``tsct.selftest.grouped_glu``: what a child process runs before a Triton path serves on
    an untested arch, on a card that may have no Triton for JIT) dry-run through the op: every launch of its forward
    and backward, the hot expert's chunked reductions and the packed factors' straight-through dW included, is a
    variant of the arch's AOT tables."""
    from tsct import selftest

    arch = aot.artifact_arch(cap)
    launched, missing = _selftest_dry_run(monkeypatch, cap)
    for path, fmt in (("triton-bf16", "bf16"), ("triton-lowbit", "nvfp4"), ("triton-lowbit", "sign"),
                      ("triton-lowbit", "mixed")):
        res = selftest.grouped_glu(path, torch.device("cpu"), torch.bfloat16, fmt, backward=True)
        assert "gradient" in res.detail, (path, fmt, res.detail)  # the backward ran
    names = {kk.split("|")[0] for kk in launched}
    assert names >= {"glu_bwd_dwd", "glu_bwd_dw", "bwd_slot_reduce", "lowbit_bwd_dz", "lowbit_bwd_dx_dw"}, names
    assert any("DO_DW=1" in kk for kk in launched if kk.startswith("lowbit_bwd_dx_dw|"))
    # dense factors run w_down in both layouts: the K-major variants (tsct.nn's layout) and the row-major ones
    for kernel in ("glu_up_fwd", "glu_bwd_dwd") + (("glu_bwd_dz",) if cap[0] == 12 else ()):
        wd_t = {("WD_T=1" in kk) for kk in launched if kk.startswith(kernel + "|")}
        assert wd_t == {False, True}, (kernel, wd_t)
    # the forward that saves for the backward and the plain one of inference (torch.no_grad), both families
    for kernel in ("glu_down_fwd", "lowbit_down_fwd"):
        bwd = {("BWD=1" in kk) for kk in launched if kk.startswith(kernel + "|")}
        assert bwd == {False, True}, (kernel, bwd)
    assert not missing, f"{len(missing)} self-test launches have no variant in the {arch} tables, e.g. {missing[:3]}"


@pytest.mark.parametrize("cap", [(9, 0), (10, 0), (12, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_the_tables_are_exactly_what_the_host_code_launches(cap, monkeypatch):
    """The launch ledger (``_aot_ledger``: the host code of both families and the router's sort, dry-run over the
    product of every input class they tell apart) against the tables the AOT build compiles for the arch: every key
    the host code requests is compiled (no launch of a supported input falls back to JIT), and every compiled key is
    requested (no cubin the dispatch cannot select). The ledger covers the activation dtypes and factor formats that
    get cubins (``specs.AOT_DTYPES``, ``triton_lowbit.specs.AOT_FORMATS``); the others run through JIT, and without
    it the status sends ``auto`` to bmm (tests/package/test_dispatch_no_cubins.py)."""
    from tsct import config

    if config.triton_glu_cfg:
        pytest.skip("TSCT_TRITON_GLU_CFG changes the tile configs the host code launches with, not the tables")
    arch = aot.artifact_arch(cap)
    table = {s.key for s in specs.enumerate_specs(arch)} | {s.key for s in lowbit_specs.enumerate_specs(arch)}
    if arch == "sm_100a" and _aot_ledger.triton_config(arch) == _aot_ledger.triton_config("sm_90a"):
        # the host code launches the same Triton keys where the tile configs differ only in the CUDA kernels taken
        # instead of some launches: the same ledger as sm_90a's (checked there), so the same tables
        other = {s.key for f in (specs, lowbit_specs) for s in f.enumerate_specs("sm_90a")}
        assert table == other
        return
    launched = _aot_ledger.ledger(cap, monkeypatch)
    missing, unused = sorted(launched - table), sorted(table - launched)
    assert not missing, f"{len(missing)} launches have no variant in the {arch} tables, e.g. {missing[:3]}"
    assert not unused, f"{len(unused)} variants of the {arch} tables are never launched, e.g. {unused[:3]}"


def test_chunk_size_bounds_the_workspace():
    """The chunk rows of the backward's dW reductions: the config's (a multiple of BM), doubled until the worst case's
    workspace (cdiv(2 M, CH) slots) fits the bound, a function of the shape only (docs/decisions/0016)."""
    from tsct.kernels.triton_common import runtime as C

    cfg = CS.config_for((9, 0))
    slot = max(64 * 5461, 2 * 2048 * 64)  # b1: dWd is the largest per-expert block
    assert C.chunk_size(cfg, 32768, slot) == 512  # b1: 128 slots, 179 MB
    assert C.chunk_size(cfg, 131072, slot) == 2048  # T 65536: 128 slots
    for m in (1, 100, 5000, 32768, 131072, 1 << 22):
        ch = C.chunk_size(cfg, m, slot)
        assert ch % cfg.shared.bm == 0 and ch >= cfg.shared.chunk_bwd
        assert ch >= m or -(-2 * m // ch) * slot * 4 <= cfg.shared.ws_bwd_mib << 20, (m, ch)
    small = CS.config_for((12, 0))
    assert small.shared.ws_bwd_mib < cfg.shared.ws_bwd_mib and C.chunk_size(small, 32768, slot) == 2048


def test_status_reasons(monkeypatch, tmp_path):
    from tsct import config
    from tsct.kernels import triton_glu as TG

    monkeypatch.setattr(config, "cuda_kernels", "auto")

    # a fake install with sm_90a cubins only
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "index.json").write_text(json.dumps({"arch": "sm_90a", "kernels": {"k": {}}}))
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    aot._reset_for_tests()
    try:
        from tsct import native

        # sm_90a's backward dz runs in CUDA when the native library loads (decision 0013): the reason says which
        dz = ("; backward dz: CUDA (bf16, r = 64, K-major w_down)" if native.available() else
              "; backward dz: Triton (the native library for the CUDA dz is not loadable)")
        assert TG.status((9, 0), "bf16") == (True, "AOT cubins for sm_90a" + dz)
        ok, why = TG.status((12, 0), "bf16")
        assert ok == (why == "Triton JIT")
        assert not TG.status((9, 0), "nvfp4")[0]
        assert not TG.status(None, "bf16")[0]
        monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
        ok, why = TG.status((12, 0), "bf16")
        assert not ok and "no AOT cubins" in why
        assert TG.status((9, 0), "bf16", "bf16") == (True, "AOT cubins for sm_90a" + dz)
        ok, why = TG.status((9, 0), "fp16", "fp16")  # no fp16 cubins
        assert not ok and why == ("TSCT_TRITON_BACKEND=aot but this install has no cubin for fp16 activations "
                                  "(Triton JIT runs them)")
        monkeypatch.setattr(config, "cuda_kernels", "lowbit_down_fwd,lowbit_up_fwd")
        assert TG.status((9, 0), "bf16") == (True, "AOT cubins for sm_90a")
    finally:
        aot._reset_for_tests()


def test_cuda_dz_only_where_timed(monkeypatch):
    """The CUDA glu_bwd_dz (decision 0013) is a dispatch row for sm_90a only: JIT arches (sm_86 / sm_89 lack its
    99 KB of shared memory), sm_100a and sm_120 take the Triton kernel; ``TSCT_CUDA_KERNELS`` turns rows off."""
    from tsct import config, dispatch
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu

    monkeypatch.setattr(config, "cuda_kernels", "auto")
    assert C.cuda_kernel("glu_bwd_dz", (9, 0), "bf16")
    assert not C.cuda_kernel("glu_bwd_dz", (9, 0), "fp16")
    for cap in ((8, 0), (8, 6), (8, 9), (10, 0), (10, 3), (12, 0), (12, 1)):
        assert not C.cuda_kernel("glu_bwd_dz", cap, "bf16"), cap
        assert not any(C.cuda_kernel(k.replaces, cap, f) for k in dispatch.CUDA_KERNELS for f in k.formats), cap
    for setting, on in (("none", False), ("off", False), ("0", False), ("glu_bwd_dz", True),
                        (" lowbit_up_fwd , glu_bwd_dz", True), ("lowbit_down_fwd", False), ("", True)):
        monkeypatch.setattr(config, "cuda_kernels", setting)
        assert C.cuda_kernel("glu_bwd_dz", (9, 0), "bf16") == on, setting
    monkeypatch.setattr(config, "cuda_kernels", "glu_bwd_dz,dz")
    with pytest.raises(ValueError, match=r"TSCT_CUDA_KERNELS.*unknown \['dz'\]"):
        C.cuda_kernel("glu_bwd_dz", (9, 0), "bf16")
    for setting in (",", " , ,"):  # a list naming no kernel is a mistake, not "none"
        monkeypatch.setattr(config, "cuda_kernels", setting)
        with pytest.raises(ValueError, match="TSCT_CUDA_KERNELS.*names no kernel"):
            C.cuda_kernel("glu_bwd_dz", (9, 0), "bf16")
    for setting in ("none,glu_bwd_dz", "glu_bwd_dz, auto"):
        monkeypatch.setattr(config, "cuda_kernels", setting)
        with pytest.raises(ValueError, match=r"TSCT_CUDA_KERNELS.*\['(none|auto)'\] cannot be combined with kernel"):
            C.cuda_kernel("glu_bwd_dz", (9, 0), "bf16")
    monkeypatch.setattr(config, "cuda_kernels", "auto")
    for setting in ("auto", "none"):  # a Triton kernel no row names is the caller's mistake, whatever the setting
        monkeypatch.setattr(config, "cuda_kernels", setting)
        with pytest.raises(ValueError, match=r"replaces='glu_bwd_dzz' is no row of CUDA_KERNELS"):
            C.cuda_kernel("glu_bwd_dzz", (9, 0), "bf16")
    monkeypatch.setattr(config, "cuda_kernels", "auto")
    # the launch-level conditions: bf16, r = 64, K-major, CUDA tensors (a CPU tensor never takes it)
    cfg = C.tile_config((9, 0))
    cpu = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert not glu._native_dz(cfg, (9, 0), True, 64, torch.bfloat16, cpu, cpu)


def test_kernel_table_matches_the_triton_sources():
    pytest.importorskip("triton")
    from tsct.kernels.triton_glu import _kernels as K

    for name, info in specs.KERNELS.items():
        fn = getattr(K, name)
        assert tuple(a for a in fn.arg_names if a not in info.constexprs) == info.params, name
        assert set(info.constexprs) <= set(fn.arg_names), name


@pytest.mark.parametrize("n_out", [50, 40000])
def test_csr_narrow_keys(n_out):
    """The combine's CSR (rows grouped by target, increasing row order, padding rows last) is the same with
    the int16 keys used below 2**15 - 1 targets as with a plain stable int64 sort."""
    from tsct.kernels.triton_common import runtime as C

    g = torch.Generator().manual_seed(n_out)
    m = 700
    idx = torch.randint(0, n_out, (m,), generator=g)
    offs = torch.tensor([200, 650], dtype=torch.int32)  # rows 650.. are padding
    order, ptr = C.build_csr(idx, offs, m, n_out, (0, 0))
    key = torch.where(torch.arange(m) < 650, idx, n_out)
    want = torch.argsort(key, stable=True)
    assert torch.equal(order, want)
    assert torch.equal(ptr.long(), torch.searchsorted(key[want], torch.arange(n_out + 1)))


def test_first_use_selftest_covers_the_layers_launches(monkeypatch):
    """What ``tsct.nn``'s dense expert layer launches on sm_120 at an aligned shape of the usual kind (r 64, odd f,
    K-major w_down, scales, router weights, gather and scatter through ``sort_by_expert``), in a training step and in
    an evaluation forward, is among what the first-use self-test launches: those variants ran in the child process
    before the path serves on the card."""
    from tsct import selftest
    from tsct.nn import GroupedGLUExperts

    launched, missing = _selftest_dry_run(monkeypatch, (12, 0))
    res = selftest.grouped_glu("triton-bf16", torch.device("cpu"), torch.bfloat16, "bf16", backward=True)
    assert "gradient" in res.detail, res.detail
    tested = set(launched)
    launched.clear()
    layer = GroupedGLUExperts(16, 256, 64, 1365, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 256, generator=g).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 16, (96, 2), generator=g)
    w = torch.rand(96, 2, generator=g).requires_grad_(True)
    layer(x, ids, w).sum().backward()
    with torch.no_grad():
        layer(x, ids, w)
    used = set(launched)
    assert {k.split("|")[0] for k in used} >= {"glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw"}
    assert not missing, missing[:3]
    assert used <= tested, sorted(used - tested)[:4]
