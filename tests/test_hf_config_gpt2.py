"""A GPT-2 config.json (transformers' GPT2Config names) read as a GPT-style model.

GPT2Config (src/transformers/models/gpt2/configuration_gpt2.py): n_embd, n_layer, n_head,
n_inner (None: 4 x n_embd, GPT2MLP), resid_pdrop (default 0.1). modeling_gpt2.py: Conv1D
layers with biases, a learned position table (wpe), dropout before each residual add,
lm_head tied to wte. The dict is the openai-community/gpt2 config.json's keys.
"""
from __future__ import annotations

import pytest

from workloads.errors import WorkloadError
from workloads.hf_config import HF_IGNORED_KEYS, model_from_dict

GPT2_SMALL = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257}


def test_gpt2_config_is_a_gpt_style_model():
    m = model_from_dict(GPT2_SMALL)
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads) == (768, 12, 12, 12)
    assert m.ffn_size == 4 * 768 and m.mlp == "gelu" and m.tie_word_embeddings
    assert m.linear_bias and m.hidden_dropout and m.position_embedding == "learned_absolute"


def test_gpt2_without_residual_dropout_and_with_n_inner():
    m = model_from_dict({**GPT2_SMALL, "resid_pdrop": 0.0, "n_inner": 2048})
    assert not m.hidden_dropout and m.ffn_size == 2048 and m.linear_bias
    with pytest.raises(WorkloadError, match="resid_pdrop"):
        model_from_dict({**GPT2_SMALL, "resid_pdrop": "0.1"})


def test_other_model_types_keep_rope_no_bias_no_dropout():
    llama = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 1024,
             "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 4096,
             "vocab_size": 32000, "attention_dropout": 0.0}
    m = model_from_dict(llama)
    assert m.mlp == "swiglu" and not m.linear_bias and not m.hidden_dropout
    assert m.position_embedding == "rope"


def test_ignore_reasons_do_not_claim_what_is_read():
    assert "n_inner" not in HF_IGNORED_KEYS and "resid_pdrop" not in HF_IGNORED_KEYS
    assert "not priced" in HF_IGNORED_KEYS["attn_pdrop"]
