"""Where a call's device work is reported while ``tsct.kernels.replay`` records it.

Every cubin launch (``tsct.kernels.aot.AotKernel.launch``), CUDA-row call (``tsct.native._ops._call``) and Triton
JIT launch (``tsct.kernels.launch.Family.launch``) checks ``log``: None (always, except while a recording runs on
this thread) costs one module attribute read per launch.
"""

from __future__ import annotations

import threading
from typing import Optional

#: the recording's list while one runs (on the thread ``owner``), else None
log: Optional[list] = None
owner: Optional[int] = None


def active() -> Optional[list]:
    """The list to report to when a recording runs on this thread, else None."""
    if log is not None and owner == threading.get_ident():
        return log
    return None
