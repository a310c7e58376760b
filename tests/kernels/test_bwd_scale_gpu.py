"""The backward at scale on a CUDA GPU: skewed routing, many experts, many tokens (docs/decisions/0016).

The harness of tests/kernels/test_triton_glu_gpu.py (NaN-poisoned allocator, fp32 reference of ``tsct.reference``,
relative Frobenius error, tolerance 1e-2 for bf16 operands) on the edge shapes of the backward's schedule:

* b1 with Zipf 1.2 routing (the largest expert some 6,800 rows, a few dozen empty experts), K-major w_down (the
  CUDA dz on sm_90) and row-major (the Triton dz), and the NVFP4 low-bit path;
* one expert with 99 % of the rows and most experts empty;
* E = 16384 (two rows per expert on average), T = 65536 at b1's d, r, f.

Each case: the forward and all seven gradients against the reference, empty experts' dW and d s exact zeros, and a
second run with the same bits. ``test_chunk_size_changes_only_dw_rounding``: two chunk sizes of the dW reduction give
the same dX, d s and d row_weight bits, and dW within ``CHUNK_TOL`` (the fp32 sums differ in order only; each rounds
once to bf16). Its speed under skew is measured by ``tsct-bench --sweep routing`` (bench/results), not here.

    PYTHONPATH=python python3 -m pytest -q tests/kernels/test_bwd_scale_gpu.py     (scripts/gpu_suite.sh bwd)
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import zlib

import pytest
import torch

pytestmark = pytest.mark.gpu

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.bench import routing  # noqa: E402
from tsct.kernels import triton_glu as TGK  # noqa: E402
from tsct.kernels import triton_lowbit as TL  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_glu import glu as G  # noqa: E402

_spec = importlib.util.spec_from_file_location("_tg_scale", pathlib.Path(__file__).with_name("test_triton_glu_gpu.py"))
TG = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = TG  # dataclasses look their module up in sys.modules
_spec.loader.exec_module(TG)  # its Case, input maker and helpers (not its tests)

DEV = TG.DEV
TOL = 1e-2
CHUNK_TOL = 4e-3  # dW at two chunk sizes: fp32 sums in another order, each rounded once to bf16 (2^-9 per element)


def zipf_counts(T: int, k: int, E: int, a: float, seed: int = 0) -> tuple:
    """Rows per expert of the benchmark's Zipf router (``tsct.bench.routing.route``), on the CPU."""
    ids, _ = routing.route(T, E, k, routing="zipf", zipf_exponent=a, generator=torch.Generator().manual_seed(seed),
                           device="cpu", dtype=torch.float32)
    return tuple(int(c) for c in torch.bincount(ids.flatten(), minlength=E))


def hot_counts(T: int, k: int, E: int) -> tuple:
    """Two rows in every fourth expert (at most 10 % of the rows), every other row in one expert, the others empty."""
    m = T * k
    c = [0] * E
    rest = m - int(0.9 * m)
    for i in range(0, E, 4):
        if rest <= 0:
            break
        c[i] = min(2, rest)
        rest -= c[i]
    c[E // 2 + 1] += m - sum(c)
    return tuple(c)


Z12 = zipf_counts(16384, 2, 1024, 1.2)
CASES = [
    TG.Case("b1_zipf12_kmajor", T=16384, k=2, E=1024, d=2048, r=64, f=5461, counts=Z12, kmajor=True),
    TG.Case("b1_zipf12_rowmajor", T=16384, k=2, E=1024, d=2048, r=64, f=5461, counts=Z12, pad=5),
    TG.Case("hot_expert_kmajor", T=8192, k=2, E=256, d=512, r=64, f=5461, counts=hot_counts(8192, 2, 256), pad=3,
            kmajor=True),
    TG.Case("e16384_kmajor", T=16384, k=2, E=16384, d=256, r=64, f=517, pad=2, kmajor=True),
    TG.Case("t65536_kmajor", T=65536, k=2, E=1024, d=2048, r=64, f=5461, kmajor=True),
]
LOWBIT = ["b1_zipf12_rowmajor", "hot_expert_kmajor"]  # NVFP4 factors on these shapes


def _case(name):
    return next(c for c in CASES if c.name == name)


_cache: dict = {}


def results(c, fmt=None):
    """(inputs, fp32 reference forward and gradients, two runs of (forward, gradients)) of one case, computed once."""
    key = (c.name, fmt)
    if key in _cache:
        return _cache[key]
    _cache.clear()  # keep one case's tensors alive at a time
    p = TG.make_inputs(c, seed=zlib.crc32(c.name.encode()) % 10000)
    fam = TGK
    if fmt:
        fam = TL
        q = dict(p)
        for k in ("w_gate", "w_up", "w_down"):
            q[k] = quant.quantize(p[k].float(), fmt)
        ref_p = {k: (quant.dequantize(v, dtype=torch.float32, backend="torch") if quant.is_quantized(v) else v)
                 for k, v in q.items()}
        p = q
    else:
        ref_p = p
    ref = R.grouped_glu_forward(*TG.args_of(ref_p, fp32=True))
    go = torch.randn(ref.shape, device=DEV).to(c.dtype)
    ref_grads = R.grouped_glu_backward(go.float(), *TG.args_of(ref_p, fp32=True), [True] * 7)
    runs = []
    for _ in range(2):
        TG.poison()
        out, saved = fam.grouped_glu_forward_saved(*TG.args_of(p))
        TG.poison()
        grads = fam.grouped_glu_backward(go, *TG.args_of(p), [True] * 7, saved=saved)
        torch.cuda.synchronize()
        runs.append((out, grads))
    _cache[key] = (p, ref, ref_grads, runs, go)
    return _cache[key]


PARAMS = [(c, None) for c in CASES] + [(_case(n), "nvfp4") for n in LOWBIT]


@pytest.mark.parametrize("c,fmt", PARAMS, ids=lambda v: v if isinstance(v, str) or v is None else v.name)
def test_against_reference_and_deterministic(c, fmt):
    p, ref, ref_grads, runs, _ = results(c, fmt)
    (out, grads), (out2, grads2) = runs
    assert not out.isnan().any() and TG.rel_err(out, ref) < TOL
    assert torch.equal(out, out2), "forward not deterministic"
    counts = torch.diff(p["offs"], prepend=p["offs"].new_zeros(1))
    empty = (counts == 0).nonzero().flatten()
    for name, g, g2, rg in zip(TG.NAMES, grads, grads2, ref_grads):
        if rg is None:
            assert g is None, name
            continue
        assert not g.isnan().any(), f"{name}: NaN (unwritten?)"
        err = TG.rel_err(g, rg)
        assert err < TOL, f"{name}: rel err {err:.3e}"
        assert torch.equal(g, g2), f"{name}: two runs differ"
        if name in ("w_gate", "w_up", "w_down", "s_gate", "s_up") and empty.numel():
            assert (g[empty] == 0).all(), f"{name}: empty experts' gradients must be exact zeros"


def test_chunk_size_changes_only_dw_rounding():
    c = _case("hot_expert_kmajor")
    p, _, _, runs, go = results(c)
    # the hot expert in 254 chunks instead of 32; room for the 513 slots of 1.4 MB that chunks of 64 rows may need
    with G.overridden("chunk_bwd=64,ws_bwd_mib=1024"):
        cfg = C.tile_config(torch.cuda.get_device_capability())
        assert C.chunk_size(cfg, p["gather_idx"].shape[0], c.r * c.f) == 64
        _, saved = TGK.grouped_glu_forward_saved(*TG.args_of(p))
        grads = TGK.grouped_glu_backward(go, *TG.args_of(p), [True] * 7, saved=saved)
    base = runs[0][1]
    for i in (0, 4, 5, 6):
        assert torch.equal(grads[i], base[i]), f"{TG.NAMES[i]} depends on the chunk size"
    for i in (1, 2, 3):
        err = TG.rel_err(grads[i], base[i])
        assert err < CHUNK_TOL, f"{TG.NAMES[i]}: {err:.2e} between chunk sizes"


@pytest.mark.parametrize("fmt", [None, "nvfp4"], ids=["bf16", "nvfp4"])
def test_side_stream_gives_the_same_bits_and_is_joined(fmt, monkeypatch):
    """The chunked dW kernels beside the row kernels (``tsct.config.side_stream``): the gradients of the caller's
    stream bit for bit, and the stream order holds both ways. ``late``: the side stream starts ~50 ms late (a sleep
    queued on it when the backward takes it) and the gradients are copied on the caller's stream at once: the
    backward waits for its side work. ``early``: the caller's stream sleeps ~50 ms after each mark
    (``SideWork.ready``), so side work that read what the caller's stream writes after its mark would read the
    poisoned allocator's NaN."""
    from tsct import config

    c = _case("hot_expert_kmajor")
    p, _, _, runs, go = results(c, fmt)
    fam = TL if fmt else TGK
    base = runs[0][1]
    side_stream, ready = C.side_stream, C.SideWork.ready

    def late(device, high=True):
        s = side_stream(device, high)
        with torch.cuda.stream(s):
            torch.cuda._sleep(100_000_000)
        return s

    def early(self):
        ev = ready(self)
        torch.cuda._sleep(100_000_000)  # on the caller's stream, after the mark
        return ev

    for name, side, stream_of, ready_of in (("late", True, late, ready), ("early", True, side_stream, early),
                                            ("off", False, side_stream, ready)):
        monkeypatch.setattr(config, "side_stream", side)
        monkeypatch.setattr(C, "side_stream", stream_of)
        monkeypatch.setattr(C.SideWork, "ready", ready_of)
        _, saved = fam.grouped_glu_forward_saved(*TG.args_of(p))
        TG.poison()
        grads = fam.grouped_glu_backward(go, *TG.args_of(p), [True] * 7, saved=saved)
        copies = [g.clone() for g in grads]  # on the caller's stream, before any host synchronization
        torch.cuda.synchronize()
        for g_name, a, b in zip(TG.NAMES, copies, base):
            assert torch.equal(a, b), f"{g_name}: side stream {name} differs from the plain run"
