"""``tsct-bench --sweep``: cost as work grows. One axis at a time is varied around the base config (the preset with
the command line's overrides); every point is one ``runner.run`` with every selected arm.

Axes (``--sweep AXIS`` takes the default values, ``--sweep AXIS=v1,v2,...`` others; ``--sweep all`` every axis):

    experts   E            256, 1024, 4096, 16384
    tokens    T            4096, 16384, 65536
    routing   skew         softmax, zipf1.0, zipf1.2, zipf1.5   (zipf<A>: --routing zipf --zipf-exponent A)
    r         latent rank  16, 32, 64, 128

A point equal to the base config on another axis is run once and shared. JSON (``sweep_schema_version`` 1):
{sweep_schema_version, kind: "sweep", tsct_version, git_commit, git, date, device, base_config, axes {axis:
[values]}, points: [{key, axes: [axes this point belongs to], values {axis: value}, result: <runner.run's JSON>}]}.
A point the GPU has no memory for (its bank, inputs and references; E 16384 at b1's d, r, f holds a 20 GB bf16 bank)
has ``result`` null and its reason in ``skipped``; the sweep goes on, the table marks it, the plot and the exit status
leave it out (no point ran: no plot, exit status 1).
Each point's result holds its own bytes floor (``bytes_floor``, ``floor_ms``) and, for the padded bmm, the fraction of
routed rows it dropped (``dropped_fraction``).

The plot: one column per axis; rows: forward ms, forward+backward ms (CUDA-graph medians where timed, else eager),
and % of the bf16 bytes floor (``pct_of_floor``: floor time / forward time; a packed format reads fewer bytes than
that floor counts, so it can pass 100 %); one line per arm; the floor time of each
point as a dashed black line in the ms rows. Arms that drop rows (the padded bmm past an expert's capacity) are drawn
dotted with the dropped fraction written at each point: their times are not comparable with the exact arms'.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from pathlib import Path
from typing import Optional, Sequence

import torch

from tsct.bench import measure, report
from tsct.bench.config import BenchConfig

SWEEP_SCHEMA_VERSION = 1

AXES: dict[str, tuple] = {
    "experts": (256, 1024, 4096, 16384),
    "tokens": (4096, 16384, 65536),
    "routing": ("softmax", "zipf1.0", "zipf1.2", "zipf1.5"),
    "r": (16, 32, 64, 128),
}
AXIS_LABELS = {"experts": "experts E", "tokens": "tokens T", "routing": "routing (skew)", "r": "latent rank r"}


def _routing_value(v: str) -> tuple[str, Optional[float]]:
    """"softmax" -> ("softmax", None); "zipf1.2" -> ("zipf", 1.2). ValueError otherwise."""
    if v == "softmax":
        return "softmax", None
    if v.startswith("zipf"):
        try:
            a = float(v[4:])
        except ValueError:
            a = math.nan
        if math.isfinite(a) and a > 0:
            return "zipf", a
    raise ValueError(f"--sweep routing: {v!r} is not 'softmax' or 'zipf<exponent>' (e.g. zipf1.2)")


def parse_axes(specs: Sequence[str]) -> dict[str, tuple]:
    """``--sweep`` arguments -> {axis: values} in ``AXES`` order. Raises ValueError naming a bad item."""
    out: dict[str, tuple] = {}
    if len(specs) > 1 and any(s.strip() == "all" for s in specs):
        raise ValueError(f"--sweep all sweeps every axis at its default values: give it alone, or name the axes "
                         f"(got {list(specs)})")
    for spec in specs:
        name, sep, vals = spec.partition("=")
        name = name.strip()
        if name == "all" and not sep:
            out.update(AXES)
            continue
        if name not in AXES:
            raise ValueError(f"--sweep {spec!r}: unknown axis {name!r} (axes: {', '.join(AXES)}, or 'all')")
        if name in out and any(s.partition("=")[0].strip() == name for s in specs[:specs.index(spec)]):
            raise ValueError(f"--sweep {spec!r}: axis {name!r} is given twice; list its values once "
                             f"({name}=v1,v2,...)")
        if not sep:
            out[name] = AXES[name]
            continue
        items = [v.strip() for v in vals.split(",") if v.strip()]
        if not items:
            raise ValueError(f"--sweep {spec!r}: no values after '='")
        if name == "routing":
            for v in items:
                _routing_value(v)
            out[name] = tuple(items)
        else:
            try:
                nums = tuple(int(v) for v in items)
            except ValueError:
                raise ValueError(f"--sweep {spec!r}: {name} values must be integers") from None
            if any(n < 1 for n in nums):
                raise ValueError(f"--sweep {spec!r}: {name} values must be >= 1")
            out[name] = nums
    return {a: out[a] for a in AXES if a in out}


def point_config(base: BenchConfig, axis: str, value) -> BenchConfig:
    """The base config with one axis set (a routing value also sets the zipf exponent)."""
    if axis == "routing":
        routing, a = _routing_value(value)
        return dataclasses.replace(base, routing=routing, zipf_exponent=a if a is not None else base.zipf_exponent)
    return dataclasses.replace(base, **{axis: value})


def base_value(base: BenchConfig, axis: str):
    """The base config's value on an axis (its routing written as the axis writes it)."""
    if axis == "routing":
        return "softmax" if base.routing == "softmax" else f"zipf{base.zipf_exponent:g}"
    return getattr(base, axis)


def _key(cfg: BenchConfig) -> tuple:
    return (cfg.experts, cfg.tokens, cfg.r, cfg.routing, cfg.zipf_exponent if cfg.routing == "zipf" else None)


def plan(base: BenchConfig, axes: dict[str, tuple]) -> list[dict]:
    """The distinct points: [{key, cfg, axes, values}], in axis order; a point shared by two axes (the base config)
    is listed once with both."""
    points: dict[tuple, dict] = {}
    for axis, values in axes.items():
        for v in values:
            try:
                cfg = point_config(base, axis, v).resolved()
            except ValueError as e:  # a point the base config cannot take (experts below --topk)
                raise ValueError(f"--sweep {axis}={v}: {e}") from None
            k = _key(cfg)
            p = points.setdefault(k, {"key": k, "cfg": cfg, "axes": [], "values": {}})
            p["axes"].append(axis)
            p["values"][axis] = v
    for p in points.values():  # every point's value on every swept axis (for the plot's x positions)
        for axis in axes:
            p["values"].setdefault(axis, base_value(p["cfg"], axis))
    return list(points.values())


def run_sweep(base: BenchConfig, axes: dict[str, tuple], reporter=None) -> dict:
    """Run every point of ``plan(base, axes)`` (``runner.run``); never raises for a failing arm (recorded)."""
    from tsct.bench import measure
    from tsct.bench.runner import NullReporter, run

    import tsct

    reporter = reporter or NullReporter()
    started = measure.utc_now()
    pts = plan(base.resolved(), axes)
    out = []
    for i, p in enumerate(pts):
        reporter.step(f"sweep point {i + 1}/{len(pts)}: " + ", ".join(f"{a}={p['values'][a]}" for a in p["axes"]))
        rec = {"key": list(p["key"]), "axes": p["axes"], "values": p["values"], "result": None}
        try:
            rec["result"] = run(p["cfg"], reporter)
        except torch.OutOfMemoryError as e:  # this GPU cannot hold the point's bank and inputs: say so, go on
            reporter.stop()
            rec["skipped"] = "out of device memory: " + str(e).split("\n")[0][:300]
        if rec["result"] is None:  # after the except block, whose traceback held the point's tensors
            gc.collect()
            torch.cuda.empty_cache()
        out.append(rec)
    git = measure.git_commit()
    first = next((p["result"] for p in out if p["result"]), None)
    device = first["device"] if first else measure.device_info(base.resolved().torch_device)
    return {"sweep_schema_version": SWEEP_SCHEMA_VERSION, "kind": "sweep", "tsct_version": tsct.__version__,
            "git_commit": git["commit"], "git": git, "date": started, "device": device,
            "base_config": base.resolved().to_json(), "axes": {a: list(v) for a, v in axes.items()}, "points": out}


def ran(result: dict) -> list[dict]:
    """The points that ran (a point the GPU had no memory for has ``"result": None`` and its reason in
    ``"skipped"``)."""
    return [p for p in result["points"] if p["result"]]


def default_stem(result: dict) -> str:
    """``<date>_<device>_sweep_<short commit>``: the bench/results naming (date, device, short commit); the device
    is "cpu" or the GPU's short name (``measure.gpu_tag``: "h100", "rtx5060")."""
    info = result.get("device") or {}
    dev = measure.gpu_tag(info.get("name")) if info.get("type") == "cuda" else "cpu"
    commit = (result.get("git_commit") or "unknown")[:7]
    return f"{result['date'][:10]}_{dev}_sweep_{commit}"


def _time(a: dict, key: str) -> Optional[float]:
    """The arm's median ms for "fwd" / "fwdbwd": the CUDA-graph one where timed, else the eager one."""
    st, _ = report.timed_stat(a, key)
    return st["median"] if st else None


def series(result: dict, axis: str) -> tuple[list, dict, list]:
    """(x values, {arm: {"fwd": [...], "fwdbwd": [...], "pct": [...], "dropped": [...]}}, floor ms per x) of the
    points on ``axis``, in the axis's order (None where an arm did not run)."""
    xs = result["axes"][axis]
    pts = {str(p["values"][axis]): p for p in ran(result) if axis in p["axes"]}
    arms: dict = {}
    floors = []
    for i, x in enumerate(xs):
        p = pts.get(str(x))
        floors.append(p["result"]["floor_ms"] if p else None)
        for a in (p["result"]["arms"] if p else []):
            s = arms.setdefault(a["name"], {k: [None] * len(xs) for k in ("fwd", "fwdbwd", "pct", "dropped")})
            if a["status"] == "ran":
                s["fwd"][i], s["fwdbwd"][i] = _time(a, "fwd"), _time(a, "fwdbwd")
                s["pct"][i], s["dropped"][i] = a.get("pct_of_floor"), a.get("dropped_fraction")
    return xs, arms, floors


def plot(result: dict, path) -> Path:
    """The sweep's figure (module docstring) as a PNG."""
    plt = report.require_matplotlib()
    axes = list(result["axes"])
    rows = (("fwd", "forward ms"), ("fwdbwd", "forward+backward ms"),
            ("pct", "% of the bf16 bytes floor (fwd;\npacked factors read fewer bytes)"))
    fig, grid = plt.subplots(len(rows), len(axes), figsize=(4.6 * len(axes) + 1.5, 3.2 * len(rows) + 0.8),
                             squeeze=False)
    names = sorted({a["name"] for p in ran(result) for a in p["result"]["arms"]})
    cmap = plt.cm.tab10 if len(names) <= 10 else plt.cm.tab20
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    drops_any = False
    for c, axis in enumerate(axes):
        xs, arms, floors = series(result, axis)
        pos = list(range(len(xs))) if axis == "routing" else xs
        for r, (key, label) in enumerate(rows):
            ax = grid[r][c]
            for name, s in arms.items():
                pts = [(x, y, dr) for x, y, dr in zip(pos, s[key], s["dropped"]) if y is not None]
                if not pts:
                    continue
                drops = any(dr for _, _, dr in pts)
                drops_any |= drops
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, color=colors[name],
                        linestyle=":" if drops else "-", label=name + (" (drops rows)" if drops else ""))
                if drops and key != "pct":
                    for x, y, dr in pts:
                        if dr:
                            ax.annotate(f"{dr:.0%} dropped", (x, y), fontsize=6, textcoords="offset points",
                                        xytext=(2, 3), color=colors[name])
            if key != "pct":
                fl = [(x, y) for x, y in zip(pos, floors) if y]
                if fl:
                    ax.plot([p[0] for p in fl], [p[1] for p in fl], "k--", linewidth=1, label="bf16 bytes floor")
                ax.set_yscale("log")
            else:
                ax.axhline(100, color="k", linestyle="--", linewidth=0.8)
            if axis == "routing":
                ax.set_xticks(pos)
                ax.set_xticklabels([str(x) for x in xs], fontsize=7)
            else:
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs)
                ax.set_xticklabels([str(x) for x in xs], fontsize=7)
            if r == len(rows) - 1:
                ax.set_xlabel(AXIS_LABELS.get(axis, axis))
            if c == 0:
                ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = {}, []
    for ax in grid.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7)
    cfg = result["base_config"]
    dev = (result.get("device") or {}).get("name")
    title = (f"tsct-bench sweep around T={cfg['tokens']} k={cfg['topk']} E={cfg['experts']} d={cfg['d']} r={cfg['r']} "
             f"f={cfg['f']} {cfg['dtype']}, {dev}, {result.get('git_commit', '')[:7]}; times: CUDA-graph medians "
             "where timed, else eager")
    if drops_any:
        title += ("\ndotted: the arm drops routed rows past an expert's capacity (fraction written at each point): "
                  "faster, but not comparable with the exact arms")
    fig.suptitle(title, fontsize=8)
    n_leg_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.02 + 0.025 * n_leg_rows, 1, 0.95))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def summary_table(result: dict):
    """A rich table: one row per arm, one column per point (forward / forward+backward ms, graph where timed; the
    padded bmm's dropped fraction in brackets)."""
    from rich.markup import escape
    from rich.table import Table

    pts = result["points"]
    t = Table(title=escape(f"tsct-bench sweep ({', '.join(result['axes'])}): forward / forward+backward ms, "
                           "CUDA-graph medians where timed; [dropped rows]; floor: bf16 bytes floor ms"))
    t.add_column("arm", no_wrap=True)
    for p in pts:
        t.add_column(escape(" ".join(f"{a}={p['values'][a]}" for a in p["axes"])), justify="right")
    t.add_row("floor", *[f"{p['result']['floor_ms']:.3g}" if p["result"] else "-" for p in pts])
    names = sorted({a["name"] for p in ran(result) for a in p["result"]["arms"]})
    if not names:  # no point ran: one row that says so
        t.add_row("every arm", *["skipped" for _ in pts])
    for name in names:
        cells = []
        for p in pts:
            if not p["result"]:
                cells.append("skipped")
                continue
            a = next((x for x in p["result"]["arms"] if x["name"] == name), None)
            if a is None or a["status"] != "ran":
                cells.append("-" if a is None else a["status"])
                continue
            f, fb = _time(a, "fwd"), _time(a, "fwdbwd")
            cell = f"{f:.3g} / {fb:.3g}" if fb is not None else f"{f:.3g} / -"
            if a.get("dropped_fraction"):
                cell += f" [{a['dropped_fraction']:.0%}]"
            cells.append(cell)
        t.add_row(escape(name), *cells)
    return t
