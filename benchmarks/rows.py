"""`python -m benchmarks.rows [--only ID] [--repeat N] [--before FILE] [-o FILE]`: the
simulator's speed on published rows (validation/references/training_runs.csv).

Each row runs in a fresh process pinned to one core, the way `python -m validation
references` simulates it (validation/references.py simulate_row: plan, topology, default
SimOptions), timed by phase: lowering (workloads.lowering.lower), the engine's event loop
(Engine.run) and finishing the trace and summary (simulator.api.finish). The table gives
the median wall and CPU time per row over the repeats; with `--before` (the JSON of an
earlier run, such as benchmarks/rows_before.json) also the before/after ratio of the
median CPU time (the machine is shared, so CPU time is the steadier figure), and whether
the simulated step time and the trace are identical (a digest of both).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Rows using Megatron's combined 1F1B schedule with the EP all-to-all overlap (the slowest
# of the published rows to simulate) and a small one of the same kind.
ROWS = ("mb-qwen3-30b-gb200-mxfp8-8", "mb-dsv3-b200-mxfp8-256", "mb-dsv3-h100-fp8-1024",
        "mb-qwen3-235b-h100-fp8-256")
CSV = Path(__file__).resolve().parent.parent / "validation/references/training_runs.csv"


def _digest(table) -> str:
    """sha256 of every column of a trace, value by value (independent of its chunking)."""
    import pyarrow as pa
    sha = hashlib.sha256()
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        sha.update(name.encode())
        if pa.types.is_string(column.type):
            sha.update("\x1f".join(column.to_pylist()).encode())
        else:
            sha.update(column.to_numpy(zero_copy_only=False).tobytes())
    return sha.hexdigest()


def set_columns(rows: list[dict[str, str]], items: list[str]) -> None:
    """Apply `--set COLUMN=VALUE` items to every row (in place); ValueError naming the item
    when it has no "=" or its column is not one of the references CSV's."""
    with open(CSV, newline="") as f:
        columns = csv.DictReader(f).fieldnames or []
    for item in items:
        column, equals, value = item.partition("=")
        if not equals or column not in columns:
            raise ValueError(f"--set: got {item!r}; allowed: COLUMN=VALUE with a column "
                             "of the references CSV")
        for row in rows:
            row[column] = value


def simulate_by_phase(row: dict[str, str], wrap):
    """Simulate a reference row as `validation references` does, with each phase (lowering,
    the engine's event loop, finishing: "lower", "engine", "finish") run through
    wrap(name, fn) -> fn; the phases are restored afterwards. Returns the Result."""
    from simulator import api
    from simulator.engine import Engine
    from validation.references import plan_dict, topology_for
    from workloads import plan_from_dict

    lower, run, finish = api.lower, Engine.run, api.finish
    api.lower, Engine.run, api.finish = (wrap("lower", lower), wrap("engine", run),
                                         wrap("finish", finish))
    try:
        return api.simulate(plan_from_dict(plan_dict(row)), topology_for(row),
                            api.SimOptions())
    finally:
        api.lower, Engine.run, api.finish = lower, run, finish


def run_row(row_id: str) -> dict:
    """Simulate one row here, timing each phase (CPU and wall seconds)."""
    with open(CSV, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == row_id)
    cpu: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu[f"{name}_s"] = cpu.get(f"{name}_s", 0.0) + time.process_time() - start
        return wrapper

    wall, cpu0 = time.perf_counter(), time.process_time()
    result = simulate_by_phase(row, timed)
    out = {"row": row_id, "wall_s": time.perf_counter() - wall,
           "cpu_s": time.process_time() - cpu0, **cpu, "events": result.events,
           # ru_maxrss is in KiB on Linux
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_time_s": repr(float(result.summary["step_time_s"])),
           "summary_digest": hashlib.sha256(json.dumps(
               result.summary, sort_keys=True, default=str).encode()).hexdigest(),
           "trace_digest": _digest(result.trace)}
    return out


def _measure(row_id: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-m", "benchmarks.rows", "--child", row_id],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = dict(runs[0])
    for key in ("wall_s", "cpu_s", "lower_s", "engine_s", "finish_s"):
        best[key] = statistics.median(r.get(key, 0.0) for r in runs)
    best["repeats"] = repeat
    best["same_across_repeats"] = len({(r["step_time_s"], r["trace_digest"]) for r in runs}) == 1
    return best


def _table(rows: list[dict], before: dict[str, dict]) -> str:
    head = (f"{'row':<30} {'wall (s)':>9} {'cpu (s)':>8} {'lower':>7} {'engine':>7} "
            f"{'finish':>7} {'events':>10} {'cpu before':>10} {'ratio':>6}  identical")
    lines = [head, "-" * len(head)]
    for r in rows:
        b = before.get(r["row"])
        ratio = f"{b['cpu_s'] / r['cpu_s']:.2f}x" if b else "-"
        same = ("-" if not b else "yes" if (b["step_time_s"], b["trace_digest"]) ==
                (r["step_time_s"], r["trace_digest"]) else "NO")
        lines.append(f"{r['row']:<30} {r['wall_s']:>9.2f} {r['cpu_s']:>8.2f} "
                     f"{r['lower_s']:>7.2f} {r['engine_s']:>7.2f} {r['finish_s']:>7.2f} "
                     f"{r['events']:>10,} {b['cpu_s'] if b else float('nan'):>10.2f} "
                     f"{ratio:>6}  {same}")
    return "\n".join(lines)


def main() -> int:
    """Time the rows and print the table (and write the JSON)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rows")
    parser.add_argument("--only", action="append", help="a row id (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (median)")
    parser.add_argument("--before", help="JSON of an earlier run to compare with")
    parser.add_argument("-o", "--output", default="benchmarks/rows_results.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps(run_row(args.child)))
        return 0
    before = {}
    if args.before:
        before = {r["row"]: r for r in json.loads(Path(args.before).read_text())["results"]}
    rows = []
    for row_id in args.only or ROWS:
        rows.append(_measure(row_id, args.repeat))
        print(_table(rows[-1:], before).splitlines()[-1], flush=True)
    print()
    print(_table(rows, before))
    Path(args.output).write_text(json.dumps({"results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
