"""Under a per-GPU memory budget, 1D or 3D tensor parallelism? The question the 3D
tensor-parallel designs raise (Bian et al. 2021, "Maximizing Parallelism in Distributed
Training for Huge Neural Networks", arXiv:2105.14450, as implemented in Colossal-AI): 3D
shrinks the activations a GPU stores at the price of more, smaller collectives, so the
fastest layout that fits depends on the budget.

Every GPU of the topology (N = q^3 of them) is in the TP group; one micro-batch per step
(no data parallelism, no pipeline). Each layout is a real plan, lowered by workloads and
simulated by the engine; memory is workloads.memory's peak of the same plan:
  * 1d             Megatron-LM col/row (Shoeybi et al. 2019): two all-reduces of the
                   activation per layer forward, two backward; norm and residual
                   activations whole on every GPU.
  * 1d_sp          the same with sequence parallelism (Korthikanti et al. 2022): the
                   all-reduces become reduce-scatter + all-gather and the norm/residual
                   activations are split over N.
  * tp3d_gather    3D design 1: all-gather the input, reduce-scatter the output; every
                   stored activation is 1/N of the original (workloads/tp_grid.py).
  * tp3d_allreduce 3D design 2: all-reduce the output; activations 1/N^(2/3).
The two 3D designs split the micro-batch over their token axes (q^2 and q ways), so the
default micro-batch is q^2, which every layout accepts.

Per-block mixing (attention in 3D, MLP in 1D), which the designs' authors suggest for a
budgeted search, is not expressible: a plan uses one grid strategy for every projection
of every layer (workloads/plan_checks.py check_grid), because the grid's activation
layout (tokens split over the token axes, features over the feature axis) differs from
1D's and the lowering has no re-layout between blocks. So the study compares whole-layer
layouts.
"""
from __future__ import annotations

import argparse

import topologies
from inputs import InputError, strict_int
from workloads import load_model, plan_from_dict, resolve
from workloads.memory import peak_memory
from workloads.plan import PROJECTIONS

from ..api import simulate
from ..errors import UsageError
from ..output import print_json

NAME = "3d-budget"
HELP = ("3D tensor-parallel designs (Bian et al. 2021): 1D or 3D TP under a per-GPU "
        "memory budget, simulated")
# layout -> (strategy of every projection, sequence parallelism, block layout name)
LAYOUTS = {
    "1d": ("megatron", False, "1d"),
    "1d_sp": ("megatron", True, "1d"),
    "tp3d_gather": ("tp3d_gather", False, "3d"),
    "tp3d_allreduce": ("tp3d_allreduce", False, "3d"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    p.add_argument("--topo", default="dgx-h100", help="topology; its GPU count must be a cube")
    p.add_argument("--model", default="llama3-8b", help="model preset or JSON")
    p.add_argument("--seq-len", type=strict_int, default=8192)
    p.add_argument("--micro-batch", type=strict_int, default=None,
                   help="sequences per step (default q^2 for N = q^3 GPUs, the smallest "
                        "the 3D layouts accept)")
    # selective_op is modelled for 1D only (plan_checks.check_grid), so it is not offered
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation checkpointing of every layout")
    p.add_argument("--budget", type=float, metavar="GB",
                   help="memory budget per GPU (default: the GPU's capacity)")


def plan_dict(layout: str, model: str, gpus: int, micro_batch: int, seq_len: int,
              recompute: str) -> dict:
    """The plan file object of one layout: all GPUs in TP, one micro-batch per step."""
    strategy, sp, _ = LAYOUTS[layout]
    sharding = {} if strategy == "megatron" else {p: strategy for p in PROJECTIONS}
    return {"name": f"{layout}-tp{gpus}", "model": model,
            "training": {"global_batch": micro_batch, "micro_batch": micro_batch,
                         "seq_len": seq_len},
            "mesh": {"dp": 1, "tp": gpus}, "sharding": {**sharding, "sequence_parallel": sp},
            "recompute": recompute}


def choice(layout: str, raw: dict, topology) -> dict:
    """Simulate one layout; a plan the model or topology rejects is an invalid row."""
    block = LAYOUTS[layout][2]
    row = {"layout": layout, "attention": block, "mlp": block, "plan": raw}
    try:
        plan = plan_from_dict(raw)
        summary = simulate(plan, topology).summary
        mem = peak_memory(resolve(plan, topology.world_size))
    except InputError as exc:   # e.g. TP does not divide the heads: the row says why
        return {**row, "status": "invalid", "error": str(exc)}
    return {**row, "status": "ok", "error": None, "step_time_s": summary["step_time_s"],
            "compute_s": summary["compute_s"], "comm_s": summary["comm_s"],
            "exposed_comm_s": summary["exposed_comm_s"],
            "activation_bytes": mem.activations_bytes,
            "states_bytes": mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes,
            "memory_bytes": mem.peak_bytes}


def choices(model: str, topology, micro_batch: int, seq_len: int,
            recompute: str = "none") -> list[dict]:
    """Every layout, simulated (LAYOUTS order)."""
    n = topology.world_size
    return [choice(layout, plan_dict(layout, model, n, micro_batch, seq_len, recompute),
                   topology) for layout in LAYOUTS]


def pick(rows: list[dict], budget_bytes: float) -> dict | None:
    """The fastest simulated layout whose peak memory fits (ties: LAYOUTS order)."""
    fits = [(r["step_time_s"], i, r) for i, r in enumerate(rows)
            if r["status"] == "ok" and r["memory_bytes"] <= budget_bytes]
    return min(fits, key=lambda t: t[:2])[2] if fits else None


def frontier(rows: list[dict]) -> list[dict]:
    """The smallest budgets at which the pick changes (each a layout's peak), ascending."""
    out: list[dict] = []
    for budget in sorted({r["memory_bytes"] for r in rows if r["status"] == "ok"}):
        layout = pick(rows, budget)["layout"]
        if not out or out[-1]["choice"] != layout:
            out.append({"budget_bytes": budget, "choice": layout})
    return out


def plot(rows: list[dict], budget_bytes: float, path: str, title: str) -> None:
    """Step time against peak memory of each layout; the budget as a vertical line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in (r for r in rows if r["status"] == "ok"):
        ax.scatter(r["memory_bytes"] / 1e9, r["step_time_s"] * 1e3, s=60)
        ax.annotate(r["layout"], (r["memory_bytes"] / 1e9, r["step_time_s"] * 1e3),
                    fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.axvline(budget_bytes / 1e9, color="#c44e52", lw=0.8, label="budget")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("simulated step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _render(out: dict) -> str:
    lines = [f"{out['model']} on {out['topology']}: {out['gpus']} GPUs = "
             f"{round(out['gpus'] ** (1 / 3))}^3 in one TP group, {out['micro_batch']} x "
             f"{out['seq_len']} tokens per step; every layout lowered and simulated",
             f"{'layout':>15}{'step':>10}{'comm':>10}{'exp.comm':>10}{'activations':>13}"
             f"{'memory':>10}  fits {out['budget_bytes'] / 1e9:.0f} GB"]
    for r in out["choices"]:
        if r["status"] != "ok":
            lines.append(f"{r['layout']:>15}  {r['status']}: {r['error']}")
            continue
        lines.append(f"{r['layout']:>15}{r['step_time_s'] * 1e3:>8.1f}ms"
                     f"{r['comm_s'] * 1e3:>8.1f}ms{r['exposed_comm_s'] * 1e3:>8.1f}ms"
                     f"{r['activation_bytes'] / 1e9:>10.1f} GB{r['memory_bytes'] / 1e9:>7.1f} GB"
                     f"  {'yes' if r['memory_bytes'] <= out['budget_bytes'] else 'no'}")
    best = out["chosen"]
    lines.append("chosen: " + (best["layout"] if best else "nothing fits"))
    lines.append("fastest per budget: " + ", ".join(
        f">= {f['budget_bytes'] / 1e9:.1f} GB: {f['choice']}" for f in out["frontier"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Simulate every layout, pick the fastest under the budget; print (or JSON), plot."""
    topology = topologies.build(args.topo)
    n = topology.world_size
    q = round(n ** (1 / 3))
    if q ** 3 != n:
        raise UsageError("--topo", args.topo, f"a topology with a cube number of GPUs (has {n})")
    micro_batch = q * q if args.micro_batch is None else args.micro_batch
    # tokens per step stay exact in the table's float columns (2^53)
    if not (1 <= args.seq_len and 1 <= micro_batch and args.seq_len * micro_batch < 1 << 40):
        raise UsageError("--seq-len/--micro-batch", (args.seq_len, micro_batch),
                         "positive integers whose product is below 2^40 tokens")
    if args.budget is not None and not args.budget > 0:
        raise UsageError("--budget", args.budget, "a positive number of GB")
    model = load_model(args.model)
    budget = args.budget * 1e9 if args.budget else min(d.hbm_bytes for d in topology.devices)
    rows = choices(args.model, topology, micro_batch, args.seq_len, args.recompute)
    out = {"model": model.name, "topology": topology.name, "gpus": n,
           "micro_batch": micro_batch, "seq_len": args.seq_len, "recompute": args.recompute,
           "budget_bytes": budget, "choices": rows, "chosen": pick(rows, budget),
           "frontier": frontier(rows), "lowering": "workloads (simulated by the engine)"}
    if args.json:
        print_json(out)
    else:
        print(_render(out))
    if args.plot:
        plot(rows, budget, args.plot, f"{model.name}, {n} GPUs: 1D vs 3D tensor parallelism")
    return 0
