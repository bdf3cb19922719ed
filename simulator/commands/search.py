"""`search`: the best plan for a model, batch and topology, by simulation.

Enumerates meshes, micro-batch sizes, FSDP, recompute, sequence parallelism and
per-projection strategies, drops the infeasible candidates (counted by reason), ranks
the rest by reduced simulations and ranks the finalists by full simulation
(simulator/search). `-o best.json` writes the winner as a plan that `run` accepts and
that `run` simulates to the same step time.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import topologies
from inputs import ascii_int, strict_int
from workloads import MODEL_PRESETS, load_model
from workloads.plan import DTYPES, RECOMPUTE, STRATEGIES

from ..api import check_dtype_runs
from ..errors import UsageError
from ..search import Search, SearchSpace
from ..search.report import describe_candidate, render_table
from ..search.space import FRAMEWORK_SPACES, GRANULARITIES, divisors, for_framework, space_size
from ..output import write_text_atomic
from .common import positive_int, print_json, sim_options

BOTH = {"on": (True,), "off": (False,), "both": (True, False)}
# The raw search space (meshes x micro-batches x FSDP x recompute x SP x strategy
# assignments, search.space.space_size, counted by arithmetic before any is built) a search
# may ask for unless --max-points raises it. README's example is 184,608 points (group
# granularity, 32 GPUs); an exhaustive projection-granularity search of one 8-GPU node is
# 4.7 million and took over a minute on a 2-core host; a projection search of 1,024 GPUs is
# 119 million and ran past 200 s unfinished.
MAX_SEARCH_POINTS = 5_000_000
# Plans ranked by full simulation: each of the top k (and a few more) is simulated, so a
# large --top would simulate the whole shortlist pool.
MAX_TOP = 100


def register(sub) -> None:
    """Add the `search` subcommand."""
    p = sub.add_parser("search", help="find the best plan by simulation")
    p.add_argument("--topo", required=True, help="topology preset or file")
    p.add_argument("--model", required=True, help="model preset or model JSON file")
    p.add_argument("--global-batch", type=strict_int, required=True, help="sequences per step")
    p.add_argument("--seq-len", type=strict_int, required=True, help="tokens per sequence")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="GEMM precision")
    p.add_argument("--memory-budget", type=float, metavar="GB",
                   help="per-GPU memory budget in GB (default: the GPU's capacity)")
    p.add_argument("--top", type=strict_int, default=5,
                   help=f"how many plans to rank (default 5, at most {MAX_TOP})")
    p.add_argument("--max-points", type=positive_int, default=MAX_SEARCH_POINTS, metavar="N",
                   help="refuse search spaces of more candidate plans "
                        f"(default {MAX_SEARCH_POINTS:,})")
    p.add_argument("-o", "--output", metavar="BEST.json", help="write the best plan here")
    p.add_argument("--micro-batch", default="1,2,4", help="micro-batch sizes (default 1,2,4)")
    p.add_argument("--tp", help="TP degrees to try (default: every divisor)")
    p.add_argument("--pp", help="PP degrees to try (default: every divisor)")
    p.add_argument("--cp", default="1", help="CP degrees to try (default 1)")
    p.add_argument("--recompute", default=",".join(RECOMPUTE), help="recompute modes")
    p.add_argument("--fsdp", choices=sorted(BOTH), default="both", help="FSDP on, off or both")
    p.add_argument("--sp", choices=sorted(BOTH), default="both",
                   help="sequence parallelism on, off or both")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help="per-projection strategies to try")
    p.add_argument("--granularity", choices=GRANULARITIES, default="group",
                   help="one strategy per projection group (attention-in, wo, mlp-in, w2), "
                        "per projection, or Megatron's only")
    p.add_argument("--framework", choices=("generic", *FRAMEWORK_SPACES), default="generic",
                   help="only plans this framework's job config expresses, under its "
                        "profile (export the best with `export`)")
    p.add_argument("--exhaustive", action="store_true",
                   help="fully simulate every feasible candidate (brute force; slow)")
    p.add_argument("--slack", type=float, default=0.10,
                   help="keep contexts within this fraction of the best screened (0.10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--debug", action="store_true", help="tracebacks on internal errors")
    p.set_defaults(handler=handle)


def _ints(flag: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    parsed = [ascii_int(v) for v in text.split(",")]
    values = () if None in parsed else tuple(parsed)
    if not values or any(v < 1 for v in values):
        raise UsageError(flag, text, "comma-separated positive integers, e.g. 1,2,4")
    return values


def _words(flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if not values or any(v not in allowed for v in values):
        raise UsageError(flag, text, "comma-separated values of " + ", ".join(allowed))
    return values


def space_from_args(args: argparse.Namespace) -> SearchSpace:
    """The SearchSpace of the command-line flags (restricted to --framework's plans)."""
    space = _space(args)
    try:
        return for_framework(space, getattr(args, "framework", "generic"))
    except ValueError as exc:
        raise UsageError("--recompute", args.recompute, str(exc)) from None


def _space(args: argparse.Namespace) -> SearchSpace:
    return SearchSpace(
        tp=_ints("--tp", args.tp), pp=_ints("--pp", args.pp), cp=_ints("--cp", args.cp),
        micro_batch=_ints("--micro-batch", args.micro_batch),
        recompute=_words("--recompute", args.recompute, RECOMPUTE),
        fsdp=BOTH[args.fsdp], sequence_parallel=BOTH[args.sp],
        strategies=_words("--strategies", args.strategies, STRATEGIES),
        granularity=args.granularity)


def _check_degrees(args: argparse.Namespace, space: SearchSpace, world_size: int) -> None:
    """Each listed degree must divide the topology's GPUs, and a micro-batch fit in the
    global batch: a list with none that can, refused here, would search an empty space."""
    allowed = divisors(world_size)
    for flag, values in (("--tp", space.tp), ("--pp", space.pp), ("--cp", space.cp)):
        if values and not set(values) & set(allowed):
            raise UsageError(flag, ",".join(map(str, values)),
                             f"a degree that divides the {world_size} GPUs of {args.topo} "
                             f"({', '.join(map(str, allowed[:24]))}"
                             f"{', ...' if len(allowed) > 24 else ''})")
    if space.micro_batch and min(space.micro_batch) > args.global_batch:
        raise UsageError("--micro-batch", ",".join(map(str, space.micro_batch)),
                         f"a size of at most --global-batch ({args.global_batch})")


def handle(args: argparse.Namespace) -> int:
    """Run the search, print the ranking, write the best plan."""
    for flag, value in (("--global-batch", args.global_batch), ("--seq-len", args.seq_len),
                        ("--top", args.top)):
        if value < 1:
            raise UsageError(flag, value, "a positive integer")
    if args.top > MAX_TOP:
        raise UsageError("--top", args.top, f"a positive integer of at most {MAX_TOP}")
    if args.memory_budget is not None and not 0 < args.memory_budget < math.inf:
        raise UsageError("--memory-budget", args.memory_budget, "a positive number of GB")
    if not 0 <= args.slack <= 10:
        raise UsageError("--slack", args.slack, "a fraction between 0 and 10")
    space = space_from_args(args)
    model = load_model(args.model)
    model_ref = args.model if args.model in MODEL_PRESETS else model.to_dict()
    topology = topologies.build(args.topo)
    check_dtype_runs(args.dtype, topology, "--dtype")   # before minutes of screening
    _check_degrees(args, space, topology.world_size)
    points = space_size(space, model, topology.world_size)
    if points > args.max_points:
        raise UsageError("search", f"{points:,} candidate plans", f"at most {args.max_points:,} "
                         "(--max-points raises it; --tp, --pp, --micro-batch, --recompute or "
                         "--granularity group narrow the space)")
    capacity = min(d.hbm_bytes for d in topology.devices)
    budget = min(args.memory_budget * 1e9, capacity) if args.memory_budget else capacity
    args.full = args.no_flow_sharing = False
    args.algorithm = args.protocol = None
    search = Search(model, model_ref, topology, args.topo, args.global_batch, args.seq_len,
                    args.dtype, space, budget, args.top, args.slack,
                    options=sim_options(args), exhaustive=args.exhaustive)
    result = search.run()
    if result.best is None:
        reasons = "; ".join(f"{n} {r}" for r, n in sorted(result.dropped.items()))
        raise UsageError("search", f"{result.counts.get('candidates', 0)} candidates",
                         f"at least one feasible plan (dropped: {reasons or 'none'})")
    if args.output:
        write_text_atomic(args.output,
                          json.dumps(result.best.plan_dict, indent=2, allow_nan=False) + "\n")
    if args.json:
        # The JSON is the same on every run; how long this one took goes to stderr.
        print_json(to_json(result, search.budget_bytes))
        print(f"search took {result.seconds:.1f} s", file=sys.stderr)
    else:
        print(render(result, args, search.budget_bytes))
    return 0


def to_json(result, budget_bytes: float) -> dict:
    """The result as one JSON object (no wall-clock time: byte-identical across runs)."""
    errors = result.estimate_errors()
    return {
        "best": result.best.plan_dict,
        "top": [{"rank": i + 1, "label": r.candidate.label(), "plan": r.plan_dict,
                 "summary": r.summary, "estimate_s": r.estimate_s}
                for i, r in enumerate(result.top)],
        "counts": result.counts, "dropped": result.dropped, "folded": result.folded,
        "memory_budget_bytes": budget_bytes,
        "max_abs_estimate_error": max(map(abs, errors)) if errors else None,
    }


def render(result, args: argparse.Namespace, budget_bytes: float) -> str:
    """The human-readable ranking, with how the search got there."""
    c = result.counts
    lines = [f"search: {args.model} on {args.topo}, global batch {args.global_batch} x seq "
             f"{args.seq_len} ({args.dtype}), memory budget {budget_bytes / 1e9:.1f} GB",
             f"  {c.get('raw_points', 0):,} points, {c.get('candidates', 0):,} distinct "
             f"candidates, {c.get('feasible', 0):,} feasible"]
    for reason, n in sorted(result.folded.items()):
        lines.append(f"    folded {n:>8,}  {reason}")
    for reason, n in sorted(result.dropped.items()):
        lines.append(f"    dropped {n:>7,}  {reason}")
    if "screened" in c:
        lines.append(f"  contexts: {c.get('contexts_scanned', 0)} screened, "
                     f"{c.get('contexts_pruned_by_bound', 0)} pruned by the compute lower bound, "
                     f"{c.get('contexts_descended', 0)} searched over strategies; "
                     f"{c['screened']} candidates screened, {c.get('estimated', 0)} estimated "
                     f"({c.get('reduced_simulations', 0)} reduced simulations)")
    lines.append(f"  {c.get('full_simulations', 0)} full simulations; {result.seconds:.1f} s\n")
    summaries = [r.summary for r in result.top]
    names = [f"#{i + 1}" for i in range(len(result.top))]
    err = [("" if r.estimate_s is None else
            f"{100 * (r.estimate_s - r.step_time_s) / r.step_time_s:+.2f} %") for r in result.top]
    lines.append(render_table(summaries, names, {"estimate err": err}))
    lines.append("")
    for i, r in enumerate(result.top):
        lines.append(f"#{i + 1} {r.candidate.label()}: {describe_candidate(r.candidate)}")
    if args.output:
        lines.append(f"\nwrote the best plan to {args.output}")
    return "\n".join(lines)
