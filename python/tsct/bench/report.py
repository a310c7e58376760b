"""Showing a run: rich progress while it runs, a rich table at the end, the JSON file, the bar chart."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table

# ---- progress -----------------------------------------------------------------------------------------


class RichReporter:
    """A progress bar over the arms on a terminal; plain time-stamped lines otherwise (logs, CI, pipes)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Optional[Progress] = None
        self.task = None

    def start(self, total: int) -> None:
        if self.console.is_terminal:
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task("tsct-bench", total=total)

    def step(self, message: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=message)
        else:
            self.console.log(message, markup=False, highlight=False)

    def arm_done(self, res: dict) -> None:
        line = f"{res['name']}: {res['status']}"
        if res.get("fwd_ms"):
            line += f"  fwd {_ms(res['fwd_ms'])} ms"
        if res.get("fwdbwd_ms"):
            line += f"  fwd+bwd {_ms(res['fwdbwd_ms'])} ms"
        if res.get("reason"):
            line += f"  ({res['reason']})"
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.advance(self.task)
        else:
            self.console.log(line, markup=False, highlight=False)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ---- formatting ---------------------------------------------------------------------------------------

def _ms(st: Optional[dict]) -> str:
    if not st:
        return "-"
    m = st["median"]
    return f"{m:.3f}" if m < 100 else f"{m:.1f}"


def _spread(st: Optional[dict]) -> str:
    if not st:
        return ""
    return f"{st['p10']:.3g}-{st['p90']:.3g}"


def _num(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _bytes(v, none: str = "n/a") -> str:
    if v is None:
        return none
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v} B"


STATUS_STYLE = {"ran": "green", "refused": "yellow", "unavailable": "dim", "error": "bold red"}


#: p90 / p10 above this marks a timing as noisy (host-bound passes, a disturbed machine): the median
#: alone then misleads, so the table flags it and the report says what to do
NOISY_RATIO = 1.3


def noisy(st: Optional[dict]) -> bool:
    """Whether a timing's p10-p90 spread is wider than ``NOISY_RATIO``."""
    return bool(st) and st["p10"] > 0 and st["p90"] > NOISY_RATIO * st["p10"]


def _time_cell(st: Optional[dict], spread: bool = True) -> str:
    if not st:
        return "-"
    mark = "[yellow]~[/]" if noisy(st) else ""
    return f"{mark}{_ms(st)} [dim]({st['p10']:.3g}-{st['p90']:.3g})[/]" if spread else mark + _ms(st)


#: below this console width the table drops the p10-p90 spreads and the storage / dropped columns
COMPACT_BELOW = 170


def _host_speed_note(result: dict) -> str:
    """The host's issue speed (``measure.host_speed``), by which the eager columns of host-bound arms move."""
    sp = (result.get("host") or {}).get("speed")
    if not sp:
        return ""
    return (f" Host speed: {sp['op_issue_us']:.2f} us to issue a tiny torch op, {sp['python_us']:.0f} us for a fixed "
            f"Python loop of 100,000 additions (lower is faster; eager times of host-bound arms scale with these).")


def table(result: dict, compact: bool = False) -> Table:
    """The main columns; ``compact`` for narrow terminals (the JSON always has everything)."""
    cfg = result["config"]
    title = (f"tsct-bench {cfg['preset']}: T={cfg['tokens']} k={cfg['topk']} E={cfg['experts']} d={cfg['d']} "
             f"r={cfg['r']} f={cfg['f']} {cfg['dtype']} {cfg['routing']} routing, {result['device'].get('name')}"
             + _proxy_label(result))
    caption = (f"copy {result['copy_bandwidth_GBps']:.0f} GB/s (measured now); bf16 bytes floor "
               f"{_bytes(result['bytes_floor'])} = {result['floor_ms']:.3f} ms at that rate. "
               f"Times: median {'' if compact else '(p10-p90) '}ms "
               f"of the whole pass (eager, per call; graph: replayed from a CUDA graph, the device time without "
               f"the host's share). % floor: floor time / fwd time (graph where timed, else eager; so are TFLOP/s). err: max|out-ref|/max|ref| against the fp32 "
               f"reference of the bf16 factors (dq: against the fp32 reference of the dequantized factors)."
               + _host_speed_note(result))
    t = Table(title=escape(title), caption=escape(caption), caption_justify="left")
    names = ["arm", "status", "fwd ms", "fwd+bwd ms", "graph f / fb", "% floor", "TFLOP/s f / fb", "max rel err",
             "peak mem"]
    names += [] if compact else ["storage", "dropped"]
    for name in names:
        t.add_column(name, justify="left" if name in ("arm", "status") else "right", no_wrap=True,
                     min_width={"arm": 18, "status": 7}.get(name))
    for a in result["arms"]:
        tf = a.get("tflops") or {}
        err = _num(a.get("max_rel_err"), ".2e")
        if a.get("max_rel_err_dequant") is not None:
            err += f" ({a['max_rel_err_dequant']:.1e} dq)"
        if a.get("nonfinite"):
            err = "[bold red]NaN/inf![/]"
        ran = a["status"] == "ran"
        row = [escape(a["name"]), f"[{STATUS_STYLE.get(a['status'], 'default')}]{a['status']}[/]",
               _time_cell(a.get("fwd_ms"), not compact), _time_cell(a.get("fwdbwd_ms"), not compact),
               _graph_cell(a), _num(a.get("pct_of_floor"), ".1f"),
               f"{_num(tf.get('fwd'), '.2f')} / {_num(tf.get('fwdbwd'), '.2f')}" if ran else "-",
               err, _bytes(a.get("peak_mem_bytes")) if ran else "-"]
        if not compact:
            row += [_bytes(a.get("storage_bytes"), "-"), _num(a.get("dropped_fraction"), ".2%") if ran else "-"]
        t.add_row(*row)
    return t


def _proxy_label(result: dict) -> str:
    """" (PROXY: ...)" when the Triton arms ran a proxy build's cubins (docs/decisions/0017), else ""."""
    p = (result.get("triton_aot") or {}).get("proxy")
    if not p:
        return ""
    return (f" (PROXY: the tsct Triton arms ran {p.get('of')}'s kernels assembled for {p.get('ptx')}, "
            f"not this GPU's release cubins)")


def _graph_cell(a: dict) -> str:
    """Median ms of the forward / forward+backward replayed from a CUDA graph ("-" where not timed)."""
    f, fb = a.get("fwd_graph_ms"), a.get("fwdbwd_graph_ms")
    if not f and not fb:
        return "-"
    return f"{_num(f and f.get('median'), '.3f')} / {_num(fb and fb.get('median'), '.3f')}"


def _fwd_above_fwdbwd(a: dict) -> bool:
    f, fb = a.get("fwd_ms"), a.get("fwdbwd_ms")
    return bool(f and fb and f.get("median") and fb.get("median") and f["median"] > fb["median"])


def print_report(result: dict, console: Console) -> None:
    console.print(table(result, compact=console.width < COMPACT_BELOW))
    notes = [a for a in result["arms"] if a.get("reason")]
    if notes:
        console.print("[bold]reasons[/]")
        for a in notes:
            console.print(f"  {a['name']} ({a['status']}): {a['reason']}", markup=False, highlight=False)
    shaky = [a["name"] for a in result["arms"] if noisy(a.get("fwd_ms")) or noisy(a.get("fwdbwd_ms"))]
    if shaky:
        graph = any(a.get("fwd_graph_ms") for a in result["arms"])  # none on a CPU
        console.print(f"[yellow]~ noisy[/]: p90/p10 > {NOISY_RATIO} for {', '.join(shaky)}. The median of such an arm "
                      "moves between runs (a host-bound eager pass, or a busy machine): re-run, raise --iters"
                      + (", or compare the CUDA-graph column (not timed for STE arms)" if graph else "")
                      + " before drawing conclusions.", highlight=False)
    upside = [a["name"] for a in result["arms"] if _fwd_above_fwdbwd(a)]
    if upside:
        console.print(f"[yellow]! inconsistent[/]: the forward alone took longer than forward+backward for "
                      f"{', '.join(upside)}: the machine was disturbed while one of them was timed (on a CPU: "
                      "other processes, or more threads than cores: try OMP_NUM_THREADS). Re-run before using "
                      "these numbers.", highlight=False)
    syncs = [a for a in result["arms"] if a.get("sync_free") is False]
    if syncs:
        console.print("[bold]host syncs inside the pass[/] (torch sync debug mode)")
        for a in syncs:
            console.print(f"  {a['name']}: {'; '.join(a['sync_ops'])}", markup=False, highlight=False)
    if result.get("fallbacks"):
        console.print(f"fallbacks counted: {result['fallbacks']}", markup=False, highlight=False)


# ---- JSON ---------------------------------------------------------------------------------------------

def _clean(v):
    """JSON-safe copy: non-finite floats -> None, tuples -> lists."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def check_writable(path, flag: str = "--json") -> Path:
    """Raise ValueError naming ``flag`` unless ``path`` can be written as a file (checked before a run, so that a
    bad output path does not lose the results at the end): the file is opened for appending (created, then removed,
    when it did not exist; missing directories are created, as the write would), which is what the write will need;
    permission bits alone say nothing to root."""
    if not str(path).strip():
        raise ValueError(f"{flag}: the path is empty")
    p = Path(path).absolute()
    if p.is_dir():
        raise ValueError(f"{flag}: {str(path)!r} is a directory")
    d = p.parent
    while not d.exists():
        d = d.parent
    if not d.is_dir():
        raise ValueError(f"{flag}: {str(path)!r} cannot be created: {str(d)!r} is not a directory")
    existed = p.exists()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise ValueError(f"{flag}: {str(path)!r} cannot be written: {e.strerror or e}") from None
    return p


def write_json(result: dict, path) -> Path:
    """Write ``result`` as JSON (NaN / inf become null) to ``path``, creating missing parent directories."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(result), indent=2, allow_nan=False) + "\n")
    return p


# ---- plot ---------------------------------------------------------------------------------------------

class PlotUnavailable(RuntimeError):
    pass


def require_matplotlib():
    """Import matplotlib with the Agg backend, or raise PlotUnavailable saying how to get it."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed: pip install 'tsct[plot]' "
                              "(or pip install matplotlib)") from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path, flag: str = "--plot") -> Path:
    """Before a run, what writing the plot to ``path`` needs: matplotlib (PlotUnavailable), a file type it writes
    (the suffix; none: PNG) and a writable path (ValueError naming ``flag`` for either)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(str(path)).suffix.lower().lstrip(".")
    types = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in types:
        raise ValueError(f"{flag}: {str(path)!r}: matplotlib cannot write .{suffix} files; use one of "
                         f"{', '.join('.' + t for t in sorted(types))} (or no suffix for PNG)")
    return check_writable(path, flag)


def timed_stat(a: dict, kind: str) -> tuple[Optional[dict], bool]:
    """The statistics a figure shows for one arm and pass (``kind``: "fwd" or "fwdbwd"): the CUDA-graph replay's
    (device time) where timed, else the eager calls'; and whether it is the graph's."""
    g = a.get(f"{kind}_graph_ms")
    if g:
        return g, True
    return a.get(f"{kind}_ms"), False


def plot(result: dict, path) -> Path:
    """Grouped bar chart, one group per arm that ran: forward and forward+backward median ms, p10-p90 as
    error bars, the median written on each bar, the bf16 bytes-floor time as a dashed line. A bar is the CUDA-graph
    replay's time (the kernels' device time) where it was timed, with the eager median as a black tick on it (the host's
    share shows as the gap); an arm timed eager only (the STE arms) gets a hatched bar of its eager time. Log scale
    when the medians and the floor span more than 30x."""
    plt = require_matplotlib()
    ran = [a for a in result["arms"] if a["status"] == "ran" and a.get("fwd_ms")]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(ran) + 2), 4.5))
    xs = list(range(len(ran)))
    w = 0.38
    series = (("fwd", "forward", -w / 2, "C0"), ("fwdbwd", "forward+backward", w / 2, "C1"))
    allv = []
    eager_labelled = False
    for kind, label, dx, color in series:
        pts = [(i + dx, a) for i, a in zip(xs, ran) if a.get(f"{kind}_ms")]
        if not pts:
            continue
        stats = [timed_stat(a, kind) for _, a in pts]
        med = [st["median"] for st, _ in stats]
        allv += med
        err = [[st["median"] - st["p10"] for st, _ in stats], [st["p90"] - st["median"] for st, _ in stats]]
        bars = ax.bar([x for x, _ in pts], med, width=w, label=label, yerr=err, capsize=3, color=color)
        ticks = []  # (x, eager median) of the graph bars
        for bar, (x, a), (st, graph), m in zip(bars, pts, stats, med):
            top = st["p90"]
            if graph:
                ticks.append((x, a[f"{kind}_ms"]["median"]))
                top = max(top, ticks[-1][1])
            else:
                bar.set_hatch("//")
            ax.annotate(f"{m:.3g}", (x, top), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
        if ticks:
            ax.scatter([p for p, _ in ticks], [m for _, m in ticks], marker="_", s=260, color="k", zorder=3,
                       label=None if eager_labelled else "eager median (host included)")
            eager_labelled = True
            allv += [m for _, m in ticks]
    ax.axhline(result["floor_ms"], linestyle="--", color="k", linewidth=1,
               label=f"bf16 bytes floor {result['floor_ms']:.3g} ms")
    allv.append(result["floor_ms"])
    if max(allv) / max(min(allv), 1e-9) > 30:
        ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([a["name"] for a in ran], rotation=30, ha="right")
    ax.set_ylabel("ms (median, whole expert pass)\nbars: CUDA graph; hatched: eager only")
    cfg = result["config"]
    ax.set_title(f"{cfg['preset']}: T={cfg['tokens']} k={cfg['topk']} E={cfg['experts']} d={cfg['d']} r={cfg['r']} "
                 f"f={cfg['f']} {cfg['dtype']}, {result['device'].get('name')}" + _proxy_label(result), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p
