"""GPT-OSS's eager expert epilogue under Megatron-Core (workloads/expert_epilogue.py)
and its unfused YaRN RoPE (workloads/yarn_rope.py).

Sources: openai/gpt-oss-120b config.json (swiglu_limit 7.0, expert biases); Megatron-LM
core_v0.15.0-core_v0.17.0 megatron/core/fusions/fused_bias_geglu.py
weighted_bias_quick_geglu_impl (eager clamp of both halves, torch.cat, torch.tensor of
the linear offset on the device) and megatron/core/transformer/moe/experts.py
TEGroupedMLP._apply_bias (per-expert t + b * p, torch.cat); PyTorch Copy.cu
(memcpy_and_sync for a blocking host-to-device copy); Megatron-Bridge utils/fusions.py
validate_rope_fusion_compatibility (no RoPE fusion for position_embedding_type yarn) and
Megatron-LM rope_utils.py _apply_rotary_pos_emb_bshd.
"""
from __future__ import annotations

import csv

import pytest

from validation.reference_rows import DEFAULT_CSV, plan_dict
from workloads import plan_from_dict, resolve
from workloads.expert_epilogue import CLAMP_SYNC_LABEL
from workloads.lowering import lower
from workloads.model_presets import PRESETS as MODEL_PRESETS
from workloads.errors import WorkloadError
from workloads.model_spec import ModelSpec


def _row(rid: str) -> dict[str, str]:
    with open(DEFAULT_CSV, newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == rid)


def _layer_tasks(rid: str, gpu: str, layer: int = 10):
    plan = plan_from_dict(plan_dict(_row(rid)))
    tasks = [t for t in lower(plan, gpu).tasks() if t.layer == layer and t.microbatch == 0]
    return plan, {(t.phase, t.op): t for t in tasks}, tasks


def test_gpt_oss_preset_has_clamp_and_expert_bias():
    m = MODEL_PRESETS["gpt-oss-120b"]
    assert m.glu_clamp == 7.0 and m.expert_bias   # config.json swiglu_limit 7.0
    assert not MODEL_PRESETS["qwen3-30b-a3b"].glu_clamp


def test_glu_clamp_must_be_a_non_negative_number():
    with pytest.raises(WorkloadError):
        ModelSpec("x", 64, 2, 4, 4, 128, 1000, glu_clamp=-1.0)


def test_b200_row_prices_clamp_and_per_expert_bias():
    """mb-gptoss120b-b200-bf16-64: EP 8 -> 16 local experts, 4 x 4096 tokens x top-4 rows
    on a rank (force-balanced), hidden = expert FFN = 2880, bf16."""
    plan, by_op, _ = _layer_tasks("mb-gptoss120b-b200-bf16-64", "b200")
    local = plan.model.num_experts // plan.mesh.ep
    assert local == 16
    # one pass over the [rows, 2880] bf16 expert tensor: the fused activation's forward
    # reads two and writes one (rows: about 4 x 4096 x 4 on the hottest rank)
    one_pass = by_op[("forward", "swiglu")].bytes / 3
    assert one_pass == pytest.approx(4 * 4096 * 4 * 2880 * 2, rel=0.02)
    clamp_f, clamp_b = by_op[("forward", "glu_clamp")], by_op[("backward", "glu_clamp")]
    assert clamp_f.kernels == 4 and clamp_b.kernels == 9
    assert clamp_f.bytes == pytest.approx(8 * one_pass, rel=1e-6)
    assert clamp_b.bytes == pytest.approx(15 * one_pass, rel=1e-6)
    bias_f, bias_b = by_op[("forward", "expert_bias")], by_op[("backward", "expert_bias")]
    assert bias_f.kernels == 2 * local + 1 and bias_b.kernels == 4 * local + 2
    assert bias_f.bytes == pytest.approx(6 * one_pass, rel=1e-6)
    assert bias_b.bytes == pytest.approx(8 * one_pass, rel=1e-6)
    # the blocking copy of the linear offset: the host waits after the clamp's forward
    assert clamp_f.host_sync and clamp_f.label == CLAMP_SYNC_LABEL
    # the activation runs after the clamp, fc2 after the activation, the bias after fc2
    assert clamp_f.id in by_op[("forward", "swiglu")].deps
    assert by_op[("forward", "w2")].id in bias_f.deps


def test_flex_dispatcher_hands_the_bias_fp32_probabilities():
    """mb-gptoss120b-b200-bf16-64-hybridep: Megatron's flex dispatcher upcasts the routing
    probabilities to fp32 (_HybridEPManager.dispatch, core_v0.16.0-core_v0.17.0), so
    _apply_bias's b * p, sum and cat are fp32 and .to(bf16) casts back: 14 forward and 20
    backward passes over the bf16 [rows, H] output instead of 6 and 8."""
    plan, by_op, _ = _layer_tasks("mb-gptoss120b-b200-bf16-64-hybridep", "b200")
    assert plan.moe.dispatcher == "deepep" and plan.moe.flex_backend == "hybridep"
    local = plan.model.num_experts // plan.mesh.ep
    one_pass = by_op[("forward", "swiglu")].bytes / 3
    bias_f, bias_b = by_op[("forward", "expert_bias")], by_op[("backward", "expert_bias")]
    assert bias_f.bytes == pytest.approx(14 * one_pass, rel=1e-6)
    assert bias_b.bytes == pytest.approx(20 * one_pass, rel=1e-6)
    assert bias_f.kernels == 2 * local + 2 and bias_b.kernels == 6 * local + 3


def test_graphed_and_other_models_get_nothing():
    """A CUDA-graphed GPT-OSS step runs Transformer Engine's fused ops (op fuser); Qwen3
    has neither clamp nor expert bias."""
    for rid, gpu in (("mb-gptoss120b-gb200-mxfp8-64", "gb200"),
                     ("mb-qwen3-30b-b200-mxfp8-8", "b200")):
        _, by_op, tasks = _layer_tasks(rid, gpu)
        assert not {op for _, op in by_op} & {"glu_clamp", "expert_bias"}, rid
        assert not any(t.label == CLAMP_SYNC_LABEL for t in tasks)


def test_gpt_oss_yarn_rope_runs_unfused_under_megatron_core():
    """q: 4 x 4096 tokens x 64 heads x 64 (bf16); 12 passes in 12 launches forward (6 on
    q, 6 on the frequencies), 13 passes in 7 kernels backward, against 2 passes fused."""
    plan, by_op, _ = _layer_tasks("mb-gptoss120b-b200-bf16-64", "b200")
    assert plan.model.position_embedding == "yarn"
    q_bytes = 4 * 4096 * 64 * 64 * 2
    fwd, bwd = by_op[("forward", "rope")], by_op[("backward", "rope")]
    assert fwd.bytes == pytest.approx(12 * q_bytes) and fwd.kernels == 12
    assert bwd.bytes == pytest.approx(13 * q_bytes) and bwd.kernels == 7
    assert by_op[("forward", "rope_k")].bytes == pytest.approx(12 * q_bytes / 8)   # 8 KV heads
    _, qwen, _ = _layer_tasks("mb-qwen3-30b-b200-mxfp8-8", "b200")
    assert qwen[("forward", "rope")].kernels == 1   # plain RoPE stays TE's fused kernel


def test_position_embedding_is_rope_or_yarn():
    with pytest.raises(WorkloadError):
        ModelSpec("x", 64, 2, 4, 4, 128, 1000, position_embedding="alibi")


def test_recompute_modules_rerun_norm_and_moe_act():
    """Megatron-Bridge's GPT-OSS configs recompute ["layernorm", "moe_act"] with
    granularity selective from v0.3.0 (overrides.py _set_recompute_overrides): the MoE
    layer's pre-MLP norm and the experts' clamp + activation run again before the
    backward, with the linear offset's blocking copy; nothing else reruns."""
    plan, _, tasks = _layer_tasks("mb-gptoss120b-b200-bf16-64", "b200")
    assert plan.recompute == "none" and plan.recompute_modules == ("layernorm", "moe_act")
    rerun = {t.op: t for t in tasks if t.phase == "recompute"}
    assert set(rerun) == {"ffn_norm", "glu_clamp", "swiglu"}
    fwd = {t.op: t for t in tasks if t.phase == "forward"}
    for op, task in rerun.items():
        assert task.bytes == pytest.approx(fwd[op].bytes), op
    assert rerun["glu_clamp"].host_sync
    # the 25.11 rows set the modules without the granularity: no recompute
    _, _, tasks = _layer_tasks("mb-gptoss120b-b200-bf16-64-gbs512", "b200")
    assert not [t for t in tasks if t.phase == "recompute"]


def test_recompute_modules_are_checked():
    raw = plan_dict(_row("mb-gptoss120b-b200-bf16-64"))
    for bad in (["core_attn"], "moe_act"):      # "selective" is the attention core's
        with pytest.raises(WorkloadError):
            plan_from_dict({**raw, "recompute_modules": bad})
    with pytest.raises(WorkloadError, match="'mlp' is not one"):   # GPT-OSS: no dense layer
        resolve(plan_from_dict({**raw, "recompute_modules": ["mlp"]}), 64)
    with pytest.raises(WorkloadError):
        plan_from_dict({**raw, "recompute": "full"})
