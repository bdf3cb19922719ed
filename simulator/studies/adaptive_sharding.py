"""The adaptive-sharding study ("Adaptive Sharding: Sequence-Parallel vs Column-Parallel",
an auto-sharding solver with an NCCL cost model): per-projection strategies for Llama 3 8B
and 70B at batch 2 x seq 8192 on a (DP, TP = 8) mesh of DGX H100 nodes, chosen by the
search, next to the study's published table.

Setting (the study: "batch_size=2, seqlen=8192, giving M = 16,384 tokens per DP rank"):
micro-batch 2, one micro-batch per DP rank, TP 8 inside each node, FSDP across nodes,
sequence parallelism on (the study's residual add "expects S(0)S(1)", i.e. a
sequence-sharded residual), no recompute. Default topology dgx-h100x4 (DP 4 over
InfiniBand), so the P(sum)P(sum) weight-gradient reductions of `seq` cross the network
as they would in the study's multi-node jobs; `--topo dgx-h100` gives DP 1.

The study names its strategies from the weight's point of view; this maps them to the
lowering's names explicitly:
  "Col-par" for wq/wk/wv, w1/w3 -> col (weight split on the output dim, input replicated)
  "Row-par (TP)" for w2          -> row (weight split on the input dim, partial output)
  "Col-par" for wo and w2 (70B)  -> row: the study says col-par wo produces S(0)P(sum),
      "requiring a costly all-reduce before the add", which is a partial-sum output,
      i.e. Megatron's row-parallel wo ("converges to standard Megatron-style TP")
  "Seq-par" for wo                -> seq (activation sequence-sharded, weight gathered)
In the JSON output, "published" is the study's published choice.
"""
from __future__ import annotations

import argparse
from typing import Any

import topologies
from workloads import load_model, plan_from_dict

from ..api import simulate
from ..errors import UsageError
from ..output import print_json, write_text_atomic
from ..search import Search, SearchSpace

NAME = "adaptive-sharding"
HELP = ("the adaptive-sharding study: per-projection col/seq/row choices for Llama 3 8B "
        "and 70B (TP 8)")
ROWS = (("wq", ("wq",)), ("wk, wv", ("wk", "wv")), ("wo", ("wo",)), ("w1, w3", ("w1", "w3")),
        ("w2", ("w2",)))
PUBLISHED = {
    "llama3-8b": {"wq": "col", "wk": "col", "wv": "col", "wo": "seq", "w1": "col", "w3": "col",
                  "w2": "row"},
    "llama3-70b": {"wq": "col", "wk": "col", "wv": "col", "wo": "row", "w1": "col", "w3": "col",
                   "w2": "row"},
}
PUBLISHED_WORDS = {
    "llama3-8b": {"wq": "Col-par", "wk, wv": "Col-par", "wo": "Seq-par", "w1, w3": "Col-par",
                  "w2": "Row-par (TP)"},
    "llama3-70b": {"wq": "Col-par", "wk, wv": "Col-par", "wo": "Col-par", "w1, w3": "Col-par",
                   "w2": "Row-par (TP)"},
}
MAPPING_NOTE = ("the study's names mapped to ours: Col-par -> col for wq/wk/wv/w1/w3; "
                "Col-par for wo (70B) -> row, since the study says it yields S(0)P(sum) "
                "(Megatron's row-parallel wo); Row-par -> row; Seq-par -> seq")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    p.add_argument("--topo", default="dgx-h100x4", help="DGX H100 nodes (default dgx-h100x4)")
    p.add_argument("--models", default="llama3-8b,llama3-70b", help="models to study")
    p.add_argument("--strategies", default="col,row,seq",
                   help="strategies the search may pick per projection (default col,row,seq)")


def _plan(model: str, topo: str, dp: int, strategies: dict[str, str]) -> dict[str, Any]:
    return {"name": f"{model}-tp8", "model": model, "topology": topo,
            "training": {"global_batch": 2 * dp, "micro_batch": 2, "seq_len": 8192},
            "mesh": {"dp": dp, "tp": 8, "pp": 1, "cp": 1},
            "fsdp": {"enabled": dp > 1, "reshard_after_forward": True},
            "sharding": {**strategies, "sequence_parallel": True}, "recompute": "none"}


def study_model(model_name: str, topo_ref: str, strategies: tuple[str, ...]) -> dict[str, Any]:
    """Search the per-projection strategies of one model; simulate the study's choice too."""
    topology = topologies.build(topo_ref)
    if topology.world_size % 8:
        raise UsageError("--topo", topo_ref, "a topology of 8-GPU nodes (TP = 8)")
    dp = topology.world_size // 8
    model = load_model(model_name)
    space = SearchSpace(tp=(8,), pp=(1,), micro_batch=(2,), recompute=("none",),
                        fsdp=(dp > 1,), sequence_parallel=(True,), strategies=strategies,
                        granularity="projection")
    # The study compares speed, not memory: no budget (the output says whether each fits).
    result = Search(model, model_name, topology, topo_ref, 2 * dp, 8192, space=space,
                    budget_bytes=float("inf"), top_k=3).run()
    if result.best is None:   # e.g. a MoE model: the search does not place experts
        reason = max(result.dropped, key=result.dropped.get, default="none")
        raise UsageError("--models", model_name, "a model with a plan at TP 8 on "
                         f"{topo_ref} (every candidate was dropped; most for {reason})")
    chosen = result.best.candidate.strategies
    published = PUBLISHED.get(model_name)
    published_s = published_fits = None
    if published is not None:
        summary = simulate(plan_from_dict(_plan(model_name, topo_ref, dp, published)),
                           topology).summary
        published_s, published_fits = summary["step_time_s"], summary["fits_in_memory"]
    return {"chosen": chosen, "published": published, "chosen_step_time_s": result.best.step_time_s,
            "published_step_time_s": published_s, "tokens_per_dp_rank": 2 * 8192,
            "chosen_fits_in_memory": result.best.summary["fits_in_memory"],
            "chosen_peak_memory_bytes": result.best.summary["peak_memory_bytes"],
            "published_fits_in_memory": published_fits,
            "mesh": {"dp": dp, "tp": 8}, "topology": topology.name,
            "runner_up": [{"strategies": r.candidate.strategies, "step_time_s": r.step_time_s}
                          for r in result.top[1:]],
            "search_counts": result.counts}


def render(out: dict[str, Any]) -> str:
    """Per model: the study's table and ours side by side, with M/N and step times."""
    lines = []
    for name, r in out.items():
        model = load_model(name)
        shapes = model.projection_shapes()
        m = r["tokens_per_dp_rank"]
        lines.append(f"{name} on {r['topology']} (dp {r['mesh']['dp']} x tp 8), micro-batch 2 x "
                     f"seq 8192: M = {m:,} tokens per DP rank")
        lines.append(f"  {'layer':<8}{'N':>8}{'M/N':>7}  {'study':<14}{'(our names)':<13}"
                     f"{'chosen':<8}")
        for label, projs in ROWS:
            n = shapes[projs[0]][1]
            words = PUBLISHED_WORDS.get(name, {}).get(label, "-")
            published = (r["published"] or {}).get(projs[0], "-")
            chosen = r["chosen"][projs[0]]
            if any(r["chosen"][p] != chosen for p in projs):
                chosen = "/".join(r["chosen"][p] for p in projs)
            mark = "" if published == chosen else "  <- differs"
            lines.append(f"  {label:<8}{n:>8,}{m / n:>7.2f}  {words:<14}{published:<13}{chosen:<8}{mark}")
        same = r["published"] == r["chosen"]
        if r["published_step_time_s"] is None:
            lines.append(f"  step time: chosen {r['chosen_step_time_s']:.4f} s (the study "
                         "published no choice for this model)")
        else:
            lines.append(f"  step time: chosen {r['chosen_step_time_s']:.4f} s, the study's choice "
                         f"{r['published_step_time_s']:.4f} s" + (" (same plan)" if same else
                         f" ({100 * (r['published_step_time_s'] / r['chosen_step_time_s'] - 1):+.2f}"
                         " % for the study's)"))
        if not r["chosen_fits_in_memory"]:
            lines.append(f"  note: at this batch the plan needs "
                         f"{r['chosen_peak_memory_bytes'] / 1e9:.0f} GB per GPU, more than an "
                         "H100 holds (the study compares speed only)")
        lines.append("")
    lines.append(MAPPING_NOTE)
    return "\n".join(lines)


def plot(out: dict[str, Any], path: str) -> None:
    """Bars: step time of the chosen plan and of the study's, per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure
    names = list(out)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [out[n]["published_step_time_s"] or 0.0 for n in names], 0.4,
           label="the study's choice")
    ax.bar([x + 0.2 for x in xs], [out[n]["chosen_step_time_s"] for n in names], 0.4,
           label="search's choice")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("simulated step time (s)")
    ax.set_title("Adaptive sharding, TP 8, batch 2 x 8192")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run the study for each model; print the table or JSON; write the plot."""
    from workloads.plan import STRATEGIES
    strategies = tuple(s.strip() for s in args.strategies.split(","))
    if not strategies or any(s not in STRATEGIES for s in strategies):
        raise UsageError("--strategies", args.strategies, ", ".join(STRATEGIES))
    out = {name: study_model(name, args.topo, strategies)
           for name in (n.strip() for n in args.models.split(","))}
    if args.json:
        print_json(out)
    else:
        print(render(out))
    if args.plot:
        plot(out, args.plot)
    return 0


__all__ = ["NAME", "HELP", "PUBLISHED", "add_arguments", "run", "study_model", "write_text_atomic"]
