"""What a rank keeps and reduces of its gradients and model states, in bytes per parameter:
the dtype a DDP or FSDP reduce moves, the accumulated gradient's, the sharded parameter's
and optimizer's (ZeRO's mixed-precision count, FSDP2's fp32 master, Megatron-Core's main_grad
buffer and precision-aware optimizer), a frozen base weight's. The memory estimate
(workloads/memory.py) and the stage lowering's reduces (workloads/stage_dp.py) read
them here, so the bytes held and the bytes moved come from one rule.
"""
from __future__ import annotations

from .framework_traits import traits
from .kernels import adam_table_bytes
from .main_grad import megatron_torch_fsdp
from .param_gathers import FP8_GATHER_BYTES
from .plan import Plan
from .precision import BF16_BYTES, FP32_BYTES, precision


def bucket_grad_bytes(plan: Plan, prec) -> float:
    """Bytes per parameter a DDP / ZeRO 1-2 gradient bucket reduces. Megatron-Core's DDP
    reduces its buffer in place, in the buffer's dtype (grad_state_bytes: fp32 only with
    ddp.grad_reduce_in_fp32). Megatron-LM of 2020-2021 reduces the parameters' fp16
    gradients: neither --fp32-allreduce (megatron/model/distributed.py allreduce_params
    @c63906a) nor --accumulate-allreduce-grads-in-fp32 (@6985e58938, _get_buffer_type) is
    on by default or set by the example scripts the references follow. Others (torch's
    DDP and the distributed optimizers of the generic plans): the precision's reduce
    dtype, fp32 under mixed precision (workloads/precision.py; an assumption for torch's
    DDP, whose Reducer reduces its buckets in the gradients' own dtype:
    workloads/torch_ddp.py)."""
    reduced = traits(plan.framework).grad_reduce_dtype
    if reduced == "param_grad":
        return prec.grad_state_bytes
    if reduced == "buffer":
        return grad_state_bytes(plan)
    return prec.grad_reduce_bytes


def grad_state_bytes(plan: Plan) -> float:
    """Bytes per accumulated gradient: the precision's, except Megatron-Core's DDP, whose
    gradient buffer (main_grad) is fp32 when grad_reduce_in_fp32 is set, as the
    Megatron-Bridge library recipes do (recipes/llama/h100/llama3.py:
    cfg.ddp.grad_reduce_in_fp32 = True), and the parameter's dtype when it is not, as the
    Bridge performance scripts set (`ddp.grad_reduce_in_fp32: false`, plan.grad_reduce_fp32;
    megatron/core/distributed/distributed_data_parallel.py at d7288711ba: grad_dtype =
    torch.float if grad_reduce_in_fp32 else param.dtype). FSDP2 keeps its reduced sharded
    gradient in the sharded parameter's dtype, fp32 (sharded_state_bytes)."""
    prec = precision(plan.training.dtype)
    megatron_buffer = ((traits(plan.framework).main_grad_buffer and not plan.fsdp
                        and plan.zero_stage < 3) or plan.fsdp_version == "megatron")
    if megatron_buffer:   # Megatron-FSDP's main_grads_dtype too (workloads/main_grad.py)
        return max(prec.grad_state_bytes, FP32_BYTES if plan.grad_reduce_fp32 else 0)
    if plan.fsdp and plan.fsdp_version == 2 and not megatron_torch_fsdp(plan) \
            and not model_params_16bit(plan):
        return max(prec.grad_state_bytes, FP32_BYTES)
    return prec.grad_state_bytes


def model_params_16bit(plan: Plan) -> bool:
    """Whether the framework trains a model built in its 16-bit dtype without an fp32
    master (framework_traits.model_params_16bit) under a mixed-precision dtype: FSDP2
    then shards 16-bit parameters and casts each reduced gradient back to their dtype
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce, to the
    sharded parameter's orig_dtype), and torch's Adam keeps its moments in it."""
    prec = precision(plan.training.dtype)
    return traits(plan.framework).model_params_16bit and prec.param_bytes < FP32_BYTES


def sharded_state_bytes(plan: Plan) -> tuple[float, float]:
    """(parameter, optimizer) bytes per parameter of the plan's model states.

    ZeRO's mixed-precision count keeps a bf16 working copy (2) besides Adam's fp32 master,
    momentum and variance (12). FSDP2 keeps no bf16 copy: its sharded parameter is the fp32
    master itself, cast to the MixedPrecisionPolicy's param_dtype only into the all-gather
    buffer (torch/distributed/fsdp/_fully_shard/_fsdp_param.py), so it holds 4 + 8 (Adam's
    two fp32 moments, in the parameter's dtype); its reduced sharded gradient is fp32 too,
    which keeps the 16 bytes per parameter of the ZeRO count. A model built in 16 bits
    (model_params_16bit) holds 2 + 4 and a 16-bit gradient: 8. Megatron-Core's precision-
    aware optimizer and Apex's DistributedFusedAdam keep the master and the moments in
    their dtypes (workloads/optimizer_states.py).
    """
    prec = precision(plan.training.dtype)
    if model_params_16bit(plan):   # 16-bit weights, Adam's two moments in their dtype
        return prec.param_bytes, 2 * prec.param_bytes
    mixed = prec.optimizer_state_bytes > 2 * FP32_BYTES    # an fp32 master copy besides m, v
    if plan.fsdp and plan.fsdp_version == 2 and mixed and not megatron_torch_fsdp(plan):
        return FP32_BYTES, 2 * FP32_BYTES
    if plan.optimizer_states is not None:   # workloads/optimizer_states.py
        return (prec.param_state_bytes, plan.optimizer_states.state_bytes(
            plan.training.dtype, plan.fp8_param_gather))
    return prec.param_state_bytes, prec.optimizer_state_bytes


def adam_bytes_per_param(plan: Plan) -> float | None:
    """HBM bytes per parameter of the Adam step where its states are not fp32 (None: the
    kernel table's fp32 figure, workloads/kernels.py ADAM_STEP): the optimizer-states
    section's (workloads/optimizer_states.py), or, for a model trained in 16 bits
    (model_params_16bit), the table's bytes at the parameters' width: torch's foreach and
    for-loop Adam run the same kernels over bf16 tensors and move half the bytes (counted
    with tests/test_kernels.py's dispatch counter: 76 -> 38 B per parameter for Adam, 84 ->
    42 for AdamW), and the fused kernel reads and writes each tensor once."""
    states = plan.optimizer_states
    if states is not None:
        return states.adam_bytes(plan.training.dtype, grad_state_bytes(plan),
                                 plan.fp8_param_gather)
    if model_params_16bit(plan):
        return adam_table_bytes(plan.optimizer) * precision(plan.training.dtype).param_bytes \
            / FP32_BYTES
    return None


def frozen_param_bytes(plan: Plan) -> int:
    """Bytes a frozen base weight (LoRA, workloads/lora.py) keeps in memory: the model's
    bf16, or one byte where the plan keeps FP8 primary weights (ddp.fp8_param_gather:
    Megatron-Core's fp8_param, as the Megatron-Bridge FP8 recipes and NeMo's fp8_params
    set)."""
    return FP8_GATHER_BYTES if plan.fp8_param_gather else BF16_BYTES


def fsdp_reduce_bytes(plan: Plan, dims: tuple[str, ...] = ()) -> float:
    """Bytes per parameter of an FSDP unit's reduce-scatter input (of its group over the
    mesh dims `dims`): torch's FSDP reduces in its reduce dtype (Precision.
    grad_reduce_bytes), Megatron-FSDP its gradient bucket in main_grad's dtype
    (workloads/main_grad.py); a group fully_shard-ed without a MixedPrecisionPolicy
    reduces in the gradients' own dtype: Megatron-Core's torch FSDP2, and the routed
    experts' groups (over "edp") where the framework shards them so
    (framework_traits.expert_fsdp_without_mp_policy)."""
    if plan.fsdp_version == "megatron":
        return grad_state_bytes(plan)
    experts_own_dtype = "edp" in dims and traits(plan.framework).expert_fsdp_without_mp_policy
    if megatron_torch_fsdp(plan) or experts_own_dtype:
        return precision(plan.training.dtype).grad_state_bytes
    return precision(plan.training.dtype).grad_reduce_bytes


def fsdp_no_sync(plan: Plan) -> bool:
    """Whether FSDP accumulates unsharded gradients until the step's single reduce-scatter,
    keeping the parameters gathered after each backward until then.

    The plan's `fsdp.grad_sync` says so: "step" (a training loop that turns gradient sync
    and reshard-after-backward off until the last micro-batch: FSDP2's
    set_requires_gradient_sync / set_reshard_after_backward, FSDP1's no_sync), or
    "microbatch" (every backward reduce-scatters, torch's default). "auto" is torch's
    default but under pipeline parallelism, where torch.distributed.pipelining turns sync
    off when the stage module is an FSDPModule (torch/distributed/pipelining/stage.py,
    backward_maybe_with_nosync, perform_reduce_grad). Megatron-FSDP reduce-scatters every
    micro-batch (workloads/main_grad.py; plan_checks refuses "step" for it)."""
    fsdp = plan.fsdp or plan.zero_stage == 3
    if not fsdp or plan.fsdp_version == "megatron":
        return False
    if plan.fsdp_grad_sync != "auto":
        return plan.fsdp_grad_sync == "step"
    return plan.mesh.pp > 1


def accumulated_grad_bytes(plan: Plan) -> float:
    """Bytes per unsharded gradient FSDP accumulates with gradient sync off (the pipeline's
    micro-batches before the last). FSDP2 upcasts each unsharded gradient to the reduce
    dtype (fp32 under mixed precision, Precision.grad_reduce_bytes) and accumulates it there
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: to_accumulated_grad_if_needed,
    called from FSDPParamGroup.post_backward when gradients are not reduced); FSDP1 keeps
    them in the precision's gradient dtype."""
    prec = precision(plan.training.dtype)
    if plan.fsdp_version == 2:
        return max(prec.grad_state_bytes, prec.grad_reduce_bytes)
    return prec.grad_state_bytes
