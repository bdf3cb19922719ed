"""ZeRO-1/2 parameter all-gathers (Megatron's distributed optimizer), overlapped with a
chunk's forward (--overlap-param-gather) or after the optimizer step; the stage lowering
(workloads/stage_lowering.py) calls them.

Bytes per parameter: the precision's (BF16: 2), but 1 for the transformer layers' weights
under `fp8_param_gather` with a per-tensor or block-wise FP8 recipe (fp8, fp8_cs,
fp8_blockwise): Transformer Engine
keeps those weights as FP8 tensors and Megatron-Core's parameter buffer holds their uint8
data (megatron/core/distributed/distributed_data_parallel.py at core_v0.15.0:
`param_dtype = torch.uint8` for a Float8Tensor), while the embedding and the output layer
(not Transformer Engine modules) stay BF16. Norm weights and the MoE router, BF16 too,
are under 0.1 % of a layer and counted at 1 byte. MXFP8 gathers BF16: its parameter
buffer is the BF16 view of the gradient buffer, and the gathered values are quantised as
they are copied into the MXFP8 weights (param_and_grad_buffer.py at core_v0.15.0 and
core_v0.16.0: `shared_buffer`; finish_param_sync copies with "cast from bf16 to MXFP8").
"""
from __future__ import annotations

from .ddp_buckets import forward_buckets
from .params import unit_param_groups
from .precision import precision
from .program import COMM
from .schedules import EMBED, HEAD, unit_context

FP8_GATHER_BYTES = 1                     # a Float8Tensor's uint8 data
# The recipes whose weights Megatron-Core's parameter buffer holds as uint8
# (GemmRecipe.uint8_param_storage: Transformer Engine 2's QuantizedTensors, per-tensor FP8
# and Float8BlockScaling's blocks; fp8_utils.is_float8tensor checks QuantizedTensor); their
# scales (one FP32 per 128 x 128 block of a blockwise weight) are not counted.


def gather_bytes(plan, bucket) -> float:
    """Bytes one all-gather of `bucket` assembles: its parameters at the precision's
    bytes, the transformer layers' at 1 byte under fp8_param_gather with uint8-held FP8
    (layers' share of a bucket spanning other units taken by their parameters)."""
    bytes_of = precision(plan.training.dtype)
    wide = bytes_of.param_bytes
    if not (plan.fp8_param_gather and bytes_of.recipe and bytes_of.recipe.uint8_param_storage):
        return bucket.params * wide
    sizes = [(u, unit_param_groups(plan, u).get(bucket.dims, 0.0)) for u in bucket.units]
    total = sum(p for _, p in sizes)
    layers = sum(p for u, p in sizes if u not in (EMBED, HEAD))
    share = layers / total if total else 1.0
    return bucket.params * (share * FP8_GATHER_BYTES + (1.0 - share) * wide)


def step_gathers(sink, plan, chunk_units, bucket_sizes, step: int) -> None:
    """Without --overlap-param-gather: the updated shards gathered back after the
    optimizer step (task `step`), exposed: per unit, or per bucket of the gradient buffer
    (Megatron's start_param_sync)."""
    for units, size in zip(chunk_units, bucket_sizes):
        for k, bucket in enumerate(forward_buckets(
                [(u, unit_param_groups(plan, u)) for u in units], size)):
            if plan.parallel_dims.group_size(bucket.dims) == 1:
                continue
            unit = bucket.units[-1]
            label = (f"zero.gather.{unit}" if len(bucket.units) == 1 and size is None
                     else f"zero.gather.bucket{k}")
            sink.add(kind=COMM, stream="dp_ag", op="all_gather", phase="optimizer",
                     deps=(step,), bytes=gather_bytes(plan, bucket), group=bucket.dims,
                     label=label, **unit_context(unit, -1))


class ParamGathers:
    """--overlap-param-gather in one chunk's forward: bucket k + 1's all-gather is issued
    when bucket k's first unit starts (Megatron's forward pre-hook: finish_param_sync,
    then the next bucket group's start_param_sync), the first one at the step's start;
    a unit waits for the gathers of every bucket holding its parameters."""

    def __init__(self, sink, plan, buckets):
        self.sink, self.plan, self.buckets = sink, plan, buckets
        self.issued: dict[int, int] = {}

    def _issue(self, k: int, deps) -> None:
        if k >= len(self.buckets) or k in self.issued:
            return
        bucket = self.buckets[k]
        self.issued[k] = self.sink.add(
            kind=COMM, stream="dp_ag", op="all_gather", phase="forward",
            deps=tuple(d for d in deps if d is not None and d >= 0),
            bytes=gather_bytes(self.plan, bucket), group=bucket.dims,
            label=f"zero.gather.bucket{k}", **unit_context(bucket.units[-1], 0))

    def issue_all(self, deps) -> None:
        """Issue every bucket's gather now, after `deps` (a chunk launched ahead)."""
        for k in range(len(self.buckets)):
            self._issue(k, deps)

    def wait(self, unit, started) -> list[int]:
        """The gathers `unit` waits for; issues the next bucket's as it starts."""
        mine = [k for k, b in enumerate(self.buckets) if unit in b.units]
        for k in mine:
            self._issue(k, () if k == 0 else (started,))
            self._issue(k + 1, (started,))
        return [self.issued[k] for k in mine]


class ChunkGathers:
    """--overlap-param-gather on one pipeline stage: each local chunk's ParamGathers,
    planned at its first forward, or all launched ahead of it by the interleaved
    schedule (align_param_gather, workloads/frameworks.py)."""

    def __init__(self, sink, plan, stage: int, chunk_units, bucket_sizes):
        self.sink, self.plan, self.stage = sink, plan, stage
        self.chunk_units, self.bucket_sizes = chunk_units, bucket_sizes
        self.aligned = plan.param_gather_align and plan.pipeline.interleaved
        self.launched: dict[int, ParamGathers] = {}

    def _plan(self, local: int) -> ParamGathers:
        """The chunk's ZeRO parameter all-gathers, issued in this forward (steady state:
        the previous step's optimizer updated the shards)."""
        group_size = self.plan.parallel_dims.group_size
        units = [(u, {d: p for d, p in unit_param_groups(self.plan, u).items()
                      if group_size(d) > 1})
                 for u in self.chunk_units[local]]
        return ParamGathers(self.sink, self.plan,
                            forward_buckets(units, self.bucket_sizes[local]))

    def for_forward(self, local: int) -> ParamGathers:
        """The gathers chunk `local`'s first forward waits for."""
        return self.launched.get(local) or self._plan(local)

    def _launch(self, local: int, deps) -> None:
        """All of one chunk's gathers, dispatched together (Megatron's start_param_sync
        of a model chunk dispatches every bucket group of it)."""
        gathers = self._plan(local)
        gathers.issue_all(deps)
        self.launched[local] = gathers

    def start(self) -> None:
        """At the step's start, under the aligned schedule: the first two chunks'."""
        if self.aligned:
            for local in range(min(2, len(self.chunk_units))):
                self._launch(local, ())

    def before_forward(self, forward_index: int, started) -> None:
        """Megatron's interleaved schedule, before virtual micro-batch k's forward on
        stage r: if k + r is the first micro-batch of chunk c, chunk c + 1's gathers start
        (for 1 < c + 1 < v), after task `started`; stage r runs r micro-batches behind
        stage 0, so the stages launch at about the same time (schedules.py,
        forward_step_helper)."""
        if not self.aligned:
            return
        chunks, pp = len(self.chunk_units), self.plan.mesh.pp
        ahead = forward_index + self.stage
        if ahead >= min(pp * chunks, self.plan.micro_batches * chunks) or ahead % pp:
            return
        nxt = ahead // pp + 1
        if 1 < nxt < chunks:
            self._launch(nxt, () if started is None else (started,))
