"""`run`: simulate one plan on one topology; table, JSON, Parquet and Perfetto traces."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from topologies.faults import FAULT_SYNTAX, apply_faults, parse_fault

from ..api import simulate
from ..band import describe_band, prediction_band
from ..errors import EXIT_DOES_NOT_FIT
from ..output import staged_outputs, write_text_atomic
from ..trace import chrome_trace
from .common import (add_common, add_limits, fmt_bytes, fmt_time, plan_and_topology, print_json,
                     sim_options)


# Operations the table prints; the JSON has every one.
TOP_OPS = 8


def register(sub) -> None:
    """Add the `run` subcommand."""
    p = sub.add_parser("run", help="simulate one training step of a plan")
    p.add_argument("--plan", required=True, help="plan file, or a bundled plan name")
    p.add_argument("--topo", help="topology preset or file (default: the plan's)")
    p.add_argument("--trace", metavar="FILE.parquet", help="write the Parquet trace")
    p.add_argument("--chrome-trace", metavar="FILE.json", help="write a Perfetto/Chrome trace")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help=FAULT_SYNTAX + " (repeatable; the ranks the faults touch, and those "
                        "that wait on them, are simulated as their own rank classes; --full: "
                        "every rank)")
    p.add_argument("--strict-memory", action="store_true",
                   help=f"exit {EXIT_DOES_NOT_FIT} when the plan does not fit in memory")
    add_common(p)
    add_limits(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Simulate and report."""
    plan, topology = plan_and_topology(args.plan, args.topo, args.max_gpus)
    options = sim_options(args)
    if args.fault:
        # A fault breaks the symmetry of the ranks it touches: split the rank classes
        # there (simulator/rank_classes.py), unless --full asks for every rank.
        topology = apply_faults(topology, [parse_fault(f) for f in args.fault])
        options = replace(options, fault_classes=True)
    result = simulate(plan, topology, options, args.max_tasks)
    band = prediction_band(topology.device(0).name, plan.framework,
                           float(result.summary["step_time_s"]),
                           model_kind="moe" if plan.model.num_experts else "dense")
    _write_traces(args, result)
    if args.json:
        print_json({**result.summary, **band})
    else:
        print(render({**result.summary, **band}))
    if args.strict_memory and not result.summary["fits_in_memory"]:
        return EXIT_DOES_NOT_FIT
    return 0


def _write_traces(args: argparse.Namespace, result) -> None:
    """The Parquet and the Perfetto trace, both or neither (output.staged_outputs)."""
    with staged_outputs():
        if args.trace:
            result.write_trace(args.trace)
        if args.chrome_trace:
            write_text_atomic(args.chrome_trace, json.dumps(chrome_trace(result.trace)))


def render(s: dict) -> str:
    """The human-readable summary table."""
    mesh = s["mesh"]
    step = s["step_time_s"]
    pct = (lambda x: f"{100 * x / step:5.1f} %") if step else (lambda x: "")
    mem = s["memory"]
    fits = "fits" if s["fits_in_memory"] else "DOES NOT FIT"
    lines = [
        f"plan {s['plan']}: {s['model']} on {s['topology']} ({s['world_size']} GPUs: "
        f"pp {mesh['pp']} x dp {mesh['dp']} x cp {mesh['cp']} x tp {mesh['tp']}), "
        f"{s['micro_batches']} micro-batch(es) per step",
        f"  step time                {fmt_time(step):>12}"
        + (f"  {describe_band(s)}" if "step_time_band" in s else ""),
        f"    compute                {fmt_time(s['compute_s']):>12}  {pct(s['compute_s'])}",
        f"    exposed communication  {fmt_time(s['exposed_comm_s']):>12}  {pct(s['exposed_comm_s'])}",
        f"    idle (bubble, waits)   {fmt_time(s['bubble_s']):>12}  {pct(s['bubble_s'])}",
        f"  communication (total)    {fmt_time(s['comm_s']):>12}  "
        f"({fmt_time(s['comm_s'] - s['exposed_comm_s'])} overlapped)",
        f"  tokens/s                 {s['tokens_per_s']:>12,.0f}",
        f"  MFU                      {100 * s['mfu']:>10.1f} %",
        f"  peak memory per GPU      {fmt_bytes(s['peak_memory_bytes']):>12}  of "
        f"{fmt_bytes(s['memory_capacity_bytes'])} ({fits})",
        f"    params {fmt_bytes(mem['params_bytes'])}, grads {fmt_bytes(mem['grads_bytes'])}, "
        f"optimizer {fmt_bytes(mem['optimizer_bytes'])}, activations "
        f"{fmt_bytes(mem['activations_bytes'])}, buffers {fmt_bytes(mem['buffers_bytes'])}",
        f"  simulated {s['simulated_ranks']} rank(s), {s['events']:,} tasks",
    ]
    return "\n".join(lines + render_ops(s))


def render_ops(s: dict, top: int = TOP_OPS) -> list[str]:
    """The critical rank's longest operations by device time (`--json` lists them all)."""
    ops = s.get("ops") or []
    if not ops:
        return []
    lines = [f"  longest operations (rank {s['critical_rank']}; device time on each "
             "stream, which overlap; exposed: while no compute ran)"]
    for op in ops[:top]:
        rate, exposed = op["achieved_flops_per_s"], op["exposed_s"]
        name = f"{op['op']} ({op['stream']})"
        lines.append(f"    {name:<30} {fmt_time(op['device_s']):>10}"
                     f"  {100 * op['share_of_step']:5.1f} %  {op['tasks']:>7,} tasks"
                     + (f"  {rate / 1e12:7.1f} TFLOP/s" if rate else "")
                     + (f"  {fmt_time(exposed)} exposed" if exposed is not None else ""))
    if len(ops) > top:
        lines.append(f"    ... {len(ops) - top} more (--json: ops)")
    return lines
