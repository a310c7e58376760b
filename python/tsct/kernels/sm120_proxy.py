"""Per sm_120 kernel: has its logic run on the H200 proxy (docs/decisions/0016), and if not, why not.

The one table behind the probe's sm_120 table, ``tsct.kernels.sm120_fp4.VERIFICATION[...]["proxy_on_sm90"]`` and
docs/sm120.md (section "The H200 proxy", kept equal to ``rows()`` by tests/cpu/test_sm120_proxy.py).

    RUNS                      the proxy stage's runs (``scripts/gpu_suite.sh proxy``): date, commit, device,
                              evidence, the suite's outcome, per kernel the launches through the proxy cubins
    NOT_PROXIED               kernel families no proxy of this kind can run, and why
    verdict(kernel, family)   "logic run on an H200 proxy (...)", "not run on the proxy yet", "no: <why>", ...
    rows()                    one row per sm_120 kernel: kernel, family, proxy_on_sm90

What "logic run on an H200 proxy" means, and no more (design.md section 6): the kernel's sm_120 variants (same
source, pinned Triton, tiles, warps, stages, TTGIR and 101,376-byte shared-memory limit) were assembled for sm_90 and
passed the GPU suite on an H200. It does not mean the sm_120 cubin ran: its LLVM and ptxas output differ, and so do
the SM count, shared memory per SM, L2 and bandwidth (the decision lists what differs).

Importing this module imports neither torch nor Triton.
"""

from __future__ import annotations

__all__ = ["RUNS", "NOT_PROXIED", "PROXY_FAMILIES", "verdict", "rows", "table_variants"]

#: the Triton families the proxy build holds (``specs.PROXIES["sm_120_proxy_sm90"].families``)
PROXY_FAMILIES = ("glu", "lowbit")

#: family -> why no kernel of it runs on the H200 proxy
NOT_PROXIED: dict[str, str] = {
    "w4a4": ("no: the W4A4 family is not in the proxy build: its GEMMs' tl.dot_scaled is the block-scaled OMMA "
             "(mma.sync kind::mxf4nvf4) on sm_120, which sm_90 lacks; the H200 runs the family's sm_90a cubins "
             "(Triton's bf16 emulation of dot_scaled), another code path"),
    "cutedsl": ("no: the NVFP4 block-scaled MMA atom exists for sm_120a / sm_121a only and CuTeDSL has no software "
                "atom to swap in (docs/sm120.md); its math is emulated in torch instead"),
    "cutlass": "no: CUTLASS's SM120 block-scaled collective builds for sm_120a only (decision 0007)",
}

#: the CUTLASS kernel (csrc/cutlass/, decision 0011)
CUTLASS_KERNELS = ("tsct_cutlass_nvfp4_grouped_sm120_bf16",)

#: Proxy-stage runs, newest last. Each: {"date", "commit" (of the wheel), "device", "evidence" (the committed log),
#: "suite" (pytest's summary), "kernels": {kernel: {"aot": launches through the proxy cubins, "variants": distinct
#: variants launched, "jit": ..., "native": ..., "failed_tests": [test ids that launched it and failed]}}}: the record
#: ``scripts/proxy_verdicts.py`` prints from the stage's launch ledger.
RUNS: tuple[dict, ...] = ()


def table_variants(family: str) -> dict[str, int]:
    """{kernel: variants} of sm_120's AOT table for a proxy family ("glu" or "lowbit"): what the proxy build holds."""
    from tsct.kernels.triton_glu import specs as glu_specs
    from tsct.kernels.triton_lowbit import specs as lowbit_specs

    fs = {"glu": glu_specs, "lowbit": lowbit_specs}[family]
    out: dict[str, int] = {k: 0 for k in fs.KERNELS}
    for s in fs.enumerate_specs("sm_120"):
        out[s.kernel] += 1
    return out


def verdict(kernel: str, family: str) -> str:
    """How far ``kernel`` (of ``family``: "glu", "lowbit", "w4a4", "cutedsl", "cutlass") has run on the H200 proxy."""
    if family in NOT_PROXIED:
        return NOT_PROXIED[family]
    if family not in PROXY_FAMILIES:
        raise ValueError(f"family must be one of {PROXY_FAMILIES + tuple(NOT_PROXIED)}, got {family!r}")
    for run in reversed(RUNS):
        k = run["kernels"].get(kernel)
        if not k or not k.get("aot"):
            continue
        n = table_variants(family).get(kernel, 0)
        if k.get("failed_tests"):
            return (f"FAILED on the H200 proxy ({run['date']}, {run['evidence']}): "
                    + ", ".join(k["failed_tests"][:3]) + ("..." if len(k["failed_tests"]) > 3 else ""))
        return (f"logic run on an H200 proxy ({run['date']}: {k['aot']} launches, {k['variants']} of {n} variants; "
                f"{run['evidence']})")
    if RUNS:
        return "in the proxy build, not launched by the proxy stage's suite"
    return "in the proxy build (sm_120_proxy_sm90); not run on the proxy yet"


def rows() -> list[dict]:
    """One row per sm_120 kernel, in table order: {"kernel", "family", "proxy_on_sm90"}."""
    from tsct.kernels.sm120_fp4 import VERIFICATION
    from tsct.kernels.triton_w4a4 import specs as w4a4_specs

    out = [{"kernel": k, "family": f} for f in PROXY_FAMILIES for k in table_variants(f)]
    out += [{"kernel": k, "family": "w4a4"} for k in w4a4_specs.KERNELS]
    out += [{"kernel": v["kernel"], "family": "cutedsl"} for v in VERIFICATION]
    out += [{"kernel": k, "family": "cutlass"} for k in CUTLASS_KERNELS]
    for r in out:
        r["proxy_on_sm90"] = verdict(r["kernel"], r["family"])
    return out

