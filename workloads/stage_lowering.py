"""Lowering of one pipeline stage: schedule order, FSDP/ZeRO/DDP collectives, optimizer.

A stage holds one chunk of layers (GPipe, 1F1B) or virtual_stages of them (interleaved
1F1B: chunk c of pp x v on stage c % pp). Activations go from chunk c to chunk c + 1 and
gradients back, as send/recv along "pp" (stage pp - 1 to stage 0 wraps around, for the
interleaved chunks); a transfer is matched by its tag (what, sending chunk, micro-batch).
"""
from __future__ import annotations

from .checkpointing import op_checkpoint_saved
from .kernels import adam_step_cost
from .layer_builder import BuildOptions, LayerBuilder, LayerShape, TaskSink
from .layers import unit_builder
from .params import unit_param_groups
from .precision import precision
from .plan import Plan
from .program import COMM, COMPUTE, MEMORY, Task
from .schedules import EMBED, HEAD, chunk_units, stage_order


class StageLowering:
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
        # With pipeline parallelism, torch.distributed.pipelining runs every micro-batch's
        # backward with FSDP's gradient sync and reshard-after-backward off, then reduces
        # once per step (stage.py: backward_maybe_with_nosync, perform_reduce_grad).
        self.sync_last_only = self.fsdp and plan.mesh.pp > 1
        self.unsharded: set = set()             # FSDP units whose parameters are gathered
        self.graphs: dict[tuple, LayerBuilder] = {}
        self.pass_ends: list[int] = []          # unit end tasks of the current pass
        self.reductions: list[int] = []
        self.last_backward = -1

    # ---- helpers ------------------------------------------------------------------------
    def _ctx(self, unit, mb: int) -> dict:
        return {"layer": unit if isinstance(unit, int) else -1, "microbatch": mb}

    def _join(self, deps, unit, mb, phase) -> tuple[int, ...]:
        deps = tuple(d for d in deps if d is not None and d >= 0)
        if len(deps) <= 1:
            return deps
        return (self.sink.add(kind=COMPUTE, stream="compute", op="join", phase=phase, deps=deps,
                              op_class=MEMORY, label="wait", **self._ctx(unit, mb)),)

    def _group_size(self, dims) -> int:
        return self.plan.parallel_dims.group_size(dims)

    def _param_groups(self, unit) -> dict[tuple[str, ...], float]:
        return unit_param_groups(self.plan, unit)

    def _graph(self, unit) -> LayerBuilder:
        return unit_builder(self.plan, unit, self.shape, self.options)

    # ---- FSDP / ZeRO / DDP --------------------------------------------------------------
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
        for dims, params in sorted(self._param_groups(unit).items()):
            if self._group_size(dims) == 1 or params == 0:
                continue
            gathered = params * self.precision.param_bytes
            gather = self.sink.add(
                kind=COMM, stream="dp_ag", op="all_gather", phase=phase,
                deps=(gate,) if gate is not None else (), bytes=gathered,
                group=dims, label=f"fsdp.gather.{unit}", **self._ctx(unit, mb))
            # FSDP2 copies the gathered flat buffer out into the unsharded parameters on
            # the compute stream (foreach_all_gather_copy_out): read + write once.
            tasks.append(self.sink.add(
                kind=COMPUTE, stream="compute", op="fsdp_copy_out", phase=phase,
                deps=(gather,), bytes=2 * gathered, op_class=MEMORY,
                label=f"fsdp.copy_out.{unit}", **self._ctx(unit, mb)))
        return tasks

    def _after_use(self, unit, phase: str, mb: int) -> None:
        resharded = (self.plan.reshard_after_forward if phase == "forward"
                     else not self.sync_last_only or mb == self.plan.micro_batches - 1)
        if resharded:
            self.unsharded.discard(unit)
        else:
            self.unsharded.add(unit)

    def _reduce(self, unit, deps: tuple[int, ...], mb: int) -> None:
        last_mb = mb == self.plan.micro_batches - 1
        every_mb = (self.fsdp and not self.sync_last_only) or self.plan.zero_stage == 2
        if not (every_mb or last_mb):
            return
        op = "reduce_scatter" if (self.fsdp or self.plan.zero_stage >= 1) else "all_reduce"
        for dims, params in sorted(self._param_groups(unit).items()):
            if self._group_size(dims) == 1 or params == 0:
                continue
            ready = deps
            if self.fsdp:
                # FSDP2 copies (and casts) the unsharded gradients into the reduce-scatter
                # input on its reduce-scatter stream (foreach_reduce): read the gradients,
                # write the reduce-dtype buffer.
                ready = (self.sink.add(
                    kind=COMPUTE, stream="dp_rs", op="fsdp_copy_in", phase="backward",
                    deps=deps, op_class=MEMORY, label=f"grad.copy_in.{unit}",
                    bytes=params * (self.precision.param_bytes + self.precision.grad_reduce_bytes),
                    **self._ctx(unit, mb)),)
            self.reductions.append(self.sink.add(
                kind=COMM, stream="dp_rs", op=op, phase="backward", deps=ready,
                bytes=params * self.precision.grad_reduce_bytes, group=dims,
                label=f"grad.reduce.{unit}", **self._ctx(unit, mb)))

    # ---- passes -------------------------------------------------------------------------
    def _p2p(self, kind: str, what: str, mb: int, deps, peer: int, phase: str,
             chunk: int) -> int:
        sh = self.shape
        size = sh.tokens * self.plan.model.hidden_size * sh.act_bytes
        if self.plan.sequence_parallel:
            size /= sh.tp
        elif self.plan.grid_strategy is not None:
            size *= self.plan.parallel_dims.grid.resid_fraction
        src = chunk if kind == "send" else chunk + peer
        return self.sink.add(kind=COMM, stream=f"pp_{kind}", op="send_recv", phase=phase,
                             deps=tuple(deps), bytes=size, group=("pp",), peer=peer,
                             tag=(what, src, mb), label=f"pp.{kind}.{what}", layer=-1,
                             microbatch=mb)

    def forward(self, mb: int, local: int = 0) -> None:
        """One micro-batch's forward through one of the stage's chunks."""
        self.pass_ends = []
        chunk = local * self.pp + self.stage
        prev = self._p2p("recv", "act", mb, (), -1, "forward", chunk) if chunk > 0 else None
        for index, unit in enumerate(self.chunk_units[local]):
            gathers = self._gather(unit, index, mb, "forward")
            graph = self._graph(unit)
            deps = self._join([prev, *gathers], unit, mb, "forward")
            prev = graph.emit_forward(self.sink, self._ctx(unit, mb), deps)
            self.graphs[(unit, mb)] = graph
            self.pass_ends.append(prev)
        if chunk < self.last_chunk:
            self._p2p("send", "act", mb, (prev,), +1, "forward", chunk)

    def backward(self, mb: int, local: int = 0) -> None:
        """One micro-batch's backward through one of the stage's chunks, in reverse."""
        self.pass_ends = []
        chunk = local * self.pp + self.stage
        if chunk < self.last_chunk:
            grad = self._p2p("recv", "grad", mb, (), +1, "backward", chunk)
        else:
            grad = self.graphs[(HEAD, mb)].output_task
        for index, unit in enumerate(reversed(self.chunk_units[local])):
            gathers = self._gather(unit, index, mb, "backward")
            graph = self.graphs.pop((unit, mb))
            ctx = self._ctx(unit, mb)
            deps = self._join([grad, *gathers], unit, mb, "backward")
            if self.plan.recompute in ("full", "selective_op") and isinstance(unit, int):
                # the whole layer reruns (its options ask for no separate attention
                # recompute: that is selective recompute's alone)
                graph = self._graph(unit)
                # op-level checkpointing reruns only what it did not keep (1D TP only)
                kept = ({"saved": op_checkpoint_saved(graph)}
                        if self.plan.recompute == "selective_op" else {})
                deps = (graph.emit_forward(self.sink, ctx, deps, phase="recompute", **kept),)
            grad = graph.emit_backward(self.sink, ctx, deps[0] if len(deps) == 1 else grad)
            self.pass_ends.append(grad)
            wgrads = tuple(graph.wgrad_tasks.values()) or (grad,)
            self._reduce(unit, wgrads, mb)
        if chunk > 0:
            self._p2p("send", "grad", mb, (grad,), -1, "backward", chunk)
        self.last_backward = grad

    def _param_tensors(self) -> int:
        """Parameter tensors of this stage: a layer's projections and two norms, the
        embedding, the final norm and the output layer (MoE experts counted as dense)."""
        per_layer = 4 + len(self.plan.model.mlp_matrices) + 2
        return sum(1 if u == EMBED else 2 if u == HEAD else per_layer for u in self.units)

    def optimizer(self) -> None:
        """Adam on this rank's parameter shard, then ZeRO-1/2's parameter all-gathers."""
        local = 0.0
        for unit in self.units:
            for dims, params in self._param_groups(unit).items():
                sharded = self.fsdp or self.plan.zero_stage >= 1
                local += params / (self._group_size(dims) if sharded else 1)
        nbytes, kernels = adam_step_cost(self.plan.optimizer, local, self._param_tensors())
        step = self.sink.add(kind=COMPUTE, stream="compute", op="adam", phase="optimizer",
                             deps=(self.last_backward, *self.reductions), bytes=nbytes,
                             kernels=kernels, op_class=MEMORY, label="optimizer.step",
                             layer=-1, microbatch=-1)
        if self.plan.zero_stage in (1, 2) and not self.fsdp:
            for unit in self.units:
                for dims, params in sorted(self._param_groups(unit).items()):
                    if self._group_size(dims) > 1 and params:
                        self.sink.add(kind=COMM, stream="dp_ag", op="all_gather",
                                      phase="optimizer", deps=(step,), bytes=params * self.precision.param_bytes,
                                      group=dims, label=f"zero.gather.{unit}",
                                      **self._ctx(unit, -1))

    def build(self) -> list[Task]:
        """All tasks of the stage for one training step."""
        order = stage_order(self.plan.pipeline.schedule, self.stage, self.pp,
                            self.plan.micro_batches, self.plan.pipeline.virtual_stages)
        for kind, mb, local in order:
            (self.forward if kind == "F" else self.backward)(mb, local)
        self.optimizer()
        return self.sink.tasks
