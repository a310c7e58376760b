"""Benchmark configuration: the presets and one dataclass holding every parameter of a run.

Presets (design.md section 2 for b1):
    b1      T = 16384 tokens, top-k 2 (M = 32768 routed rows), E = 1024, d = 2048, r = 64, f = 5461, bf16
    small   T = 256, top-k 2, E = 8, d = 128, r = 16, f = 171 (odd on purpose), bf16: a CPU smoke run

Every dimension can be overridden on the command line; ``BenchConfig.resolved`` fills the defaults
that depend on the device (copy size) and checks the values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

PRESETS: dict[str, dict] = {
    "b1": dict(tokens=16384, topk=2, experts=1024, d=2048, r=64, f=5461, dtype="bf16",
               warmup=5, iters=50, max_seconds=8.0),
    "small": dict(tokens=256, topk=2, experts=8, d=128, r=16, f=171, dtype="bf16",
                  warmup=2, iters=10, max_seconds=1.0),
}

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}

#: factor storage formats; "bf16" means dense factors in the compute dtype (see ``dense_format``)
FORMATS = ("bf16", "nvfp4", "sign", "fp8", "ternary")
ROUTINGS = ("softmax", "zipf")


def canonical_dtype(name: str) -> str:
    n = DTYPE_ALIASES.get(name.lower(), name.lower())
    if n not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)} (or {sorted(DTYPE_ALIASES)}), got {name!r}")
    return n


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclasses.dataclass
class BenchConfig:
    """All parameters of one benchmark run (written verbatim into the JSON ``config``)."""

    preset: str = "b1"
    tokens: int = 16384
    topk: int = 2
    experts: int = 1024
    d: int = 2048
    r: int = 64
    f: int = 5461
    dtype: str = "bf16"
    device: str = "cpu"
    routing: str = "softmax"
    zipf_exponent: float = 1.2      # expert popularity ~ rank^-exponent (routing="zipf")
    seed: int = 0
    warmup: int = 5                 # untimed calls before each measurement
    iters: int = 50                 # timed calls per measurement (at most; see max_seconds)
    min_iters: int = 5              # timed calls per measurement (at least)
    max_seconds: float = 8.0        # cap on one measurement: iters = clamp(max_seconds / t_warm, min_iters, iters)
    capacity_factor: float = 2.0    # padded-bmm capacity C = ceil(capacity_factor * T * k / E)
    arms: tuple = ("*",)            # fnmatch patterns over arm names
    formats: tuple = FORMATS
    backward: bool = True
    input_sets: int = 2             # input sets rotated between timed calls (L2 is not what we time)
    copy_mb: Optional[int] = None   # size of the copy that measures bandwidth; default 1024 (cuda) / 64 (cpu)

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def routed_rows(self) -> int:
        """M = T * k."""
        return self.tokens * self.topk

    @property
    def capacity(self) -> int:
        """Rows per expert of the padded bmm: ceil(capacity_factor * T * k / E), at least 1."""
        return max(1, math.ceil(self.capacity_factor * self.routed_rows / self.experts))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device)

    def resolved(self) -> "BenchConfig":
        """A checked copy with device-dependent defaults filled in. Raises ValueError on bad values."""
        c = dataclasses.replace(self)
        c.dtype = canonical_dtype(c.dtype)
        if c.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be 'cpu' or 'cuda', got {c.device!r}")
        if c.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
        def flag(name: str) -> str:  # errors name the command-line flag the user typed
            return "--" + name.replace("_", "-")

        for name in ("tokens", "topk", "experts", "d", "r", "f", "iters", "min_iters", "input_sets"):
            if getattr(c, name) < 1:
                raise ValueError(f"{flag(name)} must be >= 1, got {getattr(c, name)}")
        if c.warmup < 1:
            raise ValueError(f"--warmup must be >= 1 (the first call compiles/allocates), got {c.warmup}")
        if c.topk > c.experts:
            raise ValueError(f"--topk ({c.topk}) must not exceed --experts ({c.experts})")
        if c.routing not in ROUTINGS:
            raise ValueError(f"--routing must be one of {list(ROUTINGS)}, got {c.routing!r}")
        for name in ("capacity_factor", "max_seconds", "zipf_exponent"):  # nan fails `> 0` too
            v = getattr(c, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{flag(name)} must be a finite number > 0, got {v}")
        if c.copy_mb is not None and c.copy_mb < 1:
            raise ValueError(f"--copy-mb must be >= 1, got {c.copy_mb}")
        if not c.formats:
            raise ValueError(f"--formats must name at least one of {list(FORMATS)}")
        c.min_iters = min(c.min_iters, c.iters)
        bad = [f for f in c.formats if f not in FORMATS]
        if bad:
            raise ValueError(f"--formats: unknown format(s) {bad}; expected a subset of {list(FORMATS)} ('bf16' is the "
                             f"dense factors, in the compute dtype of --dtype)")
        c.formats = tuple(c.formats)
        c.arms = tuple(c.arms)
        if c.copy_mb is None:
            c.copy_mb = 1024 if c.device == "cuda" else 64
        return c

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["formats"] = list(self.formats)
        d["arms"] = list(self.arms)
        d["routed_rows"] = self.routed_rows
        d["capacity"] = self.capacity
        return d


def from_preset(preset: str, **overrides) -> BenchConfig:
    """A config from a preset name with keyword overrides (None values are ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    values = dict(PRESETS[preset])
    values.update({k: v for k, v in overrides.items() if v is not None})
    values.setdefault("device", default_device())
    return BenchConfig(preset=preset, **values)
