"""Lowering of one pipeline stage: schedule order, FSDP/ZeRO/DDP collectives (their
emission: workloads/stage_dp.py, a mixin of StageLowering), optimizer.

A stage holds one chunk of layers (GPipe, 1F1B) or virtual_stages of them (interleaved
1F1B: chunk c of pp x v on stage c % pp). Activations go from chunk c to chunk c + 1 and
gradients back, as send/recv along "pp" (stage pp - 1 to stage 0 wraps around, for the
interleaved chunks); a transfer is matched by its tag (what, sending chunk, micro-batch).
With the MoE all-to-all overlap, a combined slot's forward and backward are built as usual
and then put in Megatron-Core's issue order (workloads/moe/a2a_overlap.py). Megatron's
non-interleaved 1F1B synchronises the host after each send/receive (workloads/p2p_sync.py).
"""
from __future__ import annotations

import math

from .checkpointing import op_checkpoint_saved
from .ddp_buckets import BucketFiller, bucket_params
from .fp16_optimizer import FP16_OPTIMIZER, fp16_optimizer_checks, fp16_optimizer_copy_back
from .fsdp_float8 import precompute_scales
from .host_cost import add_host_issue_time
from .kernels import adam_step_cost
from .layer_builder import BuildOptions, LayerBuilder, LayerShape, TaskSink
from .layers import unit_builder
from .local_ddp import local_ddp, local_ddp_copies
from .grad_state import adam_bytes_per_param, bucket_grad_bytes, fsdp_no_sync, grad_state_bytes
from .memory import saved_layer_bytes
from .module_recompute import module_recompute_saved, recomputes_modules
from .offload_copies import insert_offload_copies
from .muon_ownership import owned
from .muon_step import layer_wise_gathers, muon_step
from .moe.a2a_overlap import (PassPieces, add_node_host_time, combined_order,
                               lone_node_calls, reorder)
from .p2p_sync import PipelineTransfers
from .torch_ddp import ReducerCopies
from .param_gathers import ChunkGathers, step_gathers
from .params import param_tensor_count, unit_param_groups, weight_dp_dims
from .precision import precision
from .plan import Plan
from .program import COMPUTE, MEMORY, Task
from .schedules import HEAD, chunk_units, stage_slots, unit_context
from .stage_dp import StageDataParallel


class StageLowering(StageDataParallel):
    """Builds the task list of one pipeline stage."""

    def __init__(self, plan: Plan, shape: LayerShape, stage: int, layers: list[range]):
        self.plan, self.shape, self.stage = plan, shape, stage
        self.pp = plan.mesh.pp
        self.last_chunk = len(layers) - 1
        self.sink = TaskSink()
        self.options = BuildOptions.from_plan(plan)
        # local chunk -> its units, in model order
        self.chunk_units: list[list] = chunk_units(plan, stage, layers)
        self.units = [u for units in self.chunk_units for u in units]
        self.fsdp = plan.fsdp or plan.zero_stage == 3
        self.precision = precision(plan.training.dtype)
        # FSDP's gradient sync under gradient accumulation (fsdp.grad_sync): once a step,
        # sync and reshard-after-backward off until the last micro-batch, or every
        # micro-batch (workloads/grad_state.py fsdp_no_sync says which and why).
        self.sync_last_only = fsdp_no_sync(plan)
        self.unsharded: set = set()             # FSDP units whose parameters are gathered
        self.graphs: dict[tuple, LayerBuilder] = {}
        self.pass_ends: list[int] = []          # unit end tasks of the current pass
        self.reductions: list[int] = []
        self.last_backward = -1
        # DDP / ZeRO 1-2 gradient buckets per local chunk (workloads/ddp_buckets.py)
        self.bucket_sizes = [bucket_params(plan, stage, c) for c in range(len(self.chunk_units))]
        self.fillers = [BucketFiller(size) for size in self.bucket_sizes]
        # torch DDP's Reducer copies (workloads/torch_ddp.py)
        self.ddp_copies = ReducerCopies(self.sink, plan, grad_state_bytes(plan),
                                        bucket_grad_bytes(plan, self.precision))
        # ZeRO 1-2's parameter all-gathers in the forward (workloads/param_gathers.py)
        self.param_gathers = (ChunkGathers(self.sink, plan, stage, self.chunk_units,
                                           self.bucket_sizes)
                              if plan.param_gather_overlap and not self.fsdp
                              and plan.zero_stage in (1, 2) else None)
        self.bucket_counter = 0
        self.pieces: PassPieces | None = None   # recorded while building a combined slot
        self.combined: list[tuple[range, list[int]]] = []
        self.node_calls: list = []   # combined steps' schedule-node host work (a2a_overlap)
        # pipeline sends and receives, their host syncs and scatter/gather (p2p_sync.py)
        self.transfers = PipelineTransfers(self.sink, plan, shape)

    # ---- helpers ------------------------------------------------------------------------
    def _join(self, deps, unit, mb, phase) -> tuple[int, ...]:
        deps = tuple(d for d in deps if d is not None and d >= 0)
        if len(deps) <= 1:
            return deps
        return (self.sink.add(kind=COMPUTE, stream="compute", op="join", phase=phase, deps=deps,
                              op_class=MEMORY, label="wait", **unit_context(unit, mb)),)

    def _piece(self, where: str, begin: int, unit=None) -> None:
        """Record tasks [begin, now) as a piece of the pass (combined slots only)."""
        if self.pieces is not None:
            span = range(begin, len(self.sink.tasks))
            if where == "units":
                self.pieces.units.append((unit, span))
            else:
                getattr(self.pieces, where).append(span)

    def _group_size(self, dims) -> int:
        return self.plan.parallel_dims.group_size(dims)

    def _graph(self, unit) -> LayerBuilder:
        return unit_builder(self.plan, unit, self.shape, self.options)

    # ---- passes -------------------------------------------------------------------------
    def forward(self, mb: int, local: int = 0) -> None:
        """One micro-batch's forward through one of the stage's chunks."""
        self.pass_ends = []
        chunk = local * self.pp + self.stage
        begin = len(self.sink.tasks)
        prev = (self.transfers.transfer("recv", "act", mb, (), -1, "forward", chunk)
                if chunk > 0 else None)
        self.transfers.sync.call_end(prev, mb, "forward")
        if prev is not None:
            prev = self.transfers.received(prev, "act", mb, "forward")
        gathers = None
        if self.param_gathers is not None and mb == 0:
            gathers = self.param_gathers.for_forward(local)
        self._piece("pre", begin)
        for index, unit in enumerate(self.chunk_units[local]):
            begin = len(self.sink.tasks)
            waits = (self._gather(unit, index, mb, "forward") if gathers is None
                     else gathers.wait(unit, prev))
            graph = self._graph(unit)
            deps = self._join([prev, *waits], unit, mb, "forward")
            prev = graph.emit_forward(self.sink, unit_context(unit, mb), deps)
            self.graphs[(unit, mb)] = graph
            self.pass_ends.append(prev)
            self._piece("units", begin, unit)
        begin = len(self.sink.tasks)
        if chunk < self.last_chunk:
            self.transfers.transfer("send", "act", mb, (prev,), +1, "forward", chunk)
        self._piece("post", begin)

    def backward(self, mb: int, local: int = 0) -> None:
        """One micro-batch's backward through one of the stage's chunks, in reverse."""
        self.pass_ends = []
        chunk = local * self.pp + self.stage
        begin = len(self.sink.tasks)
        if chunk < self.last_chunk:
            grad = self.transfers.transfer("recv", "grad", mb, (), +1, "backward", chunk)
        else:
            grad = self.graphs[(HEAD, mb)].output_task
        self.transfers.sync.call_end(grad if chunk < self.last_chunk else None, mb, "backward")
        if chunk < self.last_chunk:
            grad = self.transfers.received(grad, "grad", mb, "backward")
        self._piece("pre", begin)
        layers = [u for u in self.chunk_units[local] if isinstance(u, int)]
        for index, unit in enumerate(reversed(self.chunk_units[local])):
            begin = len(self.sink.tasks)
            gathers = self._gather(unit, index, mb, "backward")
            graph = self.graphs.pop((unit, mb))
            ctx = unit_context(unit, mb)
            deps = self._join([grad, *gathers], unit, mb, "backward")
            whole = isinstance(unit, int) and self.plan.recomputes(layers.index(unit))
            if whole or (isinstance(unit, int) and recomputes_modules(self.plan, unit)):
                # the whole layer reruns (its options ask for no separate attention
                # recompute: that is selective recompute's alone), or what op-level
                # checkpointing did not keep (1D TP only), or Megatron-Core's named modules
                graph = self._graph(unit)
                kept = ({"saved": op_checkpoint_saved(graph)}
                        if whole and self.plan.recompute == "selective_op" else
                        {} if whole else
                        {"saved": module_recompute_saved(graph, self.plan, unit)})
                deps = (graph.emit_forward(self.sink, ctx, deps, phase="recompute", **kept),)
            grad = graph.emit_backward(self.sink, ctx, deps[0] if len(deps) == 1 else grad)
            self.pass_ends.append(grad)
            wgrads = tuple(graph.wgrad_tasks.values()) or (grad,)
            self._reduce(unit, wgrads, mb, local)
            self._piece("units", begin, unit)
        begin = len(self.sink.tasks)
        if not self.fsdp and self._reduces(mb) and (
                self.bucket_sizes[local] != math.inf or mb != self.plan.micro_batches - 1):
            # The chunk's last, partly filled bucket closes when its backward ends. One
            # bucket for the whole chunk (no overlap) waits for the whole backward of the
            # step (optimizer), except ZeRO-2's reductions of earlier micro-batches.
            self._emit_buckets(self.fillers[local].take(flush=True), mb)
        if chunk > 0:
            self.transfers.transfer("send", "grad", mb, (grad,), -1, "backward", chunk)
        self._piece("post", begin)
        self.last_backward = grad

    def _combined_slot(self, fwd: tuple, bwd: tuple) -> None:
        """A forward and a backward run as one step (EP all-to-all overlap): built in
        turn, recorded, ordered after the step (build)."""
        begin = len(self.sink.tasks)
        self.pieces = PassPieces()
        self.forward(fwd[1], fwd[2])
        f_pieces, self.pieces = self.pieces, PassPieces()
        self.backward(bwd[1], bwd[2])
        order = combined_order(self.sink.tasks, f_pieces, self.pieces,
                               self.plan.moe.delay_wgrad, self.node_calls)
        self.pieces = None
        self.combined.append((range(begin, len(self.sink.tasks)), order))

    def _lone_slot(self, forward: bool, mb: int, local: int) -> None:
        """A forward or a backward alone (with the EP overlap: its schedule nodes' host
        work, a2a_overlap.lone_node_calls)."""
        self.pieces = PassPieces() if self.plan.moe.overlap_a2a else None
        (self.forward if forward else self.backward)(mb, local)
        if self.pieces is not None:
            self.node_calls += lone_node_calls(self.sink.tasks, self.pieces, forward,
                                               self.plan.moe.delay_wgrad)
        self.pieces = None

    def _param_tensors(self) -> int:
        """Parameter tensors this rank's optimizer steps (params.param_tensor_count)."""
        shards = (self._group_size(weight_dp_dims(self.plan))
                  if self.fsdp and self.plan.fsdp_version == 1 else 1)
        return param_tensor_count(self.plan, self.units, shards)

    def _before_step(self, local: float, tensors: int) -> tuple[int, ...]:
        """What the optimizer step waits for: the backward and the reductions, then
        Megatron-LM's flat gradient copies (workloads/local_ddp.py) and the 2020
        FP16_Optimizer's host-synchronised loops (workloads/fp16_optimizer.py)."""
        deps = (self.last_backward, *self.reductions)
        if self.ddp_copies.copies_back:
            deps = (self.ddp_copies.copy_back(deps, self.plan.micro_batches - 1),)
        if local_ddp(self.plan):
            deps = (local_ddp_copies(self.sink, local, tensors,
                                     bucket_grad_bytes(self.plan, self.precision), deps),)
        if self.plan.optimizer == FP16_OPTIMIZER:
            deps = (fp16_optimizer_checks(self.sink, self.plan, local, tensors, deps),)
        return deps

    def optimizer(self) -> None:
        """Adam on this rank's parameter shard, then ZeRO-1/2's parameter all-gathers."""
        self.transfers.sync.call_end(None, self.plan.micro_batches - 1, "backward")
        local = 0.0
        for unit in self.units:
            for dims, params in unit_param_groups(self.plan, unit).items():
                sharded = self.fsdp or self.plan.zero_stage >= 1
                local += params / (self._group_size(dims) if sharded else 1)
        for filler in self.fillers:   # reductions that wait for the whole backward
            self._emit_buckets(filler.take(flush=True), self.plan.micro_batches - 1)
        per_param = adam_bytes_per_param(self.plan)   # workloads/grad_state.py
        tensors = self._param_tensors()
        deps = self._before_step(local, tensors)
        if self.plan.muon is not None:   # workloads/muon.py: the rank's own tensors, Muon
            share, _ = owned(self.plan, self.units)    # first, then Adam on the rest
            deps, local = (muon_step(self.sink, self.plan, share, deps),), share.adam_params
        nbytes, kernels = adam_step_cost(self.plan.optimizer, local, tensors, per_param)
        step = self.sink.add(kind=COMPUTE, stream="compute", op="adam", phase="optimizer",
                             deps=deps, bytes=nbytes,
                             kernels=kernels, op_class=MEMORY, label="optimizer.step",
                             layer=-1, microbatch=-1)
        if self.plan.muon is not None:
            layer_wise_gathers(self.sink, self.plan, self.units, step)
        if self.plan.optimizer == FP16_OPTIMIZER:
            step = fp16_optimizer_copy_back(self.sink, local, tensors, step)
        if self.plan.zero_stage in (1, 2) and not self.fsdp and self.param_gathers is None:
            step_gathers(self.sink, self.plan, self.chunk_units, self.bucket_sizes, step)
        if self.plan.fsdp_float8_all_gather:
            precompute_scales(self.sink, self.plan, self.units, step)

    def build(self) -> list[Task]:
        """All tasks of the stage for one training step."""
        slots = stage_slots(self.plan.pipeline.schedule, self.stage, self.pp,
                            self.plan.micro_batches, self.plan.pipeline.virtual_stages,
                            self.plan.moe.overlap_a2a, self.plan.pipeline.rounds)
        if self.plan.host_step_s:
            # host work of the step before its first kernel (framework profile)
            self.sink.add(kind=COMPUTE, stream="compute", op="host_step", phase="forward",
                          layer=-1, microbatch=-1, kernels=0, host_s=self.plan.host_step_s,
                          label="host.step")
        if self.param_gathers is not None:
            self.param_gathers.start()
        forwards = 0
        for slot in slots:
            kind, mb, local = slot[0]
            if kind == "F":
                if self.param_gathers is not None:
                    self.param_gathers.before_forward(
                        forwards, self.pass_ends[-1] if self.pass_ends else None)
                forwards += 1
            if len(slot) == 2:
                self._combined_slot(*slot)
            else:
                self._lone_slot(kind == "F", mb, local)
        self.optimizer()
        if self.combined:
            reorder(self.sink.tasks, self.combined)
        insert_offload_copies(self.sink.tasks, self.plan,
                              lambda layer: saved_layer_bytes(self.plan, layer))
        add_host_issue_time(self.sink.tasks, self.plan)
        add_node_host_time(self.node_calls, self.plan)
        self.sink.share_again("host_s")
        return self.sink.tasks

