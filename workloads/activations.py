"""Activation bytes one transformer layer, and the output layer, save for the backward.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198: section 4.1 (per-tensor count), Table 2 (per parallelism and recompute
mode), section 4.3 (output layer: 4sbh/t (1 + v/h)). workloads/memory.py puts these per-layer
counts into a rank's step memory.

Generalisation of Korthikanti section 4.1 beyond GPT (MHA, 4h GeLU MLP, dropout): the saved
tensors are counted one by one from the model's real widths (`_layer_tensors`), so GQA stores
K and V of kv_heads x head_dim instead of h, SwiGLU stores four f-wide tensors (eager PyTorch:
w1 output for SiLU, SiLU output and w3 output for the product, the product for w2) instead of
GeLU's two, and dropout masks and the dropout output exist only when the model trains with
dropout (GPT-style: yes; Llama-style: no, so its attention-scores term is 2as/h, not 5as/h).
Norms are fused and store only their input (2sbh), as in the paper. With the GPT-3 shape the
count is exactly sbh(34 + 5as/h); tests/test_memory.py checks it.
"""
from __future__ import annotations

from .checkpointing import op_checkpoint_features
from .models import ModelSpec
from .precision import BF16_BYTES
from .quantized_saves import quantized_saves


def _layer_tensors(model: ModelSpec, kv_seq: int, dropout: bool,
                   moe: bool = False, load_imbalance: float = 1.0,
                   fused_swiglu: bool = False) -> list[tuple[str, float, str]]:
    """Tensors one layer saves for its backward, bytes per token, with their TP class.

    Class "replicated": not split by TP, split over the sequence by SP; "sharded": split by
    TP; "scores": the a x s attention-score tensors (dropped by selective recompute).
    Korthikanti section 4.1 names, bf16 = 2 bytes, dropout masks 1 byte.
    """
    h, q, kv, a = model.hidden_size, model.q_size, model.kv_size, model.num_heads
    f = model.ffn_size
    t = [("attn_norm_input", 2 * h, "replicated"), ("qkv_input", 2 * h, "replicated"),
         ("q", 2 * q, "sharded"), ("k", 2 * kv, "sharded"),              # for QK^T
         ("softmax_output", 2 * a * kv_seq, "scores"),
         ("v", 2 * model.v_size, "sharded"), ("out_proj_input", 2 * model.o_size, "sharded"),
         ("mlp_norm_input", 2 * h, "replicated"), ("mlp_input", 2 * h, "replicated")]
    if model.mla:
        # MLA's latents: each RMSNorm keeps its input and each up-projection its (normed)
        # input, whole on every TP rank (sequence-sharded under SP: Transformer Engine's
        # sequence-parallel linear keeps its local input and gathers it again for wgrad).
        # q and k above are the per-head nope + rope features, v the v_head_dim ones.
        latents = (model.q_lora_rank, model.kv_lora_rank)
        t += [(f"{name}_latent_{use}", 2 * width, "replicated")
              for name, width in zip(("q", "kv"), latents) if width
              for use in ("norm_input", "up_input")]
    if model.qk_norm:
        # the per-head norms of q and k keep their inputs, the projections' outputs, which
        # nothing else keeps (RoPE and attention save the normed, rotated q and k above)
        t += [("q_norm_input", 2 * q, "sharded"), ("k_norm_input", 2 * kv, "sharded")]
    if model.mlp == "gelu":
        t += [("gelu_input", 2 * f, "sharded"), ("fc2_input", 2 * f, "sharded")]
    elif fused_swiglu:
        # A fused SwiGLU kernel keeps only its inputs (w1's and w3's outputs) and recomputes
        # silu in its backward; w2 keeps its input (Megatron-LM
        # megatron/core/fusions/fused_bias_swiglu.py: SwiGLUFunction saves its input only;
        # torch.compile fuses silu(a) * b alike): 3 tensors of f.
        t += [(n, 2 * f, "sharded") for n in ("w1_output", "w3_output", "w2_input")]
    else:
        # eager F.silu(w1(x)) * w3(x): silu's output is the product's saved input too
        t += [(n, 2 * f, "sharded") for n in ("w1_output", "silu_output", "w3_output", "w2_input")]
    if moe:
        # MoE approximation: each token's (top-k + shared) expert copies save their input and
        # their MLP tensors at the expert width; fp32 router logits; replaces the dense MLP.
        # The most loaded EP rank holds top_k x load_imbalance routed copies per local token.
        # Fused gated experts keep 3 tensors of the expert width, as the dense fused MLP:
        # Megatron-LM's TEGroupedMLP.forward (megatron/core/transformer/moe/experts.py at
        # d7288711ba, core 0.17) runs fc1, then weighted_bias_swiglu_impl /
        # weighted_bias_quick_geglu_impl, which save only their input (fc1's 2f output) and
        # the per-row probability, then fc2, which saves its input (f); fc1's output is not
        # kept by fc1 (TE GroupedLinear saves its input), and the unpermute that follows
        # gets no probabilities (they were applied in the activation), so it saves no rows.
        # The expert MLP's tensors split into fc2's input (one of the expert width) and
        # what the activation keeps of fc1's output (the others), as module recompute and
        # quantized saving treat them apart (workloads/module_recompute.py, memory.py).
        k = model.experts_per_token * load_imbalance + model.num_shared_experts
        gated = 3 if fused_swiglu else 4
        tensors = 2 if model.mlp == "gelu" else gated
        t = [x for x in t if x[0] not in ("gelu_input", "fc2_input", "w1_output",
                                          "silu_output", "w3_output", "w2_input")]
        t += [("router_logits", 4 * model.num_experts, "replicated"),
              ("expert_inputs", k * 2 * h, "replicated"),
              ("expert_act", k * (tensors - 1) * 2 * model.moe_ffn_size, "sharded"),
              ("expert_fc2_input", k * 2 * model.moe_ffn_size, "sharded")]
    if dropout:
        t += [("softmax_dropout_mask", a * kv_seq, "scores"),
              ("softmax_dropout_output", 2 * a * kv_seq, "scores"),
              ("attn_dropout_mask", h, "replicated"), ("mlp_dropout_mask", h, "replicated")]
    return t


def default_dropout(model: ModelSpec) -> bool:
    """Whether the model trains with dropout by default: its hidden_dropout (GPT-3 and
    Megatron-LM's GPT: 0.1; Llama, Nemotron and the MoE recipes: 0; workloads/
    bias_dropout.py), which also prices the dropout kernels."""
    return model.hidden_dropout


def activation_bytes_per_layer(model: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               dropout: bool | None = None, kv_seq_len: int | None = None,
                               moe: bool = False, load_imbalance: float = 1.0,
                               kernels: str = "eager", freed: frozenset[str] = frozenset(),
                               quantized_input_bytes: float | None = None) -> float:
    """Activation bytes one layer keeps for one micro-batch (Korthikanti et al. Table 2).

    GPT-style: none sbh(34 + 5as/h) with no TP, sbh(10 + 24/t + 5as/(ht)) with TP,
    sbh(34/t + 5as/(ht)) with TP + SP; selective drops the 5as/h term; full keeps the layer
    input 2sbh (Table 2), which SP stores sequence-sharded: 2sbh/t. seq_len is the local
    sequence (after CP); kv_seq_len the keys each query attends to (default seq_len);
    moe: an MoE layer of an MoE model (experts replace the dense MLP); kernels: "fused"
    SwiGLU keeps 3 tensors of the FFN width, "eager" (Korthikanti-style per-op count) 4;
    freed: tensors a module recompute does not keep (workloads/module_recompute.py);
    quantized_input_bytes: bytes per element of the GEMM inputs Transformer Engine keeps
    quantized under an FP8/FP4 recipe (workloads/quantized_saves.py; None: 16-bit).
    """
    if recompute not in ("none", "selective", "selective_op", "full"):
        raise ValueError(f"recompute must be none, selective, selective_op or full, "
                         f"got {recompute!r}")
    sb = seq_len * micro_batch
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":
        return BF16_BYTES * model.hidden_size * sb / sp_div
    if recompute == "selective_op" and not moe:
        return BF16_BYTES * sb * op_checkpoint_features(model, tp, sp_div)
    if recompute == "selective_op":
        recompute = "selective"   # assumption: MoE layers keep what selective keeps
    dropout = default_dropout(model) if dropout is None else dropout
    total = 0.0
    quantized = quantized_saves(model, moe) if quantized_input_bytes else ()
    for name, per_token, kind in _layer_tensors(model, kv_seq_len or seq_len, dropout, moe,
                                                load_imbalance, kernels == "fused"):
        if (kind == "scores" and recompute == "selective") or name in freed:
            continue
        if name in quantized:
            per_token *= quantized_input_bytes / BF16_BYTES
        total += per_token * sb / (sp_div if kind == "replicated" else tp)
    return total


def scores_bytes(model: ModelSpec, sb: int, kv_seq: int, tp: int, dropout: bool) -> float:
    """The a x s attention-score tensors of one layer (what selective recompute drops)."""
    return sum(b for _, b, k in _layer_tensors(model, kv_seq, dropout) if k == "scores") * sb / tp


def output_layer_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1,
                                  sequence_parallel: bool = False,
                                  gathered_input_saved: bool = False) -> float:
    """Final norm input, output-projection input and fp32 logits for the loss, one micro-batch.

    Korthikanti et al. section 4.3: 4sbh/t (1 + v/h) with TP + SP (the h terms are not split
    over TP without SP); the vocabulary-parallel logits are 4sbv/t. Megatron's sequence-
    parallel linear keeps its input sequence-sharded and gathers it again for its weight
    gradient; torch's DTensor ColwiseParallel keeps what its matmul ran on, the input
    all-gathered over the sequence (gathered_input_saved: 2sbh, not 2sbh/t).
    """
    sb, h = seq_len * micro_batch, model.hidden_size
    sp_div = tp if sequence_parallel else 1
    projection_input = 2 * sb * h / (1 if gathered_input_saved else sp_div)
    return 2 * sb * h / sp_div + projection_input + 4 * sb * model.vocab_size / tp
