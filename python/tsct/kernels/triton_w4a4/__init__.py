"""W4A4 grouped GLU kernels on Triton's ``tl.dot_scaled`` (issue 4 item 2): NVFP4 activations x NVFP4
factors, UE4M3 block scales per 16 elements, fp32 accumulation.

    w4a4.quantize_rows(x)                         NVFP4 rows, per-row second-level scale (Triton kernel)
    w4a4.up_forward(z_q, offs, w_down, rw)        grouped NVFP4 x NVFP4 up-projection [M, f]
    emulation.up_forward_model / w4a4_glu_model   the same math in torch (CPU oracle)
    specs.enumerate_specs(arch)                   the one variant table (JIT and AOT)
    aot_build.py                                  cubins for sm_90a (emulation) and sm_120 (built as sm_120f: OMMA)

Not wired into ``tsct.ops`` / dispatch yet. Importing this package imports neither Triton nor torch.
"""
