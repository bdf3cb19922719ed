"""Layer building: the builder of each unit of a plan's model (workloads/layer_builder.py).

A transformer layer is a LayerGraph under the plan's per-projection strategies (1D tensor
parallelism, with an MoE MLP where the model has one) or a GridLayer (2D/2.5D/3D tensor
parallelism); the embedding and the output layer are small LayerGraphs.
"""
from __future__ import annotations

from dataclasses import replace

from .grid_layer import GridLayer
from .layer_builder import BuildOptions, LayerBuilder, LayerShape
from .layer_graph import LayerGraph
from .layouts import H, R, S
from .moe import build_moe_mlp
from .plan import Plan
from .precision import precision
from .schedules import EMBED, HEAD


def layer_shape(plan: Plan) -> LayerShape:
    """Per-rank sizes of one micro-batch through one layer of a resolved plan."""
    tr, m = plan.training, plan.model
    prec = precision(tr.dtype)
    return LayerShape(tokens=tr.micro_batch * tr.seq_len // plan.mesh.cp, seq_len=tr.seq_len,
                      tp=plan.mesh.tp, heads=m.num_heads, kv_heads=m.num_kv_heads,
                      head_dim=m.head_dim, act_bytes=prec.act_bytes,
                      gemm_bytes=prec.gemm_bytes, cp=plan.mesh.cp,
                      cp_mode=plan.cp_mode, recipe=prec.recipe)


def unit_builder(plan: Plan, unit, shape: LayerShape, options: BuildOptions) -> LayerBuilder:
    """A fresh builder of one unit (a layer index, EMBED or HEAD) of the plan."""
    if unit == EMBED:
        return build_embedding(plan, shape, options)
    if unit == HEAD:
        return build_head(plan, shape, options)
    if shape.recipe is not None and shape.recipe.keeps_bf16(unit, plan.model.num_layers):
        shape = replace(shape, bf16_gemms=True)   # the recipe's BF16 layers
    if plan.grid_strategy is not None:
        return GridLayer(plan, unit, shape, options)
    return build_layer(plan, unit, shape, options)


def build_layer(plan: Plan, layer: int, shape: LayerShape,
                options: BuildOptions | None = None) -> LayerGraph:
    """Forward graph of one transformer layer under the plan's strategies (1D TP)."""
    m, st = plan.model, plan.strategies(layer)
    resid = S if plan.sequence_parallel else R
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
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


def build_embedding(plan: Plan, shape: LayerShape,
                    options: BuildOptions | None = None) -> LayerGraph:
    """Vocab-parallel embedding: a lookup whose output is a partial sum over TP."""
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
    e = g.elementwise("embedding", [], layout="P" if shape.tp > 1 else R,
                      features=plan.model.hidden_size, rw=(1.0, 1.0))
    g.to_layout(e, S if plan.sequence_parallel else R)
    return g


def build_head(plan: Plan, shape: LayerShape, options: BuildOptions | None = None) -> LayerGraph:
    """Final norm, vocab-parallel output projection (column-parallel) and the loss."""
    m = plan.model
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
    x = g.input(S if plan.sequence_parallel else R, m.hidden_size)
    h = g.elementwise("final_norm", [x])
    # The output layer stays in bf16 under FP8/FP4 training (workloads/precision.py):
    # torchtitan's float8 conversion skips it (filter_fqns ["output"]) and
    # Megatron-LM/Transformer Engine quantise only the transformer layers' linears.
    logits = g.linear("output", h, "col", m.vocab_size, bf16=True)
    # Cross-entropy on fp32 logits: read logits, write softmax (Megatron's vocab-parallel
    # cross-entropy keeps its input for backward).
    g.elementwise("cross_entropy", [logits], rw=(2.0, 2.0))
    return g
