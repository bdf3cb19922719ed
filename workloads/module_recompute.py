"""Megatron-Core's selective recompute of named modules (recompute_modules), beyond the
attention core that "selective" already means.

With recompute_granularity "selective", Megatron-Core (NVIDIA/Megatron-LM core_v0.16.0
megatron/core/transformer/transformer_config.py recompute_modules; d98e8a64 for
mla_up_proj and mlp) checkpoints each listed module: the output-discarding ones
(CheckpointWithoutOutput: layernorm, moe_act, mla_up_proj) run the forward as usual, free
the module's output once its consumer has run and rerun the module just before the
backward needs it; the others (tensor_parallel.checkpoint, or te_checkpoint under FP8/FP4:
moe, mlp) keep only the module's input. Modelled modules:
- "layernorm": the separate norm modules (transformer_layer.py: recompute_input_layernorm
  and recompute_pre_mlp_layernorm, only where the norm is not an IdentityOp). Under
  Transformer Engine the attention input norm is fused into linear_qkv
  (TELayerNormColumnParallelLinear; input_layernorm is an IdentityOp), and so is a dense
  MLP's into linear_fc1; an MoE layer's pre-MLP norm is a TENorm of its own
  (gpt_layer_specs.py), so here: the ffn_norm of MoE layers. Freed: its output, the
  router's and the dispatcher's input.
- "moe_act": the routed experts' activation (experts.py TEGroupedMLP, activation_recompute:
  bias_act_func, with GPT-OSS's eager clamp: workloads/expert_epilogue.py). Freed: its
  output, fc2's input (experts.py sets fc2 to save that original input, not a quantized
  copy, so the discard frees it).
- "moe": the whole MoE layer (moe/moe_layer.py: moe_layer_recompute, MoELayer.forward under
  tensor_parallel.checkpoint, or te_checkpoint under FP8/FP4; not with cuda_graph_impl
  "local"): router, dispatch collectives, experts and combine run again, every node built
  between the pre-MLP norm and the residual add that takes the layer's output
  (workloads/layers.py add_layer). Megatron-Core refuses it with
  overlap_moe_expert_parallel_comm (workloads/moe_options.py check_a2a_overlap). Freed:
  everything the block saves but its input.
- "mla_up_proj": multi-latent attention's up projections and RoPE
  (multi_latent_attention.py: qkv_up_proj_and_rope_apply under CheckpointWithoutOutput,
  its outputs discarded after the attention core, recomputed before its backward;
  linear_q_up_proj and linear_kv_up_proj carry the latents' norms). Rerun: q_norm, wq_b,
  kv_norm, wkv_b and both RoPEs. Freed: the per-head q, k and v (the latents they are
  built from stay). Megatron-Core refuses it without MLA (transformer_config.py).
- "mlp": a dense layer's MLP (transformer_layer.py recompute_mlp, not on MoE layers),
  its fc1 with the fused pre-MLP norm, activation and fc2, with their tensor-parallel
  collectives. Freed: all the MLP saves but the block's input.
Assumptions: mla_up_proj's rerun leaves out a sequence-parallel gather of the latents
(a graph node of its own, q_lora_rank + kv_lora_rank wide); under FP8/FP4 layernorm's
discard also frees the shared experts' fc1 input (Megatron-Core saves it original there:
moe_layer.py set_for_recompute_pre_mlp_layernorm), still counted here.
The recompute runs these nodes' forward again in the "recompute" phase.
Megatron-Bridge's GPT-OSS performance configs list ["layernorm", "moe_act"]
(scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py), applied with
granularity "selective" from v0.3.0 (scripts/performance/utils/overrides.py
_set_recompute_overrides at 21b02e0cfb and f9b6319e58; at 97ad8cc6fb the list was set
without the granularity, so nothing was recomputed); its DeepSeek-V3 recipes list
["mla_up_proj"] or ["mla_up_proj", "mlp"].
"""
from __future__ import annotations

RECOMPUTE_MODULES = ("layernorm", "moe_act", "moe", "mla_up_proj", "mlp")
# The layer-graph nodes of the modules named by their nodes (workloads/layers.py,
# workloads/moe/layer.py, workloads/latent_attention.py); "moe" and "mlp" rerun the MLP
# block, found by position (_mlp_block), with its collectives; "mlp" its fused norm too.
_NODES = {"layernorm": ("ffn_norm",), "moe_act": ("glu_clamp", "swiglu", "gelu"),
          "mla_up_proj": ("q_norm", "wq_b", "kv_norm", "wkv_b", "rope", "rope_k"),
          "mlp": ("ffn_norm",)}
# The modules an MoE layer has, and a dense one (MLA's on either kind of layer).
_MOE_MODULES = ("layernorm", "moe_act", "moe")
_DENSE_MODULES = ("mlp",)
# The saved tensors each module's recompute frees (workloads/activations.py names).
_FREED = {"layernorm": ("mlp_input",), "moe_act": ("expert_fc2_input",),
          "moe": ("router_logits", "expert_inputs", "expert_act", "expert_fc2_input"),
          "mla_up_proj": ("q", "k", "v"),
          "mlp": ("mlp_input", "gelu_input", "fc2_input", "w1_output", "silu_output",
                  "w3_output", "w2_input")}


def layer_modules(plan, layer: int) -> tuple[str, ...]:
    """The plan's recompute_modules that transformer layer `layer` has."""
    own = _MOE_MODULES if plan.model.is_moe_layer(layer) else _DENSE_MODULES
    return tuple(m for m in plan.recompute_modules
                 if m in own or (m == "mla_up_proj" and plan.model.mla))


def recomputes_modules(plan, layer: int) -> bool:
    """Whether some of transformer layer `layer` reruns before its backward."""
    return bool(layer_modules(plan, layer))


def freed_tensors(plan, layer: int) -> frozenset[str]:
    """The saved tensors of layer `layer` its module recompute does not keep (module
    docstring)."""
    return frozenset(name for module in layer_modules(plan, layer) for name in _FREED[module])


def _mlp_block(graph) -> frozenset[int]:
    """Ids of a layer graph's MLP (an MoE layer's MoE) block: the nodes built after its
    pre-MLP norm and before the residual add of the block's output (the graph's last
    residual add), its collectives included."""
    norm = max(n.id for n in graph.nodes if n.name == "ffn_norm")
    add = max(n.id for n in graph.nodes if n.name == "residual_add")
    return frozenset(n.id for n in graph.nodes if norm < n.id < add)


def module_recompute_saved(graph, plan, layer: int) -> frozenset[int]:
    """Ids of the layer graph's nodes kept from the forward (all but the recomputed)."""
    modules = layer_modules(plan, layer)
    names = {n for module in modules for n in _NODES.get(module, ())}
    block = _mlp_block(graph) if {"moe", "mlp"} & set(modules) else frozenset()
    return frozenset(n.id for n in graph.nodes if n.name not in names and n.id not in block)
