"""Kernel families of tsct, one folder per kind (design.md section 4).

    triton_common  the Triton runtime both Triton families use: shared kernels (tile map, combine, zero-tail,
                   routing, weight-free backward), their host side, the kernel-spec machinery and tile configs, and
                   the AOT builder of every family (``triton_common/aot_build.py``)
    triton_glu     Triton bf16/fp16 grouped GLU, forward and backward (path "triton-bf16")
    triton_lowbit  Triton grouped GLU on packed NVFP4 / sign / FP8 / ternary factors (path "triton-lowbit")
    sm120_fp4      CuTeDSL NVFP4 x NVFP4 kernels for sm_120 (path "sm120-fp4")

The two Triton families are peers on ``triton_common`` and never import each other. ``aot`` loads the shipped cubins
(``launch`` launches them, or Triton JIT), ``source_key`` fingerprints a Triton kernel's source, ``sm120_proxy`` holds
the sm_120 proxy verdicts.

Nothing here is imported by ``import tsct``; ``tsct.dispatch`` imports a family when a path is
selected, so importing tsct never imports Triton or queries a device.
"""
