"""How a factor crosses the custom op: a format tag, its storage tensors and a gradient carrier.

A custom op takes tensors, not containers, so each factor slot (w_gate, w_up, w_down) travels as

    tag       "dense" | "nvfp4" (linear block scales) | "nvfp4-swizzled_128x4" | "sign" | "fp8" | "ternary"
    storage   the container's storage tensors in its ``_STORAGE`` order, never copied (dense: none; an
              optional one, such as an absmean ternary factor's ``scale_k``, as None); float8 tensors as their
              raw bytes (a uint8 view: float8 tensors trip torch.library's CPU checks)
    carrier   the tensor that receives the slot's gradient: a dense factor itself (also what the forward
              reads), a packed factor's MASTER (never read: it receives the straight-through gradient,
              the gradient w.r.t. the DECODED factor), or None (a frozen packed factor)

``pack`` and ``unpack`` are inverses; ``unpack`` rebuilds the container (logical shape ``[E, K, N]`` from
the first storage tensor ``[E, N, K / values per byte]``) and runs on fake tensors too.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["FACTOR_TAGS", "pack", "op_storage", "unpack", "split", "storage_count", "out_features"]

#: the format tags a factor slot may carry
FACTOR_TAGS = ("dense", "nvfp4", "nvfp4-swizzled_128x4", "sign", "fp8", "ternary")
#: storage tensors that cross the op as raw bytes: (format, field)
_RAW_BYTES = {("nvfp4", "block_scale"), ("fp8", "codes")}


class _Tables(NamedTuple):
    classes: dict          # format -> container class
    values_per_byte: dict  # format -> logical values per storage byte along K
    storage_counts: dict   # format tag -> storage tensors its slot carries


# Built on first use (tsct.quant imports the ops layer), then only read: a module global, not a functools cache,
# which torch.compile traces through with a warning that it ignores it.
_TABLES: Optional[_Tables] = None


def _tables() -> _Tables:
    global _TABLES
    if _TABLES is None:
        from tsct import quant
        from tsct.quant.formats import SIGN_PACK, TERNARY_PACK
        classes = {"nvfp4": quant.NVFP4Tensor, "sign": quant.SignTensor, "fp8": quant.FP8Tensor,
                   "ternary": quant.TernaryTensor}
        _TABLES = _Tables(classes, {"nvfp4": 2, "sign": SIGN_PACK, "fp8": 1, "ternary": TERNARY_PACK},
                          {t: 0 if t == "dense" else len(classes[_fmt(t)]._STORAGE) for t in FACTOR_TAGS})
    return _TABLES


def _fmt(tag: str) -> str:
    return tag.split("-", 1)[0]


def pack(name: str, w, for_op: bool = True) -> tuple[str, tuple[Optional[Tensor], ...]]:
    """``(tag, storage)`` of one factor: ("dense", ()) for a Tensor (it travels as its own carrier), else the
    container's format tag and storage tensors. ``for_op``: float8 storage as its raw bytes, as the custom op takes
    it (an eager call that does not cross the op keeps its own dtype: no view per tensor and call). TypeError
    naming ``name`` for anything else."""
    if isinstance(w, Tensor):
        return "dense", ()
    for fmt, cls in _tables().classes.items():
        if isinstance(w, cls):
            tag = f"{fmt}-{w.layout}" if fmt == "nvfp4" and w.layout != "linear" else fmt
            storage = tuple(getattr(w, f) for f in cls._STORAGE)
            return tag, op_storage(storage) if for_op else storage
    raise TypeError(f"grouped_glu: {name} must be a torch.Tensor, NVFP4Tensor, SignTensor, FP8Tensor or "
                    f"TernaryTensor, got {type(w).__name__}")


def op_storage(storage: Sequence[Optional[Tensor]]) -> tuple[Optional[Tensor], ...]:
    """Storage as the custom op takes it: float8 tensors (the ``_RAW_BYTES`` fields, the only float8 storage a
    container holds) as their raw bytes; the rest as it is."""
    return tuple(t.view(torch.uint8) if t is not None and t.dtype == torch.float8_e4m3fn else t for t in storage)


def storage_count(tag: str) -> int:
    """How many storage tensors a slot of format ``tag`` carries. ValueError for an unknown tag."""
    n = _tables().storage_counts.get(tag)
    if n is None:
        raise ValueError(f"grouped_glu: unknown format tag {tag!r}; expected one of {list(FACTOR_TAGS)}")
    return n


def unpack(name: str, tag: str, carrier: Optional[Tensor], storage: Sequence[Optional[Tensor]],
           trusted: bool = False):
    """The factor a path receives: the dense carrier, or the rebuilt container. ``trusted``: the storage was taken
    by ``pack`` from a container in this very call (the eager route), so the container's checks are not run again;
    the custom ops, which anyone may call, rebuild with them."""
    if storage_count(tag) != len(storage):
        raise ValueError(f"grouped_glu: {name}: format {tag!r} carries {storage_count(tag)} storage tensors, "
                         f"got {len(storage)}")
    if tag == "dense":
        if carrier is None:
            raise ValueError(f"grouped_glu: {name}: a dense factor travels as its carrier, which is None")
        return carrier
    fmt = _fmt(tag)
    cls = _tables().classes[fmt]
    fields = {f: (t.view(torch.float8_e4m3fn) if (fmt, f) in _RAW_BYTES and t.dtype == torch.uint8 else t)
              for f, t in zip(cls._STORAGE, storage)}
    e, n, kb = storage[0].shape
    if fmt == "nvfp4":
        fields["layout"] = "linear" if tag == "nvfp4" else tag[len("nvfp4-"):]
    shape = (e, _tables().values_per_byte[fmt] * kb, n)
    return cls._rebuilt(**fields, shape=shape) if trusted else cls(**fields, shape=shape)


def split(formats: str, storage: Sequence[Optional[Tensor]]) -> list[tuple[str, list]]:
    """``formats`` ("<gate>,<up>,<down>") and the flat storage of the three slots -> (tag, storage) per slot."""
    tags = formats.split(",")
    if len(tags) != 3:
        raise ValueError(f"grouped_glu: formats must be '<gate>,<up>,<down>', got {formats!r}")
    out, at = [], 0
    for tag in tags:
        k = storage_count(tag)
        out.append((tag, list(storage[at:at + k])))
        at += k
    if at != len(storage):
        raise ValueError(f"grouped_glu: formats {formats!r} carry {at} storage tensors, got {len(storage)}")
    return out


def out_features(tag: str, carrier: Optional[Tensor], storage: Sequence[Optional[Tensor]]):
    """N of a factor from its slot (f for w_down): the carrier's last dim, or dim 1 of its first storage
    tensor (``[E, N, ...]``)."""
    return carrier.shape[2] if tag == "dense" else storage[0].shape[1]
