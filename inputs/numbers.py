"""Numbers read from input files: JSON has integers of any size, which Python keeps exact
but cannot turn into a float past about 1.8e308 (math.isfinite raises OverflowError)."""
from __future__ import annotations

import math


def finite(value: int | float) -> bool:
    """Whether a JSON number is finite as a float: False for NaN, infinities and integers
    too large for a float (instead of OverflowError)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
