"""Megatron-LM's FP16_Optimizer of 2020: the host-synchronised loops of its step.

Until the April 2021 rewrite (megatron/optimizer/optimizer.py, priced as the
`megatron_float16` step: workloads/kernels.py ADAM_STEP), Megatron-LM trained in fp16
through its copy of Apex's FP16_Optimizer: megatron/fp16/fp16.py, loss_scaler.py,
fp16util.py and megatron/mpu/grads.py at NVIDIA/Megatron-LM@c63906a (September 2020), the
code of the README's September 2020 scaling tables (commit 5281919420, the same day as
the "Various speed optimizations" it measured, 51a2e6b0ff). `"optimizer":
"fp16_optimizer"` names it. After the backward and the data-parallel all-reduce, a step runs:

1. update_master_grads -> _check_overflow -> DynamicLossScaler.has_overflow_serial
   (`--loss-scale` unset, its default: dynamic scaling): for each fp16 parameter tensor,
   `float(x.float().sum())`, a cast to fp32 (read 2 B, write 4 B per element), a sum
   (read 4 B) and a device-to-host read that the host waits for; then a one-element
   all-reduce (MAX) over the model-parallel group and `.item()`.
2. model_grads_to_master_grads and _downscale_master: two multi_tensor_scale passes
   (read 2 B, write 4 B; read 4 B, write 4 B).
3. clip_master_grads (`--clip-grad` defaults to 1.0) -> mpu.clip_grad_norm: for each fp32
   master gradient `p.grad.data.norm(2)` and `.item()` (read 4 B and a host wait per
   tensor; tensor-parallel rank 0 takes every tensor, the others their tensor-parallel
   ones), then an all-reduce (SUM) over the model-parallel group and `.item()`. The
   clipping multiply runs only when the norm exceeds the limit: not counted, as for
   megatron_float16.
4. step: Apex FusedAdam (read 16 B, write 12 B), then _master_params_to_model_params,
   `model.data.copy_(master.data)` per tensor (read 4 B, write 2 B).

Pass 2 and the FusedAdam step are ADAM_STEP["fp16_optimizer"] (42 B per parameter, one
launch); the copy-back is a task of its own after it (6 B, a launch per tensor), whose
launches the host issues while the device runs Adam. Loops 1 and 3 are the tasks below,
one per loop. The host waits for the device after every tensor, so within a loop the
device's time and the host's add up instead of overlapping; one task whose kernels start
only once the host has spent the loop's launches (the engine's host timeline: a task
starts after its host time) and that synchronises the host at its end gives that sum.
The host time counts each read-back as one more operator (a device-to-host copy issued
from Python), and its device time as one launch; the copies' few bytes are not counted.
The host is already waiting for the device when loop 1 begins: train_step's timers
synchronise around each phase (megatron/global_vars.py _Timer.start and stop,
`torch.cuda.synchronize()`; backward_step starts "backward-master-grad" just before
update_master_grads), a join that synchronises the host after the backward and the
reductions.
"""
from __future__ import annotations

from .layer_builder import TaskSink
from .program import COMM, COMPUTE, MEMORY

FP16_OPTIMIZER = "fp16_optimizer"
# The master parameters copied back to the fp16 ones: read 4 B, write 2 B, a launch each.
COPY_BACK_BYTES_PER_PARAM = 6.0
# Per fp16 gradient element: the cast (read 2 B, write 4 B) and the sum (read 4 B).
OVERFLOW_CHECK_BYTES_PER_PARAM = 10.0
OVERFLOW_CHECK_LAUNCHES = 3        # cast, sum, device-to-host read
# Per fp32 master gradient element: the norm's read.
GRAD_NORM_BYTES_PER_PARAM = 4.0
GRAD_NORM_LAUNCHES = 2             # norm, device-to-host read
SCALAR_ALL_REDUCE_BYTES = 4.0      # the overflow flag (1 B) and the norm (fp32), as 4 B


def fp16_optimizer_checks(sink: TaskSink, plan, params: float, tensors: int,
                          deps: tuple[int, ...]) -> int:
    """The overflow check and the gradient-norm loop before the Adam step (module
    docstring), after `deps`: returns the last task, which the step waits for."""
    last = (sink.add(kind=COMPUTE, stream="compute", op="join", phase="optimizer",
                     deps=tuple(deps), op_class=MEMORY, kernels=0, host_sync=True,
                     label="optimizer.timer_sync", layer=-1, microbatch=-1),)
    for name, per_param, launches in (
            ("grad.overflow_check", OVERFLOW_CHECK_BYTES_PER_PARAM, OVERFLOW_CHECK_LAUNCHES),
            ("grad.norm", GRAD_NORM_BYTES_PER_PARAM, GRAD_NORM_LAUNCHES)):
        task = sink.add(kind=COMPUTE, stream="compute", op=name.split(".")[1],
                        phase="optimizer", deps=last, bytes=params * per_param,
                        kernels=launches * tensors, op_class=MEMORY, label=name,
                        layer=-1, microbatch=-1, host_sync=True)
        if plan.mesh.tp > 1:   # the model-parallel group of 2020's code is TP
            task = sink.add(kind=COMM, stream="tp", op="all_reduce", phase="optimizer",
                            deps=(task,), bytes=SCALAR_ALL_REDUCE_BYTES, group=("tp",),
                            label=f"{name}.all_reduce", layer=-1, microbatch=-1,
                            host_sync=True)
        last = (task,)
    return last[0]


def fp16_optimizer_copy_back(sink: TaskSink, params: float, tensors: int, step: int) -> int:
    """_master_params_to_model_params after the Adam step: `model.data.copy_(master.data)`
    one tensor at a time (module docstring); returns it."""
    return sink.add(kind=COMPUTE, stream="compute", op="copy_back", phase="optimizer",
                    deps=(step,), bytes=params * COPY_BACK_BYTES_PER_PARAM, kernels=tensors,
                    op_class=MEMORY, label="optimizer.copy_back", layer=-1, microbatch=-1)
