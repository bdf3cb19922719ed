"""The tensor-parallel communication of a LayerGraph (workloads/layer_graph.py).

A layout change between two nodes is a DTensor redistribution: a collective over the TP
group plus the copies DTensor makes around it. Under TP communication overlap
(workloads/tp_overlap.py) the sequence-parallel all-gather runs as ring steps whose
chunks the consuming GEMMs take as they arrive, and a row-parallel GEMM feeding a
reduce-scatter is chunked with it. LayerGraph inherits these methods; they read its
shape, options, nodes and the chunk / reduction records it keeps.
"""
from __future__ import annotations

from .fp8_gather import AMAX_ALL_REDUCE_BYTES, FP8_GATHER_BYTES, gathers_quantized, local_cast
from .graph_node import Node
from .layer_builder import TaskSink
from .layouts import collective, collective_bytes, grad_layout_needed
from .program import COMM, COMPUTE, MEMORY, RELAYOUT
from .tp_overlap import UB_SMS, USERBUFFERS, chunked_gemm, gemm_reduce_scatter, ring_gather


class TPCommMixin:
    """Redistributions and overlapped TP transfers of one layer's graph."""

    def _comm(self, sink: TaskSink, ctx: dict, src: str, dst: str, features: int, deps,
              phase: str, label: str, rows_scale: float = 1.0, chunked: bool = False,
              element_bytes: float = 0.0) -> int:
        """A redistribution of a tensor of `features` from layout `src` to `dst`, of
        `element_bytes` per element (0: the activations' bytes)."""
        op = collective(src, dst)
        element_bytes = element_bytes or self.shape.act_bytes
        if chunked and op == "all_gather" and self.options.tp_overlap:
            return self._ring_gather(sink, ctx, features, deps, phase, label, rows_scale,
                                     element_bytes)
        if op is None:
            return deps[0] if len(deps) == 1 else sink.add(
                kind=COMPUTE, stream="compute", op="join", phase=phase, deps=tuple(deps),
                op_class=MEMORY, label=label, **ctx)
        sh = self.shape
        full = sh.tokens * features * element_bytes * rows_scale
        # Activations are [batch, sequence, features]: the sequence (S) and feature (H)
        # shards are not dim 0, so DTensor chunks and concatenates around the collective,
        # one read and one write of the local tensor (autoparallel's redistribute cost:
        # non-dim-0 gather/scatter and Shard->Shard add compute_read_write_time(2 x bytes):
        # meta-pytorch/autoparallel, autoparallel/cost_models/collective_runtime_estimation.py).
        copy = {"all_gather": 2 * full, "reduce_scatter": 2 * full,
                "all_to_all": 2 * full / sh.tp}.get(op, 0.0)
        deps = tuple(deps)
        if copy and op == "reduce_scatter":   # the input is made contiguous per shard first
            deps = (sink.add(kind=COMPUTE, stream="compute", op=RELAYOUT, phase=phase,
                             deps=deps, bytes=copy, op_class=MEMORY, label=f"{label}.relayout",
                             **ctx),)
        # under userbuffers a sequence-parallel gather or reduce-scatter outside the ring
        # exchange is TE's bulk method, on its own SMs (tp_overlap.UB_SMS); else NCCL's
        bulk = self.userbuffers and op in ("all_gather", "reduce_scatter")
        task = sink.add(kind=COMM, stream="tp", op=op, phase=phase, deps=deps,
                        bytes=collective_bytes(op, full, sh.tp), group=("tp",),
                        label=label, sm_count=UB_SMS if bulk else 0, **ctx)
        if copy and op != "reduce_scatter":   # the gathered chunks are concatenated after
            task = sink.add(kind=COMPUTE, stream="compute", op=RELAYOUT, phase=phase,
                            deps=(task,), bytes=copy, op_class=MEMORY,
                            label=f"{label}.relayout", **ctx)
        return task

    def _feeds_only_linears(self, node: Node) -> bool:
        users = [n for n in self.nodes if node in n.inputs]
        return bool(users) and all(n.kind == "linear" and not n.experts for n in users)

    def _ring_gather(self, sink: TaskSink, ctx: dict, features: int, deps, phase: str,
                     label: str, rows_scale: float, element_bytes: float) -> int:
        """A sequence-parallel all-gather as tp ring steps; its consumers GEMM each chunk
        as it arrives (chunked_gemm). Returns the last arrival."""
        sh = self.shape
        chunk = sh.tokens * features * element_bytes * rows_scale / sh.tp
        chunks = ring_gather(sink, ctx, tuple(deps), chunk, sh.tp, phase, label)
        self._chunks[chunks[-1]] = chunks
        return chunks[-1]

    def _overlapped_linear(self, sink: TaskSink, ctx: dict, node: Node, deps, phase: str,
                           flops: float, nbytes: float, mnk) -> int | None:
        """A linear's forward GEMM chunked with the TP transfer before or after it, or
        None when it has none to overlap."""
        if not self.options.tp_overlap or node.experts:
            return None
        fields = dict(op=node.name, phase=phase, gemm_dtype=self._gemm_dtype(node), **ctx)
        operand = nbytes / max(1, mnk[0] * mnk[2] + mnk[2] * mnk[1] + mnk[0] * mnk[1])
        if len(deps) == 1 and deps[0] in self._chunks:
            return chunked_gemm(sink, self._chunks[deps[0]], flops, operand, mnk, 0,
                                f"{node.name}.fwd", **fields)
        users = [n for n in self.nodes if node in n.inputs]
        if node.strategy == "row" and users and all(
                n.kind == "redistribute" and collective(node.layout, n.layout) == "reduce_scatter"
                for n in users):
            sh = self.shape
            chunk = sh.tokens * node.features * sh.act_bytes * node.rows_scale / sh.tp
            out = gemm_reduce_scatter(sink, ctx, self.options.tp_overlap, sh.tp, deps, flops,
                                      operand, mnk, chunk, phase, f"{node.name}.fwd",
                                      op=node.name, gemm_dtype=self._gemm_dtype(node))
            self._reduced[node.id] = out
            return out
        return None

    # ---- per-tensor FP8 around the all-gathers (workloads/fp8_gather.py) ---------------
    def _gathers_fp8(self, users: list[Node]) -> bool:
        """Whether an all-gather feeding `users` moves the FP8 cast of the local shard."""
        sh = self.shape
        return (gathers_quantized(sh.recipe, self.options.fused_te_modules) and bool(users)
                and all(u.kind == "linear" and not u.experts and not sh.stays_bf16(u.bf16)
                        for u in users))

    def _redistribute(self, sink: TaskSink, ctx: dict, node: Node, deps, phase: str) -> int:
        """A forward redistribution node; an all-gather into quantised linears casts the
        local shard first and gathers FP8 (its consumers then cast nothing)."""
        src = node.inputs[0]
        users = [n for n in self.nodes if node in n.inputs]
        element_bytes = 0.0
        if collective(src.layout, node.layout) == "all_gather" and self._gathers_fp8(users):
            deps = self._cast_before_gather(sink, ctx, src.features * src.rows_scale, deps,
                                            phase, node.name, after_norm="norm" in src.name)
            element_bytes = FP8_GATHER_BYTES
            self._fp8_gathered.add(node.id)
        return self._comm(sink, ctx, src.layout, node.layout, node.features, deps, phase,
                          node.name, node.rows_scale,
                          # a module's own gather is a plain one (not Transformer Engine's)
                          chunked=self._feeds_only_linears(node) and not node.own_grad,
                          element_bytes=element_bytes)

    def _gather_grad(self, sink: TaskSink, ctx: dict, node: Node, layout: str, target: str,
                     summed: int) -> int:
        """A linear's output gradient brought to the layout its backward needs; gathered
        as FP8 (cast locally first) into a quantised linear (recorded in _fp8_grads)."""
        chunked = node.kind == "linear" and not node.experts
        if not (chunked and collective(layout, target) == "all_gather"
                and self._gathers_fp8([node])):
            return self._comm(sink, ctx, layout, target, node.features, (summed,),
                              "backward", f"grad.{node.name}", node.rows_scale, chunked=chunked)
        label = f"grad.{node.name}"
        deps = self._cast_before_gather(sink, ctx, node.features * node.rows_scale, (summed,),
                                        "backward", label, after_norm=False)
        task = self._comm(sink, ctx, layout, target, node.features, deps, "backward", label,
                          node.rows_scale, chunked=True, element_bytes=FP8_GATHER_BYTES)
        self._fp8_grads.add(task)
        return task

    def _cast_before_gather(self, sink: TaskSink, ctx: dict, features: float, deps,
                            phase: str, label: str, after_norm: bool) -> tuple[int, ...]:
        """The row-wise cast of the sequence shard (tokens / tp rows of `features`), then
        the all-reduce of its scale's amax over the TP group where the recipe has one."""
        sh, recipe = self.shape, self.shape.recipe
        per_element, kernels = local_cast(recipe, after_norm)
        if not kernels:
            return tuple(deps)
        task = sink.add(kind=COMPUTE, stream="compute", op=f"{recipe.name}_cast", phase=phase,
                        deps=tuple(deps), bytes=sh.rows("S") * features * per_element,
                        op_class=MEMORY, kernels=kernels,
                        label=f"{label}.{recipe.name}_cast", **ctx)
        if recipe.amax_all_reduce:   # the amax pass precedes it; the scale waits for it
            task = sink.add(kind=COMM, stream="tp", op="all_reduce", phase=phase,
                            deps=(task,), bytes=AMAX_ALL_REDUCE_BYTES, group=("tp",),
                            label=f"{label}.amax", **ctx)
        return (task,)

    def _own_gather_backward(self, sink: TaskSink, ctx: dict, node: Node, grads):
        """The backward of a module's own redistribution (a LoRA adapter's gather of the
        sequence-parallel input, gather_from_sequence_parallel_region, or its cut of a
        gathered output to the sequence shard, scatter_to_sequence_parallel_region): its
        consumers' gradients summed, then brought back to the source's layout by a
        collective of its own (a reduce-scatter, an all-gather), apart from the shared
        redistribution's."""
        layout = grads[0][1]
        tasks = [task for task, _ in grads]
        summed = tasks[0] if len(tasks) == 1 else self._accumulate(sink, ctx, node, layout, tasks)
        source = node.inputs[0]
        target = grad_layout_needed(source.layout)
        if layout != target:
            summed = self._comm(sink, ctx, layout, target, node.features, (summed,),
                                "backward", f"grad.{node.name}", node.rows_scale)
        return source, (summed, target)

    def _flush_wgrads(self, sink: TaskSink) -> None:
        """Emit the held-back wgrad GEMMs (after the reduce-scatter they overlap)."""
        for name, fields in self._deferred:
            self.wgrad_tasks[name] = sink.add(**fields)
        self._deferred = []

    @property
    def userbuffers(self) -> bool:
        """Whether TP communication overlaps the GEMMs through Transformer Engine's
        userbuffers (overlap.tp_comm: workloads/tp_overlap.py)."""
        return self.options.tp_overlap == USERBUFFERS
