"""`python -m benchmarks.calls ROW [--set column=value ...]`: the Python function calls
each phase of one published row's simulation makes (lowering, the engine's event loop,
finishing the trace and summary), counted by cProfile, in a fresh process.

On a shared host CPU times of one code version move by 10-30 % from run to run
(benchmarks/README.md), more than a small change saves; the count of calls moves by about
0.1 % (hash-ordered iteration), so it shows whether a change removed work. One row per
process: a row simulated after another finds caches and imports warm and counts fewer.
It is not a time: calls differ in cost, and the profiler slows the run about threefold.
`--set` overrides a CSV column of the row (e.g. `--set global_batch_seqs=384`: fewer
micro-batches, a shorter run).
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import sys

from benchmarks.rows import CSV, set_columns, simulate_by_phase


def count_calls(row: dict[str, str]) -> dict[str, float]:
    """Function calls per phase of one row's simulation, and its simulated step time."""
    calls: dict[str, float] = {}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            profile = cProfile.Profile()
            profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                profile.disable()
                calls[name] = pstats.Stats(profile).total_calls
        return wrapper

    result = simulate_by_phase(row, counted)
    return {**calls, "step_time_s": float(result.summary["step_time_s"])}


def main() -> int:
    """Count the calls of the row named and print them (exit 2 for an unknown row)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calls")
    parser.add_argument("row", help="a row id of the references CSV")
    parser.add_argument("--set", action="append", default=[], metavar="COLUMN=VALUE")
    args = parser.parse_args()
    with open(CSV, newline="") as f:
        table = {r["id"]: r for r in csv.DictReader(f)}
    if args.row not in table:
        print(f"error: row {args.row!r} is not in {CSV.name}", file=sys.stderr)
        return 2
    row = dict(table[args.row])
    try:
        set_columns([row], args.set)
    except ValueError as exc:
        parser.error(str(exc))
    out = count_calls(row)
    print(f"{'row':<34} {'lower':>10} {'engine':>10} {'finish':>10}  step time (s)")
    print(f"{args.row:<34} {out['lower']:>10,} {out['engine']:>10,} {out['finish']:>10,}"
          f"  {out['step_time_s']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
