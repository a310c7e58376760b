"""The element formats' values from their bit fields, written down from the OCP MX spec INDEPENDENTLY of
tsct.quant (nothing here imports the code under test): the definitions the quant tests check against.

E2M1: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit, no inf/nan.
E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa; S.1111.111 is NaN; no inf; max 448.
"""

from __future__ import annotations

import math


def e2m1_value(code: int) -> float:
    """Value of a 4-bit E2M1 code from its bit fields."""
    sign = -1.0 if code & 0b1000 else 1.0
    exp = (code >> 1) & 0b11
    man = code & 0b1
    mag = man * 0.5 if exp == 0 else (1.0 + man / 2.0) * 2.0 ** (exp - 1)
    return sign * mag


def e4m3_value(byte: int) -> float:
    """Value of an E4M3 (fn) byte from its bit fields."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp = (byte >> 3) & 0xF
    man = byte & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    mag = (man / 8.0) * 2.0 ** -6 if exp == 0 else (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return sign * mag
