"""The M vs N crossover of the adaptive-sharding study ("Adaptive Sharding:
Sequence-Parallel vs Column-Parallel"): bytes one GPU reads for a linear [K, N] under
column- and sequence-parallel sharding, against M/N (M tokens per DP rank), with the
crossover at M = N.

Closed form (the study's): col reads M*K + K*N/T elements (the whole activation, a 1/T
slice of the weight), seq reads M*K/T + K*N (a 1/T slice of the activation, the whole
weight); they are equal at M = N. Alongside, the simulator's own numbers for the same
GEMM: the HBM bytes and the roofline kernel time of the forward GEMM task the lowering
emits (workloads.layer_graph.LayerGraph.linear_cost, simulator.compute.compute_time_s);
those bytes also count the output write, which the closed form leaves out, so their
crossover can sit slightly off M = N.
"""
from __future__ import annotations

import argparse

import topologies
from workloads.layer_builder import LayerShape
from workloads.layer_graph import LayerGraph
from workloads.program import COMPUTE, GEMM, Task
from inputs import strict_int

from ..compute import compute_time_s
from ..errors import UsageError
from ..output import print_json

NAME = "mn-crossover"
HELP = "adaptive-sharding study: bytes read per GPU for one linear, col vs seq, against M/N"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    p.add_argument("--k", type=strict_int, default=4096, help="input features K (default 4096)")
    p.add_argument("--n", type=strict_int, default=4096, help="output features N (default 4096)")
    p.add_argument("--tp", type=strict_int, default=8, help="TP degree T (default 8)")
    p.add_argument("--topo", default="dgx-h100", help="device for the kernel times")


def closed_form_bytes(m: int, k: int, n: int, t: int, bytes_per: int = 2) -> tuple[float, float]:
    """The closed-form bytes read per GPU: (col, seq)."""
    return (m * k + k * n / t) * bytes_per, (m * k / t + k * n) * bytes_per


def simulated(m: int, k: int, n: int, t: int, device) -> dict[str, float]:
    """The lowering's forward GEMM of each strategy: HBM bytes and kernel time."""
    shape = LayerShape(tokens=m, seq_len=m, tp=t, heads=t, kv_heads=t, head_dim=1,
                       act_bytes=2, gemm_bytes=2)
    out = {}
    for strategy, layout in (("col", "R"), ("seq", "S")):
        g = LayerGraph(shape)
        node = g.linear("w", g.input(layout, k), strategy, n)
        flops, nbytes, mnk = g.linear_cost(node)
        task = Task(id=0, kind=COMPUTE, stream="compute", op="w", phase="forward", layer=0,
                    microbatch=0, flops=flops, bytes=nbytes, op_class=GEMM, gemm_mnk=mnk)
        out[f"{strategy}_hbm_bytes"] = nbytes
        out[f"{strategy}_kernel_s"] = compute_time_s(task, device, "bf16")
    return out


def sweep(k: int, n: int, t: int, device) -> list[dict[str, float]]:
    """M from N/16 to 16 N (powers of two around M = N)."""
    rows = []
    for e in range(-4, 5):
        m = max(t, int(round(n * 2.0 ** e / t)) * t)
        col, seq = closed_form_bytes(m, k, n, t)
        rows.append({"m": m, "m_over_n": m / n, "col_read_bytes": col, "seq_read_bytes": seq,
                     "cheaper": "seq" if seq < col else "col" if col < seq else "equal",
                     **simulated(m, k, n, t, device)})
    return rows


def plot(rows, k: int, n: int, t: int, path: str) -> None:
    """Bytes read (and kernel time) against M/N, log-log, the crossover marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure
    x = [r["m_over_n"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.loglog(x, [r["col_read_bytes"] / 1e6 for r in rows], "o-", label="col: MK + KN/T")
    a.loglog(x, [r["seq_read_bytes"] / 1e6 for r in rows], "s-", label="seq: MK/T + KN")
    a.axvline(1.0, color="grey", ls="--", label="M = N")
    a.set_xlabel("M / N")
    a.set_ylabel("bytes read per GPU (MB)")
    a.set_title(f"K = {k}, N = {n}, T = {t}")
    a.legend()
    b.loglog(x, [r["col_kernel_s"] * 1e6 for r in rows], "o-", label="col (simulated)")
    b.loglog(x, [r["seq_kernel_s"] * 1e6 for r in rows], "s-", label="seq (simulated)")
    b.axvline(1.0, color="grey", ls="--")
    b.set_xlabel("M / N")
    b.set_ylabel("forward GEMM time (us)")
    b.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Print the sweep (or JSON), write the plot."""
    for flag, value in (("--k", args.k), ("--n", args.n), ("--tp", args.tp)):
        if value < 1:
            raise UsageError(flag, value, "a positive integer")
    device = topologies.build(args.topo).device(0)
    rows = sweep(args.k, args.n, args.tp, device)
    if args.json:
        print_json({"k": args.k, "n": args.n, "tp": args.tp, "crossover_m": args.n,
                    "rows": rows})
    else:
        print(f"one linear [K={args.k}, N={args.n}], T = {args.tp}; crossover at M = N = {args.n}")
        print(f"{'M':>8}{'M/N':>8}{'col read':>12}{'seq read':>12}{'cheaper':>9}"
              f"{'col kernel':>12}{'seq kernel':>12}")
        for r in rows:
            print(f"{r['m']:>8}{r['m_over_n']:>8.3f}{r['col_read_bytes'] / 1e6:>9.1f} MB"
                  f"{r['seq_read_bytes'] / 1e6:>9.1f} MB{r['cheaper']:>9}"
                  f"{r['col_kernel_s'] * 1e6:>9.1f} us{r['seq_kernel_s'] * 1e6:>9.1f} us")
        print("read = the closed form (M K + K N / T vs M K / T + K N); kernel = the "
              "simulator's roofline of the lowered forward GEMM")
    if args.plot:
        plot(rows, args.k, args.n, args.tp, args.plot)
    return 0
