"""The bmm path: the fallback of every GPU and the CPU path (``glu.py``; design.md section 4)."""

from tsct.bmm.glu import Plan, grouped_glu_backward, grouped_glu_forward, grouped_glu_forward_saved, saved_like

__all__ = ["Plan", "grouped_glu_forward", "grouped_glu_forward_saved", "grouped_glu_backward", "saved_like"]
