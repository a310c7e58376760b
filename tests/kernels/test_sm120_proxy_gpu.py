"""The sm_120 proxy build on an H200 (docs/decisions/0017): checks that the install and the dispatch really run
sm_120's Triton kernels, before the GPU suite runs through them (``scripts/gpu_suite.sh proxy``).

Skipped unless the installed tsct holds a proxy build for this GPU (``TSCT_TRITON_AOT_ARCHS=sm_120_proxy_sm90``).

- the install: this GPU loads the proxy arch; its index is sm_120's variant table key for key (glu and low-bit
  families), every cubin assembled for sm_90 within sm_120's 101,376 bytes of shared memory; the manifest says
  "NOT A RELEASE"; every proxy cubin loads here;
- the tile config is sm_120's: no CUDA C++ kernel replaces a Triton one (on sm_90a, bf16 dz and the NVFP4 / sign
  projections at r = 64 would), and the paths no proxy can run (W4A4, sm120-fp4) say so;
- through ``tsct.ops.grouped_glu`` at exactly those shapes, every launch is a proxy cubin ("aot"), none "native" or
  "jit", the up projection takes sm_120's byte-plane variant, and the results match the fp32 reference.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tsct import dispatch, native, quant  # noqa: E402
from tsct import reference as R  # noqa: E402
from tsct.kernels import aot  # noqa: E402
from tsct.kernels.layout import to_kmajor  # noqa: E402
from tsct.kernels.triton_common import runtime as C  # noqa: E402
from tsct.kernels.triton_common import specs as CS  # noqa: E402
from tsct.kernels.triton_glu import glu as G  # noqa: E402
from tsct.kernels.triton_glu import specs  # noqa: E402
from tsct.kernels.triton_lowbit import glu as L  # noqa: E402
from tsct.kernels.triton_lowbit import specs as LS  # noqa: E402
from tsct.ops import grouped_glu  # noqa: E402

CAP = tuple(torch.cuda.get_device_capability())
ARCH = aot.artifact_arch(CAP)
PROXY = aot.proxy(ARCH) if ARCH else None
if PROXY is None:
    pytest.skip(f"the installed tsct is not a proxy build for compute capability {CAP} (arch {ARCH})",
                allow_module_level=True)

DEV = torch.device("cuda")
TOL = 1e-2


def test_install_is_sm120s_table_assembled_for_sm90():
    of = PROXY["of"]
    assert (ARCH, of, PROXY["ptx"], tuple(PROXY["capability"])) == ("sm_120_proxy_sm90", "sm_120", "sm_90", CAP)
    idx = aot.index(ARCH)
    want = {s.key: s for s in specs.enumerate_specs(of)} | {s.key: s for s in LS.enumerate_specs(of)}
    assert set(idx["kernels"]) == set(want)
    for key, e in idx["kernels"].items():
        s = want[key]
        assert (e["num_warps"], e["num_stages"], e["ptx_arch"]) == (s.num_warps, s.num_stages, "sm_90"), key
        assert e["shared"] <= CS.MAX_SHARED["sm_120"] == PROXY["max_shared"] == 101376, key
    assert "NOT A RELEASE" in (native.manifest() or {}).get("proxy_build", "")
    for key in idx["kernels"]:  # loads every cubin on this GPU (cuModuleLoadData + attributes)
        assert aot.kernel(ARCH, key).info()["max_threads_per_block"] >= 32 * idx["kernels"][key]["num_warps"]


def test_config_is_sm120s_and_no_cuda_kernel_replaces_a_triton_one():
    cfg = C.tile_config(CAP)
    assert cfg == C.ARCH_CONFIGS["sm_120"]
    assert C.kernel_arch(CAP) == "sm_120"  # so no CUDA row of the dispatch (they are sm_90a's)
    assert not any(C.cuda_kernel(k.replaces, CAP, f) for k in dispatch.CUDA_KERNELS for f in k.formats)
    assert cfg.lowbit.planes_up_lb == 1 and cfg.glu.stages_down == 2  # two of sm_120's own tiles
    st = dispatch.status(dispatch.SM120_FP4, CAP, "nvfp4")  # the OMMA kernels are not proxied: refused, and why
    assert not st.ok and "12.0" in st.reason, st


def _problem(T, k, E, d, r, f, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (T, k), generator=g)
    ids[ids == 1] = 2  # one empty expert
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    tok = (order // k).to(DEV)
    p = dict(x=torch.randn(T, d, generator=g).to(DEV, torch.bfloat16),
             offs=torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32).to(DEV),
             s_gate=(1 + 0.1 * torch.randn(E, r, generator=g)).to(DEV),
             s_up=(1 + 0.1 * torch.randn(E, r, generator=g)).to(DEV),
             row_weight=torch.rand(T * k, generator=g).to(DEV), gather_idx=tok, scatter_idx=tok, num_out_rows=T)
    w = [torch.randn(E, d, r, generator=g) / d ** 0.5, torch.randn(E, d, r, generator=g) / d ** 0.5,
         torch.randn(E, r, f, generator=g) / r ** 0.5]
    return p, [t.to(DEV) for t in w]


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("fmt", ["bf16_kmajor", "nvfp4", "sign"])
def test_sm90_cuda_shapes_run_the_sm120_triton_kernels(fmt, monkeypatch):
    """r = 64: the shapes where an sm_90a install takes CUDA C++ kernels (bf16 K-major dz; NVFP4 / sign down and up)."""
    p, w = _problem(300, 2, 12, 256, 64, 5461, seed=3)
    if fmt == "bf16_kmajor":
        facs = [w[0].to(torch.bfloat16), w[1].to(torch.bfloat16), to_kmajor(w[2].to(torch.bfloat16))]
        dec, impl, fam = [f.float() for f in facs], "triton-bf16", G
        want = {"glu_down_fwd", "glu_up_fwd", "glu_bwd_dz", "glu_bwd_dx_dw"}
    else:
        facs = [quant.quantize(t, fmt) for t in w]
        dec, impl, fam = [quant.dequantize(f, dtype=torch.float32) for f in facs], "triton-lowbit", L
        want = {"lowbit_down_fwd", "lowbit_up_fwd", "lowbit_bwd_dz", "lowbit_bwd_dx_dw"}
    keys = []
    orig = aot.AotKernel.launch
    monkeypatch.setattr(aot.AotKernel, "launch", lambda self, *a: keys.append(self.entry["key"]) or orig(self, *a))
    monkeypatch.setenv("TSCT_TRITON_BACKEND", "aot")
    before = dict(fam.backend_counts())
    x = p["x"].clone().requires_grad_(True)
    y = grouped_glu(x, p["offs"], *facs, p["s_gate"], p["s_up"], row_weight=p["row_weight"],
                    gather_idx=p["gather_idx"], scatter_idx=p["scatter_idx"], num_out_rows=p["num_out_rows"],
                    impl=impl)
    go = torch.randn_like(y)
    y.backward(go)
    torch.cuda.synchronize()
    new = {kk: v - before.get(kk, 0) for kk, v in fam.backend_counts().items() if v != before.get(kk, 0)}
    assert new and all(b == "aot" for b, _ in new), new  # no "native" (CUDA C++) and no "jit" launch
    assert {kn for _, kn in new} >= want, new
    if fmt != "bf16_kmajor":  # sm_120 decodes w_down in byte planes in the up projection (r in 33..64)
        assert any(kk.startswith("lowbit_up_fwd|") and "PLANES=1" in kk for kk in keys), keys
    args = [p["x"].float(), p["offs"], *dec, p["s_gate"], p["s_up"], p["row_weight"], p["gather_idx"],
            p["scatter_idx"], p["num_out_rows"]]
    assert _rel(y, R.grouped_glu_forward(*args)) < TOL
    assert _rel(x.grad, R.grouped_glu_backward(go.float(), *args, [True] + [False] * 6)[0]) < TOL
