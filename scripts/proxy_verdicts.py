"""The sm_120 proxy stage's per-kernel verdicts, from its launch ledger (``scripts/gpu_suite.sh proxy``).

    python3 scripts/proxy_verdicts.py LEDGER.json [--bench proxy_b1.json] [--out FILE]
    PYTHONPATH=python python3 scripts/proxy_verdicts.py --update-docs     (after a record joined RUNS)

LEDGER.json is what tests/_launch_ledger.py wrote during the stage's pytest runs. Prints (and writes to
--out): the sessions' outcomes; per kernel of sm_120's Triton families the launches through the proxy cubins
("aot"), the distinct variants launched against the sm_120 table's count, launches that did not use a proxy
cubin ("jit", "native": not evidence for sm_120), the failing tests that launched it, and the fingerprint of the
source the proxy cubins were built from (the installed proxy index's "sources", ``tsct.kernels.source_key``: a
later verdict counts the run only for a kernel whose source still has it); the b1 times of
tsct-bench labelled PROXY with their share of this GPU's bytes floor; and the record to append to
``tsct.kernels.sm120_proxy.RUNS`` (docs/decisions/0017), whose ``verdict()`` the probe and docs/sm120.md show.
Exit status 1 when the ledger is not from a proxy install, a test failed or a launched kernel has no source
fingerprint.
``--update-docs`` rewrites the verdict table of docs/sm120.md (between its sm120-proxy-table markers) from
``sm120_proxy.rows()``; tests/kernels/test_sm120_proxy.py keeps the two equal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pprint
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "sm120.md"
MARK, END = "<!-- sm120-proxy-table -->", "<!-- /sm120-proxy-table -->"


def installed_sources(arch: str | None) -> dict[str, str]:
    """{kernel: source fingerprint} the installed index of ``arch`` (the proxy the stage ran) recorded at build time."""
    from tsct.kernels import aot

    idx = aot.index(arch) if arch else None
    return dict((idx or {}).get("sources") or {})


def record(ledger: dict, evidence: str, sources: dict[str, str]) -> dict:
    """The ``sm120_proxy.RUNS`` entry of one stage's ledger; ``sources``: {kernel: source fingerprint} of the cubins
    it launched (``installed_sources``), None for a kernel without one."""
    outcomes: dict[str, int] = {}
    for s in ledger["sessions"]:
        for k, n in s["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + n
    from tsct.bench.measure import gpu_tag

    commit = (ledger.get("commit") or "unknown")[:7]
    return {
        "date": datetime.date.today().isoformat(), "commit": commit, "device": ledger.get("device"),
        "evidence": evidence.format(date=datetime.date.today().isoformat(), commit=commit,
                                    gpu=gpu_tag(ledger.get("device"))),
        "suite": ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())),
        "kernels": {k: {"aot": v["aot"], "variants": len(v["variants"]), "jit": v["jit"], "native": v["native"],
                        "failed_tests": v["failed_tests"], "source": sources.get(k)}
                    for k, v in sorted(ledger["kernels"].items())},
    }


def report(ledger: dict, bench: dict | None, rec: dict) -> tuple[str, bool]:
    from tsct.kernels import sm120_proxy

    lines, ok = [], True
    p = ledger.get("proxy")
    if not p:
        lines.append(f"NOT A PROXY RUN: the Triton cubins were {ledger.get('aot_arch')!r}, not a proxy build")
        ok = False
    lines.append(f"device {ledger.get('device')} cc {ledger.get('capability')}, cubins {ledger.get('aot_arch')} "
                 f"({p and p.get('note')}), tsct {ledger.get('tsct')} {ledger.get('commit')}")
    for s in ledger["sessions"]:
        lines.append(f"session {s['env']} exit {s['exitstatus']}: {s['outcomes']}")
        ok &= s["exitstatus"] == 0
    unkeyed = sorted(k for k, v in rec["kernels"].items() if v["aot"] and not v.get("source"))
    if unkeyed:
        lines.append(f"NO SOURCE FINGERPRINT in the installed {ledger.get('aot_arch')} index for {', '.join(unkeyed)}: "
                     "the record cannot say which source ran (a wheel built before the index recorded them?)")
        ok = False
    lines.append("")
    lines.append(f"{'kernel':<18} {'family':<7} {'aot launches':>12} {'variants':>12} {'jit':>6} {'native':>6}  "
                 f"{'source':<16}  failed tests")
    for fam in sm120_proxy.PROXY_FAMILIES:
        for k, n in sm120_proxy.table_variants(fam).items():
            v = rec["kernels"].get(k, {"aot": 0, "variants": 0, "jit": 0, "native": 0, "failed_tests": []})
            lines.append(f"{k:<18} {fam:<7} {v['aot']:>12} {v['variants']:>5} of {n:<4} {v['jit']:>6} "
                         f"{v['native']:>6}  {v.get('source') or '-':<16}  " + (", ".join(v["failed_tests"]) or "-"))
    if bench:
        floor = bench.get("floor_ms")
        label = "PROXY" if (bench.get("triton_aot") or {}).get("proxy") else "NOT A PROXY RUN"
        lines.append("")
        lines.append(f"b1 on the {rec['device']} through the proxy cubins ({label}: sm_120's kernels on sm_90, not "
                     f"an sm_120 card); bytes floor {floor:.3f} ms at {bench.get('copy_bandwidth_GBps', 0):.0f} GB/s")
        for a in bench.get("arms", []):
            if a.get("status") != "ran":
                lines.append(f"  {a['name']}: {a.get('status')} ({a.get('reason')})")
                continue
            f, fb = a.get("fwd_graph_ms") or a.get("fwd_ms") or {}, a.get("fwdbwd_graph_ms") or a.get("fwdbwd_ms") or {}
            pct = a.get("pct_of_floor")
            lines.append(f"  {a['name']}: forward {f.get('median', float('nan')):.3f} ms, forward+backward "
                         f"{fb.get('median', float('nan')):.3f} ms ({a.get('rates_from')}); bytes floor / forward = "
                         f"{(pct or 0) / 100:.3f}; max rel err {a.get('max_rel_err')}")
    lines.append("")
    lines.append("record for tsct.kernels.sm120_proxy.RUNS:")
    lines.append(pprint.pformat(rec, width=116, sort_dicts=False))
    lines.append("")
    lines.append("verdicts with it:")
    saved = sm120_proxy.RUNS
    sm120_proxy.RUNS = (*saved, rec)
    try:
        for r in sm120_proxy.rows():
            lines.append(f"  {r['kernel']:<40} {r['family']:<8} {r['proxy_on_sm90']}")
    finally:
        sm120_proxy.RUNS = saved
    ok &= all(not v["failed_tests"] and not v["native"] for v in rec["kernels"].values())
    return "\n".join(lines) + "\n", ok


def doc_table() -> str:
    """The markdown verdict table of docs/sm120.md, from ``sm120_proxy.rows()``."""
    from tsct.kernels import sm120_proxy

    lines = ["| kernel | family | logic run on the sm_90 proxy? |", "| --- | --- | --- |"]
    lines += [f"| `{r['kernel']}` | {r['family']} | {r['proxy_on_sm90']} |" for r in sm120_proxy.rows()]
    return "\n".join(lines)


def update_docs(path: Path = DOC) -> None:
    text = path.read_text()
    head, rest = text.split(MARK, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{MARK}\n{doc_table()}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ledger", nargs="?")
    ap.add_argument("--update-docs", action="store_true", help="rewrite docs/sm120.md's verdict table and exit")
    ap.add_argument("--bench", default=None, help="tsct-bench --json of the stage's b1 run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--evidence", default="bench/results/{date}_{gpu}_sm120_proxy_{commit}.log",
                    help="where the stage's log will be committed ({date}, {gpu}: tsct.bench.measure.gpu_tag, {commit} filled in)")
    args = ap.parse_args(argv)
    if args.update_docs:
        update_docs()
        return 0
    if not args.ledger:
        ap.error("a ledger (or --update-docs) is needed")
    ledger = json.load(open(args.ledger))
    bench = None
    if args.bench:
        try:
            bench = json.load(open(args.bench))
        except (OSError, ValueError) as e:
            print(f"no b1 result ({e})", file=sys.stderr)
    text, ok = report(ledger, bench, record(ledger, args.evidence, installed_sources(ledger.get("aot_arch"))))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
