"""Kernel families of tsct, one folder per kind (design.md section 4).

    triton_glu   Triton bf16/fp16 grouped GLU, forward and backward (path "triton-bf16")

Nothing here is imported by ``import tsct``; ``tsct.dispatch`` imports a family when a path is
selected, so importing tsct never imports Triton or queries a device.
"""
