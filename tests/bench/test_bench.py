"""tsct-bench on the CPU: the CLI end to end, routing, the padded-bmm baseline, and the byte/FLOP formulas."""

import contextlib
import json
import math

import pytest
import torch

from tsct import dispatch
from tsct.bench import arms, cli, config, counts, inputs, measure, report, routing, sweep

SMALL_FAST = ["--preset", "small", "--device", "cpu", "--warmup", "1", "--iters", "3", "--min-iters", "1",
              "--copy-mb", "4", "--quiet"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "small.json"
    rc = cli.main(SMALL_FAST + ["--json", str(out)])
    return rc, json.loads(out.read_text())


def test_small_preset_runs_end_to_end_through_the_cli(small_run):
    rc, res = small_run
    assert rc == 0
    assert res["schema_version"] == 1
    for key in ("tsct_version", "git_commit", "date", "device", "host", "config", "copy_bandwidth_GBps",
                "bytes_floor", "arms"):
        assert key in res, key
    assert res["device"]["type"] == "cpu" and res["device"]["torch"] == torch.__version__
    assert res["copy_bandwidth_GBps"] > 0
    speed = res["host"]["speed"]  # what eager times of host-bound arms scale with
    assert 10 < speed["python_us"] < 1e6 and 0.05 < speed["op_issue_us"] < 1e3, speed
    cfg = res["config"]
    assert (cfg["tokens"], cfg["topk"], cfg["experts"], cfg["d"], cfg["r"], cfg["f"]) == (256, 2, 8, 128, 16, 171)
    assert res["bytes_floor"] == counts.bytes_floor(256, 8, 128, 16, 171)


def test_small_run_lists_every_arm_with_plausible_figures(small_run):
    _, res = small_run
    by_name = {a["name"]: a for a in res["arms"]}
    expected = {"padded-bmm", "grouped-mm", "tsct-reference-bf16", "tsct-reference-nvfp4", "tsct-reference-sign",
                "tsct-reference-fp8", "tsct-reference-ternary", "tsct-bmm-fp8", "tsct-bmm-ternary"}
    expected |= {f"tsct-{p}-{f}" for p in dispatch.PATHS for f in ("bf16", "nvfp4", "sign", "fp8", "ternary")
                 if arms._path_serves_format(p, f)}
    # triton-lowbit reads fp8 / ternary only when forced (dispatch.FORCED_ONLY): measured, never chosen by auto
    assert {"tsct-triton-lowbit-fp8", "tsct-triton-lowbit-ternary"} <= expected
    assert not any(n.startswith("tsct-triton-bf16") and n.endswith(("-fp8", "-ternary")) for n in expected)
    expected |= {"tsct-triton-lowbit-nvfp4-ste", "tsct-triton-lowbit-sign-ste"}  # packed factors + masters
    # the same w_down values stored K-major (decision 0012)
    expected |= {"tsct-triton-bf16-bf16-kmajor", "tsct-bmm-bf16-kmajor"}
    assert set(by_name) == expected
    for a in res["arms"]:
        assert a["status"] in ("ran", "refused", "unavailable", "error"), a
        assert a["status"] != "error", (a["name"], a["reason"], a.get("traceback"))
        if a["status"] == "ran":
            for key in ("fwd_ms", "fwdbwd_ms"):
                st = a[key]
                assert 0 < st["p10"] <= st["median"] <= st["p90"], (a["name"], key, st)
            assert a["tflops"]["fwd"] > 0 and a["tflops"]["fwdbwd"] > 0
            assert a["bytes"] > 0 and a["pct_of_floor"] > 0 and a["storage_bytes"] > 0
            assert a["peak_mem_bytes"] is None  # CPU: n/a
            assert a["max_rel_err"] is not None and not a["nonfinite"]
        else:
            assert a["reason"], a["name"]
            assert a["fwd_ms"] is None
    # bf16 reference vs its fp32 oracle: only the bf16 rounding of inputs/output remains
    assert by_name["tsct-reference-bf16"]["max_rel_err"] < 1e-2
    # the bf16 padded bmm keeps bf16 intermediates; capacity 2x the mean at T=256 drops nothing here
    assert by_name["padded-bmm"]["max_rel_err"] < 5e-2
    assert 0.0 <= by_name["padded-bmm"]["dropped_fraction"] < 0.05
    # low-bit: close to the reference of its own dequantized factors; further from bf16 (quantization error)
    for fmt in ("nvfp4", "sign", "fp8", "ternary"):
        a = by_name[f"tsct-reference-{fmt}"]
        assert a["max_rel_err_dequant"] < 1e-2
        assert a["max_rel_err"] > a["max_rel_err_dequant"]
        assert a["storage_bytes"] < by_name["tsct-reference-bf16"]["storage_bytes"]
        assert a["grads"] == ["x", "router_weights", "s_gate", "s_up"]
    assert by_name["tsct-reference-bf16"]["grads"] == ["x", "router_weights", "w_gate", "w_up", "w_down", "s_gate",
                                                        "s_up"]
    # f = 171 is not a multiple of 8: torch's grouped_mm refuses, and the refusal is the result
    gm = by_name["grouped-mm"]
    assert gm["status"] in ("refused", "unavailable")
    if gm["status"] == "refused":  # said before torch is called, naming the size
        assert "16-byte multiples; f = 171 is not a multiple of 8 at bf16" in gm["reason"], gm["reason"]
    # GPU paths on a CPU: listed with dispatch's reason, not run
    for name in ("tsct-triton-bf16-bf16", "tsct-triton-bf16-bf16-kmajor"):
        assert by_name[name]["status"] == "unavailable"
        assert "GPU" in by_name[name]["reason"]


def test_a_run_without_json_says_none_was_written(capsys):
    assert cli.main(SMALL_FAST + ["--arms", "padded-bmm", "--formats", "bf16"]) == 0
    assert "no JSON written: --json FILE writes the full results" in capsys.readouterr().out


def test_table_renders_and_json_is_strict(small_run, tmp_path):
    _, res = small_run
    from rich.console import Console

    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    report.print_report(res, con)
    text = con.export_text()
    assert "padded-bmm" in text and "grouped-mm" in text and "refused" in text
    res2 = dict(res, copy_bandwidth_GBps=float("nan"))
    p = report.write_json(res2, tmp_path / "x.json")
    assert json.loads(p.read_text())["copy_bandwidth_GBps"] is None  # NaN never reaches the file


def test_grouped_mm_runs_where_torch_accepts_the_shape():
    # f = 176 and r = 16 are multiples of 8 bf16 elements: torch's CPU grouped_mm accepts them
    gmm, _ = arms.grouped_mm_function()
    if gmm is None:
        pytest.skip("this torch has no grouped_mm")
    cfg = config.from_preset("small", device="cpu", f=176, arms=("grouped-mm",), warmup=1, iters=2, min_iters=1,
                             copy_mb=1)
    from tsct.bench.runner import run

    res = run(cfg)
    (a,) = res["arms"]
    assert a["status"] == "ran", a["reason"]
    assert a["max_rel_err"] < 5e-2 and a["fwdbwd_ms"]["median"] > 0


def test_arms_selection_and_bad_arguments(capsys):
    assert cli.main(SMALL_FAST + ["--list-arms"]) == 0
    listed = capsys.readouterr().out
    assert "padded-bmm" in listed and "tsct-reference-nvfp4" in listed
    assert cli.main(SMALL_FAST + ["--arms", "no-such-arm"]) == 2
    assert "matches no arm" in capsys.readouterr().err
    assert cli.main(SMALL_FAST + ["--formats", "int3"]) == 2


def test_list_arms_agrees_with_the_run_on_shapes_a_format_cannot_store(capsys):
    """d = 24 is no multiple of 16 (NVFP4's block) and r = 12 none of 8 (sign's byte): the run marks those arms
    unavailable, and --list-arms says so too, with the same reason."""
    assert cli.main(SMALL_FAST + ["--d", "24", "--r", "12", "--list-arms"]) == 0
    listed = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert "must be a multiple of 16 for nvfp4 (K is set by --d)" in listed["tsct-reference-nvfp4"]
    assert "must be a multiple of 8 for sign (K is set by --r)" in listed["tsct-reference-sign"]
    assert listed["tsct-reference-bf16"].split()[1] == "runs"
    assert listed["tsct-reference-fp8"].split()[1] == "runs" and listed["tsct-reference-ternary"].split()[1] == "runs"
    assert cli.main(SMALL_FAST + ["--d", "22", "--list-arms"]) == 0
    listed = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert "must be a multiple of 4 for ternary (K is set by --d)" in listed["tsct-bmm-ternary"]
    cfg = config.from_preset("small", d=24, r=12).resolved()
    for fmt in ("nvfp4", "sign"):  # the shape rule is quantize_factors' own
        with pytest.raises(ValueError) as e:
            inputs.quantize_factors(inputs.make_dense_factors(cfg), fmt)
        assert inputs.storage_problem(cfg, fmt) == f"cannot store the factors as {fmt}: {e.value}"


@pytest.mark.parametrize("flag", ["--capacity-factor", "--max-seconds", "--zipf-exponent"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_non_finite_or_non_positive_floats_are_refused_naming_the_flag(flag, value, capsys):
    """nan passes a plain `<= 0` check and inf overflowed later (the capacity's ceil): both refused up front."""
    assert cli.main(SMALL_FAST + ["--routing", "zipf", f"{flag}={value}", "--list-arms"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be a finite number > 0" in err, err


def test_min_iters_above_iters_is_refused_and_the_default_follows_iters(capsys):
    """--min-iters is "at least": one above --iters (given, or the preset's) is refused, not silently cut to it; the
    default (5) follows a smaller --iters down."""
    base = ["--preset", "small", "--device", "cpu", "--list-arms"]
    assert cli.main(base + ["--iters", "5", "--min-iters", "6"]) == 2
    assert "--min-iters (6) must not exceed --iters (5)" in capsys.readouterr().err
    assert cli.main(base + ["--min-iters", "20"]) == 2  # the small preset times 10 calls
    assert "--min-iters (20) must not exceed the small preset's --iters (10)" in capsys.readouterr().err
    a = cli.parser().parse_args(["--preset", "small", "--device", "cpu", "--iters", "3"])
    assert cli.config_from_args(a).min_iters == 3


def test_an_unwritable_json_path_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """A --json path that cannot be written used to fail after the whole run, losing its results."""
    from tsct.bench import runner

    def no_run(*a, **k):
        raise AssertionError("the run started although --json cannot be written")

    monkeypatch.setattr(runner, "run", no_run)
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    # /proc refuses new files even to root, for whom permission bits allow everything
    for bad, why in ((a_file / "x.json", "is not a directory"), (tmp_path, "is a directory"), ("", "the path is empty"),
                     ("/proc/tsct-bench-test.json", "cannot be written")):
        assert cli.main(SMALL_FAST + ["--json", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "--json" in err and why in err, err
    with pytest.raises(ValueError, match="--plot: '/proc/tsct-bench-test.png' cannot be written"):
        report.check_writable("/proc/tsct-bench-test.png", "--plot")  # what the CLI asks (after matplotlib's check)
    ok = report.check_writable(tmp_path / "new" / "dir" / "r.json")  # missing directories are made, no file left
    assert ok.name == "r.json" and ok.parent.is_dir() and not ok.exists()
    a_file_before = a_file.read_text()
    report.check_writable(a_file)  # an existing file is opened for appending: left as it was
    assert a_file.read_text() == a_file_before


def test_a_name_given_twice_counts_once():
    """``--formats nvfp4,nvfp4`` (or a repeated arm) runs each arm once, in the order first given."""
    a = cli.parser().parse_args(["--formats", "nvfp4, sign,nvfp4", "--arms", "padded-bmm,padded-bmm"])
    assert a.formats == ("nvfp4", "sign") and a.arms == ("padded-bmm",)


def test_empty_lists_and_a_repeated_sweep_axis_are_refused(capsys):
    for args, want in ((["--arms", ","], "--arms: expected a comma-separated list of names, got ','"),
                       (["--formats", ""], "--formats: expected a comma-separated list of names, got ''"),
                       (["--sweep", "r=8", "--sweep", "r=16"], "axis 'r' is given twice"),
                       (["--sweep", "r=8", "--sweep", "all"], "--sweep all sweeps every axis at its default values: "
                                                                 "give it alone")):
        with pytest.raises(SystemExit) if args[0] != "--sweep" else contextlib.nullcontext():
            rc = cli.main(SMALL_FAST + args + ["--list-arms"])
            assert rc == 2
        assert want in capsys.readouterr().err, args


def test_errors_name_the_flag_the_user_typed(capsys):
    """A sweep point the base config cannot take names the sweep item (the user gave no --experts); a bad --dtype
    names the flag; an unknown format says what 'bf16' stands for (the dense factors under any --dtype)."""
    for args, want in ((["--sweep", "experts=1"], "--sweep experts=1: --topk (2) must not exceed --experts (1)"),
                       (["--dtype", "int8"], "--dtype must be one of"),
                       (["--dtype", "fp16", "--formats", "fp16"], "'bf16' is the dense factors, in the compute dtype "
                                                                  "of --dtype")):
        assert cli.main(SMALL_FAST + args) == 2, args
        assert want in capsys.readouterr().err, args


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert cli.main(SMALL_FAST + ["--plot", str(tmp_path / "x.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_plot_path_of_a_type_matplotlib_cannot_write_is_refused_before_the_run(monkeypatch, capsys, tmp_path):
    """``--plot x.txt`` is a usage error before any arm runs (savefig would raise after the whole run); no suffix
    means PNG, and any type matplotlib lists is accepted."""
    pytest.importorskip("matplotlib")
    from tsct.bench import runner

    def no_run(*a, **k):
        raise AssertionError("the run started although the plot cannot be written")

    monkeypatch.setattr(runner, "run", no_run)
    for argv in ([], ["--sweep", "experts=4,8"]):
        assert cli.main(SMALL_FAST + argv + ["--plot", str(tmp_path / "plot.txt")]) == 2
        err = capsys.readouterr().err
        assert "--plot" in err and "cannot write .txt files" in err and ".png" in err, err
    for ok in ("plot", "plot.PNG", "plot.svg", "plot.pdf"):
        assert report.check_plot_path(tmp_path / ok) == (tmp_path / ok).absolute()


def test_plot_writes_a_png(small_run, tmp_path):
    pytest.importorskip("matplotlib")
    _, res = small_run
    p = report.plot(res, tmp_path / "bars.png")
    assert p.read_bytes()[:4] == b"\x89PNG"


def test_plot_bars_are_graph_times_where_timed():
    eager = {"median": 2.0, "p10": 1.9, "p90": 2.2, "n": 5}
    graph = {"median": 1.5, "p10": 1.49, "p90": 1.51, "n": 30}
    assert report.timed_stat({"fwd_ms": eager, "fwd_graph_ms": graph}, "fwd") == (graph, True)
    assert report.timed_stat({"fwdbwd_ms": eager, "fwdbwd_graph_ms": None}, "fwdbwd") == (eager, False)
    assert report.timed_stat({"fwdbwd_ms": eager}, "fwdbwd") == (eager, False)


def test_plot_draws_a_graph_timed_arm(tmp_path):
    pytest.importorskip("matplotlib")
    st = lambda m: {"median": m, "p10": 0.9 * m, "p90": 1.1 * m, "n": 5}
    arm = lambda name, g: {"name": name, "status": "ran", "fwd_ms": st(1.0), "fwdbwd_ms": st(3.0),
                           "fwd_graph_ms": st(0.8) if g else None, "fwdbwd_graph_ms": st(2.5) if g else None}
    res = {"arms": [arm("graphed", True), arm("eager-only", False)], "floor_ms": 0.35, "device": {"name": "x"},
           "config": {"preset": "b1", "tokens": 1, "topk": 1, "experts": 1, "d": 1, "r": 1, "f": 1, "dtype": "bf16"}}
    p = report.plot(res, tmp_path / "bars.png")
    assert p.read_bytes()[:4] == b"\x89PNG"


# ---- routing ----------------------------------------------------------------------------------------------

def _route(t, e, k, **kw):
    g = torch.Generator().manual_seed(kw.pop("seed", 0))
    return routing.route(t, e, k, generator=g, device="cpu", dtype=torch.bfloat16, **kw)


@pytest.mark.parametrize("kind", ["softmax", "zipf"])
def test_offs_match_bincount_and_the_sort_is_stable(kind):
    t, e, k = 300, 16, 2
    ids, w = _route(t, e, k, routing=kind)
    assert ids.shape == (t, k) and w.shape == (t, k)
    assert bool((ids[:, 0] != ids[:, 1]).all())  # k distinct experts per token
    assert torch.allclose(w.float().sum(1), torch.ones(t), atol=1e-2)
    s = routing.sort_by_expert(ids, e)
    assert s.offs.dtype == torch.int32 and s.offs.shape == (e,)
    assert torch.equal(s.offs.long(), torch.cumsum(torch.bincount(ids.reshape(-1), minlength=e), 0))
    assert int(s.offs[-1]) == t * k
    assert torch.equal(s.expert, ids.reshape(-1)[s.order])
    assert bool((s.expert[1:] >= s.expert[:-1]).all())
    assert torch.equal(s.token, s.order // k)
    for lo, hi in zip([0] + s.offs[:-1].tolist(), s.offs.tolist()):  # stable: token order within an expert
        assert bool((s.order[lo + 1:hi] > s.order[lo:hi - 1]).all())
    inv = routing.inverse_permutation(s.order)
    assert torch.equal(s.order[inv], torch.arange(t * k))


def test_zipf_routing_leaves_experts_empty():
    ids, _ = _route(256, 64, 2, routing="zipf", zipf_exponent=2.0)
    counts_ = torch.bincount(ids.reshape(-1), minlength=64)
    assert int((counts_ == 0).sum()) >= 1
    assert int(counts_.max()) > 4 * 256 * 2 // 64  # skewed: the top expert is far above the mean
    soft, _ = _route(256, 64, 2, routing="softmax")
    assert int(torch.bincount(soft.reshape(-1), minlength=64).max()) < int(counts_.max())


def test_capacity_slots_drop_rows_past_capacity():
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])  # expert 0 gets 4 rows
    cap = routing.capacity_slots(ids, 4, 2)
    keep = cap.keep.view(4, 2)
    assert keep.tolist() == [[True, True], [True, True], [False, True], [True, False]]
    assert cap.slot[:4].tolist() == [0 * 2 + 0, 1 * 2 + 0, 0 * 2 + 1, 2 * 2 + 0]
    assert cap.src[[0, 1, 2, 4]].tolist() == [0, 1, 0, 1]


# ---- the padded-bmm baseline against the fp32 reference ---------------------------------------------------

def _small_cfg(**kw):
    return config.from_preset("small", device="cpu", **kw).resolved()


def test_padded_bmm_equals_the_reference_when_nothing_is_dropped():
    cfg = _small_cfg(capacity_factor=8.0, routing="zipf", zipf_exponent=1.5)  # C = 512 = T: no drop possible
    (inp,) = inputs.make_input_sets(cfg, 1)
    fac = inputs.make_dense_factors(cfg)
    assert bool(routing.capacity_slots(inp.ids, cfg.experts, cfg.capacity).keep.all())
    out = arms.padded_bmm_pass(cfg, inp, fac)
    assert out.shape == (cfg.tokens, cfg.f) and out.dtype == torch.bfloat16
    with torch.no_grad():
        ref = arms.tsct_call(inp.x.detach().float(), inp.ids, inp.weights.detach().float(),
                             fac.dequantized(torch.float32), cfg.experts, "reference")
    err = arms.rel_errors(out, ref)
    assert err["max_rel_err"] < 2e-2 and err["rel_l2_err"] < 1e-2, err
    # and the gradient flows to every input the benchmark differentiates
    grads = torch.autograd.grad(out, [inp.x, inp.weights] + fac.leaves(), inp.grad_out)
    assert all(g is not None and bool(torch.isfinite(g.float()).all()) for g in grads)


def test_padded_bmm_drops_when_capacity_is_small():
    cfg = _small_cfg(capacity_factor=0.5)
    (inp,) = inputs.make_input_sets(cfg, 1)
    keep = routing.capacity_slots(inp.ids, cfg.experts, cfg.capacity).keep
    assert 0.3 < 1 - keep.float().mean() < 0.7  # half the capacity of the mean: about half dropped


def test_grouped_mm_pass_matches_the_reference():
    gmm, _ = arms.grouped_mm_function()
    if gmm is None:
        pytest.skip("this torch has no grouped_mm")
    cfg = _small_cfg(f=176)
    (inp,) = inputs.make_input_sets(cfg, 1)
    fac = inputs.make_dense_factors(cfg)
    out = arms.grouped_mm_pass(cfg, inp, fac, gmm)
    with torch.no_grad():
        ref = arms.tsct_call(inp.x.detach().float(), inp.ids, inp.weights.detach().float(),
                             fac.dequantized(torch.float32), cfg.experts, "reference")
    assert arms.rel_errors(out, ref)["max_rel_err"] < 2e-2


# ---- formulas at b1 (design.md sections 2 and 5) -----------------------------------------------------------

def test_b1_counts_give_the_design_numbers():
    b1 = config.PRESETS["b1"]
    t, e, d, r, f = b1["tokens"], b1["experts"], b1["d"], b1["r"], b1["f"]
    assert counts.params_per_expert(d, r, f) == 611_776
    assert counts.bank_params(e, d, r, f) == 626_458_624  # the routed bank (design's 1,066,354,113 is the model)
    fb = counts.dense_factor_bytes(e, d, r, f)
    assert fb == 1_252_917_248 and round(fb / 1e9, 2) == 1.25
    floor = counts.bytes_floor(t, e, d, r, f)
    assert floor == t * d * 2 + fb + t * f * 2 == 1_498_972_160
    assert round(floor / 1e9, 2) == 1.50
    assert math.isclose(floor / 4.1e12 * 1e3, 0.365, abs_tol=0.001)  # 0.365 ms at the H200's 4.1 TB/s
    m = t * b1["topk"]
    assert counts.useful_flops(m, d, r, f) == 2 * m * d * 2 * r + 2 * m * r * f
    cfg = config.from_preset("b1", device="cpu").resolved()
    assert cfg.capacity == 64 and cfg.routed_rows == 32768


def test_timing_statistics_and_iteration_budget():
    calls = []
    st = measure.time_calls(lambda i: calls.append(i), torch.device("cpu"), warmup=2, iters=7, n_sets=3)
    assert st["n"] == 7 and calls == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # warm-up and timed calls rotate input sets
    assert st["p10"] <= st["median"] <= st["p90"]
    import time

    st = measure.time_calls(lambda i: time.sleep(0.01), torch.device("cpu"), warmup=1, iters=100, min_iters=3,
                            max_seconds=0.05)
    assert 3 <= st["n"] <= 6  # max_seconds caps the count, min_iters floors it


def test_graph_timing_is_cuda_only_and_reported_per_arm(small_run):
    assert measure.time_graph(lambda i: None, torch.device("cpu")) is None
    for a in small_run[1]["arms"]:  # the CPU run: eager times only, the graph fields present and empty
        assert a["fwd_graph_ms"] is None and a["fwdbwd_graph_ms"] is None
    assert report._graph_cell({"fwd_graph_ms": None, "fwdbwd_graph_ms": None}) == "-"
    cell = report._graph_cell({"fwd_graph_ms": {"median": 0.6789}, "fwdbwd_graph_ms": {"median": 1.8791}})
    assert cell == "0.679 / 1.879"
    assert report._graph_cell({"fwd_graph_ms": {"median": 0.5}, "fwdbwd_graph_ms": None}) == "0.500 / -"


def test_noisy_timings_are_flagged():
    from tsct.bench import report
    steady = {"median": 1.0, "p10": 0.98, "p90": 1.05}
    shaky = {"median": 1.2, "p10": 1.0, "p90": 2.0}
    assert not report.noisy(steady) and report.noisy(shaky) and not report.noisy(None)
    assert report._time_cell(shaky).startswith("[yellow]~[/]") and "~" not in report._time_cell(steady)


@pytest.mark.parametrize("experts", [8, 1024, 40000])
def test_sort_by_expert_narrow_keys_keep_the_stable_order(experts):
    """int16 sort keys (2 radix passes instead of 8) give exactly the stable int64 argsort."""
    from tsct.bench import routing

    ids = torch.randint(0, experts, (3000, 2), generator=torch.Generator().manual_seed(experts))
    s = routing.sort_by_expert(ids, experts)
    assert torch.equal(s.order, torch.argsort(ids.reshape(-1), stable=True))
    assert routing.sort_key(ids.reshape(-1), experts).dtype == (torch.int16 if experts < 32767 else torch.int64)


def test_report_flags_a_forward_slower_than_forward_plus_backward():
    from tsct.bench import report

    arm = {"name": "x", "status": "ran", "fwd_ms": {"median": 5.0}, "fwdbwd_ms": {"median": 2.0}}
    assert report._fwd_above_fwdbwd(arm)
    assert not report._fwd_above_fwdbwd({"fwd_ms": {"median": 1.0}, "fwdbwd_ms": {"median": 2.0}})
    assert not report._fwd_above_fwdbwd({"fwd_ms": None, "fwdbwd_ms": {"median": 2.0}})


def test_kmajor_factors_keep_the_values_and_store_w_down_k_major():
    g = torch.Generator().manual_seed(3)
    wd = torch.randn(4, 16, 37, generator=g).to(torch.bfloat16).requires_grad_(True)
    fac = inputs.Factors("bf16", torch.randn(4, 32, 16), torch.randn(4, 32, 16), wd, torch.rand(4, 16),
                         torch.rand(4, 16))
    km = arms.kmajor_factors(fac)
    assert km.w_down.shape == wd.shape and torch.equal(km.w_down, wd)
    assert km.w_down.stride() == (37 * 16, 1, 16) and km.w_down.transpose(1, 2).is_contiguous()
    assert km.w_down.is_leaf and km.w_down.requires_grad
    assert km.w_gate is fac.w_gate and km.s_up is fac.s_up


def test_installed_package_records_its_build_commit():
    """A wheel records the commit it was built from (CMakeLists.txt -> tsct/_build_commit.py), which
    tsct-bench writes into its JSON when the installed package is not inside a checkout."""
    import re

    import tsct

    if not hasattr(tsct, "__git_commit__"):
        pytest.skip("tsct imported from a source checkout: tsct-bench asks git there")
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", tsct.__git_commit__), tsct.__git_commit__
    assert tsct._build_dirty in (True, False, None)


# ---- --sweep ---------------------------------------------------------------------------------------------

def test_sweep_runs_each_point_once_and_writes_json_and_plot(tmp_path):
    """A tiny sweep on the CPU (padded bmm, the reference and bmm paths): the shared base point runs once, every point
    carries its shape's bytes floor, the padded bmm its dropped fraction (a capacity that drops rows here; the exact
    arms drop none), and the plot is written with the note that an arm dropping rows is not comparable."""

    out = tmp_path / "sw.json"
    png = tmp_path / "sw.png"
    argv = ["--preset", "small", "--device", "cpu", "--tokens", "64", "--d", "64", "--f", "40", "--experts", "8",
            "--warmup", "1", "--iters", "2", "--min-iters", "1", "--copy-mb", "1", "--quiet", "--capacity-factor",
            "0.5", "--arms", "padded-bmm,tsct-reference-*,tsct-bmm-bf16", "--formats", "bf16", "--sweep", "experts=4,8",
            "--sweep", "routing=softmax,zipf1.5", "--json", str(out)]
    if _has_matplotlib():
        argv += ["--plot", str(png)]
    assert cli.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["sweep_schema_version"] == 1 and res["kind"] == "sweep"
    assert res["axes"] == {"experts": [4, 8], "routing": ["softmax", "zipf1.5"]}
    assert [p["axes"] for p in res["points"]] == [["experts"], ["experts", "routing"], ["routing"]]
    for p in res["points"]:
        c = p["result"]["config"]
        assert (c["tokens"], c["experts"], c["d"], c["r"], c["f"]) == (64, p["values"]["experts"], 64, 16, 40)
        assert p["result"]["bytes_floor"] == counts.bytes_floor(64, c["experts"], 64, 16, 40)
        assert (c["routing"], c["zipf_exponent"] if c["routing"] == "zipf" else None) == \
            sweep._routing_value(p["values"]["routing"])
        arms_ = {a["name"]: a for a in p["result"]["arms"]}
        assert set(arms_) == {"padded-bmm", "tsct-reference-bf16", "tsct-bmm-bf16"}
        assert all(a["status"] == "ran" for a in arms_.values()), arms_
        assert arms_["padded-bmm"]["dropped_fraction"] > 0  # capacity factor 0.5: rows dropped
        assert arms_["tsct-reference-bf16"]["dropped_fraction"] == 0.0 == arms_["tsct-bmm-bf16"]["dropped_fraction"]
    xs, by_arm, floors = sweep.series(res, "routing")
    assert xs == ["softmax", "zipf1.5"] and all(f > 0 for f in floors)
    assert all(v is not None for v in by_arm["padded-bmm"]["dropped"])
    if _has_matplotlib():
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_sweep_table_into_a_log_is_not_cut(tmp_path, capsys):
    """Printed to a file or pipe (a log; here pytest's capture), the sweep table is as wide as its columns need: each
    point's header is whole, past the fixed width of 200 a single run's table uses."""
    values = list(range(2, 16))
    argv = ["--preset", "small", "--device", "cpu", "--tokens", "32", "--d", "32", "--f", "24", "--experts", "2",
            "--topk", "1", "--warmup", "1", "--iters", "1", "--min-iters", "1", "--copy-mb", "1", "--quiet",
            "--arms", "padded-bmm", "--sweep", "experts=" + ",".join(map(str, values)),
            "--json", str(tmp_path / "sw.json")]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "experts=2 " in line)
    assert len(header) > 200 and all(f"experts={v} " in header for v in values), header


def test_a_sweep_point_without_device_memory_is_skipped_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    """A point the GPU cannot hold (E 16384's bank on a 16 GB card) is recorded with its reason; the other points,
    the table, the JSON, the plot and the exit status are those of the points that ran."""
    from tsct.bench import runner

    real = runner.run

    def run(cfg, reporter=None):
        if cfg.experts == 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 21.33 GiB.\nmore lines")
        return real(cfg, reporter)

    monkeypatch.setattr(runner, "run", run)
    out = tmp_path / "sw.json"
    argv = ["--preset", "small", "--device", "cpu", "--tokens", "64", "--d", "64", "--f", "40", "--experts", "4",
            "--warmup", "1", "--iters", "2", "--min-iters", "1", "--copy-mb", "1", "--quiet", "--arms",
            "padded-bmm,tsct-reference-bf16", "--formats", "bf16", "--sweep", "experts=4,8,16", "--json", str(out)]
    if _has_matplotlib():
        argv += ["--plot", str(tmp_path / "sw.png")]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "point experts=8 skipped: out of device memory: CUDA out of memory. Tried to allocate 21.33 GiB." \
        in captured.err
    res = json.loads(out.read_text())
    assert [p["values"]["experts"] for p in res["points"]] == [4, 8, 16]
    skipped = res["points"][1]
    assert skipped["result"] is None and skipped["skipped"].endswith("Tried to allocate 21.33 GiB.")
    assert [p["values"]["experts"] for p in sweep.ran(res)] == [4, 16]
    assert res["device"]["type"] == "cpu"
    xs, by_arm, floors = sweep.series(res, "experts")
    assert xs == [4, 8, 16] and floors[1] is None and floors[0] > 0 and floors[2] > 0
    assert by_arm["padded-bmm"]["fwd"][1] is None and by_arm["padded-bmm"]["fwd"][2] > 0
    assert "skipped" in captured.out  # the summary table's cells of that point


def test_a_sweep_where_no_point_fits_says_so_and_exits_1(tmp_path, monkeypatch, capsys):
    from tsct.bench import runner

    def run(cfg, reporter=None):
        raise torch.OutOfMemoryError()  # no message at all

    monkeypatch.setattr(runner, "run", run)
    out = tmp_path / "sw.json"
    argv = ["--preset", "small", "--device", "cpu", "--quiet", "--sweep", "experts=2,4", "--json", str(out)]
    if _has_matplotlib():
        argv += ["--plot", str(tmp_path / "sw.png")]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "no sweep point ran" in captured.err and "point experts=4 skipped: out of device memory" in captured.err
    assert "every arm" in captured.out and "skipped" in captured.out
    res = json.loads(out.read_text())
    assert [p["result"] for p in res["points"]] == [None, None]
    assert res["device"]["type"] == "cpu"  # the device the sweep was asked on, though no point ran
    assert not (tmp_path / "sw.png").exists()


def test_a_run_without_device_memory_is_one_clear_error(monkeypatch, capsys):
    from tsct.bench import runner

    def run(cfg, reporter=None):
        raise torch.OutOfMemoryError(*messages[:1])

    monkeypatch.setattr(runner, "run", run)
    messages = ["CUDA out of memory. Tried to allocate 20.00 GiB.\nmore lines"]
    assert cli.main(["--preset", "small", "--device", "cpu", "--experts", "16", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "tsct-bench: error: out of device memory for this shape (E 16, T " in err
    assert "Tried to allocate 20.00 GiB. Fewer --experts or --tokens fit." in err and "Traceback" not in err
    messages.clear()  # an error without a message
    assert cli.main(["--preset", "small", "--device", "cpu", "--experts", "16", "--quiet"]) == 1
    assert "out of device memory for this shape" in capsys.readouterr().err


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("spec, words", [("depth=1,2", "unknown axis 'depth'"), ("routing=zipfx", "zipf<exponent>"),
                                         ("routing=zipf-1", "zipf<exponent>"), ("r=16,big", "must be integers"),
                                         ("experts=0", ">= 1"), ("tokens=", "no values")])
def test_sweep_axes_are_checked_naming_the_item(spec, words, capsys):
    assert cli.main(["--preset", "small", "--device", "cpu", "--sweep", spec]) == 2
    assert words in capsys.readouterr().err


def test_sweep_default_file_name_has_the_short_device_name():
    """bench/results naming: <date>_<device>_sweep_<short commit>, the device "cpu" or the GPU's short name."""
    base = {"date": "2026-12-06T19:00:00Z", "git_commit": "fc4fbdd0123"}
    for dev, want in (({"type": "cpu", "name": "x86_64"}, "cpu"),
                      ({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}, "h100"),
                      ({"type": "cuda", "name": "NVIDIA GeForce RTX 5060 Ti"}, "rtx5060")):
        assert sweep.default_stem({**base, "device": dev}) == f"2026-12-06_{want}_sweep_fc4fbdd"
    assert sweep.default_stem({"date": "2026-12-06", "device": None}) == "2026-12-06_cpu_sweep_unknown"


def test_sweep_plan_defaults_and_shared_base_point():

    base = config.from_preset("small", device="cpu").resolved()
    axes = sweep.parse_axes(["all"])
    assert axes == sweep.AXES
    pts = sweep.plan(base, {"experts": (4, 8, 16), "r": (8, 16)})
    assert len(pts) == 4  # E=8 and r=16 are the base point: run once, listed on both axes
    shared = [p for p in pts if len(p["axes"]) == 2]
    assert len(shared) == 1 and shared[0]["cfg"].experts == 8 and shared[0]["cfg"].r == 16


def test_gc_paused_collects_first_and_restores_the_collector():
    """CUDA graph captures run with the cyclic collector off (a graph freed by it mid-capture invalidates the capture):
    garbage from before is collected on entry, nothing during, and the collector's state is restored on exit (also
    when it was already off, and after an exception)."""
    import gc

    from tsct.bench.measure import gc_paused

    class Cycle:
        def __init__(self):
            self.me = self

    assert gc.isenabled()
    Cycle()
    with gc_paused():
        assert not gc.isenabled()
        assert not any(isinstance(o, Cycle) for o in gc.get_objects())  # collected on entry
        Cycle()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failed capture")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before: still off
    finally:
        gc.enable()


@pytest.mark.parametrize("shape", [dict(routing="zipf", zipf_exponent=1.2),  # many rows per expert, some empty
                                   dict(tokens=2, topk=1, experts=8)])  # one row or none per expert
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "sign", "fp8", "ternary"])
def test_reference_output_reads_the_bank_a_chunk_at_a_time_with_the_same_values(fmt, shape, monkeypatch):
    """The benchmark's fp32 reference decodes packed factors a few experts at a time (an fp32 copy of the whole bank
    is 40 GB at E 16384): the same bits as the reference on the fully decoded fp32 bank, chunks crossing experts
    (a product over one or two rows rounds differently on a transposed operand: the decode is made contiguous)."""
    cfg = _small_cfg(**shape)
    (inp,) = inputs.make_input_sets(cfg, 1)
    fac = inputs.make_dense_factors(cfg)
    if fmt != "bf16":
        fac = inputs.quantize_factors(fac, fmt)
    with torch.no_grad():
        whole = arms.tsct_call(inp.x.detach().float(), inp.ids, inp.weights.detach().float(),
                               fac.dequantized(torch.float32), cfg.experts, "reference")
    # 3 experts' w_down per chunk: chunk edges fall inside the bank for every factor
    monkeypatch.setattr(inputs, "REFERENCE_CHUNK_BYTES", 3 * 4 * cfg.r * cfg.f)
    got = inputs.reference_output(fac, inp.x, inp.ids, inp.weights, cfg.experts)
    assert got.dtype == torch.float32 and got.shape == (cfg.tokens, cfg.f)
    assert torch.equal(got, whole)
    assert float(got.abs().mean()) > 1e-3  # a real output, not zeros
