"""The FLOP counts publishers use to turn a model TFLOP/s figure into a step time: the
reference CSV's `flops_formula` column names one (default "megatron")."""
from __future__ import annotations


def model_flops_per_step(plan) -> float:
    """6 x matmul params x tokens + causal attention (fwd 2 s^2 d per layer, x3), per step."""
    m, tr = plan.model, plan.training
    tokens = tr.global_batch * tr.seq_len
    params = m.num_layers * m.layer_matmul_params() + m.vocab_size * m.hidden_size
    attention = 3 * 2 * m.num_layers * tr.seq_len * m.q_size * tokens
    return 6.0 * params * tokens + attention


def narayanan_flops_per_step(plan) -> float:
    """Narayanan et al. 2021 (arXiv:2104.04473) section 5.1, with recomputation:
    96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
    m, tr = plan.model, plan.training
    b, s, l, h, v = tr.global_batch, tr.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def nemo_llama2_flops_per_step(plan) -> float:
    """NeMo nemo/utils/flops_formulas.py `llama2`: causal attention counted half. NeMo's
    `llama3` is the same count (its vocabulary, 128256, is the model's)."""
    m, tr = plan.model, plan.training
    b, s, l, h = tr.global_batch, tr.seq_len, m.num_layers, m.hidden_size
    return b * s * l * h * h * (12 + 12 * m.num_kv_heads / m.num_heads + 18 * m.ffn_size / h
                                + 12 * s / h * 0.5 + 6 * m.vocab_size / (l * h))


def nemo_llama2_full_flops_per_step(plan) -> float:
    """NeMo's `llama2` count as it stood before NVIDIA/NeMo commit 6251117 (2025-08-09,
    "Discount FLOPs in dot-product att", #14424): causal attention counted in full
    (12 s / h), as in the tables NeMo published before it."""
    m, tr = plan.model, plan.training
    return nemo_llama2_flops_per_step(plan) + (tr.global_batch * tr.seq_len * m.num_layers
                                               * m.hidden_size * 6.0 * tr.seq_len)


FLOPS = {"megatron": model_flops_per_step, "narayanan": narayanan_flops_per_step,
         "nemo-llama2": nemo_llama2_flops_per_step,
         "nemo-llama2-full": nemo_llama2_full_flops_per_step}
