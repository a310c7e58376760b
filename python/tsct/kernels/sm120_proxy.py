"""Per sm_120 kernel: has its logic run on the sm_90 proxy (an H200 or H100; docs/decisions/0017), and if not, why not.

The one table behind the probe's sm_120 table, ``tsct.kernels.sm120_fp4.VERIFICATION[...]["proxy_on_sm90"]`` and
docs/sm120.md (section "The sm_90 proxy", kept equal to ``rows()`` by tests/kernels/test_sm120_proxy.py).

    RUNS                      the proxy stage's runs (``scripts/gpu_suite.sh proxy``): date, commit, device,
                              evidence, the suite's outcome, per kernel the launches through the proxy cubins and
                              the fingerprint of the kernel source they were built from
    NOT_PROXIED               kernel families no proxy of this kind can run, and why
    shipped_source(kernel)    (fingerprint of this install's source of the kernel, or None; why it is unknown)
    verdict(kernel, family)   "logic run on the sm_90 proxy (...)", "source changed since its proxy run: ...",
                              "not run on the proxy yet", "no: <why>", ...
    rows()                    one row per sm_120 kernel: kernel, family, proxy_on_sm90

A run counts for a kernel only if it ran this source of it: each record holds per kernel the fingerprint
(``tsct.kernels.source_key``: the kernel's text and that of every jit function it calls, transitively, plus the
constexpr globals they read; no line numbers, arch or Triton version) of the proxy cubins it launched, and
``verdict`` compares it with the fingerprint of the kernel as shipped: equal, "logic run on the sm_90 proxy";
different, the run was of an earlier source and this one has not run on the proxy. The shipped fingerprint is the
one the AOT build recorded in the installed arch index (``tsct.kernels.aot.sources()``: no Triton, no source
needed); in a source checkout without built cubins it is computed from the source when Triton is importable, and
is otherwise unknown, which the verdict says.

What "logic run on the sm_90 proxy" means, and no more (design.md section 6): the kernel's sm_120 variants (same
source, pinned Triton, tiles, warps, stages, TTGIR and 101,376-byte shared-memory limit) were assembled for sm_90 and
passed the GPU suite on a compute capability 9.0 GPU (the run names it). It does not mean the sm_120 cubin ran: its
LLVM and ptxas output differ, and so do the SM count, shared memory per SM, L2 and bandwidth (the decision lists what
differs).

Importing this module imports neither torch nor Triton (a source checkout without cubins imports Triton on the first
verdict of a proxy family, to fingerprint the source).
"""

from __future__ import annotations

__all__ = ["RUNS", "NOT_PROXIED", "PROXY_FAMILIES", "shipped_source", "verdict", "rows", "table_variants"]

#: the Triton families the proxy build holds (``specs.PROXIES["sm_120_proxy_sm90"].families``)
PROXY_FAMILIES = ("glu", "lowbit")

#: family -> why no kernel of it runs on the sm_90 proxy
NOT_PROXIED: dict[str, str] = {
    "cutedsl": ("no: the NVFP4 block-scaled MMA atom exists for sm_120a / sm_121a only and CuTeDSL has no software "
                "atom to swap in (docs/sm120.md); its math is emulated in torch instead"),
}

#: Proxy-stage runs, newest last. Each: {"date", "commit" (of the wheel), "device", "evidence" (the committed log),
#: "suite" (pytest's summary), "kernels": {kernel: {"aot": launches through the proxy cubins, "variants": distinct
#: variants launched, "jit": ..., "native": ..., "failed_tests": [test ids that launched it and failed], "source": the
#: source fingerprint of the proxy cubins (their index's "sources")}}}: the record ``scripts/proxy_verdicts.py`` prints
#: from the stage's launch ledger. The b713935 run's fingerprints were computed afterwards from that commit's tree
#: (``source_key`` on its kernel modules, Triton 3.9), the source its wheel was built from. The 2e6bd36 run's one
#: failed test is a stale assertion that errored before launching anything (it asked for a retired path's status);
#: the 3b1626c run's (on an H100) one failed test is a test defect that errored before launching anything (it reset a
#: routing attribute that no longer exists).
RUNS: tuple[dict, ...] = (
    {'date': '2026-12-04', 'commit': 'b713935', 'device': 'NVIDIA H200',
     'evidence': 'bench/results/2026-12-04_h200_sm120_proxy_b713935.log',
     'suite': '260 passed, 3 skipped',
     'kernels': {
         'glu_down_fwd': {'aot': 315, 'variants': 30, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'c5a0a225608df89d'},
         'glu_up_fwd': {'aot': 170, 'variants': 18, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': 'e916da95730f92e7'},
         'combine_rows': {'aot': 745, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': '900fcb176222429c'},
         'zero_tail_rows': {'aot': 161, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                            'source': '3ca19f5790771e7d'},
         'tile_cum': {'aot': 556, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '4686e05faba7ea99'},
         'csr_keys': {'aot': 720, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '6322dadaadcab201'},
         'route_rank': {'aot': 52, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7ae970344c25b689'},
         'route_place': {'aot': 52, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '66b9094d263bad19'},
         'glu_bwd_dz': {'aot': 160, 'variants': 15, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '1daa1f3d6b944a8a'},
         'glu_bwd_epi': {'aot': 448, 'variants': 12, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '7eeab449b99c97ec'},
         'glu_bwd_dx_dw': {'aot': 158, 'variants': 13, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': '1e9f1b0089a90c82'},
         'lowbit_down_fwd': {'aot': 556, 'variants': 20, 'jit': 0, 'native': 0, 'failed_tests': [],
                             'source': 'e9c04914f9e82a37'},
         'lowbit_up_fwd': {'aot': 296, 'variants': 20, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': 'e3c934049c95923c'},
         'lowbit_bwd_dz': {'aot': 288, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': '1ca333d31ea6131e'},
         'lowbit_bwd_dx_dw': {'aot': 288, 'variants': 11, 'jit': 0, 'native': 0, 'failed_tests': [],
                              'source': '1e384e8cca14ecda'},
     }},
    {'date': '2026-12-04', 'commit': '2e6bd36', 'device': 'NVIDIA H200',
     'evidence': 'bench/results/2026-12-04_h200_sm120_proxy_2e6bd36.log',
     'suite': '1 failed, 270 passed, 222 skipped',
     'kernels': {
         'glu_down_fwd': {'aot': 292, 'variants': 24, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'c5a0a225608df89d'},
         'glu_up_fwd': {'aot': 159, 'variants': 16, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': 'e916da95730f92e7'},
         'combine_rows': {'aot': 756, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': '900fcb176222429c'},
         'zero_tail_rows': {'aot': 149, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                            'source': '3ca19f5790771e7d'},
         'tile_cum': {'aot': 307, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '4686e05faba7ea99'},
         'csr_keys': {'aot': 731, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '6322dadaadcab201'},
         'route_rank': {'aot': 52, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7ae970344c25b689'},
         'route_place': {'aot': 52, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '66b9094d263bad19'},
         'bwd_maps': {'aot': 448, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '8c145a5ce77a5b8d'},
         'glu_bwd_dz': {'aot': 149, 'variants': 13, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '1cc5a8202c2c53fd'},
         'glu_bwd_dwd': {'aot': 437, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '97b3db8ca4055b88'},
         'bwd_slot_reduce': {'aot': 316, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                             'source': 'd28f3356d7f0a0fb'},
         'glu_bwd_epi': {'aot': 448, 'variants': 9, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '43f27cdfe8b1c50c'},
         'glu_bwd_sred': {'aot': 392, 'variants': 3, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'a7fcdbdeab649b68'},
         'glu_bwd_dx_dw': {'aot': 147, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': 'bd37aeed58153121'},
         'glu_bwd_dw': {'aot': 436, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7f44eaed32b055ac'},
         'lowbit_down_fwd': {'aot': 554, 'variants': 20, 'jit': 12, 'native': 0, 'failed_tests': [],
                             'source': '6ad6ae1d57686d3b'},
         'lowbit_up_fwd': {'aot': 299, 'variants': 20, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'b6766d14776506f0'},
         'lowbit_bwd_dz': {'aot': 291, 'variants': 7, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'e81cbed19b2a2acf'},
         'lowbit_bwd_dx_dw': {'aot': 287, 'variants': 11, 'jit': 12, 'native': 0, 'failed_tests': [],
                              'source': '6e85d70ca7196b78'},
     }},
    {'date': '2026-12-05', 'commit': '60b7bd0', 'device': 'NVIDIA H200',
     'evidence': 'bench/results/2026-12-05_h200_sm120_proxy_60b7bd0.log',
     'suite': '271 passed, 222 skipped',
     'kernels': {
         'bwd_maps': {'aot': 448, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '8c145a5ce77a5b8d'},
         'bwd_slot_reduce': {'aot': 316, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                             'source': 'd28f3356d7f0a0fb'},
         'combine_rows': {'aot': 756, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': '900fcb176222429c'},
         'csr_keys': {'aot': 731, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '6322dadaadcab201'},
         'glu_bwd_dw': {'aot': 436, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7f44eaed32b055ac'},
         'glu_bwd_dwd': {'aot': 437, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': 'b0dd8760609bba53'},
         'glu_bwd_dx_dw': {'aot': 147, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': 'bd37aeed58153121'},
         'glu_bwd_dz': {'aot': 149, 'variants': 13, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '1cc5a8202c2c53fd'},
         'glu_bwd_epi': {'aot': 448, 'variants': 9, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '43f27cdfe8b1c50c'},
         'glu_bwd_sred': {'aot': 392, 'variants': 3, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'a7fcdbdeab649b68'},
         'glu_down_fwd': {'aot': 292, 'variants': 24, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'c5a0a225608df89d'},
         'glu_up_fwd': {'aot': 159, 'variants': 16, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': 'e916da95730f92e7'},
         'lowbit_bwd_dx_dw': {'aot': 287, 'variants': 11, 'jit': 12, 'native': 0, 'failed_tests': [],
                              'source': '6e85d70ca7196b78'},
         'lowbit_bwd_dz': {'aot': 291, 'variants': 7, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'e81cbed19b2a2acf'},
         'lowbit_down_fwd': {'aot': 554, 'variants': 20, 'jit': 12, 'native': 0, 'failed_tests': [],
                             'source': '6ad6ae1d57686d3b'},
         'lowbit_up_fwd': {'aot': 299, 'variants': 20, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'b6766d14776506f0'},
         'route_place': {'aot': 52, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '66b9094d263bad19'},
         'route_rank': {'aot': 52, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7ae970344c25b689'},
         'tile_cum': {'aot': 307, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '4686e05faba7ea99'},
         'zero_tail_rows': {'aot': 149, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                            'source': '3ca19f5790771e7d'},
     }},
    {'date': '2026-12-05', 'commit': '3b1626c', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-05_h100_sm120_proxy_3b1626c.log',
     'suite': '1 failed, 270 passed, 222 skipped',
     'kernels': {
         'bwd_maps': {'aot': 448, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '8c145a5ce77a5b8d'},
         'bwd_slot_reduce': {'aot': 316, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                             'source': 'd28f3356d7f0a0fb'},
         'combine_rows': {'aot': 756, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': '900fcb176222429c'},
         'csr_keys': {'aot': 731, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '6322dadaadcab201'},
         'glu_bwd_dw': {'aot': 436, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7f44eaed32b055ac'},
         'glu_bwd_dwd': {'aot': 437, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': 'b0dd8760609bba53'},
         'glu_bwd_dx_dw': {'aot': 147, 'variants': 10, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': 'bd37aeed58153121'},
         'glu_bwd_dz': {'aot': 149, 'variants': 13, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '1cc5a8202c2c53fd'},
         'glu_bwd_epi': {'aot': 448, 'variants': 9, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '43f27cdfe8b1c50c'},
         'glu_bwd_sred': {'aot': 392, 'variants': 3, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': 'a7fcdbdeab649b68'},
         'glu_down_fwd': {'aot': 292, 'variants': 24, 'jit': 0, 'native': 0, 'failed_tests': [],
                          'source': '4b1cf567a2153d26'},
         'glu_up_fwd': {'aot': 159, 'variants': 16, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': 'e916da95730f92e7'},
         'lowbit_bwd_dx_dw': {'aot': 287, 'variants': 11, 'jit': 12, 'native': 0, 'failed_tests': [],
                              'source': '6e85d70ca7196b78'},
         'lowbit_bwd_dz': {'aot': 291, 'variants': 7, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'e81cbed19b2a2acf'},
         'lowbit_down_fwd': {'aot': 554, 'variants': 20, 'jit': 12, 'native': 0, 'failed_tests': [],
                             'source': 'ffafcebec9fa9aaa'},
         'lowbit_up_fwd': {'aot': 299, 'variants': 20, 'jit': 8, 'native': 0, 'failed_tests': [],
                           'source': 'b6766d14776506f0'},
         'route_place': {'aot': 50, 'variants': 4, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '66b9094d263bad19'},
         'route_rank': {'aot': 50, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7ae970344c25b689'},
         'tile_cum': {'aot': 307, 'variants': 2, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '4686e05faba7ea99'},
         'zero_tail_rows': {'aot': 149, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                            'source': '3ca19f5790771e7d'},
     }},
    # a subset run for the two kernels whose source changed; only they are recorded (the other kernels' newest
    # verdicts stay those of the full runs above)
    {'date': '2026-12-06', 'commit': 'a7ada20', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-06_h100_sm120_proxy_a7ada20.log',
     'suite': "140 passed, 150 skipped (test_triton_glu_gpu.py, test_triton_lowbit_gpu.py -k 'backward or "
              "deterministic or empty')",
     'kernels': {
         'glu_bwd_dx_dw': {'aot': 81, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': '81e7019a10674fd1'},
         'lowbit_bwd_dx_dw': {'aot': 196, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                              'source': '7b6ddadf6cbf5686'},
     }},
    # likewise, for glu_bwd_epi (its GLU math moved into a helper) and lowbit_bwd_dz (the fused-epilogue parameters)
    {'date': '2026-12-06', 'commit': 'cb9286e', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-06_h100_sm120_proxy_cb9286e.log',
     'suite': "139 passed, 148 skipped (test_triton_glu_gpu.py, test_triton_lowbit_gpu.py -k 'backward or "
              "deterministic or empty')",
     'kernels': {
         'glu_bwd_epi': {'aot': 275, 'variants': 8, 'jit': 0, 'native': 0, 'failed_tests': [],
                         'source': '375fbfa4253123f4'},
         'lowbit_bwd_dz': {'aot': 184, 'variants': 5, 'jit': 0, 'native': 0, 'failed_tests': [],
                           'source': 'c96833edf23efc55'},
     }},
    # likewise, for lowbit_bwd_dx_dw (a column-scaled factor's program walks several d blocks; sm_120's table keeps one)
    {'date': '2026-12-06', 'commit': '3e7c9bc', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-06_h100_sm120_proxy_3e7c9bc.log',
     'suite': "139 passed, 148 skipped (test_triton_glu_gpu.py, test_triton_lowbit_gpu.py -k 'backward or "
              "deterministic or empty')",
     'kernels': {
         'lowbit_bwd_dx_dw': {'aot': 184, 'variants': 7, 'jit': 0, 'native': 0, 'failed_tests': [],
                              'source': '71488c8910a02dac'},
     }},
    # likewise, for bwd_maps (a program per 1,024 experts, each summing the experts before it)
    {'date': '2026-12-07', 'commit': 'dbe6bab', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-07_h100_sm120_proxy_dbe6bab.log',
     'suite': "147 passed, 156 skipped (test_triton_glu_gpu.py, test_triton_lowbit_gpu.py -k 'backward or "
              "deterministic or empty')",
     'kernels': {
         'bwd_maps': {'aot': 291, 'variants': 1, 'jit': 0, 'native': 0, 'failed_tests': [],
                      'source': '8c01d859be6c9f26'},
     }},
    {'date': '2026-12-07', 'commit': 'c9056b8', 'device': 'NVIDIA H100 80GB HBM3',
     'evidence': 'bench/results/2026-12-07_h100_sm120_proxy_c9056b8.log',
     'suite': "147 passed, 156 skipped (test_triton_glu_gpu.py, test_triton_lowbit_gpu.py -k 'backward or "
              "deterministic or empty')",
     'kernels': {
         'glu_bwd_dz': {'aot': 95, 'variants': 11, 'jit': 0, 'native': 0, 'failed_tests': [],
                        'source': '7c9b7dc95d7135d5'},
     }},
)


def _family_specs(family: str):
    from tsct.kernels.triton_glu import specs as glu_specs
    from tsct.kernels.triton_lowbit import specs as lowbit_specs

    return {"glu": glu_specs, "lowbit": lowbit_specs}[family]


def table_variants(family: str) -> dict[str, int]:
    """{kernel: variants} of sm_120's AOT table for a proxy family ("glu" or "lowbit"): what the proxy build holds."""
    fs = _family_specs(family)
    out: dict[str, int] = {k: 0 for k in fs.KERNELS}
    for s in fs.enumerate_specs("sm_120"):
        out[s.kernel] += 1
    return out


_shipped: dict = {}  # {"generation": tsct.kernels.aot.generation, "keys": {kernel: fingerprint}, "why": str}


def _source_keys_from_source() -> tuple[dict[str, str], str]:
    """Fingerprints of the proxy families' kernels computed from this checkout's source (imports Triton)."""
    import importlib

    try:
        importlib.import_module("triton")
    except ImportError:
        return {}, "no AOT index is installed and Triton is not importable to fingerprint the source"
    from tsct.kernels.source_key import source_keys

    out: dict[str, str] = {}
    for fam, mod in (("glu", "tsct.kernels.triton_glu._kernels"), ("lowbit", "tsct.kernels.triton_lowbit._kernels")):
        out.update(source_keys(importlib.import_module(mod), _family_specs(fam).KERNELS))
    return out, "the source has no such kernel"


def shipped_source(kernel: str) -> tuple[str | None, str]:
    """(fingerprint, "") of this install's source of the Triton kernel ``kernel`` (``tsct.kernels.source_key``), or
    (None, why it is unknown). Taken from the installed AOT indexes (recorded at build time); with no index installed
    (a source checkout without built cubins), computed from the source if Triton is importable. Cached per
    ``tsct.kernels.aot`` index generation."""
    from tsct.kernels import aot

    if _shipped.get("generation") != aot.generation:
        keys = aot.sources()
        if keys is None:
            keys, why = _source_keys_from_source()
        elif keys:
            why = "the installed AOT indexes record no fingerprint of this kernel"
        else:
            why = "the installed AOT indexes record no source fingerprints (built before they were recorded)"
        _shipped.clear()
        _shipped.update(generation=aot.generation, keys=keys, why=why)
    key = _shipped["keys"].get(kernel)
    return (key, "") if key else (None, _shipped["why"])


def _ran(run: dict, k: dict, n: int) -> str:
    if k.get("failed_tests"):
        return (f"FAILED on the sm_90 proxy ({run['device']}, {run['date']}, {run['evidence']}): "
                + ", ".join(k["failed_tests"][:3]) + ("..." if len(k["failed_tests"]) > 3 else ""))
    # the run's variants are its build's (a table changes: fp16 variants left it after this run), n this source's
    variants = f"{k['variants']} variant" + ("" if k["variants"] == 1 else "s")
    return (f"logic run on the sm_90 proxy ({run['device']}, {run['date']}: {k['aot']} launches of {variants}; "
            f"{n} in this table; {run['evidence']})")


def verdict(kernel: str, family: str) -> str:
    """How far ``kernel`` (of ``family``: "glu", "lowbit", "cutedsl") has run on the sm_90 proxy, in this source.

    The newest run that launched the kernel with the fingerprint of this install's source of it (``shipped_source``)
    gives "logic run on the sm_90 proxy (...)" or "FAILED on the sm_90 proxy (...)". If runs launched it but none with
    this source: "source changed since its proxy run: ..." naming the newest such run. If the fingerprint of this
    source (or of the run) is unknown, the newest run's verdict with the reason it may not be this source's."""
    if family in NOT_PROXIED:
        return NOT_PROXIED[family]
    if family not in PROXY_FAMILIES:
        raise ValueError(f"family must be one of {PROXY_FAMILIES + tuple(NOT_PROXIED)}, got {family!r}")
    launched = [(run, k) for run in reversed(RUNS) if (k := run["kernels"].get(kernel)) and k.get("aot")]
    if not launched:
        if RUNS:
            last = RUNS[-1]
            return f"in the proxy build; no proxy run launched it (the latest: {last['date']}, commit {last['commit']})"
        return "in the proxy build (sm_120_proxy_sm90); not run on the proxy yet"
    n = table_variants(family).get(kernel, 0)
    now, why = shipped_source(kernel)
    for run, k in launched:
        if now is not None and k.get("source") == now:
            return _ran(run, k, n)
    run, k = launched[0]
    if now is None or not k.get("source"):
        why = why or f"the run of {run['date']} recorded no source fingerprint"
        return f"{_ran(run, k, n)}; unknown whether of this source: {why}"
    failed = ", FAILED" if k.get("failed_tests") else ""
    return (f"source changed since its proxy run: the sm_90 proxy ran an earlier source of this kernel "
            f"({run['device']}, {run['date']}, commit {run['commit']}: {k['aot']} launches{failed}; "
            f"{run['evidence']}); this source has not run on the proxy")


def rows() -> list[dict]:
    """One row per sm_120 kernel, in table order: {"kernel", "family", "proxy_on_sm90"}."""
    from tsct.kernels.sm120_fp4 import VERIFICATION

    out = [{"kernel": k, "family": f} for f in PROXY_FAMILIES for k in table_variants(f)]
    out += [{"kernel": v["kernel"], "family": "cutedsl"} for v in VERIFICATION]
    for r in out:
        r["proxy_on_sm90"] = verdict(r["kernel"], r["family"])
    return out

