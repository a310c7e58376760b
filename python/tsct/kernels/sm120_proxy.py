"""Per sm_120 kernel: has its logic run on the H200 proxy (docs/decisions/0017), and if not, why not.

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
    "cutedsl": ("no: the NVFP4 block-scaled MMA atom exists for sm_120a / sm_121a only and CuTeDSL has no software "
                "atom to swap in (docs/sm120.md); its math is emulated in torch instead"),
}

#: Proxy-stage runs, newest last. Each: {"date", "commit" (of the wheel), "device", "evidence" (the committed log),
#: "suite" (pytest's summary), "kernels": {kernel: {"aot": launches through the proxy cubins, "variants": distinct
#: variants launched, "jit": ..., "native": ..., "failed_tests": [test ids that launched it and failed]}}}: the record
#: ``scripts/proxy_verdicts.py`` prints from the stage's launch ledger.
RUNS: tuple[dict, ...] = (
    {'date': '2026-12-04', 'commit': 'b713935', 'device': 'NVIDIA H200',
     'evidence': 'bench/results/2026-12-04_h200_sm120_proxy_b713935.log',
     'suite': '260 passed, 3 skipped',
     'kernels': {
         'glu_down_fwd': {'aot': 315, 'variants': 30, 'jit': 0, 'native': 0, 'failed_tests': []},
         'glu_up_fwd': {'aot': 170, 'variants': 18, 'jit': 0, 'native': 0, 'failed_tests': []},
         'combine_rows': {'aot': 745, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': []},
         'zero_tail_rows': {'aot': 161, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': []},
         'tile_cum': {'aot': 556, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': []},
         'csr_keys': {'aot': 720, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': []},
         'route_rank': {'aot': 52, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': []},
         'route_place': {'aot': 52, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': []},
         'glu_bwd_dz': {'aot': 160, 'variants': 15, 'jit': 0, 'native': 0, 'failed_tests': []},
         'glu_bwd_epi': {'aot': 448, 'variants': 12, 'jit': 0, 'native': 0, 'failed_tests': []},
         'glu_bwd_dx_dw': {'aot': 158, 'variants': 13, 'jit': 0, 'native': 0, 'failed_tests': []},
         'lowbit_down_fwd': {'aot': 556, 'variants': 20, 'jit': 0, 'native': 0, 'failed_tests': []},
         'lowbit_up_fwd': {'aot': 296, 'variants': 20, 'jit': 0, 'native': 0, 'failed_tests': []},
         'lowbit_bwd_dz': {'aot': 288, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': []},
         'lowbit_bwd_dx_dw': {'aot': 288, 'variants': 11, 'jit': 0, 'native': 0, 'failed_tests': []},
     }},
)


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
    """How far ``kernel`` (of ``family``: "glu", "lowbit", "cutedsl") has run on the H200 proxy."""
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

    out = [{"kernel": k, "family": f} for f in PROXY_FAMILIES for k in table_variants(f)]
    out += [{"kernel": v["kernel"], "family": "cutedsl"} for v in VERIFICATION]
    for r in out:
        r["proxy_on_sm90"] = verdict(r["kernel"], r["family"])
    return out

