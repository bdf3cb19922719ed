"""Lowering: a resolved Plan becomes a Program (per-stage task lists with dependencies).

What each stage does per micro-batch: receive activations (pp), run its layers' forward
(TP redistributions from the layouts of layer_graph), send; then the backward in the
schedule's order, with FSDP/ZeRO/DDP parameter gathers and gradient reductions on their
own streams (FSDP2 uses separate all-gather and reduce-scatter streams), and the
optimizer step at the end.
"""
from __future__ import annotations

from .layer_graph import LayerGraph, LayerShape, causal_attention_flops
from .layouts import H, R, S
from .plan import Plan
from .precision import precision
from .program import Program
from .schedules import stage_layer_ranges


def build_layer(plan: Plan, layer: int, shape: LayerShape) -> LayerGraph:
    """Forward graph of one transformer layer under the plan's strategies."""
    m, st = plan.model, plan.strategies(layer)
    resid = S if plan.sequence_parallel else R
    g = LayerGraph(shape)
    x = g.input(resid, m.hidden_size)
    h = g.elementwise("attention_norm", [x])
    q = g.linear("wq", h, st["wq"], m.q_size)
    k = g.linear("wk", h, st["wk"], m.kv_size)
    v = g.linear("wv", h, st["wv"], m.kv_size)
    q = g.elementwise("rope", [q], layout=_elementwise_layout(q.layout))
    k = g.elementwise("rope_k", [k], layout=_elementwise_layout(k.layout))
    o = g.attention(q, k, v)
    y = g.to_layout(g.linear("wo", o, st["wo"], m.hidden_size), resid)
    x = g.elementwise("residual_add", [x, y], rw=(2.0, 1.0))
    h = g.elementwise("ffn_norm", [x])
    if m.is_moe_layer(layer):
        from .moe import build_moe_mlp
        g.elementwise("residual_add", [x, build_moe_mlp(g, plan, layer, h, resid)], rw=(2.0, 1.0))
        return g
    a = g.linear("w1", h, st["w1"], m.ffn_size)
    if m.mlp == "swiglu":
        b = g.linear("w3", h, st["w3"], m.ffn_size)
        act = g.elementwise("swiglu", [a, b], layout=_elementwise_layout(a.layout), rw=(2.0, 1.0))
    else:
        act = g.elementwise("gelu", [a], layout=_elementwise_layout(a.layout))
    y = g.to_layout(g.linear("w2", act, st["w2"], m.hidden_size), resid)
    g.elementwise("residual_add", [x, y], rw=(2.0, 1.0))
    return g


def _elementwise_layout(layout: str) -> str:
    # A non-linear op cannot run on partial sums: reduce them onto the features first.
    return H if layout == "P" else layout


def build_embedding(plan: Plan, shape: LayerShape) -> LayerGraph:
    """Vocab-parallel embedding: a lookup whose output is a partial sum over TP."""
    g = LayerGraph(shape)
    e = g.elementwise("embedding", [], layout="P" if shape.tp > 1 else R,
                      features=plan.model.hidden_size, rw=(1.0, 1.0))
    g.to_layout(e, S if plan.sequence_parallel else R)
    return g


def build_head(plan: Plan, shape: LayerShape) -> LayerGraph:
    """Final norm, vocab-parallel output projection (column-parallel) and the loss."""
    m = plan.model
    g = LayerGraph(shape)
    x = g.input(S if plan.sequence_parallel else R, m.hidden_size)
    h = g.elementwise("final_norm", [x])
    # The output layer stays in bf16 under FP8 training: torchtitan's float8 conversion
    # skips it (filter_fqns ["output"]) and Megatron-LM/Transformer Engine run only the
    # transformer layers' linears in FP8.
    logits = g.linear("output", h, "col", m.vocab_size, bf16=True)
    # Cross-entropy on fp32 logits: read logits, write softmax (Megatron's vocab-parallel
    # cross-entropy keeps its input for backward).
    g.elementwise("cross_entropy", [logits], rw=(2.0, 2.0))
    return g


EMBED, HEAD = "embedding", "head"


def weight_dp_dims(plan: Plan) -> tuple[str, ...]:
    """The dims a replicated weight's gradient reduces over: DP, and CP when there is one
    (every CP rank sees other tokens of the same sequence)."""
    return ("dp", "cp") if plan.mesh.cp > 1 else ("dp",)


def layer_param_groups(plan: Plan, layer: int) -> dict[tuple[str, ...], float]:
    """Parameters one rank holds for a layer, by the mesh dims their gradients reduce over.

    col/row weights are sharded over TP, their gradients S(0) over TP: reduced over DP
    only. seq weights are whole on every TP rank and see a slice of the sequence, so
    their gradients are P(sum)P(sum): reduced over DP and TP (seed 000). Norm weights
    under sequence parallelism are partial over TP too.
    """
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    if plan.grid_strategy is not None:
        from .tp_grid import grid_param_groups
        return grid_param_groups(plan, layer, dp_dims)
    both = dp_dims + ("tp",) if tp > 1 else dp_dims
    groups: dict[tuple[str, ...], float] = {}
    moe = m.is_moe_layer(layer)
    if moe:
        from .moe import moe_param_groups
        groups.update(moe_param_groups(plan, layer, dp_dims))
    for name, (fan_in, fan_out) in m.projection_shapes().items():
        if moe and name in m.mlp_matrices:
            continue
        strategy = plan.strategies(layer)[name]
        params = fan_in * fan_out / (tp if strategy in ("col", "row") else 1)
        key = both if strategy == "seq" else dp_dims
        groups[key] = groups.get(key, 0.0) + params
    norm_key = both if plan.sequence_parallel else dp_dims
    groups[norm_key] = groups.get(norm_key, 0.0) + 2 * m.hidden_size
    return groups


def unit_param_groups(plan: Plan, unit) -> dict[tuple[str, ...], float]:
    """Parameters one rank computes with for an FSDP unit (a layer index, EMBED or HEAD),
    by the mesh dims their gradients reduce over (and ZeRO/FSDP shards them over)."""
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    if unit == EMBED:
        return {dp_dims: m.vocab_size * m.hidden_size / tp}        # vocab-parallel
    if unit == HEAD:
        # A tied output layer still needs its own (vocab-parallel) copy on the last
        # stage when the first stage is elsewhere (Megatron); on one stage it is the
        # embedding. Plus the final norm.
        tied = m.tie_word_embeddings and plan.mesh.pp == 1
        return {dp_dims: (0 if tied else m.vocab_size * m.hidden_size / tp) + m.hidden_size}
    return layer_param_groups(plan, unit)


def stage_layers(plan: Plan) -> tuple[range, ...]:
    """The layers of each pipeline chunk, pp x virtual_stages of them, chunk c on stage
    c % pp (the Llama 3 split unless the plan gives one)."""
    return stage_layer_ranges(plan.model.num_layers, plan.mesh.pp * plan.pipeline.virtual_stages,
                              plan.pipeline.layer_split)


def model_flops(plan: Plan) -> float:
    """Model FLOPs of one step: 6 x tokens x matmul params (output layer included, input
    embedding excluded; Kaplan et al. 2020 / Narayanan et al. 2021 eq. 3 convention) plus
    causal attention 3 x forward (forward + 2x backward). Recompute is not counted (MFU,
    not HFU; Chowdhery et al. 2022, appendix B)."""
    m, tr = plan.model, plan.training
    tokens = tr.global_batch * tr.seq_len
    layers = (m.num_layers * m.layer_matmul_params() if not m.num_experts else
              sum(m.active_matmul_params_at(i) for i in range(m.num_layers)))
    matmul = layers + m.vocab_size * m.hidden_size   # MoE: active (routed top-k) params
    attention_fwd = causal_attention_flops(tokens, tr.seq_len, m.head_dim, m.num_heads)
    return 6.0 * tokens * matmul + 3.0 * m.num_layers * attention_fwd


def layer_shape(plan: Plan) -> LayerShape:
    """Per-rank sizes of one micro-batch through one layer of a resolved plan."""
    tr, m = plan.training, plan.model
    return LayerShape(tokens=tr.micro_batch * tr.seq_len // plan.mesh.cp, seq_len=tr.seq_len,
                      tp=plan.mesh.tp, heads=m.num_heads, kv_heads=m.num_kv_heads,
                      head_dim=m.head_dim, act_bytes=precision(tr.dtype).act_bytes,
                      gemm_bytes=precision(tr.dtype).gemm_bytes, cp=plan.mesh.cp,
                      cp_mode=plan.cp_mode)


def lower(plan: Plan) -> Program:
    """The Program of a resolved plan (plan.mesh.dp must be a number)."""
    if plan.mesh.dp < 1:
        raise ValueError("lower() needs a resolved plan: call workloads.resolve first")
    shape = layer_shape(plan)
    layers = stage_layers(plan)
    from .stage_lowering import StageLowering  # local: stage_lowering imports this module
    stages = [StageLowering(plan, shape, s, layers).build() for s in range(plan.mesh.pp)]
    pp = plan.mesh.pp
    return Program(plan=plan, stages=stages, model_flops=model_flops(plan),
                   notes={"layers_per_stage": [sum(len(r) for r in layers[s::pp])
                                               for s in range(pp)],
                          "layers_per_chunk": [len(r) for r in layers]})
