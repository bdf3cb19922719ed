"""Seed 004's question: under a per-GPU memory budget, which blocks (attention, MLP) to run
in 3D tensor parallelism instead of 1D, with the communication and memory of each choice.

The lowering has no 3D-TP layouts yet, so this study prices them in closed form (seed 004,
design 1, Bian et al. arXiv:2105.14450) with the simulator's collective model
(simulator.network.CollectiveModel(topology).time_s) for each collective:
  * N = q^3 GPUs, all in the TP group (no DP). Mesh axes j, i, l with rank strides 1, q, q^2.
  * 1D (Megatron, no sequence parallelism): per block and layer one all-reduce of the
    [M, h] activation in forward and one in backward, over N. Saved activations: the block's
    norm input and linear input whole on every GPU, the rest split over N (Korthikanti et
    al. 2022, section 4.1; flash attention, so no scores).
  * 3D: per linear [K -> Nout]: forward all-gather of the input over j (nccl-tests size
    M K / q^2), of the weight over i (K Nout / q^2), reduce-scatter of the output over l
    (M Nout / q^2); backward all-gather of the output gradient, reduce-scatter of the input
    gradient and of the weight gradient. Linears that read one input (wq/wk/wv, w1/w3)
    share its all-gather and the reduce-scatter of its gradient. Every saved activation
    is split over N (seed 004: "each activation can be 1/N of the original size").
  * Model states: 16 bytes/parameter / N in both (weights split over all N GPUs).
Times are one micro-batch through all layers, forward + backward, collectives only and not
overlapped with compute.
"""
from __future__ import annotations

import argparse
import itertools
import json

import topologies
from workloads import load_model
from workloads.memory import MODEL_STATE_BYTES_PER_PARAM

from ..network import CollectiveModel

NAME = "3d-budget"
HELP = "seed 004: which blocks to run in 3D rather than 1D TP under a memory budget"
BF16 = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    p.add_argument("--topo", default="dgx-h100", help="topology; its GPU count must be a cube")
    p.add_argument("--model", default="llama3-8b", help="model preset or JSON")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--budget", type=float, metavar="GB",
                   help="memory budget per GPU (default: the GPU's capacity)")


def _blocks(model):
    """Per block: linears (name, K, Nout, input group), saved tensors per token (bytes,
    whole-on-every-GPU under 1D?)."""
    h, q, kv, f = model.hidden_size, model.q_size, model.kv_size, model.ffn_size
    mlp_in = [("w1", h, f, "mlp_in")] + ([("w3", h, f, "mlp_in")] if model.mlp == "swiglu" else [])
    n_mlp = 4 if model.mlp == "swiglu" else 2
    return {
        "attention": ([("wq", h, q, "qkv"), ("wk", h, kv, "qkv"), ("wv", h, kv, "qkv"),
                       ("wo", q, h, "wo")],
                      [(2 * h, True), (2 * h, True), (2 * q, False), (2 * kv, False),
                       (2 * kv, False), (2 * q, False)]),
        "mlp": (mlp_in + [("w2", f, h, "w2")], [(2 * h, True), (2 * h, True)] +
                [(2 * f, False)] * n_mlp),
    }


def block_costs(model, topology, tokens: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per block and mode: collective seconds and saved-activation bytes per layer."""
    n = topology.world_size
    q = round(n ** (1 / 3))
    cm = CollectiveModel(topology)
    axis = {"j": tuple(range(0, q)), "i": tuple(range(0, q * q, q)),
            "l": tuple(range(0, q ** 3, q * q))}
    everyone = tuple(range(n))
    h = model.hidden_size
    out: dict[str, dict[str, dict[str, float]]] = {}
    for block, (linears, saved) in _blocks(model).items():
        ar = cm.time_s("all_reduce", everyone, tokens * h * BF16)
        one_d_act = sum(b * tokens / (1 if whole else n) for b, whole in saved)
        t3 = 0.0
        for group in dict.fromkeys(g for _, _, _, g in linears):
            k = next(k for _, k, _, g in linears if g == group)
            size = tokens * k / q ** 2 * BF16
            t3 += cm.time_s("all_gather", axis["j"], size)       # input, forward
            t3 += cm.time_s("reduce_scatter", axis["j"], size)   # input gradient, backward
        for _, k, nout, _ in linears:
            w, c = k * nout / q ** 2 * BF16, tokens * nout / q ** 2 * BF16
            t3 += cm.time_s("all_gather", axis["i"], w) + cm.time_s("reduce_scatter", axis["i"], w)
            t3 += cm.time_s("reduce_scatter", axis["l"], c) + cm.time_s("all_gather", axis["l"], c)
        out[block] = {"1d": {"comm_s": 2 * ar, "activation_bytes": one_d_act},
                      "3d": {"comm_s": t3, "activation_bytes": sum(b for b, _ in saved) * tokens / n}}
    return out


def choices(model, topology, tokens: int) -> list[dict]:
    """The four (attention, MLP) mode pairs with their step communication and memory."""
    costs = block_costs(model, topology, tokens)
    states = MODEL_STATE_BYTES_PER_PARAM * model.total_params() / topology.world_size
    rows = []
    for att, mlp in itertools.product(("1d", "3d"), repeat=2):
        comm = model.num_layers * (costs["attention"][att]["comm_s"] + costs["mlp"][mlp]["comm_s"])
        act = model.num_layers * (costs["attention"][att]["activation_bytes"]
                                  + costs["mlp"][mlp]["activation_bytes"])
        rows.append({"attention": att, "mlp": mlp, "comm_s": comm, "activation_bytes": act,
                     "states_bytes": states, "memory_bytes": states + act})
    return rows


def pick(rows: list[dict], budget_bytes: float) -> dict | None:
    """The least-communication choice that fits (ties: fewer 3D blocks)."""
    fits = [r for r in rows if r["memory_bytes"] <= budget_bytes]
    return min(fits, key=lambda r: (r["comm_s"], (r["attention"], r["mlp"]))) if fits else None


def plot(rows: list[dict], path: str, title: str) -> None:
    """Communication against memory of each choice; the budget frontier."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.scatter(r["memory_bytes"] / 1e9, r["comm_s"] * 1e3, s=60)
        ax.annotate(f"attn {r['attention']}, mlp {r['mlp']}",
                    (r["memory_bytes"] / 1e9, r["comm_s"] * 1e3), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("memory per GPU (GB)")
    ax.set_ylabel("TP communication per step (ms)")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Print the four choices and the pick under the budget (or JSON); write the plot."""
    from ..errors import UsageError
    topology = topologies.build(args.topo)
    n = topology.world_size
    if round(n ** (1 / 3)) ** 3 != n:
        raise UsageError("--topo", args.topo, f"a topology with a cube number of GPUs (has {n})")
    if args.seq_len < 1 or args.micro_batch < 1:
        raise UsageError("--seq-len/--micro-batch", (args.seq_len, args.micro_batch),
                         "positive integers")
    model = load_model(args.model)
    budget = args.budget * 1e9 if args.budget else min(d.hbm_bytes for d in topology.devices)
    rows = choices(model, topology, args.seq_len * args.micro_batch)
    best = pick(rows, budget)
    budgets = sorted({r["memory_bytes"] for r in rows})
    frontier = [{"budget_bytes": b, "choice": (lambda p: p and f"{p['attention']}/{p['mlp']}")(
        pick(rows, b))} for b in budgets]
    if args.json:
        print(json.dumps({"model": model.name, "topology": topology.name, "gpus": n,
                          "budget_bytes": budget, "choices": rows, "chosen": best,
                          "frontier": frontier, "lowering": "closed form (no 3D-TP lowering yet)"},
                         indent=2, sort_keys=True))
    else:
        print(f"{model.name} on {topology.name}: {n} GPUs = {round(n ** (1 / 3))}^3, "
              f"{args.micro_batch} x {args.seq_len} tokens; closed-form 3D TP (seed 004 design 1)"
              " with the simulator's collective model")
        print(f"{'attention':>10}{'mlp':>6}{'TP comm/step':>14}{'activations':>13}{'memory':>10}"
              f"  fits {budget / 1e9:.0f} GB")
        for r in rows:
            print(f"{r['attention']:>10}{r['mlp']:>6}{r['comm_s'] * 1e3:>11.1f} ms"
                  f"{r['activation_bytes'] / 1e9:>10.1f} GB{r['memory_bytes'] / 1e9:>7.1f} GB"
                  f"  {'yes' if r['memory_bytes'] <= budget else 'no'}")
        print("chosen: " + (f"attention {best['attention']}, mlp {best['mlp']}" if best
                            else "nothing fits"))
        print("least communication per budget: " + ", ".join(
            f">= {f['budget_bytes'] / 1e9:.1f} GB: {f['choice']}" for f in frontier))
    if args.plot:
        plot(rows, args.plot, f"{model.name}, {n} GPUs: 1D vs 3D TP per block")
    return 0
