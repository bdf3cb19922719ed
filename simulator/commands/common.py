"""Helpers shared by subcommands: resolving plan and topology arguments, printing."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import topologies
from inputs import decimal
from topologies import Topology
from topologies.presets import MAX_GPUS
from workloads import Plan, load_plan
from workloads.budget import MAX_TASKS
from workloads.jobs import job_framework, load_job

from ..engine import SimOptions
from ..errors import UsageError
from ..network import ALGORITHMS, PROTOCOLS, CommOptions
from ..output import print_json  # noqa: F401 - re-exported for the commands


def add_common(parser: argparse.ArgumentParser) -> None:
    """Flags every simulating command takes."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--full", action="store_true",
                        help="simulate every rank, not one per rank class")
    parser.add_argument("--algorithm", choices=ALGORITHMS,
                        help="force a collective algorithm (default: NCCL-like tuner)")
    parser.add_argument("--protocol", choices=PROTOCOLS, help="force an NCCL protocol")
    parser.add_argument("--no-flow-sharing", action="store_true",
                        help="closed-form collectives only (no link sharing between flows)")
    parser.add_argument("--debug", action="store_true", help="tracebacks on internal errors")


def add_limits(parser: argparse.ArgumentParser, tasks: bool = True) -> None:
    """--max-gpus (topology size) and --max-tasks (planned work): the bounds checked
    before anything is built (README, "Limits")."""
    parser.add_argument("--max-gpus", type=positive_int, default=MAX_GPUS, metavar="N",
                        help=f"refuse topologies of more GPUs (default {MAX_GPUS:,})")
    if tasks:
        parser.add_argument("--max-tasks", type=positive_int, default=MAX_TASKS, metavar="N",
                            help=f"refuse plans estimated at more simulated tasks "
                                 f"(default {MAX_TASKS:,})")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (at most 2^62)."""
    value = decimal(text, 19)
    if value is None or not 1 <= value <= 1 << 62:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def sim_options(args: argparse.Namespace) -> SimOptions:
    """SimOptions from the common flags."""
    return SimOptions(full=args.full, comm=CommOptions(
        algorithm=args.algorithm, protocol=args.protocol,
        flow_sharing=not args.no_flow_sharing))


# A job config's notes (what its importer ignored), held until the command has succeeded
# (simulator/cli.py main): a later error is then the one line on stderr.
PENDING_NOTES: list[str] = []


def flush_notes(succeeded: bool) -> None:
    """Print the pending notes to stderr, one a line, after a command that succeeded;
    drop them after one that failed."""
    if succeeded:
        for line in PENDING_NOTES:
            print(line, file=sys.stderr)
    PENDING_NOTES.clear()


def load_any_plan(plan_ref: str) -> Plan:
    """A plan file, a bundled plan, or a framework job config (a torchtitan .toml, a
    Megatron-Bridge .yaml, a file of Megatron flags): its notes go to stderr, one a line,
    once the command has succeeded (flush_notes)."""
    if job_framework(plan_ref) and Path(plan_ref).is_file():
        plan, notes = load_job(plan_ref)
        PENDING_NOTES.extend(notes)
        return plan
    return load_plan(plan_ref)


def plan_and_topology(plan_ref: str, topo_ref: str | None,
                      max_gpus: int = MAX_GPUS) -> tuple[Plan, Topology]:
    """Load a plan (or job config); the topology is --topo, else the plan's default (at
    most max_gpus)."""
    if topo_ref is not None and not topo_ref.strip():
        raise UsageError("--topo", topo_ref, "a topology name or file (not empty)")
    plan = load_any_plan(plan_ref)
    ref = topo_ref or plan.topology
    if not ref:
        raise UsageError("--topo", None, "a topology name or file (the plan names none)")
    return plan, topologies.build(ref, max_gpus)


def fmt_time(seconds: float) -> str:
    """Seconds with a readable unit."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_bytes(n: float) -> str:
    """Bytes in decimal GB/MB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
