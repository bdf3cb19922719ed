"""FSDP1 (`FullyShardedDataParallel`, `"fsdp": {"version": 1}`): what it does around its
collectives that FSDP2 (`fully_shard`, the default) does not, read from PyTorch's
torch/distributed/fsdp/_flat_param.py and _runtime_utils.py.

Each wrapped unit owns one FlatParameter: its parameters flattened and concatenated, each
rank holding a 1/dp shard in fp32 (the master weights under MixedPrecision).

- Unshard (FlatParamHandle.pre_unshard -> _use_low_precision_shard): the fp32 local shard
  is cast into a bf16 `_mp_shard` on the unshard stream, then all-gathered straight into
  the padded unsharded flat parameter, whose original parameters are views
  (_use_unsharded_views): no copy-out, unlike FSDP2's foreach_all_gather_copy_out.
- The unsharded flat gradient: in forward the original parameters are tensor views cut
  from the flat parameter by torch.split (_flat_param.py _use_unsharded_views with
  as_params=False, _get_unflat_views_unaligned), so autograd assembles the flat
  parameter's gradient with the split's backward, a torch.cat of every view's gradient
  (split_with_sizes_backward): a read and a write of the unit's gradient in the parameter
  dtype, on the compute stream, every micro-batch.
- Reduce (_runtime_utils._reduce_grad): the unsharded flat gradient is divided by the
  pre-divide factor in place (_div_if_needed: a read and a write of the whole unsharded
  gradient; the factor is > 1 for every DP size >= 2, DefaultState.
  _get_gradient_predivide_factor), reduce-scattered, then the new shard is divided by the
  post-divide factor, cast to the fp32 parameter dtype (_cast_grad_to_param_dtype) and,
  when an earlier micro-batch left a gradient, added to `_saved_grad_shard`
  (_accumulate_sharded_grad).
- Gradient accumulation without `no_sync` (FULL_SHARD, the default and what training
  loops that do not call no_sync get): every micro-batch all-gathers in forward and in
  backward and reduce-scatters, like FSDP2 with reshard_after_forward.
- The rate limiter (limit_all_gathers=True by default: _FreeEventQueue holds at most two
  in-flight all-gathers; the CPU waits for the free event of the unit two before) lets the
  gather of unit i start only after unit i - 2's parameters are freed, i.e. when unit i - 1
  starts; backward_prefetch=BACKWARD_PRE issues the next unit's gather before the current
  unit's gradient computation. Both are the gates workloads/stage_dp.py (_gather) already
  gives FSDP's gathers (`overlap.fsdp_prefetch` true: two units in flight; false: one).
"""
from __future__ import annotations

from .layer_builder import TaskSink
from .precision import FP32_BYTES, Precision
from .program import COMPUTE, MEMORY

# The sharded flat parameter and its gradient are fp32 (MixedPrecision): FP32_BYTES each.


def fsdp1_gather_copy(sink: TaskSink, prec: Precision, shard_params: float, deps,
                      phase: str, unit, ctx: dict) -> int:
    """The cast of the fp32 local shard into the bf16 all-gather input (_mp_shard), on the
    unshard stream; none-cost under fp32 training, where it is skipped."""
    nbytes = shard_params * (FP32_BYTES + prec.param_bytes) if prec.param_bytes < FP32_BYTES else 0.0
    return sink.add(kind=COMPUTE, stream="dp_ag", op="fsdp1_mp_shard", phase=phase,
                    deps=tuple(deps), bytes=nbytes, op_class=MEMORY,
                    kernels=1 if nbytes else 0, label=f"fsdp1.mp_shard.{unit}", **ctx)


def fsdp1_grad_cat(sink: TaskSink, prec: Precision, params: float, deps, unit,
                   ctx: dict) -> int:
    """Autograd's cat of the original parameters' gradients into the unit's unsharded
    flat gradient (the backward of the split that made their views)."""
    return sink.add(kind=COMPUTE, stream="compute", op="fsdp1_grad_cat", phase="backward",
                    deps=tuple(deps), bytes=2 * params * prec.param_bytes, op_class=MEMORY,
                    label=f"fsdp1.grad_cat.{unit}", **ctx)


def fsdp1_reduce_pre(sink: TaskSink, prec: Precision, params: float, deps, unit,
                     ctx: dict) -> int:
    """The in-place pre-divide of the unsharded flat gradient before its reduce-scatter
    (cast to the reduce dtype first when it differs from the gradient's)."""
    grad = prec.grad_state_bytes
    nbytes = params * (2 * prec.grad_reduce_bytes
                       + (grad + prec.grad_reduce_bytes if grad != prec.grad_reduce_bytes else 0))
    return sink.add(kind=COMPUTE, stream="dp_rs", op="fsdp1_predivide", phase="backward",
                    deps=tuple(deps), bytes=nbytes, op_class=MEMORY,
                    label=f"fsdp1.predivide.{unit}", **ctx)


def fsdp1_reduce_post(sink: TaskSink, prec: Precision, shard_params: float, reduction: int,
                      accumulate: bool, unit, ctx: dict) -> int:
    """Post-divide of the reduced shard, its cast to fp32 and, after the first micro-batch,
    its addition to the saved gradient shard."""
    rb = prec.grad_reduce_bytes
    nbytes = shard_params * (2 * rb + rb + FP32_BYTES + (3 * FP32_BYTES if accumulate else 0))
    return sink.add(kind=COMPUTE, stream="dp_rs", op="fsdp1_grad_shard", phase="backward",
                    deps=(reduction,), bytes=nbytes, op_class=MEMORY,
                    kernels=3 if accumulate else 2, label=f"fsdp1.grad_shard.{unit}", **ctx)
