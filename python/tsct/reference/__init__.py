"""The reference path: pure torch, CPU and any GPU. The fallback and the oracle (design.md section 4)."""

from tsct.reference.glu import grouped_glu_backward, grouped_glu_forward

__all__ = ["grouped_glu_forward", "grouped_glu_backward"]
