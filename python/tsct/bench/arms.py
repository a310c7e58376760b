"""The benchmark arms: one pass function per kind, one shared measurement (``measure_arm``).

Every arm times the WHOLE expert pass (design.md section 2): token-major ``x [T, d]``, the router's
top-k ids and weights in; token-major ``[T, f]`` out. Each pass does its own sort / dispatch, gather,
the expert math and the combine inside the timed span, sync-free.

    padded-bmm     what the user runs today: capacity C = ceil(capacity_factor*T*k/E); rows are placed in
                   an [E, C, d] buffer (rows past an expert's capacity are DROPPED), bmm with w_gate and
                   w_up, GLU with the scales, bmm with w_down -> [E, C, f], then each token sums its kept
                   rows times their router weight.
    grouped-mm     torch.nn.functional.grouped_mm (torch._grouped_mm on older torch) over the rows sorted
                   by expert; refusals (">1024 groups", "strides should be multiple of 16 bytes") are
                   recorded as the result.
    tsct-<path>-<fmt>  tsct.ops.sort_by_expert (the torch arms sort with argsort + a count, ``routing.py``), then
                   tsct.ops.grouped_glu(impl=<path>) with the factors stored in <fmt>, gather and
                   combine fused (gather_idx = scatter_idx = token of each sorted row, row_weight = the
                   sorted router weights). w_down row-major ([E, r, f] contiguous). With nvfp4 / sign
                   factors on a GPU, "triton-lowbit" is the W4A16 path auto takes (packed bytes decoded in
                   registers).
    tsct-{triton-bf16,bmm}-<fmt>-kmajor  the same with the same values of w_down stored K-major (the transpose
                   of a contiguous [E, f, r], nn.Linear's and tsct.nn's layout; decision 0012): the fast layout at
                   odd f (16-byte aligned rows for the kernels and for cuBLAS).
    tsct-triton-lowbit-<fmt>-ste  the same call with the dense bf16 factors as MASTERS (masters=...): the
                   backward also computes the straight-through gradients of the masters (dW of the
                   decoded factors), so its forward+backward is the low-bit training step comparable
                   with the bf16 arm's (which differentiates its factors).
    tsct-bmm-<fmt>  the bmm path (factors decoded to bf16 once per call, rows laid out per expert, torch.bmm;
                   exact: no row is dropped): the fallback of every GPU and the CPU path.

Forward timing runs with autograd recording (the forward of a training step); forward+backward adds
``torch.autograd.grad`` of the output w.r.t. x, the router weights, every dense factor and both scales,
with a fixed random grad_out. Packed (nvfp4 / sign / fp8 / ternary) factors hold no master weights, so their arms
differentiate x, router weights and scales only (listed in the arm's ``grads``), except the "-ste" arms,
which pass the dense factors as masters and differentiate them too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import gc
import traceback
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from tsct import dispatch
from tsct.bench import counts, measure, routing
from tsct.bench.config import BenchConfig
from tsct.bench.inputs import Factors, InputSet

PADDED_BMM = "padded-bmm"
GROUPED_MM = "grouped-mm"
TSCT = "tsct"

RAN, REFUSED, UNAVAILABLE, ERROR = "ran", "refused", "unavailable", "error"


# ---- arm list -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ArmSpec:
    name: str
    kind: str                 # PADDED_BMM / GROUPED_MM / TSCT
    path: Optional[str]       # tsct path for TSCT arms, else the kind
    fmt: str                  # storage format of the factors: "bf16"/"fp16"/"fp32" (dense), or a tsct.quant format
    w_down_layout: str = "rowmajor"   # dense w_down: "rowmajor" ([E, r, f] contiguous) or "kmajor" (decision 0012)


def _path_serves_format(path: str, fmt: str) -> bool:
    """Whether some row of the dispatch tables sends ``fmt`` factors to ``path`` (reference and bmm serve all), or
    the path serves them when forced (``dispatch.FORCED_ONLY``: measured before ``auto`` may take them)."""
    if path in (dispatch.REFERENCE, dispatch.BMM) or fmt in dispatch.FORCED_ONLY.get(path, ()):
        return True
    rows = {**dispatch.TABLE, **dispatch.TABLE_NVFP4_ACTIVATIONS}.items()
    return any(path in prefs for (_, f), prefs in rows if f == fmt)


def all_arms(cfg: BenchConfig, dense_fmt: str) -> list[ArmSpec]:
    """Every arm this config can name, in report order.

    tsct arms: every path of ``tsct.dispatch.PATHS`` times every requested format, keeping the pairs the
    dispatch table can ever route (no "sm120-fp4 with bf16 factors" arm). "bf16" in ``cfg.formats``
    stands for dense factors in the compute dtype (``dense_fmt``).
    """
    specs = [ArmSpec(PADDED_BMM, PADDED_BMM, PADDED_BMM, dense_fmt),
             ArmSpec(GROUPED_MM, GROUPED_MM, GROUPED_MM, dense_fmt)]
    fmts = [dense_fmt if f == "bf16" else f for f in cfg.formats]
    for path in dispatch.PATHS:
        for fmt in fmts:
            if _path_serves_format(path, fmt):
                specs.append(ArmSpec(f"tsct-{path}-{fmt}", TSCT, path, fmt))
                if path in (dispatch.TRITON_BF16, dispatch.BMM) and fmt == dense_fmt:
                    specs.append(ArmSpec(f"tsct-{path}-{fmt}-kmajor", TSCT, path, fmt, "kmajor"))
                if path == dispatch.TRITON_LOWBIT and fmt in ("nvfp4", "sign"):
                    specs.append(ArmSpec(f"tsct-{path}-{fmt}-ste", TSCT, path, fmt))
    return specs


def select_arms(specs: list[ArmSpec], patterns) -> list[ArmSpec]:
    """Arms whose name matches one of the fnmatch ``patterns``; a pattern matching nothing is an error."""
    names = [s.name for s in specs]
    for p in patterns:
        if not fnmatch.filter(names, p):
            raise ValueError(f"--arms pattern {p!r} matches no arm; arms are: {', '.join(names)}")
    return [s for s in specs if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]


# ---- the passes -----------------------------------------------------------------------------------

def grouped_mm_function() -> tuple[Optional[Callable], str]:
    """(function, its name) of torch's grouped GEMM, or (None, why not)."""
    fn = getattr(F, "grouped_mm", None)
    if fn is not None:
        return fn, "torch.nn.functional.grouped_mm"
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        return fn, "torch._grouped_mm"
    return None, f"torch {torch.__version__} has neither torch.nn.functional.grouped_mm nor torch._grouped_mm"


def combine_token_major(y_rows: Tensor, tokens: int, topk: int) -> Tensor:
    """Rows in token-major routed order (row t*k + j) -> per-token sum over j, [T, f]; deterministic."""
    return y_rows.view(tokens, topk, y_rows.shape[-1]).sum(1)


def padded_bmm_pass(cfg: BenchConfig, inp: InputSet, fac: Factors) -> Tensor:
    e, c, t, k, d, f = cfg.experts, cfg.capacity, cfg.tokens, cfg.topk, cfg.d, cfg.f
    cap = routing.capacity_slots(inp.ids, e, c)
    xbuf = inp.x.index_select(0, cap.src).view(e, c, d)
    g = torch.bmm(xbuf, fac.w_gate) * fac.s_gate.unsqueeze(1)
    u = torch.bmm(xbuf, fac.w_up) * fac.s_up.unsqueeze(1)
    ybuf = torch.bmm(F.silu(g) * u, fac.w_down).view(e * c, f)
    wk = inp.weights.reshape(-1) * cap.keep.to(inp.weights.dtype)  # dropped rows weigh 0
    y = ybuf.index_select(0, cap.slot) * wk.unsqueeze(1)
    return combine_token_major(y, t, k)


def grouped_mm_pass(cfg: BenchConfig, inp: InputSet, fac: Factors, gmm: Callable) -> Tensor:
    s = routing.sort_by_expert(inp.ids, cfg.experts)
    xs = inp.x.index_select(0, s.token)
    expert = s.expert
    g = gmm(xs, fac.w_gate, offs=s.offs) * fac.s_gate.index_select(0, expert)
    u = gmm(xs, fac.w_up, offs=s.offs) * fac.s_up.index_select(0, expert)
    y = gmm(F.silu(g) * u, fac.w_down, offs=s.offs)
    y = y * inp.weights.reshape(-1).index_select(0, s.order).unsqueeze(1)
    return combine_token_major(y.index_select(0, routing.inverse_permutation(s.order)), cfg.tokens, cfg.topk)


def kmajor_factors(fac: Factors) -> Factors:
    """The same factor values with w_down stored K-major (``w_down.transpose(1, 2)`` contiguous), a new
    leaf that requires grad like the row-major one (decision 0012)."""
    from tsct.kernels.layout import to_kmajor

    wd = to_kmajor(fac.w_down.detach()).requires_grad_(fac.w_down.requires_grad)
    return dataclasses.replace(fac, w_down=wd)


def tsct_call(x: Tensor, ids: Tensor, weights: Tensor, fac: Factors, experts: int, impl: str,
              masters: Optional[tuple] = None) -> Tensor:
    """The whole pass through tsct: ``tsct.ops.sort_by_expert``, then one grouped_glu with gather and combine fused.
    ``masters``: master factors of packed ones (straight-through gradients, ``tsct.ops.grouped_glu``)."""
    from tsct.ops import grouped_glu, sort_by_expert

    from tsct import dispatch

    s = sort_by_expert(ids, experts, weights)
    act = "nvfp4" if impl == dispatch.SM120_FP4 else "bf16"  # the tensor-core path computes NVFP4 activations
    return grouped_glu(x, s.offs, fac.w_gate, fac.w_up, fac.w_down, fac.s_gate, fac.s_up, row_weight=s.row_weight,
                       gather_idx=s.token, scatter_idx=s.token, num_out_rows=x.shape[0], impl=impl,
                       activations=act, masters=masters)


class _WithMasters:
    """Packed factors plus their masters (the dense factors): what an STE arm differentiates."""

    def __init__(self, fac: Factors, dense: Factors):
        self.fac, self.dense = fac, dense

    def storage_bytes(self) -> int:
        return self.fac.storage_bytes()  # what the kernels read; the masters live in the optimizer

    def leaves(self) -> list[Tensor]:
        return [self.dense.w_gate, self.dense.w_up, self.dense.w_down, self.fac.s_gate, self.fac.s_up]

    def leaf_names(self) -> list[str]:
        return ["master_w_gate", "master_w_up", "master_w_down", "s_gate", "s_up"]


# ---- measurement shared by all arms -----------------------------------------------------------------

@dataclasses.dataclass
class Context:
    """What every arm reads: the config, machine figures and the (untimed) inputs and references."""

    cfg: BenchConfig
    device: torch.device
    capability: Optional[tuple]
    sets: list[InputSet]
    dense: Factors
    formats: dict                 # fmt -> Factors, or fmt -> str (why that format cannot be stored)
    ref: Tensor                   # fp32 reference output of input set 0 with the dense factors in fp32
    ref_dequant: dict             # fmt -> fp32 reference with the dequantized factors in fp32
    copy_GBps: float
    bytes_floor: int


def rel_errors(out: Tensor, ref: Tensor) -> dict:
    """max|out - ref| / max|ref| and ||out - ref||_2 / ||ref||_2 over all T*f outputs (fp32)."""
    o = out.detach().float()
    if not bool(torch.isfinite(o).all()):
        return {"max_rel_err": None, "rel_l2_err": None, "nonfinite": True}
    diff = o - ref
    return {"max_rel_err": float(diff.abs().max() / ref.abs().max().clamp_min(1e-30)),
            "rel_l2_err": float(diff.norm() / ref.norm().clamp_min(1e-30)), "nonfinite": False}


def _message(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _is_refusal(e: BaseException) -> bool:
    """torch refusing a shape (its checks raise RuntimeError / NotImplementedError / ValueError), not an
    out-of-memory or a bug of ours (TypeError, IndexError, ...)."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return False
    return isinstance(e, (RuntimeError, NotImplementedError, ValueError))


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def new_result(spec: ArmSpec) -> dict:
    return {"name": spec.name, "kind": spec.kind, "path": spec.path, "format": spec.fmt, "status": None,
            "reason": None, "fwd_ms": None, "fwdbwd_ms": None, "bytes": None, "pct_of_floor": None,
            "pct_of_copy_bw": None, "achieved_GBps": None, "tflops": None, "max_rel_err": None,
            "rel_l2_err": None, "max_rel_err_dequant": None, "rel_l2_err_dequant": None, "peak_mem_bytes": None,
            "storage_bytes": None, "dropped_fraction": None, "grads": None, "sync_free": None, "sync_ops": [],
            "warnings": [], "w_down_layout": spec.w_down_layout, "fwd_graph_ms": None, "fwdbwd_graph_ms": None,
            "rates_from": None,
            # the precision of the activations in the products (tsct.dispatch.COMPUTES; bf16 for the baselines)
            "activations": "nvfp4" if spec.path == dispatch.SM120_FP4 else "bf16"}


def measure_arm(spec: ArmSpec, ctx: Context, fac: Factors, pass_fn: Callable[[InputSet], Tensor], *,
                refusal_status: str = ERROR, before_timing: Optional[Callable] = None,
                after_timing: Optional[Callable] = None, graph: bool = True,
                log: Callable[[str], None] = lambda s: None) -> dict:
    """Run, check and time one arm; every failure is recorded in the result, never raised.

    1. One call on input set 0 (untimed): an exception here is recorded with its message, as ``refused``
       when ``refusal_status`` is REFUSED and torch rejected the call (``_is_refusal``), else ``error``.
       Its output is compared with the fp32 reference(s).
    2. CUDA: one untimed forward+backward under torch's sync debug mode (``measure.sync_check``):
       ``sync_free`` / ``sync_ops``.
    3. Forward timed (``measure.time_calls``), then forward+backward (unless --no-backward); on CUDA,
       when the pass is sync-free and ``graph``, both again as CUDA-graph replays (``measure.time_graph``:
       device time without the host's share; a capture failure is a warning).
    4. Peak memory of one more call (forward+backward, or forward), relative to what was allocated.
    """
    cfg, dev = ctx.cfg, ctx.device
    res = new_result(spec)
    res["storage_bytes"] = fac.storage_bytes()
    res["bytes"] = counts.bytes_moved(cfg.tokens, cfg.d, cfg.f, res["storage_bytes"],
                                      torch.empty((), dtype=cfg.torch_dtype).element_size())
    leaves_of = lambda inp: [inp.x, inp.weights] + fac.leaves()  # noqa: E731
    res["grads"] = ["x", "router_weights"] + fac.leaf_names()

    def fwd(i: int):
        return pass_fn(ctx.sets[i])

    def fwdbwd(i: int):
        inp = ctx.sets[i]
        out = pass_fn(inp)
        return torch.autograd.grad(out, leaves_of(inp), inp.grad_out)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            log(f"{spec.name}: first call and check")
            try:
                out = fwd(0)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            except Exception as e:  # noqa: BLE001  (recorded, not raised)
                refused = refusal_status == REFUSED and _is_refusal(e)
                res["status"], res["reason"] = (REFUSED if refused else ERROR), _message(e)
                if not refused:
                    res["traceback"] = traceback.format_exc(limit=6)
                return res
            res.update(rel_errors(out, ctx.ref))
            if spec.fmt in ctx.ref_dequant:
                e2 = rel_errors(out, ctx.ref_dequant[spec.fmt])
                res["max_rel_err_dequant"], res["rel_l2_err_dequant"] = e2["max_rel_err"], e2["rel_l2_err"]
            del out
            res["status"] = RAN
            if before_timing:
                before_timing()
            try:
                try:  # one more untimed call, watched for host syncs (CUDA only)
                    res["sync_free"], res["sync_ops"] = measure.sync_check(
                        (lambda: fwdbwd(0)) if cfg.backward else (lambda: fwd(0)), dev)
                except Exception:  # noqa: BLE001  (a failing backward is reported by its timing below)
                    res["sync_free"], res["sync_ops"] = measure.sync_check(lambda: fwd(0), dev)
                kw = dict(warmup=cfg.warmup, iters=cfg.iters, min_iters=cfg.min_iters, max_seconds=cfg.max_seconds,
                          n_sets=len(ctx.sets))
                log(f"{spec.name}: timing forward")
                res["fwd_ms"] = measure.time_calls(fwd, dev, **kw)
                if cfg.backward:
                    log(f"{spec.name}: timing forward+backward")
                    try:
                        res["fwdbwd_ms"] = measure.time_calls(fwdbwd, dev, **kw)
                    except Exception as e:  # noqa: BLE001
                        res["reason"] = f"backward failed: {_message(e)}"
                        res["traceback"] = traceback.format_exc(limit=6)
                # a host sync cannot be captured; the bmm path captures its static layout (no host read) instead
                if graph and dev.type == "cuda" and (res["sync_free"] or spec.path == dispatch.BMM):
                    log(f"{spec.name}: timing CUDA-graph replay")
                    gkw = dict(n_sets=len(ctx.sets), replays=max(5, min(cfg.iters, 30)))
                    try:
                        res["fwd_graph_ms"] = measure.time_graph(fwd, dev, **gkw)
                        if res["fwdbwd_ms"] is not None:
                            res["fwdbwd_graph_ms"] = measure.time_graph(fwdbwd, dev, **gkw)
                    except Exception as e:  # noqa: BLE001  (recorded: the eager times stand)
                        warnings.warn(f"CUDA-graph timing failed: {_message(e)}")
                        _free(dev)
                res["peak_mem_bytes"] = measure.peak_memory(
                    lambda: fwdbwd(0) if res["fwdbwd_ms"] is not None else fwd(0), dev)
            finally:
                if after_timing:
                    after_timing()
        except Exception as e:  # noqa: BLE001
            res["status"], res["reason"] = ERROR, _message(e)
            res["traceback"] = traceback.format_exc(limit=6)
        finally:
            res["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
            _free(dev)
    _add_rates(res, ctx)
    return res


def _add_rates(res: dict, ctx: Context) -> None:
    """% of floor, GB/s and TFLOP/s from the CUDA-graph medians where the arm has them (device time: the
    eager one is host time on a slow host), else from the eager medians; ``rates_from`` says which."""
    cfg = ctx.cfg
    flops = counts.useful_flops(cfg.routed_rows, cfg.d, cfg.r, cfg.f)
    graph = bool(res.get("fwd_graph_ms"))
    res["rates_from"] = "graph" if graph else ("eager" if res["fwd_ms"] else None)
    tf_src = res["fwd_graph_ms"] if graph else res["fwd_ms"]
    tfb_src = res["fwdbwd_graph_ms"] if graph else res["fwdbwd_ms"]
    t_f = tf_src["median"] * 1e-3 if tf_src else None
    t_fb = tfb_src["median"] * 1e-3 if tfb_src else None
    if t_f:
        floor_s = ctx.bytes_floor / (ctx.copy_GBps * 1e9)
        res["pct_of_floor"] = 100.0 * floor_s / t_f
        res["pct_of_copy_bw"] = 100.0 * (res["bytes"] / (ctx.copy_GBps * 1e9)) / t_f
        res["achieved_GBps"] = res["bytes"] / t_f / 1e9
    res["tflops"] = {"fwd": flops / t_f / 1e12 if t_f else None,
                     "fwdbwd": (1 + counts.BACKWARD_FLOPS_FACTOR) * flops / t_fb / 1e12 if t_fb else None}


# ---- one function per arm kind ----------------------------------------------------------------------

def padded_bmm_arm(spec: ArmSpec, ctx: Context, log=lambda s: None) -> dict:
    cfg = ctx.cfg
    res = measure_arm(spec, ctx, ctx.dense, lambda inp: padded_bmm_pass(cfg, inp, ctx.dense), log=log)
    with torch.no_grad():
        keep = routing.capacity_slots(ctx.sets[0].ids, cfg.experts, cfg.capacity).keep
        res["dropped_fraction"] = float(1.0 - keep.float().mean())
    res["capacity"] = cfg.capacity
    return res


def grouped_mm_arm(spec: ArmSpec, ctx: Context, log=lambda s: None) -> dict:
    gmm, what = grouped_mm_function()
    if gmm is None:
        res = new_result(spec)
        res["status"], res["reason"] = UNAVAILABLE, f"not available: {what}"
        return res
    cfg = ctx.cfg
    size = torch.empty((), dtype=cfg.torch_dtype).element_size()
    odd = [f"{n} = {v}" for n, v in (("d", cfg.d), ("r", cfg.r), ("f", cfg.f)) if v * size % 16]
    if odd:  # torch's grouped GEMM raises "strides should be multiple of 16 bytes" for these
        res = new_result(spec)
        res["status"] = REFUSED
        res["reason"] = (f"{what} needs rows of 16-byte multiples; {', '.join(odd)} is not a multiple of "
                         f"{16 // size} at {cfg.dtype} (an expected refusal for this shape)")
        return res
    res = measure_arm(spec, ctx, ctx.dense, lambda inp: grouped_mm_pass(ctx.cfg, inp, ctx.dense, gmm),
                      refusal_status=REFUSED, log=log)
    res["function"] = what
    res["dropped_fraction"] = 0.0 if res["status"] == RAN else None
    return res


def tsct_arm(spec: ArmSpec, ctx: Context, log=lambda s: None) -> dict:
    from tsct import config as tsct_config

    st = dispatch.status(spec.path, ctx.capability, spec.fmt, dispatch.DTYPE_NAMES[ctx.cfg.torch_dtype])
    fac = ctx.formats.get(spec.fmt)
    if not st.ok or not isinstance(fac, Factors):
        res = new_result(spec)
        res["status"] = UNAVAILABLE
        res["reason"] = st.reason if not st.ok else (fac or f"format {spec.fmt!r} was not prepared")
        if isinstance(fac, Factors):
            res["storage_bytes"] = fac.storage_bytes()
        return res
    saved = tsct_config.check_values

    def no_value_checks():  # the first (checked) call validated offs / indices; timing must be sync-free
        tsct_config.check_values = False

    def restore():
        tsct_config.check_values = saved

    ste = spec.name.endswith("-ste")
    masters = (ctx.dense.w_gate, ctx.dense.w_up, ctx.dense.w_down) if ste else None
    if spec.w_down_layout == "kmajor":
        fac = kmajor_factors(fac)

    def pass_fn(inp: InputSet) -> Tensor:
        return tsct_call(inp.x, inp.ids, inp.weights, fac, ctx.cfg.experts, spec.path, masters)

    # STE arms: not graph-timed (the quantized-master cache would hold tensors of the graph's pool)
    res = measure_arm(spec, ctx, _WithMasters(fac, ctx.dense) if ste else fac, pass_fn,
                      before_timing=no_value_checks, after_timing=restore, graph=not ste, log=log)
    res["dropped_fraction"] = 0.0 if res["status"] == RAN else None
    return res


RUNNERS = {PADDED_BMM: padded_bmm_arm, GROUPED_MM: grouped_mm_arm, TSCT: tsct_arm}


def run_arm(spec: ArmSpec, ctx: Context, log=lambda s: None) -> dict:
    if spec.kind in (PADDED_BMM, GROUPED_MM) and not isinstance(ctx.dense.w_gate, Tensor):
        raise AssertionError("baselines need dense factors")
    return RUNNERS[spec.kind](spec, ctx, log=log)
