"""`collective`: an nccl-tests-style table of one collective on a topology."""
from __future__ import annotations

import argparse

import topologies
from inputs import strict_int

from ..network import OPS, CommOptions
from ..network.report import collective_table, group_ranks, parse_sizes
from ..network.tuning_versions import MODELLED_RELEASES, modelled
from ..errors import UsageError
from ..network import ALGORITHMS, PROTOCOLS
from .common import add_limits, print_json


def register(sub) -> None:
    """Add the `collective` subcommand."""
    p = sub.add_parser("collective", help="time one collective over a range of sizes")
    p.add_argument("--topo", required=True, help="topology preset or file")
    p.add_argument("--op", required=True, choices=OPS)
    p.add_argument("--group", required=True,
                   help="ranks: a count (32 = ranks 0..31) or a mesh expression (tp=8, dp=4)")
    p.add_argument("--sizes", default="1K:8G", help="MIN:MAX bytes, doubling (nccl-tests -f 2)")
    p.add_argument("--algorithm", choices=ALGORITHMS, help="force an algorithm")
    p.add_argument("--protocol", choices=PROTOCOLS, help="force a protocol")
    p.add_argument("--gpus-per-process", type=strict_int, default=1, metavar="N",
                   help="GPUs one process drives (nccl-tests -g N): an iteration takes at "
                        "least N host enqueues (default 1)")
    p.add_argument("--nccl-version", metavar="X.Y.Z",
                   help="NCCL release whose tuning constants price latency and the choice "
                        "(e.g. 2.18.5; default: the newest the model carries)")
    p.add_argument("--json", action="store_true",
                   help="print the rows as JSON (with algorithm, protocol, channels and the "
                        "latency / fill / bandwidth split)")
    add_limits(p, tasks=False)
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the table."""
    topo = topologies.build(args.topo, args.max_gpus)
    try:
        ranks = group_ranks(topo, args.group)
    except ValueError as exc:
        raise UsageError("--group", args.group, str(exc)) from None
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        raise UsageError("--sizes", args.sizes, str(exc)) from None
    if not 1 <= args.gpus_per_process <= 1024:
        raise UsageError("--gpus-per-process", args.gpus_per_process, "an integer 1..1024")
    if args.nccl_version is not None and not modelled(args.nccl_version):
        (low, high) = MODELLED_RELEASES
        raise UsageError("--nccl-version", args.nccl_version,
                         f"an NCCL release from {low[0]}.{low[1]} to {high[0]}.{high[1]}, like "
                         "2.26.2 (the releases whose tuning tables the model carries; "
                         "without the flag, the newest)")
    if args.op == "send_recv" and len(ranks) != 2:
        raise UsageError("--group", args.group, "two ranks (source, destination) for send_recv")
    rows = collective_table(topo, args.op, ranks, sizes,
                            CommOptions(algorithm=args.algorithm, protocol=args.protocol,
                                        gpus_per_process=args.gpus_per_process,
                                        nccl_version=args.nccl_version))
    if args.json:
        print_json(rows)
        return 0
    print(f"# {args.op} on {topo.name}, {len(ranks)} ranks ({args.group}); "
          "nccl-tests out-of-place time")
    print(f"{'size (B)':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  "
          f"{'algorithm':<14} {'protocol':<8} {'ch':>3} {'lat (us)':>9} {'fill':>8} "
          f"{'bw (us)':>10}")
    for r in rows:
        print(f"{r['size_bytes']:>14} {r['time_us']:>12.2f} {r['algbw_GBps']:>13.2f} "
              f"{r['busbw_GBps']:>13.2f}  {r['algorithm']:<14} {r['protocol']:<8} "
              f"{r['channels']:>3} {r['latency_us']:>9.2f} {r['fill_us']:>8.2f} "
              f"{r['bandwidth_us']:>10.2f}")
    return 0
