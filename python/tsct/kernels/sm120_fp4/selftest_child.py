"""The child process of the sm120-fp4 first-use self-test (``firstuse.verdict`` starts it).

    python -m tsct.kernels.sm120_fp4.selftest_child --fmt nvfp4 [--expect-name NAME --expect-capability 12.0] [--force]

Runs ``tsct.selftest.sm120_fp4_forward`` on CUDA device 0 (the parent pins its own device with
``CUDA_VISIBLE_DEVICES``), then prints ONE line ``TSCT_SM120_FP4_VERDICT {json}`` on stdout with
``verdict`` ("pass", "fail" or "not-runnable") and ``detail``, and exits 0 (pass), 1 (fail) or 3
(not runnable: no CUDA device, a device other than the one expected, or no sm120-fp4 kernel for its
compute capability; ``--force`` runs the forward anyway, e.g. to see the library refuse cleanly on
another GPU). A kernel that faults or hangs ends the process without that line; the parent reads
that as a crash or a timeout. Safe to run by hand to see what the self-test says on a card.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional

from tsct.kernels.sm120_fp4.firstuse import EXIT_FAIL, EXIT_NOT_RUNNABLE, EXIT_PASS, VERDICT_MARKER


def _emit(verdict: str, detail: str, t0: float, **extra) -> int:
    payload = {"verdict": verdict, "detail": detail, "seconds": round(time.perf_counter() - t0, 3), **extra}
    sys.stdout.write(VERDICT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return {"pass": EXIT_PASS, "fail": EXIT_FAIL, "not-runnable": EXIT_NOT_RUNNABLE}[verdict]


def main(argv: Optional[list] = None) -> int:
    """Run the self-test on cuda:0 and report (module docstring). Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m tsct.kernels.sm120_fp4.selftest_child",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmt", choices=("nvfp4", "sign"), default="nvfp4")
    ap.add_argument("--expect-name", default=None, help="the GPU name the parent sees for this device")
    ap.add_argument("--expect-capability", default=None, help="its compute capability, e.g. 12.0")
    ap.add_argument("--force", action="store_true", help="run the forward even without a kernel for this GPU")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    import torch

    from tsct import selftest
    from tsct.kernels import sm120_fp4

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
    ok, why = sm120_fp4.kernel_status(cap)
    if not ok and not args.force:
        return _emit("not-runnable", why, t0, device=seen)
    r = selftest.sm120_fp4_forward(torch.device("cuda", 0), fmt=args.fmt)
    detail = r.detail
    try:  # an asynchronous fault surfaces here at the latest
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 (reported as the verdict)
        return _emit("fail", f"{detail}; then {type(exc).__name__}: {exc}", t0, device=seen)
    return _emit("pass" if r.ok else "fail", detail, t0, device=seen)


if __name__ == "__main__":
    sys.exit(main())
