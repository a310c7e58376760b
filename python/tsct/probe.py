"""tsct-probe: what this install holds, what this machine is, and which path each op takes here.

Usage: ``tsct-probe [--json] [--no-selftest] [--verify-artifacts]`` (also ``python -m tsct.probe``).
Exit status 1 when a self-test fails, or when ``--verify-artifacts`` finds a mismatch or cannot run.

Sections: versions; GPUs (name, compute capability, SMs, memory); built artifacts (from the
manifest written at build time, and the Triton AOT cubins per arch and kernel from their index.json
files, with the arch each GPU would load; ``--verify-artifacts`` checks both against the binaries
with cuobjdump); for every op and storage format, the path ``impl="auto"`` takes and why; self-tests of
each runnable path against a float64 computation. With no GPU it says so and covers the CPU paths.
The text is meant to be pasted into bug reports.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Optional

import torch

import tsct
from tsct import config, dispatch, firstuse, selftest

OPS = ("grouped_glu",)  # ops with a dispatch table (sort_by_expert has a self-test row, no table)


def _pkg_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> dict[str, Any]:
    """Driver release (nvidia-smi) and the CUDA version the driver supports (cuDriverGetVersion)."""
    info: dict[str, Any] = {"release": None, "cuda_driver_api": None}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            info["cuda_driver_api"] = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20)
            info["release"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info


def _build_commit() -> Optional[str]:
    """The commit the installed package was built from ("+dirty": with uncommitted changes; "unknown" when the build
    had no git), None for a source tree used without installing."""
    commit = getattr(tsct, "__git_commit__", None)
    if commit is None:
        return None
    return commit + ("+dirty" if getattr(tsct, "_build_dirty", None) else "")


def collect(selftests: bool = True, verify_artifacts: bool = False) -> dict[str, Any]:
    from tsct import native

    report: dict[str, Any] = {
        "versions": {
            "tsct": tsct.__version__,
            "tsct_commit": _build_commit(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "triton": _pkg_version("triton"),
            "nvidia-cutlass-dsl": _pkg_version("nvidia-cutlass-dsl"),
            "driver": _driver(),
        },
        "platform": platform.platform(),
    }
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            pr = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": pr.name, "capability": f"{pr.major}.{pr.minor}",
                         "arch_class": dispatch.arch_class((pr.major, pr.minor)), "sms": pr.multi_processor_count,
                         "memory_GiB": round(pr.total_memory / 2 ** 30, 1)})
    report["gpus"] = gpus
    report["cuda_available"] = bool(gpus)

    man = native.manifest()
    art: dict[str, Any] = {"library": native.library_path(), "loadable": native.available(),
                           "load_error": native.load_error(), "manifest": man}
    if man and gpus:
        art["kernels_loadable_on_gpu0"] = {k: native.kernel_available(k) for k in _manifest_kernels(man)}
    art["triton_aot"] = _triton_aot(man, gpus)
    art["native_glu"], art["native_glu_error"] = _native_glu(art["loadable"])
    art["cuda_kernels_setting"] = config.cuda_kernels
    if verify_artifacts:
        art["verify"] = _verify_artifacts()
    report["artifacts"] = art

    caps = [None] + sorted({(int(g["capability"].split(".")[0]), int(g["capability"].split(".")[1])) for g in gpus})
    decisions = []
    for op in OPS:
        for cap in caps:
            for fmt in dispatch.FORMATS:
                for act in dispatch.ACTIVATIONS:
                    dec = dispatch.decide(cap, fmt, act)
                    decisions.append({"op": op, "device": "cpu" if cap is None else f"cuda (cc {cap[0]}.{cap[1]})",
                                      "format": fmt, "activations": act, "path": dec.path, "reason": dec.reason,
                                      "skipped": [{"path": p, "why": w} for p, w in dec.skipped]})
    report["dispatch"] = decisions
    # every path (auto's or explicit-only), per device and storage format: can it run here, and why not
    report["paths"] = [{"device": "cpu" if cap is None else f"cuda (cc {cap[0]}.{cap[1]})", "path": path,
                        "format": fmt, **dataclasses.asdict(dispatch.status(path, cap, fmt))}
                       for cap in caps for path in dispatch.PATHS for fmt in dispatch.FORMATS]
    # sm120-fp4's self-test runs in a child process (a faulting kernel must not take the probe down)
    report["sm120_fp4"] = _sm120_fp4(caps, gpus, run=selftests)
    from tsct.kernels import sm120_proxy  # per sm_120 kernel: run on the sm_90 proxy, or why not (decision 0017)
    report["sm120_proxy"] = sm120_proxy.rows()

    tests = []
    if selftests:
        devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if gpus else [])
        for dev in devices:
            cap = dispatch.device_capability(dev)
            dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
            for fmt in dispatch.FORMATS:
                paths = dict.fromkeys(dispatch.preferences(cap, fmt) + dispatch.preferences(cap, fmt, "nvfp4"))
                for path in paths:
                    if path == dispatch.SM120_FP4:
                        # a self-test row only where a test ran (now or cached), not where the env forced it
                        tests += [_sm120_selftest_row(v) for v in report["sm120_fp4"]["verdicts"]
                                  if v["gpu"] == (dev.index or 0) and v["format"] == fmt
                                  and v["verdict"] not in (None, "forced")]
                    elif not dispatch.status(path, cap, fmt).ok:
                        continue
                    elif dev.type == "cuda" and dispatch.arch_class(cap) not in dispatch.EXECUTED_ON[path]:
                        # never executed on this GPU: the self-test runs in a child process, as on first use
                        tests.append(_child_row(dev, path, fmt, f"grouped_glu[{path}, {fmt} factors]"))
                    else:
                        r = selftest.grouped_glu(path, dev, dtype, fmt, backward=True)
                        tests.append({"device": str(dev), **r.__dict__})
            tests.append(_sort_by_expert_selftest(dev, cap))
            if dev.type == "cuda" and native.available():
                if dispatch.needs_first_use(dispatch.NATIVE_QUANT, cap):  # never ran here: a child, as on first use
                    tests.append(_child_row(dev, dispatch.NATIVE_QUANT, firstuse.FAMILY_FMT,
                                            "native quantize / decode vs torch"))
                else:
                    tests += [{"device": str(dev), **r.__dict__} for r in selftest.native_quant(dev)]
    report["selftests"] = tests
    report["fallbacks"] = dispatch.fallback_records()
    return report


def _sort_by_expert_selftest(dev: torch.device, cap: Optional[tuple[int, int]]) -> dict[str, Any]:
    """The self-test row of ``sort_by_expert`` on ``dev``: on a GPU its Triton kernels can launch on but never executed
    on (``dispatch.EXECUTED_ON[dispatch.ROUTING]``), the verdict of their self-test in a child process, as on first
    use (run now, or cached); elsewhere ``selftest.sort_by_expert`` in this process (the kernels, or torch's sort)."""
    from tsct.ops import routing

    if dev.type == "cuda" and dispatch.needs_first_use(dispatch.ROUTING, cap) and routing.kernels_status(cap)[0]:
        return _child_row(dev, dispatch.ROUTING, firstuse.FAMILY_FMT,
                          "sort_by_expert's Triton kernels vs stable argsort")
    return {"device": str(dev), **selftest.sort_by_expert(dev).__dict__}


def _child_row(dev: torch.device, path: str, fmt: str, name: str) -> dict[str, Any]:
    """The self-test row of ``path`` with ``fmt`` factors on ``dev``, a GPU it never executed on: the verdict of its
    self-test in a child process, as on first use (``firstuse.verdict``: run now, or cached)."""
    v = firstuse.verdict(dev.index or 0, path, fmt)
    return {"device": str(dev), "name": f"{name} (child process)", "ok": v.ok, "detail": v.describe(),
            "seconds": v.seconds}


def _native_glu(loadable: bool) -> tuple[dict[str, Any], Optional[str]]:
    """Which CUDA C++ stand-ins for Triton kernels the dispatch takes, per artifact arch, plus "other" (arches without
    cubins: none): ``tsct.dispatch.cuda_kernels_by_arch``; none anywhere when the library does not load. Second: the
    error of a bad ``TSCT_CUDA_KERNELS`` (every Triton call that consults it raises it), else None."""
    from tsct.kernels.triton_common import specs

    archs = [*specs.CONFIGS, "other"]
    try:
        table = dispatch.cuda_kernels_by_arch(archs)
    except ValueError as exc:  # the probe reports a bad setting, it does not crash
        return {arch: [] for arch in archs}, str(exc)
    return (table if loadable else {arch: [] for arch in table}), None


def _sm120_fp4(caps, gpus: Optional[list] = None, run: bool = False) -> dict[str, Any]:
    """The sm_120 fp4 path: can it run on each device here (and why not), its first-use verdict per GPU
    and format where it can, and per kernel how it is verified (design.md section 6;
    tsct.kernels.sm120_fp4.VERIFICATION).

    ``run``: a GPU without a verdict gets its self-test now, in a child process
    (``tsct.firstuse.verdict``); otherwise only known verdicts are shown (this
    process's, the disk cache's, or the one ``TSCT_SM120_FP4`` sets)."""
    from tsct.kernels import sm120_fp4
    from tsct import firstuse

    linked, why = sm120_fp4.kernels_linked()
    linked121, why121 = sm120_fp4.kernels_linked("sm_121a")
    rows = []
    for cap in caps:
        st = dispatch.status(dispatch.SM120_FP4, cap, "nvfp4")
        rows.append({"device": "cpu" if cap is None else f"cuda (cc {cap[0]}.{cap[1]})", "runnable": st.ok,
                     "reason": st.reason})
    verdicts = []
    for g in gpus or []:
        cap = tuple(int(v) for v in g["capability"].split("."))
        for fmt in sm120_fp4.FORMATS:
            if not dispatch.status(dispatch.SM120_FP4, cap, fmt).ok:
                continue
            try:
                v = firstuse.verdict(g["index"], "sm120-fp4", fmt) if run else firstuse.peek(g["index"], "sm120-fp4", fmt)
            except Exception as exc:  # the probe reports, it does not crash
                v = firstuse.Verdict(False, "fail", f"{type(exc).__name__}: {exc}", "probe")
            verdicts.append({"gpu": g["index"], "capability": g["capability"], "format": fmt,
                             "verdict": None if v is None else v.outcome, "ok": None if v is None else v.ok,
                             "source": "runs in a child process on first use" if v is None else v.source,
                             "detail": "" if v is None else v.detail, "seconds": 0.0 if v is None else v.seconds})
    return {"linked": linked, "linked_detail": why, "linked_sm121a": linked121, "linked_sm121a_detail": why121,
            "env": firstuse.env_mode()[1], "cache_file": str(firstuse.cache_file()), "status": rows,
            "verdicts": verdicts,
            "kernels": [_sm120_kernel_row(k, linked, linked121, why) for k in sm120_fp4.VERIFICATION]}


def _sm120_kernel_row(k: dict, linked: bool, linked121: bool, why: str) -> dict[str, Any]:
    """One row of the sm_120 verification table for THIS install: the CI facts (``VERIFICATION``) plus whether the
    library holds the kernel's cubins ("in_this_library": the OMMA check runs when a library is built with them,
    so it is only claimed then) and whether a first-use self-test can gate it here."""
    row = dict(k)
    if linked:
        row["in_this_library"] = (("yes: sm_120a + sm_121a cubins" if linked121 else "yes: sm_120a cubin")
                                  + ", OMMA checked at build")
    else:
        row["in_this_library"] = f"no: {why}"
    if k["first_use_selftest"] == "yes" and not linked:
        row["first_use_selftest"] = "yes where linked; not here"
    return row


def _sm120_selftest_row(v: dict) -> dict[str, Any]:
    """A self-test table row from an sm120-fp4 first-use verdict (``_sm120_fp4``'s "verdicts")."""
    return {"device": f"cuda:{v['gpu']}", "name": f"grouped_glu[sm120-fp4, {v['format']}] vs emulation, child process",
            "ok": bool(v["ok"]), "detail": f"{v['verdict']} ({v['source']}): {v['detail']}", "seconds": v["seconds"]}


def _manifest_kernels(man: dict) -> list[str]:
    ks = man.get("kernels", [])
    if isinstance(ks, dict):  # {arch: [names]}
        names = sorted({k for v in ks.values() for k in v})
    else:
        names = list(ks)
    return names


def _triton_aot(man: Optional[dict], gpus: list[dict]) -> dict[str, Any]:
    """The Triton AOT cubins this install ships (docs/decisions/0005), from the index.json files (the
    manifest's triton_aot section where an index is missing), and the arch each GPU would load.
    Reads JSON files only: nothing is loaded, no GPU is touched."""
    from tsct.kernels import aot, launch
    from tsct.kernels.triton_common import specs as CS

    sec = (man or {}).get("triton_aot") or {}
    sec_archs = sec.get("archs") if isinstance(sec.get("archs"), dict) else {}
    caps: dict[str, list[str]] = {}
    for (major, minor), arch in sorted(CS.ARTIFACT_ARCH.items()):
        caps.setdefault(arch, []).append(f"{major}.{minor}")
    for name, p in CS.PROXIES.items():  # a proxy build (decision 0017) serves its capability in place of a release
        caps[name] = [f"{p.capability[0]}.{p.capability[1]}"]
    order = {a: CS.TARGET_CAPABILITY.get(CS.table_arch(a), 10 ** 6) for a in set(caps) | set(sec_archs)}
    archs: dict[str, Any] = {}
    version = sec.get("triton_version")
    for arch in sorted(order, key=lambda a: (order[a], a)):
        idx = aot.index(arch)
        if idx and isinstance(idx.get("kernels"), dict):
            counts: dict[str, int] = {}
            for e in idx["kernels"].values():
                counts[e.get("kernel", "?")] = counts.get(e.get("kernel", "?"), 0) + 1
            source = "index"
            version = version or idx.get("triton_version")
        elif arch in sec_archs:
            counts, source = dict(sec_archs[arch].get("kernels") or {}), "manifest (no index.json)"
        else:
            continue
        archs[arch] = {"variants": sum(counts.values()), "kernels": dict(sorted(counts.items())),
                       "capabilities": caps.get(arch, []), "source": source,
                       "manifest_variants": (sec_archs.get(arch) or {}).get("variants"),
                       "proxy": aot.proxy(arch) or (sec_archs.get(arch) or {}).get("proxy")}
    loads = []
    for g in gpus:
        cap = tuple(int(v) for v in g["capability"].split("."))
        arch = aot.artifact_arch(cap)
        shipped = bool(arch and archs.get(arch, {}).get("source") == "index")
        loads.append({"gpu": g["index"], "capability": g["capability"], "arch": arch, "shipped": shipped,
                      "variants": archs[arch]["variants"] if shipped else 0,
                      "proxy": archs[arch]["proxy"] if shipped else None})
    proxy = {a: x["proxy"] for a, x in archs.items() if x["proxy"]}
    try:  # a value the launches would refuse: said here, not first on a GPU
        launch.backend_mode()
        backend_error = None
    except ValueError as e:
        backend_error = str(e)
    return {"dir": str(aot.aot_dir()), "triton_version": version, "in_manifest": bool(sec), "archs": archs,
            "backend": config.triton_backend(), "backend_error": backend_error, "gpus": loads,
            "proxy": proxy}


def _verify_artifacts() -> dict[str, Any]:
    """tsct.native.artifacts.verify() on the library and the Triton cubins this process would load: the
    manifest against what cuobjdump finds in the binaries. Never raises: ok False and a detail saying why instead."""
    try:
        from tsct import native
        from tsct.native import artifacts
    except ImportError as exc:
        return {"ok": False, "status": "error", "problems": [], "detail": f"artifact verification unavailable: {exc}"}
    try:
        from tsct.kernels import aot

        return artifacts.verify(lib=native.library_path(), aot_dir=aot.aot_dir())
    except Exception as exc:  # a bug in the checker must not take the probe down
        return {"ok": False, "status": "error", "problems": [], "detail": f"{type(exc).__name__}: {exc}"}


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 160)  # pipes/bug reports: don't truncate at 80
    v = report["versions"]
    drv = v["driver"]
    c = v.get("tsct_commit")
    built = "source tree" if not c else "commit " + c.split("+")[0][:12] + ("+dirty" if c.endswith("+dirty") else "")
    con.print(f"[bold]tsct {v['tsct']}[/] ({built})  python {v['python']}  torch {v['torch']} (CUDA {v['torch_cuda']})  "
              f"triton {v['triton'] or '-'}  cutlass-dsl {v['nvidia-cutlass-dsl'] or '-'}  "
              f"driver {drv['release'] or '-'} (CUDA {drv['cuda_driver_api'] or '-'})")
    for arch, p in (report["artifacts"]["triton_aot"].get("proxy") or {}).items():
        con.print(f"[bold red]PROXY BUILD, NOT A RELEASE[/]: the Triton cubins are {escape(arch)}: "
                  f"{escape(str(p.get('note') or p))}")
    if report["gpus"]:
        t = Table(title="GPUs")
        for c in ("index", "name", "capability", "arch_class", "sms", "memory_GiB"):
            t.add_column(c)
        for g in report["gpus"]:
            t.add_row(*(str(g[c]) for c in ("index", "name", "capability", "arch_class", "sms", "memory_GiB")))
        con.print(t)
    else:
        con.print("[yellow]No CUDA GPU visible[/]: only the CPU paths can run here.")

    a = report["artifacts"]
    man = a["manifest"]
    if man:
        con.print(f"native library: {a['library']} (loadable: {a['loadable']}"
                  + (f"; {a['load_error']}" if a["load_error"] else "") + ")")
        con.print(f"  built {man.get('built_at', '?')} with nvcc {man.get('nvcc_version', '?')}; targets: "
                  + ", ".join(man.get("gencodes", man.get("archs", []))))
        con.print("  kernels: " + ", ".join(_manifest_kernels(man)))
        if "kernels_loadable_on_gpu0" in a:
            bad = [k for k, ok in a["kernels_loadable_on_gpu0"].items() if not ok]
            con.print("  on GPU 0: " + ("every kernel has a loadable image" if not bad else f"NO image for {bad}"))
    else:
        con.print(f"[yellow]native library not installed[/] ({a['load_error'] or 'no manifest'}): "
                  "quantize/decode use torch")
    _render_triton_aot(con, a["triton_aot"])
    if a.get("native_glu_error"):
        con.print(f"[red]bad TSCT_CUDA_KERNELS[/]: {escape(a['native_glu_error'])}")
    elif man and a.get("native_glu"):
        setting = a.get("cuda_kernels_setting", "auto")
        con.print("CUDA C++ kernels the dispatch takes instead of Triton ones (tsct.dispatch.CUDA_KERNELS; only where "
                  "they have run" + ("" if setting.strip().lower() in ("", "auto") else
                                     f"; TSCT_CUDA_KERNELS={escape(repr(setting))}") + "):")
        for arch, ks in a["native_glu"].items():
            con.print(f"  {arch}: {'; '.join(ks) or 'none'}")
        for arch, p in (a["triton_aot"].get("proxy") or {}).items():
            cc = ".".join(map(str, p.get("capability") or ()))
            con.print(f"  [bold red]proxy[/]: on cc {cc} this install runs {arch} with {p.get('of')}'s config "
                      f"({p.get('of')}: {'; '.join(a['native_glu'].get(p.get('of'), [])) or 'none'})")
    if "verify" in a:
        vr = a["verify"]
        st = vr.get("status") or ("match" if vr.get("ok") else "error")
        head = {"match": "[green]ok[/]", "mismatch": "[red]MISMATCH[/]"}.get(st, "[yellow]not run[/]")
        con.print(f"  artifact check: {head} ({escape(str(vr.get('detail', '')))})"
                  + "".join(f"\n    - {escape(str(p))}" for p in vr.get("problems") or []))

    t = Table(title="dispatch (impl='auto')")
    for c in ("op", "device", "format", "activations", "path", "why"):
        t.add_column(c)
    for d in report["dispatch"]:
        why = d["reason"] + "".join(f"\n  {s['path']}: {s['why']}" for s in d["skipped"])
        t.add_row(d["op"], d["device"], d["format"], d.get("activations", "bf16"), d["path"], why)
    con.print(t)

    t = Table(title="every path (impl='<path>' forces one; 'reference' is never taken by 'auto')")
    for c in ("device", "path", *dispatch.FORMATS):
        t.add_column(c)
    rows: dict = {}
    for r in report["paths"]:
        rows.setdefault((r["device"], r["path"]), {})[r["format"]] = "[green]yes[/]" if r["ok"] else escape(r["reason"])
    for (dev, path), cells in rows.items():
        t.add_row(dev, path, *(cells.get(f, "") for f in dispatch.FORMATS))
    con.print(t)

    sm = report.get("sm120_fp4")
    if sm:
        con.print(f"sm120-fp4 (NVFP4 block-scaled mma.sync, CuTeDSL): {escape(sm['linked_detail'])}")
        con.print(f"  sm_121a exports (cc 12.1): {escape(sm['linked_sm121a_detail'])}")
        for row in sm["status"]:
            con.print(f"  {row['device']}: " + ("[green]runnable[/]" if row["runnable"] else "[yellow]not runnable[/]")
                      + f": {escape(row['reason'])}")
        con.print(f"  first-use self-test: {escape(sm['env'])}; verdicts cached in {escape(sm['cache_file'])}")
        for v in sm["verdicts"]:
            if v["verdict"] is None:
                word = "[yellow]not run yet[/]"
            elif v["verdict"] == "forced":
                word = "[yellow]forced on, not tested[/]"
            else:
                word = "[green]pass[/]" if v["ok"] else f"[red]{v['verdict'].upper()}[/]"
            con.print(f"  GPU {v['gpu']} (cc {v['capability']}) {v['format']}: {word} ({escape(v['source'])})"
                      + (f": {escape(v['detail'])}" if v["detail"] else ""))
        t = Table(title="sm_120 kernels: how each is verified (design.md section 6; docs/sm120.md)")
        for c in ("kernel", "role", "in this library", "host prep", "emulated", "proxy sm_90",
                  "ran on sm_120", "first-use self-test"):
            t.add_column(c, no_wrap=c == "kernel")
        seen: dict[str, int] = {}  # a long cell said once, then "as row N" (the CuTeDSL kernels share theirs)
        for i, k in enumerate(sm["kernels"], 1):
            here = k["in_this_library"] if sm["linked"] else "no (why: above)"
            cells = []
            for c in (k["emulated"], k["proxy_on_sm90"], k["ran_on_sm120"], k["first_use_selftest"]):
                if len(c) > 40 and c in seen:
                    c = f"as row {seen[c]}"
                else:
                    seen.setdefault(c, i)
                cells.append(escape(c))
            t.add_row(k["kernel"], k["role"], escape(here), k["host_prep"], *cells)
        con.print(t)

    if report.get("sm120_proxy"):
        t = Table(title="sm_120 kernels on the sm_90 proxy (sm_120's cubins' source, tiles and TTGIR assembled "
                        "for sm_90; decision 0017; docs/sm120.md; the CuTeDSL rows as above)")
        for c in ("kernel", "family", "logic run on the sm_90 proxy?"):
            t.add_column(c, no_wrap=c == "kernel")
        from tsct.kernels import sm120_proxy

        logs = [run["evidence"] for run in sm120_proxy.RUNS]
        named: set = set()  # a run's log is named in the first row that cites it, then left out
        for r in report["sm120_proxy"]:
            if r["family"] != "cutedsl":
                text = r["proxy_on_sm90"]
                for log in logs:
                    if log in text and log in named:
                        text = text.replace(f"; {log}", "")
                    elif log in text:
                        named.add(log)
                t.add_row(r["kernel"], r["family"], escape(text))
        con.print(t)

    if report["selftests"]:
        t = Table(title="self-tests against float64 / the torch reference")
        for c in ("device", "test", "result", "detail", "s"):
            t.add_column(c, no_wrap=c == "test")
        for s in report["selftests"]:
            t.add_row(s["device"], escape(s["name"]), "[green]pass[/]" if s["ok"] else "[red]FAIL[/]", escape(s["detail"]),
                      f"{s['seconds']:.2f}")
        con.print(t)


def _render_triton_aot(con, ta: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    if ta.get("backend_error"):
        con.print(f"[red]bad TSCT_TRITON_BACKEND[/]: {escape(ta['backend_error'])}; the Triton "
                  "paths raise this on a GPU")
    archs = ta["archs"]
    if not archs:
        con.print(f"Triton AOT cubins: [yellow]none shipped[/] ({escape(ta['dir'])}): on a GPU the Triton paths "
                  "would need Triton installed (JIT)")
        return
    total = sum(x["variants"] for x in archs.values())
    con.print(f"Triton AOT cubins (Triton {ta['triton_version'] or '?'}): {total} in {len(archs)} archs, "
              f"{escape(ta['dir'])}; TSCT_TRITON_BACKEND={escape(ta['backend'])}")
    t = Table(title="Triton AOT cubins per kernel")
    t.add_column("kernel")
    for arch, x in archs.items():
        note = "" if x["source"] == "index" else f"\n{x['source']}"
        t.add_column(f"{arch}\n(cc {', '.join(x['capabilities']) or '-'}){note}", justify="right")
    for k in sorted({k for x in archs.values() for k in x["kernels"]}):
        t.add_row(k, *(str(x["kernels"].get(k, 0)) for x in archs.values()))
    t.add_row("total", *(str(x["variants"]) for x in archs.values()))
    con.print(t)
    if not ta["gpus"]:
        con.print("  no GPU: no cubin is loaded (a GPU of "
                  + "; ".join(f"cc {', '.join(x['capabilities'])} would load {a}" for a, x in archs.items()
                              if x["capabilities"]) + ")")
    for g in ta["gpus"]:
        if g["shipped"]:
            how = f"would load {g['arch']} ({g['variants']} cubins)"
            if g.get("proxy"):
                how += (f" [bold red]PROXY[/]: {g['proxy'].get('of')}'s kernels and tiles assembled for "
                        f"{g['proxy'].get('ptx')}, in place of this GPU's release cubins")
            if ta["backend"] == "jit":
                how += ", but TSCT_TRITON_BACKEND=jit uses Triton JIT instead"
        elif g["arch"]:
            how = (f"[yellow]would load {g['arch']}, which this install does not ship[/]: Triton JIT if installed, "
                   "else bmm")
        else:
            shipped = ", ".join(c for x in archs.values() for c in x["capabilities"])
            how = (f"[yellow]has no AOT cubins[/] (this install's cubins serve {shipped}): Triton JIT if installed, "
                   "else bmm")
        con.print(f"  GPU {g['gpu']} (cc {g['capability']}) {how}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="tsct-probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--no-selftest", action="store_true", help="skip the self-tests")
    ap.add_argument("--verify-artifacts", action="store_true",
                    help="check the manifest against the binary with cuobjdump (needs cuobjdump)")
    args = ap.parse_args(argv)
    report = collect(selftests=not args.no_selftest, verify_artifacts=args.verify_artifacts)
    if args.json:
        try:
            json.dump(report, sys.stdout, indent=2, default=str)
            print(flush=True)
        except BrokenPipeError:  # a reader that stopped early (`| head`): as the text report, no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush goes nowhere
            return 1
    else:
        render(report)
    failed = [s for s in report["selftests"] if not s["ok"]]
    verify = report["artifacts"].get("verify")
    # exit status: 1 if a self-test or the asked-for artifact check failed or could not run
    return 1 if failed or (verify is not None and not verify.get("ok")) else 0


if __name__ == "__main__":
    sys.exit(main())
