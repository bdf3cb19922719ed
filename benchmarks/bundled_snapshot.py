"""Snapshot of every bundled plan's simulated step: step time, peak memory, task count.

A refactor must leave these unchanged (or change them for a stated reason). Run
`python -m benchmarks.bundled_snapshot --write` before a change and
`python -m benchmarks.bundled_snapshot` after it: the second prints every plan whose
numbers moved, with before and after, and exits 1 if any did.
tests/test_bundled_snapshot.py runs the comparison in the suite.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import topologies
from simulator import simulate
from workloads import bundled_plans, load_plan

SNAPSHOT = Path(__file__).with_name("bundled_snapshot.json")
KEYS = ("step_time_s", "peak_memory_bytes", "tasks")
# Relative change treated as unchanged: float summation order may move the last digits.
TOLERANCE = 1e-9


def snapshot_one(name: str) -> dict[str, float]:
    """The numbers of one bundled plan simulated on its own topology."""
    plan = load_plan(name)
    result = simulate(plan, topologies.build(plan.topology or "dgx-h100"))
    tasks = sum(len(stage) for stage in result.program.stages)
    return {"step_time_s": result.summary["step_time_s"],
            "peak_memory_bytes": result.summary["peak_memory_bytes"], "tasks": tasks}


def take() -> dict[str, dict[str, float]]:
    """Numbers of every bundled plan, keyed by file name."""
    return {name: snapshot_one(name) for name in bundled_plans()}


def differences(before: dict, after: dict) -> list[str]:
    """One line per plan and number that moved (or a plan that appeared or vanished)."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            lines.append(f"{name}: {'new' if name not in before else 'removed'}")
            continue
        for key in KEYS:
            old, new = before[name][key], after[name][key]
            if abs(new - old) > TOLERANCE * max(abs(old), 1e-30):
                lines.append(f"{name}: {key} {old:.6g} -> {new:.6g} "
                             f"({(new - old) / old * 100 if old else float('inf'):+.3f} %)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Write the snapshot (--write) or compare the current code against it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bundled_snapshot")
    parser.add_argument("--write", action="store_true", help="record the current numbers")
    args = parser.parse_args(argv)
    now = take()
    if args.write:
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT} ({len(now)} plans)")
        return 0
    moved = differences(json.loads(SNAPSHOT.read_text()), now)
    print("\n".join(moved) if moved else f"all {len(now)} bundled plans unchanged")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
