"""The shared Triton runtime (``tsct.kernels.triton_common``) under the two Triton kernel families, checked on the CPU.

- the source of every Triton kernel of both families, by fingerprint (``tsct.kernels.source_key``): a change of the
  package layout (moving kernels or helpers between modules, renaming host code) leaves every fingerprint as it is,
  while an edit of a kernel, a jit helper it calls or a constexpr global it reads changes one here, on purpose;
- the shared kernels stay the "glu" family's in the AOT tables (their index entries, spec keys and proxy verdicts):
  its table lists them with the runtime's parameters, its kernel module holds the runtime's own functions;
- the low-bit family's host code uses only public names of the runtime, and the bf16 family's launch counts include
  the shared kernels' (as ``triton_glu.glu.backend_counts`` always did).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import specs as CS
from tsct.kernels.triton_glu import specs as GS
from tsct.kernels.triton_lowbit import specs as LS

ROOT = Path(__file__).resolve().parents[2]

# tsct.kernels.source_key of each kernel. Update an entry only with an intended change of that kernel's source (the
# kernel, a jit function it calls, a constexpr global it reads); its sm_120 proxy verdict then says "source changed"
# until the proxy stage runs it again (tsct.kernels.sm120_proxy, docs/sm120.md).
FINGERPRINTS = {
    "glu": {
        "glu_down_fwd": "4b1cf567a2153d26",
        "glu_up_fwd": "e916da95730f92e7",
        "combine_rows": "900fcb176222429c",
        "zero_tail_rows": "3ca19f5790771e7d",
        "tile_cum": "4686e05faba7ea99",
        "csr_keys": "6322dadaadcab201",
        "route_rank": "7ae970344c25b689",
        "route_place": "66b9094d263bad19",
        "bwd_maps": "8c01d859be6c9f26",
        "glu_bwd_dz": "7c9b7dc95d7135d5",
        "glu_bwd_dwd": "b0dd8760609bba53",
        "bwd_slot_reduce": "d28f3356d7f0a0fb",
        "glu_bwd_epi": "375fbfa4253123f4",
        "glu_bwd_sred": "a7fcdbdeab649b68",
        "glu_bwd_dx_dw": "81e7019a10674fd1",
        "glu_bwd_dw": "7f44eaed32b055ac",
    },
    "lowbit": {
        "lowbit_down_fwd": "ffafcebec9fa9aaa",
        "lowbit_up_fwd": "b6766d14776506f0",
        "lowbit_bwd_dz": "c96833edf23efc55",
        "lowbit_bwd_dx_dw": "71488c8910a02dac",
    },
}


def test_kernel_sources_are_the_recorded_ones():
    pytest.importorskip("triton")
    from tsct.kernels.source_key import source_keys
    from tsct.kernels.triton_glu import _kernels as glu_kernels
    from tsct.kernels.triton_lowbit import _kernels as lowbit_kernels

    now = {"glu": source_keys(glu_kernels, GS.KERNELS), "lowbit": source_keys(lowbit_kernels, LS.KERNELS)}
    changed = {k: (FINGERPRINTS[f].get(k), v) for f in now for k, v in now[f].items() if FINGERPRINTS[f].get(k) != v}
    assert not changed, f"kernel sources changed (recorded, now): {changed}"
    assert {f: list(d) for f, d in now.items()} == {f: list(d) for f, d in FINGERPRINTS.items()}


def test_the_glu_family_holds_the_shared_kernels():
    """Every shared kernel is in the glu table with the runtime's own KernelInfo, and no family's own kernel is
    shared; the glu kernel module exposes the runtime's jit functions themselves (what the build compiles)."""
    assert set(CS.KERNELS) <= set(GS.KERNELS) and not set(CS.KERNELS) & set(LS.KERNELS)
    assert all(GS.KERNELS[k] is CS.KERNELS[k] for k in CS.KERNELS)
    assert not {k for k in GS.KERNELS if k not in CS.KERNELS and not k.startswith("glu_")}
    pytest.importorskip("triton")
    from tsct.kernels.triton_common import _kernels as common_kernels
    from tsct.kernels.triton_glu import _kernels as glu_kernels

    assert all(getattr(glu_kernels, k) is getattr(common_kernels, k) for k in CS.KERNELS)


def _runtime_names_used(path: Path) -> set[str]:
    """The attributes a module reads from ``triton_common.runtime`` imported ``as C``."""
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "C"}


def test_the_low_bit_family_uses_public_runtime_names():
    used = _runtime_names_used(ROOT / "python" / "tsct" / "kernels" / "triton_lowbit" / "glu.py")
    assert used and used <= set(C.__all__), sorted(used - set(C.__all__))
    assert all(hasattr(C, n) for n in C.__all__)


def test_public_runtime_names_have_docstrings():
    import inspect

    missing = [n for n in C.__all__ if callable(getattr(C, n)) and not inspect.getdoc(getattr(C, n))]
    assert not missing


def test_bf16_launch_counts_include_the_shared_kernels(monkeypatch):
    from tsct.kernels import launch
    from tsct.kernels.triton_glu import glu as G

    shared = launch.Family("triton-common", CS, "tsct.kernels.triton_common._kernels")
    bf16 = launch.Family("triton-bf16", GS, "tsct.kernels.triton_glu._kernels")
    monkeypatch.setattr(C, "FAMILY", shared)
    monkeypatch.setattr(G, "FAMILY", bf16)
    shared.count("aot", "combine_rows")
    shared.count("jit", "glu_bwd_epi")
    bf16.count("aot", "glu_up_fwd")
    bf16.count("native", "glu_bwd_dz")
    assert G.backend_counts() == {("aot", "combine_rows"): 1, ("jit", "glu_bwd_epi"): 1, ("aot", "glu_up_fwd"): 1,
                                  ("native", "glu_bwd_dz"): 1}
    assert C.backend_counts() == {("aot", "combine_rows"): 1, ("jit", "glu_bwd_epi"): 1}


@pytest.mark.parametrize("spec, rows", [("", 64), ("bm=32", 64), ("bm=128,chunk_bwd=512", 128)])
def test_selftest_chunks_fit_the_row_tiles(spec, rows):
    """The first-use self-test's backward runs with small chunks (``selftest._small_chunks``): chunks of 64 rows, or of
    one row tile where a tile config (TSCT_TRITON_GLU_CFG) has larger ones; a chunk size that is no multiple of bm
    would fail the self-test, and disable the path, for a reason that is not the kernels'. Restored on exit."""
    from tsct import selftest

    with C.overridden(spec):
        before = dict(C.ARCH_CONFIGS), C.CONFIG
        with selftest._small_chunks("triton-lowbit"):
            assert {c.shared.chunk_bwd for c in (*C.ARCH_CONFIGS.values(), C.CONFIG)} == {rows}
        assert dict(C.ARCH_CONFIGS) == before[0] and C.CONFIG is before[1]
        with selftest._small_chunks("bmm"):
            assert dict(C.ARCH_CONFIGS) == before[0]
