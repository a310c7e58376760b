"""tsct: ahead-of-time compiled GPU kernels for low-rank (dual-latent GLU) Mixture-of-Experts.

Public API:
    tsct.ops.grouped_glu   the expert pass (design.md section 2)
    tsct.quant             NVFP4 and sign factor formats, STE fake-quant
    tsct-probe             what this install can run here, and why (``python -m tsct.probe``)
    tsct-bench             the benchmark (``python -m tsct.bench``)

Importing tsct loads no native library and queries no device.
"""

__version__ = "0.1.0"

from tsct import ops, quant  # noqa: E402  (light modules: no device query, no native load)

__all__ = ["ops", "quant", "__version__"]
