"""The expert pass below ``tsct.ops.grouped_glu``: one autograd.Function over one custom-op pair, for every
factor format (dense is a format) and every path.

    primitives   ``forward`` / ``backward``: plain functions. They rebuild each factor from its slot
                 (``tsct.ops._factors``: format tag, storage tensors, gradient carrier), decode packed
                 factors for a path that reads dense ones only (``dispatch.READS_PACKED``), and call the
                 path's implementation (``dispatch.implementation(impl)``).
    custom ops   ``tsct::grouped_glu`` (``(out, saved)``: the output and what the path's backward would
                 otherwise recompute) and ``tsct::grouped_glu_backward`` (the seven gradients): the same
                 primitives behind torch.library, with fake implementations (shapes and dtypes only). They
                 are what torch.compile, FakeTensor, ``opcheck`` and other dispatcher-level tools see; a
                 compiled graph holds them as two opaque nodes and never traces into a path's Python.
    Function     ``GroupedGLU``: the primitives as one autograd formula (save, name the gradients, call the
                 backward), which is also the forward op's registered formula. A plain eager call
                 (``_eager.direct_ok``) applies the Function itself: the dispatcher layer (schema
                 defaults, pytree flattening, the aliasing check, the redispatch) costs ~0.2-0.4 ms of
                 host time per forward + backward on the H200's host (docs/performance.md) and buys
                 nothing there. Every other call (torch.compile, a FakeTensor or other dispatch mode, a
                 tensor subclass, the CPU) calls the forward op, whose formula calls the backward op.

The backward op's own formula refuses a second derivative by name. Below the op's flat schema the routing
arguments travel as one record (``Routing``), the differentiable inputs as ``Inputs`` (whose field names
are the gradients' names) and the rest as ``Call``.
"""

from __future__ import annotations

from itertools import islice
from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from tsct import config, dispatch
from tsct.kernels import replay
from tsct.kernels.layout import is_kmajor
from tsct.kernels.triton_common import runtime as C
from tsct.ops import _eager, _factors, _select

OP_NAME = "tsct::grouped_glu"
FACTOR_NAMES = ("w_gate", "w_up", "w_down")


class Routing(NamedTuple):
    """Where the routed rows come from and go (design.md section 2): ``offs`` ``[E]`` int32 END offsets;
    optional ``gather_idx`` / ``scatter_idx`` ``[M]``, ``num_out_rows`` (with ``scatter_idx``) and the
    router's ``row_weight`` ``[M]``."""
    offs: Tensor
    gather_idx: Optional[Tensor] = None
    scatter_idx: Optional[Tensor] = None
    num_out_rows: Optional[int] = None
    row_weight: Optional[Tensor] = None


class Inputs(NamedTuple):
    """The differentiable inputs, in the order every path's backward returns their gradients. A factor
    field holds the slot's gradient carrier (``tsct.ops._factors``); ``row_weight`` is ``Routing``'s."""
    x: Tensor
    w_gate: Optional[Tensor]
    w_up: Optional[Tensor]
    w_down: Optional[Tensor]
    s_gate: Optional[Tensor]
    s_up: Optional[Tensor]
    row_weight: Optional[Tensor]


class Call(NamedTuple):
    """What a call carries besides the differentiable inputs: the routing, the factor slots' format tags
    ("<gate>,<up>,<down>") and flat storage tensors, and the resolved path key (``dispatch.impl_key``)."""
    routing: Routing
    formats: str
    storage: tuple
    impl: str


# ---- primitives -------------------------------------------------------------------------------------

def _path_args(inputs: Inputs, call: Call, trusted: bool, factors: Optional[tuple] = None) -> tuple:
    """The positional arguments of a path's ``grouped_glu_forward`` (and the tail of its backward's); ``trusted``:
    the factor slots come from this eager call's own containers (``_factors.unpack``). ``factors``: those
    containers themselves (an eager forward: the slots are not unpacked again)."""
    path = call.impl.split("/", 1)[0]
    if factors is None:
        factors = [_factors.unpack(name, tag, carrier, storage, trusted) for name, carrier, (tag, storage)
                   in zip(FACTOR_NAMES, inputs[1:4], _factors.split(call.formats, call.storage))]
    facs = list(factors)
    if path not in dispatch.READS_PACKED:
        from tsct import quant
        # bmm: in storage order (K contiguous), torch.bmm takes the transposed view without a copy
        facs = [w if isinstance(w, Tensor) else quant.dequantize(w, dtype=inputs.x.dtype, contiguous=path != dispatch.BMM)
                for w in facs]
    r = call.routing
    return (inputs.x, r.offs, *facs, inputs.s_gate, inputs.s_up, inputs.row_weight, r.gather_idx, r.scatter_idx,
            r.num_out_rows)


def forward(inputs: Inputs, call: Call, save: bool = True, trusted: bool = False,
            factors: Optional[tuple] = None) -> tuple[Tensor, list[Tensor]]:
    """``(out, saved)`` of the path's forward. With ``save`` and a path that has
    ``grouped_glu_forward_saved``, ``saved`` is what its backward would otherwise recompute; else [].
    ``trusted``, ``factors``: an eager call's records and its factors (``_path_args``)."""
    mod = dispatch.implementation(call.impl)
    fwd_saved = getattr(mod, "grouped_glu_forward_saved", None) if save else None
    fn = fwd_saved or mod.grouped_glu_forward
    with _eager.on_device(inputs.x.device):
        if _replays(mod, trusted):
            res = replay.call(lambda: fn(*_path_args(inputs, call, trusted, factors)), _replay_tensors(inputs, call),
                              (call.impl, call.formats, call.routing.num_out_rows, save))
        else:
            res = fn(*_path_args(inputs, call, trusted, factors))
    if fwd_saved is None:
        return res, []
    out, saved = res
    return out, list(saved)


def _replays(mod, trusted: bool) -> bool:
    """An eager call's own records (``trusted``) on a path whose calls may be replayed, with the replay on."""
    return trusted and config.eager_replay and getattr(mod, "REPLAYABLE", False)


def _replay_tensors(inputs: Inputs, call: Call, *first: Tensor, saved: Optional[Sequence[Tensor]] = None) -> list:
    """Every tensor a path may touch in an eager call (``tsct.kernels.replay``): ``first`` (the backward's grad_out),
    the inputs, the factors' storage (whose shapes give the factors' logical ones), what the backward saved and the
    CSR linked to the index the call combines through (the forward's scatter, the backward's gather:
    ``saved`` None for a forward)."""
    r = call.routing
    m = (r.gather_idx if r.gather_idx is not None else inputs.x).shape[0]
    idx, n = (r.scatter_idx, r.num_out_rows) if saved is None else (r.gather_idx, inputs.x.shape[0])
    link = C.linked_csr(idx, r.offs, m, n) if idx is not None and n is not None else None
    return [*first, inputs.x, r.offs, r.gather_idx, r.scatter_idx, inputs.s_gate, inputs.s_up, r.row_weight,
            *inputs[1:4], *call.storage, *(saved or ()), *(link or (None, None))]


def backward(grad_out: Tensor, inputs: Inputs, call: Call, needs: Inputs, saved: list,
             trusted: bool = False) -> Inputs:
    """The gradients of ``inputs`` (None where ``needs`` is False), each in its input's layout
    (``like_input``); a factor slot's is the gradient w.r.t. the DECODED factor in its carrier's dtype.
    ``trusted``: an eager call's records (``_path_args``)."""
    _select.before_backward(call.impl, inputs.x.device)
    mod = dispatch.implementation(call.impl)

    def run():  # a plain tuple (a replay rebuilds lists and tuples, not named tuples)
        args = (grad_out, *_path_args(inputs, call, trusted), list(needs))
        grads = mod.grouped_glu_backward(*args, saved=saved) if saved else mod.grouped_glu_backward(*args)
        out = []
        for name, g, t in zip(Inputs._fields, grads, inputs):
            if g is not None and name in FACTOR_NAMES and g.dtype != t.dtype:
                g = g.to(t.dtype)
            out.append(like_input(g, t) if g is not None else None)
        return tuple(out)

    with _eager.on_device(inputs.x.device):
        if _replays(mod, trusted):  # the layouts too: in the key
            out = replay.call(run, _replay_tensors(inputs, call, grad_out, saved=saved),
                              (call.impl, call.formats, call.routing.num_out_rows, tuple(needs), len(saved)))
        else:
            out = run()
    return Inputs(*out)


def grad_like(t: Tensor) -> Tensor:
    """A fresh tensor shaped like input ``t`` in the layout its gradient is returned in: K-major for a
    K-major t, contiguous otherwise. One rule for the real op and its fake, decided from t alone (so it
    also holds with symbolic shapes under torch.compile)."""
    if is_kmajor(t):
        return torch.empty_like(t.transpose(-1, -2), memory_format=torch.contiguous_format).transpose(-1, -2)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def like_input(g: Tensor, t: Tensor) -> Tensor:
    """Gradient ``g`` of input ``t`` in ``grad_like(t)``'s layout, whatever layout a path's kernels
    wrote (a copy only when they differ, e.g. a K-major w_down on a launch that is not aligned)."""
    if is_kmajor(t):
        return g if g.transpose(-1, -2).is_contiguous() else grad_like(t).copy_(g)
    return g if g.is_contiguous() else g.contiguous()


# ---- the custom ops ------------------------------------------------------------------------------------
# Their parameters are Inputs' fields, then Routing's other fields, then Call's other fields.

def _op_args(inputs: Inputs, call: Call) -> tuple:
    r = call.routing
    return (*inputs, r.offs, r.gather_idx, r.scatter_idx, r.num_out_rows, call.formats, list(call.storage),
            call.impl)


def _records(x, w_gate, w_up, w_down, s_gate, s_up, row_weight, offs, gather_idx, scatter_idx, num_out_rows,
             formats, storage, impl) -> tuple[Inputs, Call]:
    routing = Routing(offs, gather_idx, scatter_idx, num_out_rows, row_weight)
    return Inputs(x, w_gate, w_up, w_down, s_gate, s_up, row_weight), Call(routing, formats, tuple(storage), impl)


@torch.library.custom_op(OP_NAME, mutates_args=())
def forward_op(
    x: Tensor,
    w_gate: Optional[Tensor],
    w_up: Optional[Tensor],
    w_down: Optional[Tensor],
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    offs: Tensor,
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    formats: str,
    storage: list[Optional[Tensor]],
    impl: str,
) -> tuple[Tensor, list[Tensor]]:
    """``forward`` (``(out, saved)``) with the records flattened into the schema."""
    return forward(*_records(x, w_gate, w_up, w_down, s_gate, s_up, row_weight, offs, gather_idx, scatter_idx,
                             num_out_rows, formats, storage, impl))


@forward_op.register_fake
def _(x, w_gate, w_up, w_down, s_gate, s_up, row_weight, offs, gather_idx, scatter_idx, num_out_rows, formats,
      storage, impl):
    slots = _factors.split(formats, storage)
    f = _factors.out_features(slots[2][0], w_down, slots[2][1])
    rows = num_out_rows if num_out_rows is not None else (gather_idx if gather_idx is not None else x).shape[0]
    like = getattr(dispatch.implementation(impl), "saved_like", None)
    wg = _factors.unpack("w_gate", slots[0][0], w_gate, slots[0][1])
    saved = like(x, wg, gather_idx, scatter_idx, num_out_rows) if like is not None else []
    return x.new_empty((rows, f)), saved


@torch.library.custom_op("tsct::grouped_glu_backward", mutates_args=())
def backward_op(
    grad_out: Tensor,
    x: Tensor,
    w_gate: Optional[Tensor],
    w_up: Optional[Tensor],
    w_down: Optional[Tensor],
    s_gate: Optional[Tensor],
    s_up: Optional[Tensor],
    row_weight: Optional[Tensor],
    offs: Tensor,
    gather_idx: Optional[Tensor],
    scatter_idx: Optional[Tensor],
    num_out_rows: Optional[int],
    formats: str,
    storage: list[Optional[Tensor]],
    impl: str,
    needs_grad: list[bool],
    saved: list[Tensor],
) -> list[Tensor]:
    """``backward``'s seven gradients in ``Inputs`` order; custom ops cannot return None, so an absent
    gradient is an empty tensor."""
    inputs, call = _records(x, w_gate, w_up, w_down, s_gate, s_up, row_weight, offs, gather_idx, scatter_idx,
                            num_out_rows, formats, storage, impl)
    grads = backward(grad_out, inputs, call, Inputs(*needs_grad), saved)
    return [g if g is not None else x.new_empty(0) for g in grads]


@backward_op.register_fake
def _(grad_out, x, w_gate, w_up, w_down, s_gate, s_up, row_weight, offs, gather_idx, scatter_idx, num_out_rows,
      formats, storage, impl, needs_grad, saved):
    inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
    return [grad_like(t) if (t is not None and need) else x.new_empty(0) for t, need in zip(inputs, needs_grad)]


def _no_double_backward(ctx, *grads):
    raise RuntimeError("tsct.ops.grouped_glu: double backward (gradients of gradients, create_graph=True) is "
                       "not supported; only first derivatives are implemented")


# Registered so a second derivative fails with that message instead of torch's generic "no autograd formula".
backward_op.register_autograd(_no_double_backward)


# ---- the Function ----------------------------------------------------------------------------------------

def _none_like(needs):
    """No gradient for one input: None, or a list of them for a tensor-list input of the op (whose
    ``needs_input_grad`` entry torch.library makes a list)."""
    return [None] * len(needs) if isinstance(needs, list) else None


def _setup_context(ctx, inputs, output):
    diff, (offs, gather_idx, scatter_idx, num_out_rows, formats, storage, impl) = inputs[:7], inputs[7:]
    ctx.save_for_backward(*diff, offs, gather_idx, scatter_idx, *storage, *output[1])
    ctx.num_out_rows, ctx.formats, ctx.impl, ctx.n_storage = num_out_rows, formats, impl, len(storage)
    ctx.trusted = False  # the op's formula: its storage may come from anyone (GroupedGLU.forward sets it)


def _backward(ctx, grad_out, *_saved_grads):
    n = len(Inputs._fields)
    needs = Inputs(*ctx.needs_input_grad[:n])
    others = tuple(_none_like(need) for need in ctx.needs_input_grad[n:])
    if not any(needs):
        return (None,) * n + others
    it = iter(ctx.saved_tensors)
    inputs = Inputs(*islice(it, n))
    routing = Routing(next(it), next(it), next(it), ctx.num_out_rows, inputs.row_weight)
    call = Call(routing, ctx.formats, tuple(islice(it, ctx.n_storage)), ctx.impl)
    saved = list(it)
    if _eager.direct_ok(inputs.x, grad_out) and not torch.is_grad_enabled():
        grads = backward(grad_out.contiguous(), inputs, call, needs, saved, ctx.trusted)
    else:  # the op (what a trace records); under create_graph its formula refuses a second derivative by name
        if ctx.trusted:  # an eager forward's storage keeps float8 tensors: the op takes their bytes
            call = call._replace(storage=_factors.op_storage(call.storage))
        grads = backward_op(grad_out.contiguous(), *_op_args(inputs, call), list(needs), saved)
    return (*(g if need else None for g, need in zip(grads, needs)), *others)


class GroupedGLU(torch.autograd.Function):
    """The expert pass's one autograd formula for plain eager calls: its parameters are the custom op's, and
    ``_setup_context`` / ``_backward`` are also registered as the op's formula, so ``GroupedGLU.apply`` and
    ``forward_op`` (everything else) save, name and compute the gradients with the same code. Returns ``(out,
    saved)`` like the op. The forward takes ``ctx`` (no ``setup_context`` method) because torch's ``apply`` binds
    the arguments of a Function that defines one through ``inspect.signature`` on every call (~70 us on a 2-core CPU
    host; ~0.5 ms of eager time per call on an H200's host, docs/performance.md)."""

    @staticmethod
    def forward(ctx, *args):
        args, factors = args[:-1], args[-1]  # the op's arguments, then the call's factors (tensors, containers)
        output = forward(*_records(*args), trusted=True, factors=factors)  # grouped_glu's own containers
        _setup_context(ctx, args, output)
        ctx.trusted = True
        return output

    backward = staticmethod(_backward)


forward_op.register_autograd(_backward, setup_context=_setup_context)


def encode(x: Tensor, factors: tuple, masters: tuple, s_gate: Optional[Tensor], s_up: Optional[Tensor],
           routing: Routing, impl: str, for_op: bool = True) -> tuple[Inputs, Call]:
    """The records of one call: each factor packed into its slot (``tsct.ops._factors``); ``masters`` holds
    each packed factor's master or None. ``_op_args(*encode(...))`` are the custom op's arguments (``for_op``: the
    storage as the op takes it; an eager call that does not cross the op passes False)."""
    tags, storage, carriers = [], [], []
    for name, w, master in zip(FACTOR_NAMES, factors, masters):
        tag, st = _factors.pack(name, w, for_op)
        tags.append(tag)
        storage.extend(st)
        carriers.append(w if tag == "dense" else master)
    return Inputs(x, *carriers, s_gate, s_up, routing.row_weight), Call(routing, ",".join(tags), tuple(storage), impl)


def op_args(*args) -> tuple:
    """The custom op's (and ``GroupedGLU.apply``'s) arguments for ``encode``'s arguments."""
    return _op_args(*encode(*args))


def grouped_glu(x: Tensor, factors: tuple, masters: tuple, s_gate: Optional[Tensor], s_up: Optional[Tensor],
                routing: Routing, impl: str) -> Tensor:
    """The expert pass on validated inputs with a resolved path key: ``[num_out_rows, f]`` or ``[M, f]``."""
    # the slots' carriers (encode's): a dense factor itself, a packed factor's master
    direct = _eager.direct_ok(x, *(w if isinstance(w, Tensor) else m for w, m in zip(factors, masters)))
    inputs, call = encode(x, factors, masters, s_gate, s_up, routing, impl, for_op=not direct)
    if not direct:
        return forward_op(*_op_args(inputs, call))[0]
    if _eager.needs_grad(*inputs):
        return _eager.run(OP_NAME, GroupedGLU.apply, *_op_args(inputs, call), factors)[0]
    # inference: the plain forward, nothing saved
    return _eager.run(OP_NAME, forward, inputs, call, False, True, factors)[0]
