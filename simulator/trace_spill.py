"""A trace too large to hold in memory (every rank simulated): spilled to disk as the
engine records it, finished bucket by bucket of ranks, and streamed into Parquet.

`SpillRecorder` takes the engine's rows like `TraceRecorder`, but keeps at most
`chunk_rows` of them in memory: a full chunk is split by rank bucket (consecutive ranks)
and appended to one raw file per bucket, in recording order. `finish` then reads one
bucket at a time, builds its rows exactly as the in-memory recorder builds the whole
table (the same join and stable sort by rank, start, end: a bucket's rows are a run of
ranks of the whole sorted table), adds the memory column (memory_timeline.py works per
rank) and each rank's breakdown (summary.py, also per rank), and spills the finished
bucket back. `SpilledTrace` serves the finished buckets: as one Table on demand, or
streamed into a Parquet file one bucket per row group, with the same rows and metadata
as `trace.write_parquet` of that Table.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .output import atomic_write
from .trace import RECORDED, SCHEMA, parquet_metadata, rows_table, task_columns

# One recorded row on disk: (rank, stage, task id, start, end, group id, algorithm id).
_RAW = np.dtype([("rank", "<i4"), ("stage", "<i4"), ("task", "<i4"), ("start", "<f8"),
                 ("end", "<f8"), ("group", "<i4"), ("algorithm", "<i4")])
# Rows held in memory before a spill: 2^20 rows of Python lists take ~100 MB.
CHUNK_ROWS = 1 << 20
# Buckets of ranks finished at a time: 64 keep a bucket of a 1,024-GPU, 10-million-row
# trace near 150,000 rows (tens of MB as a Table).
BUCKETS = 64


class SpillRecorder:
    """Records rows like trace.TraceRecorder, spilling them per rank bucket to a
    temporary folder (removed with the SpilledTrace that `finish` returns)."""

    def __init__(self, stages, world_size: int, chunk_rows: int = CHUNK_ROWS,
                 buckets: int = BUCKETS) -> None:
        self.stages = stages
        self.ranks_per_bucket = max(1, -(-world_size // buckets))
        self.num_buckets = -(-world_size // self.ranks_per_bucket)
        self.chunk_rows = chunk_rows
        self.folder = tempfile.TemporaryDirectory(prefix="shardsim-trace-")
        self.names: dict[str, int] = {}       # group and algorithm strings -> ids
        self.rows: tuple[list, ...] = ([], [], [], [], [], [], [])
        self.num_rows = 0

    def record(self, rank: int, stage: int, task_id: int, start_s: float, end_s: float,
               group: str, algorithm: str) -> None:
        """Append one executed task; spill when the chunk is full."""
        rows, names = self.rows, self.names
        rows[0].append(rank)
        rows[1].append(stage)
        rows[2].append(task_id)
        rows[3].append(start_s)
        rows[4].append(end_s)
        rows[5].append(names.setdefault(group, len(names)))
        rows[6].append(names.setdefault(algorithm, len(names)))
        if len(rows[0]) >= self.chunk_rows:
            self._spill()

    def _path(self, bucket: int, kind: str) -> Path:
        return Path(self.folder.name) / f"{kind}{bucket:05d}.bin"

    def _spill(self) -> None:
        """Append the chunk in memory to the bucket files, in recording order."""
        if not self.rows[0]:
            return
        chunk = np.empty(len(self.rows[0]), dtype=_RAW)
        for name, column in zip(_RAW.names, self.rows):
            chunk[name] = column
            column.clear()
        self.num_rows += len(chunk)
        bucket = chunk["rank"] // self.ranks_per_bucket
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.num_buckets + 1))
        for b in range(self.num_buckets):
            lo, hi = bounds[b], bounds[b + 1]
            if hi > lo:
                with open(self._path(b, "raw"), "ab") as f:
                    chunk[order[lo:hi]].tofile(f)

    def _bucket_tables(self, remove: bool) -> Iterator[tuple[int, pa.Table]]:
        """(bucket, its recorded rows as trace.TraceRecorder.table builds them)."""
        self._spill()
        static = task_columns(self.stages)
        names = pa.array(sorted(self.names, key=self.names.get), type=pa.string())
        for b in range(self.num_buckets):
            raw_path = self._path(b, "raw")
            if not raw_path.exists():
                continue
            raw = np.fromfile(raw_path, dtype=_RAW)
            if remove:
                os.unlink(raw_path)
            yield b, rows_table(static, raw["rank"], raw["stage"], raw["task"], raw["start"],
                                raw["end"], names.take(pa.array(raw["group"])),
                                names.take(pa.array(raw["algorithm"])))

    def table(self) -> pa.Table:
        """Every recorded row in one Table, as trace.TraceRecorder.table gives it."""
        tables = [table for _, table in self._bucket_tables(remove=False)]
        return pa.concat_tables(tables).combine_chunks() if tables else RECORDED.empty_table()

    def finish(self, finish_bucket: Callable[[pa.Table], pa.Table]) -> "SpilledTrace":
        """Build every bucket's rows, pass each Table through `finish_bucket` (which adds
        the memory column and takes what the summary needs) and keep the results."""
        finished = []
        for b, table in self._bucket_tables(remove=True):
            done_path = self._path(b, "done")
            with pa.OSFile(str(done_path), "wb") as sink:
                with pa.ipc.new_file(sink, SCHEMA) as writer:
                    writer.write_table(finish_bucket(table))
            finished.append(done_path)
        return SpilledTrace(self.folder, finished)


class SpilledTrace:
    """The finished buckets of a spilled trace (Arrow IPC files in a temporary folder)."""

    def __init__(self, folder: tempfile.TemporaryDirectory, paths: list[Path]) -> None:
        self.folder = folder
        self.paths = paths

    def tables(self) -> Iterator[pa.Table]:
        """Each bucket's rows, in rank order."""
        for path in self.paths:
            with pa.OSFile(str(path), "rb") as source:
                yield pa.ipc.open_file(source).read_all()

    def table(self) -> pa.Table:
        """The whole trace as one Table (every row in memory)."""
        tables = list(self.tables())
        if not tables:
            return SCHEMA.empty_table()
        return pa.concat_tables(tables).combine_chunks()

    def write_parquet(self, path: str | Path, metadata: dict[str, Any]) -> None:
        """Stream the buckets into one Parquet file with the trace's metadata, atomically."""
        schema = SCHEMA.with_metadata(parquet_metadata(metadata))

        def write(tmp: str) -> None:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                for table in self.tables():
                    writer.write_table(table.replace_schema_metadata(schema.metadata))
        atomic_write(path, write)

    def close(self) -> None:
        """Remove the temporary folder now (it also goes when this object is collected)."""
        self.folder.cleanup()
