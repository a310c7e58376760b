"""The sm120-fp4 forward on a GPU with only the MMA kernels emulated (design.md section 6: "the same
math checked on the H200 through an emulated path").

``tsct.kernels.sm120_fp4.glu.forward`` runs with the REAL CUDA activation quantizer
(``tsct_nvfp4_quantize_rows_grouped``), the real host plan, the real combine, and
``tsct.kernels.sm120_fp4.emulated.emulated_gemm`` in place of the sm_120a GEMM entry (same arguments,
contract asserted). Expected: bit-identical to the same forward on the CPU with the torch quantizer
(without scatter), deterministic with scatter, and the first-use self-test passes with it. What this
does NOT cover: the CuTeDSL kernels' own fragment code (no sm_120 here; docs/sm120.md).

    pytest -s -m gpu tests/kernels/test_sm120_fp4_emulated_gpu.py     (TSCT_GPU_LOG=path appends the lines)
"""

from __future__ import annotations

import functools

import pytest
import torch
from _gpu_log import log
from _sm120_problem import make_problem

from tsct import quant, selftest
from tsct.kernels.sm120_fp4 import glu
from tsct.kernels.sm120_fp4.emulated import emulated_gemm, emulated_sign_gemm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _problem(seed, d, r, f, experts, tokens, topk=2, pad=5, fmt="nvfp4"):
    x, offs, ws, sg, su, rw, gather, tokens = make_problem(seed, d, r, f, experts, tokens, topk, pad)
    qfn = quant.quantize_sign if fmt == "sign" else quant.quantize_nvfp4
    return x, offs, [qfn(w, backend="torch") for w in ws], sg, su, rw, gather, tokens


def _to(q, dev):
    return q.replace(**{k: getattr(q, k).to(dev) for k in q._STORAGE})


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
@pytest.mark.parametrize("shape", [(128, 64, 37, 6, 40), (256, 64, 96, 16, 200), (2048, 64, 200, 8, 64)],
                         ids=lambda s: "d{}_r{}_f{}_E{}_T{}".format(*s))
def test_forward_with_cuda_quantizer_matches_cpu(shape, fmt):
    d, r, f, e, t = shape
    x, offs, qs, sg, su, rw, gather, tokens = _problem(0, d, r, f, e, t, fmt=fmt)
    gemm = emulated_sign_gemm if fmt == "sign" else emulated_gemm
    dev = torch.device("cuda")
    cpu = glu.forward(x, offs, *qs, sg, su, rw, gather, None, None, gemm=gemm, quant_backend="torch")
    gpu = glu.forward(x.to(dev), offs.to(dev), *[_to(q, dev) for q in qs], sg.to(dev), su.to(dev), rw.to(dev),
                      gather.to(dev), None, None, gemm=gemm, quant_backend="native")
    same = torch.equal(gpu.cpu(), cpu)
    log(f"[{'PASS' if same else 'FAIL'}] sm120-fp4 {fmt} forward, emulated MMA, CUDA quantizer vs CPU torch, [M, f], "
        f"d={d} r={r} f={f} E={e}: {'bit-identical' if same else 'DIFFERS'}")
    assert same
    ys = [glu.forward(x.to(dev), offs.to(dev), *[_to(q, dev) for q in qs], sg.to(dev), su.to(dev), rw.to(dev),
                      gather.to(dev), gather.to(dev), tokens, gemm=gemm, quant_backend="native")
          for _ in range(2)]
    want = torch.zeros(tokens, f, dtype=torch.float64)
    valid = int(offs[-1])
    want.index_add_(0, gather[:valid], cpu[:valid].double())
    err = ((ys[0].double().cpu() - want).norm() / want.norm()).item()
    det = torch.equal(ys[0], ys[1])
    log(f"[{'PASS' if det and err < 1e-2 else 'FAIL'}] with scatter: rel err vs float64 combine {err:.1e}, "
        f"deterministic {det}")
    assert det and err < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "sign"])
def test_selftest_harness_on_gpu_with_emulated_mma(fmt):
    gemm = emulated_sign_gemm if fmt == "sign" else emulated_gemm
    fwd = functools.partial(glu.forward, gemm=gemm, quant_backend="native")
    r = selftest.sm120_fp4_forward(torch.device("cuda"), forward=fwd, fmt=fmt)
    log(f"[{'PASS' if r.ok else 'FAIL'}] first-use self-test harness ({fmt}) with the emulated MMA on the GPU: "
        f"{r.detail}")
    assert r.ok, r.detail
