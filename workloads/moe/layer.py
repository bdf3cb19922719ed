"""The MoE layer as graph events: router, dispatcher, grouped expert GEMMs, combine.

An MoE layer replaces the dense MLP (Shazeer et al. 2017; Fedus et al. 2021, Switch
Transformer arXiv:2101.03961), as Megatron-LM's MoELayer runs it (NVIDIA/Megatron-LM commit
d98e8a64, megatron/core/transformer/moe/moe_layer.py, router.py, token_dispatcher.py):

1. router: logits = x W_router (a d x E GEMM on the rank's own tokens: its sequence shard
   under sequence parallelism, which Megatron-LM requires for MoE with TP), softmax and
   top-k (router_topk: reads the logits, writes scores and the dense probabilities and
   routing map), and the load-balancing loss when the plan asks for it (router_aux_loss);
2. dispatch, experts' input in expert order, combine: the dispatcher's events
   (workloads/moe/dispatch.py: alltoall, allgather or deepep, with the permute and
   unpermute copies);
3. experts: E / ep local experts as grouped GEMMs on the hottest EP rank's rows
   (workloads/moe/imbalance.py), split over expert TP like the dense MLP when etp = tp, or
   whole on each rank when etp = 1; each at the grouped-GEMM efficiency of its rows per
   expert, in the framework's kernel launches (Transformer Engine: one GEMM per expert;
   workloads/moe/grouped_gemm.py); under FP8 / FP4, Transformer Engine's per-expert
   padding copies before and after them (workloads/moe/quant_padding.py);
4. shared experts (DeepSeek-V3) run as a dense MLP on every token and are added after the
   combine (Megatron-LM shared_experts.py: their own TP reduction).

With etp = tp, EP is a sub-dimension of dp: the ranks with dp indices in one block of ep
consecutive values form an EP group (the mesh's virtual dim "ep", workloads/mesh.py).
Expert weights are replicated over the other dp x cp / ep ranks ("edp" x "cp"); their
gradients reduce there, and ZeRO / FSDP shard and gather them over the same ranks.
With etp = 1 < tp, Megatron-Core's expert mesh re-splits a stage's tp x cp x dp ranks as
ep x edp (workloads/expert_mesh.py): an EP group runs through the TP ranks first, so EP
may be up to tp x cp x dp. At the boundary nothing is gathered: Megatron-Core's MoE layer
takes the sequence-parallel shard the attention block's reduce-scatter left
(moe_layer.py requires sequence parallelism with TP), each TP rank routes and dispatches
its own tokens over the EP group (the expert TP group has one rank, so the alltoall
dispatcher's ETP all-gather and the allgather dispatcher's gather over "tp-ep" reduce to
the EP group, token_dispatcher.py), and the combine returns them to that shard. A rank
holds E / ep whole experts; they are replicated over the expert mesh's edp ranks, where
their gradients reduce and ZeRO / FSDP shard them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..expert_epilogue import clamped_glu, expert_bias
from ..layouts import P, S
from ..framework_traits import traits
from .dispatch import Geometry, combine, dispatch
from .grouped_gemm import grouped_gemm_efficiency, grouped_gemm_launches, grouped_gemm_streams
from .imbalance import routed_tokens, rows_per_token, rows_sent
from .quant_padding import PAD_LAUNCHES, pads_expert_rows, unpad_launches
from .router_ops import aux_loss, random_logits, round_robin_gate, token_drop

if TYPE_CHECKING:  # pragma: no cover
    from ..layer_graph import LayerGraph, Node

# Every node an MoE layer's graph can hold, as the builders name them (build_moe_mlp and
# _experts here, router_ops.py, dispatch.py, workloads/expert_epilogue.py); trace labels
# are NODE.fwd / .bwd / .dgrad / .wgrad / .fp8_cast and grad.NODE for the gradient sum.
# Readers of a trace (validation's single-layer check) select the layer's tasks by it;
# tests/test_moe_layer_check.py checks that every builder's node is listed.
MOE_LAYER_NODES = frozenset({
    "router", "router_random", "router_topk", "router_token_drop", "router_aux_loss",
    "router_round_robin",
    "permute", "sort_chunks", "expert_pad", "w1", "w3", "glu_clamp", "swiglu", "gelu", "w2",
    "expert_bias", "expert_unpad", "unsort_chunks", "unpermute",
    "shared_w1", "shared_w3", "shared_swiglu", "shared_gelu", "shared_w2", "shared_add"})


def dispatch_dims(plan) -> tuple[str, ...]:
    """The mesh dims a token dispatch spans: EP, with TP when the experts are TP-sharded."""
    return ("tp", "ep") if plan.moe.etp_of(plan.mesh.tp) > 1 else ("ep",)


def geometry(g: "LayerGraph", plan, x: "Node") -> Geometry:
    """Sizes of one MoE layer on one rank for the router input `x`."""
    m, mesh, opt = plan.model, plan.mesh, plan.moe
    tokens = routed_tokens(plan)   # the router input x: the rank's sequence shard
    k, rows = m.experts_per_token, rows_per_token(plan, tokens)
    sent = rows_sent(plan, rows)
    etp = opt.etp_of(mesh.tp)
    group = dispatch_dims(plan)
    return Geometry(tokens=tokens, top_k=k, rows=rows, sent=sent, hidden=m.hidden_size,
                    num_experts=m.num_experts, act_bytes=g.shape.act_bytes, tp=mesh.tp,
                    etp=etp, ep=mesh.ep, group=group,
                    group_ranks=plan.parallel_dims.group_ranks(0, group), gpu=g.shape.gpu,
                    flex_backend=opt.flex_backend, flex_sms=opt.dispatcher_sms,
                    expert_groups=m.expert_groups, groups_per_token=m.expert_groups_per_token,
                    round_robin=opt.gate == "round_robin")


def build_moe_mlp(g: "LayerGraph", plan, layer: int, h: "Node", resid: str) -> "Node":
    """The MoE MLP on the normed input `h`; returns its output in the residual layout."""
    m, tp = plan.model, plan.mesh.tp
    x = g.to_layout(h, S) if tp > 1 else h   # each TP rank routes its own sequence shard
    if plan.moe.gate == "round_robin":
        gate, extras = round_robin_gate(g, plan, x), []
    else:
        gate, extras = _router(g, plan, x)
    geo = geometry(g, plan, x)
    rows, probs = dispatch(g, geo, plan.moe.dispatcher, x, gate)
    y = _experts(g, plan, layer, geo, rows)
    routed = combine(g, geo, plan.moe.dispatcher, y, [probs, *extras], x.layout)
    out = routed
    if m.num_shared_experts:
        shared = g.to_layout(_shared_experts(g, plan, layer, h), routed.layout)
        out = g.elementwise("shared_add", [routed, shared], layout=routed.layout, rw=(2.0, 1.0))
    return g.to_layout(out, resid)


def _router(g: "LayerGraph", plan, x: "Node") -> tuple["Node", list["Node"]]:
    """The learned router on the tokens `x`: (its gate, the aux loss's nodes)."""
    m = plan.model
    # Under Transformer Engine's recipes the router stays a BF16 GEMM: its weight is a plain
    # parameter, multiplied by te_general_gemm without a quantizer (Megatron-Core
    # moe_utils.py RouterGatingLinearFunction, core_v0.13.0 through d98e8a64), so no FP8
    # cast or block-scale swizzle precedes it.
    logits = g.linear("router", x, "seq" if x.layout == S else "replicate", m.num_experts,
                      bf16=traits(plan.framework).te_modules)
    # Passes over the [tokens, E] logits (Megatron-LM moe_utils.topk_routing_with_score_
    # function, unfused): softmax reads the logits and writes the scores, top-k reads the
    # scores, the dense probabilities are written; the bool routing map (half a bf16
    # tensor) is left out. Forced balance's random logits, token drop's capacity mask and
    # the aux loss, with their kernel counts: workloads/moe/router_ops.py
    gate = g.elementwise("router_topk", [random_logits(g, plan, logits)], rw=(2.0, 2.0))
    gate = token_drop(g, plan, gate)
    return gate, aux_loss(g, plan, gate)


def expert_strategies(plan, layer: int, layout: str) -> tuple[str, str, str]:
    """Strategies of the routed experts' w1, w3, w2: the plan's (TP-split) under expert
    TP, else whole weights on the rank's rows ("seq" on a sequence shard)."""
    st = plan.strategies(layer)
    if plan.moe.etp_of(plan.mesh.tp) > 1:
        return st["w1"], st["w3"], st["w2"]
    whole = "seq" if layout == S and plan.mesh.tp > 1 else "replicate"
    return whole, whole, whole


def _experts(g: "LayerGraph", plan, layer: int, geo: Geometry, rows: "Node") -> "Node":
    s1, s3, s2 = expert_strategies(plan, layer, rows.layout)
    # rows per local expert on the hottest rank (with ETP: gathered from the ETP group)
    per_expert = geo.tokens * geo.rows * geo.etp / geo.local_experts
    grouped = dict(experts=geo.local_experts, efficiency=grouped_gemm_efficiency(per_expert),
                   launches=grouped_gemm_launches(plan.framework, geo.local_experts),
                   launch_streams=grouped_gemm_streams(plan.framework))
    recipe = g.shape.recipe.name if g.shape.quantized else None
    padded = pads_expert_rows(plan, recipe, geo.ep * geo.etp)
    if padded:   # Fp8Padding: each expert's rows padded to the alignment (a copy)
        rows = g.elementwise("expert_pad", [rows], rw=(1.0, 1.0), passthrough=True,
                             launches=PAD_LAUNCHES)
    out = (_fused_experts(g, plan, rows, (s1, s3, s2), grouped) if plan.moe.fused_mlp
           else _grouped_mlp(g, plan, rows, (s1, s3, s2), grouped, geo.local_experts))
    if padded:   # Fp8Unpadding: the output rows copied back without the padding
        out = g.elementwise("expert_unpad", [out], rw=(1.0, 1.0), passthrough=True,
                            launches=unpad_launches(geo.local_experts))
    return out


def _grouped_mlp(g: "LayerGraph", plan, rows: "Node", strategies, grouped: dict,
                 local_experts: int) -> "Node":
    """The routed experts as Megatron-Core's TEGroupedMLP runs them: Transformer Engine
    GroupedLinear modules around the activation (and GPT-OSS's eager epilogue)."""
    m = plan.model
    s1, s3, s2 = strategies
    a = g.linear("w1", rows, s1, m.moe_ffn_size, **grouped)
    if m.mlp == "swiglu":
        # Megatron-Core's linear_fc1 is w1 and w3 in one GroupedLinear (TEGroupedMLP, gated
        # linear unit): its per-expert launches are w1's; w3 stands for the other half
        fused = dict(grouped, launches=1)
        b = g.linear("w3", rows, s3, m.moe_ffn_size, **fused)
        act = g.elementwise("swiglu", clamped_glu(g, plan, a, b), layout=_nonpartial(a.layout),
                            rw=(2.0, 1.0))
    else:
        act = g.elementwise("gelu", [a], layout=_nonpartial(a.layout))
    return expert_bias(g, plan, g.linear("w2", act, s2, m.hidden_size, **grouped),
                       local_experts)


def _fused_experts(g: "LayerGraph", plan, rows: "Node", strategies, grouped: dict) -> "Node":
    """The routed experts as Transformer Engine's fused grouped MLP runs them
    (workloads/moe_options.py fused_mlp; NVIDIA/TransformerEngine d0067d0d
    transformer_engine/pytorch/ops/fused/grouped_mlp.py, GroupedMLP_CuTeGEMMGLU):
    - forward: one group quantize of the dispatched rows for all experts, then cuDNN's
      grouped GEMM for linear_fc1 whose epilogue applies the gated activation (GPT-OSS's
      clamped one included: ScaledClampedQGeGLU) and writes linear_fc2's input already
      block-quantized, then linear_fc2's grouped GEMM: no activation kernel, no cast of
      fc2's input;
    - backward: one group quantize of fc2's output gradient, then the grouped GEMM for
      fc2's data gradient whose epilogue applies the activation's backward and writes
      fc1's output gradient quantized: no activation-backward kernel, no cast of fc1's
      output gradient; the weight gradients are grouped GEMMs;
    - each grouped GEMM and each group quantize is one launch for all local experts, and
      the experts' biases (GPT-OSS) are added in the kernels (the op's has_bias paths).
    Assumption: the epilogue's work costs the GEMM no time (the activation's elementwise
    work is small beside the GEMM's; NVIDIA/cudnn-frontend's cutedsl_fusion_kernels
    benchmark times the fused kernel below TE's GEMM plus activation-and-cast alone,
    workloads/te_quant.py), and cuDNN's grouped GEMM runs at the grouped efficiency TE's
    cuBLAS path does (workloads/moe/grouped_gemm.py)."""
    m = plan.model
    s1, s3, s2 = strategies
    one = dict(grouped, launches=1, launch_streams=1)
    a = g.linear("w1", rows, s1, m.moe_ffn_size, **one)
    b = g.linear("w3", rows, s3, m.moe_ffn_size, **one)
    act = g.elementwise("swiglu", [a, b], layout=_nonpartial(a.layout), rw=(0.0, 0.0),
                        launches=0, backward=(0.0, 0))
    out = g.linear("w2", act, s2, m.hidden_size, **one)
    # fc1's output gradient and fc2's input come quantized from the other GEMM's epilogue;
    # the casts left (fc1's input, fc2's output gradient) quantize all experts at once
    a.quantized_grad = b.quantized_grad = out.quantized_input = True
    a.group_cast = b.group_cast = out.group_cast = True
    return out


def _shared_experts(g: "LayerGraph", plan, layer: int, h: "Node") -> "Node":
    m, st = plan.model, plan.strategies(layer)
    width = m.num_shared_experts * m.moe_ffn_size
    sa = g.linear("shared_w1", h, st["w1"], width)
    if m.mlp == "swiglu":
        sb = g.linear("shared_w3", h, st["w3"], width)
        sact = g.elementwise("shared_swiglu", [sa, sb], layout=_nonpartial(sa.layout),
                             rw=(2.0, 1.0))
    else:
        sact = g.elementwise("shared_gelu", [sa], layout=_nonpartial(sa.layout))
    return g.linear("shared_w2", sact, st["w2"], m.hidden_size)


def _nonpartial(layout: str) -> str:
    return "H" if layout == P else layout


def routed_expert_dims(plan, strategy: str) -> tuple[str, ...]:
    """The dims a routed expert weight's gradient reduces over (and its optimizer states
    are shared over), for its strategy (expert_strategies): the expert-data-parallel
    ranks ("edp", x "cp"), and TP as well when every TP rank holds whole experts and
    computes on its own tokens; under the expert mesh (EP spanning TP) "edp" alone, which
    folds tp and cp in (moe_param_groups)."""
    spans_tp = plan.parallel_dims.expert_mesh is not None
    dims = ("edp", "cp") if plan.mesh.cp > 1 and not spans_tp else ("edp",)
    whole_on_tp = strategy == "seq" and plan.mesh.tp > 1 and not spans_tp
    return dims + ("tp",) if whole_on_tp else dims


def moe_param_groups(plan, layer: int, dp_dims: tuple[str, ...]) -> dict:
    """Parameters one rank holds for an MoE layer's MLP, by gradient-reduction dims.

    Router: replicated over TP; its gradient reduces over TP too (it runs on each TP rank's
    sequence shard). Shared experts: TP-split like the dense MLP. Routed experts: E / ep
    experts, split over expert TP; gradients reduce over the expert-data-parallel ranks
    ("edp", x "cp": dp x cp / ep of them), and over TP as well when etp = 1 (every TP rank
    then holds whole experts and computes on its own tokens); under the expert mesh (EP
    spanning TP) over its "edp" alone, which folds those in (tp x cp x dp / ep ranks).
    """
    m, tp, st = plan.model, plan.mesh.tp, plan.strategies(layer)
    both = dp_dims + ("tp",) if tp > 1 else dp_dims
    routed_st = dict(zip(("w1", "w3", "w2"), expert_strategies(plan, layer, S)))
    groups: dict[tuple[str, ...], float] = {}

    def add(dims, params):
        groups[dims] = groups.get(dims, 0.0) + params

    if plan.moe.gate == "router":   # the round-robin gate has no parameters
        add(both, m.hidden_size * m.num_experts)
    for name in m.mlp_matrices:
        shared_split = tp if st[name] in ("col", "row") else 1
        shared = m.num_shared_experts * m.hidden_size * m.moe_ffn_size / shared_split
        add(both if st[name] == "seq" else dp_dims, shared)
        strategy = routed_st[name]
        routed = (m.num_experts // plan.mesh.ep * m.hidden_size * m.moe_ffn_size
                  / (tp if strategy in ("col", "row") else 1))
        add(routed_expert_dims(plan, strategy), routed)
    return {k: v for k, v in groups.items() if v}
