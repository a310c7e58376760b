"""The launch ledger of the Triton host code on one arch: every AOT specialization key that ``triton_glu/glu.py``,
``triton_lowbit/glu.py`` and ``triton_common/route.py`` request over the product of every input class they tell apart.

A dry run: CPU tensors, the compute capability patched, each launch's key recorded instead of run (``aot.kernel``
answers every key). The classes are the host code's own branch conditions, each with every value it can take:

* activations: the dtypes with cubins (``specs.AOT_DTYPES``, bf16; fp16 runs through Triton JIT);
* scales: none, both fp32, both in x's dtype (what ``runtime.scales_in`` passes on), and one alone (which it turns
  into fp32, as a mix of dtypes);
* row weight: absent or given; gather / scatter indices: absent or given (widened to int64), and their raw dtypes
  int32 / int64 with a combine of fewer or more than 2**15 - 1 targets (``runtime._csr``'s int16 / int32 keys);
* shapes: an aligned rank of each rank block and K step (r = 16, 32, 48, 64, 128 and 144: the K loop), d and r that
  are not multiples of 16, x / grad_out / packed storage as views 2 bytes off a 16-byte boundary, d and f on both
  sides of the combine's 256-column tile, one expert of several row tiles and chunks (the chunked dW kernels, their
  workspace slots, a slot sum with a row length that is not a multiple of 16) next to empty ones;
* w_down row-major or K-major; every factor format triple of the low-bit table (``LS.AOT_FORMATS``: fp8 and
  ternary, forced-only, have none);
* a plain forward, a saving forward, the latent alone, and the backward of each gradient subset that changes a
  flag (x only, w_gate / w_up only, w_down only, scales and row weight only, all) with the saved tensors, and of
  all without them (the recompute);
* the router's sort: every index dtype (``route.sort_by_expert`` narrows or widens to int32 / int64) with and
  without router weights of each dtype;
* on the arches that ship them, the opt-in byte-plane down projection (``LowbitTiles.planes_down_lb=1``).

What the classes cannot reach (fp16 activations, a factor format or mix the low-bit table leaves out, a
``TSCT_TRITON_GLU_CFG`` override other than the shipped opt-in) is outside the AOT tables by design: JIT, and without
Triton the dispatch's status sends those calls to bmm (tests/package/test_dispatch_no_cubins.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Optional

import torch

from tsct import quant
from tsct.kernels import aot, launch
from tsct.kernels.layout import to_kmajor
from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import route
from tsct.kernels.triton_glu import glu as G
from tsct.kernels.triton_glu import specs as GS
from tsct.kernels.triton_lowbit import glu as L
from tsct.kernels.triton_lowbit import specs as LS

E, T, K = 3, 70, 2          # 140 routed rows: one expert of 138 rows (3 row tiles), one of 1, one empty
CHUNK = 64                  # rows per chunk of the chunked dW kernels (one row tile)
SCALES = ("none", "fp32", "like_x")  # as the kernels get them; one scale alone (or a mix of dtypes) becomes fp32
# (d, r, f, views): aligned shapes of every rank block / K step, then the generic ones (d and r not multiples of 16:
# a dX combine of d <= 256 and of d > 256 columns, both without 8-element rows), then aligned shapes whose inputs
# ("all": x, the factors and grad_out; "grad_out" alone, as the gradient of a torch.cat is) are views off a
# 16-byte boundary. The aligned f are no multiples of 8: the up kernel's masked-store variant (Y_PAD 0) is what a
# call without scatter into such rows launches; with scatter, or rows of f % 8 == 0, it takes the Y_PAD 1 one
GLU_SHAPES = ((32, 16, 44, None), (32, 32, 300, None), (32, 48, 44, None), (32, 64, 300, None),
              (32, 128, 44, None), (32, 144, 300, None), (20, 24, 37, None), (300, 24, 300, None),
              (32, 64, 40, "all"), (32, 64, 37, "grad_out"))
LOWBIT_SHAPES = ((64, 16, 44, None), (64, 32, 300, None), (64, 48, 44, None), (64, 64, 300, None),
                 (64, 128, 44, None), (64, 144, 300, None), (24, 24, 37, None), (64, 64, 37, "all"),
                 (64, 64, 40, "grad_out"))
NEEDS = ([True] * 7, [True] + [False] * 6, [False, True, True, False, False, False, False],
         [False, False, False, True, False, False, False], [False, False, False, False, True, True, True])
AOT_TORCH_DTYPES = tuple({"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in GS.AOT_DTYPES)
FORMAT_NAMES = {LS.NVFP4: "nvfp4", LS.SIGN: "sign", LS.FP8: "fp8", LS.TERNARY: "ternary"}
K_MULTIPLE = {"nvfp4": 16, "sign": 8, "fp8": 1, "ternary": 4}


def off16(t: torch.Tensor, misaligned: bool = True) -> torch.Tensor:
    """``t`` (contiguous) copied into a view that starts one element past a 16-byte boundary (a slice of a larger
    buffer, as a caller's view may be); ``t`` itself when not ``misaligned``."""
    if not misaligned:
        return t
    buf = torch.empty(t.numel() + 16 // t.element_size(), dtype=t.dtype)
    v = buf[1:1 + t.numel()].view(t.shape)
    v.copy_(t)
    assert v.data_ptr() % 16
    return v


def container(fmt: str, e: int, k: int, n: int, misaligned: bool = False):
    """A packed factor of logical shape [e, k, n] with random storage (the dry run reads no values); ``misaligned``:
    every storage tensor a view off a 16-byte boundary."""
    def o(t):
        return off16(t, misaligned)

    codes = torch.randint(0, 256, (e, n, k), dtype=torch.uint8)
    if fmt == "nvfp4":
        return quant.NVFP4Tensor(o(codes[..., :k // 2].contiguous()),
                                 o(torch.ones(e, n, k // 16).to(torch.float8_e4m3fn)), o(torch.ones(e)), "linear",
                                 (e, k, n))
    if fmt == "fp8":
        return quant.FP8Tensor(o(codes).view(torch.float8_e4m3fn), o(torch.ones(e, n)), (e, k, n))
    if fmt == "ternary":  # absmean scaling (the one with cubins)
        return quant.TernaryTensor(o(codes[..., :k // 4].contiguous()), None, o(torch.ones(e, n)), (e, k, n))
    return quant.SignTensor(o(codes[..., :k // 8].contiguous()), o(torch.ones(e, k)), o(torch.ones(e, n)), (e, k, n))


@dataclasses.dataclass
class Routing:
    """One routing of the T * K rows and its per-rank scales (functions of the rank)."""
    x: torch.Tensor
    offs: torch.Tensor
    sg: Callable
    su: Callable
    rw: Optional[torch.Tensor]
    gi: Optional[torch.Tensor]
    si: Optional[torch.Tensor]
    n_out: Optional[int]
    go: torch.Tensor


def _routing(dtype, d, f, scales, rw, gather, scatter, views, n_out=None, idx_dtype=torch.int64) -> Routing:
    m = T * K
    offs = torch.tensor([1, m - 1, m - 1], dtype=torch.int32)  # rows past offs[-1]: padding
    n_out = (n_out or T) if scatter else None
    sdt = {"none": None, "fp32": torch.float32, "like_x": dtype, "lone": dtype}[scales]

    def scale(rank):
        return torch.rand(E, rank).to(sdt) if sdt is not None else None

    tok = torch.arange(m) // K
    return Routing(off16(torch.randn(T if gather else m, d).to(dtype), views == "all"), offs, scale,
                   (lambda rank: None) if scales == "lone" else scale, torch.rand(m).to(dtype) if rw else None,
                   tok.to(idx_dtype) if gather else None, tok.to(idx_dtype) if scatter else None, n_out,
                   off16(torch.randn(n_out if scatter else m, f).to(dtype), views is not None))


def _run(mod, rt: Routing, wg, wu, wd, r) -> None:
    """Every entry point of one path's host code on one input: forward, saving forward, the backward of each
    gradient subset with the saved tensors and of all without them (and the low-bit latent alone)."""
    sg, su = rt.sg(r), rt.su(r)
    args = (rt.x, rt.offs, wg, wu, wd, sg, su, rt.rw, rt.gi, rt.si, rt.n_out)
    mod.grouped_glu_forward(*args)
    _, saved = mod.grouped_glu_forward_saved(*args)
    mod.grouped_glu_backward(rt.go, *args, NEEDS[0])  # recomputes what ``saved`` holds: the down kernel's BWD mode
    for need in NEEDS:
        mod.grouped_glu_backward(rt.go, *args, need, saved=saved)
    if mod is L:
        L.down_forward(rt.x, rt.offs, wg, wu, sg, su, rt.gi)


def run_glu() -> None:
    for dtype, scales, rw, gather, scatter, (d, r, f, views), kmajor in itertools.product(
            AOT_TORCH_DTYPES, SCALES, (False, True), (False, True), (False, True), GLU_SHAPES,
            (False, True)):
        rt = _routing(dtype, d, f, scales, rw, gather, scatter, views)
        mis = views == "all"
        wg, wu = off16(torch.randn(E, d, r).to(dtype), mis), off16(torch.randn(E, d, r).to(dtype), mis)
        wd = off16(torch.randn(E, r, f).to(dtype), mis)
        _run(G, rt, wg, wu, to_kmajor(wd) if kmajor else wd, r)
    # one scale alone (ones for the other: fp32 like a pair of fp32 scales); the combine's CSR: the raw index dtype
    # (csr_keys reads it) and int16 / int32 sort keys
    for dtype, scales, idx_dtype, n_out in itertools.product(AOT_TORCH_DTYPES, ("lone", "none"),
                                                             (torch.int32, torch.int64), (T, 1 << 15)):
        rt = _routing(dtype, 32, 40, scales, False, True, True, None, n_out=n_out, idx_dtype=idx_dtype)
        wg, wu, wd = (torch.randn(shape).to(dtype) for shape in ((E, 32, 64), (E, 32, 64), (E, 64, 40)))
        _run(G, rt, wg, wu, wd, 64)
    # sort_by_expert on the GPU: ids of any integer dtype, router weights of each accepted dtype or none
    for idt, wdt in itertools.product((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
                                      (None, torch.bfloat16, torch.float16, torch.float32)):
        ids = torch.randint(0, 5, (40, 2)).to(idt)
        route.sort_by_expert(ids, 5, torch.rand(40, 2).to(wdt) if wdt is not None else None)


def run_lowbit(triples=LS.AOT_FORMATS) -> None:
    for (fg, fu, fd), scales, rw, gather, scatter, (d, r, f, views) in itertools.product(
            triples, SCALES, (False, True), (False, True), (False, True), LOWBIT_SHAPES):
        names = [FORMAT_NAMES[q] for q in (fg, fu, fd)]
        if any(d % K_MULTIPLE[n] for n in names[:2]) or r % K_MULTIPLE[names[2]]:
            continue  # the format cannot hold this shape
        rt = _routing(torch.bfloat16, d, f, scales, rw, gather, scatter, views)
        mis = views == "all"
        wg, wu = container(names[0], E, d, r, mis), container(names[1], E, d, r, mis)
        _run(L, rt, wg, wu, container(names[2], E, r, f, mis), r)
    # views off a 16-byte boundary at every rank block and K step (the host code copies them: no generic launch
    # of an always-aligned triple, whatever the rank)
    for (fg, fu, fd), views, (d, r, f, _), indexed in itertools.product(
            triples, ("all", "grad_out"), LOWBIT_SHAPES[:6], (False, True)):
        names = [FORMAT_NAMES[q] for q in (fg, fu, fd)]
        rt = _routing(torch.bfloat16, d, f, "fp32", True, indexed, indexed, views)
        mis = views == "all"
        wg, wu = container(names[0], E, d, r, mis), container(names[1], E, d, r, mis)
        _run(L, rt, wg, wu, container(names[2], E, r, f, mis), r)


def ledger(cap: tuple[int, int], monkeypatch) -> set[str]:
    """Every key the host code requests on compute capability ``cap`` over the classes above."""
    keys: set[str] = set()

    class _Rec:
        def __init__(self, key):
            self.key = key

        def launch(self, grid, values, stream):
            assert all(int(g) >= 0 for g in grid), (self.key, grid)
            keys.add(self.key)

    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    monkeypatch.setattr(C, "device_capability", lambda dev: cap)
    monkeypatch.setattr(launch, "current_stream", lambda dev: 0)
    monkeypatch.setattr(aot, "kernel", lambda arch, key: _Rec(key))
    monkeypatch.setattr(aot, "index", lambda arch: {"kernels": {}})
    arch = aot.artifact_arch(cap)
    base = C.ARCH_CONFIGS[arch].update(f"chunk_bwd={CHUNK}")
    monkeypatch.setitem(C.ARCH_CONFIGS, arch, base)
    run_glu()
    run_lowbit()
    if arch in LS.OPT_IN_PLANES_DOWN:  # the opt-in byte-plane down projection its table ships
        monkeypatch.setitem(C.ARCH_CONFIGS, arch, C.ARCH_CONFIGS[arch].update("planes_down_lb=1"))
        run_lowbit([t for t in LS.AOT_FORMATS if set(t[:2]) <= set(LS.PLANE_FORMATS)])
    if LS.fused_variants(base, LS.NVFP4):  # the dz running the GLU backward (fused from fuse_tiles_lb row tiles,
        # fuse_rank_lb ranks) ... on every shape here
        monkeypatch.setitem(C.ARCH_CONFIGS, arch, base.update("fuse_tiles_lb=1,fuse_rank_lb=1"))
        run_lowbit([t for t in LS.AOT_FORMATS if t[2] == LS.NVFP4])
    return keys


def triton_config(arch: str):
    """The arch's tile config: what decides the keys of its Triton launches (the CUDA stand-ins of the dispatch,
    ``tsct.dispatch.CUDA_KERNELS``, never run on the ledger's CPU tensors). Two arches with equal ones have the same
    ledger."""
    return C.ARCH_CONFIGS[arch]
