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


def decimal(text: str, max_digits: int) -> int | None:
    """The integer `text` spells in 1 to `max_digits` ASCII-or-Unicode decimal digits, else
    None. str.isdecimal, not isdigit ('²' is a digit that int() does not read), and the
    length bound first (int() of thousands of digits raises past the interpreter's limit,
    and a count that long is never meant)."""
    if not 1 <= len(text) <= max_digits or not text.isdecimal():
        return None
    return int(text)
