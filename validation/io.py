"""Atomic writers (temp file in the target folder, then os.replace) and the measured file.

The measured Parquet file uses the simulator's trace columns where they overlap (rank,
stream, phase, layer, microbatch, op, kind, start_s, end_s, flops, bytes, group,
algorithm) plus `step`, `step_time_s` (max over ranks), `rank_step_time_s`, `loss` (the
step's mean training loss on that rank) and `parent` (the enclosing profiler event). Its metadata key `validation` holds the run as JSON.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from simulator.output import atomic_write, write_text_atomic

from .errors import ValidationError

TRACE_COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int32(), "rank": pa.int32(), "stream": pa.string(), "phase": pa.string(),
    "layer": pa.int32(), "microbatch": pa.int32(), "op": pa.string(), "kind": pa.string(),
    "start_s": pa.float64(), "end_s": pa.float64(), "flops": pa.float64(),
    "bytes": pa.float64(), "group": pa.string(), "algorithm": pa.string(),
    "step_time_s": pa.float64(), "rank_step_time_s": pa.float64(), "parent": pa.string(),
    "loss": pa.float64(),
}
SCHEMA = pa.schema(list(TRACE_COLUMNS.items()))


def write_parquet(rows: Iterable[dict[str, Any]], path: str | os.PathLike,
                  metadata: dict[str, str]) -> None:
    """Rows (dicts with TRACE_COLUMNS keys) to Parquet with string metadata, atomically."""
    rows = list(rows)
    columns = {name: [row.get(name) for row in rows] for name in TRACE_COLUMNS}
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in metadata.items()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Pretty JSON, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(text: str, path: str | os.PathLike) -> None:
    """A text file, atomically."""
    write_text_atomic(path, text)


def read_measured(path: str | os.PathLike) -> tuple[pa.Table, dict]:
    """(table, run description) of a `validation run` output; bad files exit 2."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValidationError("--measured", str(path),
                              f"a Parquet file written by `validation run` ({exc})") from None
    meta = table.schema.metadata or {}
    if b"validation" not in meta:
        raise ValidationError("--measured", str(path),
                              "a Parquet file written by `validation run` (no 'validation' "
                              "metadata)")
    try:
        run = json.loads(meta[b"validation"])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValidationError("--measured", str(path), "valid 'validation' JSON metadata") from None
    missing = [c for c in ("step", "kind", "step_time_s") if c not in table.column_names]
    if missing or not isinstance(run, dict) or "plan" not in run:
        raise ValidationError("--measured", str(path),
                              "columns step, kind, step_time_s and a recorded plan")
    return table, run
