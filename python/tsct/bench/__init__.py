"""tsct.bench: the benchmark of the whole expert pass (design.md sections 2 and 5).

Usage: ``tsct-bench [--preset b1|small] [--json FILE] [--plot FILE.png] ...`` (``python -m tsct.bench``;
``--help`` lists every flag, ``--list-arms`` what can run here). From Python: ``run(config)``.

Modules: ``config`` (presets, BenchConfig), ``counts`` (bytes / FLOP formulas), ``routing`` (router
outputs, sync-free sort and capacity placement), ``inputs`` (factors, formats, input sets), ``measure``
(timing, copy bandwidth, peak memory, machine facts), ``arms`` (the passes and their shared
measurement), ``runner`` (one run), ``report`` (table, JSON, plot), ``sweep`` (``--sweep``: runs over one varied
axis at a time, their JSON and plot), ``cli`` (argparse).

JSON (schema_version 1): {schema_version, tsct_version, git_commit, git {commit, dirty, source}, date (UTC ISO 8601),
device {type, name, capability, sm_count, memory_bytes, l2_cache_bytes, driver, torch, cuda}, host,
config (every parameter, plus routed_rows, capacity, input_sets_used), copy_bandwidth_GBps, copy,
bytes_floor, floor_ms, factor_bytes_bf16, params_per_expert, flops_fwd, expert_rows, auto_paths,
triton_aot {arch, proxy: the proxy build's record or null (docs/decisions/0017)},
fallbacks, arms: [{name, kind, path, format, status: ran|refused|unavailable|error, reason,
fwd_ms {median, p10, p90, n}, fwdbwd_ms {...}, fwd_graph_ms {...} | null, fwdbwd_graph_ms {...} | null,
bytes, pct_of_floor, pct_of_copy_bw, achieved_GBps, tflops {fwd, fwdbwd}, rates_from: graph|eager, max_rel_err, rel_l2_err, max_rel_err_dequant, rel_l2_err_dequant, nonfinite,
peak_mem_bytes, storage_bytes, dropped_fraction, grads, sync_free, sync_ops, warnings}]}.
README.md beside this file defines every figure; the formulas live in ``counts`` (bytes, FLOPs),
``measure`` (times) and ``arms``.
"""

from tsct.bench.config import PRESETS, BenchConfig, from_preset
from tsct.bench.runner import run

__all__ = ["PRESETS", "BenchConfig", "from_preset", "run"]
