"""The compact forms a large step is held in give what the plain forms gave.

A 1,008-micro-batch row holds 17 million tasks and trace rows, so the tasks share their
repeated values (workloads/layer_builder.py TaskSink), the recorder keeps machine values
(simulator/trace.py), the trace is sorted before it is joined, and the memory timeline
works on masks and arrays (simulator/memory_timeline.py). Each test checks one of these
against the straightforward computation it replaced.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import topologies
from simulator import simulate
from simulator.memory_timeline import _rank_deltas, memory_column
from simulator.trace import RECORDED, TraceRecorder
from workloads import load_plan
from workloads.activation_offload import offloaded_layers, release_layer
from workloads.layer_builder import TaskSink
from workloads.memory import memory_breakdown, output_activation_bytes, saved_layer_bytes


# ---- tasks share repeated values ------------------------------------------------------
def _made() -> dict:
    """Field values built at run time (equal literals may be one constant already, which
    would let a sharing test pass without any sharing)."""
    return dict(label="".join(["w1", ".fwd"]), flops=float("2.0"), bytes=float("3.0"),
                efficiency=float("0.5"), host_s=float("1e-6"),
                gemm_mnk=tuple(int(x) for x in "123"))


def test_equal_values_are_one_object_and_types_are_kept():
    sink = TaskSink()
    common = dict(kind="compute", stream="compute", op="w", phase="forward", layer=0)
    made = [_made() for _ in range(2)]
    for name in made[0]:
        assert made[0][name] is not made[1][name], name   # two objects going in
    a, b = (sink.tasks[sink.add(microbatch=mb, **fields, **common)]
            for mb, fields in enumerate(made))
    for name in made[0]:
        assert getattr(a, name) is getattr(b, name), name   # one object coming out
    # equal but of another type: not merged (2 == 2.0, (1, 2, 3) == (1.0, 2.0, 3.0))
    c = sink.tasks[sink.add(microbatch=2, label="w1.fwd", flops=2, bytes=3.0,
                            gemm_mnk=(1.0, 2.0, 3.0), **common)]
    assert type(c.flops) is int and type(c.gemm_mnk[0]) is float
    # a negative zero is never replaced by a positive one
    d = sink.tasks[sink.add(microbatch=3, bytes=0.0, **common)]
    e = sink.tasks[sink.add(microbatch=4, bytes=-0.0, **common)]
    assert str(d.bytes) == "0.0" and str(e.bytes) == "-0.0"


def test_host_times_rewritten_in_place_are_shared_again():
    sink = TaskSink()
    for mb in range(3):
        sink.add(kind="compute", stream="compute", op="w", phase="forward", layer=0,
                 microbatch=mb, host_s=1e-6)
    for task in sink.tasks:
        task.host_s += 2e-6          # a new float object per task
    sink.share_again("host_s")
    assert len({id(t.host_s) for t in sink.tasks}) == 1
    assert sink.tasks[0].host_s == 1e-6 + 2e-6


# ---- the trace's order --------------------------------------------------------------
def _stages() -> list:
    """Two small stages of distinct tasks."""
    stages = []
    for stage in range(2):
        sink = TaskSink()
        for i in range(4):
            sink.add(kind="compute" if i % 2 else "comm", stream=f"s{i}", op=f"op{stage}{i}",
                     phase="forward", layer=i, microbatch=stage, flops=float(i),
                     bytes=float(10 * i + stage), label=f"l{stage}{i}")
        stages.append(sink.tasks)
    return stages


def test_rows_are_sorted_as_a_stable_sort_of_the_joined_table():
    """The recorder sorts before it joins; the result must be the joined table's stable
    sort by (rank, start, end), ties in recording order."""
    stages = _stages()
    recorder = TraceRecorder(stages)
    # rows recorded out of order, with ties in (rank, start, end)
    rows = [(1, 1, 0, 2.0, 3.0), (0, 0, 1, 2.0, 3.0), (0, 0, 2, 1.0, 5.0),
            (1, 1, 3, 0.5, 0.5), (0, 0, 0, 2.0, 3.0), (0, 0, 3, 2.0, 2.5)]
    for rank, stage, task, start, end in rows:
        recorder.record(rank, stage, task, start, end, f"g{task}", "ring")
    table = recorder.table()
    tasks = [stages[s][t] for _, s, t, _, _ in rows]
    joined = pa.table({
        "rank": pa.array([r[0] for r in rows], type=pa.int32()),
        "stream": [t.stream for t in tasks], "phase": [t.phase for t in tasks],
        "layer": pa.array([t.layer for t in tasks], type=pa.int32()),
        "microbatch": pa.array([t.microbatch for t in tasks], type=pa.int32()),
        "op": [t.op for t in tasks], "kind": [t.kind for t in tasks],
        "start_s": [r[3] for r in rows], "end_s": [r[4] for r in rows],
        "flops": pa.array([float(t.flops) for t in tasks]),
        "bytes": pa.array([float(t.bytes) for t in tasks]),
        "group": [f"g{r[2]}" for r in rows], "algorithm": ["ring"] * len(rows),
        "label": [t.label for t in tasks]}, schema=RECORDED)
    expected = joined.sort_by([("rank", "ascending"), ("start_s", "ascending"),
                               ("end_s", "ascending")])
    assert table.equals(expected)
    assert table["op"].to_pylist() == ["op02", "op03", "op01", "op00", "op13", "op10"]


def test_a_recorder_without_rows_gives_an_empty_table():
    table = TraceRecorder(_stages()).table()
    assert table.num_rows == 0 and table.schema == RECORDED


# ---- the memory timeline ------------------------------------------------------------
def _plain_deltas(plan, layer, microbatch, phase, op, end, stream):
    """The memory timeline's deltas as first written: a pass in end order with dicts."""
    deltas = np.zeros(len(end))
    first_fwd, last_fwd, last_bwd = {}, {}, {}
    for i in np.argsort(end, kind="stable"):
        if stream[i] != "compute":
            continue
        key = (int(layer[i]), int(microbatch[i]))
        if key[0] >= 0 or op[i] in ("cross_entropy", "output"):
            key = key if key[0] >= 0 else (-1, key[1])
            if phase[i] == "forward" and (key[0] >= 0 or op[i] == "cross_entropy"):
                last_fwd[key] = i
                first_fwd.setdefault(key, i)
            elif phase[i] == "backward" and (key[0] >= 0 or op[i] == "output"):
                last_bwd[key] = i
    for key, i in last_fwd.items():
        size = output_activation_bytes(plan) if key[0] < 0 else saved_layer_bytes(plan, key[0])
        deltas[i] += size
        if key in last_bwd:
            deltas[last_bwd[key]] -= size
    for saved in offloaded_layers(plan):
        size, at = saved_layer_bytes(plan, saved), release_layer(plan, saved)
        for mb in {k[1] for k in first_fwd if k[0] == at}:
            deltas[first_fwd[(at, mb)]] -= size
            if (at, mb) in last_bwd:
                deltas[last_bwd[(at, mb)]] += size
    return deltas


def _plain_column(program, trace):
    plan = program.plan
    cols = trace.to_pydict()
    out = np.zeros(trace.num_rows)
    ranks = np.asarray(cols["rank"])
    for rank in sorted(set(cols["rank"])):
        rows = np.flatnonzero(ranks == rank)
        stage = plan.parallel_dims.stage_of(int(rank))
        b = memory_breakdown(plan, stage)
        static = b.params_bytes + b.grads_bytes + b.optimizer_bytes + b.buffers_bytes
        pick = {n: np.asarray(cols[n], dtype=object)[rows]
                for n in ("layer", "microbatch", "phase", "op", "stream")}
        end = np.asarray(cols["end_s"])[rows]
        deltas = _plain_deltas(plan, pick["layer"], pick["microbatch"], pick["phase"],
                               pick["op"], end, pick["stream"])
        order = np.argsort(end, kind="stable")
        in_use = np.empty(len(end))
        in_use[order] = static + np.cumsum(deltas[order])
        out[rows] = in_use
    return out


@pytest.mark.parametrize("plan_name", ["offload.json", "interleaved.json", "pipeline_1f1b.json"])
def test_memory_column_is_the_plain_pass(plan_name):
    plan = load_plan(plan_name)
    result = simulate(plan, topologies.build(plan.topology or "dgx-h100"))
    trace = result.trace.drop_columns(["memory_bytes"])
    fast = memory_column(result.program, trace).to_numpy()
    plain = _plain_column(result.program, trace)
    assert np.array_equal(fast, plain)
    assert fast.max() > fast.min()          # the timeline moves: activations come and go
    if plan_name == "offload.json":
        assert offloaded_layers(result.program.plan)   # the offload branch is exercised


def test_deltas_match_the_plain_pass_on_random_rows():
    """Rows the bundled plans never make: tied end times within a key, layers below -1,
    per-step rows (micro-batch -1) inside layers, every release layer of the offload."""
    plan = simulate(load_plan("offload.json"),
                    topologies.build(load_plan("offload.json").topology or "dgx-h100")
                    ).program.plan
    layers = plan.model.num_layers
    assert offloaded_layers(plan)
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 60))
        layer = rng.integers(-3, layers, n)
        microbatch = rng.integers(-1, 4, n)
        stream = rng.choice(["compute", "compute", "dp_rs"], n)
        phase = rng.choice(["forward", "backward", "recompute"], n)
        op = rng.choice(["w", "cross_entropy", "output"], n)
        end = rng.integers(0, 12, n) / 4.0          # few distinct ends: many ties
        masks = {"compute": stream == "compute", "forward": phase == "forward",
                 "backward": phase == "backward", "cross_entropy": op == "cross_entropy",
                 "output": op == "output"}
        fast = _rank_deltas(plan, layer, microbatch, masks, end)
        plain = _plain_deltas(plan, layer, microbatch, phase, op, end, stream)
        assert np.array_equal(fast, plain)
