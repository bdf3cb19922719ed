"""`compare`: one row per plan, deltas to the best, JSON and Parquet traces."""
from __future__ import annotations

import json

import pyarrow.parquet as pq

from simulator.cli import main


def test_compare_bundled_plans_json_and_traces(tmp_path, capsys):
    code = main(["compare", "--topo", "dgx-h100x4", "--plan", "hybrid.json", "--plan", "col.json",
                 "--json", "--trace-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    plans = data["plans"]
    assert [p["plan"] for p in plans] == ["hybrid", "col"]
    best = min(range(2), key=lambda i: plans[i]["step_time_s"])
    assert data["best"] == best and data["delta_pct"][best] == 0.0
    other = 1 - best
    expected = 100 * (plans[other]["step_time_s"] / plans[best]["step_time_s"] - 1)
    assert abs(data["delta_pct"][other] - expected) < 1e-9
    assert len(data["traces"]) == 2
    for path, summary in zip(data["traces"], plans):
        meta = pq.read_schema(path).metadata
        assert json.loads(meta[b"summary"])["step_time_s"] == summary["step_time_s"]


def test_compare_table_has_a_row_per_plan(capsys):
    code = main(["compare", "--plan", "hybrid.json", "--plan", "hybrid.json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    table, ops = out.strip().split("\n\n")   # the plans' table, then their operations
    lines = table.splitlines()
    assert "step" in lines[0] and "exp. comm" in lines[0] and "vs best" in lines[0]
    assert len(lines) == 4 and all("best" in line for line in lines[2:])
    assert ops.startswith("longest operations")


def test_compare_bad_input_is_one_line_exit_2(capsys):
    for argv in (["compare", "--plan", "hybrid.json"],
                 ["compare", "--plan", "hybrid.json", "--plan", "no-such.json"],
                 ["compare", "--topo", "dgx-h100x4", "--plan", "hybrid.json", "--plan",
                  "fsdp.json"]):
        code = main(argv)
        _, err = capsys.readouterr()
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
