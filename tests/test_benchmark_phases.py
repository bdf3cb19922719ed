"""benchmarks.rows simulate_by_phase, which benchmarks.rows (CPU time) and benchmarks.calls
(function calls) measure the phases through: each phase runs through the wrapper once,
the result is the plain simulation's, and the phases are restored afterwards."""
from __future__ import annotations

import csv

from benchmarks.rows import CSV, simulate_by_phase
from simulator import api
from simulator.engine import Engine
from validation.references import simulate_row

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
