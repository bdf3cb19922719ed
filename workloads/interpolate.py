"""Reading a measured curve between its points: one rule for every kernel table.

Kernel speeds are published at lengths or sizes a factor of two or more apart (attention
TFLOP/s by sequence length, grouped GEMMs by rows per expert, casts by tensor size), so
between two measured points the value is taken linear in the logarithm of the argument,
and outside the measured range the nearest point holds (no extrapolation past what was
measured).
"""
from __future__ import annotations

import math
from typing import Sequence


def log_linear(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """`ys` at `x`: linear in log(x) between the ascending points `xs`, clamped to the
    first and last value outside them."""
    if x <= xs[0]:
        return float(ys[0])
    for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:]):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0)
            return y0 + t * (y1 - y0)
    return float(ys[-1])
