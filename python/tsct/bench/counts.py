"""What a run must do, counted from the shape alone: parameters, bytes and useful FLOPs.

Bytes (``bytes_moved``): the fewest bytes the whole expert pass must move through device memory:

    bytes = T*d*s_x                  x read once (token-major)
          + storage(w_gate, w_up, w_down)  each factor read once, in its storage format
          + 2*E*r*s_scale            s_gate and s_up read once
          + T*f*s_x                  the token-major output written once

with s_x the bytes of the compute dtype. Router ids/weights, offsets and index vectors (~10 bytes per
routed row, 0.3 MB at b1) are left out. ``bytes_floor`` is this count with bf16 everywhere (the bf16
bytes floor of design.md section 5: 1.50 GB at b1 = 67.1 MB x + 1252.9 MB factors + 178.9 MB out).
It is a count, not a measurement: the padded bmm and grouped-mm arms move far more than this.

FLOPs (``useful_flops``): the multiply-adds of the routed rows only (M = T*k, no capacity padding),
2 FLOPs each:  forward = 2*M*d*(2r) + 2*M*r*f.  Backward counts 2x forward (gradients for the
activations and for the weights), so forward+backward = 3x forward. Elementwise work (GLU, scales,
row weights, combine) is not counted.
"""

from __future__ import annotations

BF16_BYTES = 2


def params_per_expert(d: int, r: int, f: int) -> int:
    """w_gate + w_up (2*d*r) + w_down (r*f) + s_gate + s_up (2*r). 611,776 at b1."""
    return 2 * d * r + r * f + 2 * r


def bank_params(experts: int, d: int, r: int, f: int) -> int:
    """Parameters of the routed expert bank (factors and scales). 626,458,624 at b1."""
    return experts * params_per_expert(d, r, f)


def dense_factor_bytes(experts: int, d: int, r: int, f: int, elem_bytes: int = BF16_BYTES) -> int:
    """Storage of the bank with every parameter (scales included) at ``elem_bytes``. ~1.25 GB at b1 in bf16."""
    return bank_params(experts, d, r, f) * elem_bytes


def bytes_moved(tokens: int, d: int, f: int, factor_storage_bytes: int, act_bytes: int) -> int:
    """x read once + factors (and scales) in their storage once + output written once."""
    return tokens * d * act_bytes + factor_storage_bytes + tokens * f * act_bytes


def bytes_floor(tokens: int, experts: int, d: int, r: int, f: int) -> int:
    """The bf16 bytes floor of design.md: ``bytes_moved`` with bf16 activations and bf16 factors."""
    return bytes_moved(tokens, d, f, dense_factor_bytes(experts, d, r, f), BF16_BYTES)


def useful_flops(routed_rows: int, d: int, r: int, f: int) -> int:
    """Forward FLOPs: 2*M*d*2r (gate and up) + 2*M*r*f (down)."""
    return 2 * routed_rows * d * 2 * r + 2 * routed_rows * r * f


BACKWARD_FLOPS_FACTOR = 2  # backward = 2x forward; forward+backward = 3x forward
