"""tsct.ops: the public operators. ``grouped_glu`` is the expert pass of design.md section 2;
``quantize_master`` makes the packed factors of master factors for low-bit training (decision 0008)."""

from tsct.ops._library_q import mark_masters_updated, quantize_master
from tsct.ops.grouped_glu import grouped_glu

__all__ = ["grouped_glu", "quantize_master", "mark_masters_updated"]
