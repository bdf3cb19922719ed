"""Megatron-Core's selective recompute of named modules (recompute_modules), beyond the
attention core that "selective" already means.

With recompute_granularity "selective", Megatron-Core (NVIDIA/Megatron-LM core_v0.16.0
megatron/core/transformer/transformer_config.py recompute_modules) checkpoints each listed
module with CheckpointWithoutOutput: the forward runs as usual, its output is dropped and
the module's forward runs again just before the backward needs it. Modelled modules:
- "layernorm": the separate norm modules (transformer_layer.py: recompute_input_layernorm
  and recompute_pre_mlp_layernorm, only where the norm is not an IdentityOp). Under
  Transformer Engine the attention input norm is fused into linear_qkv
  (TELayerNormColumnParallelLinear; input_layernorm is an IdentityOp), and so is a dense
  MLP's into linear_fc1; an MoE layer's pre-MLP norm is a TENorm of its own
  (gpt_layer_specs.py), so here: the ffn_norm of MoE layers.
- "moe_act": the routed experts' activation (experts.py TEGroupedMLP, activation_recompute:
  bias_act_func, with GPT-OSS's eager clamp: workloads/expert_epilogue.py).
- "moe": the whole MoE layer (moe/moe_layer.py: moe_layer_recompute, MoELayer.forward under
  tensor_parallel.checkpoint, or te_checkpoint under FP8/FP4; not with cuda_graph_impl
  "local"): router, dispatch collectives, experts and combine run again, every node built
  between the pre-MLP norm and the residual add that takes the layer's output
  (workloads/layers.py add_layer). Megatron-Core refuses it with
  overlap_moe_expert_parallel_comm (workloads/moe_options.py check_a2a_overlap).
The recompute runs these nodes' forward again in the "recompute" phase; the activation
memory they no longer keep is not taken off (an overestimate of the memory).
Megatron-Bridge's GPT-OSS performance configs list ["layernorm", "moe_act"]
(scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py), applied with
granularity "selective" from v0.3.0 (scripts/performance/utils/overrides.py
_set_recompute_overrides at 21b02e0cfb and f9b6319e58; at 97ad8cc6fb the list was set
without the granularity, so nothing was recomputed).
"""
from __future__ import annotations

RECOMPUTE_MODULES = ("layernorm", "moe_act", "moe")
# The layer-graph nodes of the modules named by their nodes (workloads/layers.py,
# workloads/moe/layer.py); "moe" is the MoE block, found by position (_moe_block).
_NODES = {"layernorm": ("ffn_norm",), "moe_act": ("glu_clamp", "swiglu", "gelu")}


def recomputes_modules(plan, layer: int) -> bool:
    """Whether some of transformer layer `layer` reruns before its backward."""
    return bool(plan.recompute_modules) and plan.model.is_moe_layer(layer)


def _moe_block(graph) -> frozenset[int]:
    """Ids of an MoE layer graph's MoE block: the nodes built after its pre-MLP norm and
    before the residual add of the block's output (the graph's last residual add)."""
    norm = max(n.id for n in graph.nodes if n.name == "ffn_norm")
    add = max(n.id for n in graph.nodes if n.name == "residual_add")
    return frozenset(n.id for n in graph.nodes if norm < n.id < add)


def module_recompute_saved(graph, plan, layer: int) -> frozenset[int]:
    """Ids of the layer graph's nodes kept from the forward (all but the recomputed)."""
    names = {n for module in plan.recompute_modules for n in _NODES.get(module, ())}
    block = _moe_block(graph) if "moe" in plan.recompute_modules else frozenset()
    return frozenset(n.id for n in graph.nodes if n.name not in names and n.id not in block)
