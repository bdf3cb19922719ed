"""torch DDP's copies around its all-reduces (torch.nn.parallel.DistributedDataParallel,
its C++ Reducer: torch/csrc/distributed/c10d/reducer.cpp).

With `gradient_as_bucket_view=False`, the constructor's default, the Reducer keeps its own
flat bucket tensors beside `param.grad`:

- copy-in: as each parameter's gradient is ready (its autograd hook,
  Reducer::mark_variable_ready_dense), the gradient is divided by the process-group size
  while it is copied into its bucket (`at::mul_out(bucket_view, grad, 1 / div_factor)`,
  recorded as `torch::distributed::reducer::mul_out`): one kernel per parameter tensor,
  reading the gradient and writing the bucket; the bucket's all-reduce waits for them;
- copy-back: once every bucket is reduced, finalize_backward copies each bucket view back
  into its `param.grad` (Reducer::copy_bucket_to_grad: `grad.copy_(bucket_view)`): one
  kernel per tensor, reading the bucket and writing the gradient, before the optimizer;
- memory: the buckets are a second copy of the gradients, allocated once.

With `"ddp": {"gradient_as_bucket_view": true}` the gradients are views into the buckets:
the division runs in place instead (`bucket_view.div_`, one kernel a tensor, the same two
passes), with no copy-back and no second copy in memory. tests/test_torch_ddp.py counts
the Reducer's ops with torch's profiler on a gloo process group.

The buckets are priced in the dtype the simulator's all-reduce moves (workloads/
grad_state.py bucket_grad_bytes: fp32 under generic mixed precision, the gradients' own
fp16 under Megatron-LM), a copy reading the gradient in its dtype (grad_state_bytes) and
writing the bucket. Assumption: torch's Reducer itself allocates each bucket in its
parameters' dtype (Reducer::initialize_buckets), so bf16 gradients would be reduced and
held in bf16; the generic plans' fp32 reduce convention (workloads/precision.py) is kept
for DDP too. Kernels: one per parameter tensor of the unit (params.param_tensor_count;
under LoRA it counts the frozen base tensors too, an over-count of the adapters the
Reducer buckets).

Which plans run it: torch's DDP reducer, that is a framework whose data parallelism is
torch's (framework_traits.torch_ddp: generic, torchtitan's replicate, Megatron-LM
2020-2021's `--DDP-impl torch`, which the plan says by overlapping the gradient reduce;
its local DDP is workloads/local_ddp.py), all-reducing whole gradients: ZeRO 0 without
FSDP (ZeRO-1/2 reduce-scatter through the distributed optimizer's own buckets:
workloads/dp_impl.py), where the data-parallel group has more than one rank.
"""
from __future__ import annotations

from .dp_impl import DDP_COPY_IN, wraps_ddp
from .layer_builder import TaskSink
from .params import param_tensor_count, unit_param_groups
from .program import COMPUTE, MEMORY

DDP_COPY_BACK = "ddp_copy_back"


def bucketed_params(plan, unit) -> float:
    """The unit's parameters the Reducer's buckets hold on this rank: those whose
    gradients reduce over more than one rank (0 where no DDP wraps the model)."""
    if not wraps_ddp(plan):
        return 0.0
    return sum(params for dims, params in unit_param_groups(plan, unit).items()
               if plan.parallel_dims.group_size(dims) > 1)


def bucket_copy_bytes(plan, bucket_bytes: float) -> float:
    """Bytes per parameter of the buckets' second copy of the gradients in memory (none as
    bucket views), `bucket_bytes` a parameter (module docstring)."""
    return 0.0 if plan.grad_as_bucket_view else bucket_bytes


class ReducerCopies:
    """One stage's Reducer copies: each unit's copy-in as its gradients become ready on the
    reducing micro-batch, and one copy-back of all of them after the reductions. A copy
    reads the gradient (`grad_bytes` a parameter) and writes the bucket (`bucket_bytes`)
    or back; as bucket views the division reads and writes the bucket in place."""

    def __init__(self, sink: TaskSink, plan, grad_bytes: float, bucket_bytes: float) -> None:
        self.sink, self.plan = sink, plan
        self.copy_bytes = grad_bytes + bucket_bytes
        self.divide_bytes = 2 * bucket_bytes if plan.grad_as_bucket_view else self.copy_bytes
        self.params, self.tensors = 0.0, 0        # what the copy-back copies

    @property
    def copies_back(self) -> bool:
        """Whether the stage copies reduced buckets back into param.grad (not as views)."""
        return self.params > 0 and not self.plan.grad_as_bucket_view

    def copy_in(self, unit, deps, ctx: dict) -> tuple[int, ...]:
        """The unit's bucketed gradients divided into their buckets (one kernel a tensor),
        after `deps`: what the buckets' all-reduces wait for (`deps` without DDP)."""
        params = bucketed_params(self.plan, unit)
        if not params:
            return tuple(deps)
        tensors = param_tensor_count(self.plan, [unit])
        self.params += params
        self.tensors += tensors
        return (self.sink.add(kind=COMPUTE, stream="compute", op=DDP_COPY_IN,
                              phase="backward", deps=tuple(deps), op_class=MEMORY,
                              bytes=params * self.divide_bytes, kernels=tensors,
                              label=f"grad.ddp_copy_in.{unit}", **ctx),)

    def copy_back(self, deps: tuple[int, ...], microbatch: int) -> int:
        """Every copied-in gradient copied back from its reduced bucket into `param.grad`
        (one kernel a tensor), after the reductions `deps`: what the step waits for."""
        return self.sink.add(kind=COMPUTE, stream="compute", op=DDP_COPY_BACK,
                             phase="backward", deps=deps, op_class=MEMORY,
                             bytes=self.params * self.copy_bytes, kernels=self.tensors,
                             label="grad.ddp_copy_back", layer=-1, microbatch=microbatch)
