"""Hugging Face config.json (and ModelSpec-keyed) model files to a ModelSpec.

Every key of a file either sets a ModelSpec field (HF_KEYS), is read by a rule below
(INTERPRETED_KEYS), or is known not to change a training step's work or memory as
modelled here (HF_IGNORED_KEYS, each with its reason). Any other key is an error, so that
a misspelt size is not silently left at its default. The keys are those of transformers'
configuration classes (src/transformers/models/<model>/configuration_<model>.py) for
Llama, Mistral, Mixtral, Qwen2, Qwen3 and Qwen3 MoE, GPT-2, DeepSeek-V3 and GPT-OSS.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from .errors import WorkloadError
from .model_spec import ModelSpec

# Hugging Face config.json key -> ModelSpec field (ModelSpec's own names are accepted too).
HF_KEYS = {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
           "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
           "intermediate_size": "ffn_size", "vocab_size": "vocab_size",
           "tie_word_embeddings": "tie_word_embeddings", "head_dim": "head_dim",
           "mlp": "mlp", "name": "name", "num_local_experts": "num_experts",
           "n_routed_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
           "n_shared_experts": "num_shared_experts", "moe_intermediate_size": "moe_ffn_size",
           "first_k_dense_replace": "first_dense_layers",
           # group-limited routing (DeepseekV3Config; workloads/moe/group_routing.py)
           "n_group": "expert_groups", "topk_group": "expert_groups_per_token",
           # multi-head latent attention (DeepseekV3Config)
           "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
           "qk_nope_head_dim": "qk_nope_head_dim", "qk_rope_head_dim": "qk_rope_head_dim",
           "v_head_dim": "v_head_dim",
           # sliding-window attention (MistralConfig, GptOssConfig)
           "sliding_window": "sliding_window", "layer_types": "layer_types",
           # GptOssConfig: both GLU halves clamped at this value (workloads/expert_epilogue.py)
           "swiglu_limit": "glu_clamp",
           # GPT2Config's own names (its attribute_map gives the others as aliases)
           "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
           "n_inner": "ffn_size"}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")

# Keys read by a rule of model_from_dict, with the values it can express.
INTERPRETED_KEYS = {
    "model_type": "gpt2: a GeLU MLP (n_inner, default 4 x n_embd), biases on the linears "
                  "(GPT2's Conv1D layers), learned absolute positions (wpe), hidden "
                  "dropout where resid_pdrop > 0 (workloads/bias_dropout.py); gpt_oss: attention sinks (transformers' GptOssAttention "
                  "holds a sinks parameter of num_attention_heads) and expert biases "
                  "(GptOssExperts' gate_up_proj_bias, down_proj_bias) and YaRN RoPE "
                  "(Megatron-Core's position_embedding_type yarn); qwen3, qwen3_moe: an "
                  "RMSNorm over each query and key head (transformers' Qwen3Attention q_norm, "
                  "k_norm: qk_norm); llama, mistral, mixtral, qwen2, qwen2_moe, deepseek_v3: gated "
                  "SiLU; any other type is refused (KNOWN_MODEL_TYPES)",
    "hidden_act": "with model_type, the MLP (swiglu unless gpt2)",
    "use_sliding_window": "false drops sliding_window (Qwen2/Qwen3 MoE: transformers sets "
                          "it to None); true needs layer_types",
    "decoder_sparse_step": "1 (Qwen3 MoE: every layer MoE)",
    "mlp_only_layers": "[] (Qwen3 MoE: no dense layers among the MoE ones)",
    "moe_layer_freq": "1 (DeepSeek: every layer after first_k_dense_replace is MoE)",
    "topk_method": "greedy drops n_group / topk_group (a plain top-k that ignores them: "
                   "DeepSeek-V2-Lite's, the MoEGate of deepseek-ai's modeling_deepseek.py); "
                   "group_limited_greedy and noaux_tc keep them",
    "resid_pdrop": "gpt2: > 0 (GPT2Config's default 0.1) sets hidden_dropout, the dropout "
                   "before each residual add",
}

_IGNORED_BY_REASON = {
    "metadata, tokens and dtypes": (
        "_name_or_path", "architectures", "torch_dtype", "dtype", "transformers_version",
        "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "description",
        "use_cache", "task_specific_params", "quantization_config"),
    "initialisation and numerics (no work or memory)": (
        "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
        "activation_function", "scale_attn_weights", "reorder_and_upcast_attn",
        "scale_attn_by_inverse_layer_idx", "pretraining_tp"),
    "positions: RoPE's frequencies and the position table's or the longest context's "
    "size, not the trained sequence": (
        "max_position_embeddings", "n_positions", "n_ctx", "rope_theta", "rope_scaling",
        "rope_parameters", "rope_interleave", "initial_context_length"),
    "dropout not priced: inside the fused attention kernel (workloads/bias_dropout.py: "
    "about 3 % of that kernel) or once per step on the embedding": (
        "attention_dropout", "embd_pdrop", "attn_pdrop"),
    "biases on some projections only (Llama's attention_bias, mlp_bias; GPT-OSS's): under "
    "0.1 % of the parameters and FLOPs; their gradient reductions, priced for a model with "
    "biases on every linear (linear_bias, workloads/bias_dropout.py), are not priced": (
        "attention_bias", "mlp_bias"),
    "router losses, scoring and scaling: the same GEMMs, top-k and dispatch": (
        "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
        "aux_loss_alpha", "seq_aux", "norm_topk_prob", "scoring_func",
        "routed_scaling_factor", "ep_size"),
    "the checkpoint's multi-token-prediction modules: training with MTP is the model key "
    "mtp_layers (Megatron-LM's --mtp-num-layers is likewise a training option)": (
        "num_nextn_predict_layers",),
    "only meaningful with use_sliding_window true, which needs layer_types": (
        "max_window_layers",),
    "GPT-2 sequence-summary heads (classification, not the LM)": (
        "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout"),
}
# Known keys that do not change a training step's work or memory here: key -> reason.
HF_IGNORED_KEYS = {key: reason for reason, keys in _IGNORED_BY_REASON.items() for key in keys}

# MoE layer-layout keys and the one value each that the model expresses.
_LAYOUT_KEYS = {"decoder_sparse_step": 1, "moe_layer_freq": 1, "mlp_only_layers": []}
# Model types with attention sinks (transformers' modeling_gpt_oss.py).
_SINK_MODEL_TYPES = ("gpt_oss",)
# Qwen3Attention and Qwen3MoeAttention always hold q_norm and k_norm (no config key)
_QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")
# The transformers model types whose decoder layer is a pre-norm block of attention and a
# (gated) MLP or MoE, which the keys above and the rules of _apply_rules describe (a part
# they cannot say is refused by its own key: Qwen2-MoE's shared_expert_intermediate_size).
# Another type may carry a layer these keys cannot see (OLMo 2 normalises after each
# block and over the full q / k projections; Gemma 3 adds post-attention and
# post-feedforward norms and its own q / k norms): loaded as Llama it would price a
# different model, so it is refused.
KNOWN_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                     "qwen3_moe", "gpt2", "deepseek_v3", "gpt_oss")


def model_from_dict(raw: dict[str, Any], default_name: str = "custom") -> ModelSpec:
    """A ModelSpec from HF-style keys (also accepts ModelSpec field names).

    Unknown keys are rejected; errors name the key as the file writes it.
    """
    if not isinstance(raw, dict):
        raise WorkloadError("model", raw, "a JSON object with Hugging Face config keys")
    by_field = {f.name for f in fields(ModelSpec)}
    values: dict[str, Any] = {}
    written: dict[str, str] = {}     # ModelSpec field -> the key the file used
    for key, value in raw.items():
        target = HF_KEYS.get(key, key if key in by_field else None)
        if target is None:
            if key not in HF_IGNORED_KEYS and key not in INTERPRETED_KEYS:
                raise WorkloadError(f"model.{key}", value, "keys of a Hugging Face config "
                                    "(" + ", ".join(sorted(HF_KEYS)) + ") or ModelSpec fields")
            continue
        if value is not None:
            if target in values and values[target] != value:   # two names, one field
                raise WorkloadError(f"model.{key}", value,
                                    f"{values[target]!r}, as {written[target]} sets it")
            values[target] = value
            written[target] = key
    hidden = values.get("hidden_size")
    if raw.get("model_type") == "gpt2" and hidden is not None:
        if not isinstance(hidden, int) or isinstance(hidden, bool):
            raise WorkloadError(f"model.{written['hidden_size']}", hidden, "a positive integer")
        values.setdefault("ffn_size", 4 * hidden)   # GPT2MLP's default
    for key in REQUIRED:
        if HF_KEYS[key] not in values:
            raise WorkloadError(f"model.{key}", None, "a positive integer (required)")
    values.setdefault("num_kv_heads", values["num_heads"])
    values.setdefault("name", default_name)
    _apply_rules(raw, values)
    try:
        return ModelSpec(**values)
    except WorkloadError as exc:
        name = exc.field.removeprefix("model.")
        if name in written and written[name] != name:
            raise WorkloadError(f"model.{written[name]}", exc.value, exc.allowed) from None
        raise


def _gpt2(raw: dict[str, Any], values: dict[str, Any]) -> None:
    """GPT-2 (transformers' modeling_gpt2.py): GPT2MLP is c_fc, GeLU, c_proj; every Conv1D
    has a bias; positions are the learned wpe table; the output layer is wte; GPT2Block drops out (resid_pdrop,
    default 0.1) each branch before its residual add."""
    if "mlp" not in raw:
        values["mlp"] = "gelu"
    values.setdefault("linear_bias", True)
    values.setdefault("position_embedding", "learned_absolute")
    values.setdefault("tie_word_embeddings", True)   # GPT2LMHeadModel ties lm_head to wte
    dropout = raw.get("resid_pdrop", 0.1)
    if (isinstance(dropout, bool) or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1):
        raise WorkloadError("model.resid_pdrop", dropout, "a number in [0, 1)")
    values.setdefault("hidden_dropout", dropout > 0)


def _apply_rules(raw: dict[str, Any], values: dict[str, Any]) -> None:
    """The INTERPRETED_KEYS: MLP kind, sinks, sliding-window switches, MoE layouts."""
    model_type = raw.get("model_type")
    if model_type is not None and model_type not in KNOWN_MODEL_TYPES:
        raise WorkloadError("model.model_type", model_type,
                            "one of " + ", ".join(KNOWN_MODEL_TYPES) + ", or no model_type "
                            "(other architectures' layers are not modelled)")
    if "hidden_act" in raw and "mlp" not in raw:
        # HF Llama/Mistral/Qwen use gated SiLU (3 matrices)
        values["mlp"] = "swiglu"
    if model_type == "gpt2":
        _gpt2(raw, values)
    if model_type in _QK_NORM_MODEL_TYPES:
        values.setdefault("qk_norm", True)
    if model_type in _SINK_MODEL_TYPES:
        values.setdefault("attention_sinks", True)
        values.setdefault("expert_bias", True)
        values.setdefault("position_embedding", "yarn")   # GptOssConfig rope_scaling yarn
    if (values.get("kv_lora_rank") and "head_dim" in values
            and values["head_dim"] == values.get("qk_rope_head_dim")):
        # transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim (the RoPE part)
        values.pop("head_dim")
    if raw.get("topk_method") == "greedy":
        values.pop("expert_groups", None)
        values.pop("expert_groups_per_token", None)
    use_window = raw.get("use_sliding_window")
    if use_window is False:
        values.pop("sliding_window", None)
    elif use_window is not None and (use_window is not True or "layer_types" not in raw):
        raise WorkloadError("model.use_sliding_window", use_window,
                            "false, or true with layer_types (which layers slide)")
    for key, allowed in _LAYOUT_KEYS.items():
        if key in raw and raw[key] != allowed:
            raise WorkloadError(f"model.{key}", raw[key], INTERPRETED_KEYS[key]
                                + "; other layer layouts are not modelled")
