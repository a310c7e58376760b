"""Small self-tests of each runnable path against an independent float64 computation.

Used by ``tsct-probe`` and, for paths never executed on their hardware (sm_120), on first use in a
process (design.md section 4): tsct.ops and the probe run them in a child process (``tsct.firstuse``),
because a kernel that faults there would kill the caller's CUDA context.
Each test returns a ``Result`` and never raises for a numerical disagreement: the caller decides what
a failure means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import torch

# rel-Frobenius tolerance per compute dtype: bf16 operands land between 1e-3 and 1e-2 (METHOD.md)
_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@dataclasses.dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float


#: rows per chunk of the backward's chunked dW reductions during a self-test (``SharedTiles.chunk_bwd``, a run-time
#: value of the same kernels): the problem's hot expert then spans several chunks and workspace slots. A tile config
#: with larger row tiles (``TSCT_TRITON_GLU_CFG``: bm=128) gets chunks of one row tile (chunk_bwd is a multiple of bm)
SELFTEST_CHUNK_ROWS = 64


def _problem(device, dtype, seed=0):
    """A small routed problem with an empty expert, a hot expert, odd f and padding rows; float64 master copy.
    f = 261: odd (rows at 2-byte offsets) and above 256, so the combine runs the wide tile that model widths take.
    r = 48 and d = 64: the low-bit kernels then take their b1 code paths (the up projection's rank in one K step of
    64, in byte planes on sm_120; a K step of 64 over d). Expert 0 takes most rows (more than two row tiles of 64,
    so the row kernels run their further-tile programs, and with ``SELFTEST_CHUNK_ROWS`` several chunks and slots),
    the others a few each: skewed routing's code paths, which a first-use self-test on the user's card must run too."""
    g = torch.Generator().manual_seed(seed)
    tokens, topk, experts, d, r, f, pad = 96, 2, 5, 64, 48, 261, 3
    ids = torch.randint(0, experts, (tokens * topk,), generator=g)
    ids[torch.rand(tokens * topk, generator=g) < 0.7] = 0  # the hot expert: 144 of 192 rows (3 tiles, the last partial)
    ids[ids == 2] = 3  # expert 2 is empty
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    tok = order // topk
    gather = torch.cat([tok, torch.zeros(pad, dtype=tok.dtype)])
    p64 = dict(
        x=torch.randn(tokens, d, generator=g, dtype=torch.float64),
        w_gate=torch.randn(experts, d, r, generator=g, dtype=torch.float64) / math.sqrt(d),
        w_up=torch.randn(experts, d, r, generator=g, dtype=torch.float64) / math.sqrt(d),
        w_down=torch.randn(experts, r, f, generator=g, dtype=torch.float64) / math.sqrt(r),
        s_gate=1 + 0.1 * torch.randn(experts, r, generator=g, dtype=torch.float64),
        s_up=1 + 0.1 * torch.randn(experts, r, generator=g, dtype=torch.float64),
        row_weight=torch.rand(tokens * topk + pad, generator=g, dtype=torch.float64),
    )
    idx = dict(offs=offs, gather_idx=gather, scatter_idx=gather, num_out_rows=tokens)
    return p64, idx, ids[order]


def _small_chunks(path: str):
    """Within the block, the Triton paths' backward sums dW over chunks of ``SELFTEST_CHUNK_ROWS`` rows (the same
    kernels; the chunk size is a run-time value), so the hot expert of ``_problem`` runs the chunked reductions and
    their workspace slots. Other paths: nothing changes."""
    if path not in ("triton-bf16", "triton-lowbit"):
        return contextlib.nullcontext()
    from tsct.kernels.triton_common import runtime

    # bm is a power of two on every arch: the largest (or 64) is a multiple of each, as Config.update requires
    rows = max([SELFTEST_CHUNK_ROWS] + [c.shared.bm for c in (*runtime.ARCH_CONFIGS.values(), runtime.CONFIG)])
    return runtime.overridden(f"chunk_bwd={rows}")


def _expected(p64, idx, expert_of_row):
    """float64 per-row computation, written from design.md section 2 (not the reference path)."""
    valid = int(idx["offs"][-1])
    out = torch.zeros(idx["num_out_rows"], p64["w_down"].shape[2], dtype=torch.float64)
    for i in range(valid):
        e = int(expert_of_row[i])
        xi = p64["x"][int(idx["gather_idx"][i])]
        gg = (xi @ p64["w_gate"][e]) * p64["s_gate"][e]
        uu = (xi @ p64["w_up"][e]) * p64["s_up"][e]
        out[int(idx["scatter_idx"][i])] += ((torch.nn.functional.silu(gg) * uu) @ p64["w_down"][e]) * p64["row_weight"][i]
    return out


def grouped_glu(path: str, device: torch.device, dtype: torch.dtype = torch.bfloat16, fmt: str = "bf16",
                backward: bool = False) -> Result:
    """Run ``grouped_glu(impl=path)`` on a small problem and compare with float64.

    ``fmt`` "nvfp4"/"sign"/"fp8"/"ternary" quantizes the factors first ("mixed": NVFP4 gate and down, sign up;
    "mixed-decoded": fp8 gate, ternary up, NVFP4 down); the
    expectation then uses the dequantized factors (same math), so the tolerance stays the compute dtype's.
    With ``backward`` the gradients of x, the scales, the row weights and the factors are compared too, against
    float64 autograd of the same oracle (tolerance 1.5x the forward's): a dense factor's own, a packed factor's
    through its master (``tsct.ops.quantize_master``, ``masters=``: the straight-through gradient, the gradient
    w.r.t. the decoded factor), so the packed paths' dW kernels run too.
    Dense factors run twice, w_down row-major and K-major (the transpose of a contiguous ``[E, f, r]``, the layout
    ``tsct.nn``'s layers store): the Triton kernels read the two layouts through different variants (``WD_T``), and
    a path is trusted on a new arch only for what ran. The result passes when both do.
    """
    if path == "sm120-fp4":  # W4A4: its own problem (K % 64) and oracle (the emulation of the same math)
        return sm120_fp4_forward(device, fmt=fmt if fmt in ("nvfp4", "sign") else "nvfp4")
    # the storage format of the factors ("bf16" = dense factors, run in `dtype`) and the compute dtype
    name = (f"grouped_glu[{path}, {'dense' if fmt == 'bf16' else fmt} factors, {str(dtype).replace('torch.', '')}"
            f"{', forward and backward' if backward else ''}]")
    if fmt != "bf16":
        return _grouped_glu_once(name, path, device, dtype, fmt, backward, kmajor_down=False)
    return all_of(name, [_grouped_glu_once(f"{name} w_down {lay}", path, device, dtype, fmt, backward, kmajor_down=k)
                         for lay, k in (("row-major", False), ("K-major", True))])


def _grouped_glu_once(name: str, path: str, device: torch.device, dtype: torch.dtype, fmt: str, backward: bool,
                      kmajor_down: bool) -> Result:
    """``grouped_glu``'s test with one w_down layout (``kmajor_down``: dense factors only)."""
    from tsct import quant
    from tsct.kernels.layout import to_kmajor
    from tsct.ops import grouped_glu as op
    from tsct.ops import quantize_master

    t0 = time.perf_counter()
    try:
        p64, idx, eor = _problem(device, dtype)
        p = {k: v.to(device, dtype) for k, v in p64.items()}
        facs = [p["w_gate"], p["w_up"], to_kmajor(p["w_down"]) if kmajor_down else p["w_down"]]
        masters = None
        if fmt != "bf16":
            mixes = {"mixed": ("nvfp4", "sign", "nvfp4"), "mixed-decoded": ("fp8", "ternary", "nvfp4")}
            fmts = mixes.get(fmt, (fmt,) * 3)
            masters = [w.requires_grad_(True) for w in facs] if backward else None  # their gradients: STE
            facs = [quantize_master(w, q) if backward else quant.quantize(w, q) for w, q in zip(facs, fmts)]
            for k, w in zip(("w_gate", "w_up", "w_down"), facs):
                p64[k] = quant.dequantize(w, dtype=torch.float32).double().cpu()
        grad_names = ["x", "s_gate", "s_up", "row_weight", "w_gate", "w_up", "w_down"]
        if backward:
            for k in grad_names:
                p64[k].requires_grad_(True)
            for k in ("x", "s_gate", "s_up", "row_weight"):
                p[k].requires_grad_(True)
            if fmt == "bf16":
                for w in facs:
                    w.requires_grad_(True)
        ix = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in idx.items()}

        def forward():
            return op(p["x"], ix["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                      gather_idx=ix["gather_idx"], scatter_idx=ix["scatter_idx"], num_out_rows=ix["num_out_rows"],
                      impl=path, masters=masters)

        want = _expected(p64, idx, eor)
        ref = want.detach()
        tol = _TOL[dtype]
        # with a backward to come the forward saves for it (other kernel variants: the row weight applied before
        # the up projection); the plain forward of inference (torch.no_grad) is checked first
        ys = ([("inference forward", torch.no_grad()(forward)())] if backward else []) + [("forward", forward())]
        errs = []
        for what, y in ys:
            got = y.detach().double().cpu()
            if not torch.isfinite(got).all():
                return Result(name, False, f"non-finite output ({what})", time.perf_counter() - t0)
            errs.append(((got - ref).norm() / ref.norm()).item())
        err = max(errs)
        if err >= tol or not backward:
            return Result(name, err < tol, f"rel err {err:.2e} (tol {tol:.0e})", time.perf_counter() - t0)
        y = ys[-1][1]
        g = torch.Generator().manual_seed(3)
        go64 = torch.randn(want.shape, generator=g, dtype=torch.float64)
        with _small_chunks(path):
            y.backward(go64.to(device, dtype))
        (want * go64).sum().backward()
        have = {"x": p["x"], "s_gate": p["s_gate"], "s_up": p["s_up"], "row_weight": p["row_weight"]}
        have.update(zip(("w_gate", "w_up", "w_down"), facs if masters is None else masters))
        worst = ("", 0.0)
        valid = int(idx["offs"][-1])
        for k, t in have.items():
            gd, gw = t.grad, p64[k].grad
            if gd is None or not torch.isfinite(gd).all():
                return Result(name, False, f"gradient of {k} missing or non-finite", time.perf_counter() - t0)
            gd = gd.double().cpu()
            if k == "row_weight":  # padding rows: exact zeros
                if gd[valid:].abs().max() != 0:
                    return Result(name, False, "padding rows got a row-weight gradient", time.perf_counter() - t0)
                gd, gw = gd[:valid], gw[:valid]
            e = ((gd - gw).norm() / gw.norm().clamp_min(1e-30)).item()
            worst = max(worst, (k, e), key=lambda kv: kv[1])
        gtol = 1.5 * tol
        ok = worst[1] < gtol
        return Result(name, ok, f"rel err {err:.2e} (tol {tol:.0e}; forward with and without grad); worst gradient "
                      f"{worst[0]} {worst[1]:.2e} "
                      f"(tol {gtol:.0e})", time.perf_counter() - t0)
    except Exception as exc:  # a self-test reports, it does not crash the probe
        return Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def native_quant(device: torch.device) -> list[Result]:
    """CUDA quantize/decode kernels (NVFP4, sign, FP8, ternary) against the torch reference, bit for bit, on a small
    random input."""
    from tsct import quant

    out = []
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(3, 64, 200, generator=g) * torch.logspace(-3, 3, 200)).to(device, torch.bfloat16)
    for layout in ("linear", "swizzled_128x4"):
        t0 = time.perf_counter()
        name = f"nvfp4 quantize+decode native vs torch [{layout}]"
        try:
            a = quant.quantize_nvfp4(w, layout=layout, backend="native")
            b = quant.quantize_nvfp4(w, layout=layout, backend="torch")
            same = (torch.equal(a.codes, b.codes)
                    and torch.equal(a.block_scale.view(torch.uint8), b.block_scale.view(torch.uint8))
                    and torch.equal(a.global_scale, b.global_scale))
            da = quant.dequantize(a, backend="native")
            db = quant.dequantize(b, backend="torch")
            same_dec = torch.equal(da.view(torch.int16), db.view(torch.int16))
            out.append(Result(name, same and same_dec, "bit-exact" if same and same_dec else
                              f"MISMATCH (encode equal: {same}, decode equal: {same_dec})", time.perf_counter() - t0))
        except Exception as exc:
            out.append(Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0))
    t0 = time.perf_counter()
    try:
        a = quant.quantize_sign(w, backend="native")
        b = quant.quantize_sign(w, backend="torch")
        same = torch.equal(a.bits, b.bits) and torch.equal(
            quant.dequantize(a, backend="native").view(torch.int16), quant.dequantize(b, backend="torch").view(torch.int16))
        out.append(Result("sign pack+decode native vs torch", same, "bit-exact" if same else "MISMATCH",
                          time.perf_counter() - t0))
    except Exception as exc:
        out.append(Result("sign pack+decode native vs torch", False, f"{type(exc).__name__}: {exc}",
                          time.perf_counter() - t0))
    for fmt, opts in (("fp8", {}), ("ternary", {"scaling": "absmean"}), ("ternary", {"scaling": "rank1"})):
        t0 = time.perf_counter()
        name = f"{fmt} quantize+decode native vs torch" + (f" [{opts['scaling']}]" if opts else "")
        try:
            a = quant.quantize(w, fmt, backend="native", **opts)
            b = quant.quantize(w, fmt, backend="torch", **opts)
            same = torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8)) and torch.equal(
                quant.dequantize(a, backend="native").view(torch.int16),
                quant.dequantize(b, backend="torch").view(torch.int16))
            out.append(Result(name, same, "bit-exact" if same else "MISMATCH", time.perf_counter() - t0))
        except Exception as exc:
            out.append(Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0))
    return out


def all_of(name: str, results: list[Result]) -> Result:
    """One ``Result`` named ``name`` for several: ok when every one is (and there is at least one); the detail counts
    them and names each failing one with its detail. Raises ValueError for an empty list (nothing was tested)."""
    if not results:
        raise ValueError(f"all_of({name!r}): no results (nothing was tested)")
    bad = [r for r in results if not r.ok]
    detail = (f"all {len(results)} passed ({', '.join(sorted({r.detail for r in results}))})" if not bad else
              f"{len(bad)} of {len(results)} failed: " + "; ".join(f"{r.name}: {r.detail}" for r in bad))
    return Result(name, not bad, detail, sum(r.seconds for r in results))


#: sort_by_expert's self-test cases: T, k, E, ids' dtype, router weights' dtype (None: none). Together they launch
#: every variant of the routing kernels: route_rank for int64 and int32 ids (int16 ones are widened to int32),
#: route_place without weights and gathering bf16, fp16 and fp32 ones; ids in [-1, E + 3) give padding rows
_SORT_CASES = ((3000, 2, 37, torch.int64, torch.bfloat16), (1500, 3, 37, torch.int32, torch.float16),
               (1023, 1, 5, torch.int16, torch.float32), (2000, 2, 300, torch.int64, None))


def _sort_differs(s, ids: torch.Tensor, e: int, w, kernels: bool) -> list[str]:
    """What of ``sort_by_expert``'s result ``s`` differs from a stable ``torch.argsort`` and a count (and, where the
    kernels ran, the combine's CSR they link to the token tensor from the token's own stable sort)."""
    t, k = ids.shape
    flat = ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < e), flat, e)
    order = torch.argsort(key, stable=True)
    offs = torch.cumsum((key[:, None] == torch.arange(e, device=ids.device)).sum(0), 0).to(torch.int32)
    pairs = (("order", s.order, order), ("offs", s.offs, offs), ("token", s.token, order // k))
    bad = [name for name, got, want in pairs if got.dtype != want.dtype or not torch.equal(got, want)]
    if w is None:
        if s.row_weight is not None:
            bad.append("row_weight (expected None)")
    elif s.row_weight.dtype != torch.float32 or not torch.equal(s.row_weight, w.reshape(-1)[order].float()):
        bad.append("row_weight")
    if kernels:
        from tsct.kernels.triton_common import runtime

        csr = runtime.linked_csr(s.token, s.offs, t * k, t)
        if csr is None:
            bad.append("no combine CSR linked to the token tensor")
        elif not (torch.equal(csr[1], torch.arange(t + 1, device=ids.device) * k)
                  and torch.equal(csr[0], torch.argsort(s.token, stable=True))):
            bad.append("the combine CSR linked to the token tensor")
    return bad


def sort_by_expert(device: torch.device) -> Result:
    """``tsct.ops.sort_by_expert`` against a stable ``torch.argsort`` and a count, bit for bit: ``order``, ``offs``,
    ``token`` and ``row_weight`` (and, where the Triton kernels ran, the combine's CSR they link to ``token``), for
    int64, int32 and int16 ids with padding entries, bf16, fp16, fp32 and no router weights (``_SORT_CASES``: every
    variant of the kernels). The detail names what ran (the Triton kernels or torch's sort). It is the first-use
    self-test of the routing kernels (``--path triton-routing`` of ``tsct.selftest_child``)."""
    from tsct.ops import routing

    t0 = time.perf_counter()
    name = "sort_by_expert vs stable argsort"
    g = torch.Generator().manual_seed(2)
    ran, bad = set(), []
    try:
        for t, k, e, id_dtype, w_dtype in _SORT_CASES:
            ids = torch.randint(-1, e + 3, (t, k), generator=g).to(device, id_dtype)
            w = torch.rand(t, k, generator=g).to(device, w_dtype) if w_dtype is not None else None
            s = routing.sort_by_expert(ids, e, w)
            kernels = routing.uses_kernels(ids, e)
            ran.add("Triton kernels" if kernels else "torch sort")
            bad += [f"{what} (T={t}, k={k}, E={e}, {str(id_dtype)[6:]} ids)"
                    for what in _sort_differs(s, ids, e, w, kernels)]
        what = " and ".join(sorted(ran))
        return Result(name, not bad, f"bit-exact ({what})" if not bad else f"MISMATCH ({what}): " + "; ".join(bad),
                      time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 (reported as the result)
        return Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def sm120_fp4_forward(device: torch.device, forward=None, seed: int = 0, fmt: str = "nvfp4") -> Result:
    """First-use self-test of the sm120-fp4 forward (W4A4: the activations are NVFP4 too).

    A small routed problem (E = 5 with an empty expert, d = 128, r = 64, f = 37, padding rows, gather,
    scatter, row weights, per-rank scales) with ``fmt`` ("nvfp4" or "sign") factors, run through
    ``forward`` (default: the path's ``grouped_glu_forward``), against the torch emulation of the same
    kernels (``tsct.emulation.grouped_glu_w4a4`` / ``grouped_glu_w4a4_sign`` on the same packed
    factors, CPU) followed by a float64 combine. Tolerance 3e-2 relative (Frobenius): both quantize x and z to NVFP4 with the same
    recipe; they differ by fp32 accumulation order and its effect on z's bf16 rounding. A fragment
    or layout mistake in a kernel gives O(1) errors. Also checks the output is finite and that
    padding-free tokens that receive no row are exactly 0.
    """
    from tsct import quant
    from tsct.emulation import grouped_glu_w4a4, grouped_glu_w4a4_sign
    from tsct.emulation.grouped_glu import GluFactors
    from tsct.emulation.sign_glu import SignGluFactors
    from tsct.kernels.sm120_fp4 import glu as sglu

    t0 = time.perf_counter()
    name = f"grouped_glu[sm120-fp4, {fmt}, bf16] vs emulation"
    try:
        if forward is None:
            from tsct.kernels import sm120_fp4
            forward = sm120_fp4.grouped_glu_forward
        g = torch.Generator().manual_seed(seed)
        tokens, topk, experts, d, r, f, pad = 24, 2, 5, 128, 64, 37, 3
        ids = torch.randint(0, experts, (tokens * topk,), generator=g)
        ids[ids == 2] = 3
        ids[0:2] = 4  # token 0 -> expert 4 twice is fine; token 23 gets no row below
        order = torch.argsort(ids, stable=True)
        offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
        tok = order // topk
        tok = torch.where(tok == tokens - 1, torch.zeros_like(tok), tok)  # token 23 receives nothing
        gather = torch.cat([tok, torch.full((pad,), 10 ** 6)])  # padding entries never read
        x = torch.randn(tokens, d, generator=g).to(torch.bfloat16)
        wg = torch.randn(experts, d, r, generator=g) / d ** 0.5
        wu = torch.randn(experts, d, r, generator=g) / d ** 0.5
        wd = torch.randn(experts, r, f, generator=g) / r ** 0.5
        sg = 1 + 0.1 * torch.randn(experts, r, generator=g)
        su = 1 + 0.1 * torch.randn(experts, r, generator=g)
        rw = torch.rand(tokens * topk + pad, generator=g)
        m = gather.shape[0]
        valid = int(offs[-1])
        xr = torch.zeros(m, d)
        xr[:valid] = x[gather[:valid]].float()
        if fmt == "sign":
            qg, qu, qd = (quant.quantize_sign(w, backend="torch") for w in (wg, wu, wd))
            sfacs = SignGluFactors(gate=qg, up=qu, down=qd, gu_bits=torch.stack((qg.bits, qu.bits)),
                                   gu_col=torch.stack((qg.scale_n, qu.scale_n)))
            y_emu = grouped_glu_w4a4_sign(xr, offs, sfacs, sg, su, rw)
        else:
            qg, qu, qd = (quant.quantize_nvfp4(w, backend="torch") for w in (wg, wu, wd))
            # the oracle: the emulation on the same packed factors, laid out by the path's own prep
            ops = sglu.prepare_factors(qg, qu, qd)
            facs = GluFactors(gu_codes=ops.gu_codes, gu_sfb=ops.gu_sfb.view(torch.float8_e4m3fn), gate=qg, up=qu,
                              down=qd, down_sfb=ops.down_sfb.view(torch.float8_e4m3fn))
            y_emu = grouped_glu_w4a4(xr, offs, facs, sg, su, rw)
        want = torch.zeros(tokens, f, dtype=torch.float64)
        want.index_add_(0, gather[:valid], y_emu[:valid].double())
        dev = torch.device(device)
        to = lambda t: t.to(dev)  # noqa: E731
        qgd, qud, qdd = (qq.replace(**{k: to(getattr(qq, k)) for k in qq._STORAGE}) for qq in (qg, qu, qd))
        y = forward(to(x), to(offs), qgd, qud, qdd, to(sg), to(su), to(rw), to(gather), to(gather), tokens)
        got = y.double().cpu()
        if not torch.isfinite(got).all():
            return Result(name, False, "non-finite output", time.perf_counter() - t0)
        if got[tokens - 1].abs().max() != 0:
            return Result(name, False, "a token with no routed row is not 0", time.perf_counter() - t0)
        err = ((got - want).norm() / want.norm()).item()
        return Result(name, err < 3e-2, f"rel err vs emulation {err:.2e} (tol 3e-02)", time.perf_counter() - t0)
    except Exception as exc:  # a self-test reports, it does not crash
        return Result(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
