"""CPU check of the Triton GLU through Triton's interpreter (fp32 only: design.md section 5 found the
interpreter wrong for bf16 dots). Exercises the same kernels and host code as the GPU path, against
tsct.reference: gather/scatter on and off, scales and row weight on and off, padding rows with NaN
weights and garbage indices, empty and one-row experts, multi-tile experts, r > 128 (multi-K up
projection, several rank blocks), f not a multiple of 8, top-4, targets no row reaches, a K-major
w_down (WD_T).

    TRITON_INTERPRET=1 PYTHONPATH=python python tools/triton_glu_interp_check.py

Exit status 1 if any relative error exceeds 1e-5 (fp32: seen ~1e-7 on 2026-11-29, Triton 3.9).
"""

from __future__ import annotations

import math
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":  # must be set before triton is imported
    sys.exit("set TRITON_INTERPRET=1")

import torch  # noqa: E402

from tsct import reference as R  # noqa: E402
from tsct.kernels.layout import to_kmajor  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_glu import glu as G  # noqa: E402


def make(T, k, E, d, r, f, pad=3, gather=True, scatter=True, scales=True, rw=True, counts=None, seed=0,
         kmajor=False, spread=0):
    g = torch.Generator().manual_seed(seed)
    valid = T * k
    m = valid + pad
    if counts is None:
        counts = torch.bincount(torch.randint(0, E, (valid,), generator=g), minlength=E)
    counts = torch.as_tensor(counts)
    assert int(counts.sum()) == valid
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(T if gather else m, d, generator=g)
    wg = torch.randn(E, d, r, generator=g) / d ** 0.5
    wu = torch.randn(E, d, r, generator=g) / d ** 0.5
    wd = torch.randn(E, r, f, generator=g) / r ** 0.5
    if kmajor:  # the transpose of a contiguous [E, f, r] (decision 0012)
        wd = to_kmajor(wd)
    sg = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    su = 1 + 0.1 * torch.randn(E, r, generator=g) if scales else None
    rwt = torch.cat([torch.rand(valid, generator=g), torch.full((pad,), float("nan"))]) if rw else None
    gi = torch.cat([torch.randperm(valid, generator=g) // k, torch.full((pad,), 10 ** 9)]).to(torch.int32) \
        if gather else None
    si = torch.cat([torch.randperm(valid, generator=g) // k, torch.full((pad,), -7)]) if scatter else None
    if scatter and spread:  # T + spread targets, `spread` of them reached by no row (must come out zero)
        si[:valid] = torch.randperm(T + spread, generator=g)[:T][si[:valid]]
    return x, offs, wg, wu, wd, sg, su, rwt, gi, si, (T + spread if scatter else None)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


CASES = {
    "basic": dict(T=24, k=2, E=4, d=32, r=16, f=40),
    "no_gather_scatter": dict(T=24, k=2, E=4, d=32, r=16, f=40, gather=False, scatter=False),
    "no_scales_rw": dict(T=24, k=2, E=5, d=48, r=24, f=37, scales=False, rw=False),
    "multi_tile": dict(T=80, k=2, E=3, d=32, r=16, f=33, counts=[0, 150, 10]),
    "empty_and_one": dict(T=10, k=2, E=6, d=32, r=16, f=21, counts=[0, 1, 0, 18, 1, 0]),
    "r80": dict(T=16, k=2, E=2, d=16, r=80, f=24),
    "r300_d100_f5": dict(T=20, k=2, E=3, d=100, r=300, f=5, pad=4),
    "top4": dict(T=16, k=4, E=5, d=32, r=16, f=19, pad=2),
    "untouched_targets": dict(T=20, k=2, E=4, d=32, r=16, f=29, spread=7),
    "f600_slices": dict(T=40, k=2, E=3, d=32, r=16, f=600, counts=[70, 0, 10], pad=2),
    "kmajor_wd": dict(T=24, k=2, E=4, d=32, r=16, f=37, kmajor=True),
    "kmajor_wd_multi": dict(T=80, k=2, E=3, d=32, r=32, f=600, counts=[0, 150, 10], kmajor=True),
    "kmajor_wd_r160": dict(T=16, k=2, E=2, d=16, r=160, f=24, kmajor=True),
    # rows of f % 8 == 0 without scatter: the up kernel's vector-store variant (Y_PAD) writes y itself
    "kmajor_wd_nogs_multi": dict(T=40, k=2, E=3, d=32, r=16, f=48, counts=[0, 70, 10], kmajor=True, gather=False,
                                 scatter=False),
}


def main() -> int:
    worst = 0.0
    for name, kw in CASES.items():
        args = make(**kw)
        ref = R.grouped_glu_forward(*args)
        errs = [rel(G.grouped_glu_forward(*args), ref)]
        go = torch.randn_like(ref)
        for a, b in zip(G.grouped_glu_backward(go, *args, [True] * 7), R.grouped_glu_backward(go, *args, [True] * 7)):
            if (a is None) != (b is None):
                print(f"{name}: gradient presence differs")
                return 1
            if a is not None and kw.get("kmajor") and a.shape == args[4].shape and a.stride() != args[4].stride():
                print(f"{name}: dW_down strides {a.stride()} differ from w_down's {args[4].stride()}")
                return 1
            if b is not None:
                errs.append(rel(a, b))
        err = max(errs) if all(math.isfinite(e) for e in errs) else math.inf  # a NaN must fail
        worst = max(worst, err)
        print(f"{name:20s} max rel err {err:.2e}")
    if not check_saved_csr() or not check_experts_past_one_block() or not check_scales_as_given():
        return 1
    print(f"worst {worst:.2e}")
    return 0 if worst < 1e-5 else 1


def check_scales_as_given() -> bool:
    """fp16 x with fp16 scales: the forward hands the scales to glu_down_fwd as they are (``runtime.scales_in``,
    widened in the kernel), saving and plain; the same bits as with the scales converted to fp32 first."""
    args = [t.half() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in make(T=24, k=2, E=4, d=32, r=16, f=40, seed=7)]
    conv = list(args)
    conv[5], conv[6] = args[5].float(), args[6].float()
    for fwd in (G.grouped_glu_forward, lambda *a: G.grouped_glu_forward_saved(*a)[0]):
        a, b = fwd(*args), fwd(*conv)
        if a.dtype != torch.float16 or not torch.equal(a, b) or not bool(torch.isfinite(a).all()):
            print("scales_as_given: fp16 scales passed as given differ from fp32 ones")
            return False
    go = torch.randn_like(a)
    for saved in (None, G.grouped_glu_forward_saved(*args)[1]):  # recompute, and the saving forward's tensors
        ga = G.grouped_glu_backward(go, *args, [True] * 7, saved=saved)
        gb = G.grouped_glu_backward(go, *conv, [True] * 7, saved=saved)
        # the scales' gradients come back in the scales' dtype: the fp32 ones rounded to fp16 are the same values
        if not all(torch.equal(u, v.to(u.dtype)) for u, v in zip(ga, gb) if u is not None):
            print("scales_as_given: gradients with fp16 scales passed as given differ from fp32 ones")
            return False
    print("scales_as_given      same bits, forward and backward")
    return True


def check_saved_csr() -> bool:
    """One index tensor routes and combines (a token-choice MoE layer): the saving forward keeps the combine's
    CSR and the backward's dX combine reuses it, with the same bits as the backward that builds its own."""
    x, offs, wg, wu, wd, sg, su, rwt, _, si, n_out = make(T=24, k=2, E=4, d=32, r=16, f=40, seed=5)
    args = (x, offs, wg, wu, wd, sg, su, rwt, si, si, n_out)
    out, saved = G.grouped_glu_forward_saved(*args)
    order, ptr = C.build_csr(si, offs, si.shape[0], n_out, (0, 0))
    if len(saved) != 5 or not (torch.equal(saved[3], order) and torch.equal(saved[4], ptr)):
        print("saved_csr: the saving forward did not keep the combine's CSR")
        return False
    if C.dx_csr(saved, si.clone(), si, x.shape[0], n_out) is not None or C.dx_csr(saved[:3], si, si, n_out, n_out):
        print("saved_csr: dx_csr reused a CSR for another index tensor or without one")
        return False
    go = torch.randn_like(out)
    built, csr = [], C._csr
    C._csr = lambda *a: built.append(1) or csr(*a)
    try:
        a = G.grouped_glu_backward(go, *args, [True] * 7, saved=saved)
        n_reused = len(built)
        b = G.grouped_glu_backward(go, *args, [True] * 7, saved=saved[:3])
    finally:
        C._csr = csr
    if (n_reused, len(built)) != (0, 1):
        print(f"saved_csr: CSRs built by the backward with / without the saved one: {n_reused} / {len(built) - n_reused}")
        return False
    ref = R.grouped_glu_backward(go, *args, [True] * 7)
    if not all(torch.equal(u, v) for u, v in zip(a, b)) or rel(a[0], ref[0]) > 1e-5:
        print(f"saved_csr: dX with the reused CSR differs (rel err vs reference {rel(a[0], ref[0]):.2e})")
        return False
    print("saved_csr           reused, bit-identical")
    return True


def check_experts_past_one_block() -> bool:
    """More experts than BLOCK_E (the step of the kernels' scans over experts): the down kernel's tile map formed
    from offs (_kernels._tile_of_offs) carries across blocks; forward and backward against the reference."""
    with G.overridden("block_e=4"):
        args = make(T=60, k=2, E=11, d=32, r=16, f=24, counts=[3, 0, 0, 90, 1, 0, 0, 0, 2, 0, 24], seed=7)
        out = G.grouped_glu_forward(*args)
        go = torch.randn_like(out)
        errs = [rel(out, R.grouped_glu_forward(*args))]
        errs += [rel(a, b) for a, b in zip(G.grouped_glu_backward(go, *args, [True] * 7),
                                           R.grouped_glu_backward(go, *args, [True] * 7)) if b is not None]
    err = max(errs) if all(math.isfinite(e) for e in errs) else math.inf
    print(f"{'experts_past_block':20s} max rel err {err:.2e}")
    return err < 1e-5


if __name__ == "__main__":
    sys.exit(main())
