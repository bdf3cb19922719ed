"""`python -m benchmarks.row_memory [--only ID ...] [--skip ID ...] [--phases]
[--set COLUMN=VALUE ...] [-o FILE]`: each published row's peak memory alone, the rows
simulated one after another in this one process as a `validation references` worker runs
them (Linux: /proc/self/status).

Before each row the process's peak resident set (VmHWM) is reset (writing 5 to
/proc/self/clear_refs), so a row's peak is its own, though never below what the process
kept from the rows before (the previous row's rss_after_gb: freed memory the allocator
holds for reuse); the resident set after each row shows whether memory builds up. One
JSON line per row (id, seconds, peak_gb, rss_after_gb, outcome, error_pct or reason)
goes to the output file as the row ends, so a run stopped part-way keeps what it
measured. Not a timed test: it takes the table's whole simulation time (about two hours
on one core), and a row past the host's memory is killed with the process (`--skip`
leaves it out).

`--phases` simulates each row through its phases instead (benchmarks/rows.py
simulate_by_phase) and adds the peak reached by the end of each (`lower_gb`, `engine_gb`,
`finish_gb`: what the Program holds, what the event loop adds, what building the trace
adds) and the step time; `--set` overrides a CSV column of every row (e.g.
`--set global_batch_seqs=224`: fewer micro-batches, a smaller copy of a large row).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# The kernel states these sizes in "kB" that are KiB; the figures here (and those quoted in
# validation/README.md and benchmarks/README.md) are that number / 1e6, 2.4 % under
# decimal GB.
KB_PER_GB = 1e6


def _memory_gb() -> dict[str, float]:
    """VmRSS and VmHWM of this process, in the kernel's kB / 1e6 (KB_PER_GB)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / KB_PER_GB
    return out


def _by_phase(row: dict[str, str]) -> dict:
    """Simulate a row phase by phase: the peak by the end of each, and the step time."""
    from benchmarks.rows import simulate_by_phase

    peaks: dict[str, float] = {}

    def measured(name, fn):
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                peaks[f"{name}_gb"] = round(_memory_gb()["VmHWM"], 2)
        return wrapper

    result = simulate_by_phase(row, measured)
    return {**peaks, "step_time_s": float(result.summary["step_time_s"])}


def _measure(row: dict[str, str], phases: bool) -> dict:
    """One row's outcome as `validation references` reaches it (inexpressible and skipped
    rows alike), with the error, or with the peaks by phase and the step time."""
    from validation.references import simulate_or_skip, simulate_row

    try:   # a column --set made unreadable fails before the simulation's own checks
        kind, result = simulate_or_skip(row, _by_phase if phases else simulate_row)
    except ValueError as exc:
        return {"outcome": "skipped", "reason": str(exc)}
    if kind != "row":
        return {"outcome": kind, "reason": result["reason"]}
    if phases:
        return {"outcome": kind, **result}
    return {"outcome": kind, "error_pct": round(result["error_pct"], 3)}


def main() -> int:
    """Measure the rows and write one JSON line each."""
    from benchmarks.rows import set_columns
    from validation.reference_rows import load_rows, row_id
    from validation.references import DEFAULT_CSV

    parser = argparse.ArgumentParser(prog="python -m benchmarks.row_memory")
    parser.add_argument("--only", action="extend", nargs="+", help="row ids (repeatable)")
    parser.add_argument("--skip", action="extend", nargs="+", default=[],
                        help="row ids to leave out (repeatable)")
    parser.add_argument("--phases", action="store_true",
                        help="the peak at the end of each phase, and the step time")
    parser.add_argument("--set", action="append", default=[], metavar="COLUMN=VALUE")
    parser.add_argument("-o", "--output", default="benchmarks/row_memory.jsonl")
    args = parser.parse_args()
    rows = [dict(r) for r in load_rows(DEFAULT_CSV)
            if (not args.only or row_id(r) in args.only) and row_id(r) not in args.skip]
    try:
        set_columns(rows, args.set)
    except ValueError as exc:
        parser.error(str(exc))
    with open(args.output, "w") as out:
        for row in rows:
            Path("/proc/self/clear_refs").write_text("5")
            start = time.perf_counter()
            line = _measure(row, args.phases)
            memory = _memory_gb()
            line = {"id": row_id(row), "seconds": round(time.perf_counter() - start, 1),
                    "peak_gb": round(memory["VmHWM"], 2),
                    "rss_after_gb": round(memory["VmRSS"], 2), **line}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
