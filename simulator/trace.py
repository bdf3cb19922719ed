"""The trace: one row per executed task per simulated rank, as a pyarrow Table.

Columns (docs/design.md, "Trace"): rank, stream, phase, layer, microbatch, op, kind,
start_s, end_s, flops, bytes, group, algorithm, label, memory_bytes. Written to Parquet with the plan, the
topology name, the package version and the summary in the file metadata, atomically.
"""
from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workloads.program import gc_paused

from .output import atomic_write

SCHEMA = pa.schema([
    ("rank", pa.int32()), ("stream", pa.string()), ("phase", pa.string()),
    ("layer", pa.int32()), ("microbatch", pa.int32()), ("op", pa.string()),
    ("kind", pa.string()), ("start_s", pa.float64()), ("end_s", pa.float64()),
    ("flops", pa.float64()), ("bytes", pa.float64()), ("group", pa.string()),
    ("algorithm", pa.string()), ("label", pa.string()),
])
# What the engine records; simulate() then adds the memory timeline (memory_timeline.py).
RECORDED = SCHEMA
SCHEMA = RECORDED.append(pa.field("memory_bytes", pa.float64()))
COLUMNS = SCHEMA.names


class TraceRecorder:
    """Collects rows as (rank, stage, task id, start, end, group, algorithm); the task's own
    columns (stream, op, flops, ...) are joined in once, column by column, in `table()`."""

    def __init__(self, stages) -> None:
        self.stages = stages
        self.rows: tuple[list, ...] = ([], [], [], [], [], [], [])
        (self._rank, self._stage, self._task, self._start, self._end, self._group,
         self._algorithm) = (col.append for col in self.rows)

    def record(self, rank: int, stage: int, task_id: int, start_s: float, end_s: float,
               group: str, algorithm: str) -> None:
        """Append one executed task."""
        self._rank(rank)
        self._stage(stage)
        self._task(task_id)
        self._start(start_s)
        self._end(end_s)
        self._group(group)
        self._algorithm(algorithm)

    def table(self) -> pa.Table:
        """The rows as a Table with RECORDED's columns, sorted by (rank, start_s, end_s)."""
        rank, stage, task, start, end, group, algorithm = self.rows
        with gc_paused():   # millions of rows, none of them cyclic garbage
            return rows_table(task_columns(self.stages), rank, stage, task, start, end,
                              pa.array(group, type=pa.string()),
                              pa.array(algorithm, type=pa.string()))


def task_columns(stages) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Every task's static columns, all stages concatenated, and each stage's offset."""
    names = ("stream", "phase", "layer", "microbatch", "op", "kind", "flops", "bytes",
             "label")
    values: dict[str, list] = {n: [] for n in names}
    offsets = [0]
    for tasks in stages:
        for n in names:   # a column at a time: one C-level pass per field
            values[n].extend(map(attrgetter(n), tasks))
        offsets.append(offsets[-1] + len(tasks))
    columns = {n: pa.array(v, type=SCHEMA.field(n).type) for n, v in values.items()}
    return columns, np.array(offsets[:-1], dtype=np.int64)


def rows_table(static: tuple[dict[str, pa.Array], np.ndarray], rank, stage, task, start,
               end, group: pa.Array, algorithm: pa.Array) -> pa.Table:
    """Recorded rows (in recording order) joined with their tasks' static columns, as a
    Table with RECORDED's columns, stably sorted by (rank, start_s, end_s)."""
    columns, offsets = static
    index = pa.array(offsets[np.asarray(stage, dtype=np.int64)] +
                     np.asarray(task, dtype=np.int64))
    table = pa.table({
        "rank": pa.array(rank, type=pa.int32()),
        **{n: columns[n].take(index) for n in ("stream", "phase", "layer", "microbatch",
                                                "op", "kind")},
        "start_s": pa.array(start, type=pa.float64()),
        "end_s": pa.array(end, type=pa.float64()),
        "flops": columns["flops"].take(index), "bytes": columns["bytes"].take(index),
        "group": group, "algorithm": algorithm,
        "label": columns["label"].take(index),
    }, schema=RECORDED)
    if table.num_rows:
        table = table.sort_by([("rank", "ascending"), ("start_s", "ascending"),
                               ("end_s", "ascending")])
    return table


def parquet_metadata(metadata: dict[str, Any]) -> dict[bytes, bytes]:
    """A trace's metadata as Parquet key-value pairs (JSON values, keys as bytes)."""
    return {key.encode(): json.dumps(value, sort_keys=True).encode()
            for key, value in metadata.items()}


def write_parquet(table: pa.Table, path: Path, metadata: dict[str, Any]) -> None:
    """Write a trace with JSON metadata (keys stored as bytes) atomically."""
    table = table.replace_schema_metadata(parquet_metadata(metadata))
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def chrome_trace(table: pa.Table) -> dict:
    """A Chrome/Perfetto trace: a process per rank, a thread per stream, times in us."""
    cols = table.to_pydict()
    streams = sorted(set(cols["stream"]), key=lambda s: (s != "compute", s))
    tid = {s: i for i, s in enumerate(streams)}
    events = []
    for rank in sorted(set(cols["rank"])):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        for stream, i in tid.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": i,
                           "args": {"name": stream}})
    for i in range(table.num_rows):
        start, end = cols["start_s"][i], cols["end_s"][i]
        if end <= start:
            continue
        events.append({
            "ph": "X", "pid": cols["rank"][i], "tid": tid[cols["stream"][i]],
            "name": cols["label"][i] or cols["op"][i], "cat": cols["kind"][i],
            "ts": start * 1e6, "dur": (end - start) * 1e6,
            "args": {"phase": cols["phase"][i], "layer": cols["layer"][i],
                     "microbatch": cols["microbatch"][i], "bytes": cols["bytes"][i],
                     "flops": cols["flops"][i], "group": cols["group"][i],
                     "algorithm": cols["algorithm"][i]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
