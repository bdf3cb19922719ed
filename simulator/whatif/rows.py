"""What a row read back from a checkpoint must look like to join the study's table.

A checkpoint is a file on disk, so anything may have been written into it; a row that
passed here can be rendered, plotted and written as Parquet exactly like a row that
`points.evaluate` just returned (a string or a list where a time is expected would
otherwise fail in `table.render` after the Parquet was written, an integer past 2**63
in pyarrow).
"""
from __future__ import annotations

from typing import Any

from inputs import finite
from inputs.errors import shown

from .points import PointSpec

STATUSES = ("ok", "invalid", "error")
# What `table.render` and `table.plot` read from an `ok` row: finite numbers ...
RENDERED_NUMBERS = ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "mfu",
                    "peak_memory_bytes")
# ... and one flag.
RENDERED_FLAGS = ("fits_in_memory",)
# Every other summary column named so is a number (or null: a ratio over a zero time),
# so a string there would turn the whole Parquet column into strings.
NUMBER_SUFFIXES = ("_s", "_bytes")
# Counts the summary gives as integers (a true there would turn the column into text).
COUNT_COLUMNS = ("events", "simulated_ranks", "world_size", "micro_batches", "critical_rank")
COUNT_PREFIXES = ("mesh_",)
# Parquet's integers are 64-bit: a larger JSON integer cannot be written.
INT64 = 1 << 63


def is_number(value: Any) -> bool:
    """A finite JSON number (bool excluded; an integer that a float or an int64 cannot
    hold is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return finite(value) and (isinstance(value, float) or -INT64 <= value < INT64)


def _scalar(value: Any) -> bool:
    """A value one Parquet cell holds: null, a flag, a string or a number."""
    return value is None or isinstance(value, (bool, str)) or is_number(value)


def _lead_problem(row: dict[str, Any], spec: PointSpec) -> str | None:
    """The columns fixed by the point itself: topology, fault and parameters."""
    point = spec["point"]
    expected = {"topo": spec["topo"]["ref"], "fault": ";".join(spec["faults"]) or None,
                **spec["params"]}
    for key, value in expected.items():
        if row.get(key) != value or type(row.get(key)) is not type(value):
            return f"{key!r} {value!r} for point {point} (got {shown(row.get(key))})"
    return None


def _result_problem(row: dict[str, Any], params: set[str]) -> str | None:
    """The columns the simulation produced: what the table, plot and Parquet need (a
    time or size not negative, a count an integer, true/false only in a flag)."""
    ok = row["status"] == "ok"
    error = row.get("error", "absent")
    if ok and error is not None or not ok and not isinstance(error, str):
        want = "null for an ok point" if ok else "a string for an invalid or error point"
        return f"'error' {want} (got {shown(error)})"
    for key, value in row.items():
        if not _scalar(value):
            return f"{shown(key)} null, true/false, a string or a finite number below " \
                   f"2**63 (got {shown(value)})"
        if key.endswith(NUMBER_SUFFIXES) and value is not None and \
                (not is_number(value) or value < 0):
            return f"{shown(key)} a number >= 0 (got {shown(value)})"
        if (key in COUNT_COLUMNS or key.startswith(COUNT_PREFIXES)) and key not in params \
                and value is not None and (not is_number(value) or type(value) is not int):
            return f"{shown(key)} an integer (got {shown(value)})"
        if isinstance(value, bool) and key not in RENDERED_FLAGS and key not in params:
            return f"{shown(key)} a number or text, not true/false (got {shown(value)})"
    if not ok:
        return None
    for key in RENDERED_NUMBERS:
        if not is_number(row.get(key)):
            return f"{key!r} a finite number for an ok point (got {shown(row.get(key))})"
    for key in RENDERED_FLAGS:
        if not isinstance(row.get(key), bool):
            return f"{key!r} true or false for an ok point (got {shown(row.get(key))})"
    return None


def row_problem(row: Any, points: dict[int, PointSpec]) -> str | None:
    """Why a checkpoint line cannot be a finished point of this study (None: it can)."""
    if not isinstance(row, dict):
        return f"a JSON object (got {type(row).__name__})"
    point = row.get("point")
    if type(point) is not int or point not in points:
        return f"'point' an integer from 0 to {len(points) - 1} (got {shown(point)})"
    if row.get("status") not in STATUSES:
        return f"'status' one of {', '.join(STATUSES)} (got {shown(row.get('status'))})"
    return _lead_problem(row, points[point]) or _result_problem(row, set(points[point]["params"]))
