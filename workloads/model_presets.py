"""Bundled model presets, each with the published source of its sizes.

The Hugging Face config.json files cited are those published in each model's repository
on the Hub; the transformers configuration classes (src/transformers/models/<model>/
configuration_<model>.py) give the same keys and their meaning.
"""
from __future__ import annotations

from .model_spec import FULL, SLIDING, ModelSpec

# DeepSeek-V3 (arXiv:2412.19437 section 4.2; deepseek-ai/DeepSeek-V3 config.json, the
# defaults of transformers' DeepseekV3Config): 61 layers, d 7168, 128 heads; MLA with a
# query latent of 1536, a KV latent of 512, head dims 128 (no RoPE) + 64 (RoPE) for q and
# k and 128 for v; the first 3 layers dense (FFN 18432), then 1 shared + 256 routed
# experts of FFN 2048 (SwiGLU), top-8; vocab 129280. 671B parameters, 37B activated
# per token (report, abstract). MTP depth 1 in training (section 4.2): off in
# "deepseek-v3", on in "deepseek-v3-mtp". Node-limited routing (section 2.1.2): 8 expert
# groups, a token's experts from 4 of them (config.json n_group 8, topk_group 4).
_DEEPSEEK_V3 = dict(hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128,
                    ffn_size=18432, vocab_size=129280, num_experts=256, experts_per_token=8,
                    num_shared_experts=1, moe_ffn_size=2048, first_dense_layers=3,
                    expert_groups=8, expert_groups_per_token=4,
                    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128)

# Qwen3 MoE (Qwen3 technical report, arXiv:2505.09388 Table 2; Qwen/Qwen3-30B-A3B and
# Qwen/Qwen3-235B-A22B config.json): every layer MoE (decoder_sparse_step 1, no
# mlp_only_layers), 128 experts, top-8, no shared expert, head_dim 128 given explicitly,
# vocab 151936, untied embeddings, an RMSNorm over each query and key head
# (transformers' Qwen3MoeAttention q_norm / k_norm). Model cards: 30.5B total / 3.3B
# activated, 235B / 22B.
_QWEN3_MOE = dict(num_kv_heads=4, vocab_size=151936, head_dim=128, num_experts=128,
                  experts_per_token=8, qk_norm=True)

PRESETS: dict[str, ModelSpec] = {
    # Llama 3 paper Table 3: 8B: 32 layers, d 4096, FFN 14336 (6144*... per config.json),
    # 32 heads, 8 KV heads, vocab 128000 (+256 special tokens = 128256 in config.json).
    "llama3-8b": ModelSpec("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
    # 70B: 80 layers, d 8192, FFN 28672, 64 heads, 8 KV heads.
    "llama3-70b": ModelSpec("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
    # 405B: 126 layers, d 16384, FFN 53248, 128 heads, 8 KV heads.
    "llama3-405b": ModelSpec("llama3-405b", 16384, 126, 128, 8, 53248, 128256),
    # GPT-3 175B (Brown et al. Table 2.1): 96 layers, d 12288, 96 heads of 128, FFN 4d,
    # BPE vocab 50257; tied input/output embeddings; GeLU MLP; learned absolute positions
    # (NeMo's megatron_gpt_config.yaml position_embedding_type learned_absolute, which the
    # GPT-3 recipes keep). Biases on every linear and
    # dropout 0.1 (Megatron-Core's add_bias_linear and hidden_dropout defaults, which NeMo's
    # GPT-3 configs keep: dgxc-benchmarking gpt3_175b_hydra.yaml; workloads/bias_dropout.py).
    "gpt3-175b": ModelSpec("gpt3-175b", 12288, 96, 96, 96, 49152, 50257, mlp="gelu",
                           tie_word_embeddings=True, linear_bias=True, hidden_dropout=True,
                           position_embedding="learned_absolute"),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088, Table 1; mistralai/Mixtral-8x7B-v0.1
    # config.json): 32 layers, d 4096, 32 heads, 8 KV heads, 8 experts of FFN 14336 (SwiGLU),
    # top-2, vocab 32000; every layer is MoE. 46.7B parameters.
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, num_experts=8,
                              experts_per_token=2, moe_ffn_size=14336),
    # Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1 config.json): 56 layers, d 6144, 48 heads,
    # 8 KV heads, 8 experts of FFN 16384 (SwiGLU), top-2, vocab 32000, no sliding window.
    # Mistral AI's announcement (mistral.ai/news/mixtral-8x22b): 141B parameters, 39B active.
    "mixtral-8x22b": ModelSpec("mixtral-8x22b", 6144, 56, 48, 8, 16384, 32000, num_experts=8,
                               experts_per_token=2, moe_ffn_size=16384),
    "deepseek-v3": ModelSpec("deepseek-v3", **_DEEPSEEK_V3),
    "deepseek-v3-mtp": ModelSpec("deepseek-v3-mtp", **_DEEPSEEK_V3, mtp_layers=1),
    # Qwen3-30B-A3B: 48 layers, d 2048, 32 heads, expert FFN 768 (dense FFN 6144 unused).
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", hidden_size=2048, num_layers=48, num_heads=32,
                               ffn_size=6144, moe_ffn_size=768, **_QWEN3_MOE),
    # Qwen3-235B-A22B: 94 layers, d 4096, 64 heads, expert FFN 1536 (dense FFN 12288 unused).
    "qwen3-235b-a22b": ModelSpec("qwen3-235b-a22b", hidden_size=4096, num_layers=94,
                                 num_heads=64, ffn_size=12288, moe_ffn_size=1536,
                                 **_QWEN3_MOE),
    # GPT-OSS-120B (OpenAI's gpt-oss model card, arXiv:2508.10925 section 2; openai/
    # gpt-oss-120b config.json, the defaults of transformers' GptOssConfig): 36 layers,
    # d 2880, 64 query heads and 8 KV heads of 64, 128 experts of FFN 2880 (SwiGLU), top-4,
    # vocab 201088; layers alternate a 128-token sliding window and full attention, the
    # first windowed; a learned sink logit per head. 116.83B total, 5.13B active (model
    # card Table 1). The q/k/v/o and expert biases' parameters and FLOPs are not counted
    # (0.04B, under 0.1 %); the expert biases' eager kernels and the GLU clamp (config.json
    # swiglu_limit 7.0) are priced (workloads/expert_epilogue.py), and YaRN RoPE
    # (rope_scaling yarn, factor 32) runs unfused in Megatron-Core (workloads/yarn_rope.py).
    "gpt-oss-120b": ModelSpec("gpt-oss-120b", 2880, 36, 64, 8, 2880, 201088, head_dim=64,
                              num_experts=128, experts_per_token=4, sliding_window=128,
                              layer_types=tuple(SLIDING if i % 2 == 0 else FULL
                                                for i in range(36)),
                              attention_sinks=True, glu_clamp=7.0, expert_bias=True,
                              position_embedding="yarn"),
}
