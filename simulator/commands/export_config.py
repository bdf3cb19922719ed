"""`export torchtitan|megatron PLAN -o CONFIG`: a plan as a framework's job config.

Writes only the framework's own keys; each plan field the framework cannot express is
one line on stderr (what the config runs instead), e.g. per-projection `seq` strategies.
"""
from __future__ import annotations

import argparse
import sys

import topologies
from workloads.jobs import write_megatron, write_torchtitan

from ..output import write_text_atomic
from .common import load_any_plan


def register(sub) -> None:
    """Add the `export` subcommand."""
    p = sub.add_parser("export", help="write a plan as a torchtitan or Megatron job config")
    p.add_argument("framework", choices=("torchtitan", "megatron"))
    p.add_argument("plan", help="plan file, bundled plan name or job config")
    p.add_argument("-o", "--output", metavar="CONFIG",
                   help="torchtitan: JOB.toml; megatron: a flags file (default: stdout)")
    p.add_argument("--topo", help="topology that resolves mesh.dp \"auto\" where the "
                                  "framework needs the degree (default: the plan's)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Export, list what could not be expressed on stderr, write the config."""
    plan = load_any_plan(args.plan)
    if args.framework == "torchtitan":
        ref = args.topo or plan.topology
        world = topologies.build(ref).world_size if ref and not plan.mesh.dp else None
        exported = write_torchtitan(plan, world)
    else:
        exported = write_megatron(plan)
    if args.output:
        write_text_atomic(args.output, exported.text)
    for line in exported.notes:
        print(line, file=sys.stderr)
    if not args.output:
        sys.stdout.write(exported.text)
    return 0
