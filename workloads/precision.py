"""Bytes per element of each tensor class, by training dtype (one place).

Mixed precision (bf16, fp8): activations and the weights' compute copy in bf16 (also
under fp8 GEMMs, as Transformer Engine keeps them), GEMM operands in the GEMM dtype.
Gradients are reduced in fp32: torchtitan's default mixed_precision_reduce = "float32" and
Megatron-LM's default main_grad accumulation in fp32. fp32 training keeps everything in
fp32 (what the CPU validation runs use).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Bytes per element: activations, gathered weights, GEMM operands, reduced grads,
    and the per-parameter model states (ZeRO paper, arXiv:1910.02054, section 3.1)."""

    act_bytes: int
    param_bytes: int
    gemm_bytes: int
    grad_reduce_bytes: int
    param_state_bytes: int      # the weights as the model holds them
    grad_state_bytes: int       # the gradients as accumulated
    optimizer_state_bytes: int  # Adam: fp32 master (mixed precision only), m and v


# Mixed-precision Adam: 2 + 2 + 12 = 16 bytes per parameter; fp32 Adam: 4 + 4 + 8 = 16.
_MIXED = dict(act_bytes=2, param_bytes=2, grad_reduce_bytes=4, param_state_bytes=2,
              grad_state_bytes=2, optimizer_state_bytes=12)
PRECISIONS = {
    "bf16": Precision(gemm_bytes=2, **_MIXED),
    "fp8": Precision(gemm_bytes=1, **_MIXED),
    "fp32": Precision(act_bytes=4, param_bytes=4, gemm_bytes=4, grad_reduce_bytes=4,
                      param_state_bytes=4, grad_state_bytes=4, optimizer_state_bytes=8),
}


def precision(dtype: str) -> Precision:
    """The byte sizes of a training dtype (bf16, fp8 or fp32)."""
    return PRECISIONS[dtype]
