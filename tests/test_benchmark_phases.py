"""benchmarks.rows simulate_by_phase, which benchmarks.rows (CPU time) and benchmarks.calls
(function calls) measure the phases through: each phase runs through the wrapper once,
the result is the plain simulation's, and the phases are restored afterwards."""
from __future__ import annotations

import csv

import pytest

from benchmarks.rows import CSV, set_columns, simulate_by_phase
from simulator import api
from simulator.engine import Engine
from validation.references import simulate_or_skip, simulate_row

ROW = "mb-qwen3-30b-gb200-mxfp8-8"   # a small published MoE row (8 GPUs)


def test_each_phase_is_wrapped_once_and_restored():
    with open(CSV, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == ROW)
    originals = (api.lower, Engine.run, api.finish)
    seen: list[str] = []

    def wrap(name, fn):
        def wrapper(*args, **kwargs):
            seen.append(name)
            return fn(*args, **kwargs)
        return wrapper

    result = simulate_by_phase(row, wrap)
    assert seen == ["lower", "engine", "finish"]
    assert (api.lower, Engine.run, api.finish) == originals
    assert float(result.summary["step_time_s"]) == simulate_row(row)["simulated_step_s"]


def test_set_columns_overrides_every_row_and_refuses_unknown_columns():
    rows = [{"id": "a", "micro_batch": "1"}, {"id": "b", "micro_batch": "2"}]
    set_columns(rows, ["micro_batch=4", "global_batch_seqs=8"])
    assert [r["micro_batch"] for r in rows] == ["4", "4"]
    assert [r["global_batch_seqs"] for r in rows] == ["8", "8"]
    for bad in ("micro_batch", "no_such_column=1"):
        with pytest.raises(ValueError, match="--set"):
            set_columns(rows, [bad])


def test_a_row_is_simulated_by_the_function_given_and_skipped_as_references_skips_it():
    with open(CSV, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == ROW)
    assert simulate_or_skip(row, lambda r: {"by": r["id"]}) == ("row", {"by": ROW})
    kind, result = simulate_or_skip({**row, "global_batch_seqs": "3"},
                                     lambda r: pytest.fail("an invalid row was simulated"))
    assert kind in ("skipped", "inexpressible") and result["reason"]
