"""ZeRO-1/2 parameter all-gathers (Megatron's distributed optimizer), overlapped with a
chunk's forward (--overlap-param-gather) or after the optimizer step, as the stage
lowering issues them (workloads/stage_lowering.py).

Bytes per parameter: the precision's (BF16: 2), but 1 for the transformer layers' weights
under `fp8_param_gather` with a per-tensor FP8 recipe (fp8, fp8_cs): Transformer Engine
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
from .program import COMM
from .schedules import EMBED, HEAD

FP8_GATHER_BYTES = 1                     # a Float8Tensor's uint8 data
PER_TENSOR_FP8_DTYPES = ("fp8", "fp8_cs")


def gather_bytes(lowering, bucket) -> float:
    """Bytes one all-gather of `bucket` assembles: its parameters at the precision's
    bytes, the transformer layers' at 1 byte under fp8_param_gather with per-tensor FP8
    (layers' share of a bucket spanning other units taken by their parameters)."""
    plan, wide = lowering.plan, lowering.precision.param_bytes
    if not (plan.fp8_param_gather and plan.training.dtype in PER_TENSOR_FP8_DTYPES):
        return bucket.params * wide
    sizes = [(u, lowering._param_groups(u).get(bucket.dims, 0.0)) for u in bucket.units]
    total = sum(p for _, p in sizes)
    layers = sum(p for u, p in sizes if u not in (EMBED, HEAD))
    share = layers / total if total else 1.0
    return bucket.params * (share * FP8_GATHER_BYTES + (1.0 - share) * wide)


def step_gathers(lowering, step: int) -> None:
    """Without --overlap-param-gather: the updated shards gathered back after the
    optimizer step, exposed: per unit, or per bucket of the gradient buffer (Megatron's
    start_param_sync)."""
    for local, units in enumerate(lowering.chunk_units):
        size = lowering.bucket_sizes[local]
        for k, bucket in enumerate(forward_buckets(
                [(u, lowering._param_groups(u)) for u in units], size)):
            if lowering._group_size(bucket.dims) == 1:
                continue
            unit = bucket.units[-1]
            label = (f"zero.gather.{unit}" if len(bucket.units) == 1 and size is None
                     else f"zero.gather.bucket{k}")
            lowering.sink.add(kind=COMM, stream="dp_ag", op="all_gather", phase="optimizer",
                              deps=(step,), bytes=gather_bytes(lowering, bucket),
                              group=bucket.dims, label=label, **lowering._ctx(unit, -1))


class ParamGathers:
    """--overlap-param-gather in one chunk's forward: bucket k + 1's all-gather is issued
    when bucket k's first unit starts (Megatron's forward pre-hook: finish_param_sync,
    then the next bucket group's start_param_sync), the first one at the step's start;
    a unit waits for the gathers of every bucket holding its parameters."""

    def __init__(self, lowering, buckets):
        self.lowering, self.buckets = lowering, buckets
        self.issued: dict[int, int] = {}

    def _issue(self, k: int, deps) -> None:
        if k >= len(self.buckets) or k in self.issued:
            return
        low, bucket = self.lowering, self.buckets[k]
        self.issued[k] = low.sink.add(
            kind=COMM, stream="dp_ag", op="all_gather", phase="forward",
            deps=tuple(d for d in deps if d is not None and d >= 0),
            bytes=gather_bytes(low, bucket), group=bucket.dims,
            label=f"zero.gather.bucket{k}", **low._ctx(bucket.units[-1], 0))

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
