"""Benchmark: the search for Llama 3 70B on dgx-h100x4 (32 H100s), one core.

    python benchmarks/search_70b.py [--global-batch 32] [--seq-len 8192] [--validate]

Prints the wall time of every stage, the counts, the top 5 by full simulation with the
reduced-simulation estimate's error on each, and (--validate) the bilinear estimate's
error on a few more candidates against full simulations. Target: < 2 minutes.
Not a timed test: numbers depend on the machine.
"""
from __future__ import annotations

import argparse
import time

import topologies
from simulator import simulate
from simulator.search import Search, candidate_plan
from workloads import load_model


def main() -> None:
    """Run the search and print its timings and ranking."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--topo", default="dgx-h100x4")
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--validate", action="store_true",
                    help="also compare estimates with full simulations beyond the top 5")
    args = ap.parse_args()
    topo = topologies.build(args.topo)
    model = load_model(args.model)
    search = Search(model, args.model, topo, args.topo, args.global_batch, args.seq_len)
    t0 = time.perf_counter()
    plans, dropped, folded, raw = search.feasible()
    t_feasible = time.perf_counter() - t0
    search = Search(model, args.model, topo, args.topo, args.global_batch, args.seq_len)
    t0 = time.perf_counter()
    result = search.run()
    total = time.perf_counter() - t0
    print(f"{args.model} on {args.topo}, global batch {args.global_batch} x seq {args.seq_len}")
    print(f"{'stage':<34}{'value':>14}")
    print(f"{'points / candidates / feasible':<34}"
          f"{raw:>6,} / {sum(dropped.values()) + len(plans):,} / {len(plans):,}")
    print(f"{'enumerate + feasibility (s)':<34}{t_feasible:>14.1f}")
    for key in ("contexts_scanned", "contexts_pruned_by_bound", "contexts_descended", "screened",
                "estimated", "reduced_simulations", "full_simulations"):
        print(f"{key:<34}{result.counts.get(key, 0):>14,}")
    print(f"{'total search wall time (s)':<34}{total:>14.1f}")
    print(f"\n{'rank':<5}{'candidate':<46}{'full step (s)':>14}{'estimate (s)':>14}{'error':>9}")
    for i, r in enumerate(result.top):
        err = (r.estimate_s - r.step_time_s) / r.step_time_s
        print(f"{i + 1:<5}{r.candidate.label():<46}{r.step_time_s:>14.4f}"
              f"{r.estimate_s:>14.4f}{100 * err:>8.2f}%")
    if args.validate:
        print("\nestimate vs full simulation, screened candidates beyond the finalists:")
        pool = sorted(search.plans, key=lambda c: c.key)[::max(1, len(search.plans) // 6)][:6]
        for c in pool:
            est = search.estimator.estimate_s(search.plans[c], c.key)
            t = time.perf_counter()
            full = simulate(candidate_plan(c, args.model, args.topo), topo).summary["step_time_s"]
            print(f"     {c.label():<46}{full:>14.4f}{est:>14.4f}"
                  f"{100 * (est - full) / full:>8.2f}%  ({time.perf_counter() - t:.1f} s full)")


if __name__ == "__main__":
    main()
