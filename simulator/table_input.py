"""Typed reading of Parquet inputs: traces (`trace summary|plot`) and measured runs
(`validation compare`).

A Parquet file carries its own column types, so a file written by something else may
hold a rank as text, a time as a string, or NaN step times; pyarrow reads all of it
without complaint and the failure comes later as a TypeError or a NaN in the report.
`check_columns` checks each column the reader uses against the kind it needs (integer,
number, text) and the numbers for finiteness, and raises the caller's InputError naming
the file, the column and what it holds instead.
"""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from inputs import InputError

INT, FLOAT, TEXT = "integer", "number", "text"
_EXACT = 2 ** 53
_KIND_CHECKS = {INT: pa.types.is_integer,
                FLOAT: lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
                TEXT: lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)}


def check_columns(table: pa.Table, required: Mapping[str, str], optional: Mapping[str, str],
                  field: str, path: str, error: type[InputError] = InputError,
                  nan_ok: tuple[str, ...] = ()) -> None:
    """Every required column present and without nulls, every column present of its
    kind, numbers finite (except in the `nan_ok` columns, whose rows the caller filters).
    `required`/`optional` map column name -> INT, FLOAT or TEXT."""
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise error(field, str(path), f"a file with columns {', '.join(required)} "
                                      f"(missing {', '.join(missing)})")
    for name, kind in {**required, **optional}.items():
        if name not in table.column_names:
            continue
        column = table[name]
        if not _KIND_CHECKS[kind](column.type):
            raise error(f"{field} column {name}", f"{column.type} in {path}",
                        f"{kind} values")
        if column.null_count and name in required:   # optional columns may have gaps
            raise error(f"{field} column {name}", f"{column.null_count} null value(s) in {path}",
                        f"{kind} values in every row")
        if pa.types.is_integer(column.type) and len(column):
            # a float holds integers exactly up to 2^53: beyond, times and ranks are noise
            # and pyarrow refuses to compare them with float columns (ArrowInvalid)
            bounds = pc.min_max(column).as_py()
            if any(v is not None and abs(v) > _EXACT for v in bounds.values()):
                raise error(f"{field} column {name}", f"integers beyond 2^53 in {path}",
                            f"{kind} values of at most 2^53 in magnitude")
        if pa.types.is_floating(column.type) and len(column) and name not in nan_ok:
            finite = pc.all(pc.is_finite(column)).as_py()   # nulls skipped
            if finite is False:
                raise error(f"{field} column {name}", f"NaN or infinite values in {path}",
                            "finite numbers")


def check_order(table: pa.Table, start: str, end: str, field: str, path: str,
                error: type[InputError] = InputError) -> None:
    """Every row ends no earlier than it starts (and starts at or after 0)."""
    if not len(table):
        return
    if not pc.all(pc.greater_equal(table[end], table[start])).as_py():
        raise error(f"{field} column {end}", f"rows ending before they start in {path}",
                    f"{end} >= {start} in every row")
    if pc.min(table[start]).as_py() < 0:
        raise error(f"{field} column {start}", f"negative times in {path}", "times >= 0")
