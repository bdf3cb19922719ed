"""The router's small ops, kernel by kernel (workloads/moe/router_ops.py), against
Megatron-Core core_v0.16.0 (NVIDIA/Megatron-LM b0cc2706: router.py TopKRouter, moe_utils.py
RandomSTE / MoEAuxLossAutoScaler / save_to_aux_losses_tracker) with moe_router_fusion on
(Transformer Engine's fused router kernels, transformer_engine/pytorch/router.py), and the
reference rows' aux loss from Megatron-Bridge's model providers.
"""
from __future__ import annotations

from validation.reference_features import moe_block

from moe_small import E, T, layer_tasks, moe_plan


def _one(tasks, label):
    found = [t for t in tasks if t.label == label]
    assert len(found) == 1, (label, [t.label for t in tasks])
    return found[0]


def test_forced_balance_draws_random_logits_in_two_kernels_without_backward():
    tasks = layer_tasks(moe_plan(mesh={"ep": 4}, moe={"force_balance": True}))
    fwd = _one(tasks, "router_random.fwd")
    # logits.clone().normal_(): clone reads and writes the [T, E] bf16 logits, normal_
    # writes them again
    assert fwd.kernels == 2 and fwd.bytes == T * E * 2 * 3
    bwd = [t for t in tasks if t.label == "router_random.bwd"]
    assert all(t.kernels == 0 and t.bytes == 0 for t in bwd)   # RandomSTE passes it back
    # the top-k reads the random logits
    topk = _one(tasks, "router_topk.fwd")
    assert fwd.id in topk.deps
    assert not [t for t in layer_tasks(moe_plan(mesh={"ep": 4})) if "router_random" in t.label]


def test_aux_loss_kernels_as_megatron_runs_them_fused():
    tasks = layer_tasks(moe_plan(mesh={"ep": 4}, moe={"aux_loss": True}))
    # forward: fused scores, routing_map.sum, fused aux loss, tracker's divide and add
    assert _one(tasks, "router_aux_loss.fwd").kernels == 5
    # backward: ones_like and scale, aux-loss bwd, scores bwd, the logits' gradient sum
    assert _one(tasks, "router_aux_loss.bwd").kernels == 5


def test_each_router_kernel_costs_the_host_one_eager_launch():
    plan = moe_plan(mesh={"ep": 4}, moe={"force_balance": True, "aux_loss": True},
                    framework="megatron-core")
    tasks = layer_tasks(plan)   # lowering prices the host (workloads/host_cost.py)
    assert _one(tasks, "router_random.fwd").host_s == 2 * plan.host_kernel_s
    assert _one(tasks, "router_aux_loss.fwd").host_s == 5 * plan.host_kernel_s


def test_reference_rows_run_the_aux_loss_their_provider_sets():
    base = {"framework": "megatron-core", "moe_dispatcher": "alltoall", "ep": "8"}
    # Qwen3 MoE: "aux_loss" 1e-3; DeepSeek-V3: "seq_aux_loss" 1e-4; GPT-OSS: "none"
    assert moe_block({**base, "model": "qwen3-30b-a3b"}, 1)["aux_loss"] is True
    assert moe_block({**base, "model": "deepseek-v3"}, 1)["aux_loss"] is True
    assert "aux_loss" not in moe_block({**base, "model": "gpt-oss-120b"}, 1)
    assert "aux_loss" not in moe_block({**base, "model": "qwen3-30b-a3b",
                                        "framework": "torchtitan"}, 1)


def test_token_drop_masks_the_probabilities_in_eager_ops():
    tasks = layer_tasks(moe_plan(mesh={"ep": 4}, moe={"capacity_factor": 1.0}))
    fwd = _one(tasks, "router_token_drop.fwd")
    # topk over tokens, zeros_like, scatter, .bool(), probs * map (apply_router_token_dropping)
    assert fwd.kernels == 5 and fwd.bytes == T * E * 2 * 6.0
    assert _one(tasks, "router_token_drop.bwd").kernels == 1
    assert not [t for t in layer_tasks(moe_plan(mesh={"ep": 4})) if "token_drop" in t.label]
