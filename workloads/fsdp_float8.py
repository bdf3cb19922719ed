"""torchao's float8 FSDP all-gather (`"fsdp": {"float8_all_gather": true}`; torchtitan's
`float8.enable_fsdp_float8_all_gather` with `precompute_float8_dynamic_scale_for_fsdp`).

With tensor-wise Float8 training under FSDP2, torchao wraps each Float8Linear weight in
WeightWithDynamicFloat8CastTensor (pytorch/ao torchao/float8/fsdp_utils.py, v0.10-v0.13):

- After the optimizer step, `precompute_float8_dynamic_scale_for_fsdp` takes the inf-norm
  of every float8 weight's local shard (one torch._foreach_norm over the shards, which
  FSDP2's mixed precision keeps in fp32: a read of 4 B per element), stacks them, and one
  all-reduce over the FSDP mesh gives every weight its amax and scale (4 B per weight).
- Before each all-gather (forward, and backward again when the unit was resharded),
  `fsdp_pre_all_gather` casts the fp32 local shard to float8 with that scale (read 4 B,
  write 1 B), in place of FSDP's own cast to bf16, so the gather moves 1 byte per element; `fsdp_post_all_gather` wraps the gathered
  bytes as the Float8Tensor the GEMMs take. The forward GEMM (input @ weight.t()) reads it
  as it is: no amax or cast of the full weight. The data-gradient GEMM needs the weight as
  torch._scaled_mm's column-major second operand, a copy of the float8 weight transposed
  (read 1 B, write 1 B) where Float8Linear would otherwise cast the bf16 weight again
  (torchao float8_ops.py, float8_mm).
- The unsharded weights are held in float8 (1 B) between the gather and the reshard.

Without the precomputed scale each pre-all-gather cast computes the shard's amax and
all-reduces it (reduce_amax=True): one all-reduce per weight per gather, not modelled
(the importer refuses that setting). Only the transformer layers' linears are Float8Linear:
the embedding and the output layer (torchtitan's filter_fqns) stay bf16 units, and a
layer's norm weights are gathered in bf16 with their own group where TP replicates them
(float8_group; without TP they share the linears' group and are counted at 1 B, under
0.1 % of a layer).
"""
from __future__ import annotations

from dataclasses import replace

from .param_gathers import FP8_GATHER_BYTES
from .params import unit_param_groups
from .precision import FP32_BYTES, GemmRecipe, OperandCast
from .program import COMM, COMPUTE, MEMORY
from .schedules import EMBED, HEAD

# FSDP2 keeps the sharded parameters in fp32 under mixed precision
# (workloads/grad_state.py sharded_state_bytes); each weight's amax is one fp32 value.
SHARD_BYTES = FP32_BYTES
# The float8 weight's own cost around its GEMMs once FSDP gathered it in float8: nothing in
# forward, the column-major copy (read 1 B, write 1 B) for the data-gradient GEMM.
GATHERED_WEIGHT = OperandCast(0.0, 0, 2 * FP8_GATHER_BYTES, 1)


def gathers_float8(plan, unit) -> bool:
    """Whether FSDP gathers `unit`'s parameters as float8 (a transformer layer's)."""
    return plan.fsdp_float8_all_gather and unit not in (EMBED, HEAD)


def float8_group(plan, unit, groups: dict, dims) -> bool:
    """Whether FSDP gathers `unit`'s parameter group `dims` (of `groups`, the unit's
    parameters by sharding dimensions) in float8: a layer's largest group, its linears;
    a smaller one (the norms, replicated over TP) is gathered in bf16."""
    return gathers_float8(plan, unit) and groups[dims] == max(groups.values())


def gathered_bytes_per_param(plan, unit, wide: float) -> float:
    """Bytes per parameter of `unit` as FSDP holds it unsharded (the memory model's
    per-unit count: a layer's norms, under 0.1 % of it, at its linears' 1 B)."""
    return FP8_GATHER_BYTES if gathers_float8(plan, unit) else wide


def with_gathered_weights(recipe: GemmRecipe) -> GemmRecipe:
    """torchao's recipe with the weight's casts replaced by the gathered float8 weight's."""
    inputs, _weight, grads = recipe.casts
    return replace(recipe, casts=(inputs, GATHERED_WEIGHT, grads))


def linears_per_layer(model) -> int:
    """Float8Linear weights in one transformer layer: q, k, v, o and the MLP's matrices."""
    return 4 + len(model.mlp_matrices)


def shard_cast(sink, plan, shard_params: float, deps, phase: str, unit, ctx: dict) -> int:
    """fsdp_pre_all_gather: each weight's fp32 local shard cast to float8 with its
    precomputed scale, one kernel per weight, before the unit's all-gather (its stream)."""
    return sink.add(kind=COMPUTE, stream="dp_ag", op="fsdp_float8_cast", phase=phase,
                    deps=tuple(deps), bytes=shard_params * (SHARD_BYTES + FP8_GATHER_BYTES),
                    op_class=MEMORY, kernels=linears_per_layer(plan.model),
                    label=f"fsdp.float8_cast.{unit}", **ctx)


def precompute_scales(sink, plan, units, step: int) -> None:
    """precompute_float8_dynamic_scale_for_fsdp after the optimizer step (task `step`): the
    inf-norm of the shards of the stage's layers among `units`, then one all-reduce of the
    weights' amaxes per FSDP group."""
    layers = [u for u in units if gathers_float8(plan, u)]
    shards: dict = {}
    for unit in layers:
        for dims, params in unit_param_groups(plan, unit).items():
            ranks = plan.parallel_dims.group_size(dims)
            if ranks > 1:
                shards[dims] = shards.get(dims, 0.0) + params / ranks
    weights = len(layers) * linears_per_layer(plan.model)
    for dims, shard_params in sorted(shards.items()):
        norm = sink.add(kind=COMPUTE, stream="compute", op="fsdp_float8_amax",
                        phase="optimizer", deps=(step,), bytes=shard_params * SHARD_BYTES,
                        op_class=MEMORY, kernels=1, label="fsdp.float8_amax",
                        layer=-1, microbatch=-1)
        sink.add(kind=COMM, stream="dp_ag", op="all_reduce", phase="optimizer",
                 deps=(norm,), bytes=weights * FP32_BYTES, group=dims,
                 label="fsdp.float8_amax_reduce", layer=-1, microbatch=-1)
