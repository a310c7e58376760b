"""The Triton runtime both Triton kernel families use (``triton_glu``: bf16 / fp16 factors; ``triton_lowbit``: packed
factors): the two families are peers that import this package, never each other.

    _kernels.py   the shared ``@triton.jit`` sources: tile map, row-tile and chunk lookups, the combine and its CSR
                  keys, padding zeroing, ``sort_by_expert``'s routing kernels, the weight-free GLU backward
                  (epilogue, scale sums, chunked dW, slot sums)
    runtime.py    their host side: the tile configs at run time (``TSCT_TRITON_GLU_CFG``), capability and alignment
                  checks, input normalisation, the launcher of the shared kernels, tile map, CSR, combine, zero-tail,
                  the backward plan and its weight-free steps
    route.py      ``tsct.ops.sort_by_expert`` on a GPU (route_rank -> cumsum -> route_place)
    specs.py      the kernel-spec machinery every family's table uses (``Config`` and the per-arch tile tables, arch
                  and proxy tables, ``KernelInfo``, ``Spec``, ``spec_key``) and the shared kernels' variants
    aot_build.py  the AOT builder of every family (cubins + one index per arch; run by CMake at wheel build)

The shared kernels are compiled and indexed as the "glu" family (``triton_glu.specs.KERNELS`` lists them; their index
entries and the sm_120 proxy verdicts have always been the glu family's). Importing this package imports neither
Triton nor torch.
"""
