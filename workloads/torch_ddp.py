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
passes), with no copy-back and no second copy in memory. tests/test_torch_ddp.py counts the Reducer's ops with torch's profiler on
a gloo process group.

Which plans run it: torch's DDP reducer, that is a framework whose data parallelism is
torch's (framework_traits.torch_ddp: generic, torchtitan's replicate, Megatron-LM
2020-2021's `--DDP-impl torch`, which the plan says by overlapping the gradient reduce;
its local DDP is workloads/local_ddp.py), all-reducing whole gradients: ZeRO 0 without
FSDP (ZeRO-1/2 reduce-scatter through the distributed optimizer's own buckets:
workloads/dp_impl.py), where the data-parallel group has more than one rank.
"""
from __future__ import annotations

from .dp_impl import TORCH_DDP, dp_impl
from .layer_builder import TaskSink
from .params import param_tensor_count
from .program import COMPUTE, MEMORY

def copies_back(plan) -> bool:
    """Whether torch's DDP copies each reduced bucket back into param.grad (the default
    gradient_as_bucket_view=False; as views the gradients are the buckets)."""
    return dp_impl(plan) == TORCH_DDP and not plan.grad_as_bucket_view


class ReducerCopies:
    """One stage's Reducer copies: each unit's copy-in as its gradients become ready on the
    reducing micro-batch, and one copy-back of all of them after the reductions."""

    def __init__(self, sink: TaskSink, plan, grad_bytes: float, bucket_bytes: float,
                 dp_ranks: int) -> None:
        self.sink, self.plan = sink, plan
        # DistributedDataParallel wraps the model where the DP group has several ranks
        self.enabled = dp_impl(plan) == TORCH_DDP and dp_ranks > 1
        # a copy reads one side and writes the other: param.grad's dtype and the bucket's
        # (the dtype the reduction moves); as views, the division reads and writes the bucket
        self.copy_bytes = grad_bytes + bucket_bytes
        self.divide_bytes = self.copy_bytes if not plan.grad_as_bucket_view else 2 * bucket_bytes
        self.params, self.tensors = 0.0, 0        # what the copy-back copies

    @property
    def copies_back(self) -> bool:
        """Whether the stage copies reduced buckets back (module docstring)."""
        return self.enabled and self.params > 0 and not self.plan.grad_as_bucket_view

    def copy_in(self, unit, params: float, deps, ctx: dict) -> int:
        """The unit's `params` gradients divided into their buckets (one kernel a
        tensor), after `deps`: the task the bucket's all-reduce waits for."""
        tensors = param_tensor_count(self.plan, [unit])
        self.params += params
        self.tensors += tensors
        return self.sink.add(kind=COMPUTE, stream="compute", op="ddp_copy_in",
                             phase="backward", deps=tuple(deps), op_class=MEMORY,
                             bytes=params * self.divide_bytes,
                             kernels=tensors, label=f"grad.ddp_copy_in.{unit}", **ctx)

    def copy_back(self, deps: tuple[int, ...], microbatch: int) -> int:
        """Every copied-in gradient copied back from its reduced bucket into `param.grad`
        (one kernel a tensor), after the reductions `deps`: what the step waits for."""
        return self.sink.add(kind=COMPUTE, stream="compute", op="ddp_copy_back",
                             phase="backward", deps=deps, op_class=MEMORY,
                             bytes=self.params * self.copy_bytes,
                             kernels=self.tensors, label="grad.ddp_copy_back", layer=-1,
                             microbatch=microbatch)
