"""The loss's working set: how many vocabulary-wide fp32 tensors the cross-entropy holds.

The output layer's logits are the largest tensors of a step (tokens x vocab / t), and how
many copies of them coexist depends on how the framework computes the cross-entropy, which
the plan's `"loss": {"kernels": "fused" | "eager"}` says for the torch frameworks (generic,
torchtitan; by default the model's `kernels`):

- Eager (`cross_entropy(pred.flatten(0, 1).float(), labels)` outside torch.compile, as
  torchtitan's train.py at 9dec370 and every torchtitan before bbb1b616e runs it) is ATen's
  `cross_entropy_loss` = `log_softmax` + `nll_loss` (aten/src/ATen/native/LossNLL.cpp).
  `log_softmax` saves its fp32 output for the backward (tools/autograd/derivatives.yaml:
  `_log_softmax_backward_data(grad, result, ...)`); the backward allocates
  `nll_loss_backward`'s dense fp32 gradient and then `_log_softmax_backward_data`'s fp32
  result while the saved output is still held: three fp32 copies at the backward's peak
  (the forward holds the bf16 logits, their fp32 copy and the output: 2.5).
- Eager with TP: torchtitan runs the loss under `loss_parallel` on vocabulary-sharded
  logits (torch/distributed/tensor/parallel/loss.py): `_nll_loss_and_log_softmax_backward`
  holds the saved log-softmax output, `zeros_like(x)`, `exp(x)` and their sum at once: four
  fp32 copies (its forward `_log_softmax` holds the bf16 logits, the fp32 copy, `shifted`
  and `exp(shifted)`: 3.5).
- Compiled (torchtitan from bbb1b616e, pull request 1033, 2025-04-02: "Enable compiling the
  loss function ... result in reduction of memory", `torch.compile(loss_fn)` under
  `--training.compile`; `compile.components` "loss" from 08b8b244f): Inductor fuses the
  up-cast, log-softmax and NLL. The compiled graph saves the bf16 logits themselves and two
  fp32 statistics per token (the row maximum and the log-sum-exp), and its backward writes
  the bf16 gradient in one kernel: the peak holds 2 + 2 bytes per logit, one fp32 copy's
  worth (tests/test_loss_memory.py measures both forms with torch on the CPU). Under TP the
  compiled `loss_parallel` form is not measured: assumption, its eager count (four).
- Megatron (megatron-core, megatron-lm) and generic TP > 1: one fp32 copy. Korthikanti et
  al. (arXiv:2205.05198) section 4.3 count the logits once (4sbv/t), as Megatron's fused
  vocab-parallel cross-entropy, which works in place
  (megatron/core/tensor_parallel/cross_entropy.py), keeps them.
"""
from __future__ import annotations

from .framework_traits import traits
from .precision import FP32_BYTES

TORCH_CE_FP32_COPIES = 3            # ATen log_softmax + nll_loss backward (see above)
TORCH_LOSS_PARALLEL_FP32_COPIES = 4  # DTensor loss_parallel backward (see above)
FUSED_CE_FP32_COPIES = 1            # Korthikanti section 4.3; Megatron's in-place kernel;
                                    # the compiled loss's bf16 logits + bf16 gradient


def fp32_logits_copies(framework: str, tp: int, loss_kernels: str) -> int:
    """Vocabulary-wide fp32 tensors the cross-entropy holds at its peak (the backward)."""
    loss = traits(framework)
    if loss.dtensor_loss_parallel and tp > 1:
        return TORCH_LOSS_PARALLEL_FP32_COPIES
    if loss.torch_cross_entropy and tp == 1 and loss_kernels == "eager":
        return TORCH_CE_FP32_COPIES
    return FUSED_CE_FP32_COPIES


def fp32_logits_bytes(tokens: int, vocab_size: int, tp: int) -> float:
    """One fp32 copy of a micro-batch's vocabulary-parallel logits on one rank."""
    return FP32_BYTES * tokens * vocab_size / tp
