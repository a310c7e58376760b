"""pytest plugin: a ledger of the Triton kernel launches each test makes, written as JSON.

    TSCT_LAUNCH_LEDGER=ledger.json PYTHONPATH=tests python3 -m pytest -p _launch_ledger tests/kernels/test_..._gpu.py

Inert unless ``TSCT_LAUNCH_LEDGER`` names a file. Per test: its outcome and the launches it made per backend
("aot": a shipped cubin, "jit": Triton JIT, "native": a CUDA C++ kernel in place of a Triton one; from
``launch.Family.backend_counts`` of the shared kernels and of the bf16 and low-bit families); per session, the AOT
variants (spec keys) launched, by wrapping ``tsct.kernels.aot.AotKernel.launch`` (loading a cubin without launching
it does not count).
At the end of the session the file gets this session's tests and the
totals per kernel: {"aot", "jit", "native", "variants": [keys launched], "failed_tests": [ids of failing tests that
launched its cubins]}; a file that already exists is merged into (counts add up, so several pytest runs of one stage, e.g.
with different ``TSCT_TRITON_GLU_CFG``, give one ledger). ``scripts/proxy_verdicts.py`` turns it into the per-kernel
verdicts of the sm_120 proxy stage (``scripts/gpu_suite.sh proxy``, docs/decisions/0017).
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest

ENV = "TSCT_LAUNCH_LEDGER"
_state: dict = {}


def _families():
    """The launchers whose counts make the ledger: the shared kernels' (``triton_common.runtime``, whichever family
    launched them), the bf16 family's and the low-bit family's."""
    from tsct.kernels.triton_common import runtime as C
    from tsct.kernels.triton_glu import glu as G
    from tsct.kernels.triton_lowbit import glu as L

    return (C.FAMILY, G.FAMILY, L.FAMILY)


def _counts() -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for fam in _families():
        for (backend, kernel), n in fam.backend_counts().items():
            c[f"{backend}:{kernel}"] += n
    return c


def pytest_configure(config):
    path = os.environ.get(ENV)
    if not path:
        return
    from tsct.kernels import aot

    keys: collections.Counter = collections.Counter()
    orig = aot.AotKernel.launch

    def launch(self, grid, values, stream):
        keys[self.entry["key"]] += 1
        return orig(self, grid, values, stream)

    aot.AotKernel.launch = launch
    _state.update(path=Path(path), keys=keys, tests={}, outcome={})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _state:
        yield
        return
    before = _counts()
    yield
    after = _counts()
    _state["tests"][item.nodeid] = {
        "outcome": _state["outcome"].get(item.nodeid, "unknown"),
        "launches": {k: after[k] - before[k] for k in after if after[k] != before[k]},
    }


def pytest_runtest_logreport(report):
    if not _state:
        return
    prev = _state["outcome"].get(report.nodeid)
    if report.failed:
        _state["outcome"][report.nodeid] = "failed"
    elif report.skipped and prev != "failed":
        _state["outcome"][report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and prev is None:
        _state["outcome"][report.nodeid] = "passed"


def _kernel_totals(tests: dict, variants) -> dict:
    """{kernel: {"aot", "jit", "native", "variants" (a set of spec keys), "failed_tests" (failing tests that launched
    the kernel's cubins)}} of the tests' launches and the launched variant keys."""
    out: dict = {}

    def row(kernel):
        return out.setdefault(kernel, {"aot": 0, "jit": 0, "native": 0, "variants": set(), "failed_tests": []})

    for nodeid, t in tests.items():
        for label, n in t["launches"].items():
            backend, kernel = label.split(":", 1)
            k = row(kernel)
            k[backend] = k.get(backend, 0) + n
            if t["outcome"] == "failed" and backend == "aot" and nodeid not in k["failed_tests"]:
                k["failed_tests"].append(nodeid)
    for key in variants:
        row(key.split("|", 1)[0])["variants"].add(key)
    return out


def pytest_sessionfinish(session, exitstatus):
    if not _state:
        return
    from tsct.kernels import aot

    path: Path = _state["path"]
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    tests = dict(old.get("tests", {}))
    for nodeid, t in _state["tests"].items():  # a test id run again (another configuration) gets a suffix
        n, key = 1, nodeid
        while key in tests:
            n += 1
            key = f"{nodeid} #{n}"
        tests[key] = t
    import torch

    cap = tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    arch = aot.artifact_arch(cap)
    sessions = list(old.get("sessions", []))
    sessions.append({"argv": sys.argv[1:], "exitstatus": int(exitstatus),
                     "env": {k: os.environ.get(k) for k in ("TSCT_TRITON_BACKEND", "TSCT_TRITON_GLU_CFG")},
                     "outcomes": dict(collections.Counter(t["outcome"] for t in _state["tests"].values()))})
    variants = {k for k, n in _state["keys"].items() if n} | {
        key for v in old.get("kernels", {}).values() for key in v.get("variants", [])}
    totals = _kernel_totals(tests, variants)
    import tsct

    data = {"device": torch.cuda.get_device_name() if cap else None, "capability": cap, "aot_arch": arch,
            "proxy": aot.proxy(arch) if arch else None, "tsct": tsct.__version__,
            "commit": getattr(tsct, "__git_commit__", None), "sessions": sessions,
            "kernels": {k: {**v, "variants": sorted(v["variants"])} for k, v in sorted(totals.items())},
            "tests": tests}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
