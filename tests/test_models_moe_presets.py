"""MoE model presets against their published parameter counts, MLA and sliding-window
attention against hand-computed FLOPs and bytes, config.json parsing and the plans that
cannot be combined with MLA or a window yet.

Published totals: DeepSeek-V3 technical report (arXiv:2412.19437, abstract): 671B total,
37B activated per token; Qwen3-30B-A3B / Qwen3-235B-A22B model cards (Qwen3 technical
report, arXiv:2505.09388): 30.5B / 3.3B activated and 235B / 22B activated; Mixtral 8x22B
(mistral.ai/news/mixtral-8x22b): 141B, 39B active; gpt-oss model card (arXiv:2508.10925,
Table 1): 116.83B total, 5.13B active.
"""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import WorkloadError, plan_from_dict, resolve
from workloads.attention import AttentionCost, causal_attention_flops
from workloads.lowering import lower
from workloads.memory import activation_bytes_per_layer
from workloads.models import PRESETS, model_from_dict
from workloads.params import layer_param_groups, model_flops, unit_param_groups
from workloads.schedules import HEAD

from conftest import small_plan


def _active(m, with_output=True, with_embedding=False):
    layers = sum(m.active_matmul_params_at(i) for i in range(m.num_layers))
    return (layers + (m.output_params() if with_output else 0)
            + (m.embedding_params() if with_embedding else 0))


# (preset, published total, published active, whether the source counts the input
# embedding among the active parameters, relative tolerance). Qwen's "activated" counts
# both embeddings (3.3B; 29.9B non-embedding of 30.5B); DeepSeek's 37B does too; the
# gpt-oss card counts the unembedding only.
PUBLISHED = [("deepseek-v3", 671e9, 37e9, True, 0.02),
             ("qwen3-30b-a3b", 30.5e9, 3.3e9, True, 0.02),
             ("qwen3-235b-a22b", 235e9, 22e9, True, 0.01),
             ("mixtral-8x22b", 141e9, 39e9, True, 0.01),
             ("gpt-oss-120b", 116.83e9, 5.13e9, False, 0.001)]


@pytest.mark.parametrize("name,total,active,with_embedding,rel", PUBLISHED)
def test_presets_match_published_parameter_counts(name, total, active, with_embedding, rel):
    m = PRESETS[name]
    assert m.total_params() == pytest.approx(total, rel=rel)
    assert _active(m, with_embedding=with_embedding) == pytest.approx(active, rel=rel)


def test_published_breakdowns():
    # Qwen3 model cards: 29.9B and 234B non-embedding parameters; gpt-oss model card
    # Table 1: attention 0.96B, embedding + unembedding 1.16B, MLP 114.71B (its 0.04B of
    # biases not modelled).
    for name, non_embedding in (("qwen3-30b-a3b", 29.9e9), ("qwen3-235b-a22b", 234e9)):
        m = PRESETS[name]
        assert m.total_params() - m.embedding_params() - m.output_params() == \
            pytest.approx(non_embedding, rel=0.005)
    m = PRESETS["gpt-oss-120b"]
    assert 36 * m.attention_matmul_params() == pytest.approx(0.96e9, rel=0.01)
    assert m.embedding_params() + m.output_params() == pytest.approx(1.16e9, rel=0.01)
    mlp = 36 * (m.hidden_size * 128 + 128 * m.expert_params())
    assert mlp == pytest.approx(114.71e9, rel=0.001)


def test_deepseek_v3_counts_by_hand():
    m = PRESETS["deepseek-v3"]
    d, heads = 7168, 128
    mla = (d * 1536 + 1536 * heads * 192 + d * (512 + 64) + 512 * heads * (128 + 128)
           + heads * 128 * d)
    assert mla == 187_105_280 == m.attention_matmul_params()
    expert = 3 * d * 2048
    dense = mla + 3 * d * 18432 + 2 * d + 1536 + 512
    moe = mla + d * 256 + 257 * expert + 2 * d + 1536 + 512
    total = 3 * dense + 58 * moe + 2 * 129280 * d + d
    assert m.total_params() == total == 671_026_404_352
    assert _active(m, with_embedding=True) == (
        3 * (mla + 3 * d * 18432) + 58 * (mla + d * 256 + 9 * expert) + 2 * 129280 * d)
    assert [m.is_moe_layer(i) for i in (2, 3)] == [False, True]


def test_gpt_oss_windows_alternate_and_sinks_are_counted():
    m = PRESETS["gpt-oss-120b"]
    assert [m.window_at(i) for i in range(4)] == [128, 0, 128, 0]
    attention = 2880 * 64 * 64 * 2 + 2 * 2880 * 8 * 64
    assert m.attention_matmul_params() == attention
    layer = attention + 2880 * 128 + 128 * 3 * 2880 * 2880 + 2 * 2880 + 64
    assert m.total_params() == 36 * layer + 2 * 201088 * 2880 + 2880


def test_mtp_modules_are_counted():
    # DeepSeek-V3 section 2.2: per depth two norms, M of 2d x d, one block and the output
    # head's norm; the embedding and output head shared. The released checkpoint's 685B
    # = 671B + 14B, its MTP module stored with its own copies of the embedding and head.
    base, mtp = PRESETS["deepseek-v3"], PRESETS["deepseek-v3-mtp"]
    d = 7168
    assert mtp.mtp_params() == 3 * d + 2 * d * d + base.layer_params_at(60)
    assert mtp.total_params() == base.total_params() + mtp.mtp_params()
    assert (mtp.total_params() + base.embedding_params() + base.output_params()) / 1e9 == \
        pytest.approx(685, rel=0.01)


MOE = {"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
       "first_k_dense_replace": 1}


def _head_tasks(prog):
    return [t for t in prog.stages[-1] if t.layer == -1 and t.microbatch == 0
            and t.label not in ("embedding.fwd", "embedding.bwd")]


def test_mtp_module_runs_in_the_output_layers_unit():
    plans = [resolve(plan_from_dict(small_plan(model={**MOE, "mtp_layers": n})), 8)
             for n in (0, 1)]
    base, mtp = (_head_tasks(lower(p)) for p in plans)
    d, vocab, tokens = 1024, 8192, TOKENS
    fwd = Counter(t.label for t in mtp if t.phase == "forward")
    assert fwd["output.fwd"] == 2 and fwd["mtp_proj.fwd"] == 1 and fwd["w1.fwd"] == 1
    proj = [t for t in mtp if t.label == "mtp_proj.fwd"][0]
    assert proj.flops == 2.0 * tokens * 2 * d * d
    assert Counter(t.label for t in base if t.phase == "forward")["output.fwd"] == 1
    # both losses start the backward: each output layer has its dgrad and wgrad
    assert Counter(t.label for t in mtp)["output.wgrad"] == 2
    # model FLOPs: M, the MoE block's active parameters and the output layer once more,
    # and one more layer of attention (8 sequences of 2048, 16 heads of 64)
    m = plans[1].model
    extra = 6.0 * 8 * 2048 * (2 * d * d + m.active_matmul_params_at(4) + vocab * d)
    extra += 3.0 * causal_attention_flops(8 * 2048, 2048, 64, 16)
    assert model_flops(plans[1]) - model_flops(plans[0]) == pytest.approx(extra)
    # the output layer's unit holds the MTP module's parameters (one stage, no TP or EP)
    held = [sum(unit_param_groups(p, HEAD).values()) for p in plans]
    assert held[1] - held[0] == m.mtp_params()


def test_mtp_with_a_tp_grid_exits_2():
    grid = {p: "tp2d" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(model={"mtp_layers": 1}, mesh={"tp": 4},
                                          sharding=grid, training={"micro_batch": 2})), 8)
    assert err.value.field == "model.mtp_layers"


# ---- MLA ------------------------------------------------------------------------------
MLA = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
       "num_key_value_heads": 16, "intermediate_size": 4096, "vocab_size": 8192,
       "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
       "qk_rope_head_dim": 32, "v_head_dim": 64}
TOKENS, SEQ = 2048, 2048


def _layer_tasks(tp=1, sp=False, model=MLA, **over):
    raw = small_plan(model=model, mesh={"tp": tp, **over.pop("mesh", {})},
                     sharding={"sequence_parallel": sp, **over.pop("sharding", {})}, **over)
    prog = lower(resolve(plan_from_dict(raw), 8))
    return prog, [t for t in prog.stages[0] if t.layer == 1 and t.microbatch == 0]


def test_mla_attention_flops_per_token_by_hand():
    # DeepSeek-V3: projections 2 x 187,105,280 FLOPs per token forward; the core at 4096
    # tokens, causal: 2 x (s/2) x (192 + 128) x 128 heads per query.
    m = PRESETS["deepseek-v3"]
    assert 2 * m.attention_matmul_params() == 374_210_560
    assert causal_attention_flops(1, 4096, 192, 128, v_head_dim=128) == 4096 * 320 * 128
    # MHA with the same heads would price 2 x 2 x (s/2) x 192 x 128 (v as wide as q, k).
    assert causal_attention_flops(1, 4096, 192, 128) == 4096 * 384 * 128


def test_mla_layer_tasks_without_tp():
    _, tasks = _layer_tasks()
    fwd = {t.label: t for t in tasks if t.phase == "forward" and t.kind == "compute"}
    d, heads = 1024, 16
    for name, (k, n) in {"wq_a": (d, 256), "wq_b": (256, heads * 96),
                         "wkv_a": (d, 128 + 32), "wkv_b": (128, heads * 128),
                         "wo": (heads * 64, d)}.items():
        assert fwd[f"{name}.fwd"].flops == 2.0 * TOKENS * k * n
        assert fwd[f"{name}.fwd"].gemm_mnk == (TOKENS, n, k)
    assert "wq.fwd" not in fwd and "wk.fwd" not in fwd and "wv.fwd" not in fwd
    assert fwd["attention.fwd"].flops == 2.0 * TOKENS * (SEQ / 2) * (96 + 64) * heads
    # flash HBM traffic: read q (96), k (96), v (64) per head, write o (64)
    assert fwd["attention.fwd"].bytes == TOKENS * heads * (96 + 96 + 64 + 64) * 2


def test_mla_tensor_parallel_split_follows_megatron():
    # Down projections whole on every rank, on the sequence shard under SP; the latents
    # (256 and 128 wide) and the 32-wide RoPE key are what is all-gathered, not h.
    _, tasks = _layer_tasks(tp=2, sp=True)
    fwd = {t.label: t for t in tasks if t.phase == "forward"}
    assert fwd["wq_a.fwd"].flops == 2.0 * (TOKENS / 2) * 1024 * 256
    assert fwd["wq_b.fwd"].flops == 2.0 * TOKENS * 256 * (16 * 96 / 2)
    gathers = Counter((t.label, t.bytes) for t in tasks
                      if t.op == "all_gather" and t.phase == "forward")
    assert gathers[("q_norm->R", TOKENS * 256 * 2)] == 1
    assert gathers[("kv_norm->R", TOKENS * 128 * 2)] == 1
    assert gathers[("rope_k->R", TOKENS * 32 * 2)] == 1
    assert not [t for t in tasks if t.label == "attention_norm->R"]
    # the shared RoPE key's gradient is a partial sum over the heads: reduce-scattered
    back = {t.label: t.op for t in tasks if t.phase == "backward" and t.group == ("tp",)}
    assert back["grad.rope_k"] == "reduce_scatter"
    assert back["grad.q_norm"] == "reduce_scatter"


def test_mla_parameter_groups_under_tp():
    plan = resolve(plan_from_dict(small_plan(model=MLA, mesh={"tp": 2},
                                             sharding={"sequence_parallel": True})), 8)
    groups = layer_param_groups(plan, 0)
    d = 1024
    down = d * 256 + d * 160
    split = (256 * 16 * 96 + 128 * 16 * 128 + 16 * 64 * d + 3 * d * 4096) / 2
    assert groups[("dp", "tp")] == down + 2 * d + 256 + 128    # + norms, latent norms
    assert groups[("dp",)] == split
    assert set(groups) == {("dp", "tp"), ("dp",)}
    assert plan.model.layer_params() == down + 2 * split + 2 * d + 256 + 128


def test_mla_memory_counts_latents_and_v_width():
    m = model_from_dict(MLA)
    s, b = 2048, 1
    h, q, k, v = 1024, 16 * 96, 16 * 96, 16 * 64
    # selective recompute keeps: norm inputs and qkv input (3h + mlp input h), q, k, v,
    # out_proj input (v), SwiGLU's four f-wide tensors, and the four latents.
    expected = 2 * s * b * (4 * h + q + k + v + v + 4 * 4096 + 2 * 256 + 2 * 128)
    assert activation_bytes_per_layer(m, s, b, recompute="selective") == expected


def test_mla_with_context_parallel_moves_per_head_k_and_v():
    _, tasks = _layer_tasks(mesh={"cp": 2}, context_parallel={"mode": "all_gather"})
    gather = [t for t in tasks if t.label == "cp.all_gather.kv"][0]
    # the gathered K and V of 2 CP ranks: tokens/cp x heads x (96 + 64) x 2 bytes each
    assert gather.bytes == 2 * (TOKENS / 2) * 16 * (96 + 64) * 2


# ---- sliding window -----------------------------------------------------------------
SW = {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2}


def test_sliding_window_flops_are_bounded_by_the_window():
    w, s = 128, SEQ
    per_query = w - w * w / (2 * s)       # s w - w^2/2 pairs over s queries
    assert causal_attention_flops(TOKENS, s, 64, 16, window=w) == \
        2.0 * TOKENS * per_query * 128 * 16
    assert causal_attention_flops(TOKENS, s, 64, 16, window=s) == \
        causal_attention_flops(TOKENS, s, 64, 16)
    prog = lower(resolve(plan_from_dict(small_plan(model=SW)), 8))
    fwd = {t.layer: t.flops for t in prog.stages[0]
           if t.label == "attention.fwd" and t.microbatch == 0}
    full = 2.0 * TOKENS * SEQ * 64 * 16
    assert fwd == {0: 2.0 * TOKENS * per_query * 128 * 16, 1: full,
                   2: 2.0 * TOKENS * per_query * 128 * 16, 3: full}
    plan = prog.plan
    dense = resolve(plan_from_dict(small_plan()), 8)
    saved = 3 * 2 * 8 * (full - fwd[0])      # 2 windowed layers, 8 sequences, fwd + bwd
    assert model_flops(dense) - model_flops(plan) == pytest.approx(saved)


def test_eager_attention_computes_and_masks_every_score():
    cost = AttentionCost(queries=TOKENS, keys=SEQ, heads=16, kv_heads=8, head_dim=64,
                         act_bytes=2, flash=False, window=128)
    assert cost.forward_flops == causal_attention_flops(TOKENS, SEQ, 64, 16)


def test_sinks_add_a_parameter_per_head_and_no_flops():
    plain = model_from_dict({**small_plan()["model"], **SW})
    sinks = model_from_dict({**small_plan()["model"], **SW, "model_type": "gpt_oss"})
    assert sinks.attention_sinks and not plain.attention_sinks
    assert sinks.total_params() - plain.total_params() == 4 * 16
    lowered = [lower(resolve(plan_from_dict(small_plan(model=m.to_dict())), 8))
               for m in (plain, sinks)]
    flops = [sum(t.flops for t in p.stages[0]) for p in lowered]
    assert flops[0] == flops[1]


# ---- config.json parsing ---------------------------------------------------------------
DEEPSEEK_V3_CONFIG = {   # deepseek-ai/DeepSeek-V3 config.json (sizes and switches)
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "hidden_act": "silu", "rope_theta": 10000, "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 40}, "torch_dtype": "bfloat16"}
QWEN3_30B_CONFIG = {   # Qwen/Qwen3-30B-A3B config.json
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "sliding_window": None,
    "use_sliding_window": False, "max_window_layers": 48, "vocab_size": 151936,
    "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 1000000.0}
GPT_OSS_120B_CONFIG = {   # openai/gpt-oss-120b config.json
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "experts_per_token": 4, "num_experts_per_tok": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "num_attention_heads": 64,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128,
    "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088, "rope_theta": 150000}
MIXTRAL_8X22B_CONFIG = {   # mistralai/Mixtral-8x22B-v0.1 config.json
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
    "hidden_size": 6144, "intermediate_size": 16384, "num_hidden_layers": 56,
    "num_attention_heads": 48, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "sliding_window": None, "vocab_size": 32000,
    "router_aux_loss_coef": 0.001, "rope_theta": 1000000, "tie_word_embeddings": False}


@pytest.mark.parametrize("config,preset", [
    (DEEPSEEK_V3_CONFIG, "deepseek-v3"), (QWEN3_30B_CONFIG, "qwen3-30b-a3b"),
    (GPT_OSS_120B_CONFIG, "gpt-oss-120b"), (MIXTRAL_8X22B_CONFIG, "mixtral-8x22b")])
def test_config_json_gives_the_preset(config, preset):
    parsed = model_from_dict({**config, "name": preset})
    assert parsed == PRESETS[preset]


def test_transformers_head_dim_alias_of_mla_is_the_rope_part():
    # transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim
    parsed = model_from_dict({**DEEPSEEK_V3_CONFIG, "head_dim": 64})
    assert parsed.head_dim == 192 and parsed.value_head_dim == 128


def test_mla_config_without_head_dims_names_the_missing_field():
    # kv_lora_rank given, neither head_dim nor qk_rope_head_dim: a field error, not a crash
    config = {k: v for k, v in DEEPSEEK_V3_CONFIG.items() if k != "qk_rope_head_dim"}
    with pytest.raises(WorkloadError) as err:
        model_from_dict(config)
    assert err.value.field == "model.qk_rope_head_dim"


@pytest.mark.parametrize("change,field", [
    ({"decoder_sparse_step": 2}, "model.decoder_sparse_step"),
    ({"mlp_only_layers": [0]}, "model.mlp_only_layers"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "model.use_sliding_window"),
    ({"qk_rope_head_dims": 64}, "model.qk_rope_head_dims"),
    ({"head_dim": 100, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "v_head_dim": 128, "num_key_value_heads": 32},
     "model.head_dim"),
    ({"layer_types": ["sliding_attention"] * 3}, "model.layer_types"),
    ({"num_local_experts": 64}, "model.num_local_experts"),     # num_experts says 128
])
def test_config_keys_outside_the_model_are_refused(change, field):
    with pytest.raises(WorkloadError) as err:
        model_from_dict({**QWEN3_30B_CONFIG, **change})
    assert err.value.field == field


def test_sliding_window_switched_off_by_use_sliding_window():
    assert model_from_dict(QWEN3_30B_CONFIG).sliding_window == 0
    mistral = model_from_dict({**small_plan()["model"], "sliding_window": 4096})
    assert [mistral.window_at(i) for i in range(4)] == [4096] * 4


# ---- plans that cannot combine yet ------------------------------------------------------
@pytest.mark.parametrize("over,field,words", [
    ({"mesh": {"tp": 4}, "sharding": {p: "tp2d" for p in
                                      ("wq", "wk", "wv", "wo", "w1", "w3", "w2")},
      "training": {"micro_batch": 2}}, "sharding", "TP grids"),
    ({"recompute": "selective_op"}, "recompute", "op-level"),
    ({"mesh": {"tp": 2}, "sharding": {"wv": "row"}}, "sharding.wv", "wkv_b"),
])
def test_mla_plans_that_cannot_combine_exit_2(over, field, words):
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(model=MLA, **over)), 8)
    assert err.value.field == field and words in str(err.value)


def test_sliding_window_with_ring_context_parallelism_exits_2():
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(model=SW, mesh={"cp": 2},
                                          context_parallel={"mode": "ring"})), 8)
    assert err.value.field == "context_parallel.mode"
    resolve(plan_from_dict(small_plan(model=SW, mesh={"cp": 2},
                                      context_parallel={"mode": "all_to_all"})), 8)


# ---- Megatron-LM flags ------------------------------------------------------------------
def test_megatron_mla_and_mtp_flags_round_trip():
    from workloads.jobs import read_megatron, write_megatron
    plan = plan_from_dict({"model": "deepseek-v3-mtp", "mesh": {"dp": "auto", "tp": 8},
                           "training": {"global_batch": 64, "micro_batch": 1,
                                        "seq_len": 4096}})
    text = write_megatron(plan).text
    assert "--multi-latent-attention" in text and "--mtp-num-layers 1" in text
    model = read_megatron(text, lenient=True).plan["model"]
    m = PRESETS["deepseek-v3-mtp"]
    assert {k: model[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                  "qk_rope_head_dim", "v_head_dim", "mtp_layers")} == \
        {"q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
         "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
         "v_head_dim": m.value_head_dim, "mtp_layers": 1}


def test_megatron_mla_without_its_sizes_is_refused():
    from workloads.jobs.megatron import read_megatron
    text = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
            "--multi-latent-attention --qk-head-dim 64 --qk-pos-emb-head-dim 32 "
            "--v-head-dim 64 --padded-vocab-size 8192 --seq-length 2048 --micro-batch-size 1 "
            "--global-batch-size 8")
    with pytest.raises(WorkloadError) as err:
        read_megatron(text, lenient=True)
    assert err.value.field == "--kv-lora-rank"
