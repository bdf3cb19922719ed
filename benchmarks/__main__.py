"""`python -m benchmarks [--only SUBSTRING] [--repeat N] [-o results.json]`.

Each case runs in a fresh process pinned to one core (the targets in cases.py are for one
core of a 2-core machine); the table reports the median wall time over repeats.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

from simulator.output import write_text_atomic

from .cases import CASES, run_case


def _child(index: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(json.dumps(run_case(CASES[index])))


def _measure(index: int, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-m", "benchmarks", "--child", str(index)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = dict(runs[0])
    best["wall_s"] = statistics.median(r["wall_s"] for r in runs)
    best["cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
    best["events_per_s"] = best["events"] / best["wall_s"]
    best["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in runs)
    best["repeats"] = repeat
    return best


def _table(rows: list[dict]) -> str:
    head = (f"{'case':<46} {'wall (s)':>9} {'cpu (s)':>8} {'target':>8} {'events':>10} "
            f"{'events/s':>10} {'peak RSS':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        target = f"{r['target_s']:.0f} s" if r["target_s"] else "-"
        ok = "" if not r["target_s"] or r["wall_s"] <= r["target_s"] else " MISSED"
        if r.get("target_rss_bytes") and r["peak_rss_bytes"] > r["target_rss_bytes"]:
            ok += " RSS MISSED"
        lines.append(f"{r['case']:<46} {r['wall_s']:>9.2f} {r['cpu_s']:>8.2f} {target:>8} "
                     f"{r['events']:>10,} "
                     f"{r['events_per_s']:>10,.0f} {r['peak_rss_bytes'] / 1e9:>7.2f} GB{ok}")
    return "\n".join(lines)


def main() -> int:
    """Run the benchmarks and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (median)")
    parser.add_argument("-o", "--output", default="benchmarks/results.json")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child)
        return 0
    rows = []
    for i, case in enumerate(CASES):
        if args.only and args.only not in case.name:
            continue
        rows.append(_measure(i, args.repeat))
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(_table(rows))
    machine = {"python": platform.python_version(), "machine": platform.machine(),
               "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count()}
    write_text_atomic(args.output, json.dumps({"machine": machine, "results": rows},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
