"""Which data-parallel implementation a plan's gradients go through, by its sharding and
its framework's traits (workloads/framework_traits.py): one answer that the lowering,
the memory estimate and the plan checks share.

- "fsdp": FSDP1, FSDP2 or Megatron-FSDP (ZeRO-3): each unit's gradients reduce-scattered
  by the FSDP implementation (workloads/fsdp1.py, main_grad.py);
- "zero": ZeRO-1 / ZeRO-2, the gradients reduce-scattered to the optimizer's shards, once
  a step or every micro-batch (DeepSpeed's or Megatron's distributed optimizer, with
  their own buckets);
- "local_ddp": Megatron-LM 2020-2021's local DDP, which flattens, all-reduces and copies
  back after the backward (workloads/local_ddp.py), when the plan does not overlap the
  reduce;
- "torch_ddp": torch's DistributedDataParallel and its Reducer's bucket copies
  (workloads/torch_ddp.py), all-reducing whole gradients (ZeRO 0);
- "framework": the framework's own DDP (Megatron-Core's DistributedDataParallel over its
  main_grad buffers, workloads/main_grad.py).
"""
from __future__ import annotations

from .framework_traits import traits

FSDP, ZERO, LOCAL_DDP, TORCH_DDP, FRAMEWORK_DDP = (
    "fsdp", "zero", "local_ddp", "torch_ddp", "framework")
# The op of torch DDP's copy of a unit's gradients into its buckets (workloads/torch_ddp.py),
# named here, where the MoE overlap's ordering can read it without the lowering's imports.
DDP_COPY_IN = "ddp_copy_in"


def dp_impl(plan) -> str:
    """The plan's data-parallel implementation (module docstring)."""
    if plan.fsdp or plan.zero_stage == 3:
        return FSDP
    if plan.zero_stage in (1, 2):
        return ZERO
    framework = traits(plan.framework)
    if framework.local_ddp and not plan.grad_reduce_overlap:
        return LOCAL_DDP
    return TORCH_DDP if framework.torch_ddp else FRAMEWORK_DDP


def wraps_ddp(plan) -> bool:
    """Whether torch's DistributedDataParallel wraps a resolved plan's model: its data
    parallelism is torch's over a group of several ranks (dp x cp, params.weight_dp_dims)."""
    return dp_impl(plan) == TORCH_DDP and plan.mesh.dp * plan.mesh.cp > 1
