"""The low-bit family's AOT variant count per arch, derived here from its parts (not from the table it checks):
the test files that hold an index or the table against it share this one formula."""

from tsct.kernels.triton_lowbit import specs as LS


def n_lowbit(arch: str) -> int:
    """172 for the NVFP4 / sign triples (2 gathers x 2 scale flags x 3 BWD / row-weight modes x aligned or not = 24
    down-projection variants per format triple, plus the up / dz / dX-dW ones: lowbit_bwd_dx_dw has one d-block count
    per triple, ``LS.dxdw_ndb``), plus 68 per uniform fp8 / ternary triple (24 down, 24 up, 8 dz, 12 dX-dW: a w_down
    format of its own shares no up / dz variant), plus 24 per NVFP4 / sign triple on the arches that also ship
    lowbit_down_fwd's opt-in byte-plane variants (``LS.OPT_IN_PLANES_DOWN``)."""
    decoded = sum(1 for t in LS.AOT_FORMATS if set(t) <= {LS.FP8, LS.TERNARY})
    planes = sum(1 for t in LS.AOT_FORMATS if set(t) <= {LS.NVFP4, LS.SIGN})
    opt_in = 24 * planes if arch in LS.OPT_IN_PLANES_DOWN else 0
    return 172 + 68 * decoded + opt_in
