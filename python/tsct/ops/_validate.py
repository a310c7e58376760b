"""Argument checks for ``grouped_glu``: every error names the argument and what was expected."""

from __future__ import annotations

import operator
from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake  # imported by torch itself

from tsct import config
from tsct.quant import is_quantized

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)


def as_int(fn: str, name: str, v):
    """A Python int from an int-like (numpy integers, 0-dim integer tensors); SymInts (torch.compile) pass through.
    TypeError naming ``fn`` and the argument for anything else: a bool, and a bool or shaped tensor (a tensor of one
    element of any shape has ``__index__``, a bool tensor too; numpy's and Python's rule: only integers count)."""
    if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
        return v
    if not isinstance(v, bool) and not (isinstance(v, Tensor) and (v.dim() or v.dtype == torch.bool)):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise TypeError(f"{fn}: {name} must be an int, got {type(v).__name__} {v!r}")


def _shape(t) -> tuple:
    return tuple(t.shape)


def check_tensor(name: str, t, *, ndim: int, dtypes=None, device=None, dtype_hint: str = "") -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"grouped_glu: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"grouped_glu: {name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dim() != ndim:
        raise ValueError(f"grouped_glu: {name} must be {ndim}-D, got shape {list(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"grouped_glu: {name} must have dtype in {[str(d) for d in dtypes]}{dtype_hint}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"grouped_glu: {name} is on {t.device}, expected {device} (the device of x)")


def _factor_shape(name: str, w) -> tuple:
    """Logical shape of a factor: a tensor's shape or a quantized container's ``shape``."""
    return tuple(w.shape)


def validate(
    x: Tensor,
    offs: Tensor,
    w_gate,
    w_up,
    w_down,
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
) -> tuple[int, int, int, int, int]:
    """Check shapes, dtypes and devices (no host read; the index values: ``check_index_values``).

    Returns (M, E, d, r, f). Raises TypeError for a wrong type/dtype, ValueError for a wrong shape,
    device or value; the message starts with ``grouped_glu: <argument>``.
    """
    check_tensor("x", x, ndim=2, dtypes=_FLOAT_DTYPES)
    dev = x.device
    t_rows, d = _shape(x)
    check_tensor("offs", offs, ndim=1, dtypes=(torch.int32,), device=dev)

    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if isinstance(w, Tensor):
            check_tensor(name, w, ndim=3, dtypes=(x.dtype,), device=dev,
                         dtype_hint=" (dense factors must match x.dtype; or pass a tsct.quant container)")
        elif is_quantized(w):
            if len(w.shape) != 3:
                raise ValueError(f"grouped_glu: {name} must have logical shape [E, K, N], got {list(w.shape)}")
            try:  # its storage as the constructor checked it (fields replaced since then are caught here)
                w.check()
            except (TypeError, ValueError) as e:
                raise type(e)(f"grouped_glu: {name}: {e}") from None
            if w.device != dev:
                raise ValueError(f"grouped_glu: {name} is on {w.device}, expected {dev} (the device of x)")
        else:
            raise TypeError(
                f"grouped_glu: {name} must be a torch.Tensor or a tsct.quant container (NVFP4Tensor, SignTensor, "
                f"FP8Tensor, TernaryTensor), got {type(w).__name__}"
            )
    shapes = {name: _factor_shape(name, w) for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down))}
    e = offs.shape[0]
    e_fac = [sh[0] for sh in shapes.values()]  # a list, not a set: symbolic sizes (make_fx, export) do not hash
    if e_fac[0] == e_fac[1] == e_fac[2] != e:  # the three factors agree on E: offs is the odd one out
        raise ValueError(f"grouped_glu: offs must have length E = {e_fac[0]} (cumulative end offsets), got {e}")
    for name, sh in shapes.items():  # else name the factor whose E differs from len(offs)
        if sh[0] != e:
            what = "[E, r, f]" if name == "w_down" else "[E, d, r]"
            raise ValueError(f"grouped_glu: {name} must be {what} with E = len(offs) = {e}, got {list(sh)}")
    _, dg, r = shapes["w_gate"]
    if dg != d:
        raise ValueError(f"grouped_glu: w_gate must be [E, d, r] with d = x.shape[1] = {d}, got {list(w_gate.shape)} "
                         "(x [T, d] and w_gate disagree on d: one of the two is wrong)")
    if shapes["w_up"] != (e, d, r):
        raise ValueError(f"grouped_glu: w_up must be [E, d, r] = {[e, d, r]} like w_gate, got {list(w_up.shape)}")
    _, rd, f = shapes["w_down"]
    if rd != r:
        raise ValueError(f"grouped_glu: w_down must be [E, r, f] with E = {e}, r = {r}, got {list(w_down.shape)}")

    for name, s in (("s_gate", s_gate), ("s_up", s_up)):
        if s is not None:
            check_tensor(name, s, ndim=2, dtypes=tuple(dict.fromkeys((x.dtype, torch.float32))), device=dev)
            if _shape(s) != (e, r):
                raise ValueError(f"grouped_glu: {name} must be [E, r] = {[e, r]}, got {list(s.shape)}")

    if gather_idx is not None:
        check_tensor("gather_idx", gather_idx, ndim=1, dtypes=_INDEX_DTYPES, device=dev)
        m = gather_idx.shape[0]
        m_src = "len(gather_idx)"
    else:
        m = t_rows
        m_src = "x.shape[0]"
    if row_weight is not None:
        check_tensor("row_weight", row_weight, ndim=1, dtypes=tuple(dict.fromkeys((x.dtype, torch.float32))),
                     device=dev)
        if row_weight.shape[0] != m:
            raise ValueError(f"grouped_glu: row_weight must be [M] with M = {m} routed rows ({m_src}), got "
                             f"{list(row_weight.shape)} (row_weight, gather_idx and scatter_idx have one entry per routed row)")
    if (scatter_idx is None) != (num_out_rows is None):
        raise ValueError("grouped_glu: scatter_idx and num_out_rows must be given together")
    if scatter_idx is not None:
        check_tensor("scatter_idx", scatter_idx, ndim=1, dtypes=_INDEX_DTYPES, device=dev)
        if scatter_idx.shape[0] != m:
            raise ValueError(f"grouped_glu: scatter_idx must be [M] with M = {m} routed rows ({m_src}), got "
                             f"{list(scatter_idx.shape)} (row_weight, gather_idx and scatter_idx have one entry per routed row)")
        if not isinstance(num_out_rows, int) or isinstance(num_out_rows, bool) or num_out_rows < 0:
            raise ValueError(f"grouped_glu: num_out_rows must be a non-negative int, got {num_out_rows!r}")

    return m, e, d, r, f


def _has_values(t: Tensor) -> bool:
    """False on the meta device (shape-only use, e.g. a model built there): no values now or later, nothing to
    check."""
    return t.device.type != "meta"


def _func_wrapped(t: Tensor) -> bool:
    """A tensor of a torch.func transform (grad, vmap): a wrapper without storage of its own."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def _values_readable(t: Tensor) -> bool:
    """Values can be read without breaking a graph capture or a trace (torch.compile, make_fx, FakeTensorMode: a
    fake tensor has no data; its values are asserted in the graph instead)."""
    if torch.compiler.is_compiling():
        return False
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return not is_fake(t)


def _assert_values_async(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows) -> None:
    """While compiling or capturing, values cannot be read: assert them on the device instead.

    A violation then fails the launch (a device-side assert: the CUDA context is lost, as with an
    out-of-range index in torch) instead of giving silently wrong rows; on the CPU it raises.
    """
    if offs.numel() == 0:
        return
    ok = (offs[0] >= 0) & (offs[-1] <= m)
    if offs.numel() > 1:
        ok = ok & (offs[1:] >= offs[:-1]).all()
    rows = torch.arange(m, device=offs.device)
    valid = rows < offs[-1]
    for idx, bound in ((gather_idx, t_rows), (scatter_idx, num_out_rows)):
        if idx is not None:
            ok = ok & ((~valid) | ((idx >= 0) & (idx < bound))).all()
    torch._assert_async(ok, "grouped_glu: offs must be non-decreasing with offs[-1] <= M, and "
                            "gather_idx/scatter_idx in range (value check under torch.compile / CUDA graph)")


# ``sort_by_expert``'s outputs, valid by construction: token -> (offs, versions, data pointers, T)
_sorted = None


def remember_sorted(token: Tensor, offs: Tensor, num_tokens: int) -> None:
    """Record that ``token`` and ``offs`` are ``tsct.ops.sort_by_expert``'s for ``num_tokens`` tokens: ``offs``
    non-decreasing with ``offs[-1] <= len(token)`` and every entry of ``token`` in ``[0, num_tokens)``, by
    construction. ``sorted_routing`` then vouches for them while both are unchanged (the same objects, storage and
    version counters). A write that does not move the version counter is not seen, as with autograd's saved tensors:
    ``.data``, DLPack or numpy views, ``untyped_storage()`` writes, and torch.distributed's in-place collectives
    (``all_reduce`` / ``broadcast`` into ``token`` or ``offs``): route such tensors through a copy. Inference
    tensors have no version counter, torch.func's wrapped tensors no storage, and traced or captured calls check on
    the device: not recorded."""
    global _sorted
    if (not _values_readable(token) or torch.is_inference(token) or torch.is_inference(offs)
            or not _has_values(token) or _func_wrapped(token) or _func_wrapped(offs)):
        return
    if _sorted is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _sorted = WeakIdKeyDictionary()
    _sorted[token] = (offs, token._version, offs._version, token.data_ptr(), offs.data_ptr(), num_tokens)


def sorted_routing(offs: Tensor, m: int, gather_idx: Optional[Tensor], t_rows: int, scatter_idx: Optional[Tensor],
                   num_out_rows: Optional[int]) -> bool:
    """The call routes through ``sort_by_expert``'s unchanged outputs (``remember_sorted``) within their bounds: the
    one token tensor as ``gather_idx`` and / or ``scatter_idx``, its ``offs``, M = its length, at least its T rows
    of x (with ``gather_idx``) and of the output (with ``scatter_idx``). Its values then pass the checks by
    construction."""
    tok = gather_idx if gather_idx is not None else scatter_idx
    if _sorted is None or tok is None or (scatter_idx is not None and scatter_idx is not tok):
        return False
    rec = _sorted.get(tok)
    if rec is None:
        return False
    r_offs, tv, ov, tp, op, t = rec
    return (r_offs is offs and tok._version == tv and offs._version == ov and tok.data_ptr() == tp
            and offs.data_ptr() == op and tok.shape[0] == m and (gather_idx is None or t_rows >= t)
            and (scatter_idx is None or num_out_rows >= t))


def check_index_values(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows, *, deferred: bool = False) -> None:
    """The value checks of ``grouped_glu`` (``tsct.config.check_values``): ``offs`` non-negative,
    non-decreasing, ``offs[-1] <= M``; ``gather_idx[:offs[-1]]`` in ``[0, x rows)``, ``scatter_idx[:offs[-1]]``
    in ``[0, num_out_rows)``. Eager: one host read (``routing_facts``), none for ``sort_by_expert``'s unchanged
    outputs (``sorted_routing``: valid by construction). Compiling or capturing: device-side asserts. ``deferred``:
    the caller reads ``routing_facts`` with its own host read and checks them with ``check_routing_facts`` (one
    sync per call instead of two). Raises ValueError naming the argument."""
    if not config.values_checked(offs) or not _has_values(offs):
        return
    if not _values_readable(offs):
        _assert_values_async(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows)
    elif not deferred and not sorted_routing(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows):
        _check_values(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows)


def routing_facts(offs: Tensor, m: int, gather_idx: Optional[Tensor], t_rows: int, scatter_idx: Optional[Tensor],
                  num_out_rows: Optional[int]) -> Tensor:
    """``[E + 6]`` int64 on ``offs``' device, computed without a host read: ``offs``, then for ``gather_idx``
    (bound: the rows of x) and ``scatter_idx`` (bound: ``num_out_rows``) over the routed rows (``[:offs[-1]]``):
    how many entries are below 0, how many at or above the bound, and the most routed rows one row of the
    bound receives (its fan; 0 for an absent index). One ``index_add_`` of counts per index."""
    o = offs.long()
    parts = [o]
    valid = torch.arange(m, device=offs.device) < o[-1] if (m and o.numel()) else None
    ones = o.new_ones(()).expand(m)
    for idx, bound in ((gather_idx, t_rows), (scatter_idx, num_out_rows)):
        if idx is None or valid is None:
            parts.append(o.new_zeros(3))
            continue
        # slots: 0 padding row, 1 below 0, 2 .. bound + 1 the rows of the bound, bound + 2 at or above it
        slot = torch.where(valid, idx.clamp(-1, bound) + 2, 0)
        cnt = o.new_zeros(bound + 3).index_add_(0, slot, ones)
        fan = cnt[2:bound + 2].amax() if bound else cnt[0] * 0
        parts.append(torch.stack([cnt[1], cnt[bound + 2], fan]))
    return torch.cat(parts)


def check_routing_facts(facts, m: int, t_rows: int, num_out_rows: Optional[int]) -> None:
    """Check ``routing_facts`` read on the host (a list of ints); ValueError naming the argument."""
    o, g, sc = facts[:-6], facts[-6:-3], facts[-3:]
    if o:
        if o[0] < 0:
            raise ValueError(f"grouped_glu: offs must be non-negative end offsets, offs[0] = {o[0]}")
        dec = np.flatnonzero(np.diff(np.asarray(o, dtype=np.int64)) < 0)
        if dec.size:
            i = int(dec[0]) + 1
            raise ValueError(f"grouped_glu: offs must be non-decreasing, offs[{i}] = {o[i]} < "
                             f"offs[{i - 1}] = {o[i - 1]}")
        if o[-1] > m:
            raise ValueError(f"grouped_glu: offs[-1] = {o[-1]} exceeds M = {m} routed rows "
                             "(len(gather_idx) when it is given, else x.shape[0])")
    for name, (below, above, _), bound in (("gather_idx", g, t_rows), ("scatter_idx", sc, num_out_rows)):
        if below or above:
            of = "the rows of x" if name == "gather_idx" else "num_out_rows"
            raise ValueError(f"grouped_glu: {name}[:offs[-1]] must lie in [0, {bound}) ({of} = {bound}), found "
                             f"{below} entries below 0 and {above} at or above {bound}")


def _check_values(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows) -> None:
    facts = routing_facts(offs, m, gather_idx, t_rows, scatter_idx, num_out_rows).tolist()
    check_routing_facts(facts, m, t_rows, num_out_rows)
