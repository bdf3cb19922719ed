"""Per-head query and key RMSNorms (model.qk_norm): Qwen3's q_norm / k_norm.

transformers' Qwen3Attention (and Qwen3MoeAttention) apply an RMSNorm of head_dim weights
to every query and key head after the projections and before RoPE; Megatron-Bridge's Qwen3
bridges set Megatron-Core's qk_layernorm (src/megatron/bridge/models/qwen/qwen3_bridge.py,
qwen3_moe_bridge.py), whose q_layernorm / k_layernorm are Transformer Engine RMSNorms.
"""
from __future__ import annotations

import pytest

from workloads import WorkloadError, plan_from_dict, resolve
from workloads.activations import activation_bytes_per_layer
from workloads.hf_config import model_from_dict
from workloads.lowering import lower
from workloads.model_presets import PRESETS
from workloads.params import layer_param_groups

from conftest import small_plan

QWEN3_MOE_CONFIG = {   # the keys of Qwen/Qwen3-30B-A3B's config.json that size the model
    "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "vocab_size": 151936, "hidden_act": "silu",
    "tie_word_embeddings": False}


def test_qwen3_configs_and_presets_have_the_norms_and_others_do_not():
    assert model_from_dict(QWEN3_MOE_CONFIG).qk_norm
    assert model_from_dict({**QWEN3_MOE_CONFIG, "model_type": "qwen3"}).qk_norm
    assert not model_from_dict({**QWEN3_MOE_CONFIG, "model_type": "qwen2_moe"}).qk_norm
    assert PRESETS["qwen3-30b-a3b"].qk_norm and PRESETS["qwen3-235b-a22b"].qk_norm
    assert not PRESETS["llama3-8b"].qk_norm


def _plan(qk_norm, tp=1, **over):
    model = {**small_plan()["model"], "qk_norm": qk_norm}
    return resolve(plan_from_dict(small_plan(model=model, mesh={"tp": tp}, **over)), 8)


@pytest.mark.parametrize("tp", [1, 2])
def test_each_layer_norms_its_local_query_and_key_heads(tp):
    on, off = (lower(_plan(q, tp)).stages[0] for q in (True, False))
    norms = {t.op: t for t in on if t.layer == 1 and t.microbatch == 0
             and t.phase == "forward" and t.op in ("q_headnorm", "k_headnorm")}
    assert set(norms) == {"q_headnorm", "k_headnorm"}
    assert not any(t.op.endswith("headnorm") for t in off)
    m = _plan(True, tp).model
    # one read and one write of the rank's q and k (16 and 8 heads of 64, over TP)
    tokens = 2048
    assert norms["q_headnorm"].bytes == pytest.approx(2 * tokens * m.q_size / tp * 2)
    assert norms["k_headnorm"].bytes == pytest.approx(2 * tokens * m.kv_size / tp * 2)
    # each norm has a backward, and RoPE reads the normed q
    backward = [t for t in on if t.layer == 1 and t.microbatch == 0 and t.phase == "backward"
                and t.op.endswith("headnorm")]
    assert len(backward) == 2
    ropes = {t.op: t for t in on if t.layer == 1 and t.microbatch == 0
             and t.phase == "forward" and t.op in ("rope", "rope_k")}
    assert norms["q_headnorm"].id in ropes["rope"].deps
    assert norms["k_headnorm"].id in ropes["rope_k"].deps


@pytest.mark.parametrize("sp", [False, True])
def test_their_gradients_reduce_over_tp_with_or_without_sequence_parallelism(sp):
    # each TP rank norms its own heads with the whole weight: its gradient is partial over
    # TP (Megatron-Core finalize_model_grads.py all-reduces q_layernorm / k_layernorm over
    # TP, core_v0.15.0)
    sharding = {"sequence_parallel": sp}
    on, off = (layer_param_groups(_plan(q, 2, sharding=sharding), 1) for q in (True, False))
    diff = {k: on.get(k, 0.0) - off.get(k, 0.0) for k in set(on) | set(off)}
    m = _plan(True, 2).model
    assert {k: v for k, v in diff.items() if v} == {
        next(k for k in on if "tp" in k): 2 * m.head_dim}


def test_the_norms_add_their_weights_and_saved_inputs():
    m_on, m_off = _plan(True).model, _plan(False).model
    assert m_on.layer_vector_params() - m_off.layer_vector_params() == 2 * m_on.head_dim
    saved = [activation_bytes_per_layer(m, 2048, 1, tp=2) for m in (m_on, m_off)]
    assert saved[0] - saved[1] == pytest.approx(2048 * 2 * (m_on.q_size + m_on.kv_size) / 2)


def test_what_the_norms_cannot_combine_with_is_refused():
    mla = {**small_plan()["model"], "qk_norm": True, "kv_lora_rank": 256,
           "num_key_value_heads": 16,
           "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 64}
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(model=mla))
    assert err.value.field == "model.qk_norm"
    grid = {p: "tp2d" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(model={**small_plan()["model"], "qk_norm": True},
                                          mesh={"tp": 4}, sharding=grid,
                                          training={"global_batch": 8, "micro_batch": 2})), 8)
    assert err.value.field == "model.qk_norm"
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(model={**small_plan()["model"], "qk_norm": "yes"}))
    assert err.value.field == "model.qk_norm"
