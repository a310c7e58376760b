"""The sm_120 proxy build (docs/decisions/0017), checked without a GPU.

- the proxy's variant table is sm_120's, key for key, compiled with sm_120's GPUTarget and shared-memory limit for
  plain sm_90 (glu and low-bit families); a small real build (pinned Triton): the same keys, warps,
  stages, shared bytes and TTGIR as the sm_120 build, sm_90 PTX and ELF, HMMA and no HGMMA, and the artifact check
  accepts it as a proxy (and refuses a manifest that does not say so); a proxy never builds with release arches;
- a proxy install serves compute capability 9.0 with sm_120's tile config (no CUDA C++ kernel replaces a Triton
  one), and every launch of the host code at the GPU-test shapes finds its key in the proxy's table; an index
  that does not say "proxy" is not one;
- never mistaken for a release: the manifest's "proxy_build", the probe's banner, the artifact summary;
- the per-kernel verdicts: one table (``tsct.kernels.sm120_proxy``) behind VERIFICATION, the probe and docs/sm120.md;
  the stage's launch ledger turns into a RUNS record and verdicts (scripts/proxy_verdicts.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from tsct.bench.measure import gpu_tag
from tsct.kernels import aot, launch, sm120_proxy
from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs
from tsct.kernels.triton_lowbit import specs as LS

ROOT = Path(__file__).resolve().parents[2]
PROXY = "sm_120_proxy_sm90"


def _n_variants(kernel: str) -> int:
    """Variants of a glu kernel in sm_120's table (what a proxy build holds)."""
    return sm120_proxy.table_variants("glu")[kernel]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


AOT_BUILD = ROOT / "python" / "tsct" / "kernels" / "triton_common" / "aot_build.py"


def _load_aot_build():
    """aot_build.py by path (as CMake runs it), without leaving its alias of the shared specs module in sys.modules."""
    name = "tsct.kernels.triton_common.specs"
    saved = sys.modules[name]
    try:
        mod = _load("_tsct_test_aot_build", AOT_BUILD)
        for fam in ("glu", "lowbit"):
            mod.family_specs(fam)  # loaded now, against the build's own copy of the shared specs
    finally:
        sys.modules[name] = saved
    return mod


aot_build = _load_aot_build()
artifacts = _load("_tsct_test_artifacts", ROOT / "python" / "tsct" / "native" / "artifacts.py")


def test_proxy_table_is_sm120s_for_sm90():
    p = CS.PROXIES[PROXY]
    assert (p.of, p.ptx, p.capability, p.families) == ("sm_120", "sm_90", (9, 0), ("glu", "lowbit"))
    assert CS.table_arch(PROXY) == "sm_120" and CS.table_arch("sm_90a") == "sm_90a"
    assert CS.table_arch(None) is None
    assert PROXY not in CS.ARTIFACT_ARCH.values()  # the release table never names it
    for fam in ("glu", "lowbit"):
        assert PROXY in aot_build.family_archs(fam)
        assert aot_build.target(fam, PROXY) == (120, "sm_90", 101376)
        assert aot_build.target(fam, "sm_120") == (120, "sm_120", CS.MAX_SHARED["sm_120"])
        fs = aot_build.family_specs(fam)
        keys = [s.key for s in fs.enumerate_specs(CS.table_arch(PROXY))]
        assert keys == [s.key for s in fs.enumerate_specs("sm_120")]


def _build(tmp_path, *args):
    """aot_build.py in a child process (it patches Triton's compiler module), as the wheel build runs it."""
    import subprocess

    return subprocess.run([sys.executable, str(AOT_BUILD), "--jobs", "1", "--families", "glu,lowbit", "--cache-dir",
                           str(tmp_path / "cache"), *args], capture_output=True, text=True, timeout=900)


def test_aot_build_fails_when_a_kernel_source_changes_while_it_compiles(tmp_path, monkeypatch):
    """An index's "sources" are fingerprinted after the compiles: a kernel file edited in between fails the build,
    instead of indexing cubins under a source they were not compiled from (which a proxy verdict would credit)."""
    pytest.importorskip("triton")
    f = tmp_path / "_kernels.py"
    f.write_text("before\n")
    monkeypatch.setattr(aot_build, "_kernel_files", lambda families: {f: aot_build._sha256(f)})
    monkeypatch.setattr(aot_build, "_init_worker", lambda: None)  # no compiler patch in this process

    def edit_then_compile(family, arch, spec, cache_dir):
        f.write_text("after\n")
        return {"key": spec.key}

    monkeypatch.setattr(aot_build, "_compile", edit_then_compile)
    with pytest.raises(SystemExit, match="changed during the build"):
        aot_build.main(["--out", str(tmp_path / "x"), "--archs", "sm_90a", "--families", "glu", "--jobs", "1",
                        "--limit", "1", "--cache-dir", str(tmp_path / "cache")])
    assert not (tmp_path / "x" / "sm_90a").exists()


def test_a_proxy_build_is_sm120s_variants_assembled_for_sm90(tmp_path):
    pytest.importorskip("triton")
    r = _build(tmp_path, "--out", str(tmp_path / "x"), "--archs", f"sm_90a,{PROXY}")
    assert r.returncode != 0 and "builds alone" in r.stderr, r.stderr
    rel, prx = tmp_path / "sm_120", tmp_path / PROXY
    for out in (rel, prx):  # --check-sass: the proxy's are "code for sm_90" with HMMA and no HGMMA
        r = _build(tmp_path, "--out", str(out), "--archs", out.name, "--limit", "1", "--check-sass")
        assert r.returncode == 0, r.stdout + r.stderr
    a = json.loads((rel / "sm_120" / "index.json").read_text())
    b = json.loads((prx / PROXY / "index.json").read_text())
    assert b["proxy"]["of"] == "sm_120" and b["proxy"]["ptx"] == "sm_90" and b["proxy"]["max_shared"] == 101376
    assert "not a release" in b["proxy"]["note"] and "proxy" not in a
    assert b["target"] == a["target"] == "cuda:120:32"
    assert set(a["kernels"]) == set(b["kernels"]) and len(b["kernels"]) == 2
    for key, e in b["kernels"].items():
        r = a["kernels"][key]
        same = ("kernel", "num_warps", "num_stages", "shared", "params", "constexprs", "ttgir_sha256", "function")
        assert {k: e[k] for k in same} == {k: r[k] for k in same}, key
        assert (e["ptx_arch"], r["ptx_arch"]) == ("sm_90", "sm_120") and e["sha256"] != r["sha256"]
    top = json.loads((prx / "index.json").read_text())
    assert top["archs"][PROXY]["proxy"] == b["proxy"]
    # each index records the source fingerprint of its kernels, the same on every arch and equal to the package's
    from tsct.kernels.source_key import source_keys
    from tsct.kernels.triton_glu import _kernels as glu_kernels
    from tsct.kernels.triton_lowbit import _kernels as lowbit_kernels

    names = {e["kernel"] for e in b["kernels"].values()}  # the first variant of each family
    want = {**source_keys(glu_kernels, names & set(specs.KERNELS)),
            **source_keys(lowbit_kernels, names & set(LS.KERNELS))}
    assert a["sources"] == b["sources"] == want and len(want) == 2

    # the artifact check on the proxy's cubins: ELF sm_90, SASS rules of the proxy arch
    exe = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sec = {"dir": "tsct/_aot", "triton_version": top["triton_version"],
           "archs": {PROXY: {k: top["archs"][PROXY][k] for k in ("variants", "kernels", "proxy")}}}
    res: dict = {}
    problems = artifacts._verify_aot(res, {"triton_aot": sec}, tmp_path / "lib.so", prx, str(exe), True, True, env)
    assert problems == [], problems
    (row,) = res["triton_aot"]["archs"]
    assert (row["elf_arch"], row["elf_ok"], row["sass_checked"]) == ("sm_90", 2, 2) and row["ok"]
    assert res["triton_aot"]["proxy"] == {PROXY: b["proxy"]}
    assert "PROXY BUILD, not a release" in artifacts._summary([], {}, True, [], res["triton_aot"], [])
    del sec["archs"][PROXY]["proxy"]  # a manifest that does not say "proxy" for a proxy index
    problems = artifacts._verify_aot({}, {"triton_aot": sec}, tmp_path / "lib.so", prx, str(exe), False, False, env)
    assert any("disagree on whether it is a proxy" in p for p in problems), problems


def test_proxy_sass_rule():
    hmma = "        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
    hgmma = "        /*0010*/                   HGMMA.64x64x16.F32.BF16 R4, gdesc[UR4], R4 ;\n"
    assert artifacts.rule_failures(PROXY, {"glu_up_fwd": hmma}) == []
    bad = artifacts.rule_failures(PROXY, {"glu_up_fwd": hgmma})
    assert {what.split(" ")[0] for _, what in bad} == {"SASS"} and len(bad) == 2  # lacks HMMA, has HGMMA
    assert artifacts.elf_arch(PROXY, {"proxy": {"ptx": "sm_90"}}) == "sm_90"
    assert artifacts.elf_arch("sm_120", {}) == "sm_120"


def _entry(s):
    return {"key": s.key, "kernel": s.kernel, "function": s.kernel, "file": "x.cubin", "num_warps": s.num_warps,
            "num_stages": s.num_stages, "shared": 0,
            "params": [{"name": p, "type": t} for p, t in s.types] + [{"name": n, "type": "*i8"}
                                                                       for n in CS.SCRATCH_PARAMS]}


@pytest.fixture
def proxy_install(tmp_path, monkeypatch):
    """A fake install holding only the proxy arch: sm_120's table, no cubin bytes (launches are recorded)."""
    kernels = {s.key: _entry(s) for s in [*specs.enumerate_specs("sm_120"), *LS.enumerate_specs("sm_120")]}
    (tmp_path / PROXY).mkdir()
    rec = aot_build.proxy_info(PROXY)
    sources = {k: f"{i:016x}" for i, k in enumerate([*specs.KERNELS, *LS.KERNELS])}
    (tmp_path / PROXY / "index.json").write_text(json.dumps({"arch": PROXY, "proxy": rec, "kernels": kernels,
                                                             "families": {"glu": {}, "lowbit": {}},
                                                             "sources": sources}))
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    monkeypatch.delenv("TSCT_TRITON_BACKEND", raising=False)
    aot._reset_for_tests()
    yield tmp_path
    aot._reset_for_tests()


def test_a_proxy_install_serves_9_0_with_sm120s_config(proxy_install):
    from tsct import dispatch
    from tsct.kernels import triton_glu, triton_lowbit
    from tsct.kernels.triton_common import runtime as C

    assert aot.artifact_arch((9, 0)) == PROXY and aot.proxy(PROXY)["of"] == "sm_120"
    assert aot.artifact_arch((12, 0)) == "sm_120" and aot.artifact_arch((10, 0)) == "sm_100a"
    assert aot.proxy("sm_120") is None and aot.summary()[PROXY]["glu_down_fwd"] == _n_variants("glu_down_fwd")
    cfg = C.tile_config((9, 0))
    assert cfg == C.ARCH_CONFIGS["sm_120"] and cfg != C.ARCH_CONFIGS["sm_90a"]
    assert C.kernel_arch((9, 0)) == "sm_120"  # so no CUDA row of the dispatch (they are sm_90a's)
    assert not any(C.cuda_kernel(k.replaces, (9, 0), f) for k in dispatch.CUDA_KERNELS for f in k.formats)
    assert triton_glu.status((9, 0), "bf16") == (True, f"AOT cubins for {PROXY}")  # no "backward dz: CUDA"
    assert triton_lowbit.aot_arch((9, 0)) == PROXY
    assert not dispatch.status(dispatch.SM120_FP4, (9, 0), "nvfp4").ok


def test_an_index_without_the_proxy_record_is_not_a_proxy(tmp_path, monkeypatch):
    (tmp_path / PROXY).mkdir()
    (tmp_path / PROXY / "index.json").write_text(json.dumps({"arch": PROXY, "kernels": {"k": {}}}))
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    aot._reset_for_tests()
    try:
        assert aot.artifact_arch((9, 0)) == "sm_90a" and aot.proxy(PROXY) is None
    finally:
        aot._reset_for_tests()


def test_every_launch_of_the_host_code_is_in_the_proxy_table(proxy_install, monkeypatch):
    """The glu and low-bit host code on (9, 0) against a proxy install, TSCT_TRITON_BACKEND=aot (a missing key
    raises): bf16 K-major r = 64 (sm_90a's CUDA dz shape), NVFP4 and sign at r = 64 (its CUDA projections), an odd
    generic shape; the launches carry sm_120's tiles (two stages in the down kernel, the up kernel's byte planes)."""
    from tsct import quant
    from tsct.kernels.layout import to_kmajor
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu as G
    from tsct.kernels.triton_lowbit import glu as L

    keys = []
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(C, "device_capability", lambda dev: (9, 0))
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(aot.AotKernel, "launch", lambda self, grid, values, stream: keys.append(self.entry["key"]))
    g = torch.Generator().manual_seed(0)
    for T, k, E, d, r, f in ((64, 2, 8, 128, 64, 5461), (12, 1, 8, 40, 24, 100)):
        m = T * k
        offs = torch.full((E,), m // E).cumsum(0).to(torch.int32)
        offs[-1] = m
        x = torch.randn(T, d, generator=g).to(torch.bfloat16)
        w = [torch.randn(E, d, r, generator=g), torch.randn(E, d, r, generator=g), torch.randn(E, r, f, generator=g)]
        tok = torch.arange(m) // k
        sg, su, rw = torch.rand(E, r), torch.rand(E, r), torch.rand(m)
        go = torch.randn(T, f).to(torch.bfloat16)
        dense = [w[0].to(torch.bfloat16), w[1].to(torch.bfloat16), to_kmajor(w[2].to(torch.bfloat16))]
        G.grouped_glu_forward(x, offs, *dense, sg, su, rw, tok, tok, T)
        G.grouped_glu_backward(go, x, offs, *dense, sg, su, rw, tok, tok, T, [True] * 7)
        for fmt in ("nvfp4", "sign"):
            if r % 16 and fmt == "nvfp4":
                continue
            q = [quant.quantize(t, fmt) for t in w]
            L.grouped_glu_forward(x, offs, *q, sg, su, rw, tok, tok, T)
            L.grouped_glu_backward(go, x, offs, *q, sg, su, rw, tok, tok, T, [True] * 7)
    names = {kk.split("|")[0] for kk in keys}
    assert names >= {"glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw", "lowbit_down_fwd", "lowbit_up_fwd",
                     "lowbit_bwd_dz", "lowbit_bwd_dx_dw"}, names
    assert any(kk.startswith("lowbit_up_fwd|") and "PLANES=1" in kk for kk in keys)
    assert all(kk.endswith(("|w4s2|a16", "|w4s2|gen")) for kk in keys if kk.startswith("glu_down_fwd|"))


def test_manifest_of_a_proxy_build_says_not_a_release(tmp_path):
    sys.path.insert(0, str(ROOT / "csrc" / "tools"))
    import gen_build_info

    idx = tmp_path / "index.json"
    rec = aot_build.proxy_info(PROXY)
    idx.write_text(json.dumps({"triton_version": "3.9.0", "archs": {PROXY: {"variants": 2, "kernels": {"a": 2},
                                                                            "bytes": 1, "proxy": rec}}}))
    out = tmp_path / "manifest.json"
    gen_build_info.main(["--objects", os.path.realpath(sys.executable), "--gencodes", "sm_90a", "--version", "0.1.0",
                         "--abi-version", "3", "--nvcc-version", "13.0", "--json", str(out), "--cpp",
                         str(tmp_path / "b.cpp"), "--triton-aot", str(idx)])
    man = json.loads(out.read_text())
    assert man["proxy_build"].startswith("NOT A RELEASE") and PROXY in man["proxy_build"]
    assert man["triton_aot"]["archs"][PROXY] == {"variants": 2, "kernels": {"a": 2}, "proxy": rec}
    assert artifacts.proxy_archs(man["triton_aot"]) == {PROXY: rec}


def test_probe_says_proxy(proxy_install, capsys):
    from tsct import probe

    ta = probe._triton_aot(None, [{"index": 0, "capability": "9.0"}])
    assert ta["proxy"] == {PROXY: aot.proxy(PROXY)} and ta["archs"][PROXY]["capabilities"] == ["9.0"]
    assert ta["gpus"][0]["arch"] == PROXY and ta["gpus"][0]["proxy"]["of"] == "sm_120"
    assert probe.main(["--no-selftest"]) == 0
    out = capsys.readouterr().out
    assert "PROXY BUILD, NOT A RELEASE" in out and PROXY in out


def test_verdict_table_covers_every_sm120_kernel_and_feeds_verification(monkeypatch):
    from tsct.kernels import sm120_fp4

    rows = sm120_proxy.rows()
    by = {r["kernel"]: r for r in rows}
    assert len(by) == len(rows)
    cutedsl = {v["kernel"] for v in sm120_fp4.VERIFICATION}
    assert set(by) >= set(specs.KERNELS) | set(LS.KERNELS) | cutedsl
    for v in sm120_fp4.VERIFICATION:
        assert v["proxy_on_sm90"] == by[v["kernel"]]["proxy_on_sm90"] == sm120_proxy.NOT_PROXIED["cutedsl"]
    run = {"date": "2026-12-05", "commit": "abc1234", "device": "NVIDIA H200", "evidence": "bench/results/x.log",
           "suite": "300 passed", "kernels": {"glu_down_fwd": {"aot": 10, "variants": 3, "jit": 0, "native": 0,
                                                               "failed_tests": [], "source": "a" * 16},
                                              "lowbit_up_fwd": {"aot": 5, "variants": 2, "jit": 0, "native": 0,
                                                                "failed_tests": ["t.py::test_x"], "source": "b" * 16}}}
    monkeypatch.setattr(sm120_proxy, "RUNS", (run,))
    monkeypatch.setattr(sm120_proxy, "shipped_source", lambda k: ({"glu_down_fwd": "a" * 16, "lowbit_up_fwd": "b" * 16,
                                                                   "glu_bwd_dz": "c" * 16}[k], ""))
    n = sm120_proxy.table_variants("glu")["glu_down_fwd"]
    assert sm120_proxy.verdict("glu_down_fwd", "glu") == (f"logic run on the sm_90 proxy (NVIDIA H200, 2026-12-05: 10 "
                                                          f"launches of 3 "
                                                          f"variants; {n} in this table; bench/results/x.log)")
    failed = sm120_proxy.verdict("lowbit_up_fwd", "lowbit")
    assert failed.startswith("FAILED on the sm_90 proxy (NVIDIA H200, 2026-12-05,")
    assert sm120_proxy.verdict("glu_bwd_dz", "glu") == ("in the proxy build; no proxy run launched it (the latest: "
                                                        "2026-12-05, commit abc1234)")
    with pytest.raises(ValueError, match="family"):
        sm120_proxy.verdict("x", "nope")


def test_a_run_counts_only_for_the_source_it_ran(monkeypatch):
    """Equal fingerprints: "logic run"; a changed one: the run was of an earlier source, this one has not run; an
    older run of this very source still counts; an unknown fingerprint is said to be unknown."""
    k = {"aot": 7, "variants": 2, "jit": 0, "native": 0, "failed_tests": []}
    old = {"date": "2026-12-01", "commit": "1111111", "device": "NVIDIA H200", "evidence": "old.log",
           "kernels": {"glu_up_fwd": {**k, "source": "1" * 16}, "glu_bwd_dz": {**k, "source": "1" * 16}}}
    new = {"date": "2026-12-05", "commit": "2222222", "device": "NVIDIA H100 80GB HBM3", "evidence": "new.log",
           "kernels": {"glu_up_fwd": {**k, "source": "2" * 16}, "glu_bwd_dz": {**k, "source": "2" * 16},
                       "glu_bwd_epi": dict(k)}}
    monkeypatch.setattr(sm120_proxy, "RUNS", (old, new))
    shipped = {"glu_up_fwd": "2" * 16, "glu_bwd_dz": "3" * 16, "glu_bwd_epi": "4" * 16}
    monkeypatch.setattr(sm120_proxy, "shipped_source", lambda n: (shipped.get(n), "" if n in shipped else "why"))
    v = {name: sm120_proxy.verdict(name, "glu") for name in ("glu_up_fwd", "glu_bwd_dz", "glu_bwd_epi", "glu_down_fwd")}
    assert v["glu_up_fwd"].startswith("logic run on the sm_90 proxy (NVIDIA H100 80GB HBM3, 2026-12-05: 7 launches")
    assert "new.log" in v["glu_up_fwd"]
    assert v["glu_bwd_dz"] == ("source changed since its proxy run: the sm_90 proxy ran an earlier source of this "
                               "kernel (NVIDIA H100 80GB HBM3, 2026-12-05, commit 2222222: 7 launches; new.log); "
                               "this source has not run on the proxy")
    assert v["glu_bwd_epi"].endswith("; unknown whether of this source: the run of 2026-12-05 recorded no source "
                                     "fingerprint") and v["glu_bwd_epi"].startswith("logic run on the sm_90 proxy")
    assert v["glu_down_fwd"].startswith("in the proxy build; no proxy run launched it")
    shipped["glu_bwd_dz"] = "1" * 16  # reverted to the source of the older run: that run counts again
    assert sm120_proxy.verdict("glu_bwd_dz", "glu").startswith("logic run on the sm_90 proxy (NVIDIA H200, 2026-12-01:")
    del shipped["glu_up_fwd"]
    assert sm120_proxy.verdict("glu_up_fwd", "glu").endswith("; unknown whether of this source: why")


def test_shipped_fingerprints_come_from_the_installed_index(proxy_install):
    """An install's fingerprints are its index's "sources" (no Triton, no source needed); an index without them makes
    every fingerprint unknown, not computed from whatever source is around."""
    assert sm120_proxy.shipped_source("glu_up_fwd") == (f"{list(specs.KERNELS).index('glu_up_fwd'):016x}", "")
    assert aot.sources()["lowbit_up_fwd"] == f"{len(specs.KERNELS) + list(LS.KERNELS).index('lowbit_up_fwd'):016x}"
    verdicts = _load("_tsct_test_proxy_verdicts", ROOT / "scripts" / "proxy_verdicts.py")
    assert verdicts.installed_sources(PROXY) == aot.sources() and verdicts.installed_sources(None) == {}
    idx = json.loads((proxy_install / PROXY / "index.json").read_text())
    del idx["sources"]
    (proxy_install / PROXY / "index.json").write_text(json.dumps(idx))
    aot._reset_for_tests()
    assert aot.sources() == {}
    key, why = sm120_proxy.shipped_source("glu_up_fwd")
    assert key is None and "record no source fingerprints" in why
    assert "unknown whether of this source" in sm120_proxy.verdict("glu_down_fwd", "glu")


def test_without_an_index_or_triton_the_source_is_unknown(tmp_path, monkeypatch):
    """A source checkout with no cubins built and no Triton cannot fingerprint its source: the verdict says so."""
    monkeypatch.setenv("TSCT_AOT_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    aot._reset_for_tests()
    try:
        key, why = sm120_proxy.shipped_source("glu_down_fwd")
        assert key is None and "Triton is not importable" in why
        v = sm120_proxy.verdict("glu_down_fwd", "glu")
        newest = next(r for r in reversed(sm120_proxy.RUNS) if r["kernels"].get("glu_down_fwd", {}).get("aot"))
        assert v.startswith(f"logic run on the sm_90 proxy ({newest['device']}, {newest['date']}: ")
        assert newest["evidence"] in v
        assert v.endswith(f"; unknown whether of this source: {why}")
    finally:
        aot._reset_for_tests()


def test_source_fingerprints_of_the_recorded_run():
    """The 2026-12-04 run (commit b713935) against this source, fingerprinted from the source: the bf16 up
    projection, combine and routing are the source that ran; the down projections (their GLU epilogue is a shared
    helper since), the backward and the low-bit kernels changed since."""
    pytest.importorskip("triton")
    from tsct.kernels.source_key import source_keys
    from tsct.kernels.triton_glu import _kernels as glu_kernels
    from tsct.kernels.triton_lowbit import _kernels as lowbit_kernels

    now = {**source_keys(glu_kernels, specs.KERNELS), **source_keys(lowbit_kernels, LS.KERNELS)}
    (run,) = [r for r in sm120_proxy.RUNS if r["commit"] == "b713935"]
    ran = {k: v["source"] for k, v in run["kernels"].items()}
    same = {"glu_up_fwd", "combine_rows", "zero_tail_rows", "tile_cum", "csr_keys", "route_rank", "route_place"}
    assert {k for k in ran if ran[k] == now[k]} == same
    assert all(ran[k] != now[k] for k in ("glu_down_fwd", "glu_bwd_dz", "lowbit_down_fwd"))


def test_source_key_covers_the_source_and_nothing_else(tmp_path, monkeypatch):
    """The kernel's text, its jit callees' (transitively) and constexpr globals: an edit of any changes the key;
    moving the kernel down the file or loading it under another module name does not."""
    pytest.importorskip("triton")
    from tsct.kernels.source_key import source_key

    body = ("import triton\nimport triton.language as tl\nSCALE = tl.constexpr({scale})\n\n"
            "@triton.jit\ndef _leaf(x):\n    return x * {leaf}\n\n"
            "@triton.jit\ndef _mid(x):\n    return _leaf(x) + SCALE\n\n"
            "@triton.jit\ndef kern(p, n, BLOCK: tl.constexpr):\n    i = tl.arange(0, BLOCK)\n"
            "    tl.store(p + i, _mid(tl.load(p + i, mask=i < n)), mask=i < n)\n")

    def key(name, text):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        return source_key(getattr(_load(name, path), "kern"))

    base = key("_sk_a", body.format(scale=2, leaf=3))
    assert len(base) == 16 and int(base, 16) >= 0
    assert key("_sk_b", "# moved down\n\n\n" + body.format(scale=2, leaf=3)) == base
    assert key("_sk_c", body.format(scale=2, leaf=4)) != base  # a callee's callee
    assert key("_sk_d", body.format(scale=5, leaf=3)) != base  # a constexpr global
    with pytest.raises(TypeError, match="jit"):
        source_key(lambda: 0)


def test_the_build_fingerprints_what_the_package_does():
    """aot_build.py loads the kernel modules under its own names; the fingerprints it records are the package's."""
    pytest.importorskip("triton")
    from tsct.kernels.source_key import source_keys
    from tsct.kernels.triton_glu import _kernels as glu_kernels
    from tsct.kernels.triton_lowbit import _kernels as lowbit_kernels

    names = ("tsct.kernels.triton_common._kernels",)  # the build's alias of the shared sources
    saved = {n: sys.modules.get(n) for n in names}
    try:
        built = aot_build.source_keys(["glu", "lowbit"])
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    assert built == {**source_keys(glu_kernels, specs.KERNELS), **source_keys(lowbit_kernels, LS.KERNELS)}


def test_docs_table_is_the_verdict_table(tmp_path):
    """docs/sm120.md's table is sm120_proxy.rows() (``scripts/proxy_verdicts.py --update-docs`` writes it), the
    verdicts of this source: needs its fingerprints (an installed index that records them, or Triton)."""
    if sm120_proxy.shipped_source("glu_down_fwd")[0] is None:
        pytest.skip(f"this source's fingerprints are unknown here: {sm120_proxy.shipped_source('glu_down_fwd')[1]}")
    verdicts = _load("_tsct_test_proxy_verdicts", ROOT / "scripts" / "proxy_verdicts.py")
    doc = tmp_path / "sm120.md"
    doc.write_text((ROOT / "docs" / "sm120.md").read_text())
    verdicts.update_docs(doc)
    assert doc.read_text() == (ROOT / "docs" / "sm120.md").read_text()
    text = doc.read_text()
    body = text.split("<!-- sm120-proxy-table -->")[1].split("<!-- /sm120-proxy-table -->")[0]
    got = [tuple(c.strip().strip("`") for c in line.strip().strip("|").split("|"))
           for line in body.strip().splitlines()[2:]]
    assert got == [(r["kernel"], r["family"], r["proxy_on_sm90"]) for r in sm120_proxy.rows()]


def test_ledger_turns_into_verdicts(tmp_path, monkeypatch):
    before = sm120_proxy.RUNS
    monkeypatch.setattr(sm120_proxy, "shipped_source", lambda k: ("f" * 16, ""))
    ledger_mod = _load("_tsct_test_ledger", ROOT / "tests" / "_launch_ledger.py")
    verdicts = _load("_tsct_test_proxy_verdicts", ROOT / "scripts" / "proxy_verdicts.py")
    key = next(s.key for s in specs.enumerate_specs("sm_120") if s.kernel == "glu_down_fwd")
    tests = {"a.py::test_ok": {"outcome": "passed", "launches": {"aot:glu_down_fwd": 3, "aot:glu_up_fwd": 3}},
             "a.py::test_bad": {"outcome": "failed", "launches": {"aot:glu_up_fwd": 1, "jit:lowbit_up_fwd": 2}}}
    totals = ledger_mod._kernel_totals(tests, {key})
    assert totals["glu_down_fwd"]["variants"] == {key} and totals["glu_up_fwd"]["aot"] == 4
    assert totals["glu_up_fwd"]["failed_tests"] == ["a.py::test_bad"] and totals["lowbit_up_fwd"]["jit"] == 2
    ledger = {"device": "NVIDIA H200", "capability": [9, 0], "aot_arch": PROXY, "proxy": aot_build.proxy_info(PROXY),
              "tsct": "0.1.0", "commit": "0123456789abcdef",
              "sessions": [{"argv": [], "exitstatus": 1, "env": {}, "outcomes": {"passed": 1, "failed": 1}}],
              "kernels": {k: {**v, "variants": sorted(v["variants"])} for k, v in totals.items()}, "tests": tests}
    rec = verdicts.record(ledger, "bench/results/{date}_{gpu}_sm120_proxy_{commit}.log",
                          {"glu_down_fwd": "f" * 16, "glu_up_fwd": "f" * 16, "bwd_maps": "e" * 16})
    assert rec["commit"] == "0123456" and rec["evidence"].endswith("_h200_sm120_proxy_0123456.log")
    assert [rec["kernels"][k]["source"] for k in ("glu_down_fwd", "lowbit_up_fwd")] == ["f" * 16, None]
    assert rec["suite"] == "1 failed, 1 passed" and rec["kernels"]["glu_down_fwd"]["variants"] == 1
    text, ok = verdicts.report(ledger, None, rec)
    assert not ok and "record for tsct.kernels.sm120_proxy.RUNS" in text
    assert re.search(rf"glu_down_fwd\s+glu\s+3\s+1 of {_n_variants('glu_down_fwd')}\s+0\s+0\s+f{{16}}", text), text
    assert "NO SOURCE FINGERPRINT" not in text  # lowbit_up_fwd only JIT-launched: no proxy cubin, no fingerprint
    assert "logic run on the sm_90 proxy (NVIDIA H200, " in text and "FAILED on the sm_90 proxy" in text
    names = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 5060 Ti", "", None)
    assert [gpu_tag(n) for n in names] == ["h100", "h200", "rtx5060", "gpu", "gpu"]
    assert sm120_proxy.RUNS == before  # report() restores the table


def test_launch_ledger_plugin_records_and_merges(tmp_path):
    """tests/_launch_ledger.py in a real pytest run (no GPU needed: the tests count launches by hand)."""
    import subprocess

    (tmp_path / "test_fake.py").write_text(
        "from tsct.kernels.triton_common import runtime as C\n"
        "from tsct.kernels.triton_glu import glu as G\n"
        "from tsct.kernels.triton_lowbit import glu as L\n"
        "def test_ok():\n    G.FAMILY.count('aot', 'glu_down_fwd'); L.FAMILY.count('native', 'lowbit_down_fwd')\n"
        "    C.FAMILY.count('aot', 'combine_rows')\n"
        "def test_bad():\n    G.FAMILY.count('aot', 'glu_up_fwd'); assert False\n")
    ledger = tmp_path / "ledger.json"
    env = dict(os.environ, TSCT_LAUNCH_LEDGER=str(ledger),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT / "python")]))
    for _ in range(2):  # a second session merges into the same file
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_launch_ledger",
                            "--rootdir", str(tmp_path), str(tmp_path / "test_fake.py")], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    data = json.loads(ledger.read_text())
    assert [s["outcomes"] for s in data["sessions"]] == [{"passed": 1, "failed": 1}] * 2
    assert len(data["tests"]) == 4 and any(k.endswith(" #2") for k in data["tests"])
    k = data["kernels"]
    assert k["glu_down_fwd"]["aot"] == 2 and k["lowbit_down_fwd"]["native"] == 2 and not k["glu_down_fwd"]["failed_tests"]
    assert k["combine_rows"]["aot"] == 2  # a shared kernel, counted by the runtime's launcher
    assert len(k["glu_up_fwd"]["failed_tests"]) == 2 and data["aot_arch"] is None and data["proxy"] is None
