"""The vocabulary-parallel cross-entropy's collectives: with the output layer's logits
sharded over TP by vocabulary, each token's loss needs statistics of the whole row, which
every implementation all-reduces over the TP group (per token, fp32) in the forward; the
backward computes the gradient from the saved statistics without communication.

- torch's loss_parallel (generic, torchtitan; torch/distributed/tensor/parallel/loss.py):
  the max logit (_log_softmax: funcol.all_reduce, MAX), the sum of the shifted exponentials
  (SUM) and the target's logit (_nll_loss_forward: the _MaskPartial placement's reduction,
  SUM): 3.
- Megatron-LM of 2021 (mpu/cross_entropy.py, _VocabParallelCrossEntropy): the max, the
  predicted logit and the sum of exponentials: 3.
- Megatron-Core with cross_entropy_loss_fusion (megatron/core/fusions/
  fused_cross_entropy.py): the max, then the predicted logit and the sum of exponentials
  concatenated into one SUM of two values a token: 2 (loss.kernels "fused", the profile's
  default: Megatron-Bridge sets the flag on the models it converts, src/megatron/bridge/
  models/conversion/model_bridge.py). Without the flag (loss.kernels "unfused"), megatron/
  core/tensor_parallel/cross_entropy.py all-reduces 3 times, as Megatron-LM of 2021 did.
  Transformer Engine's parallel cross-entropy (cross_entropy_fusion_impl "te") gathers
  instead: priced as the native fused path (assumption).

torch's all-reduces are functional collectives called inside loss_parallel's op handlers,
Megatron's torch.distributed calls: none is a DTensor redistribution (Task.
direct_collective: a CPU host does not charge them its redistribution overhead).
"""
from __future__ import annotations

from .framework_traits import traits
from .precision import FP32_BYTES

UNFUSED_ALL_REDUCE_BYTES = (FP32_BYTES,) * 3    # per token: max, sum of exps, target logit


def loss_all_reduce_bytes(framework: str, loss_kernels: str) -> tuple[float, ...]:
    """Bytes per token of each all-reduce of one vocabulary-parallel cross-entropy's
    forward, in order (module docstring): fp32 statistics, one value a token each, the
    fused path's second carrying two."""
    if traits(framework).fused_vocab_parallel_loss and loss_kernels == "fused":
        return (FP32_BYTES, 2 * FP32_BYTES)
    return UNFUSED_ALL_REDUCE_BYTES
