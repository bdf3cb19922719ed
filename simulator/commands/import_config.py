"""`import torchtitan|megatron CONFIG`: a framework's job config as a plan file.

Keys that cannot change a step's time are listed as ignored, one line each on stderr;
keys that would change it but are not modelled exit 2 naming them (`--lenient`: a
warning each). The tables are workloads/jobs/torchtitan_keys.py and megatron_keys.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workloads.jobs import read_job
from workloads.plan import plan_from_dict

from ..output import write_text_atomic


def register(sub) -> None:
    """Add the `import` subcommand."""
    p = sub.add_parser("import", help="read a torchtitan or Megatron job config as a plan")
    p.add_argument("framework", choices=("torchtitan", "megatron"))
    p.add_argument("config", help="torchtitan: JOB.toml; megatron: a file of pretrain_gpt.py "
                                  "flags, or a Megatron-Bridge run YAML (.yaml)")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan here "
                                                               "(default: stdout)")
    p.add_argument("--lenient", action="store_true",
                   help="warn about keys that are not modelled instead of exiting 2")
    p.add_argument("--model", help="model preset or model JSON for a flavor or flags that "
                                   "name no preset")
    p.add_argument("--topology", help="the plan's default topology (not part of a job config)")
    p.add_argument("--name", help="the plan's name (default: the config file's stem)")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Import, validate the plan, write it, list the notes on stderr."""
    model = args.model
    if model and Path(model).is_file():
        model = str(Path(model).resolve())
    imported = read_job(args.config, args.framework, args.lenient, model)
    stem = Path(args.config).stem
    plan = {"name": args.name or stem,
            "description": f"imported from the {args.framework} config {Path(args.config).name}",
            **imported.plan}
    if args.topology:
        plan["topology"] = args.topology
    plan_from_dict(plan)               # the plan file it writes is a valid plan
    text = json.dumps(plan, indent=2) + "\n"
    if args.output:
        write_text_atomic(args.output, text)
    for line in imported.notes:
        print(line, file=sys.stderr)
    if not args.output:
        sys.stdout.write(text)
    return 0
