"""The router's small ops between its GEMM and the dispatcher, counted kernel by kernel.

Megatron-Core's TopKRouter (megatron/core/transformer/moe/router.py and moe_utils.py at
NVIDIA/Megatron-LM b0cc2706, core_v0.16.0, the commit Megatron-Bridge 21b02e0cfb pins as
3rdparty/Megatron-LM) with moe_router_fusion on, as every Megatron-Bridge performance
script of the scored MoE rows sets it (scripts/performance/configs/{qwen,gpt_oss,deepseek}/
*_llm_pretrain.py at 21b02e0cfb, 97ad8cc6fb, f9b6319e58; qwen3_30b_a3b_llm_pretrain.yaml at
6725f70495), so top-k, scores and the aux loss are Transformer Engine's fused kernels
(transformer_engine/pytorch/router.py: one tex call per forward and per backward):

- forced balance (--moe-router-force-load-balancing, TopKRouter.forward -> moe_utils
  apply_random_logits -> RandomSTE): `logits.clone().normal_()` under the expert-parallel
  RNG fork, two kernels over the [tokens, experts] logits (clone reads and writes them,
  normal_ writes them again); its backward returns the gradient as it is (no kernel). The
  RNG fork saves and restores the generator's state on the host (no kernel, not priced).
- the load-balancing loss (TopKRouter.routing, `if self.training and ... is_aux_loss_
  enabled()`; _apply_aux_loss / _apply_seq_aux_loss, attach_and_log_load_balancing_loss),
  forward: fused_compute_score_for_moe_aux_loss (1), get_tokens_per_expert_and_token_
  count's routing_map.sum(dim=0) (1; its all-reduce over TP x CP is a no-op at one rank
  and not priced), fused_moe_aux_loss (1), and save_to_aux_losses_tracker's `aux_loss /
  coeff` and `values[layer - 1] += loss` (2): 5 kernels. Backward: MoEAuxLossAutoScaler.
  backward's `torch.ones_like(aux_loss) * scale` (2), fused_moe_aux_loss's backward (1),
  the fused scores' backward (1), and autograd's sum of the logits' two gradients (top-k
  path and aux-loss path) (1): 5 kernels. seq_aux_loss (DeepSeek-V3) runs the same calls on
  reshaped views (its `/ bsz` left out).

- token drop (moe_expert_capacity_factor set: TopKRouter.routing -> moe_utils.apply_router_
  token_dropping, unfused PyTorch; the same ops sat inside topk_softmax_with_capacity in
  earlier releases): torch.topk over the token axis (counted as one kernel; a capacity
  above the tokens takes ones_like instead, priced the same), zeros_like, scatter,
  .bool() and the probabilities masked (`routing_probs * final_map`): 5 kernels forward;
  backward the mask's product (1).

Each op is a memory-bound event with these launches; the host pays the framework's eager
per-kernel time for each (workloads/host_cost.py). The bytes are small ([tokens, experts]
tensors: a few MB a micro-batch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernels import FUSED_BACKWARD_FACTOR

if TYPE_CHECKING:  # pragma: no cover
    from ..layer_graph import LayerGraph, Node

RANDOM_LOGITS_LAUNCHES = 2          # clone, normal_ (RandomSTE.forward)
AUX_LOSS_LAUNCHES = 5               # forward, listed above
AUX_LOSS_BACKWARD_LAUNCHES = 5      # backward, listed above
TOKEN_DROP_LAUNCHES = 5             # topk, zeros_like, scatter, bool, mul
TOKEN_DROP_BACKWARD_LAUNCHES = 1    # the mul's gradient
# token drop's passes over the [tokens, experts] probabilities: topk, .bool() and the mul
# read them (3), zeros_like / scatter, .bool() and the mul write (about 3)
TOKEN_DROP_RW = (3.0, 3.0)
# The aux loss's passes over the [tokens, experts] gate, in activation-sized tensors:
# the scores and routing map read (1.5), nothing of that size written.
AUX_LOSS_RW = (1.5, 0.0)


def random_logits(g: "LayerGraph", plan, logits: "Node") -> "Node":
    """Forced balance's random logits (RandomSTE) in place of the router's, or `logits`
    unchanged without forced balance."""
    if not plan.moe.force_balance:
        return logits
    return g.elementwise("router_random", [logits], rw=(1.0, 2.0),
                         launches=RANDOM_LOGITS_LAUNCHES, backward=(0.0, 0))


# NeMo AutoModel's FakeBalancedGate.forward (nemo_automodel/components/moe/layers.py at
# 89e3a9fdd): weights = torch.ones(T, k) / k in fp32 (torch's default dtype) then
# .type_as(x), indices = arange(T k).view(T, k) % E in int64: five kernels (ones, the
# division, arange, the remainder, the cast). Per slot: the weights written (4 B), read
# and written by the division (8 B), read and cast to the activation width (4 B + act);
# the indices written by arange (8 B), read and written by the remainder (16 B). Nothing
# to differentiate (the weights are constants).
ROUND_ROBIN_LAUNCHES = 5
INDEX_BYTES = 8
WEIGHT_BYTES = 4     # torch.ones's default dtype, fp32


def round_robin_gate(g: "LayerGraph", plan, x: "Node") -> "Node":
    """The round-robin gate's weights and indices for the tokens `x` (moe.gate
    "round_robin", workloads/moe_options.py): a memory-bound op priced in passes over x."""
    m, act = plan.model, g.shape.act_bytes
    per_slot = 4 * WEIGHT_BYTES + act + 3 * INDEX_BYTES
    passes = m.experts_per_token * per_slot / (m.hidden_size * act)
    return g.elementwise("router_round_robin", [x], rw=(0.0, passes),
                         launches=ROUND_ROBIN_LAUNCHES, backward=(0.0, 0))


def aux_loss(g: "LayerGraph", plan, gate: "Node") -> list["Node"]:
    """The load-balancing loss's events on the router's output, when the plan runs it."""
    if not plan.moe.aux_loss:
        return []
    passes = sum(AUX_LOSS_RW)
    return [g.elementwise("router_aux_loss", [gate], rw=AUX_LOSS_RW,
                          launches=AUX_LOSS_LAUNCHES,
                          backward=(passes * FUSED_BACKWARD_FACTOR,
                                    AUX_LOSS_BACKWARD_LAUNCHES))]


def token_drop(g: "LayerGraph", plan, gate: "Node") -> "Node":
    """The capacity mask applied to the router's output (apply_router_token_dropping),
    or `gate` unchanged without a capacity factor."""
    if plan.moe.capacity_factor is None:
        return gate
    return g.elementwise("router_token_drop", [gate], rw=TOKEN_DROP_RW,
                         launches=TOKEN_DROP_LAUNCHES,
                         backward=(2.0 * FUSED_BACKWARD_FACTOR, TOKEN_DROP_BACKWARD_LAUNCHES))
