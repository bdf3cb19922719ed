"""`compare`: simulate several plans on one topology; one row per plan, the best marked."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from workloads import WorkloadError, resolve
from workloads.budget import check_work

from ..api import simulate
from ..errors import UsageError
from ..output import output_kind
from ..search.report import deltas, render_ops_table, render_table
from .common import add_common, add_limits, plan_and_topology, print_json, sim_options


def register(sub) -> None:
    """Add the `compare` subcommand."""
    p = sub.add_parser("compare", help="simulate several plans on one topology and compare them")
    p.add_argument("--plan", action="append", required=True,
                   help="plan file or bundled plan name (repeat: at least two)")
    p.add_argument("--topo", help="topology preset or file (default: each plan's own)")
    p.add_argument("--trace-dir", metavar="DIR",
                   help="write each plan's Parquet trace here (NN_<plan>.parquet)")
    add_common(p)
    add_limits(p)
    p.set_defaults(handler=handle)


def _trace_name(index: int, name: str) -> str:
    # a plan's name may be long: the file name stays well under the 255 bytes a name holds
    return f"{index:02d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:100] or 'plan'}.parquet"


def handle(args: argparse.Namespace) -> int:
    """Simulate each plan, print the table (or JSON), write the traces."""
    if len(args.plan) < 2:
        raise UsageError("--plan", args.plan, "at least two plans to compare")
    if args.trace_dir and Path(args.trace_dir).exists() and not Path(args.trace_dir).is_dir():
        raise UsageError("--trace-dir", args.trace_dir, "a directory (or a path to create)")
    loaded = [plan_and_topology(ref, args.topo, args.max_gpus) for ref in args.plan]
    for ref, (plan, topology) in zip(args.plan, loaded):   # fail before any simulation
        try:
            resolved = resolve(plan, topology.world_size)
            check_work(resolved, topology.world_size if args.full else resolved.mesh.pp,
                       args.max_tasks)
        except WorkloadError as exc:
            raise UsageError("--plan", ref, f"a plan that runs on {topology.name} ({exc})") \
                from None
    if args.trace_dir:   # every trace path checked before any simulation or write
        for i, (plan, _) in enumerate(loaded):
            output_kind(Path(args.trace_dir) / _trace_name(i, plan.name), "--trace-dir",
                        create_parents=True)
    options = sim_options(args)
    summaries, traces = [], []
    for i, (plan, topology) in enumerate(loaded):
        result = simulate(plan, topology, options, args.max_tasks)
        summaries.append(result.summary)
        if args.trace_dir:
            path = Path(args.trace_dir) / _trace_name(i, plan.name)
            result.write_trace(path)
            traces.append(str(path))
    delta = deltas(summaries)
    best = min(range(len(summaries)), key=lambda i: (summaries[i]["step_time_s"], i))
    if args.json:
        print_json({"plans": summaries, "delta_pct": delta, "best": best,
                    "best_plan": summaries[best]["plan"], "traces": traces})
        return 0
    names = [f"{s['plan']}" + ("" if args.topo else f" @ {s['topology']}") for s in summaries]
    print(render_table(summaries, names))
    ops = render_ops_table(summaries, names)
    if ops:
        print("\n" + ops)
    if traces:
        print("traces: " + ", ".join(traces))
    return 0
