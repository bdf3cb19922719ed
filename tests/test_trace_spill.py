"""`--full` spills its trace to disk and finishes it bucket by bucket of ranks
(simulator/trace_spill.py): the same rows, memory column, summary and Parquet file
(rows and metadata) as the in-memory trace."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.api import finish
from simulator.cli import main
from simulator.engine import Engine
from simulator.trace import TraceRecorder, write_parquet
from simulator.trace_spill import SpillRecorder
from topologies.faults import apply_faults
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

# Pipeline 2 x TP 4 x FSDP 2 with a straggler: every stream kind, uneven rank ends.
RAW = small_plan(mesh={"pp": 2, "tp": 4}, training={"global_batch": 16},
                 fsdp={"enabled": True})


@pytest.fixture(scope="module")
def job():
    topo = apply_faults(topologies.build("dgx-h100x2"), ["straggler:gpu=5,slowdown=1.2"])
    program = lower(resolve(plan_from_dict(RAW), topo.world_size))
    return program, topo


def _run(job, recorder):
    program, topo = job
    engine = Engine(program, topo, SimOptions(full=True), recorder=recorder(program))
    engine.run()
    return finish(program, topo, engine)


@pytest.fixture(scope="module")
def in_memory(job):
    return _run(job, lambda p: TraceRecorder(p.stages))


@pytest.mark.parametrize("chunk_rows, buckets", [(1000, 5), (997, 16), (10 ** 7, 1)])
def test_spilled_trace_is_the_in_memory_trace(job, in_memory, chunk_rows, buckets):
    spilled = _run(job, lambda p: SpillRecorder(p.stages, p.world_size, chunk_rows, buckets))
    assert spilled.spilled is not None and spilled._trace is None
    assert spilled.summary == in_memory.summary
    assert spilled.trace.num_rows == in_memory.trace.num_rows > 10_000
    assert spilled.trace.equals(in_memory.trace)


def test_streamed_parquet_has_the_same_rows_and_metadata(job, in_memory, tmp_path):
    spilled = _run(job, lambda p: SpillRecorder(p.stages, p.world_size, 777, 3))
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    write_parquet(in_memory.trace, old, in_memory.metadata())
    spilled.write_trace(new)
    assert spilled._trace is None                   # streamed, never read whole
    a, b = pq.read_table(old), pq.read_table(new)
    assert a.equals(b, check_metadata=True)
    assert pq.read_metadata(new).num_row_groups == 3   # one per bucket


def test_full_mode_spills_and_cleans_up(job, in_memory):
    program, topo = job
    result = simulate(program.plan, topo, SimOptions(full=True))
    folder = Path(result.spilled.folder.name)
    assert sorted(p.name for p in folder.iterdir())[0].startswith("done")
    assert result.summary == in_memory.summary
    assert result.trace.equals(in_memory.trace)
    result.spilled.close()
    assert not folder.exists()


def test_run_full_trace_file_matches_the_rank_class_layout(tmp_path):
    path = tmp_path / "t.parquet"
    assert main(["run", "--plan", "fsdp", "--topo", "dgx-h100", "--full", "--trace",
                 str(path), "--json"]) == 0
    table = pq.read_table(path)
    assert set(table["rank"].to_pylist()) == set(range(8))
    assert b"summary" in table.schema.metadata
    assert table.column_names[-1] == "memory_bytes"
