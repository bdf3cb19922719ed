"""The data-parallel collectives of one pipeline stage (workloads/stage_lowering.py):
FSDP's parameter all-gathers before a unit runs and its gradient reduce-scatters after,
with the copies FSDP1, FSDP2 and Megatron-FSDP make around them, and the gradient
reductions of DDP and ZeRO 1-2, one per closed bucket (workloads/ddp_buckets.py).
StageLowering inherits these methods; they read its plan, precision, sink and the
gather and reduction records it keeps.
"""
from __future__ import annotations

from .fsdp1 import fsdp1_reduce_post, fsdp1_reduce_pre
from .fsdp_float8 import float8_group
from .fsdp_gather_input import gather_input
from .grad_state import bucket_grad_bytes, fsdp_reduce_bytes, grad_state_bytes
from .main_grad import FLAT_BUFFER_FSDP, grads_ready, megatron_fsdp_grad_copy
from .param_gathers import FP8_GATHER_BYTES
from .params import unit_param_groups
from .program import COMM, COMPUTE, MEMORY
from .schedules import unit_context


class StageDataParallel:
    """FSDP gathers and reductions, DDP / ZeRO bucket reductions of a stage's units."""

    def _gather(self, unit, index: int, mb: int, phase: str) -> list[int]:
        """FSDP all-gathers a unit needs before it runs, if its parameters are sharded.

        Parameters are resharded after forward when `reshard_after_forward`, and after
        backward unless the pipeline schedule defers that to the end of the step.
        """
        if not self.fsdp:
            return []
        if unit in self.unsharded:
            self._after_use(unit, phase, mb)
            return []
        self._after_use(unit, phase, mb)
        lag = 2 if self.plan.fsdp_prefetch else 1
        gate = self.pass_ends[index - lag] if index >= lag else None
        tasks = []
        groups = unit_param_groups(self.plan, unit)
        for dims, params in sorted(groups.items()):
            if self._group_size(dims) == 1 or params == 0:
                continue
            float8 = float8_group(self.plan, unit, groups, dims)
            gathered = params * (FP8_GATHER_BYTES if float8 else self.precision.param_bytes)
            deps = gather_input(self.sink, self.plan, self.precision,
                                params / self._group_size(dims), float8,
                                (gate,) if gate is not None else (), phase, unit,
                                unit_context(unit, mb))
            gather = self.sink.add(
                kind=COMM, stream="dp_ag", op="all_gather", phase=phase,
                deps=deps, bytes=gathered,
                group=dims, label=f"fsdp.gather.{unit}", **unit_context(unit, mb))
            if self.plan.fsdp_version in FLAT_BUFFER_FSDP:
                # FSDP1 gathers straight into the padded flat parameter, whose original
                # parameters are views (_flat_param.py, _use_unsharded_views); Megatron-FSDP
                # into its unit's bucket, whose views the parameters are
                # (workloads/main_grad.py): no copy-out.
                tasks.append(gather)
                continue
            # FSDP2 copies the gathered flat buffer out into the unsharded parameters on
            # the compute stream (foreach_all_gather_copy_out): read + write once.
            tasks.append(self.sink.add(
                kind=COMPUTE, stream="compute", op="fsdp_copy_out", phase=phase,
                deps=(gather,), bytes=2 * gathered, op_class=MEMORY,
                label=f"fsdp.copy_out.{unit}", **unit_context(unit, mb)))
        return tasks

    def _closes_round(self, mb: int) -> bool:
        """Whether micro-batch `mb` is the last of its run of the pipeline schedule
        (pipeline.rounds; with one run, the step's last): where torch pipelining's
        backward_maybe_with_nosync reduces and reshards, once per schedule call."""
        return (mb + 1) % (self.plan.micro_batches // self.plan.pipeline.rounds) == 0

    def _first_reducing_mb(self) -> int:
        """The first micro-batch whose backward reduce-scatters (the later ones add into
        the sharded gradient it leaves)."""
        if not self.sync_last_only:
            return 0
        return self.plan.micro_batches // self.plan.pipeline.rounds - 1

    def _after_use(self, unit, phase: str, mb: int) -> None:
        resharded = (self.plan.reshard_after_forward if phase == "forward"
                     else not self.sync_last_only or self._closes_round(mb))
        if resharded:
            self.unsharded.discard(unit)
        else:
            self.unsharded.add(unit)

    def _reduces(self, mb: int) -> bool:
        """Whether micro-batch `mb`'s backward reduces gradients (the others accumulate)."""
        every_mb = (self.fsdp and not self.sync_last_only) or self.plan.zero_stage == 2
        return every_mb or self._closes_round(mb)

    def _reduce(self, unit, deps: tuple[int, ...], mb: int, local: int) -> None:
        deps = grads_ready(self.sink, self.plan, self.precision,
                           sum(unit_param_groups(self.plan, unit).values()), deps, unit, mb,
                           unit_context(unit, mb), self.fsdp, grad_state_bytes(self.plan))
        if not self._reduces(mb):
            return
        if not self.fsdp:
            deps = self.ddp_copies.copy_in(unit, deps, unit_context(unit, mb))
            for dims, params in sorted(unit_param_groups(self.plan, unit).items()):
                if self._group_size(dims) > 1 and params:
                    self.fillers[local].add(unit, dims, params, deps)
            self._emit_buckets(self.fillers[local].take(), mb)
            return
        for dims, params in sorted(unit_param_groups(self.plan, unit).items()):
            if self._group_size(dims) == 1 or params == 0:
                continue
            ctx = unit_context(unit, mb)
            if self.plan.fsdp_version == 1:
                ready = (fsdp1_reduce_pre(self.sink, self.precision, params, deps, unit, ctx),)
            elif self.plan.fsdp_version == "megatron":
                ready = megatron_fsdp_grad_copy(self.sink, self.precision, params, deps,
                                                unit, ctx, grad_state_bytes(self.plan),
                                                self.plan.grad_accumulation_fusion)
            else:
                # FSDP2 copies (and casts) the unsharded gradients into the reduce-scatter
                # input on its reduce-scatter stream (foreach_reduce): read the gradients,
                # write the reduce-dtype buffer.
                ready = (self.sink.add(
                    kind=COMPUTE, stream="dp_rs", op="fsdp_copy_in", phase="backward",
                    deps=deps, op_class=MEMORY, label=f"grad.copy_in.{unit}",
                    bytes=params * (self.precision.param_bytes
                                    + fsdp_reduce_bytes(self.plan, dims)), **ctx),)
            reduction = self.sink.add(
                kind=COMM, stream="dp_rs", op="reduce_scatter", phase="backward", deps=ready,
                bytes=params * fsdp_reduce_bytes(self.plan, dims), group=dims,
                label=f"grad.reduce.{unit}", **ctx)
            if self.plan.fsdp_version == 1:
                reduction = fsdp1_reduce_post(self.sink, self.precision,
                                              params / self._group_size(dims), reduction,
                                              accumulate=mb > self._first_reducing_mb(),
                                              unit=unit, ctx=ctx)
            self.reductions.append(reduction)

    def _emit_buckets(self, buckets, mb: int) -> None:
        """DDP / ZeRO 1-2 gradient reductions, one per closed bucket (a unit's in "unit"
        mode: the label names the unit then)."""
        op = "reduce_scatter" if self.plan.zero_stage >= 1 else "all_reduce"
        unit_mode = self.plan.grad_bucket == "unit" and self.plan.grad_reduce_overlap
        grad_bytes = bucket_grad_bytes(self.plan, self.precision)
        for bucket in buckets:
            unit = bucket.units[-1]
            label = (f"grad.reduce.{unit}" if unit_mode
                     else f"grad.reduce.bucket{self.bucket_counter}")
            self.bucket_counter += 1
            self.reductions.append(self.sink.add(
                kind=COMM, stream="dp_rs", op=op, phase="backward", deps=bucket.deps,
                bytes=bucket.params * grad_bytes, group=bucket.dims,
                label=label, **unit_context(unit, mb)))
