"""`export torchtitan|megatron PLAN -o CONFIG`: a plan as a framework's job config.

Writes only the framework's own keys; each plan field the framework cannot express is
one line on stderr (what the config runs instead), e.g. per-projection `seq` strategies.

The topology (--topo, else the plan's) is read as a ClusterSpec only, for its GPU count:
nothing is built, and a cluster past --max-gpus is refused before it is read further,
as `run` refuses it (README, "Limits").
"""
from __future__ import annotations

import argparse
import sys

import topologies
from workloads.jobs import write_megatron, write_torchtitan

from ..output import write_text_atomic
from ..errors import UsageError
from .common import add_limits, load_any_plan


def register(sub) -> None:
    """Add the `export` subcommand."""
    p = sub.add_parser("export", help="write a plan as a torchtitan or Megatron job config")
    p.add_argument("framework", choices=("torchtitan", "megatron"))
    p.add_argument("plan", help="plan file, bundled plan name or job config")
    p.add_argument("-o", "--output", metavar="CONFIG",
                   help="torchtitan: JOB.toml; megatron: a flags file (default: stdout)")
    p.add_argument("--topo", help="topology that resolves mesh.dp \"auto\" where the "
                                  "framework needs the degree (default: the plan's)")
    add_limits(p, tasks=False)   # nothing is simulated: only the topology's size is bounded
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def _world_size(ref: str, max_gpus: int) -> int:
    """The GPU count of a topology preset or file (TopologyError past max_gpus), without
    building its graph."""
    spec = topologies.cluster_spec(ref, max_gpus)
    return spec.num_domains * spec.domain_size


def handle(args: argparse.Namespace) -> int:
    """Export, list what could not be expressed on stderr, write the config."""
    if args.topo is not None and not args.topo.strip():
        raise UsageError("--topo", args.topo, "a topology name or file (not empty)")
    plan = load_any_plan(args.plan)
    ref = args.topo or plan.topology
    needed = args.framework == "torchtitan" and not plan.mesh.dp   # dp "auto"
    # A --topo is read (and bounded) even where the mesh does not need it: never ignored.
    world = _world_size(ref, args.max_gpus) if ref and (needed or args.topo) else None
    if args.framework == "torchtitan":
        exported = write_torchtitan(plan, world if needed else None)
    else:
        exported = write_megatron(plan)
    if args.output:
        write_text_atomic(args.output, exported.text)
    for line in exported.notes:
        print(line, file=sys.stderr)
    if not args.output:
        sys.stdout.write(exported.text)
    return 0
