"""``tsct-bench`` / ``python -m tsct.bench``: command-line front end of the benchmark (argparse only).

Exit status: 0 when every selected arm ran, was refused or is unavailable (all recorded); 1 when an arm
failed with an unexpected error (recorded too); 2 for bad arguments or a missing optional dependency.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch
from rich.console import Console

from tsct.bench import config as cfgmod
from tsct.bench import report, sweep


def _csv(s: str) -> tuple:
    items = tuple(dict.fromkeys(p.strip() for p in s.split(",") if p.strip()))  # each name once, in order
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {s!r}")
    return items


def _per_preset(key: str) -> str:
    return ", ".join(f"{v[key]} for {name}" for name, v in cfgmod.PRESETS.items())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tsct-bench",
        description="Time the whole low-rank MoE expert pass (sort, gather, grouped GLU, combine) for the "
                    "padded-bmm and grouped-mm baselines and every tsct path and factor format.",
        epilog="Presets: " + "; ".join(f"{k}: " + " ".join(f"{a}={b}" for a, b in v.items())
                                       for k, v in cfgmod.PRESETS.items()),
    )
    p.add_argument("--preset", choices=sorted(cfgmod.PRESETS),
                   help="shape preset (default: b1 on a GPU, small on the CPU)")
    g = p.add_argument_group("shape (overrides the preset)")
    g.add_argument("--tokens", type=int, help="T, tokens per step")
    g.add_argument("--topk", type=int, help="k, experts per token")
    g.add_argument("--experts", type=int, help="E")
    g.add_argument("--d", type=int, help="model width d")
    g.add_argument("--r", type=int, help="latent rank r")
    g.add_argument("--f", type=int, help="FFN width f")
    g.add_argument("--dtype", help="activation / dense factor dtype: bf16 (default), fp16, fp32")
    g = p.add_argument_group("run")
    g.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    g.add_argument("--routing", choices=cfgmod.ROUTINGS, help="softmax (default) or zipf (skewed expert popularity)")
    g.add_argument("--zipf-exponent", type=float, help="popularity ~ rank^-exponent for --routing zipf (default 1.2)")
    g.add_argument("--seed", type=int, help="random seed (default 0)")
    g.add_argument("--warmup", type=int, help="untimed calls before each measurement, at least 1 (the first compiles "
                   f"and allocates; default: the preset's, {_per_preset('warmup')})")
    g.add_argument("--iters", type=int,
                   help=f"at most this many timed calls per measurement (default: the preset's, {_per_preset('iters')})")
    g.add_argument("--min-iters", type=int,
                   help="at least this many timed calls per measurement, at most --iters (default 5, or --iters if fewer)")
    g.add_argument("--max-seconds", type=float,
                   help="cap on one measurement in seconds: fewer timed calls (not below --min-iters) if they would "
                        "take longer")
    g.add_argument("--capacity-factor", type=float, help="padded-bmm capacity C = ceil(cf * T * k / E) (default 2.0)")
    g.add_argument("--input-sets", type=int, help="input sets rotated between calls (default 2)")
    g.add_argument("--copy-mb", type=int, help="MiB copied to measure bandwidth (default 1024 on cuda, 64 on cpu)")
    g.add_argument("--arms", type=_csv, help="comma-separated arm names or fnmatch patterns (default: all); "
                                             "see --list-arms")
    g.add_argument("--formats", type=_csv,
                   help="factor storage formats of the tsct arms (default bf16,nvfp4,sign,fp8,ternary)")
    g.add_argument("--no-backward", action="store_true", help="time the forward only")
    g.add_argument("--sweep", action="append", metavar="AXIS[=V,...]",
                   help="cost as work grows: vary one axis at a time around the other flags' config and run every "
                        "selected arm at each point; axes experts (256,1024,4096,16384), tokens (4096,16384,65536), "
                        "routing (softmax,zipf1.0,zipf1.2,zipf1.5), r (16,32,64,128), or 'all'; repeatable. Writes "
                        "the JSON (--json, else bench/results/<date>_<device>_sweep_<commit>.json) and the plot "
                        "(--plot, else the same name .png when matplotlib is installed)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the full results as JSON (missing directories are created)")
    g.add_argument("--plot", metavar="FILE.png",
                   help="bar chart of forward and forward+backward times (matplotlib; missing directories are created)")
    g.add_argument("--list-arms", action="store_true", help="print the arms and whether they can run here, then exit")
    g.add_argument("--quiet", action="store_true", help="no progress display")
    return p


def config_from_args(a: argparse.Namespace) -> cfgmod.BenchConfig:
    over = dict(tokens=a.tokens, topk=a.topk, experts=a.experts, d=a.d, r=a.r, f=a.f, dtype=a.dtype, device=a.device,
                routing=a.routing, zipf_exponent=a.zipf_exponent, seed=a.seed, warmup=a.warmup, iters=a.iters,
                min_iters=a.min_iters, max_seconds=a.max_seconds, capacity_factor=a.capacity_factor,
                input_sets=a.input_sets, copy_mb=a.copy_mb, arms=a.arms, formats=a.formats)
    if a.no_backward:
        over["backward"] = False
    preset = a.preset
    if preset is None:  # the real shape where it can run in reasonable time, a quick one elsewhere
        import torch
        on_gpu = a.device == "cuda" or (a.device is None and torch.cuda.is_available())
        preset = "b1" if on_gpu else "small"
    cfg = cfgmod.from_preset(preset, **over).resolved()
    if a.min_iters is not None and a.min_iters > cfg.iters:  # the default follows --iters down; an asked one does not
        src = "--iters" if a.iters is not None else f"the {preset} preset's --iters"
        raise ValueError(f"--min-iters ({a.min_iters}) must not exceed {src} ({cfg.iters})")
    return cfg


def _list_arms(cfg: cfgmod.BenchConfig, console: Console) -> None:
    from tsct import dispatch
    from tsct.bench import arms, inputs, runner

    cap = dispatch.device_capability(cfg.torch_device)
    gmm, what = arms.grouped_mm_function()
    for s in runner.plan(cfg):
        storage = inputs.storage_problem(cfg, s.fmt)  # None for the dense formats of the baselines
        if storage is not None:  # the run would make this arm unavailable for the same reason
            state = f"unavailable: {storage}"
        elif s.kind == arms.TSCT:
            st = dispatch.status(s.path, cap, s.fmt, dispatch.DTYPE_NAMES[cfg.torch_dtype])
            state = "runs" if st.ok else f"unavailable: {st.reason}"
        elif s.kind == arms.GROUPED_MM:
            state = f"runs if torch accepts the shape ({what})" if gmm else f"unavailable: {what}"
        elif s.kind in (arms.PADDED_BMM,):
            state = "runs"
        else:
            state = f"unknown arm kind {s.kind!r}"
        console.print(f"{s.name:28s} {state}", markup=False, highlight=False)


def _usage_error(err: Console, e: Exception) -> int:
    """Print ``e`` as one unwrapped ``tsct-bench: error:`` line on stderr; the exit status for bad arguments."""
    err.print(f"tsct-bench: error: {e}", markup=False, highlight=False, soft_wrap=True)
    return 2


def _sweep(cfg: cfgmod.BenchConfig, axes: dict, a: argparse.Namespace, out: Console, err: Console) -> int:
    """``--sweep``: run the points, print the summary, write the JSON and the plot (``tsct.bench.sweep``)."""
    from tsct.bench.runner import NullReporter

    try:
        result = sweep.run_sweep(cfg, axes, reporter=NullReporter() if a.quiet else report.RichReporter(err))
    except ValueError as e:  # e.g. an --arms pattern that matches nothing
        return _usage_error(err, e)
    table = sweep.summary_table(result)
    if not out.is_terminal:  # a log: as wide as the table needs (a column per point), not cut to the fixed width
        from rich.measure import Measurement
        out.width = max(out.width, Measurement.get(out, out.options.update(width=10_000), table).maximum)
    out.print(table)
    for p in result["points"]:
        if not p["result"]:
            err.print("tsct-bench: point " + ", ".join(f"{x}={p['values'][x]}" for x in p["axes"]) + " skipped: "
                      + p["skipped"], markup=False, highlight=False)
    stem = Path("bench") / "results" / sweep.default_stem(result)
    path = a.json or str(stem.with_suffix(".json"))
    out.print(f"wrote {report.write_json(result, path)}", markup=False, highlight=False)
    if not sweep.ran(result):
        err.print("tsct-bench: error: no sweep point ran (none fits this GPU's memory); no plot", markup=False,
                  highlight=False)
        return 1
    plot = a.plot
    if plot is None:
        try:
            report.require_matplotlib()
            plot = str(Path(path).with_suffix(".png"))
        except report.PlotUnavailable as e:
            err.print(f"tsct-bench: note: no plot: {e}", markup=False, highlight=False)
    if plot:
        out.print(f"wrote {sweep.plot(result, plot)}", markup=False, highlight=False)
    failed = any(r["status"] == "error" for p in sweep.ran(result) for r in p["result"]["arms"])
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parser().parse_args(argv)
    # Not a terminal (a log, a remote runner): a fixed width that fits the table, no colour codes.
    out = Console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    err = (Console(stderr=True) if sys.stderr.isatty()
           else Console(stderr=True, width=200, no_color=True, log_path=False))
    try:
        cfg = config_from_args(a)
        axes = sweep.parse_axes(a.sweep) if a.sweep else None
        # outputs checked (written to) before spending device time, not after
        if a.json is not None:
            report.check_writable(a.json, "--json")
        if a.plot is not None:
            report.check_plot_path(a.plot)
    except (ValueError, report.PlotUnavailable) as e:
        return _usage_error(err, e)
    if axes is not None and not a.list_arms:
        return _sweep(cfg, axes, a, out, err)
    if a.list_arms:
        try:
            _list_arms(cfg, out)
        except ValueError as e:
            return _usage_error(err, e)
        return 0
    if cfg.device == "cpu" and cfg.preset == "b1" and not a.quiet:
        err.print("tsct-bench: note: the b1 preset on the CPU takes a long time; try --preset small", markup=False)

    from tsct.bench.runner import NullReporter, run

    reporter = NullReporter() if a.quiet else report.RichReporter(err)
    try:
        result = run(cfg, reporter=reporter)
    except ValueError as e:  # e.g. an --arms pattern that matches nothing
        return _usage_error(err, e)
    except torch.OutOfMemoryError as e:  # the shape's bank, inputs and references do not fit this GPU
        reporter.stop()
        why = (str(e).splitlines() or ["CUDA out of memory."])[0]
        err.print(f"tsct-bench: error: out of device memory for this shape (E {cfg.experts}, T {cfg.tokens}, d {cfg.d}, "
                  f"r {cfg.r}, f {cfg.f}): {why} Fewer --experts or --tokens fit.", markup=False, highlight=False,
                  soft_wrap=True)
        return 1
    report.print_report(result, out)
    try:
        if a.json:
            out.print(f"wrote {report.write_json(result, a.json)}", markup=False, highlight=False)
        else:
            out.print("no JSON written: --json FILE writes the full results (bench/results/ names them "
                      "<date>_<device>_<preset>_<commit>.json)", markup=False, highlight=False)
        if a.plot:
            out.print(f"wrote {report.plot(result, a.plot)}", markup=False, highlight=False)
    except OSError as e:  # checked before the run; the file system changed since
        err.print(f"tsct-bench: error: writing the results: {e}", markup=False, highlight=False, soft_wrap=True)
        return 1
    return 1 if any(r["status"] == "error" for r in result["arms"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
