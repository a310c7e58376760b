"""The low-bit family's AOT variant count per arch, derived here from its parts (not from the table it checks):
the test files that hold an index or the table against it share this one formula."""

from tsct.kernels.triton_lowbit import specs as LS


def n_lowbit(arch: str) -> int:
    """172 (2 gathers x 2 scale flags x 3 BWD / row-weight modes x aligned or not = 24 down-projection variants per
    format triple, plus the up / dz / dX-dW ones: lowbit_bwd_dx_dw has one d-block count per triple, ``LS.dxdw_ndb``),
    plus 24 per format triple on the arches that also ship lowbit_down_fwd's opt-in byte-plane variants
    (``LS.OPT_IN_PLANES_DOWN``)."""
    opt_in = 24 * len(LS.AOT_FORMATS) if arch in LS.OPT_IN_PLANES_DOWN else 0
    return 172 + opt_in
