"""Process-wide settings, read once from the environment and changeable at run time.

``check_values``: whether ``grouped_glu`` validates the VALUES of ``offs``, ``gather_idx`` and
``scatter_idx`` (non-decreasing offsets, indices in range). On a GPU this reads those tensors on the
host, i.e. one device synchronization per call. While a CUDA graph is being captured or torch.compile
traces (values are not known then) the host read is replaced by device-side asserts, so a violation
still fails loudly. Set
``TSCT_CHECK_VALUES=0`` or ``tsct.config.check_values = False`` for sync-free eager calls once a
model's routing is trusted (docs/decisions/0004-validation.md). Shapes, dtypes and devices are
always checked; they cost no sync.

``eager_direct``: plain eager calls on CUDA tensors run the path's forward and backward through a
``torch.autograd.Function`` instead of the custom ops' dispatcher (same functions, same results; less
host time per call). torch.compile, FakeTensor, tensor subclasses and dispatch modes always get the
custom ops. ``TSCT_EAGER_DIRECT=0`` or ``tsct.config.eager_direct = False`` sends everything through
the ops (``tsct.ops._eager``).

``csr_side_stream``: the forward of a GPU path with ``scatter_idx`` builds the combine's CSR (a stable sort of
the targets, latency-bound small kernels) on a second, high-priority CUDA stream while the projections run on
the caller's stream, which waits for it before the combine. Same results either way; ``TSCT_CSR_SIDE_STREAM=0``
or ``tsct.config.csr_side_stream = False`` keeps everything on the caller's stream. Nothing is built when
``scatter_idx`` is the token tensor ``tsct.ops.sort_by_expert`` returned (with its offs): the sort's kernels
wrote that CSR already.

``warn_fallbacks``: warn (once per path and reason) when ``impl="auto"`` could not take the
preferred path. The counter in ``tsct.dispatch.fallback_counts()`` counts every time regardless.
"""

from __future__ import annotations

import os


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


check_values: bool = _env_flag("TSCT_CHECK_VALUES", True)
warn_fallbacks: bool = _env_flag("TSCT_WARN_FALLBACKS", True)
eager_direct: bool = _env_flag("TSCT_EAGER_DIRECT", True)
csr_side_stream: bool = _env_flag("TSCT_CSR_SIDE_STREAM", True)
