"""The trace: one row per executed task per simulated rank, as a pyarrow Table.

Columns (docs/design.md, "Trace"): rank, stream, phase, layer, microbatch, op, kind,
start_s, end_s, flops, bytes, group, algorithm, label, memory_bytes. Written to Parquet with the plan, the
topology name, the package version and the summary in the file metadata, atomically.
"""
from __future__ import annotations

import json
from array import array
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
    columns (stream, op, flops, ...) are joined in once, column by column, in `table()`.

    The numbers are kept as machine values (array.array), not Python objects: a recorded
    row takes 56 bytes instead of 104 (two float objects and seven list slots), and a
    step of a 1,008-micro-batch row records 17 million of them.
    """

    def __init__(self, stages) -> None:
        self.stages = stages
        self.rows: tuple = (array("q"), array("q"), array("q"), array("d"), array("d"),
                            [], [])
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
        """The rows as a Table with RECORDED's columns, sorted by (rank, start_s, end_s).

        The recorded numbers are read in place (NumPy views of the recorder's arrays), so
        nothing may be recorded while the table is being built."""
        rank, stage, task, start, end, group, algorithm = map(_numpy, self.rows)
        with gc_paused():   # millions of rows, none of them cyclic garbage
            return rows_table(task_columns(self.stages), rank, stage, task, start, end,
                              pa.array(group, type=pa.string()),
                              pa.array(algorithm, type=pa.string()))


def _numpy(column):
    """A recorded column of machine values as a NumPy array on the same memory; a list
    of strings as it is."""
    return np.frombuffer(column, dtype=column.typecode) if isinstance(column, array) else column


def task_columns(stages) -> tuple[dict[str, pa.ChunkedArray], np.ndarray]:
    """Every task's static columns, all stages concatenated, and each stage's offset.

    Built a stage at a time, so that the Python lists a column passes through hold one
    stage's tasks, not the step's.
    """
    names = ("stream", "phase", "layer", "microbatch", "op", "kind", "flops", "bytes",
             "label")
    parts: dict[str, list[pa.Array]] = {n: [] for n in names}
    offsets = [0]
    for tasks in stages:
        for n in names:   # a column at a time: one C-level pass per field
            parts[n].append(pa.array(list(map(attrgetter(n), tasks)),
                                     type=SCHEMA.field(n).type))
        offsets.append(offsets[-1] + len(tasks))
    # chunked, as one pa.array of the whole list was: a string column may pass 2 GiB
    columns = {n: pa.chunked_array(p, type=SCHEMA.field(n).type) for n, p in parts.items()}
    return columns, np.array(offsets[:-1], dtype=np.int64)


def rows_table(static: tuple[dict[str, pa.ChunkedArray], np.ndarray], rank, stage, task, start,
               end, group: pa.Array, algorithm: pa.Array) -> pa.Table:
    """Recorded rows (in recording order) joined with their tasks' static columns, as a
    Table with RECORDED's columns, stably sorted by (rank, start_s, end_s).

    The order is found first and every column taken once in it (a sort of the joined
    table would copy it whole a second time).
    """
    columns, offsets = static
    rank, start, end = (np.asarray(c, dtype=t) for c, t in
                        ((rank, np.int64), (start, np.float64), (end, np.float64)))
    order = np.lexsort((end, start, rank))   # stable: ties keep recording order
    index = pa.array(offsets[np.asarray(stage, dtype=np.int64)[order]] +
                     np.asarray(task, dtype=np.int64)[order])
    taken = pa.array(order)
    return pa.table({
        "rank": pa.array(rank[order], type=pa.int32()),
        **{n: columns[n].take(index) for n in ("stream", "phase", "layer", "microbatch",
                                                "op", "kind")},
        "start_s": pa.array(start[order], type=pa.float64()),
        "end_s": pa.array(end[order], type=pa.float64()),
        "flops": columns["flops"].take(index), "bytes": columns["bytes"].take(index),
        "group": group.take(taken), "algorithm": algorithm.take(taken),
        "label": columns["label"].take(index),
    }, schema=RECORDED)


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
