"""The backward under skewed routing, through Triton's interpreter in fp32 (tests/kernels/test_bwd_skew_interp.py).

The backward of both Triton families runs its per-row work on the row tiles of the tile map and sums each expert's
dW over chunks of CH rows (workspace slots, then a fixed-order sum: ``triton_common/_kernels.py`` "backward"). Cases:

* ``maps_*``: the ``bwd_maps`` kernel against the same counts made with torch, E past one block of experts.
* ``oracle_*``: one expert with almost all rows, many empty experts, one-row experts, or (``*one_tile*``) every
  expert one row tile or empty, as at b1 (the row kernels' per-expert dW, no chunk); every gradient against the
  float64 oracle (``tests/_glu_oracle.py``, autograd through one routed row at a time), at chunk sizes of one, two
  and eight row tiles (several workspace slots, a few, none) and with the experts found by binary search (a block
  of experts smaller than E); ``torch.empty`` poisoned with NaN, so an element no kernel writes fails the check.
  Low-bit factors (NVFP4, sign) are compared on their decoded values.
* ``repeat_*``: two runs with differently poisoned ``torch.empty`` give the same bits.
* ``chunks_*``: two chunk sizes: the gradients that have no sum over an expert's rows (dX, d row_weight) and the
  scales' gradients (summed per row tile) are the same bits; dW differs only by the order of its fp32 sums, within
  ``CHUNK_TOL`` (docs/decisions/0016).
* ``selftest_*``: the first-use self-test's problem and backward reach the chunked reductions (several slots) and
  pass against their float64 oracle.

    TRITON_INTERPRET=1 PYTHONPATH=python:tests python tests/_bwd_skew_check.py [--json PATH] [CASE...]

Prints one line per case; exit status 1 if any case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

if os.environ.get("TRITON_INTERPRET") != "1":  # must be set before triton is imported
    sys.exit("set TRITON_INTERPRET=1")

import torch  # noqa: E402

from tsct import quant  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_glu import glu as G  # noqa: E402
from tsct.kernels.triton_lowbit import glu as L  # noqa: E402
from _glu_oracle import oracle_forward, rel_err  # noqa: E402

TOL = 1e-5         # fp32 kernels against the float64 oracle
CHUNK_TOL = 1e-6   # fp32 dW at two chunk sizes: the same products summed in another order
_EMPTY = torch.empty
NAMES = ["x", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight"]


def _poisoned(fval: float):
    def empty(*a, **k):
        t = _EMPTY(*a, **k)
        if t.is_floating_point():
            t.fill_(fval)
        elif t.numel():
            t.view(-1).view(torch.uint8).fill_(0xA5)
        return t
    return empty


def problem(counts, T=None, k=2, d=32, r=16, f=40, pad=3, gather=True, scales=True, seed=0, kmajor=False):
    """fp32 inputs with the given rows per expert (sorted by expert), tokens of k rows each when gathering, padding
    rows with garbage indices and NaN weights; plus the oracle's routing (the expert of each row). ``kmajor``: w_down
    K-major (an ``[E, f, r]`` tensor's transpose: the WD_T variants)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.as_tensor(counts)
    E, valid = counts.numel(), int(counts.sum())
    m = valid + pad
    T = T or -(-valid // k)
    offs = counts.cumsum(0).to(torch.int32)
    expert_of_row = torch.repeat_interleave(torch.arange(E), counts)
    x = torch.randn(T if gather else m, d, generator=g)
    wg = torch.randn(E, d, r, generator=g) / d ** 0.5
    wu = torch.randn(E, d, r, generator=g) / d ** 0.5
    wd = (torch.randn(E, f, r, generator=g).transpose(1, 2) if kmajor else torch.randn(E, r, f, generator=g)) / r ** 0.5
    sg = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    su = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    rw = torch.cat([torch.rand(valid, generator=g), torch.full((pad,), float("nan"))])
    tok = torch.randperm(T * k, generator=g)[:valid] // k
    gi = torch.cat([tok, torch.full((pad,), 10 ** 9)]) if gather else None
    si = torch.cat([tok, torch.full((pad,), -7)]) if gather else None
    args = [x, offs, wg, wu, wd, sg, su, rw, gi, si, T if gather else None]
    return args, expert_of_row


def oracle_grads(args, expert_of_row, go):
    """Every gradient of the float64 oracle (autograd through one routed row at a time)."""
    x, offs, wg, wu, wd, sg, su, rw, gi, si, n_out = args
    leaves = [t.double().requires_grad_(True) if t is not None else None for t in (x, wg, wu, wd, sg, su, rw)]
    lx, lwg, lwu, lwd, lsg, lsu, lrw = leaves
    out = oracle_forward(lx, offs, lwg, lwu, lwd, lsg, lsu, lrw, gi, si, n_out, expert_of_row)
    valid = int(offs[-1])
    go64 = go.double()
    if si is None:
        out, go64 = out[:valid], go64[:valid]
    used = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(out, used, go64, allow_unused=True))
    res = [next(grads) if t is not None else None for t in leaves]
    return [None if t is None else (torch.zeros_like(t) if gr is None else gr) for t, gr in zip(leaves, res)]


def run_backward(fam, args, go, ch=None, block_e=None, fval=float("nan"), regs=None):
    """The family's backward with ``torch.empty`` poisoned (``fval``), with chunk_bwd / block_e / regs_dwd set
    (``overridden``)."""
    spec = ",".join(f"{k}={v}" for k, v in (("chunk_bwd", ch), ("block_e", block_e), ("regs_dwd", regs)) if v)
    with G.overridden(spec):
        torch.empty = _poisoned(fval)
        try:
            return fam.grouped_glu_backward(go, *args, [True] * 7)
        finally:
            torch.empty = _EMPTY


def _decoded(args):
    out = list(args)
    for i in (2, 3, 4):
        if not isinstance(out[i], torch.Tensor):
            out[i] = quant.dequantize(out[i], dtype=torch.float32, backend="torch")
    return out


def lowbit(args, fmts):
    out = list(args)
    for i, fmt in zip((2, 3, 4), fmts):
        if fmt == "nvfp4":
            out[i] = quant.quantize_nvfp4(args[i], layout="linear", backend="torch")
        elif fmt == "sign":
            out[i] = quant.quantize_sign(args[i], backend="torch")
    return out


HOT = [0, 0, 0, 290, 1, 0, 2, 0, 0, 3]                                    # one expert of 5 row tiles, empty ones
MANY_EMPTY = [0] * 13 + [200] + [0] * 9 + [1, 70, 0, 0, 65, 0, 64] + [0] * 10  # 40 experts, mostly empty
ONE_TILE = [5, 64, 0, 31, 1, 0, 17, 64, 2, 40, 0, 9]                       # every expert one row tile or empty (b1)
ORACLE = {
    # name: (counts, problem kwargs, family, factor formats, chunk rows, block of experts[, glu_bwd_dwd's registers])
    "oracle_hot_ch64": (HOT, {}, G, None, 64, None),
    "oracle_hot_ch128_bsearch": (HOT, {}, G, None, 128, 4),
    "oracle_hot_ch512": (HOT, {}, G, None, 512, None),
    # the register cap reaches the compile options: K-major w_down only (SharedTiles.dwd_maxnreg), row-major none
    "oracle_hot_ch64_regcap": (HOT, dict(kmajor=True), G, None, 64, None, 80),
    "oracle_hot_ch64_regcap_rowmajor": (HOT, {}, G, None, 64, None, 80),
    "oracle_many_empty_nogather": (MANY_EMPTY, dict(gather=False, scales=False), G, None, 64, 8),
    "oracle_hot_r80": (HOT, dict(r=80, d=48, f=21), G, None, 64, None),
    "oracle_lowbit_nvfp4_ch64": (HOT, {}, L, ("nvfp4",) * 3, 64, None),
    "oracle_lowbit_mixed_bsearch": (MANY_EMPTY, dict(f=37), L, ("nvfp4", "sign", "nvfp4"), 64, 8),
    "oracle_one_tile": (ONE_TILE, {}, G, None, 64, 4),
    "oracle_one_tile_r80_nogather": (ONE_TILE, dict(r=80, d=48, f=21, gather=False), G, None, 64, None),
    "oracle_lowbit_one_tile": (ONE_TILE, dict(f=37), L, ("sign", "nvfp4", "nvfp4"), 64, None),
}


def check_oracle(name) -> tuple[bool, str]:
    counts, kw, fam, fmts, ch, block_e, *regs = ORACLE[name]
    args, eor = problem(counts, **kw, seed=len(name))
    if fmts:
        args = lowbit(args, fmts)
    ref_args = _decoded(args)
    n_out = args[10]
    go = torch.randn(n_out if n_out is not None else args[0].shape[0], ref_args[4].shape[2],
                     generator=torch.Generator().manual_seed(7))
    want = oracle_grads(ref_args, eor, go)
    caps = []
    real_launch = C.FAMILY.launch

    def spy(kernel, *a):  # the register cap glu_bwd_dwd is launched with
        if kernel == "glu_bwd_dwd":
            caps.append(a[-1] if len(a) == 9 else 0)
        return real_launch(kernel, *a)

    C.FAMILY.launch = spy
    try:
        got = run_backward(fam, args, go, ch, block_e, regs=regs[0] if regs else None)
    finally:
        del C.FAMILY.launch
    if regs:
        want_cap = regs[0] if kw.get("kmajor") else 0
        if not caps or set(caps) != {want_cap}:
            return False, f"glu_bwd_dwd launched with register caps {sorted(set(caps))}, want {want_cap}"
    errs = {}
    for n, a, b in zip(NAMES, got, want):
        if (a is None) != (b is None):
            return False, f"{n}: gradient presence differs"
        if b is not None:
            if n == "row_weight":  # padding rows: zero gradient, the oracle has none for them
                a = a[: int(args[1][-1])]
                b = b[: int(args[1][-1])]
            errs[n] = rel_err(a, b) if bool(torch.isfinite(a).all()) else float("inf")
    worst = max(errs.values())
    empty = [e for e, c in enumerate(counts) if c == 0]
    nonzero = [n for n, a in zip(NAMES[1:6], got[1:6]) if a is not None and bool((a[empty] != 0).any())]
    why = " ".join(f"{k}={v:.1e}" for k, v in errs.items())
    if nonzero:
        return False, f"empty experts' gradients not exact zeros: {nonzero}; {why}"
    return worst < TOL, why


def check_maps() -> tuple[bool, str]:
    """bwd_maps against torch, E = 9500 (ten programs of 1024 experts; the last one's carry in three steps of 4096
    experts, one of them partial), a chunk of 128 rows."""
    g = torch.Generator().manual_seed(3)
    e = 9500
    counts = torch.randint(0, 140, (e,), generator=g) * (torch.rand(e, generator=g) < 0.5)
    counts[17] = 5000
    offs = counts.cumsum(0).to(torch.int32)
    bm, ch = C.CONFIG.shared.bm, 128
    cfg = C.CONFIG.update(f"chunk_bwd={ch}")
    plan = C.bwd_plan(offs, int(offs[-1]) + 5, 64, cfg, (0, 0))
    t = -(-counts // bm)
    k = -(-counts // plan.ch)
    c = torch.where(counts <= bm, 0, k)
    s = torch.where(k >= 2, k, 0)
    x = (t - 1).clamp(min=0)
    want = torch.stack([t.cumsum(0), c.cumsum(0), s.cumsum(0), x.cumsum(0)]).to(torch.int32)
    ok = torch.equal(plan.maps, want) and plan.max_tiles >= int(want[0, -1]) and plan.max_tiles >= e + int(x.sum())
    ok = ok and plan.n_slots >= int(want[2, -1]) and plan.ch % bm == 0 and plan.ch >= ch
    return ok, f"ch={plan.ch} tiles={int(want[0, -1])}/{plan.max_tiles} chunks={int(want[1, -1])} " \
               f"slots={int(want[2, -1])}/{plan.n_slots}"


def check_repeat(fam, fmts) -> tuple[bool, str]:
    args, _ = problem(HOT, seed=11)
    if fmts:
        args = lowbit(args, fmts)
    go = torch.randn(args[10], 40, generator=torch.Generator().manual_seed(1))
    a = run_backward(fam, args, go, 64, fval=float("nan"))
    b = run_backward(fam, args, go, 64, fval=-3.25)
    same = [n for n, u, v in zip(NAMES, a, b) if u is not None and not torch.equal(u, v)]
    return not same, f"differing: {same}" if same else "same bits"


def check_chunks(fam, fmts) -> tuple[bool, str]:
    args, _ = problem(HOT, seed=12)
    if fmts:
        args = lowbit(args, fmts)
    go = torch.randn(args[10], 40, generator=torch.Generator().manual_seed(2))
    a = run_backward(fam, args, go, 64)
    b = run_backward(fam, args, go, 128)
    same = all(torch.equal(a[i], b[i]) for i in (0, 4, 5, 6))
    dw = {NAMES[i]: rel_err(a[i], b[i]) for i in (1, 2, 3)}
    ok = same and max(dw.values()) < CHUNK_TOL
    return ok, ("dX, d s, d rw same bits" if same else "dX / d s / d rw differ") + " dW " + \
        " ".join(f"{k}={v:.1e}" for k, v in dw.items())


def check_selftest(path: str, fmt: str) -> tuple[bool, str]:
    """The first-use self-test (``tsct.selftest.grouped_glu``, what a child process runs on an sm_120 card before a
    Triton path serves there) through the op, forward and backward: its hot expert must reach the chunked dW
    reductions with several workspace slots, and every result must match its float64 oracle."""
    from tsct import selftest
    from tsct.ops import _select

    seen = {}
    real = _select.select, C.dwd_chunks, C.dw_chunks

    def spy(name, fn):
        # the plan's maps (bwd_maps): slots the experts use (not plan.n_slots, the workspace's bound) and row tiles
        # past the experts' first (the row kernels' further-tile programs)
        def run(plan, *a):
            seen[name] = (plan.ch, int(plan.maps[2, -1]), int(plan.maps[3, -1]))
            return fn(plan, *a)
        return run

    _select.select = lambda impl, cap, fmt, *rest: impl  # the CPU: no dispatch row
    C.dwd_chunks, C.dw_chunks = spy("dwd", real[1]), spy("dw", real[2])
    try:
        res = selftest.grouped_glu(path, torch.device("cpu"), torch.float32, fmt, backward=True)
    finally:
        _select.select, C.dwd_chunks, C.dw_chunks = real
    chunked = sorted(seen) == ["dw", "dwd"] and all(
        ch == selftest.SELFTEST_CHUNK_ROWS and slots >= 2 and further >= 1 for ch, slots, further in seen.values())
    return res.ok and chunked, f"{res.detail}; (chunk rows, slots used, further row tiles) {seen}"


CASES = {name: (lambda n=name: check_oracle(n)) for name in ORACLE}
CASES.update({
    "maps_e9500": check_maps,
    "repeat_bf16": lambda: check_repeat(G, None),
    "repeat_lowbit": lambda: check_repeat(L, ("nvfp4", "sign", "nvfp4")),
    "chunks_bf16": lambda: check_chunks(G, None),
    "chunks_lowbit": lambda: check_chunks(L, ("sign",) * 3),
    "selftest_bf16": lambda: check_selftest("triton-bf16", "bf16"),
    "selftest_lowbit_mixed": lambda: check_selftest("triton-lowbit", "mixed"),
})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("cases", nargs="*")
    a = p.parse_args()
    res = []
    for name in a.cases or list(CASES):
        try:
            ok, why = CASES[name]()
        except Exception:  # noqa: BLE001  (recorded: the test names the case)
            ok, why = False, traceback.format_exc(limit=4)
        print(f"{name:30s} {'ok ' if ok else 'FAIL'} {why}", flush=True)
        res.append({"name": name, "ok": bool(ok), "why": why})
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh)
    return 0 if all(r["ok"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
