"""The low-bit family's AOT variant count per arch, derived here from its parts (not from the table it checks):
the test files that hold an index or the table against it share this one formula."""

from tsct.kernels.triton_lowbit import specs as LS


def n_lowbit(arch: str) -> int:
    """For the NVFP4 / sign triples: 2 gathers x 2 scale flags x 3 BWD / row-weight modes = 12 down-projection variants
    per triple and alignment, 2 row weights x 5 K steps x 2 Y_PAD aligned + 2 x 2 generic up-projection and 2 x 2 x 2 dz
    ones per w_down format, 2 gathers x 3 gradient subsets x 2 alignments dX-dW ones per triple (one d-block count each,
    ``LS.dxdw_ndb``); the ``LS.always_aligned`` triples (uniform NVFP4 and the NVFP4-sign-NVFP4 mix, whose up / dz
    variants are uniform NVFP4's) have no generic ones: 128. Plus 68 per uniform fp8 / ternary triple the table holds
    (24 down, 24 up, 8 dz, 12 dX-dW: a w_down format of its own shares no up / dz variant; none now: they run through
    JIT), plus lowbit_down_fwd's opt-in byte-plane variants on ``LS.OPT_IN_PLANES_DOWN`` arches: 12 per NVFP4 / sign
    triple and alignment it can launch. Where the arch's table can fuse the GLU backward into the dz
    (``LS.fused_variants``, NVFP4 w_down) its 4 NVFP4 dz variants come six times more: 3 scale dtypes x 2 row
    weights."""
    decoded = sum(1 for t in LS.AOT_FORMATS if set(t) <= {LS.FP8, LS.TERNARY})
    planes = [t for t in LS.AOT_FORMATS if set(t) <= {LS.NVFP4, LS.SIGN}]
    opt_in = sum(12 if LS.always_aligned(*t) else 24 for t in planes) if arch in LS.OPT_IN_PLANES_DOWN else 0
    fused = 24 if LS.fused_variants(LS.CONFIGS[arch], LS.NVFP4) else 0
    return 128 + fused + 68 * decoded + opt_in
