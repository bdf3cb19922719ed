"""`python -m validation run|calibrate|compare|references|op-shares|collectives|moe-layer|gemm-guide`.

Exit status: 0 success, 2 bad input (one line on stderr naming field, value and allowed
values; no traceback; an output path that cannot be written is refused before the work),
4 an output could not be written (a full disk), 1 internal error.
"""
from __future__ import annotations

import argparse
import os
import sys

from inputs import InputError, decimal
from simulator.errors import EXIT_WRITE_FAILED, WriteError
from simulator.output import output_kind

from .errors import ValidationError

BAD_INPUT = (InputError,)   # ValidationError, WorkloadError, TopologyError, ...


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse hook
        raise ValidationError("arguments", " ".join(sys.argv[1:]), message)


# Upper bounds of the count flags, checked while the flags are parsed (before a process is
# spawned): a typo such as --nproc 100000 must be refused, not handed to mp.spawn.
# --nproc: processes spawned on this one host (mp.spawn); no host has more than 1,024 GPUs
# or CPU cores to give them (a multi-node run goes through torchrun, which sets WORLD_SIZE).
MAX_NPROC = 1024
# --threads: torch intra-op threads per process; past a host's core count they only contend.
MAX_THREADS = 1024
# --steps / --warmup: real training steps, each a row per rank in the measured file;
# 100,000 steps of even a 10 ms toy step is over 15 minutes, far past any validation run.
MAX_STEPS = 100_000
# --jobs: simulation workers of `references` (CPU-bound, each an interpreter holding the
# simulator); more than a few per CPU only queue and use memory.
JOBS_PER_CPU = 4


def max_jobs() -> int:
    """The largest --jobs this host accepts (JOBS_PER_CPU per CPU)."""
    return JOBS_PER_CPU * (os.cpu_count() or 1)


def _count(low: int, high: int):
    """argparse type: an integer in [low, high]; ASCII decimal digits only (inputs.decimal:
    no sign, '_', padding or '٨'), at most 7 of them (every bound is below 10^7)."""
    def parse(text: str) -> int:
        value = decimal(text, 7)
        if value is None or not low <= value <= high:
            # argparse names the flag: "argument --nproc: an integer in [1, 1,024] ..."
            raise argparse.ArgumentTypeError(f"an integer in [{low}, {high:,}], got {text!r}")
        return value
    return parse


def _add_jobs(parser: argparse.ArgumentParser) -> None:
    """--jobs: simulation workers over the references' rows."""
    parser.add_argument("--jobs", type=_count(1, max_jobs()), default=None,
                        help=f"worker processes, at most {JOBS_PER_CPU} per CPU "
                             "(default: one per CPU)")


def build_parser() -> argparse.ArgumentParser:
    """The CLI; exposed for tests of argument parsing."""
    p = _Parser(prog="python -m validation", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="train a plan for real and time its steps")
    run.add_argument("--plan", required=True, action="append",
                     help="plan file or bundled plan name; repeat it to train several plans "
                          "in the same processes, their steps in turn (-o is then a folder)")
    run.add_argument("--backend", default="gloo", help="gloo (CPU) | nccl (GPU)")
    run.add_argument("--nproc", type=_count(1, MAX_NPROC), default=None,
                     help=f"processes to spawn, at most {MAX_NPROC:,} (default: WORLD_SIZE "
                          "under torchrun, else 2)")
    run.add_argument("--steps", type=_count(1, MAX_STEPS), default=5,
                     help=f"timed steps, at most {MAX_STEPS:,}")
    run.add_argument("--warmup", type=_count(0, MAX_STEPS), default=1,
                     help=f"untimed steps, at most {MAX_STEPS:,}")
    run.add_argument("--dims", default=None,
                     help="overrides: hidden=,layers=,heads=,kv_heads=,ffn=,vocab=,seq=,batch=,"
                          "micro_batch=")
    run.add_argument("--dtype", default=None, help="fp32 (gloo default) | bf16 (nccl default)")
    run.add_argument("--threads", type=_count(1, MAX_THREADS), default=1,
                     help=f"torch intra-op threads per process (CPU), at most {MAX_THREADS:,}")
    run.add_argument("--profile", action="store_true", help="record torch.profiler events")
    run.add_argument("-o", "--output", required=True,
                     help="measured Parquet file (with several --plan: a folder that gets "
                          "<plan name>.parquet for each)")

    cal = sub.add_parser("calibrate", help="micro-benchmark this host into a topology file")
    cal.add_argument("--backend", default="gloo", help="gloo | nccl")
    cal.add_argument("--nproc", type=_count(1, MAX_NPROC), default=None,
                     help=f"processes to spawn, at most {MAX_NPROC:,}")
    cal.add_argument("--threads", type=_count(1, MAX_THREADS), default=1,
                     help=f"torch intra-op threads per process, at most {MAX_THREADS:,}")
    cal.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    cal.add_argument("-o", "--output", required=True, help="topology JSON to write")

    cmp = sub.add_parser("compare", help="simulate a measured run and report the error")
    cmp.add_argument("--measured", required=True, help="Parquet file from `validation run`")
    cmp.add_argument("--topo", required=True, help="topology (calibrated host.json or preset)")
    cmp.add_argument("--json", action="store_true", help="print one JSON object")

    ref = sub.add_parser("references", help="simulate published training runs; print MAPE")
    ref.add_argument("--csv", default=None, help="reference CSV (default: bundled)")
    ref.add_argument("--json", action="store_true", help="print one JSON object")
    _add_jobs(ref)
    ref.add_argument("--row", metavar="ID",
                     help="simulate one row and print where its time goes (the run table, "
                          "longest operations); one process, no residuals written")
    ref.add_argument("--no-write-residuals", action="store_true",
                     help="do not update simulator/data/reference_residuals.json (the bundled "
                          "table's residuals, read by `simulator run` for its band)")
    shares = sub.add_parser("op-shares", help="references' errors against where their "
                                              "simulated time goes (attention, GEMMs, ...)")
    shares.add_argument("--csv", default=None, help="reference CSV (default: bundled)")
    shares.add_argument("--json", action="store_true", help="print one JSON object")
    _add_jobs(shares)
    col = sub.add_parser("collectives",
                         help="score the collective model on published nccl-tests points")
    col.add_argument("--csv", default=None, help="points CSV (default: the bundled table)")
    col.add_argument("--systems", default=None,
                     help="system -> topology JSON (default: the bundled mapping)")
    col.add_argument("--json", action="store_true", help="print one JSON object")
    moe = sub.add_parser("moe-layer",
                         help="simulate Megatron-LM's single-MoE-layer benchmark; print errors")
    moe.add_argument("--csv", default=None, help="cases CSV (default: the bundled table)")
    moe.add_argument("--json", action="store_true", help="print one JSON object")
    guide = sub.add_parser("gemm-guide", help="price one layer's GEMMs by recipe against "
                           "Transformer Engine's GEMM profiling guide")
    guide.add_argument("--json", action="store_true", help="print one JSON list")
    return p


def _world_from_env(nproc: int | None) -> int:
    """The world size: torchrun's WORLD_SIZE when RANK is set too, else --nproc or 2."""
    env = os.environ.get("WORLD_SIZE")
    if env is not None and "RANK" in os.environ:
        # torchrun's own value, but still text from the environment: int() of "x" would
        # be an exit-1 ValueError
        world = decimal(env.strip(), 7)
        if world is None or world < 1:
            raise ValidationError("WORLD_SIZE", env, "an integer >= 1 (set by torchrun)")
        if nproc is not None and nproc != world:
            raise ValidationError("--nproc", nproc, f"WORLD_SIZE ({env}) under torchrun")
        return world
    return nproc or 2


def _run(args: argparse.Namespace) -> int:
    from .config import build_run
    from .runner import launch

    world = _world_from_env(args.nproc)
    specs = [build_run(plan, args.dims, args.backend, world, args.dtype) for plan in args.plan]
    outputs = _run_outputs(args, [spec.plan.name for spec in specs])
    launch(specs, args.steps, args.warmup, outputs, args.profile, args.threads)
    if int(os.environ.get("RANK", "0")) == 0:
        for spec, out in zip(specs, outputs):
            print(f"wrote {out}: plan {spec.plan.name}, {spec.nproc} x {spec.backend}, "
                  f"{args.steps} steps ({spec.dtype})")
    return 0


def _run_outputs(args: argparse.Namespace, names: list[str]) -> list[str]:
    """One output path per plan: -o itself, or <folder>/<plan name>.parquet for several;
    none of them may be one of the plan files (the trace would replace its own plan)."""
    outputs = _output_paths(args, names)
    plans = {os.path.realpath(p) for p in args.plan if os.path.isfile(p)}
    for out in outputs:
        if os.path.realpath(out) in plans:
            raise ValidationError("-o", out, "a path that is not one of the --plan files "
                                  "(the measured trace would replace its plan)")
    return outputs


def _output_paths(args: argparse.Namespace, names: list[str]) -> list[str]:
    """-o for one plan; <folder>/<plan name>.parquet for several (the folder made)."""
    if len(names) == 1:
        return [args.output]
    if args.profile:
        raise ValidationError("--profile", "with several --plan", "one --plan per profiled run")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValidationError("--plan", repeated[0], "plans with distinct names")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise ValidationError("-o", args.output, "a folder when several --plan are given")
    os.makedirs(args.output, exist_ok=True)
    return [os.path.join(args.output, f"{name}.parquet") for name in names]


def _calibrate(args: argparse.Namespace) -> int:
    from .calibrate import run_calibration

    result = run_calibration(args.backend, _world_from_env(args.nproc), args.output,
                             threads=args.threads, quick=args.quick)
    if result is not None:
        print(result)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare_main

    return compare_main(args.measured, args.topo, args.json)


def _references(args: argparse.Namespace) -> int:
    if args.row is not None:
        from .reference_detail import row_main

        return row_main(args.csv, args.row, args.json)
    from .references import references_main

    return references_main(args.csv, args.json, args.jobs, not args.no_write_residuals)


def _op_shares(args: argparse.Namespace) -> int:
    from .op_shares import op_shares_main

    return op_shares_main(args.csv, args.json, args.jobs)


def _collectives(args: argparse.Namespace) -> int:
    from .collective_scoring import collectives_main

    return collectives_main(args.csv, args.systems, args.json)


def _moe_layer(args: argparse.Namespace) -> int:
    from .moe_layer import moe_layer_main

    return moe_layer_main(args.csv, args.json)


def _gemm_guide(args: argparse.Namespace) -> int:
    from .gemm_guide import gemm_guide_main

    return gemm_guide_main(args.json)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        handler = {"run": _run, "calibrate": _calibrate, "compare": _compare,
                   "references": _references, "op-shares": _op_shares,
                   "collectives": _collectives, "moe-layer": _moe_layer,
                   "gemm-guide": _gemm_guide}[args.command]
        if args.command == "calibrate" or (args.command == "run" and len(args.plan) == 1):
            output_kind(args.output, "-o")   # before minutes of training or benchmarks
        return handler(args)
    except BAD_INPUT as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except WriteError as exc:   # a full disk: one line, the simulator's exit status for it
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # internal error: one line, exit 1 (VALIDATION_DEBUG=1: traceback)
        if os.environ.get("VALIDATION_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
