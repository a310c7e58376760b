"""tsct.ops: the public operators. ``grouped_glu`` is the expert pass of design.md section 2."""

from tsct.ops.grouped_glu import grouped_glu

__all__ = ["grouped_glu"]
