"""Checks of single plan fields, shared by the plan types' __post_init__ (workloads/plan.py).

Each raises a WorkloadError naming the field, the value and what is allowed, in the same
words whether the value came from a plan file, `whatif --vary` or `dataclasses.replace`.
"""
from __future__ import annotations

from typing import Any

from inputs import finite

from .errors import WorkloadError


def is_int(value: Any) -> bool:
    """A true integer (JSON's true/false are bools, not integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_as_float(value: Any) -> Any:
    """A JSON integer given for a float field, as a float; one past a float's range (10^400)
    stays an integer, which the field's check refuses as not finite."""
    if is_int(value):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


# Largest integer a plan field may hold: 2^53, the last of the integers a float (which the
# cost model multiplies them as) holds exactly; past it sizes stop being exact, and past
# about 10^308 they stop being numbers at all.
MAX_INT = 1 << 53


def check_int(value: Any, field: str, minimum: int = 1, maximum: int = MAX_INT) -> None:
    """An integer in [minimum, maximum]."""
    if not is_int(value) or not minimum <= value <= maximum:
        raise WorkloadError(field, value, f"an integer >= {minimum} and <= {maximum:,}")


def check_bool(value: Any, field: str) -> None:
    """true or false."""
    if not isinstance(value, bool):
        raise WorkloadError(field, value, "true or false")


def check_choice(value: Any, field: str, allowed: tuple[str, ...]) -> None:
    """One of a fixed set of names."""
    if not isinstance(value, str) or value not in allowed:
        raise WorkloadError(field, value, ", ".join(allowed))


def check_number(value: Any, field: str, low: float, high: float, allowed: str) -> None:
    """A finite number in [low, high]."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not finite(value) or not low <= value <= high):
        raise WorkloadError(field, value, allowed)


def check_optional_name(value: Any, field: str, allowed: str) -> None:
    """None or a string."""
    if value is not None and not isinstance(value, str):
        raise WorkloadError(field, value, allowed)


def json_object(raw: Any, where: str) -> dict:
    """A JSON object (absent: empty)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WorkloadError(where, raw, "a JSON object")
    return raw


def known_keys(raw: dict, where: str, allowed: tuple[str, ...]) -> None:
    """Every key of a JSON object is one of `allowed`."""
    for key in raw:
        if key not in allowed:
            raise WorkloadError(f"{where}.{key}" if where else key, raw[key],
                                "keys " + ", ".join(allowed))
