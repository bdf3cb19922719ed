"""Training-framework profiles: what `"framework"` in a plan sets by default.

A profile gives the defaults of the plan keys a framework decides for its users (the
overlap flags, FSDP's version and resharding, kernels, optimizer implementation, ZeRO
stage, recompute, CUDA graphs, host overhead); a key the plan gives overrides it. Each
default carries the framework code or documentation it is read from. `generic` sets
nothing: it is the simulator's behaviour before profiles existed.

The profile is applied when a plan file is parsed (`workloads.plan.plan_from_dict`); the
Plan then holds the resolved values, so `dataclasses.replace(plan, framework=...)` changes
the name only, not the defaults already applied.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

# Plan keys a profile may set (the Plan field names), with the generic default of each:
# the simulator's behaviour before profiles, where gradients are reduced per unit as
# soon as the unit's backward has produced them (PyTorch DDP's and FSDP's hooks).
GENERIC_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "fsdp_prefetch": True, "async_tp": False, "grad_reduce_overlap": True,
    "grad_bucket": "unit",
    "param_gather_overlap": False, "tp_comm_overlap": False,
    "fsdp": False, "fsdp_version": 2, "reshard_after_forward": True,
    "kernels": "fused", "optimizer": "fused", "zero_stage": 0, "recompute": "none",
    "cuda_graphs": False, "host_step_s": 0.0, "host_kernel_s": 0.0,
})

# PyTorch eager dispatch costs the host on the order of 10 us per operator (Python, the
# dispatcher, the CUDA launch; H. He, "Making Deep Learning Go Brrrr From First
# Principles", 2022, section "Overhead"). Assumption: 10 us per kernel launch issued from
# Python when the step is not captured in a CUDA graph.
EAGER_HOST_KERNEL_S = 10e-6

MEGATRON_CORE: Mapping[str, Any] = MappingProxyType({
    # Transformer Engine / Apex fused kernels for norms, RoPE, SwiGLU, cross-entropy
    # (Megatron-LM megatron/core/transformer: TENorm, fused_apply_rotary_pos_emb,
    # bias_swiglu_impl, fused vocab-parallel cross-entropy).
    "kernels": "fused",
    # Apex/TE FusedAdam (megatron/core/optimizer/__init__.py imports FusedAdam as Adam).
    "optimizer": "fused",
    # The distributed optimizer: optimizer states sharded over DP, gradients reduce-
    # scattered, parameters all-gathered (Megatron-Bridge recipes set
    # `use_distributed_optimizer=True`; docs/source/api-guide/dist_optimizer.md).
    "zero_stage": 1,
    # Megatron-Bridge's CommOverlapConfig turns on overlap_grad_reduce and
    # overlap_param_gather with the distributed optimizer at DP > 1, and tp_comm_overlap
    # in the performance recipes (bridge/training/comm_overlap.py; the flags are
    # `--overlap-grad-reduce`, `--overlap-param-gather`, `--tp-comm-overlap` of
    # megatron/training/arguments.py). tp_comm_overlap only acts with TP > 1 and
    # sequence parallelism, which Transformer Engine's userbuffers require.
    "grad_reduce_overlap": True, "param_gather_overlap": True, "tp_comm_overlap": True,
    # DDP buckets of max(40M, 1M x dp) parameters (workloads/ddp_buckets.py).
    "grad_bucket": "megatron",
    # TransformerConfig.enable_cuda_graph defaults to False
    # (megatron/core/transformer/transformer_config.py); recipes that graph set it.
    "cuda_graphs": False,
    # Megatron's Python issues every kernel eagerly as well (fewer, fused ones).
    "host_kernel_s": EAGER_HOST_KERNEL_S,
})

TORCHTITAN: Mapping[str, Any] = MappingProxyType({
    # compile.enable defaults to False: PyTorch eager kernels (torchtitan
    # torchtitan/config/job_config.py, class Compile).
    "kernels": "eager",
    # optimizer.implementation defaults to "fused" (job_config.py, class Optimizer:
    # Literal["for-loop", "foreach", "fused"] = "fused").
    "optimizer": "fused",
    # FSDP2 (fully_shard) over data_parallel_shard_degree = -1, i.e. every DP rank
    # (job_config.py, class Parallelism); fsdp_reshard_after_forward "default": reshard
    # unless pipeline parallelism is on (models/llama3/infra/parallelize.py, apply_fsdp).
    "fsdp": True, "fsdp_version": 2, "reshard_after_forward": True,
    # The Llama 3 train configs use activation_checkpoint mode "selective" with
    # selective_ac_option "op" (models/llama3/train_configs/llama3_8b.toml).
    "recompute": "selective_op",
    # compile.enable_async_tensor_parallel defaults to False (job_config.py).
    "async_tp": False,
    # No CUDA graphs in torchtitan's training loop; eager Python issues each kernel.
    "cuda_graphs": False, "host_kernel_s": EAGER_HOST_KERNEL_S,
})

PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "generic": MappingProxyType({}), "megatron-core": MEGATRON_CORE, "torchtitan": TORCHTITAN,
})
FRAMEWORKS = tuple(PROFILES)


def framework_defaults(name: str) -> dict[str, Any]:
    """The Plan field defaults under a framework profile (generic's, overridden by it)."""
    return {**GENERIC_DEFAULTS, **PROFILES[name]}
