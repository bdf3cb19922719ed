"""Layer building: the builder of each unit of a plan's model (workloads/layer_builder.py).

A transformer layer is a LayerGraph under the plan's per-projection strategies (1D tensor
parallelism, with an MoE MLP where the model has one) or a GridLayer (2D/2.5D/3D tensor
parallelism); the embedding and the output layer are small LayerGraphs, the output layer
with the multi-token-prediction modules where the model trains with them (on the last
pipeline stage, as Megatron-LM places them).
"""
from __future__ import annotations

from dataclasses import replace

from .attention_impls import COMPUTE_CAPABILITY
from .bias_dropout import activation_bias_grad, eager_residual_extras, residual_add_costs
from .explicit_comm import ExplicitComm
from .fsdp_float8 import with_gathered_weights
from .grid_layer import GridLayer
from .layer_builder import BuildOptions, LayerBuilder, LayerShape
from .layer_graph import LayerGraph, Node
from .latent_attention import build_mla, layer_strategies
from .lora import add_adapter
from .layouts import H, P, R, S
from .moe import build_moe_mlp
from .plan import Plan
from .precision import precision
from .schedules import EMBED, HEAD
from .torchao_recipes import gemm_recipe
from .train_metrics import add_train_metrics
from .yarn_rope import rope


def layer_shape(plan: Plan, gpu: str = "") -> LayerShape:
    """Per-rank sizes of one micro-batch through one layer of a resolved plan, on `gpu`
    (a device name: its compute capability picks the recipe's casts; "": Hopper's)."""
    tr, m = plan.training, plan.model
    prec = precision(tr.dtype)
    recipe = gemm_recipe(tr.dtype, plan.framework,   # torchao's under torchtitan
                         COMPUTE_CAPABILITY.get(gpu.lower(), (0, 0)))
    if recipe is not None and plan.fsdp_float8_all_gather:   # weights gathered in float8
        recipe = with_gathered_weights(recipe)
    if recipe is not None:   # the plan's own BF16 layers, where it names them
        recipe = recipe.with_layers(tr.bf16_layers)
    return LayerShape(tokens=tr.micro_batch * tr.seq_len // plan.mesh.cp, seq_len=tr.seq_len,
                      tp=plan.mesh.tp, heads=m.num_heads, kv_heads=m.num_kv_heads,
                      head_dim=m.head_dim, act_bytes=prec.act_bytes,
                      gemm_bytes=prec.gemm_bytes, cp=plan.mesh.cp,
                      cp_mode=plan.cp_mode, recipe=recipe,
                      v_head_dim=m.value_head_dim if m.value_head_dim != m.head_dim else 0,
                      gpu=gpu.lower(), packed_segment=tr.packed_segment,
                      attention_dtype=tr.dtype if tr.fp8_attention else "")


def unit_builder(plan: Plan, unit, shape: LayerShape, options: BuildOptions) -> LayerBuilder:
    """A fresh builder of one unit (a layer index, EMBED or HEAD) of the plan."""
    if unit == EMBED:
        return build_embedding(plan, shape, options)
    if unit == HEAD:
        return build_head(plan, shape, options)
    if shape.recipe is not None and shape.recipe.keeps_bf16(unit, plan.model.num_layers):
        # the recipe's BF16 layers: outside the FP8 autocast, attention included
        shape = replace(shape, bf16_gemms=True, attention_dtype="")
    if plan.grid_strategy is not None:
        return GridLayer(plan, unit, shape, options)
    return build_layer(plan, unit, shape, options)


def build_layer(plan: Plan, layer: int, shape: LayerShape,
                options: BuildOptions | None = None) -> LayerGraph:
    """Forward graph of one transformer layer under the plan's strategies (1D TP)."""
    resid = S if plan.sequence_parallel else R
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
    add_layer(g, plan, layer, g.input(resid, plan.model.hidden_size))
    return g


def add_layer(g: LayerGraph, plan: Plan, layer: int, x: Node) -> Node:
    """Transformer layer `layer` on the residual stream `x` (in the residual layout), into
    `g`; returns the node with its output."""
    m, st = plan.model, layer_strategies(plan, layer)
    resid = S if plan.sequence_parallel else R
    h = g.elementwise("attention_norm", [x])
    window = m.window_at(layer)
    if m.mla:     # multi-head latent attention (workloads/latent_attention.py)
        q, kv, k_pe = build_mla(g, m, st, h)
        o = g.attention(q, kv, None, window, m.o_size, head_shared=(k_pe,))
    else:
        q = g.linear("wq", h, st["wq"], m.q_size)
        k = g.linear("wk", h, st["wk"], m.kv_size)
        v = g.linear("wv", h, st["wv"], m.v_size)
        q, k, v = _adapted(g, plan, "wq", h, [q, k, v], resid)
        if m.qk_norm:   # per-head RMSNorms of q and k, on the heads this rank holds
            q = g.elementwise("q_headnorm", [q], layout=_elementwise_layout(q.layout))
            k = g.elementwise("k_headnorm", [k], layout=_elementwise_layout(k.layout))
        q = rope(g, plan, "rope", q, _elementwise_layout(q.layout))
        k = rope(g, plan, "rope_k", k, _elementwise_layout(k.layout))
        o = g.attention(q, k, v, window)
    y, = _adapted(g, plan, "wo", o, [g.to_layout(g.linear("wo", o, st["wo"], m.hidden_size),
                                                 resid)], resid)
    rw, add_backward = residual_add_costs(m, g.shape.act_bytes)   # bias-dropout-add
    # eager PyTorch: the branch's dropout and its projections' bias gradients (wo and, not
    # returned by an eager GEMM as by Transformer Engine's, wq, wk and wv), in units of the
    # residual stream's local tensor: a column-parallel output holds 1 / tp of its width on
    # every token, the residual stream all of it (1 / tp of the tokens under SP)
    col = 1.0 if plan.sequence_parallel or g.shape.tp == 1 else 1.0 / g.shape.tp
    x = g.elementwise("residual_add", [x, y], rw=rw, backward=add_backward,
                      eager_extra=eager_residual_extras(m, g.shape.act_bytes, (1.0, *(
                          col * w / m.hidden_size for w in (m.q_size, m.kv_size, m.v_size)))))
    h = g.elementwise("ffn_norm", [x])
    if m.is_moe_layer(layer):     # the MoE layer's output goes through the same add
        return g.elementwise("residual_add", [x, build_moe_mlp(g, plan, layer, h, resid)],
                             rw=rw, backward=add_backward,
                             eager_extra=eager_residual_extras(m, g.shape.act_bytes, ()))
    a = g.linear("w1", h, st["w1"], m.ffn_size)
    fc1_bias = activation_bias_grad(m)   # fc1's bias gradient, fused or eager alike
    if m.mlp == "swiglu":
        b = g.linear("w3", h, st["w3"], m.ffn_size)
        a, b = _adapted(g, plan, "w1", h, [a, b], resid)
        act = g.elementwise("swiglu", [a, b], layout=_elementwise_layout(a.layout), rw=(2.0, 1.0),
                            backward_extra=fc1_bias)
    else:
        a, = _adapted(g, plan, "w1", h, [a], resid)
        act = g.elementwise("gelu", [a], layout=_elementwise_layout(a.layout),
                            backward_extra=fc1_bias)
    y, = _adapted(g, plan, "w2", act, [g.to_layout(g.linear("w2", act, st["w2"], m.hidden_size),
                                                   resid)], resid)
    return g.elementwise("residual_add", [x, y], rw=rw, backward=add_backward,
                         eager_extra=eager_residual_extras(m, g.shape.act_bytes, (1.0,)))


def _adapted(g: LayerGraph, plan: Plan, projection: str, x: Node, bases: list[Node],
             resid: str) -> list[Node]:
    """The base outputs with the LoRA adapter of the module holding `projection` added, or
    as they are when it has none (workloads/lora.py add_adapter)."""
    module = plan.lora.module_of(projection) if plan.lora is not None else None
    return add_adapter(g, plan.lora, module, x, bases, resid) if module else bases


def _elementwise_layout(layout: str) -> str:
    # A non-linear op cannot run on partial sums: reduce them onto the features first.
    return H if layout == "P" else layout


def build_embedding(plan: Plan, shape: LayerShape,
                    options: BuildOptions | None = None) -> LayerGraph:
    """Vocab-parallel embedding: a lookup whose output is a partial sum over TP."""
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
    e = g.elementwise("embedding", [], layout="P" if shape.tp > 1 else R,
                      features=plan.model.hidden_size, rw=(1.0, 1.0))
    e.frozen = g.options.frozen_base    # LoRA: the embedding gets no gradient
    g.to_layout(e, S if plan.sequence_parallel else R)
    return g


def build_head(plan: Plan, shape: LayerShape, options: BuildOptions | None = None) -> LayerGraph:
    """Final norm, vocab-parallel output projection (column-parallel) and the loss; then
    the multi-token-prediction modules, if the model trains with them. The MTP block reads
    the final norm's output, as the output layer does: Megatron-Core's decoder applies its
    final layernorm before GPTModel hands the hidden states to the MTP block, whose hnorm
    normalises them again (NVIDIA/Megatron-LM core_v0.15.0 transformer_block.py,
    gpt_model.py _postprocess)."""
    m = plan.model
    resid = S if plan.sequence_parallel else R
    g = LayerGraph(shape, options or BuildOptions.from_plan(plan))
    x = g.input(resid, m.hidden_size)
    if m.mtp_layers:
        x = g.elementwise("final_norm", [x])
    losses = [_output_and_loss(g, x, "final_norm", m.vocab_size, plan.loss_metrics,
                               normed=bool(m.mtp_layers))]
    for depth in range(m.mtp_layers):
        x = _mtp_module(g, plan, depth, x, resid)
        losses.append(_output_and_loss(g, x, "mtp_norm", m.vocab_size))
    if len(losses) > 1:
        # the step's loss adds the MTP losses (weighted) to the main one: the backward
        # starts from every cross-entropy
        g.elementwise("loss_sum", losses, features=1, rw=(float(len(losses)), 1.0))
    return g


def _output_and_loss(g: LayerGraph, x: Node, norm: str, vocab: int, metrics: int = 0,
                     normed: bool = False) -> Node:
    """A norm (`normed`: `x` is that norm's output already), the output projection and
    the cross-entropy on `x`; before the loss, the trainer's `metrics` cross-entropies on
    the logits (workloads/train_metrics.py), so that the loss stays the graph's last node,
    where its backward starts."""
    h = x if normed else g.elementwise(norm, [x])
    # The output layer stays in bf16 under FP8/FP4 training (workloads/precision.py):
    # torchtitan's float8 conversion skips it (filter_fqns ["output"]) and
    # Megatron-LM/Transformer Engine quantise only the transformer layers' linears.
    logits = g.linear("output", h, "col", vocab, bf16=True)
    add_train_metrics(g, logits, metrics)
    # Cross-entropy on fp32 logits: read logits, write softmax (Megatron's vocab-parallel
    # cross-entropy keeps its input for backward). Under TP it first all-reduces its
    # per-token statistics (workloads/vocab_parallel_loss.py), one after the other.
    inputs = [logits]
    if g.shape.tp > 1:
        # no gradient flows back through them: the backward uses the saved statistics
        stats = logits
        for call, per_token in enumerate(g.options.loss_all_reduce_bytes):
            comm = ExplicitComm("all_reduce", ("tp",), g.shape.tokens * per_token, None,
                                stream="tp", label="loss", direct=True)
            stats = g.explicit_comm(f"{norm}_stats{call}", stats, comm, features=1)
        inputs.append(stats)
    return g.elementwise("cross_entropy", inputs, rw=(2.0, 2.0))


def _mtp_module(g: LayerGraph, plan: Plan, depth: int, x: Node, resid: str) -> Node:
    """Multi-token-prediction module `depth` (DeepSeek-V3, arXiv:2412.19437 section 2.2;
    Megatron-LM megatron/core/transformer/multi_token_prediction.py): the previous depth's
    output and the embedding of the tokens `depth` + 1 ahead, each RMS-normed and
    concatenated, projected 2d -> d by the column-parallel eh_proj (whose output is
    gathered over TP, then sliced to the sequence shard under SP), then one transformer
    block built like the model's last layer."""
    m, tp = plan.model, g.shape.tp
    hidden = g.elementwise("mtp_hnorm", [x])
    emb = g.elementwise("mtp_embedding", [], layout=P if tp > 1 else R,
                        features=m.hidden_size, rw=(1.0, 1.0))     # vocab-parallel lookup
    emb = g.elementwise("mtp_enorm", [g.to_layout(emb, resid)])
    cat = g.elementwise("mtp_concat", [hidden, emb], features=2 * m.hidden_size)
    proj = g.linear("mtp_proj", cat, "col", m.hidden_size)
    return add_layer(g, plan, m.mtp_layer_index(depth), g.to_layout(g.to_layout(proj, R), resid))
