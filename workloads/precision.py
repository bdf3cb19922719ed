"""Bytes per element of each tensor class in mixed-precision training (one place)."""

ACT_BYTES = 2          # activations in bf16 (also under fp8 GEMMs, as Transformer Engine)
PARAM_BYTES = 2        # bf16 compute copy of the weights (what FSDP gathers)
# Gradients are reduced in fp32: torchtitan's default mixed_precision_reduce = "float32"
# and Megatron-LM's default main_grad accumulation in fp32.
GRAD_REDUCE_BYTES = 4
