"""Parameter and FLOP accounting: what one rank holds of each unit, and the model FLOPs.

A unit is a layer index, the embedding (EMBED) or the output layer with the final norm
(HEAD). Its parameters are grouped by the mesh dims their gradients reduce over, which is
also what ZeRO/FSDP shard them over.
"""
from __future__ import annotations

import math
from collections import Counter

from .attention import causal_attention_flops
from .framework_traits import traits
from .latent_attention import layer_strategies
from .lora import adapter_params_per_layer
from .model_spec import LEARNED
from .moe import moe_param_groups
from .plan import Plan
from .schedules import EMBED, HEAD
from .tp_grid import grid_param_groups


def weight_dp_dims(plan: Plan) -> tuple[str, ...]:
    """The dims a replicated weight's gradient reduces over: DP, and CP when there is one
    (every CP rank sees other tokens of the same sequence)."""
    return ("dp", "cp") if plan.mesh.cp > 1 else ("dp",)


def layer_param_groups(plan: Plan, layer: int) -> dict[tuple[str, ...], float]:
    """Parameters one rank holds for a layer, by the mesh dims their gradients reduce over.

    col/row weights are sharded over TP, their gradients S(0) over TP: reduced over DP
    only. seq weights are whole on every TP rank and see a slice of the sequence, so
    their gradients are P(sum)P(sum): reduced over DP and TP (DTensor's sharding
    propagation for a matmul whose input is sharded on the contracted token dim, as the
    adaptive-sharding study notes). Norm weights under sequence parallelism are partial
    over TP too.
    """
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    if plan.grid_strategy is not None:
        return grid_param_groups(plan, layer, dp_dims)
    both = dp_dims + ("tp",) if tp > 1 else dp_dims
    groups: dict[tuple[str, ...], float] = {}
    moe = m.is_moe_layer(layer)
    if moe:
        groups.update(moe_param_groups(plan, layer, dp_dims))
    strategies = layer_strategies(plan, layer)
    for name, (fan_in, fan_out) in m.projection_shapes().items():
        if moe and name in m.mlp_matrices:
            continue
        strategy = strategies[name]
        params = fan_in * fan_out / (tp if strategy in ("col", "row") else 1)
        key = both if strategy == "seq" else dp_dims
        groups[key] = groups.get(key, 0.0) + params
    # Norms (MLA's latent norms too) run on the sequence shards under SP; attention
    # sinks are per head, split over TP with the heads; the per-head q / k norms are whole
    # on every TP rank but see only its heads, so their gradients are partial over TP with
    # or without SP (Megatron-Core all-reduces them over TP: finalize_model_grads.py,
    # core_v0.15.0).
    sinks = m.num_heads if m.attention_sinks else 0
    head_norms = 2 * m.head_dim if m.qk_norm else 0
    norm_key = both if plan.sequence_parallel else dp_dims
    groups[norm_key] = (groups.get(norm_key, 0.0) + m.layer_vector_params() - sinks
                        - head_norms)
    if head_norms:
        groups[both] = groups.get(both, 0.0) + head_norms
    if sinks:
        groups[dp_dims] = groups.get(dp_dims, 0.0) + sinks / tp
    return groups


def unit_param_groups(plan: Plan, unit) -> dict[tuple[str, ...], float]:
    """Trainable parameters one rank computes with for an FSDP unit (a layer index, EMBED
    or HEAD), by the mesh dims their gradients reduce over (and ZeRO/FSDP shards them
    over). Under LoRA only the adapters train (workloads/lora.py): a layer's adapters,
    split over TP, reduce over DP; the embedding and the output layer have none."""
    if plan.lora is None:
        return _unit_params(plan, unit)
    if unit in (EMBED, HEAD):
        return {}
    # every adapter linear is split over TP (workloads/lora.py)
    return {weight_dp_dims(plan): adapter_params_per_layer(plan.model, plan.lora) / plan.mesh.tp}


def unit_frozen_params(plan: Plan, unit) -> float:
    """Parameters of the unit that do not train (LoRA's base weights), held whole on
    the rank (check_lora refuses their sharding); 0 without LoRA."""
    return sum(_unit_params(plan, unit).values()) if plan.lora is not None else 0.0


def _unit_params(plan: Plan, unit) -> dict[tuple[str, ...], float]:
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    if unit == EMBED:
        return {dp_dims: m.vocab_size * m.hidden_size / tp}        # vocab-parallel
    if unit == HEAD:
        # A tied output layer still needs its own (vocab-parallel) copy on the last
        # stage when the first stage is elsewhere (Megatron); on one stage it is the
        # embedding. Plus the final norm.
        tied = m.tie_word_embeddings and plan.mesh.pp == 1
        groups = {dp_dims: (0 if tied else m.vocab_size * m.hidden_size / tp) + m.hidden_size}
        return _add_mtp_groups(plan, groups) if m.mtp_layers else groups
    return layer_param_groups(plan, unit)


def _add_mtp_groups(plan: Plan, groups: dict) -> dict:
    """The output layer's groups plus the multi-token-prediction modules (on the last
    stage): each its transformer block, eh_proj (2d x d, column-parallel) and three
    norms; and, when the embedding is on another stage and not tied to the output
    layer, a copy of the vocab-parallel embedding for the MTP lookups (Megatron-LM keeps
    one on the last stage for them)."""
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    norm_key = dp_dims + ("tp",) if plan.sequence_parallel and tp > 1 else dp_dims
    groups = dict(groups)
    extra = [(dp_dims, m.mtp_layers * 2 * m.hidden_size * m.hidden_size / tp),
             (norm_key, m.mtp_layers * 3 * m.hidden_size)]
    if plan.mesh.pp > 1 and not m.tie_word_embeddings:
        extra.append((dp_dims, m.vocab_size * m.hidden_size / tp))
    for depth in range(m.mtp_layers):
        extra += layer_param_groups(plan, m.mtp_layer_index(depth)).items()
    for key, params in extra:
        groups[key] = groups.get(key, 0.0) + params
    return groups


def model_flops(plan: Plan) -> float:
    """Model FLOPs of one step: 6 x tokens x matmul params (output layer included, input
    embedding excluded; Kaplan et al. 2020 / Narayanan et al. 2021 eq. 3 convention) plus
    causal attention 3 x forward (forward + 2x backward), each layer with its head dims
    and sliding window; the multi-token-prediction modules too (their projection, block
    and a second pass through the output layer, as Megatron-LM counts them). Recompute
    is not counted (MFU, not HFU; Chowdhery et al. 2022, appendix B).

    Packed plans (training.packed_segment) still count causal attention over the whole
    seq_len, not over each packed example: that is how NeMo reports the model FLOPs its
    TFLOP/s and MFU figures are per (nemo/utils/flops_formulas.py: every family's
    attention term is gbs x enc_seq_len^2, with enc_seq_len the packed sequence's length),
    so the simulated MFU stays comparable with theirs; the simulated step itself prices
    each example's attention alone (workloads/attention.py).

    LoRA (workloads/lora.py): the frozen matmuls run forward and data gradient only
    (4 x tokens x params), the adapters all three passes (6 x tokens x params)."""
    m, tr = plan.model, plan.training
    tokens = tr.global_batch * tr.seq_len
    layers = (m.num_layers * m.layer_matmul_params() if not m.num_experts else
              sum(m.active_matmul_params_at(i) for i in range(m.num_layers)))
    matmul = layers + m.vocab_size * m.hidden_size   # MoE: active (routed top-k) params
    d = m.hidden_size
    matmul += sum(2 * d * d + m.active_matmul_params_at(m.mtp_layer_index(k))
                  + m.vocab_size * d for k in range(m.mtp_layers))
    windows = Counter(m.window_at(i) for i in range(m.num_layers + m.mtp_layers))
    attention = sum(3.0 * count * causal_attention_flops(
        tokens, tr.seq_len, m.head_dim, m.num_heads, m.value_head_dim, window)
        for window, count in sorted(windows.items()))
    if plan.lora is not None:
        adapters = m.num_layers * adapter_params_per_layer(m, plan.lora)
        return 4.0 * tokens * matmul + 6.0 * tokens * adapters + attention
    return 6.0 * tokens * matmul + attention


def param_tensor_count(plan: Plan, units: list, fsdp1_shards: int = 1) -> int:
    """Parameter tensors a rank's optimizer steps for `units` (its stage's), which the
    per-tensor loops of the for_loop, megatron_float16 and fp16_optimizer steps run over.

    A layer: its projections (one query_key_value tensor under the Megatron frameworks,
    Megatron-LM's ParallelAttention and Megatron-Core's linear_qkv; Megatron-Core's
    linear_fc1 also holds a gated MLP's gate and up) and two norms (four
    with per-head q / k norms); GPT-style layers (ModelSpec.linear_bias) add a bias to
    each projection and to each LayerNorm. Approximations (only the per-tensor steps read
    the count): MoE experts count as the dense projections, multi-head latent attention as
    q, k, v and o.
    The embedding: the word embedding, and the position embedding where it is learned.
    The output layer: the final norm (and its bias) and the output projection, which a
    tied embedding on the same stage shares.
    FSDP1 (`fsdp1_shards` > 1) shards a unit's FlatParameter contiguously and steps only
    the parameters a shard overlaps (_flat_param.py _use_sharded_grad_views): each of the
    unit's k - 1 inner boundaries falls in one shard, 1 + (k - 1) / shards on average.
    """
    m = plan.model
    linears = 4 + len(m.mlp_matrices)
    framework = traits(plan.framework)
    if framework.fused_linear_groups and not m.mla:
        linears -= 2    # q, k and v in one tensor
    if framework.fused_gate_up_weight and len(m.mlp_matrices) == 3:
        linears -= 1    # gate and up in one linear_fc1
    norms = 2 + 2 * m.qk_norm
    per_layer = linears + norms + (linears + 2 if m.linear_bias else 0)
    head = 1 + m.linear_bias + (0 if m.tie_word_embeddings and EMBED in units else 1)
    counts = [1 + (m.position_embedding == LEARNED) if u == EMBED else head if u == HEAD
              else per_layer for u in units]
    if fsdp1_shards > 1:
        return math.ceil(sum(1 + (k - 1) / fsdp1_shards for k in counts))
    return sum(counts)
