"""How weight gradients reach the buffer their reduction reads: Megatron's main_grad buffer
under its DDP and under Megatron-FSDP (`"fsdp": {"version": "megatron"}`), Megatron-LM
2020-2021's `param.grad` accumulated by autograd (autograd_accumulates) and FSDP1's
flat gradient (workloads/fsdp1.py); grads_ready picks one.

With gradient-accumulation fusion (`ddp.gradient_accumulation_fusion`, the default) a
Transformer Engine linear's weight-gradient GEMM accumulates into `param.main_grad` itself
(`grad_added_to_main_grad`); without it autograd leaves the gradient in `param.grad`, and
Megatron's hook moves it: under DDP / the distributed optimizer it adds it into the
main_grad buffer on every micro-batch (megatron/core/distributed/
distributed_data_parallel.py, _make_backward_post_hook: `param.main_grad.add_(
param.grad.data)`: read both, write main_grad), under Megatron-FSDP it copies it into the
unit's unsharded gradient bucket (below). Megatron-Bridge's performance recipes turn the
fusion off for some Megatron-FSDP runs ("Disabled to avoid functional errors",
scripts/performance/configs/llama/llama3_llm_pretrain.py at 22ef9ff9f and c810129341).

Megatron-FSDP does less than FSDP2 (`fully_shard`, the default) around its collectives, read
from NVIDIA/Megatron-LM@d98e8a64
megatron/core/distributed/fsdp/src/megatron_fsdp/ (megatron_fsdp.py,
param_and_grad_buffer.py, mixed_precision.py) and its design notes (docs/mfsdp_design.md:
FSDP2's per-tensor sharding "leads to extra data copy so won't be used by default").

- Buffers: each FSDP unit's parameters live in flat per-unit buffers, sharded over DP:
  the model weights in the parameters' dtype, the fp32 main weights
  (MixedPrecisionPolicy.main_params_dtype) and the main gradients in main_grads_dtype
  (param_and_grad_buffer.py: model_weight_buffer, main_weight_buffer, main_grad_buffer):
  ZeRO's count, 2 + 4 + 8 bytes a parameter besides the gradient's
  (workloads/memory.py, workloads/grad_state.py; the gradient in fp32 only with
  ddp.grad_reduce_in_fp32).
- Unshard: the all-gather writes the unit's bucket, and the parameters are views into it:
  no copy-out (FSDP2 copies the gathered buffer out into each parameter,
  foreach_all_gather_copy_out).
- Reduce: with gradient-accumulation fusion a linear writes its weight gradient straight
  into `param.main_grad`, the parameter's view of the unit's unsharded gradient bucket
  (megatron_fsdp.py `_grad_acc`: "If TransformerEngine gradient accumulation is fused,
  then param.get_main_grad() already holds the wgrad"; with sharded gradients
  `overwrite_main_grad` makes the GEMM overwrite it), and the bucket is reduce-scattered
  in place: no copy-in for the layers' weights. What autograd computes is copied into the
  bucket (`param.main_grad.copy_(param.grad)`): the embedding table (Megatron's
  VocabParallelEmbedding) always, every weight without the fusion; the output layer is
  Megatron's ColumnParallelLinear, fused like TE's; the norms' weights are a few vectors,
  left out. The reduced shard is added into the sharded main gradient (params / dp
  elements, left out like FSDP2's).
- Gradient accumulation: every micro-batch gathers in forward and backward and
  reduce-scatters (the strategy optim_grads_params, as FSDP2 with reshard_after_forward).
"""
from __future__ import annotations

from .framework_traits import traits
from .fsdp1 import fsdp1_grad_cat
from .layer_builder import TaskSink
from .precision import Precision
from .program import COMPUTE, MEMORY
from .schedules import EMBED

# FSDP versions whose unsharded parameters are views of the gathered buffer (no copy-out).
FLAT_BUFFER_FSDP = (1, "megatron")


def megatron_fsdp_grad_copy(sink: TaskSink, prec: Precision, params: float, deps,
                            unit, ctx: dict, grad_bytes: float,
                            fused: bool) -> tuple[int, ...]:
    """The tasks a unit's reduce-scatter waits for: the copy of its autograd gradients into
    the bucket (read the gradient, write the bucket): the embedding's, and every unit's
    without gradient-accumulation fusion; nothing where the linears write the bucket."""
    if fused and unit != EMBED:
        return tuple(deps)
    # the post-backward hook copies on the compute stream (megatron_fsdp.py
    # _process_post_backward_gradients -> _grad_acc), then queues the reduce-scatter on its own
    return (sink.add(kind=COMPUTE, stream="compute", op="fsdp_copy_in", phase="backward",
                     deps=tuple(deps), op_class=MEMORY, label=f"grad.copy_in.{unit}",
                     bytes=params * (prec.param_bytes + grad_bytes), **ctx),)


# The ops of main_grad_accumulate: gradients added into their accumulating buffer once a
# unit's backward has produced them (an MoE layer pair's combined order issues them with
# the unit's reductions: workloads/moe/a2a_overlap.py backward_segments).
MAIN_GRAD_ADD, GRAD_ADD = "main_grad_add", "grad_add"
GRAD_ACCUMULATE_OPS = (MAIN_GRAD_ADD, GRAD_ADD)


def main_grad_accumulate(sink: TaskSink, prec: Precision, params: float, deps, unit,
                         ctx: dict, grad_bytes: float, op: str = MAIN_GRAD_ADD) -> int:
    """The unit's new weight gradients added into the buffer that accumulates them (read
    the buffer and the gradient, write the buffer; `grad_bytes` per buffer element), on the
    compute stream: Megatron DDP's hook without gradient-accumulation fusion, into
    main_grad every micro-batch (`main_grad_add`), or autograd's AccumulateGrad into
    `param.grad` after the first micro-batch, whose gradient is stored as it is
    (`grad_add`, grads_ready)."""
    return sink.add(kind=COMPUTE, stream="compute", op=op, phase="backward",
                    deps=tuple(deps), op_class=MEMORY, label=f"grad.{op}.{unit}",
                    bytes=params * (prec.param_bytes + 2 * grad_bytes), **ctx)


def grads_ready(sink: TaskSink, plan, prec: Precision, params: float, deps, unit, mb: int,
                ctx: dict, fsdp: bool, grad_bytes: float) -> tuple[int, ...]:
    """What a unit's gradient reduction waits for after its backward of micro-batch `mb`
    (`params` of its gradients on this rank): Megatron-Core DDP's main_grad add without
    gradient-accumulation fusion, FSDP1's FlatParameter gradient (workloads/fsdp1.py),
    Megatron-LM's autograd accumulation after the first micro-batch; else the backward."""
    if not fsdp and not plan.grad_accumulation_fusion:
        return (main_grad_accumulate(sink, prec, params, deps, unit, ctx, grad_bytes),)
    if fsdp and plan.fsdp_version == 1:
        return (fsdp1_grad_cat(sink, prec, params, deps, unit, ctx),)
    if mb > 0 and autograd_accumulates(plan):
        # in place, in the parameters' dtype
        return (main_grad_accumulate(sink, prec, params, deps, unit, ctx, prec.param_bytes,
                                     op=GRAD_ADD),)
    return tuple(deps)


def autograd_accumulates(plan) -> bool:
    """Whether weight gradients accumulate over micro-batches in `param.grad` by autograd
    (framework_traits.autograd_grad_accumulation): torch DDP and ZeRO-1 under no_sync
    (generic, torchtitan) and Megatron-LM of 2020-2021 (framework megatron-lm), before
    Megatron's main_grad buffer and gradient-accumulation fusion (megatron/model/
    distributed.py @a8d172b keeps them in `param.grad` unless
    --accumulate-allreduce-grads-in-fp32, off by default for fp16;
    --gradient-accumulation-fusion came in 83b1e42f30, 2022). Not under FSDP, which
    accumulates its own unsharded or sharded gradients (workloads/grad_state.py), nor
    ZeRO-2, which reduces every micro-batch's gradients as they come."""
    return (traits(plan.framework).autograd_grad_accumulation and not plan.fsdp
            and plan.zero_stage < 2)


def megatron_torch_fsdp(plan) -> bool:
    """Whether the plan is Megatron-Core over torch's FSDP2 (--use-torch-fsdp2). Its wrapper
    calls fully_shard without a MixedPrecisionPolicy (megatron/core/distributed/
    torch_fully_sharded_data_parallel.py at d98e8a64) on the model Float16Module has made
    bf16, so FSDP2 holds, gathers and reduce-scatters bf16 parameters and gradients; the
    fp32 master and Adam's moments are the non-distributed optimizer's
    (Float16OptimizerWithFloat16Params: Megatron asserts --use-torch-fsdp2 without
    --use-distributed-optimizer, megatron/training/arguments.py), the ZeRO count's
    2 + 12 bytes a parameter, sharded with the parameters."""
    return (traits(plan.framework).fsdp2_without_mp_policy and plan.fsdp
            and plan.fsdp_version == 2)
