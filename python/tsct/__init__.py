"""tsct: ahead-of-time compiled GPU kernels for low-rank (dual-latent GLU) Mixture-of-Experts.

Public API:
    tsct.ops.grouped_glu   the expert pass (design.md section 2)
    tsct.quant             NVFP4 and sign factor formats, STE fake-quant
    tsct.nn                expert layers (modules) on the op, the padded-bmm layer, expert parallelism
    tsct-probe             what this install can run here, and why (``python -m tsct.probe``)
    tsct-bench             the benchmark (``python -m tsct.bench``)

Importing tsct loads no native library and queries no device.
"""

__version__ = "0.1.0"

try:  # the commit an installed wheel was built from (CMakeLists.txt); absent in a source checkout
    from tsct._build_commit import commit as __git_commit__, dirty as _build_dirty  # noqa: F401
except ImportError:
    pass

from tsct import nn, ops, quant  # noqa: E402  (light modules: no device query, no native load)

__all__ = ["nn", "ops", "quant", "__version__"]
