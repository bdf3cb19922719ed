"""What an FSDP unit's all-gather waits for on its copy-in stream: the work that turns each
rank's local shard into the all-gather's input, by FSDP version.

- FSDP2 (`fully_shard`), read from PyTorch's torch/distributed/fsdp/_fully_shard/
  _fsdp_collectives.py foreach_all_gather: on the all-gather copy-in stream,
  _get_param_all_gather_inputs casts the unit's fp32 shards to the mixed-precision
  param_dtype in one torch._foreach_copy_ into a flat buffer (a read of the fp32 shard, a
  write in the param dtype; without a param_dtype, under fp32 training, nothing), or a
  float8 weight's fsdp_pre_all_gather casts it (workloads/fsdp_float8.py); then
  torch.ops.fsdp.all_gather_copy_in copies the inputs into the rank's own chunk of the
  freshly allocated all-gather output (a second torch._foreach_copy_: a read and a write
  of the shard in the gathered dtype). The all-gather stream waits for the copy-in stream;
  the simulator runs both on the all-gather's (`dp_ag`), which the copy-in then delays.
- FSDP1: the fp32 shard cast into its bf16 `_mp_shard` (workloads/fsdp1.py), gathered
  straight into the flat parameter: no copy-in.
- Megatron-FSDP gathers from its bucket's shard in place (workloads/main_grad.py): nothing.
"""
from __future__ import annotations

from .fsdp1 import fsdp1_gather_copy
from .fsdp_float8 import shard_cast
from .grad_state import model_params_16bit
from .layer_builder import TaskSink
from .param_gathers import FP8_GATHER_BYTES
from .plan import Plan
from .precision import FP32_BYTES, Precision
from .program import COMPUTE, MEMORY


def gather_input(sink: TaskSink, plan: Plan, prec: Precision, shard_params: float,
                 float8: bool, deps: tuple, phase: str, unit, ctx: dict) -> tuple:
    """The tasks before one all-gather of `shard_params` local parameters (module
    docstring); returns the all-gather's dependencies."""
    if float8:   # the shard cast to float8 first
        deps = (shard_cast(sink, plan, shard_params, deps, phase, unit, ctx),)
    if plan.fsdp_version == 1:
        return (fsdp1_gather_copy(sink, prec, shard_params, deps, phase, unit, ctx),)
    if plan.fsdp_version != 2:
        return deps
    gathered_bytes = FP8_GATHER_BYTES if float8 else prec.param_bytes
    # the fp32 shard cast to the gather's dtype; none where the model is 16-bit itself
    # (grad_state.model_params_16bit: the shard already has the gathered dtype)
    cast_bytes = (FP32_BYTES + prec.param_bytes
                  if not float8 and prec.param_bytes < FP32_BYTES
                  and not model_params_16bit(plan) else 0.0)
    # the foreach cast (under mixed precision) and the foreach copy-in: one launch each
    return (sink.add(kind=COMPUTE, stream="dp_ag", op="fsdp_gather_copy_in", phase=phase,
                     deps=tuple(deps), op_class=MEMORY, kernels=2 if cast_bytes else 1,
                     bytes=shard_params * (cast_bytes + 2 * gathered_bytes),
                     label=f"fsdp.copy_in.{unit}", **ctx),)
