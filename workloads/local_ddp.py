"""Megatron-LM's own data parallelism of 2020-2021 (`--DDP-impl local`, its default).

Under framework megatron-lm without overlap.grad_reduce, the gradients are all-reduced
after the backward through a flat copy of them (megatron/model/distributed.py:
allreduce_params @c63906a, allreduce_gradients @a8d172b without
--use-contiguous-buffers-in-ddp, which is off by default): _flatten_dense_tensors (read
and write each gradient), `coalesced /= data-parallel size` (read, write), the
all-reduce (ddp_buckets.py sizes it: one bucket), then each gradient copied back from its
slice (read, write; a launch per tensor). It runs whatever the data-parallel size, one
rank included. (torch DDP, `--DDP-impl torch`, is overlap.grad_reduce with its buckets.)
"""
from __future__ import annotations

from .dp_impl import LOCAL_DDP, dp_impl
from .layer_builder import TaskSink
from .program import COMPUTE, MEMORY

# Passes over the gradients, in their bytes (module docstring):
LOCAL_DDP_COPY_PASSES = 6.0
LOCAL_DDP_COPY_KERNELS = 2              # the flatten and the scale; + one per tensor


def local_ddp(plan) -> bool:
    """Whether the plan's data parallelism is Megatron-LM's local DDP (above)."""
    return dp_impl(plan) == LOCAL_DDP


def local_ddp_copies(sink: TaskSink, params: float, tensors: int, grad_bytes: float,
                     deps: tuple[int, ...]) -> int:
    """The local DDP's flatten, scale and copy-back of `params` gradients in `tensors`
    tensors, as one task after `deps` (the all-reduce between them waits for the whole
    backward anyway, and the step waits for the copy-back): returns it."""
    return sink.add(kind=COMPUTE, stream="compute", op="ddp_flat_copies", phase="optimizer",
                    deps=deps, bytes=params * grad_bytes * LOCAL_DDP_COPY_PASSES,
                    kernels=LOCAL_DDP_COPY_KERNELS + tensors, op_class=MEMORY,
                    label="grad.local_ddp_copies", layer=-1, microbatch=-1)
