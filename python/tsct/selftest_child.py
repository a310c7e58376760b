"""The child process of a first-use self-test (``tsct.firstuse.verdict`` starts it).

    python -m tsct.selftest_child --path triton-lowbit --fmt nvfp4 [--expect-name NAME --expect-capability 12.0]

Runs the self-test of ``--path`` with ``--fmt`` factors on CUDA device 0 (the parent pins its own
device with ``CUDA_VISIBLE_DEVICES``): ``tsct.selftest.grouped_glu`` (forward and backward against
float64) for the Triton paths, ``tsct.selftest.sm120_fp4_forward`` for sm120-fp4, and for ``--path native-quant``
(``tsct.dispatch.NATIVE_QUANT``, the native quantize / decode kernels; ``--fmt`` is ignored: one test covers every
format) ``tsct.selftest.native_quant``, all of whose comparisons must be bit-exact, and for ``--path triton-routing``
(``tsct.dispatch.ROUTING``, ``tsct.ops.sort_by_expert``'s Triton kernels; ``--fmt`` is ignored)
``tsct.selftest.sort_by_expert``, bit for bit against a stable argsort. Then prints ONE
line ``TSCT_SELFTEST_VERDICT {json}`` on stdout with ``verdict`` ("pass", "fail" or "not-runnable")
and ``detail``, and exits 0 (pass), 1 (fail) or 3 (not runnable: no CUDA device, a device other than
the one expected, or no kernel of the path for its compute capability; ``--force`` runs anyway). A
kernel that faults or hangs ends the process without that line; the parent reads that as a crash or
a timeout. Safe to run by hand to see what the self-test says on a card.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

from tsct.firstuse import ENV_IN_CHILD, EXIT_FAIL, EXIT_NOT_RUNNABLE, EXIT_PASS, SELFTEST_FORMATS, VERDICT_MARKER


def _emit(verdict: str, detail: str, t0: float, **extra) -> int:
    payload = {"verdict": verdict, "detail": detail, "seconds": round(time.perf_counter() - t0, 3), **extra}
    sys.stdout.write(VERDICT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return {"pass": EXIT_PASS, "fail": EXIT_FAIL, "not-runnable": EXIT_NOT_RUNNABLE}[verdict]


def main(argv: Optional[list] = None) -> int:
    """Run the self-test on cuda:0 and report (module docstring). Returns the exit status."""
    from tsct import dispatch

    ap = argparse.ArgumentParser(prog="python -m tsct.selftest_child", description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", choices=dispatch.SELF_TESTED, default=dispatch.SM120_FP4)
    ap.add_argument("--fmt", choices=SELFTEST_FORMATS, default="nvfp4")
    ap.add_argument("--expect-name", default=None, help="the GPU name the parent sees for this device")
    ap.add_argument("--expect-capability", default=None, help="its compute capability, e.g. 12.0")
    ap.add_argument("--force", action="store_true", help="run the self-test even without a kernel for this GPU")
    args = ap.parse_args(argv)
    os.environ[ENV_IN_CHILD] = args.path  # the path under test runs without asking again, no other gated family
    t0 = time.perf_counter()

    import torch

    from tsct import selftest

    if not torch.cuda.is_available():
        return _emit("not-runnable", "no CUDA device visible in the self-test child", t0)
    props = torch.cuda.get_device_properties(0)
    cap = (props.major, props.minor)
    seen = {"gpu": props.name, "capability": f"{cap[0]}.{cap[1]}"}
    want = {"gpu": args.expect_name, "capability": args.expect_capability}
    if any(w is not None and w != seen[k] for k, w in want.items()):
        return _emit("not-runnable", f"the child sees {seen['gpu']} (cc {seen['capability']}), the parent asked "
                     f"about {want['gpu']} (cc {want['capability']}): CUDA_VISIBLE_DEVICES did not pin the device",
                     t0, device=seen)
    dev = torch.device("cuda", 0)
    if args.path == dispatch.SM120_FP4:
        from tsct.kernels import sm120_fp4

        ok, why = sm120_fp4.kernel_status(cap)
        if not ok and not args.force:
            return _emit("not-runnable", why, t0, device=seen)
        r = selftest.sm120_fp4_forward(dev, fmt=args.fmt if args.fmt in ("nvfp4", "sign") else "nvfp4")
    elif args.path == dispatch.NATIVE_QUANT:
        from tsct import native

        if not native.available() and not args.force:
            return _emit("not-runnable", f"the native library does not load: {native.load_error()}", t0, device=seen)
        r = selftest.all_of("native quantize / decode vs torch", selftest.native_quant(dev))
    elif args.path == dispatch.ROUTING:
        from tsct.ops import routing

        ok, why = routing.kernels_status(cap)
        if not ok and not args.force:
            return _emit("not-runnable", f"the routing kernels cannot launch here: {why}", t0, device=seen)
        r = selftest.sort_by_expert(dev)
    else:
        st = dispatch.status(args.path, cap, args.fmt)
        if not st.ok and not args.force:
            return _emit("not-runnable", st.reason, t0, device=seen)
        r = selftest.grouped_glu(args.path, dev, torch.bfloat16, args.fmt, backward=True)
    detail = r.detail
    try:  # an asynchronous fault surfaces here at the latest
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 (reported as the verdict)
        return _emit("fail", f"{detail}; then {type(exc).__name__}: {exc}", t0, device=seen)
    return _emit("pass" if r.ok else "fail", detail, t0, device=seen)


if __name__ == "__main__":
    sys.exit(main())
