"""`whatif`: one plan over topologies x varied parameters (x faults), as a table.

    python -m simulator whatif --plan col.json --topo dgx-h100x4 --topo nvl72 \\
        --vary tp=4,8,16 --vary ib_bandwidth=x0.5,x1,x2 -o study.parquet --plot study.png

Invalid points (a TP degree the model does not divide, a fault that cuts the job off)
stay in the table with status `invalid` and the reason. Exit 1 when a point hit an
internal error (status `error`), after the table is written.

Interruptions: SIGINT (Ctrl-C) or SIGTERM stop the study at once, keep every finished
point in FILE.parquet.partial.jsonl (the resume checkpoint: `--resume` runs only the
other points, and the table is then the one an uninterrupted run writes) and exit 130
(SIGINT) or 143 (SIGTERM). Killing the main process (SIGKILL) takes its worker
processes with it. Any other failure leaves no checkpoint behind, except one that
`--resume` started from. `--engine ray --address HOST:PORT` fails (exit 2) when the
port does not answer within simulator.whatif.engines.RAY_CONNECT_TIMEOUT_S (5 s).
"""
from __future__ import annotations

import argparse
import sys

from inputs import strict_int
from topologies.faults import FAULT_SYNTAX

from ..errors import EXIT_INTERNAL
from ..errors import UsageError
from ..output import print_json
from ..whatif import ENGINES, SweepInterrupted, plot, render, whatif
from ..whatif.engines import MAX_WORKERS, check_workers
from ..whatif.points import plan_source
from ..whatif.variations import (CLUSTER_PARAMS, FRAMEWORK_PARAMS, PLAN_KEYS, PLAN_PARAMS,
                                 parse_all)
from .common import add_common


def _named(name: str) -> str:
    """A plan parameter with its plan-file key where that differs (fsdp_version
    (fsdp.version))."""
    section, key = PLAN_KEYS[name]
    where = key if section is None else f"{section}.{key}"
    return name if where == name else f"{name} ({where})"


def register(sub) -> None:
    """Add the `whatif` subcommand."""
    p = sub.add_parser("whatif", help="sweep a plan over topologies, hardware and plan changes")
    p.add_argument("--plan", required=True, help="plan file, or a bundled plan name")
    p.add_argument("--topo", action="append", default=[],
                   help="topology preset or file (repeat for several; default: the plan's)")
    p.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a parameter and its values (repeatable; the study is the cross "
                        "product). Cluster: " + ", ".join(CLUSTER_PARAMS) + ". Plan: "
                        + ", ".join(n for n in PLAN_PARAMS if n not in FRAMEWORK_PARAMS)
                        + ". Framework-level (written at their plan-file keys, so a "
                        "`framework` profile's defaults follow each point): "
                        + ", ".join(map(_named, FRAMEWORK_PARAMS)))
    p.add_argument("--fault", action="append", default=[], metavar="FAULT",
                   help=FAULT_SYNTAX + " (repeatable; the rank classes split around it, "
                                       "--full: every rank)")
    p.add_argument("-o", "--output", metavar="FILE.parquet",
                   help="write one row per point (checkpoint FILE.parquet.partial.jsonl "
                        "while running)")
    p.add_argument("--plot", metavar="FILE.png", help="stacked step-time bars per point")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local worker processes (default) or Ray tasks")
    p.add_argument("--address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--workers", type=strict_int, default=None,
                   help="local worker processes, 1 to %d; never more than the cores "
                        "(default: all cores)" % MAX_WORKERS)
    p.add_argument("--resume", action="store_true",
                   help="skip the points already in the -o file's checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Check the flags, run the study through the library (simulator.whatif.whatif),
    plot and print the table."""
    check_workers(args.workers)
    if args.address and args.engine != "ray":
        raise UsageError("--address", args.address, "only with --engine ray")
    if args.output and not args.output.endswith(".parquet"):
        raise UsageError("--output", args.output, "a path ending in .parquet")
    varied = [v.name for v in parse_all(args.vary)]
    raw = plan_source(args.plan)
    options = {"full": args.full, "algorithm": args.algorithm, "protocol": args.protocol,
               "flow_sharing": not args.no_flow_sharing}
    try:
        rows = whatif(raw, args.topo, args.vary, args.fault, options, engine=args.engine,
                      workers=args.workers, address=args.address, output=args.output,
                      resume=args.resume, progress=not args.no_progress)
    except SweepInterrupted as exc:
        print(exc.message(), file=sys.stderr)
        return exc.exit_status
    if args.plot:
        title = f"{raw.get('name', 'plan')}: step time per point"
        if args.fault:
            title += " (" + "; ".join(args.fault) + ")"
        plot(rows, varied, args.plot, title)
    if args.json:
        print_json(rows)
    else:
        print(render(rows, varied))
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        print(f"internal error in {len(errors)} point(s), first: point {errors[0]['point']}: "
              f"{errors[0]['error']}", file=sys.stderr)
        return EXIT_INTERNAL
    return 0
