"""The loss's working set: how many vocabulary-wide fp32 tensors the cross-entropy holds.

The output layer's logits are the largest tensors of a step (tokens x vocab / t), and how
many copies of them coexist depends on how the framework computes the cross-entropy:

- torchtitan (train.py at 9dec370: `cross_entropy(pred.flatten(0, 1).float(), labels)`,
  not compiled) runs ATen's `cross_entropy_loss` = `log_softmax` + `nll_loss`
  (aten/src/ATen/native/LossNLL.cpp). `log_softmax` saves its fp32 output for the backward
  (tools/autograd/derivatives.yaml: `_log_softmax_backward_data(grad, result, ...)`); the
  backward allocates `nll_loss_backward`'s dense fp32 gradient and then
  `_log_softmax_backward_data`'s fp32 result while the saved output is still held: three
  fp32 copies at the backward's peak (the forward holds the bf16 logits, their fp32 copy and
  the output: 2.5).
- torchtitan with TP runs the loss under `loss_parallel` on vocabulary-sharded logits
  (torch/distributed/tensor/parallel/loss.py): `_nll_loss_and_log_softmax_backward` holds
  the saved log-softmax output, `zeros_like(x)`, `exp(x)` and their sum at once: four fp32
  copies (its forward `_log_softmax` holds the bf16 logits, the fp32 copy, `shifted` and
  `exp(shifted)`: 3.5).
- Otherwise one fp32 copy: Korthikanti et al. (arXiv:2205.05198) section 4.3 count the
  logits once (4sbv/t), as Megatron's fused vocab-parallel cross-entropy, which works in
  place (megatron/core/tensor_parallel/cross_entropy.py), keeps them.
"""
from __future__ import annotations

from .precision import FP32_BYTES

TORCH_CE_FP32_COPIES = 3            # ATen log_softmax + nll_loss backward (see above)
TORCH_LOSS_PARALLEL_FP32_COPIES = 4  # DTensor loss_parallel backward (see above)
FUSED_CE_FP32_COPIES = 1            # Korthikanti section 4.3; Megatron's in-place kernel


def fp32_logits_copies(framework: str, tp: int) -> int:
    """Vocabulary-wide fp32 tensors the cross-entropy holds at its peak (the backward)."""
    if framework == "torchtitan":
        return TORCH_LOSS_PARALLEL_FP32_COPIES if tp > 1 else TORCH_CE_FP32_COPIES
    return FUSED_CE_FP32_COPIES


def fp32_logits_bytes(tokens: int, vocab_size: int, tp: int) -> float:
    """One fp32 copy of a micro-batch's vocabulary-parallel logits on one rank."""
    return FP32_BYTES * tokens * vocab_size / tp
