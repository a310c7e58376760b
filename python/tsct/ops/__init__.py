"""tsct.ops: the public operators. ``grouped_glu`` is the expert pass of design.md section 2;
``sort_by_expert`` sorts a top-k router's rows by expert for it; ``quantize_master`` makes the packed factors of master factors for low-bit training (decision 0008)."""

from tsct.ops._masters import mark_masters_updated, quantize_master
from tsct.ops.grouped_glu import grouped_glu
from tsct.ops.routing import ExpertOrder, sort_by_expert

__all__ = ["grouped_glu", "sort_by_expert", "ExpertOrder", "quantize_master", "mark_masters_updated"]
