"""The summary's `ops` (simulator/op_breakdown.py): the critical rank's device time per
operation, as the trace has it, and the `run` table's longest operations."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

import topologies
from simulator import SimOptions, simulate
from simulator.commands.run import TOP_OPS, render_ops
from simulator.intervals import uncovered_s, union
from simulator.op_breakdown import op_totals, rank_ops
from workloads import plan_from_dict

from conftest import small_plan
from test_cli import run_cli

# TP 4 x FSDP 2 on one node: GEMMs, attention, TP and FSDP collectives on their streams.
RAW = small_plan(mesh={"tp": 4}, training={"global_batch": 8}, fsdp={"enabled": True})


@pytest.fixture(scope="module")
def result():
    return simulate(plan_from_dict(RAW), topologies.build("dgx-h100"), SimOptions())


def _rank_rows(result):
    trace = result.trace
    rows = trace.filter(pc.equal(trace["rank"], result.summary["critical_rank"])).to_pylist()
    return [r for r in rows if r["end_s"] > r["start_s"]]


def test_ops_add_up_to_the_critical_ranks_trace(result):
    ops, rows = result.summary["ops"], _rank_rows(result)
    assert sum(op["tasks"] for op in ops) == len(rows)
    assert sum(op["device_s"] for op in ops) == pytest.approx(
        sum(r["end_s"] - r["start_s"] for r in rows), rel=1e-12)
    assert sum(op["flops"] for op in ops) == pytest.approx(sum(r["flops"] for r in rows))
    # one entry per (stream, op): the same op on two streams is two entries
    keys = [(op["stream"], op["op"]) for op in ops]
    assert len(keys) == len(set(keys))
    streams = {op["stream"] for op in ops}
    assert {"compute", "tp", "dp_ag", "dp_rs"} <= streams


def test_each_op_is_its_tasks(result):
    rows = _rank_rows(result)
    step = result.summary["step_time_s"]
    for op in result.summary["ops"]:
        mine = [r for r in rows if (r["stream"], r["op"]) == (op["stream"], op["op"])]
        assert op["tasks"] == len(mine) and {r["kind"] for r in mine} == {op["kind"]}
        assert op["device_s"] == pytest.approx(sum(r["end_s"] - r["start_s"] for r in mine))
        assert op["share_of_step"] == pytest.approx(op["device_s"] / step)
        if op["kind"] == "compute" and op["flops"]:
            assert op["achieved_flops_per_s"] == pytest.approx(op["flops"] / op["device_s"])
        else:
            assert op["achieved_flops_per_s"] is None


def test_longest_first_and_attention_named(result):
    ops = result.summary["ops"]
    times = [op["device_s"] for op in ops]
    assert times == sorted(times, reverse=True)
    assert any(op["op"] == "attention" and op["kind"] == "compute" for op in ops)


def test_same_inputs_same_ops(result):
    again = simulate(plan_from_dict(RAW), topologies.build("dgx-h100"), SimOptions())
    assert json.dumps(again.summary["ops"]) == json.dumps(result.summary["ops"])


def test_table_prints_the_longest_and_counts_the_rest(result):
    lines = render_ops(result.summary)
    ops = result.summary["ops"]
    assert len(ops) > TOP_OPS
    assert len(lines) == 1 + TOP_OPS + 1
    assert lines[1].split()[0] == ops[0]["op"]
    assert f"{len(ops) - TOP_OPS} more" in lines[-1]
    assert render_ops({**result.summary, "ops": []}) == []


def test_run_json_and_table_carry_the_ops(capsys):
    code, out, _ = run_cli(capsys, "run", "--plan", "fsdp.json", "--json")
    assert code == 0
    ops = json.loads(out)["ops"]
    assert ops and {"op", "stream", "kind", "tasks", "device_s", "share_of_step", "exposed_s",
                    "flops", "bytes", "achieved_flops_per_s"} == set(ops[0])
    code, out, _ = run_cli(capsys, "run", "--plan", "fsdp.json")
    assert code == 0 and "longest operations (rank" in out


def test_exposed_time_is_the_communication_outside_compute(result):
    ops, summary = result.summary["ops"], result.summary
    comm = [op for op in ops if op["kind"] == "comm"]
    assert comm and all(0.0 <= op["exposed_s"] <= op["device_s"] * (1 + 1e-12) for op in comm)
    assert all(op["exposed_s"] is None for op in ops if op["kind"] == "compute")
    # each op counts the time its own tasks ran without compute, so together they cover
    # the summary's exposed communication (more where two transfers run at once)
    assert sum(op["exposed_s"] for op in comm) >= summary["exposed_comm_s"] * (1 - 1e-9)
    assert summary["exposed_comm_s"] > 0


def _uncovered_by_loop(start, end, union):
    inside = sum(max(0.0, min(end, hi) - max(start, lo)) for lo, hi in union)
    return (end - start) - inside


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=12),
       st.lists(st.tuples(st.integers(0, 80), st.integers(0, 30)), min_size=1, max_size=12))
def test_uncovered_time_matches_interval_by_interval(covering, asked):
    # integer-valued intervals: every sum below is exact in floating point
    starts = np.array([float(s) for s, _ in covering])
    ends = np.array([float(s + n) for s, n in covering])
    merged = union(starts, ends)
    a_start = np.array([float(s) for s, _ in asked])
    a_end = np.array([float(s + n) for s, n in asked])
    got = uncovered_s(a_start, a_end, merged)
    want = [_uncovered_by_loop(s, e, merged) for s, e in zip(a_start, a_end)]
    assert got.tolist() == want


def test_each_communications_exposed_time_is_its_time_outside_compute(result):
    rows = _rank_rows(result)
    work = [r for r in rows if r["kind"] == "compute"]
    merged = union(np.array([r["start_s"] for r in work]), np.array([r["end_s"] for r in work]))
    comm = [op for op in result.summary["ops"] if op["kind"] == "comm"]
    for op in comm:
        mine = [r for r in rows if (r["stream"], r["op"]) == (op["stream"], op["op"])]
        want = sum(_uncovered_by_loop(r["start_s"], r["end_s"], merged) for r in mine)
        assert op["exposed_s"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    # FSDP's gathers run ahead of the layers that need them: partly hidden, partly not
    gather = next(op for op in comm if op["stream"] == "dp_ag")
    assert 0 < gather["exposed_s"] < 0.9 * gather["device_s"]


def test_exposed_time_reads_each_rank_alone_in_any_row_order():
    # rank 0 computes over [0, 10] and rank 1 over [20, 30]; both transfer over [5, 15]
    rows = [(0, "compute", "compute", "gemm", 0.0, 10.0),
            (0, "tp", "comm", "all_gather", 5.0, 15.0),
            (1, "compute", "compute", "gemm", 20.0, 30.0),
            (1, "tp", "comm", "all_gather", 5.0, 15.0),
            (1, "tp", "comm", "all_gather", 25.0, 27.0)]
    order = [3, 0, 4, 2, 1]   # not sorted by rank
    table = pa.table({name: [rows[i][k] for i in order] for k, name in enumerate(
        ("rank", "stream", "kind", "op", "start_s", "end_s"))}
        | {"flops": [0.0] * 5, "bytes": [0.0] * 5})
    totals = op_totals(table)
    exposed = {rank: next(op["exposed_s"] for op in rank_ops(totals, rank, 30.0)
                          if op["kind"] == "comm") for rank in (0, 1)}
    assert exposed == {0: 5.0, 1: 10.0}


def test_a_whatif_row_holds_the_scalars_not_the_ops(result):
    from simulator.whatif.points import flatten
    row = flatten(result.summary)
    assert "ops" not in row and row["mesh_tp"] == 4
    assert all(not isinstance(value, (list, dict)) for value in row.values())


def _op(stream, name, device_s):
    return {"stream": stream, "op": name, "device_s": device_s}


def test_compare_shows_each_plans_longest_operations_together():
    from simulator.search.report import render_ops_table
    # a's two longest: w1, attention; b's: all_to_all, w2 (b's attention is 3rd, a's w2 4th)
    a = {"ops": [_op("compute", "w1", 2.0), _op("compute", "attention", 1.5),
                 _op("tp", "all_gather", 0.5), _op("compute", "w2", 0.25)]}
    b = {"ops": [_op("ep", "all_to_all", 3.0), _op("compute", "w2", 0.75),
                 _op("compute", "attention", 0.5), _op("compute", "w1", 0.125)]}
    assert render_ops_table([a, b], ["a", "b"], top=2).splitlines()[1:] == [
        "operation (stream)          a         b",
        "-------------------  --------  --------",
        "all_to_all (ep)             -   3.000 s",
        "w1 (compute)          2.000 s  125.0 ms",
        "attention (compute)   1.500 s  500.0 ms",
        "w2 (compute)         250.0 ms  750.0 ms"]
    # equal longest times: by stream, then name
    tied = {"ops": [_op("tp", "b", 1.0), _op("compute", "z", 1.0), _op("compute", "a", 1.0)]}
    rows = render_ops_table([tied], ["t"], top=3).splitlines()[3:]
    assert [r.split()[0] for r in rows] == ["a", "z", "b"]
    assert render_ops_table([{}, {}], ["a", "b"]) == ""
    with pytest.raises(ValueError):
        render_ops_table([a], ["a"], top=0)


def test_compare_prints_each_plans_operations(capsys):
    code, out, _ = run_cli(capsys, "compare", "--plan", "fsdp.json", "--plan", "ddp.json",
                           "--json")
    assert code == 0
    plans = json.loads(out)["plans"]
    code, out, _ = run_cli(capsys, "compare", "--plan", "fsdp.json", "--plan", "ddp.json")
    assert code == 0
    table = out[out.index("longest operations"):].splitlines()
    assert table[1].split()[-6:] == ["fsdp", "@", "dgx-h100", "ddp", "@", "dgx-h100"]
    shown = {" ".join(line.split()[:2]) for line in table[3:]}
    for plan in plans:   # every plan's own eight longest are in the table
        assert {f"{op['op']} ({op['stream']})" for op in plan["ops"][:8]} <= shown
