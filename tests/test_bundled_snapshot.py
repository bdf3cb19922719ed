"""Every bundled plan keeps the step time, peak memory and task count recorded in
benchmarks/bundled_snapshot.json. A change that moves one on purpose rewrites the
snapshot (`python -m benchmarks.bundled_snapshot --write`), so the move shows in review."""
from __future__ import annotations

import json

from benchmarks.bundled_snapshot import SNAPSHOT, differences, take


def test_bundled_plans_match_the_snapshot():
    moved = differences(json.loads(SNAPSHOT.read_text()), take())
    assert not moved, "\n".join(moved)


def test_differences_reports_a_moved_number():
    before = {"a.json": {"step_time_s": 1.0, "peak_memory_bytes": 2.0, "tasks": 3}}
    after = {"a.json": {"step_time_s": 1.1, "peak_memory_bytes": 2.0, "tasks": 3}}
    assert differences(before, after) == ["a.json: step_time_s 1 -> 1.1 (+10.000 %)"]
    assert differences(before, before) == []
