"""Gradient and parameter buckets of data-parallel training without FSDP (DDP, ZeRO 1/2).

`overlap.grad_reduce` and `ddp.bucket_params` decide when a stage's gradients are reduced
over data parallelism, `overlap.param_gather` when ZeRO 1/2's updated parameters are
all-gathered back (workloads/stage_dp.py and stage_lowering.py emit the tasks this module
sizes).

Megatron-Core's DistributedDataParallel (megatron/core/distributed/) keeps each model
chunk's gradients in one contiguous buffer per kind of parameter (dense, expert), laid out
in reverse parameter order, and cuts it into buckets (param_and_grad_buffer.py: a bucket
closes at the first parameter that brings it to `bucket_size` elements or more):

- the default bucket size is max(40,000,000, 1,000,000 x DP size) parameters
  (distributed_data_parallel.py; distributed_data_parallel_config.py says larger DP needs
  larger buckets so the collectives do not become latency-bound);
- without `--overlap-grad-reduce` the bucket size is None: one bucket per buffer, reduced
  by finalize_model_grads after the whole backward of the step, exposed;
- pipeline stages after the first and model chunks after the first of the interleaved
  schedule get one bucket (distributed_data_parallel.py: `disable_bucketing or
  pp_rank > 0`; megatron/training/models/dist_utils.py: `model_chunk_idx > 0`), their
  reduction being off the critical path;
- with overlap, a bucket is reduced (all-reduce, or reduce-scatter under the distributed
  optimizer) as soon as the last micro-batch's backward has produced all its gradients;
- `--overlap-param-gather`: the distributed optimizer's all-gather of bucket k + 1 is
  dispatched when the forward of bucket k's first module starts (forward pre-hook,
  `finish_param_sync` then `next_param_gather_bucket_group.start_param_sync`), the first
  one when the step's forward begins; each module waits for its own bucket. Checked at
  core_v0.14.0 through core_v0.17.0: the distributed optimizer's zero_grad and
  step_with_ready_grads dispatch nothing under overlap (the latter's comment about
  zero_grad is stale), and only the interleaved schedule calls `param_sync_func`
  (align_param_gather), so without virtual stages the first forward pre-hook dispatches
  the first bucket; the dense and the expert buffers chain their buckets separately.

Buckets are cut at exact multiples of the bucket size here (Megatron cuts at parameter
boundaries, so its buckets run up to one tensor larger and are at most as many): a
stage chunk holding P parameters of one group has ceil(P / bucket) buckets.
`ddp.bucket_params: "unit"` (the generic default) reduces and gathers each unit (layer,
embedding, output layer) on its own, as the simulator always did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

UNIT = "unit"            # one bucket per unit (layer, embedding, output layer)
MEGATRON = "megatron"    # Megatron-Core's default size, max(40M, 1M x dp)
BUCKET_MODES = (UNIT, MEGATRON)
MEGATRON_MIN_BUCKET_PARAMS = 40_000_000      # distributed_data_parallel.py
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def bucket_params(plan, stage: int, local_chunk: int) -> float | None:
    """Parameters per bucket for one stage chunk: a number, math.inf (one bucket for the
    chunk) or None (one bucket per unit)."""
    if not plan.grad_reduce_overlap:
        return math.inf
    if plan.grad_bucket == UNIT:
        return None
    if stage > 0 or local_chunk > 0:
        return math.inf
    if plan.grad_bucket == MEGATRON:
        return float(max(MEGATRON_MIN_BUCKET_PARAMS,
                         MEGATRON_BUCKET_PARAMS_PER_DP_RANK * plan.mesh.dp))
    return float(plan.grad_bucket)


@dataclass
class Bucket:
    """A run of one gradient group's parameters, in the order the backward produces them."""

    dims: tuple[str, ...]
    params: float
    deps: tuple[int, ...]               # tasks after which all its gradients exist
    units: list = field(default_factory=list)   # units it holds parameters of


class BucketFiller:
    """Cuts a stream of (unit, params, ready tasks) into buckets of one size per group."""

    def __init__(self, size: float | None):
        self.size = size
        self.open: dict[tuple[str, ...], Bucket] = {}
        self.closed: list[Bucket] = []

    def add(self, unit, dims: tuple[str, ...], params: float, deps: tuple[int, ...]) -> None:
        """Add a unit's parameters of one group; close every bucket they fill."""
        if self.size is None:
            self.closed.append(Bucket(dims, params, deps, [unit]))
            return
        bucket = self.open.setdefault(dims, Bucket(dims, 0.0, ()))
        bucket.deps += deps
        bucket.units.append(unit)
        left = params
        while bucket.params + left >= self.size:
            taken = self.size - bucket.params
            bucket.params = self.size
            self.closed.append(bucket)
            left -= taken
            bucket = self.open[dims] = Bucket(dims, 0.0, deps if left else (), [unit] if left else [])
        bucket.params += left
        if not bucket.params:
            del self.open[dims]

    def take(self, flush: bool = False) -> list[Bucket]:
        """Buckets closed so far (and, with `flush`, the partly filled ones)."""
        if flush:
            self.closed += [b for _, b in sorted(self.open.items()) if b.params]
            self.open = {}
        out, self.closed = self.closed, []
        return out


def forward_buckets(units_params: list[tuple[object, dict]], size: float | None) -> list[Bucket]:
    """The buckets of one stage chunk in forward order (for the parameter all-gathers):
    cut in backward (reverse) order like the gradient buffer, then reversed."""
    filler = BucketFiller(size)
    for unit, groups in reversed(units_params):
        for dims, params in sorted(groups.items()):
            if params:
                filler.add(unit, dims, params, ())
    return list(reversed(filler.take(flush=True)))
