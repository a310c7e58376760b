"""The saving forwards' outputs are defined on padding rows (rows at or past offs[-1], design.md section 2).

``grouped_glu_forward_saved`` of the Triton paths returns, besides the output, the tensors its backward reads
(hg, hu fp32 [M, r], z * row_weight [M, r]; with scatter_idx also the combine's CSR). They are outputs of the custom ops (``tsct::grouped_glu``), so every row must
be defined: torch.library.opcheck's AOT-dispatch checks compare two runs' outputs. Run in a subprocess under
Triton's interpreter, fp32 (tests/kernels/test_triton_glu_interp.py):

    TRITON_INTERPRET=1 PYTHONPATH=python:tests python tests/_saved_tails_check.py [--json PATH] [CASE...]

Direct cases: two saving forwards with ``torch.empty`` poisoned (each fresh buffer filled with NaN, then with
another value; integers with garbage), so a row no kernel writes shows up as non-zero or as a difference
between the runs. Op cases: ``torch.library.opcheck`` of the custom op with that path. Prints one JSON line
per case ({"name", "ok", "why"}); exit status 1 if any case fails.
"""

from __future__ import annotations

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
from tsct.ops import _function as F  # noqa: E402  (importing tsct.ops registers the custom ops)
from _glu_oracle import make_problem  # noqa: E402

_EMPTY = torch.empty


def _poisoned(fval: float, byte: int):
    """``torch.empty`` whose buffers come filled: floats with ``fval``, anything else with the byte ``byte``."""
    def empty(*a, **k):
        t = _EMPTY(*a, **k)
        if t.is_floating_point():
            t.fill_(fval)
        elif t.numel():
            t.view(-1).view(torch.uint8).fill_(byte)
        return t
    return empty


def _saving_runs(fwd, args) -> list:
    """``fwd(*args)`` twice, each with ``torch.empty`` poisoned differently: [(out, saved), (out, saved)]."""
    runs = []
    for fval, byte in ((float("nan"), 0xA5), (-3.25, 0x5A)):
        torch.empty = _poisoned(fval, byte)
        try:
            runs.append(fwd(*args))
        finally:
            torch.empty = _EMPTY
    return runs


def _check_saved(runs, valid: int, n_csr: int) -> str:
    """'' if every saved tensor is the same in both runs and hg, hu, z*rw are 0 on padding rows, else why not."""
    (out_a, sa), (out_b, sb) = runs
    if len(sa) != 3 + n_csr or len(sb) != len(sa):
        return f"saved holds {len(sa)} / {len(sb)} tensors, expected {3 + n_csr}"
    if not torch.equal(out_a, out_b):
        return "the output differs between the runs"
    for i, (a, b) in enumerate(zip(sa, sb)):
        if i < 3:
            if a.shape[0] <= valid:
                return f"saved[{i}] has no padding rows (shape {tuple(a.shape)}): the case tests nothing"
            if not bool((a[valid:] == 0).all()):
                return f"saved[{i}] padding rows are not zero: {a[valid:].tolist()}"
            if not bool(torch.isfinite(a[:valid]).all()):
                return f"saved[{i}] has non-finite valid rows"
        if not torch.equal(a, b):
            return f"saved[{i}] ({a.dtype}, {tuple(a.shape)}) differs between the runs"
    return ""


def _problem(gather: bool, seed: int = 0):
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=4, f=7, pad_rows=3, gather=gather, seed=seed)
    return p, int(p["offs"][-1])


def _args(p, wg, wu, wd):
    return (p["x"], p["offs"], wg, wu, wd, p["s_gate"], p["s_up"], p["row_weight"], p["gather_idx"], p["scatter_idx"],
            p["num_out_rows"])


def bf16_direct(gather: bool) -> str:
    p, valid = _problem(gather)
    runs = _saving_runs(G.grouped_glu_forward_saved, _args(p, p["w_gate"], p["w_up"], p["w_down"]))
    return _check_saved(runs, valid, 2 if gather else 0)


def bf16_opcheck() -> str:
    p, _ = _problem(True)
    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], p["num_out_rows"], p["row_weight"])
    facs = (p["w_gate"].requires_grad_(), p["w_up"], p["w_down"])
    args = F.op_args(p["x"].requires_grad_(), facs, (None,) * 3, p["s_gate"], p["s_up"], routing, "triton-bf16")
    torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args)
    return ""


def _nvfp4(p, names=("w_gate", "w_up", "w_down")):
    return [quant.quantize_nvfp4(p[n], backend="torch") for n in names]


def _lowbit_problem(gather: bool):
    # NVFP4 blocks run along d for w_gate / w_up and along r for w_down: both multiples of 16
    p = make_problem(tokens=8, topk=2, experts=3, d=16, r=16, f=7, pad_rows=3, gather=gather)
    return p, int(p["offs"][-1])


def lowbit_direct(gather: bool) -> str:
    p, valid = _lowbit_problem(gather)
    runs = _saving_runs(L.grouped_glu_forward_saved, _args(p, *_nvfp4(p)))
    return _check_saved(runs, valid, 2 if gather else 0)


def _q_opcheck(impl: str) -> str:
    p, _ = _lowbit_problem(True)
    facs = _nvfp4(p)
    routing = F.Routing(p["offs"], p["gather_idx"], p["scatter_idx"], p["num_out_rows"], p["row_weight"])
    args = F.op_args(p["x"].requires_grad_(), facs, (None,) * 3, p["s_gate"], p["s_up"], routing, impl)
    torch.library.opcheck(torch.ops.tsct.grouped_glu.default, args)
    return ""


def tile_cum_kernel() -> str:
    """The Triton tile_cum in ZERO mode (what a GPU's saving forward launches; on the CPU ``runtime.tile_cum`` uses
    torch ops), run by the interpreter: the tile map equals torch's, the padding rows of the three word arrays are 0
    and the other rows untouched, for several grids (one zeroing program strides over many rows) and tails that end
    inside a ZBLOCK, an empty tail and an all-padding one."""
    from tsct.kernels.triton_common import specs as CS
    counts = [5, 0, 70, 1, 3]
    for m_pad, nz in ((9, 1), (9, 3), (0, 2), (4000, 2)):
        offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
        if m_pad == 4000:
            offs = torch.zeros(len(counts), dtype=torch.int32)  # every row is padding
        m = sum(counts) + m_pad if m_pad != 4000 else m_pad
        ts = [torch.randn(m, 17, dtype=torch.float32), torch.randn(m, 17, dtype=torch.float32),
              torch.randn(m, 17, dtype=torch.float32).to(torch.float16)]
        ref = [t.clone() for t in ts]
        words = [t.view(torch.int16) for t in ts]
        cum = torch.empty(len(counts), dtype=torch.int32)
        C.launch_kernel("tile_cum", (1 + nz,),
                        [offs, cum, len(counts), *words, m, words[0].shape[1], words[2].shape[1]],
                        dict(BM=4, BLOCK=CS.TILE_CUM_BLOCK, ZERO=True, ZBLOCK=CS.TILE_CUM_ZBLOCK), 4, 1, False,
                        (0, 0), offs.device)
        want = torch.cumsum(torch.div(torch.diff(offs, prepend=offs.new_zeros(1)) + 3, 4, rounding_mode="floor"), 0)
        if not torch.equal(cum, want.to(torch.int32)):
            return f"m_pad={m_pad}: tile map {cum.tolist()} != {want.tolist()}"
        v = int(offs[-1])
        for i, (t, r) in enumerate(zip(ts, ref)):
            if not bool((t[v:] == 0).all()):
                return f"m_pad={m_pad} nz={nz}: tensor {i} padding rows not zero"
            if not torch.equal(t[:v], r[:v]):
                return f"m_pad={m_pad} nz={nz}: tensor {i} rows before offs[-1] changed"
    return ""


CASES = {
    "tile_cum_zero_kernel": tile_cum_kernel,
    "bf16_saved_gather_scatter": lambda: bf16_direct(True),
    "bf16_saved_no_gather": lambda: bf16_direct(False),
    "bf16_opcheck": bf16_opcheck,
    "lowbit_saved_gather_scatter": lambda: lowbit_direct(True),
    "lowbit_saved_no_gather": lambda: lowbit_direct(False),
    "lowbit_opcheck": lambda: _q_opcheck("triton-lowbit"),
}


def main() -> int:
    argv = sys.argv[1:]
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out = argv[i + 1]
        del argv[i:i + 2]
    res = []
    for name in argv or list(CASES):
        try:
            why = CASES[name]()
        except Exception as e:  # noqa: BLE001  (a failed opcheck raises; report it as this case's failure)
            why = f"{type(e).__name__}: {str(e)[:800]}\n{traceback.format_exc()[-1500:]}"
        res.append({"name": name, "ok": not why, "why": why})
        print(json.dumps(res[-1]), flush=True)
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if all(r["ok"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
