"""Numbers read from input files and flags: JSON has integers of any size, which Python
keeps exact but cannot turn into a float past about 1.8e308 (math.isfinite raises
OverflowError); and int() / float() of text also read Unicode digits ('٨'), underscores
('1_6') and padding (' 8'), which no input of this project means as a number."""
from __future__ import annotations

import argparse
import math
import re

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")


def finite(value: int | float) -> bool:
    """Whether a JSON number is finite as a float: False for NaN, infinities and integers
    too large for a float (instead of OverflowError)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def decimal(text: str, max_digits: int) -> int | None:
    """The non-negative integer `text` spells in 1 to `max_digits` ASCII digits, else None
    (the length bound first: int() of thousands of digits raises past the interpreter's
    limit, and a count that long is never meant)."""
    if not 1 <= len(text) <= max_digits or not text.isascii() or not text.isdecimal():
        return None
    return int(text)


def ascii_int(text: str) -> int | None:
    """The integer `text` spells in ASCII digits (an optional '-', at most 18 digits), else
    None."""
    return int(text) if _INT.fullmatch(text) else None


def ascii_float(text: str) -> float | None:
    """The number `text` spells as an ASCII decimal (optionally with an exponent), else
    None: no 'nan', 'inf', '٨', '1_0' or padding."""
    return float(text) if _FLOAT.fullmatch(text) else None


def strict_int(text: str) -> int:
    """argparse type: an integer in ASCII digits (ascii_int); the command checks its
    range."""
    value = ascii_int(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, got {text!r}")
    return value
