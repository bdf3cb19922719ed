"""Mixture-of-experts layers with expert parallelism (EP).

An MoE layer replaces the dense MLP by (Shazeer et al. 2017; Fedus et al. 2021, Switch
Transformer arXiv:2101.03961; Megatron-LM's MoE with the all-to-all token dispatcher):

1. router: logits = h W_router (d x E GEMM on the rank's tokens), softmax and top-k;
2. dispatch: an all-to-all over the EP group sends each token's k copies to the ranks that
   hold its experts;
3. experts: each rank runs its E / ep experts as a grouped GEMM. A rank receives on average
   tokens x top_k rows (tokens x top_k / E per expert x E / ep experts x ep senders); the
   plan's `moe.load_imbalance` factor f (hottest rank's rows / mean, default 1) scales the
   rows, so the critical rank computes tokens x top_k x f rows;
4. combine: the reverse all-to-all, then each token's k outputs are summed with their
   router weights; shared experts (DeepSeek-V3) run as a dense MLP on every token and are
   added before the one TP reduction.

Sizes (nccl-tests all-to-all size, the per-rank send buffer): dispatch and combine move
tokens x top_k x f x d x 2 bytes each, in forward and again in backward (their gradients).
With TP the experts are split like the dense MLP (expert TP = TP, Megatron-LM's default):
tokens are all-gathered over TP under sequence parallelism before the dispatch, and the
expert outputs (partial over TP) are reduced once after the combine.

EP is a sub-dimension of dp: the ranks with dp indices in one block of ep consecutive
values form an EP group (the mesh's virtual dim "ep", workloads/mesh.py). Expert weights
are replicated over the other dp x cp / ep ranks ("edp" x "cp"), where their gradients
are reduced.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .layouts import P, R, S

if TYPE_CHECKING:  # pragma: no cover
    from .layer_graph import LayerGraph, Node
    from .plan import Plan


def expert_rows_scale(plan: "Plan") -> float:
    """Rows an EP rank's experts process per local token: top_k x load imbalance."""
    return plan.model.experts_per_token * plan.load_imbalance


def build_moe_mlp(g: "LayerGraph", plan: "Plan", layer: int, h: "Node", resid: str) -> "Node":
    """The MoE MLP on the normed input `h`; returns its output in the residual layout."""
    m, st, tp = plan.model, plan.strategies(layer), plan.mesh.tp
    router_strategy = "seq" if (h.layout == S and tp > 1) else "replicate"
    logits = g.linear("router", h, router_strategy, m.num_experts)
    gate = g.elementwise("topk", [logits], rw=(1.0, 1.0))
    scale = expert_rows_scale(plan)
    dispatched = g.ep_all_to_all("dispatch", g.to_layout(h, R), scale)
    local_experts = m.num_experts // plan.mesh.ep
    a = g.linear("w1", dispatched, st["w1"], m.moe_ffn_size, experts=local_experts)
    if m.mlp == "swiglu":
        b = g.linear("w3", dispatched, st["w3"], m.moe_ffn_size, experts=local_experts)
        act = g.elementwise("swiglu", [a, b], layout=_nonpartial(a.layout), rw=(2.0, 1.0))
    else:
        act = g.elementwise("gelu", [a], layout=_nonpartial(a.layout))
    y = g.linear("w2", act, st["w2"], m.hidden_size, experts=local_experts)
    combined = g.ep_all_to_all("combine", y, scale)
    partial = P if tp > 1 and combined.layout == P else combined.layout
    parts = [combined]
    if m.num_shared_experts:
        width = m.num_shared_experts * m.moe_ffn_size
        sa = g.linear("shared_w1", h, st["w1"], width)
        if m.mlp == "swiglu":
            sb = g.linear("shared_w3", h, st["w3"], width)
            sact = g.elementwise("shared_swiglu", [sa, sb], layout=_nonpartial(sa.layout),
                                 rw=(2.0, 1.0))
        else:
            sact = g.elementwise("shared_gelu", [sa], layout=_nonpartial(sa.layout))
        shared = g.linear("shared_w2", sact, st["w2"], m.hidden_size)
        parts.append(g.to_layout(shared, partial) if shared.layout != partial else shared)
    # Weighted sum of each token's k expert outputs (+ the shared experts'), on the partial
    # sums when the experts are TP-split: read k + shared rows, write one.
    out = g.elementwise("moe_combine", parts, layout=partial,
                        rw=(m.experts_per_token + len(parts) - 1, 1.0), rows_scale=1.0)
    # The router weights enter the weighted sum too (their gradient flows back to the
    # router); added after the layout step, since a gate is never a partial sum.
    out.inputs.append(gate)
    return g.to_layout(out, resid)


def _nonpartial(layout: str) -> str:
    return "H" if layout == P else layout


def moe_param_groups(plan: "Plan", layer: int, dp_dims: tuple[str, ...]) -> dict:
    """Parameters one rank holds for an MoE layer's MLP, by gradient-reduction dims.

    Router: replicated over TP; its gradient reduces over TP too when it runs on the
    sequence-sharded tokens (sequence parallelism). Shared experts: TP-split like the
    dense MLP. Routed experts: E / ep experts, TP-split; gradients reduce over the
    expert-data-parallel ranks ("edp", x "cp"): dp x cp / ep of them.
    """
    m, tp, st = plan.model, plan.mesh.tp, plan.strategies(layer)
    both = dp_dims + ("tp",) if tp > 1 else dp_dims
    expert_dims = ("edp", "cp") if plan.mesh.cp > 1 else ("edp",)
    groups: dict[tuple[str, ...], float] = {}

    def add(dims, params):
        groups[dims] = groups.get(dims, 0.0) + params

    add(both if (plan.sequence_parallel and tp > 1) else dp_dims, m.hidden_size * m.num_experts)
    for name in m.mlp_matrices:
        strategy = st[name]
        split = tp if strategy in ("col", "row") else 1
        shared = m.num_shared_experts * m.hidden_size * m.moe_ffn_size / split
        routed = m.num_experts // plan.mesh.ep * m.hidden_size * m.moe_ffn_size / split
        add(both if strategy == "seq" else dp_dims, shared)
        add(expert_dims + ("tp",) if strategy == "seq" and tp > 1 else expert_dims, routed)
    return {k: v for k, v in groups.items() if v}
