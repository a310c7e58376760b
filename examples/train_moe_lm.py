#!/usr/bin/env python3
"""Train a small byte-level MoE language model once per expert layer and compare the loss curves (an A/B of
``tsct.nn`` against the padded bmm on real text).

Every arm builds the same model from the same seed (same initial weights: the expert layers share one parameter
layout), sees the same batches in the same order and is trained with the same optimizer; only the expert layer
differs:

    exact            PaddedBmmGLUExperts(capacity_factor=None, intermediates="fp32"): torch.bmm with every
                     expert's rows, nothing dropped, bf16 operands and everything after them in fp32 (the math of
                     tsct's float oracle, written without tsct)
    exact-replicate  the exact arm again from initial weights moved by one part in a million (each parameter
                     times 1 + 1e-6 N(0, 1)): its gap to the exact arm is the run-to-run noise of one computation
    padded-bmm       PaddedBmmGLUExperts(capacity_factor=2): what MoE code runs today; its dropped-row fraction
                     is logged per step
    tsct-bf16        GroupedGLUExperts(storage="bf16")
    tsct-nvfp4-ste   GroupedGLUExperts(storage="nvfp4"): NVFP4 factors trained straight-through from fp32 masters
    tsct-sign-ste    GroupedGLUExperts(storage="sign"): 1-bit sign factors, likewise

Text: the standard library's ``.py`` sources of the running Python, split into train and validation by file
(about 5 % of the files, chosen by a CRC32 of the path). Model: byte embedding, ``--blocks`` pre-norm blocks of
causal attention and a top-k MoE feed-forward (router -> experts [T, f] -> shared down-projection [f, d]), a
Switch-style load-balancing loss.

The gate: tsct-bf16 computes what the exact layer computes, within 1 %, over the whole run. Two independent
training runs of one computation do not stay within 1 % of each other: routing is a top-k of near ties and Adam
turns gradient differences at the rounding level into sign flips of updates, so two runs whose weights differ in
the sixth digit are decorrelated by step 100 and their validation losses wander apart by about a percent
(``exact-replicate`` measures it). So the gate pairs the two layers on one trajectory: at every evaluation the
tsct-bf16 arm's parameters are also run through the exact layer, and (1) the validation loss must be within 1 %
of tsct-bf16's and (2) the gradient of the training loss on the first validation batch, per parameter tensor
(relative Frobenius error), within max(1 %, 2 x that tensor's bf16 rounding noise): the same parameters through
the exact layer with its GEMM operands rounded as bf16 tensor-core kernels round them
(``PaddedBmmGLUExperts(intermediates="tensor-core")``) against the exact layer. The router's gradient cancels
(a softmax Jacobian over near-equal scores) and amplifies those roundings to several percent on a GPU, where a
wrong layer (a missing or scaled gradient, dropped rows) still stands out. The independent curves' gaps (every arm
against exact) are reported next to the noise band (max |gap| of exact-replicate), not gated.

Output (``--out DIR``): ``<date>_<device>_moe-lm_<commit>.json`` with the curves, tokens per second and peak
memory per arm, and a PNG of the curves when matplotlib is installed (``--plot FILE.json`` draws it later).

    python examples/train_moe_lm.py --out bench/results                      # the GPU configuration
    python examples/train_moe_lm.py --preset cpu --out /tmp/lm               # a tiny CPU run
    python examples/train_moe_lm.py --plot bench/results/<file>.json         # the PNG from the JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import sysconfig
import time
import zlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

# tsct is imported where it is used, so that ``--plot`` runs where only matplotlib is installed

ARMS = ("exact", "exact-replicate", "padded-bmm", "tsct-bf16", "tsct-nvfp4-ste", "tsct-sign-ste")
GATED_ARM, REFERENCE_ARM, NOISE_ARM, GATE = "tsct-bf16", "exact", "exact-replicate", 0.01
#: a tensor's gradient may differ from the exact layer's by this multiple of the bf16-rounding noise (the exact
#: layer with rounded GEMM operands against the exact layer) where that noise exceeds GATE / GRAD_NOISE_FACTOR
GRAD_NOISE_FACTOR = 2.0
ROUNDED_LAYER = "exact-rounded"
REPLICATE_EPS = 1e-6  # relative perturbation of the noise arm's initial weights
VOCAB = 256  # bytes

PRESETS = {
    # H200: 62M parameters (59M in experts), 16k tokens per step
    "gpu": dict(device="cuda", dtype="bf16", d=384, heads=6, blocks=4, experts=128, r=64, f=1023, topk=2, batch=64,
                seq=256, steps=3000, eval_every=100, val_batches=8, lr=2e-3, warmup=100, time_budget=220.0,
                calib_steps=16),
    # CI: seconds on two CPU cores
    "cpu": dict(device="cpu", dtype="fp32", d=64, heads=2, blocks=2, experts=8, r=16, f=63, topk=2, batch=4, seq=32,
                steps=6, eval_every=3, val_batches=2, lr=3e-3, warmup=2, time_budget=0.0, calib_steps=0),
}


@dataclasses.dataclass
class Config:
    device: str = "cuda"
    dtype: str = "bf16"          # autocast dtype; "fp32" runs without autocast
    d: int = 384
    heads: int = 6
    blocks: int = 4
    experts: int = 128
    r: int = 64
    f: int = 1023
    topk: int = 2
    capacity_factor: float = 2.0  # of the padded-bmm arm
    aux_coef: float = 0.01
    batch: int = 64
    seq: int = 256
    steps: int = 3000
    eval_every: int = 100
    val_batches: int = 8
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    impl: str = "auto"            # of the tsct arms
    time_budget: float = 220.0    # seconds for calibration and all arms' training; 0: run --steps as given
    calib_steps: int = 16         # steps per arm timed first to fit --steps into --time-budget
    arms: tuple = ARMS


# ---- data -----------------------------------------------------------------------------------------------

def load_corpus(val_percent: int = 5) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The standard library's .py sources as bytes: (train uint8 [N], validation uint8 [N_val], description).
    A file goes to validation when CRC32(relative path) % 100 < val_percent; files are joined in sorted order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not {"site-packages", "dist-packages", "__pycache__"} & set(p.parts) and p.is_file())
    parts = {"train": [], "val": []}
    for p in files:
        rel = str(p.relative_to(root)).replace(os.sep, "/")
        parts["val" if zlib.crc32(rel.encode()) % 100 < val_percent else "train"].append(p.read_bytes())
    data = {k: torch.frombuffer(bytearray(b"\n".join(v)), dtype=torch.uint8) for k, v in parts.items()}
    info = {"source": str(root), "python": platform.python_version(), "files_train": len(parts["train"]),
            "files_val": len(parts["val"]), "bytes_train": data["train"].numel(), "bytes_val": data["val"].numel()}
    return data["train"], data["val"], info


def windows(data: torch.Tensor, starts: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) int64 [len(starts), seq] from byte windows data[s : s + seq + 1]."""
    idx = starts.unsqueeze(1) + torch.arange(seq + 1)
    w = data[idx].long()
    return w[:, :-1], w[:, 1:]


# ---- the model ----------------------------------------------------------------------------------------------

class MoEBlock(nn.Module):
    """Pre-norm block: causal self-attention, then a top-k MoE feed-forward whose experts return [T, f] and a
    shared down-projection [f, d] brings it back to the model width."""

    def __init__(self, cfg: Config, experts: nn.Module):
        super().__init__()
        d = cfg.d
        self.heads, self.topk, self.num_experts = cfg.heads, cfg.topk, cfg.experts
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.router = nn.Linear(d, cfg.experts, bias=False)
        self.experts = experts
        self.down = nn.Linear(cfg.f, d, bias=False)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, s, d))
        x = self.ln2(h).reshape(b * s, d)
        probs = torch.softmax(self.router(x).float(), -1)
        w, ids = probs.topk(self.topk, -1)
        w = w / w.sum(-1, keepdim=True)
        y = self.experts(x, ids, w)  # [T, f]
        h = h + self.down(y).view(b, s, d)
        # Switch-style load balance: E * sum_e (share of routed rows to e) * (mean router probability of e)
        from tsct.nn.capacity import expert_counts
        share = expert_counts(ids.reshape(-1), self.num_experts).float() / ids.numel()
        aux = self.num_experts * (share * probs.mean(0)).sum()
        return h, aux


class ByteMoELM(nn.Module):
    def __init__(self, cfg: Config, make_experts):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, cfg.d)
        self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.d))
        self.blocks = nn.ModuleList(MoEBlock(cfg, make_experts()) for _ in range(cfg.blocks))
        self.ln = nn.LayerNorm(cfg.d)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        aux = h.new_zeros((), dtype=torch.float32)
        for blk in self.blocks:
            h, a = blk(h)
            aux = aux + a
        return self.ln(h) @ self.embed.weight.t(), aux / len(self.blocks)  # tied output head


def make_experts(cfg: Config, arm: str):
    from tsct.nn import GroupedGLUExperts, PaddedBmmGLUExperts

    args = (cfg.experts, cfg.d, cfg.r, cfg.f)
    if arm in (REFERENCE_ARM, NOISE_ARM):
        return lambda: PaddedBmmGLUExperts(*args, capacity_factor=None, intermediates="fp32")
    if arm == ROUNDED_LAYER:  # not an arm: the gate's noise reference
        return lambda: PaddedBmmGLUExperts(*args, capacity_factor=None, intermediates="tensor-core")
    if arm == "padded-bmm":
        return lambda: PaddedBmmGLUExperts(*args, capacity_factor=cfg.capacity_factor)
    storage = {"tsct-bf16": "bf16", "tsct-nvfp4-ste": "nvfp4", "tsct-sign-ste": "sign"}[arm]
    return lambda: GroupedGLUExperts(*args, storage=storage, impl=cfg.impl)


# ---- training -----------------------------------------------------------------------------------------------

class Arm:
    """One arm's model, optimizer and schedule, built from the seed."""

    def __init__(self, cfg: Config, arm: str, steps: int):
        self.cfg, self.name = cfg, arm
        self.dev = torch.device(cfg.device)
        torch.manual_seed(cfg.seed)  # the same initial weights in every arm
        self.model = ByteMoELM(cfg, make_experts(cfg, arm))
        if arm == NOISE_ARM:
            g = torch.Generator().manual_seed(cfg.seed + 1)
            with torch.no_grad():
                for p in self.model.parameters():
                    p.mul_(1 + REPLICATE_EPS * torch.randn(p.shape, generator=g))
        self.model.to(self.dev)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and n != "pos"]
        other = [p for n, p in self.model.named_parameters() if not (p.dim() >= 2 and n != "pos")]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
        warm = max(1, min(cfg.warmup, steps // 10))

        def lr_at(i):  # linear warmup, cosine decay to 10 %
            if i < warm:
                return (i + 1) / warm
            return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (i - warm) / max(1, steps - warm))))

        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_at)

    def autocast(self):
        on = self.cfg.dtype != "fp32"
        return torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=on)

    def backward(self, model: nn.Module, inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """The training loss of ``model`` on one batch, its gradient (with the load-balancing term) accumulated."""
        with self.autocast():
            logits, aux = model(inp)
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tgt.reshape(-1))
        (loss + self.cfg.aux_coef * aux).backward()
        return loss

    def step(self, inp: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        loss = self.backward(self.model, inp, tgt)
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        dropped = [b.experts.dropped_fraction for b in self.model.blocks
                   if getattr(b.experts, "dropped_fraction", None) is not None]
        return loss.detach(), (torch.stack(dropped).mean() if dropped else None)

    @torch.no_grad()
    def evaluate(self, val: list, model: Optional[nn.Module] = None) -> float:
        """Mean validation loss (nats per byte) of this arm's model, or of ``model``, over the batches ``val``."""
        model = self.model if model is None else model
        total = 0.0
        for inp, tgt in val:
            with self.autocast():
                logits, _ = model(inp)
            total += F.cross_entropy(logits.float().reshape(-1, VOCAB), tgt.reshape(-1)).item()
        return total / len(val)

    def paired(self, exact: nn.Module, rounded: nn.Module, val: list) -> dict:
        """This arm's parameters run through the exact layer (``exact``) and through the exact layer with the
        GEMM operands rounded as bf16 tensor-core kernels round them (``rounded``; both overwritten here).
        Returns the validation loss through the exact layer and, per parameter tensor, the relative Frobenius
        error of this arm's gradient of the training loss on ``val[0]`` against the exact layer's (``err``) and
        the rounded layer's against it (``noise``: what the same math with a bf16 GPU's roundings shows). A
        tensor passes with ``err <= max(GATE, GRAD_NOISE_FACTOR * noise)``; the worst tensor is the one with the
        largest ``err / allowed``. Per tensor, so that a wrong gradient of a small tensor (a scale, the router)
        is not lost in the whole model's norm; a missing gradient counts as zeros."""
        exact.load_state_dict(self.model.state_dict())
        rounded.load_state_dict(self.model.state_dict())
        val_loss = self.evaluate(val, exact)
        grads = []
        for m in (self.model, exact, rounded):
            self.backward(m, *val[0])
            grads.append({n: p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
                          for n, p in m.named_parameters()})
            m.zero_grad(set_to_none=True)

        def rel(a: dict, n: str) -> float:
            g = grads[1][n]
            return ((a[n] - g).norm() / g.norm().clamp_min(torch.finfo(torch.float32).tiny)).item()

        err = {n: rel(grads[0], n) for n in grads[1]}
        noise = {n: rel(grads[2], n) for n in grads[1]}
        allowed = {n: max(GATE, GRAD_NOISE_FACTOR * noise[n]) for n in err}
        worst = max(err, key=lambda n: err[n] / allowed[n])
        return {"val_loss": val_loss, "err": err[worst], "noise": noise[worst], "tensor": worst,
                "pass": all(err[n] <= allowed[n] for n in err)}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def calibrate(cfg: Config, batches, val, log, t_start: float) -> int:
    """Steps that fit the whole run (from ``t_start``, calibration included) into ``cfg.time_budget`` seconds: time
    ``calib_steps`` steps and one evaluation per arm (the first half of the steps warms up: kernels load or
    compile, caches fill), then solve for the step count (a multiple of ``eval_every``, at most ``cfg.steps``)."""
    per_step, per_eval = 0.0, 0.0
    dev = torch.device(cfg.device)
    n = max(2, cfg.calib_steps)
    for arm in cfg.arms:
        a = Arm(cfg, arm, n)
        for i in range(n):
            if i == n // 2:
                sync(dev)
                t0 = time.perf_counter()
            a.step(*batches(i))
        sync(dev)
        t1 = time.perf_counter()
        a.evaluate(val)
        t2 = time.perf_counter()
        per_step += (t1 - t0) / (n - n // 2)
        per_eval += t2 - t1
        log(f"calibrate {arm}: {1e3 * (t1 - t0) / (n - n // 2):.1f} ms/step, eval {t2 - t1:.2f} s")
        del a
    # 10 % margin for the timing noise of a short calibration; ~2 s to build each arm
    left = 0.9 * (cfg.time_budget - (time.perf_counter() - t_start)) - 2.0 * len(cfg.arms)
    steps = int((left - per_eval) / (per_step + per_eval / cfg.eval_every))
    steps = max(cfg.eval_every, min(cfg.steps, steps // cfg.eval_every * cfg.eval_every))
    log(f"calibrate: {steps} steps per arm fit {cfg.time_budget:.0f} s ({1e3 * per_step:.1f} ms per step of all arms)")
    return steps


def train_arm(cfg: Config, arm: str, steps: int, batches, val, log) -> dict:
    dev = torch.device(cfg.device)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    from tsct import dispatch
    dispatch.reset_fallback_counts()
    a = Arm(cfg, arm, steps)
    # the gated arm's parameters are also run through the exact layer at every evaluation (the gate)
    exact = ByteMoELM(cfg, make_experts(cfg, REFERENCE_ARM)).to(dev) if arm == GATED_ARM else None
    rounded = ByteMoELM(cfg, make_experts(cfg, ROUNDED_LAYER)).to(dev) if arm == GATED_ARM else None
    paired = {"val_loss_exact_layer": [], "grad_rel_error": [], "grad_noise": [], "grad_worst_tensor": [],
              "grad_pass": []}
    losses = torch.zeros(steps, device=dev)
    dropped = torch.zeros(steps, device=dev)
    val_steps, val_loss = [], []
    train_s = 0.0
    sync(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        loss, drop = a.step(*batches(i))
        losses[i] = loss
        if drop is not None:
            dropped[i] = drop
        if (i + 1) % cfg.eval_every == 0 or i + 1 == steps:
            sync(dev)
            t1 = time.perf_counter()
            train_s += t1 - t0
            val_steps.append(i + 1)
            val_loss.append(a.evaluate(val))
            msg = f"{arm}: step {i + 1}/{steps} train {losses[i].item():.4f} val {val_loss[-1]:.4f}"
            if exact is not None:
                pr = a.paired(exact, rounded, val)
                paired["val_loss_exact_layer"].append(round(pr["val_loss"], 5))
                paired["grad_rel_error"].append(round(pr["err"], 7))
                paired["grad_noise"].append(round(pr["noise"], 7))
                paired["grad_worst_tensor"].append(pr["tensor"])
                paired["grad_pass"].append(pr["pass"])
                msg += (f" (through the exact layer {pr['val_loss']:.4f}; gradient rel. error {pr['err']:.2e} at "
                        f"{pr['tensor']}, bf16 rounding noise there {pr['noise']:.2e})")
            log(msg)
            sync(dev)
            t0 = time.perf_counter()
    res = {
        "layer": repr(a.model.blocks[0].experts),
        "params": sum(p.numel() for p in a.model.parameters()),
        "expert_params": sum(p.numel() for b in a.model.blocks for p in b.experts.parameters()),
        "train_loss": [round(v, 5) for v in losses.tolist()],
        "val_step": val_steps,
        "val_loss": [round(v, 5) for v in val_loss],
        "train_seconds": round(train_s, 3),
        "tokens_per_s": round(steps * cfg.batch * cfg.seq / train_s, 1),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
        "fallbacks": dispatch.fallback_records(),
    }
    if arm == "padded-bmm":
        res["dropped_fraction"] = [round(v, 5) for v in dropped.tolist()]
    if exact is not None:
        res["paired"] = paired
    return res


def gaps(arms: dict) -> dict:
    """Per arm: (val loss - exact's) / exact's at every evaluation of independent training runs; the largest |gap|
    and the final gap."""
    ref = arms.get(REFERENCE_ARM)
    out = {}
    for name, a in arms.items():
        if ref is None or name == REFERENCE_ARM:
            continue
        g = [(v - r) / r for v, r in zip(a["val_loss"], ref["val_loss"])]
        out[name] = {"rel_gap": [round(x, 6) for x in g], "max_abs_rel_gap": round(max(map(abs, g)), 6),
                     "final_rel_gap": round(g[-1], 6)}
    return out


# ---- provenance and files -----------------------------------------------------------------------------------

def gate_of(arms: dict, g: dict) -> Optional[dict]:
    """The gate (module docstring) from the gated arm's paired evaluations; the independent curves' gap and the
    noise band beside it. None without the gated arm."""
    a = arms.get(GATED_ARM)
    if a is None:
        return None
    p = a["paired"]
    val_gap = [(v - r) / r for v, r in zip(a["val_loss"], p["val_loss_exact_layer"])]
    paired_val = max(map(abs, val_gap))
    paired_grad = max(p["grad_rel_error"])
    gate = {"arm": GATED_ARM, "reference": REFERENCE_ARM, "threshold": GATE,
            "paired_val_rel_gap": [round(x, 7) for x in val_gap],
            "paired_val_max_abs_rel_gap": round(paired_val, 7), "paired_grad_max_rel_error": round(paired_grad, 7),
            "grad_noise_factor": GRAD_NOISE_FACTOR, "paired_grad_pass": all(p["grad_pass"]),
            "pass": paired_val <= GATE and all(p["grad_pass"]),
            "trajectory_max_abs_rel_gap": g[GATED_ARM]["max_abs_rel_gap"] if GATED_ARM in g else None,
            "noise_band": g[NOISE_ARM]["max_abs_rel_gap"] if NOISE_ARM in g else None}
    return gate


def device_name(cfg: Config) -> tuple[str, str]:
    """(full name, short name for file names)."""
    if cfg.device.startswith("cuda"):
        from tsct.bench.measure import gpu_tag

        full = torch.cuda.get_device_name(torch.device(cfg.device))
        return full, gpu_tag(full)
    return platform.processor() or platform.machine(), "cpu"


def source_commit() -> tuple[str, Optional[bool]]:
    """(short commit, dirty) of the tsct that runs: the wheel's build commit, else this checkout's git."""
    import tsct

    commit = getattr(tsct, "__git_commit__", None)
    if commit:
        return commit[:7], bool(getattr(tsct, "_build_dirty", False))
    here = pathlib.Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, check=True).stdout.strip())
        return commit, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None


def plot(json_path: pathlib.Path, png_path: Optional[pathlib.Path] = None) -> Optional[pathlib.Path]:
    """Draw the curves of a result JSON: validation loss per arm, the smoothed training loss, and each arm's
    relative gap to the exact layer. Returns the PNG path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    res = json.loads(pathlib.Path(json_path).read_text())
    png_path = pathlib.Path(png_path or pathlib.Path(json_path).with_suffix(".png"))
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    color = {name: f"C{i}" for i, name in enumerate(ARMS)}
    for name, a in res["arms"].items():
        label = name
        if "dropped_fraction" in a:
            drop = 100 * sum(a["dropped_fraction"]) / len(a["dropped_fraction"])
            label += f" (cf {res['config']['capacity_factor']:g}: {drop:.1f} % of rows dropped)"
        ax[0].plot(a["val_step"], a["val_loss"], marker=".", label=label, color=color.get(name))
        tl = a["train_loss"]
        ema, sm = tl[0], []
        for v in tl:
            ema = 0.98 * ema + 0.02 * v
            sm.append(ema)
        ax[1].plot(range(1, len(sm) + 1), sm, label=name, color=color.get(name))
    for name, g in res.get("gaps", {}).items():
        ax[2].plot(res["arms"][name]["val_step"], [100 * x for x in g["rel_gap"]], marker=".", label=name,
                   color=color.get(name))
    gate = res.get("gate") or {}
    if "paired_val_rel_gap" in gate:
        ax[2].plot(res["arms"][GATED_ARM]["val_step"], [100 * x for x in gate["paired_val_rel_gap"]], marker="x",
                   color="k", label=f"{GATED_ARM} vs the {REFERENCE_ARM} layer, same parameters (gated)")
    ax[2].axhspan(-100 * GATE, 100 * GATE, color="0.9", label=f"gate: +-{100 * GATE:g} %")
    ax[0].set(title="validation loss (nats/byte)", xlabel="step")
    ax[1].set(title="training loss (EMA 0.98)", xlabel="step")
    ax[2].set(title=f"validation loss vs {REFERENCE_ARM} (%)", xlabel="step")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    m = res["meta"]
    fig.suptitle(f"byte-level MoE LM, {m['device']}, tsct {m['commit']}, {m['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def parse(argv) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu", help="configuration to start from (default gpu)")
    for f in dataclasses.fields(Config):
        if f.name == "arms":
            p.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)}")
        else:
            p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    p.add_argument("--out", type=pathlib.Path, help="directory for the JSON (and PNG)")
    p.add_argument("--plot", type=pathlib.Path, metavar="FILE.json", help="only draw FILE.png from a result JSON")
    p.add_argument("--require-gate", action="store_true", help="exit 1 when the gate fails")
    a = p.parse_args(argv)
    if a.plot is not None:
        try:
            json.loads(a.plot.read_text())
        except (OSError, ValueError) as e:
            p.error(f"--plot {a.plot}: not a readable result JSON ({e})")
        return None, a
    if a.out is None:
        p.error("--out DIR is required")
    try:  # before any training, not after it
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {a.out}: {e}")
    cfg = Config(**PRESETS[a.preset])
    for f in dataclasses.fields(Config):
        v = getattr(a, f.name)
        if v is not None:
            setattr(cfg, f.name, tuple(v.split(",")) if f.name == "arms" else v)
    bad = [x for x in cfg.arms if x not in ARMS]
    if bad:
        p.error(f"--arms: unknown {bad}; choose from {list(ARMS)}")
    if cfg.dtype not in ("bf16", "fp32"):
        p.error(f"--dtype must be bf16 or fp32, got {cfg.dtype!r}")
    for name in ("d", "heads", "blocks", "experts", "r", "f", "topk", "batch", "seq", "steps", "eval_every",
                 "val_batches"):
        if getattr(cfg, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.d % cfg.heads:
        p.error(f"--d ({cfg.d}) must be a multiple of --heads ({cfg.heads})")
    if cfg.topk > cfg.experts:
        p.error(f"--topk ({cfg.topk}) must not exceed --experts ({cfg.experts})")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {cfg.device} (preset {a.preset!r}) needs a CUDA GPU; --preset cpu runs on the CPU")
    from tsct import dispatch
    if cfg.impl != "auto" and cfg.impl not in dispatch.PATHS:
        p.error(f"--impl must be 'auto' or one of {list(dispatch.PATHS)}, got {cfg.impl!r}")
    return cfg, a


def main(argv=None) -> int:
    cfg, a = parse(argv)
    if cfg is None:
        png = plot(a.plot)
        print(png if png else "matplotlib is not installed: no PNG", file=sys.stderr if png is None else sys.stdout)
        return 0 if png else 1

    def log(msg):
        print(msg, flush=True)

    import tsct
    from tsct import config as tsct_config

    start = time.perf_counter()
    dev = torch.device(cfg.device)
    train, val_data, data_info = load_corpus()
    g = torch.Generator().manual_seed(cfg.seed)
    starts = torch.randint(0, train.numel() - cfg.seq - 1, (cfg.steps, cfg.batch), generator=g)
    val_starts = torch.linspace(0, val_data.numel() - cfg.seq - 1, cfg.val_batches * cfg.batch).long()
    val = [tuple(t.to(dev) for t in windows(val_data, s, cfg.seq)) for s in val_starts.split(cfg.batch)]

    def batches(i):  # step i's batch: the same for every arm
        return tuple(t.to(dev, non_blocking=True) for t in windows(train, starts[i], cfg.seq))

    # top-k routing gives valid indices by construction; the op's value checks would read them on the host in
    # every call, which the padded-bmm arm does not pay
    checks, tsct_config.check_values = tsct_config.check_values, False
    try:
        steps = calibrate(cfg, batches, val, log, start) if cfg.time_budget > 0 and cfg.calib_steps > 0 else cfg.steps
        arms = {}
        for arm in cfg.arms:
            arms[arm] = train_arm(cfg, arm, steps, batches, val, log)
            peak = arms[arm]["peak_memory_bytes"]  # None on the CPU (torch counts CUDA allocations only)
            log(f"{arm}: {arms[arm]['tokens_per_s']:.0f} tokens/s"
                + (f", peak {peak / 2**20:.0f} MiB on the device" if peak is not None else ""))
    finally:
        tsct_config.check_values = checks
    full, short = device_name(cfg)
    commit, dirty = source_commit()
    date = datetime.datetime.now(datetime.timezone.utc)
    g = gaps(arms)
    gate = gate_of(arms, g)
    res = {
        "meta": {"date": date.strftime("%Y-%m-%dT%H:%M:%SZ"), "device": full, "commit": commit, "dirty": dirty,
                 "torch": torch.__version__, "tsct": tsct.__version__, "python": platform.python_version(),
                 "argv": sys.argv[1:] if argv is None else list(argv), "steps": steps,
                 "tokens_per_step": cfg.batch * cfg.seq, "wall_seconds": round(time.perf_counter() - start, 1)},
        "config": dataclasses.asdict(cfg),
        "data": data_info,
        "arms": arms,
        "gaps": g,
        "gate": gate,
    }
    path = a.out / f"{date:%Y-%m-%d}_{short}_moe-lm_{commit}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    log(f"wrote {path}")
    png = plot(path)
    log(f"wrote {png}" if png else "matplotlib is not installed: draw the PNG later with --plot " + str(path))
    for name, x in g.items():
        log(f"{name}: validation loss vs {REFERENCE_ARM}: max |gap| {100 * x['max_abs_rel_gap']:.2f} %, "
            f"final {100 * x['final_rel_gap']:+.2f} %" + (" (the noise band)" if name == NOISE_ARM else ""))
    if gate is not None:
        log(f"gate ({GATED_ARM} within {100 * GATE:g} % of the {REFERENCE_ARM} layer on its own trajectory): "
            f"validation loss max |gap| {100 * gate['paired_val_max_abs_rel_gap']:.4f} %, gradient max rel. error "
            f"{100 * gate['paired_grad_max_rel_error']:.4f} % (every tensor within max({100 * GATE:g} %, "
            f"{GRAD_NOISE_FACTOR:g} x its bf16 rounding noise): {'yes' if gate['paired_grad_pass'] else 'no'}): "
            f"{'pass' if gate['pass'] else 'FAIL'}")
        if a.require_gate and not gate["pass"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
