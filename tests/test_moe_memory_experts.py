"""Saved activations of fused gated experts (workloads/activations.py).

Megatron-LM's TEGroupedMLP (megatron/core/transformer/moe/experts.py at d7288711ba, core
0.17) keeps per routed copy fc1's input (d), the fused weighted SwiGLU's input (fc1's 2f
output) and fc2's input (f): 3 tensors of the expert width, like the dense fused MLP; the
eager per-op count keeps 4.
"""
from __future__ import annotations

from workloads.activations import activation_bytes_per_layer
from workloads.model_presets import PRESETS

GPT_OSS = PRESETS["gpt-oss-120b"]


def _layer(model, kernels: str, moe: bool = True) -> float:
    return activation_bytes_per_layer(model, 4096, 4, moe=moe, kernels=kernels)


def test_fused_experts_keep_three_tensors_of_the_expert_width():
    # eager - fused = one f-wide bf16 tensor per routed copy: top_k x 2 bytes x f per token
    tokens = 4096 * 4
    drop = GPT_OSS.experts_per_token * 2 * GPT_OSS.moe_ffn_size * tokens
    assert _layer(GPT_OSS, "eager") - _layer(GPT_OSS, "fused") == drop


def test_fused_expert_tensors_are_three_quarters_of_the_eager_ones():
    # the expert MLP tensors alone: fused 3 x 2f, eager 4 x 2f bytes per copy
    k, f, tokens = GPT_OSS.experts_per_token, GPT_OSS.moe_ffn_size, 4096 * 4
    eager_mlp = k * 4 * 2 * f * tokens
    assert _layer(GPT_OSS, "fused") == _layer(GPT_OSS, "eager") - eager_mlp / 4


def test_dense_layers_do_not_move():
    dense = PRESETS["llama3-8b"]
    fused, eager = _layer(dense, "fused", moe=False), _layer(dense, "eager", moe=False)
    # the dense fused SwiGLU already kept 3 tensors of the FFN width (unchanged rule)
    assert eager - fused == 2 * dense.ffn_size * 4096 * 4
