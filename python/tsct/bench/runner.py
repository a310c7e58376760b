"""One benchmark run: prepare inputs, factors and references (untimed), measure bandwidth, run the arms.

``run(cfg)`` returns the result dictionary that ``tsct.bench.report`` writes as JSON (schema in
``tsct.bench.__init__``).
"""

from __future__ import annotations

from typing import Optional

import torch

import tsct
from tsct import dispatch
from tsct.bench import arms as arms_mod
from tsct.bench import counts, inputs, measure
from tsct.bench.config import BenchConfig

SCHEMA_VERSION = 1


class NullReporter:
    """Progress sink that shows nothing (tests, --quiet)."""

    def start(self, total: int) -> None: ...
    def step(self, message: str) -> None: ...
    def arm_done(self, result: dict) -> None: ...
    def stop(self) -> None: ...


def dense_format(cfg: BenchConfig) -> str:
    from tsct import quant

    return quant.storage_format(torch.empty(0, dtype=cfg.torch_dtype))


def plan(cfg: BenchConfig) -> list[arms_mod.ArmSpec]:
    """The arms this (resolved) config will report, in order."""
    return arms_mod.select_arms(arms_mod.all_arms(cfg, dense_format(cfg)), cfg.arms)


def _input_sets_that_fit(cfg: BenchConfig, device: torch.device) -> int:
    """cfg.input_sets, reduced (not below 1) if the sets would take more than a quarter of free memory."""
    if device.type != "cuda":
        return cfg.input_sets
    free, _ = torch.cuda.mem_get_info(device)
    per_set = inputs.input_set_bytes(cfg)
    return max(1, min(cfg.input_sets, int(0.25 * free // max(1, per_set))))


def run(cfg: BenchConfig, reporter=None) -> dict:
    """Run the benchmark described by ``cfg``; never raises for a failing arm (it is recorded)."""
    reporter = reporter or NullReporter()
    cfg = cfg.resolved()
    device = cfg.torch_device
    capability = dispatch.device_capability(device)
    specs = plan(cfg)
    started = measure.utc_now()
    reporter.start(len(specs))

    reporter.step("measuring copy bandwidth")
    copy = measure.copy_bandwidth(device, cfg.copy_mb * 2**20)
    floor = counts.bytes_floor(cfg.tokens, cfg.experts, cfg.d, cfg.r, cfg.f)

    reporter.step("making inputs, factors and fp32 references")
    n_sets = _input_sets_that_fit(cfg, device)
    sets = inputs.make_input_sets(cfg, n_sets)
    dense = inputs.make_dense_factors(cfg)
    formats: dict = {dense.fmt: dense}
    for fmt in sorted({s.fmt for s in specs if s.kind == arms_mod.TSCT and s.fmt != dense.fmt}):
        try:
            formats[fmt] = inputs.quantize_factors(dense, fmt)
        except Exception as e:  # noqa: BLE001  (e.g. K not a multiple of 16 for nvfp4)
            formats[fmt] = f"cannot store the factors as {fmt}: {type(e).__name__}: {e}"
    x0, ids0, w0 = sets[0].x.detach(), sets[0].ids, sets[0].weights.detach()
    ref = inputs.reference_output(dense, x0, ids0, w0, cfg.experts)
    ref_dequant = {}
    for fmt, fac in formats.items():
        if fmt != dense.fmt and isinstance(fac, inputs.Factors):
            try:
                ref_dequant[fmt] = inputs.reference_output(fac, x0, ids0, w0, cfg.experts)
            except Exception as e:  # noqa: BLE001  (the format's arms become unavailable, with the reason)
                formats[fmt] = f"cannot decode the {fmt} factors for the reference: {type(e).__name__}: {e}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()

    ctx = arms_mod.Context(cfg=cfg, device=device, capability=capability, sets=sets, dense=dense, formats=formats,
                           ref=ref, ref_dequant=ref_dequant, copy_GBps=copy["GBps"], bytes_floor=floor)
    results = []
    for spec in specs:
        reporter.step(spec.name)
        res = arms_mod.run_arm(spec, ctx, log=reporter.step)
        results.append(res)
        reporter.arm_done(res)
    reporter.stop()

    host_speed = measure.host_speed(device)  # after the arms: the same state of the machine as their timings
    git = measure.git_commit()
    conf = cfg.to_json()
    conf["input_sets_used"] = n_sets
    conf["eager_replay"] = tsct.config.eager_replay  # eager figures depend on it (tsct.kernels.replay)
    return {
        "schema_version": SCHEMA_VERSION,
        "tsct_version": tsct.__version__,
        "git_commit": git["commit"],
        "git": git,
        "date": started,
        "device": measure.device_info(device),
        "host": {**measure.host_info(), "speed": host_speed},
        "config": conf,
        "copy_bandwidth_GBps": copy["GBps"],
        "copy": copy,
        "bytes_floor": floor,
        "floor_ms": floor / (copy["GBps"] * 1e9) * 1e3,
        "factor_bytes_bf16": counts.dense_factor_bytes(cfg.experts, cfg.d, cfg.r, cfg.f),
        "params_per_expert": counts.params_per_expert(cfg.d, cfg.r, cfg.f),
        "flops_fwd": counts.useful_flops(cfg.routed_rows, cfg.d, cfg.r, cfg.f),
        "expert_rows": _expert_row_stats(sets[0].ids, cfg.experts),
        "auto_paths": {fmt: _auto(capability, fmt) for fmt in formats},
        "triton_aot": _triton_aot(capability),
        "fallbacks": dispatch.fallback_records(),  # paths, native quantizers, routing kernels
        "arms": results,
    }


def _triton_aot(capability) -> dict:
    """The Triton cubins this run launched from: {"arch", "proxy"}; "proxy" is the record of a proxy build
    (docs/decisions/0017: another arch's kernels assembled for this GPU), whose times are labelled as such."""
    from tsct.kernels import aot

    arch = aot.artifact_arch(capability)
    return {"arch": arch, "proxy": aot.proxy(arch) if arch else None}


def _auto(capability, fmt) -> Optional[str]:
    try:
        return dispatch.decide(capability, fmt).path
    except RuntimeError:
        return None


def _expert_row_stats(ids: torch.Tensor, experts: int) -> dict:
    from tsct.bench.routing import expert_counts

    c = expert_counts(ids.reshape(-1), experts).cpu()
    return {"min": int(c.min()), "max": int(c.max()), "mean": float(c.float().mean()),
            "empty_experts": int((c == 0).sum())}
