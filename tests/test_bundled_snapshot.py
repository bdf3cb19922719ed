"""Every bundled plan keeps the step time, peak memory and task count recorded in
benchmarks/bundled_snapshot.json. A change that moves one on purpose rewrites the
snapshot (`python -m benchmarks.bundled_snapshot --write`), so the move shows in review.
One test per plan: the 23 simulations spread over the suite's workers (as one test they
took 33 s on one worker)."""
from __future__ import annotations

import json

import pytest

from benchmarks.bundled_snapshot import SNAPSHOT, differences, snapshot_one
from workloads import bundled_plans

RECORDED = json.loads(SNAPSHOT.read_text())


def test_the_snapshot_names_every_bundled_plan():
    assert sorted(RECORDED) == sorted(bundled_plans())


@pytest.mark.parametrize("name", sorted(bundled_plans()))
def test_bundled_plan_matches_the_snapshot(name):
    recorded = {name: RECORDED[name]} if name in RECORDED else {}   # absent: "name: new"
    moved = differences(recorded, {name: snapshot_one(name)})
    assert not moved, "\n".join(moved)


def test_differences_reports_a_moved_number():
    before = {"a.json": {"step_time_s": 1.0, "peak_memory_bytes": 2.0, "tasks": 3}}
    after = {"a.json": {"step_time_s": 1.1, "peak_memory_bytes": 2.0, "tasks": 3}}
    assert differences(before, after) == ["a.json: step_time_s 1 -> 1.1 (+10.000 %)"]
    assert differences(before, before) == []
