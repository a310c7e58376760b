"""A stand-in for the first-use self-test child (``tsct.firstuse.run_subprocess``) on the CPU: the CPU tests of the
first-use gates (tests/native/test_native_quant_firstuse.py, tests/ops/test_routing_firstuse.py) answer with it as the
real child would; the verdict logic, the caches, the counters and the warnings stay the real ones."""

from __future__ import annotations

import json

from tsct import firstuse

#: the identity a dressed-up 12.0 GPU reports (``firstuse.identity`` is replaced by it)
IDENT = {"tsct": "0.1.0", "library": "/x/libtsct_kernels.so 123 sha256:ab", "driver": "615.00 (CUDA 12.9)",
         "gpu": "NVIDIA GeForce RTX 5060 Ti", "capability": "12.0"}


def verdict_line(verdict: str, detail: str) -> str:
    """The line a child prints: the verdict marker and its JSON."""
    return firstuse.VERDICT_MARKER + json.dumps({"verdict": verdict, "detail": detail}) + "\n"


class FakeRunner:
    """Stands in for the child: records each start (argv, env, timeout), answers with a fixed result."""

    def __init__(self, returncode=firstuse.EXIT_PASS, stdout=None, stderr="", timed_out=False,
                 detail="all 6 passed (bit-exact)"):
        stdout = verdict_line("pass", detail) if stdout is None else stdout
        self.result = firstuse.ChildResult(returncode, stdout, stderr, timed_out, 0.4)
        self.calls = []

    def __call__(self, argv, env, timeout):
        self.calls.append((argv, env, timeout))
        return self.result


def failures(fail: tuple[str, str], not_runnable: tuple[str, str]) -> dict:
    """{outcome: (FakeRunner kwargs, the words the status reason must hold)} for each failing verdict of a child:
    "fail" and "not-runnable" with the family's own (child detail, expected words); "crash" and "timeout" alike for
    every family."""
    return {
        "fail": (dict(returncode=firstuse.EXIT_FAIL, stdout=verdict_line("fail", fail[0])), fail[1]),
        "crash": (dict(returncode=-11, stdout="", stderr="Fatal Python error: Segmentation fault"),
                  "FAILED: crash: self-test child died with SIGSEGV"),
        "timeout": (dict(returncode=None, stdout="", timed_out=True), "FAILED: timeout: self-test child still running"),
        "not-runnable": (dict(returncode=firstuse.EXIT_NOT_RUNNABLE,
                              stdout=verdict_line("not-runnable", not_runnable[0])), not_runnable[1]),
    }
