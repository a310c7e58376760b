"""tsct-probe (tsct.probe.main) on a machine without a GPU: the JSON report's sections, the rendered
text (self-test names such as "grouped_glu[bmm, dense factors, float32]" are not eaten as rich markup),
the Triton AOT listing per arch and kernel (from the index files; nothing loaded), exit status 0."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

import tsct
from tsct import dispatch, probe

NO_GPU = not torch.cuda.is_available()


def _json_report(capsys, argv):
    rc = probe.main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_json_report_sections(capsys, monkeypatch):
    monkeypatch.setattr(dispatch, "_fallbacks", dispatch.collections.Counter({("triton-bf16", "bmm", "why"): 3}))
    rc, rep = _json_report(capsys, ["--json", "--no-selftest"])
    assert rc == 0
    for key in ("versions", "gpus", "artifacts", "dispatch", "selftests", "fallbacks"):
        assert key in rep, key
    assert {"wanted": "triton-bf16", "taken": "bmm", "reason": "why", "count": 3} in rep["fallbacks"]
    assert rep["versions"]["tsct"] and rep["versions"]["torch"] == torch.__version__
    # the build's commit in an installed wheel, None from the source tree (the two cases of this test run)
    assert rep["versions"]["tsct_commit"] == (None if getattr(tsct, "__git_commit__", None) is None else
                                             tsct.__git_commit__ + ("+dirty" if tsct._build_dirty else ""))
    assert rep["selftests"] == []
    if NO_GPU:
        assert rep["gpus"] == [] and rep["cuda_available"] is False
    cpu = [d for d in rep["dispatch"] if d["device"] == "cpu"]
    assert cpu and all(d["path"] == "bmm" for d in cpu), cpu
    assert {d["activations"] for d in cpu} == {"bf16", "nvfp4"}
    assert {d["format"] for d in cpu} >= {"bf16"}

    art = rep["artifacts"]
    assert {"library", "loadable", "manifest", "triton_aot", "native_glu"} <= set(art)
    # the CUDA C++ GLU kernels the dispatch takes: on sm_90a only (where they ran), none on sm_120 / JIT archs
    ng = art["native_glu"]
    assert set(ng) == {"sm_90a", "sm_100a", "sm_120", "other"}
    if art["loadable"]:
        assert [k.split()[0] for k in ng["sm_90a"]] == ["glu_bwd_dz", "lowbit_down_fwd", "lowbit_up_fwd"]
        assert all(f in k for k in ng["sm_90a"][1:] for f in ("nvfp4", "sign", "fp8", "ternary"))
    else:  # no library: the dispatch takes none of them anywhere, and the report says so
        assert ng["sm_90a"] == []
    assert ng["sm_120"] == [] and ng["other"] == []
    ta = art["triton_aot"]
    assert {"dir", "triton_version", "archs", "gpus", "backend"} <= set(ta)
    if NO_GPU:
        assert ta["gpus"] == []
    man = art["manifest"] or {}
    if "triton_aot" in man:  # the counts per kernel per arch are those the manifest promises
        sec = man["triton_aot"]
        assert list(ta["archs"]) == ["sm_90a", "sm_120"]  # by capability (a default build: no sm_100a)
        assert ta["triton_version"] == sec["triton_version"]
        for arch, x in ta["archs"].items():
            assert x["source"] == "index"
            assert x["kernels"] == sec["archs"][arch]["kernels"]
            assert x["variants"] == x["manifest_variants"] == sec["archs"][arch]["variants"]
        assert ta["archs"]["sm_120"]["capabilities"] == ["12.0", "12.1"]


def test_json_report_loads_no_cubin():
    """Listing the AOT kernels reads index.json only: no cubin is looked up or loaded, CUDA stays
    uninitialised (a fresh process, so other tests' kernel caches do not count)."""
    code = ("import io, contextlib, torch\n"
            "from tsct import probe\n"
            "from tsct.kernels import aot\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = probe.main(['--json', '--no-selftest'])\n"
            "print(rc, len(aot._kernels), torch.cuda.is_initialized() if not torch.cuda.is_available() else False)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0", "False"], out


def test_triton_aot_arch_per_gpu():
    """Which arch each (pretend) GPU would load: exact capability table, 'shipped' only with an index."""
    from tsct import native

    gpus = [{"index": 0, "capability": "9.0"}, {"index": 1, "capability": "8.0"},
            {"index": 2, "capability": "12.1"}, {"index": 3, "capability": "10.3"}]
    ta = probe._triton_aot(native.manifest(), gpus)
    by = {g["gpu"]: g for g in ta["gpus"]}
    assert by[0]["arch"] == "sm_90a" and by[2]["arch"] == "sm_120"
    assert by[1]["arch"] is None and by[3]["arch"] is None and not by[1]["shipped"] and not by[3]["shipped"]
    shipped = "sm_90a" in ta["archs"]
    assert by[0]["shipped"] == shipped and by[0]["variants"] == (ta["archs"]["sm_90a"]["variants"] if shipped else 0)


def test_render_without_selftests(capsys):
    assert probe.main(["--no-selftest"]) == 0
    out = capsys.readouterr().out
    assert "dispatch (impl='auto')" in out and "self-tests" not in out
    if NO_GPU:
        assert "No CUDA GPU visible" in out
    from tsct.kernels import sm120_proxy

    cited = [r["evidence"] for r in sm120_proxy.RUNS if any(r["evidence"] in x["proxy_on_sm90"]
                                                           for x in sm120_proxy.rows())]
    assert cited and all(out.replace("\n", "").replace(" ", "").count(log) == 1 for log in cited)  # once, not per row
    ta = probe.collect(selftests=False)["artifacts"]["triton_aot"]
    if ta["archs"]:
        assert "Triton AOT cubins" in out and "glu_down_fwd" in out
        for arch in ta["archs"]:
            assert arch in out
        if NO_GPU:
            assert "no GPU: no cubin is loaded" in out and "cc 9.0 would load sm_90a" in out


def test_render_with_selftests(capsys):
    """The self-tests run (about 1 s on the CPU) and their names print as written: rich must not read
    "[reference, dense factors, float32]" as markup."""
    assert probe.main([]) == 0
    out = capsys.readouterr().out
    assert "self-tests against float64" in out
    for fmt in ("dense", "nvfp4", "sign"):
        assert f"grouped_glu[bmm, {fmt} factors, float32, forward and backward]" in out, out
    assert "sort_by_expert vs stable argsort" in out and "bit-exact (torch sort)" in out, out
    assert "FAIL" not in out


def test_bad_cuda_kernels_setting_is_reported_not_raised(capsys, monkeypatch):
    """A bad TSCT_CUDA_KERNELS makes every Triton call that consults it raise; the probe, the tool for bug reports,
    names it instead of crashing (JSON and text), and lists no CUDA rows anywhere."""
    from tsct import config

    monkeypatch.setattr(config, "cuda_kernels", "glu_bwd_dz,lowbit_dwon_fwd")
    rc, rep = _json_report(capsys, ["--json", "--no-selftest"])
    art = rep["artifacts"]
    assert rc == 0 and "TSCT_CUDA_KERNELS" in art["native_glu_error"] and "lowbit_dwon_fwd" in art["native_glu_error"]
    assert art["native_glu"] == {a: [] for a in ("sm_90a", "sm_100a", "sm_120", "other")}
    assert art["cuda_kernels_setting"] == "glu_bwd_dz,lowbit_dwon_fwd"
    assert probe.main(["--no-selftest"]) == 0
    assert "bad TSCT_CUDA_KERNELS" in capsys.readouterr().out

    monkeypatch.setattr(config, "cuda_kernels", "auto")
    rc, rep = _json_report(capsys, ["--json", "--no-selftest"])
    assert rc == 0 and rep["artifacts"]["native_glu_error"] is None


def test_bad_triton_backend_setting_is_reported(capsys, monkeypatch):
    """A TSCT_TRITON_BACKEND other than auto / aot / jit makes the Triton paths raise on a GPU; the probe names it
    on any machine (JSON and text), where it had shown the value as if it were valid."""
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "bogus")
    rc, rep = _json_report(capsys, ["--json", "--no-selftest"])
    ta = rep["artifacts"]["triton_aot"]
    assert rc == 0 and ta["backend"] == "bogus" and "TSCT_TRITON_BACKEND='bogus'" in ta["backend_error"]
    assert probe.main(["--no-selftest"]) == 0
    assert "bad TSCT_TRITON_BACKEND" in capsys.readouterr().out
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "AOT")  # read case-insensitively
    rc, rep = _json_report(capsys, ["--json", "--no-selftest"])
    assert rep["artifacts"]["triton_aot"]["backend_error"] is None


def test_json_report_into_a_closed_pipe_is_no_traceback():
    """``tsct-probe --json | head -1``: the reader is gone before the report is written; exit status 1 and nothing
    on stderr, as the text report gives (the pipe is closed before the probe has collected anything)."""
    p = subprocess.Popen([sys.executable, "-m", "tsct.probe", "--json", "--no-selftest"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
