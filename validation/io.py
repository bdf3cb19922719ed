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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inputs import parse_json
from simulator.output import atomic_write, write_text_atomic
from simulator.table_input import FLOAT, INT, TEXT, check_columns

from .csv_input import require_regular_file
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
    # pq.read_table walks a folder as a dataset (all of /usr) and blocks on a FIFO
    require_regular_file(path, "--measured")
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
        run = parse_json(meta[b"validation"].decode(), "--measured metadata", ValidationError)
    except UnicodeDecodeError:
        raise ValidationError("--measured", str(path), "valid 'validation' JSON metadata") from None
    # Profiler rows carry NaN step times by design; the timed steps' must be numbers.
    check_columns(table, MEASURED_REQUIRED, MEASURED_OPTIONAL, "--measured", str(path),
                  ValidationError, nan_ok=("step_time_s",))
    steps = table.filter(pc.equal(table["kind"], "step"))["step_time_s"]
    if len(steps) and not pc.all(pc.and_(pc.is_finite(steps), pc.greater(steps, 0))).as_py():
        raise ValidationError("--measured column step_time_s", f"NaN, infinite or <= 0 in {path}",
                              "positive finite step times in every step row")
    _check_run(run, str(path))
    return table, run


# The columns `validation compare` reads and their kinds (TRACE_COLUMNS).
MEASURED_REQUIRED = {"step": INT, "kind": TEXT, "step_time_s": FLOAT}
MEASURED_OPTIONAL = {"rank": INT, "phase": TEXT, "parent": TEXT, "start_s": FLOAT,
                     "end_s": FLOAT}


def _check_run(run: Any, path: str) -> None:
    """The run record's fields that compare reads, each of its type."""
    if not isinstance(run, dict) or not isinstance(run.get("plan"), dict):
        raise ValidationError("--measured metadata", path, "a recorded run with its plan object")
    nproc = run.get("nproc")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or not 1 <= nproc <= 1 << 20:
        raise ValidationError("--measured metadata.nproc", nproc, "an integer >= 1")
    for key in ("dtype", "plan_name", "backend"):
        if key in run and not isinstance(run[key], str):
            raise ValidationError(f"--measured metadata.{key}", run[key], "a string")
    probe = run.get("host_probe")
    if probe is None:
        return
    ok = isinstance(probe, dict)
    if ok:
        shape, during = probe.get("shape_mnk"), probe.get("flops_per_s_during")
        numbers = [probe[k] for k in ("flops_per_s_before", "flops_per_s_after") if k in probe]
        ok = (isinstance(shape, list) and len(shape) == 3
              and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
              and (during is None or isinstance(during, list))
              and (bool(during) or len(numbers) == 2))
        if ok:
            numbers += during or []
        ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                        for x in numbers)
    if not ok:
        raise ValidationError("--measured metadata.host_probe", probe,
                              "shape_mnk (3 positive integers) and positive flops_per_s_* numbers")
