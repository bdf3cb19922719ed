"""One transformer layer as a small dataflow graph over TP layouts, lowered to tasks.

The forward graph records every op with the layout of its output; a consumer that needs
another layout gets a redistribution node (one per source and layout, so wq/wk/wv share
one all-gather). The backward walks the graph in reverse like autograd: each node sums
the gradients of its consumers (converted, by collective where needed, to the layout its
own backward wants) and passes input-gradients on. Redistribution nodes pass gradients
straight through, so an all-gather in forward becomes one reduce-scatter of the summed
partial gradients in backward, as DTensor does. The TP communication and the FP8 casts
live in two mixins (workloads/layer_graph_comm.py, workloads/layer_graph_fp8.py).
"""
from __future__ import annotations

from .attention import AttentionCost, LocalAttention
from .context_parallel import ContextParallelAttention
from .context_parallel_torch import TorchRingAttention
from .explicit_comm import ExplicitComm
from .fp8_gather import transpose_bytes
from .graph_node import FUSED_INTO, Node, wgrad_shape
from .kernels import fused_cost
from .layer_graph_comm import TPCommMixin
from .layer_graph_fp8 import FP8CastMixin
from .layer_builder import BuildOptions, LayerBuilder, LayerShape, TaskSink, \
    backward_rescale_task, memory_task
from .layouts import STRATEGY_LAYOUTS, grad_layout_needed
from .program import COMM, COMPUTE, GEMM, MEMORY
from .tp_overlap import USERBUFFERS, chunked_backward


def attention_core(shape: LayerShape, options: BuildOptions, window: int = 0) -> LayerBuilder:
    """The attention core of a 1D tensor-parallel layer (sliding `window`, 0: none): local
    to the rank, or across its context-parallel group."""
    cost = AttentionCost.of_layer(shape, options.flash_attention, window=window,
                                  impl=options.attention_impl)
    if shape.cp > 1 and options.cp_impl == "torch" and shape.cp_mode != "all_to_all":
        return TorchRingAttention(cost, options, shape.cp, shape.cp_mode)
    if shape.cp > 1:
        return ContextParallelAttention(cost, options, shape.cp, shape.cp_mode)
    return LocalAttention(cost, options)


class LayerGraph(TPCommMixin, FP8CastMixin):
    """Build one layer's forward graph, then emit forward and backward tasks (a layer
    builder: workloads/layer_builder.py)."""

    def __init__(self, shape: LayerShape, options: BuildOptions = BuildOptions()):
        self.shape, self.options = shape, options
        self.nodes: list[Node] = []
        self._redistributed: dict[tuple[int, str], Node] = {}
        self.wgrad_tasks: dict[str, int] = {}      # projection -> wgrad task (backward)
        self._ep_grad_layouts: dict[int, str] = {}  # comm/permute node -> its input grad's layout
        self._attention: LayerBuilder | None = None  # the attention core's builder
        self._head_shared: set[int] = set()   # attention inputs every head uses (MLA's RoPE key)
        self._weight_keys: dict[int, str] = {}  # linear node -> its key in wgrad_tasks
        # TP overlap (workloads/tp_overlap.py): task -> the tasks its gathered chunks
        # arrive with; row-linear node -> the task with its reduce-scattered output;
        # wgrads held back to overlap a dgrad's reduce-scatter (userbuffers' bulk method)
        self._chunks: dict[int, list[int]] = {}
        self._reduced: dict[int, int] = {}
        self._deferred: list[tuple[str, dict]] = []
        self._cast_inputs: dict[int, int] = {}   # activation -> its cast, this emission
        # FP8 all-gathers (workloads/fp8_gather.py): redistribution nodes gathered as FP8;
        # backward tasks with an FP8-gathered output gradient; gathered inputs transposed
        self._fp8_gathered: set[int] = set()
        self._fp8_grads: set[int] = set()
        self._fp8_transposed: dict[int, int] = {}
        self._module_casts: dict[str, int] = {}  # fused TE module -> its input's cast

    # ---- graph building ----------------------------------------------------------
    def _node(self, **fields) -> Node:
        node = Node(id=len(self.nodes), **fields)
        self.nodes.append(node)
        return node

    def input(self, layout: str, features: int) -> Node:
        """The layer input (the residual stream)."""
        return self._node(kind="input", name="input", layout=layout, features=features)

    def to_layout(self, node: Node, layout: str, own: bool = False) -> Node:
        """`node` in `layout`, through a redistribution when the layouts differ; `own`:
        a redistribution of its own rather than the one other consumers share, even
        between equal layouts (a module that gathers its input again and reduces its
        input gradient itself, as a LoRA adapter does: _own_gather_backward)."""
        if (node.layout == layout and not own) or self.shape.tp == 1:
            return node
        key = (node.id, layout) if not own else (node.id, layout, len(self.nodes))
        if key not in self._redistributed:
            self._redistributed[key] = self._node(
                kind="redistribute", name=f"{node.name}->{layout}", layout=layout,
                features=node.features, inputs=[node], rows_scale=node.rows_scale,
                own_grad=own)
        return self._redistributed[key]

    def elementwise(self, name: str, inputs: list[Node], layout: str | None = None,
                    features: int | None = None, rw: tuple[float, float] = (1.0, 1.0),
                    rows_scale: float | None = None, passthrough: bool = False,
                    launches: int = 1, backward: tuple[float, int] | None = None,
                    backward_extra: tuple[float, int] | None = None,
                    eager_extra: tuple[tuple[float, int], tuple[float, int]] | None = None) -> Node:
        """A memory-bound op; all inputs are first brought to one layout. By default it
        works on as many token rows as its inputs (MoE: the dispatched expert rows).
        `passthrough`: it only moves rows (MoE permutes), so its gradient may stay a
        partial sum. `launches`: its forward's kernels (MoE: workloads/moe/dispatch.py).
        `backward`: (passes, kernels) of a backward that is not one fused kernel's;
        `backward_extra`: (passes, kernels) run after its backward, fused or eager (a bias
        gradient's reduction); `eager_extra`: (forward, backward) (passes, kernels) added
        to its eager cost only (Node.eager_extra)."""
        layout = layout or inputs[0].layout
        inputs = [self.to_layout(x, layout) for x in inputs]
        rows = max((x.rows_scale for x in inputs), default=1.0) if rows_scale is None \
            else rows_scale
        return self._node(kind="elementwise", name=name, layout=layout,
                          features=features or inputs[0].features, inputs=inputs, rw=rw,
                          rows_scale=rows, passthrough=passthrough, launches=launches,
                          backward=backward, backward_extra=backward_extra,
                          eager_extra=eager_extra)

    def linear(self, name: str, x: Node, strategy: str, out_features: int,
               experts: int = 0, bf16: bool = False, efficiency: float = 1.0,
               launches: int = 1, launch_streams: int = 1, adapter: bool = False) -> Node:
        """A projection under a strategy (col | row | seq | replicate); `experts` > 0 makes
        it a grouped GEMM over that many local experts on the input's (dispatched) rows,
        at `efficiency` relative to one large GEMM, in `launches` kernel launches per GEMM
        over `launch_streams` streams (workloads/moe/grouped_gemm.py). Under a frozen base
        (LoRA) only an `adapter` linear computes its weight gradient."""
        needs, produces, _ = STRATEGY_LAYOUTS[strategy]
        x = self.to_layout(x, needs)
        node_id = len(self.nodes)
        # one wgrad entry per weight: a name used again in this graph (the output layer
        # of a multi-token-prediction module) is told apart by its node
        self._weight_keys[node_id] = (name if name not in self._weight_keys.values()
                                      else f"{name}#{node_id}")
        return self._node(kind="linear", name=name, layout=produces if self.shape.tp > 1 else "R",
                          features=out_features, inputs=[x], strategy=strategy,
                          in_features=x.features, rows_scale=x.rows_scale, experts=experts,
                          bf16=bf16, efficiency=efficiency, launches=launches,
                          launch_streams=launch_streams,
                          frozen=self.options.frozen_base and not adapter)

    def explicit_comm(self, name: str, x: Node, comm: ExplicitComm, layout: str | None = None,
                      rows_scale: float | None = None, features: int | None = None) -> Node:
        """A collective spelled out by the builder (an MoE dispatch or combine); its output
        has `layout` and `rows_scale` (default: the input's)."""
        return self._node(kind="comm", name=name, layout=layout or x.layout,
                          features=features or x.features, inputs=[x], comm=comm,
                          rows_scale=x.rows_scale if rows_scale is None else rows_scale)

    def attention(self, q: Node, k: Node, v: Node | None, window: int = 0,
                  features: int | None = None, head_shared: tuple[Node, ...] = ()) -> Node:
        """Head-parallel causal attention core (workloads/attention.py) with a sliding
        `window` (0: none), `features` out (default q's); v None: k holds the values too
        (MLA's wkv_b). `head_shared` inputs are used whole by every local head (MLA's
        RoPE key): their gradient is a partial sum over the heads of all TP ranks."""
        self._attention = attention_core(self.shape, self.options, window)
        own = [self.to_layout(t, "H") for t in (q, k, v) if t is not None]
        shared = [self.to_layout(t, "H") for t in head_shared]
        self._head_shared = {x.id for x in shared}
        ins = own + shared
        return self._node(kind="attention", name="attention", layout="H" if self.shape.tp > 1 else "R",
                          features=features or q.features, inputs=ins)

    # ---- costs ------------------------------------------------------------------------
    def linear_cost(self, node: Node) -> tuple[float, float, tuple[int, int, int]]:
        """FLOPs, bytes and (m, n, k) of one GEMM of a linear node (fwd = dgrad = wgrad)."""
        sh, st = self.shape, node.strategy
        m = sh.rows(STRATEGY_LAYOUTS[st][0] if sh.tp > 1 else "R") * node.rows_scale
        k = node.in_features / sh.tp if (st == "row" and sh.tp > 1) else node.in_features
        n = node.features / sh.tp if (st == "col" and sh.tp > 1) else node.features
        flops = 2.0 * m * k * n
        operand = sh.operand_bytes(node.bf16)
        if node.experts:
            # Grouped GEMM: the rows split over the local experts, each its weight; one
            # launch tiles every expert's rows, so its waves are those of all the rows
            # (the few-rows-per-expert loss is node.efficiency).
            nbytes = (m * k + node.experts * k * n + m * n) * operand
            return flops, nbytes, (int(m), int(n), int(k))
        return flops, (m * k + k * n + m * n) * operand, (int(m), int(n), int(k))

    def elementwise_task(self, sink: TaskSink, ctx: dict, node: Node, phase: str,
                         deps) -> int:
        """The task of a memory-bound op in forward (or recompute) or backward."""
        sh = self.shape
        local = sh.rows(node.layout) * sh.cols(node.layout, node.features) * sh.act_bytes
        backward = "backward" if phase == "backward" else "forward"
        passes, kernels = fused_cost(node.name, node.rw[0] + node.rw[1], backward)
        fused = (passes, node.launches if backward == "forward" and kernels else kernels)
        if backward == "backward" and node.backward is not None:
            fused = node.backward
        extra = node.eager_extra[backward == "backward"] if node.eager_extra else (0.0, 0)
        if backward == "backward" and node.backward_extra is not None and node.backward is None:
            # its own kernels after the op's backward, whether that is fused or eager
            fused = (fused[0] + node.backward_extra[0], fused[1] + node.backward_extra[1])
            extra = (extra[0] + node.backward_extra[0], extra[1] + node.backward_extra[1])
        return memory_task(sink, ctx, self.options, sh.act_bytes, node.name, phase, deps,
                           local * node.rows_scale, fused,
                           f"{node.name}.{'bwd' if backward == 'backward' else 'fwd'}",
                           eager_extra=extra)

    # ---- emission ---------------------------------------------------------------------
    @property
    def output_task(self) -> int:
        """The forward task producing the graph's output (after emit_forward)."""
        return self.nodes[-1].task

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """Emit forward tasks; returns the id of the task producing the layer output.

        `saved`: ids of nodes whose outputs were kept from the first forward, so that a
        recompute emits nothing for them (their consumers wait only for `input_dep`).
        """
        self._cast_inputs, self._module_casts = {}, {}
        for node in self.nodes:
            deps = tuple(x.task for x in node.inputs) if node.inputs else input_dep
            if node.id in saved:
                node.task = input_dep[0] if input_dep else -1
                continue
            node.task = self._emit_forward_node(sink, ctx, node, deps, phase)
        return self.nodes[-1].task

    def _emit_forward_node(self, sink: TaskSink, ctx: dict, node: Node, deps, phase) -> int:
        if node.kind == "input":
            return deps[0] if deps else -1
        if node.kind == "redistribute":
            if node.inputs[0].id in self._reduced:    # reduce-scattered with its GEMM
                return self._reduced[node.inputs[0].id]
            return self._redistribute(sink, ctx, node, deps, phase)
        if node.kind == "linear":
            flops, nbytes, mnk = self.linear_cost(node)
            deps = self._fp8_cast(sink, ctx, node, flops, mnk, deps, phase, node.name)
            overlapped = self._overlapped_linear(sink, ctx, node, deps, phase, flops, nbytes, mnk)
            if overlapped is not None:
                return overlapped
            return sink.add(kind=COMPUTE, stream="compute", op=node.name, phase=phase,
                            deps=deps, flops=flops, bytes=nbytes, op_class=GEMM, gemm_mnk=mnk,
                            gemm_dtype=self._gemm_dtype(node), label=f"{node.name}.fwd",
                            efficiency=node.efficiency, kernels=node.launches,
                            launch_streams=node.launch_streams, **ctx)
        if node.kind == "comm":
            return node.comm.emit(sink, ctx, node.name, deps, phase, backward=False)
        if node.kind == "attention":
            return self._attention.emit_forward(sink, ctx, deps, phase)
        return self.elementwise_task(sink, ctx, node, phase, deps)

    def _gemm_dtype(self, node: Node) -> str:
        return self.shape.gemm_dtype(node.bf16)

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Emit backward tasks given the output-gradient task.

        Returns the task producing the gradient of the graph's input, or, for a graph
        without an input (the embedding), its last backward task.
        """
        self._cast_inputs, self._fp8_grads, self._fp8_transposed = {}, set(), {}
        self._module_of_grad: dict[int, str] = {}
        grads: dict[int, list[tuple[int, str]]] = {n.id: [] for n in self.nodes}
        out = self.nodes[-1]
        grads[self.through(out).id].append((grad_dep, out.layout))
        result = grad_dep
        for node in reversed(self.nodes):
            if (node.kind == "redistribute" and not node.own_grad) or not grads[node.id]:
                continue
            if node.frozen and node.kind == "elementwise":
                continue   # a frozen lookup (LoRA's embedding): its gradient is not wanted
            if node.kind == "redistribute":   # a module's own gather: reduced apart
                source, grad = self._own_gather_backward(sink, ctx, node, grads[node.id])
                grads[self.through(source).id].append(grad)
                continue
            start = len(sink.tasks)
            result = self._combine(sink, ctx, node, grads[node.id])
            if any(t.kind == COMM for t in sink.tasks[start:]):
                self._flush_wgrads(sink)   # after the collective the wgrads overlap
            if node.kind == "input":
                continue
            produced = self._emit_backward_node(sink, ctx, node, result)
            for source, grad in produced:
                grads[self.through(source).id].append(grad)
                if node.kind == "linear" and self.options.fused_linear_grads:
                    self._module_of_grad[grad[0]] = FUSED_INTO.get(node.name, node.name)
            result = produced[0][1][0] if produced else sink.tasks[-1].id
        self._flush_wgrads(sink)
        return result

    @staticmethod
    def through(node: Node) -> Node:
        """The node behind `node`'s shared redistributions (a module's own stops it)."""
        while node.kind == "redistribute" and not node.own_grad:
            node = node.inputs[0]
        return node

    def _combine(self, sink: TaskSink, ctx: dict, node: Node, grads) -> int:
        """Convert consumers' gradients to the layout this node's backward needs, sum."""
        target = grad_layout_needed(node.layout) if self.shape.tp > 1 else node.layout
        moves_rows = node.kind == "comm" or node.passthrough
        if moves_rows and len({layout for _, layout in grads}) == 1:
            # A dispatcher's collective or permute takes its output gradient as it comes
            # (they are linear: partial sums pass through them).
            target = grads[0][1]
        if moves_rows:
            given = node.comm.grad_layout if node.comm else None
            self._ep_grad_layouts[node.id] = given or target
        by_layout: dict[str, list[int]] = {}
        for task, layout in grads:
            by_layout.setdefault(layout if self.shape.tp > 1 else target, []).append(task)
        ready = []
        for layout, tasks in sorted(by_layout.items()):
            summed = tasks[0] if len(tasks) == 1 else self._accumulate(sink, ctx, node, layout, tasks)
            ready.append(self._gather_grad(sink, ctx, node, layout, target, summed)
                         if layout != target else summed)
        return ready[0] if len(ready) == 1 else self._accumulate(sink, ctx, node, target, ready)

    def _accumulate(self, sink: TaskSink, ctx: dict, node: Node, layout: str, tasks) -> int:
        # one TE module's GEMMs (graph_node.FUSED_INTO) give one input gradient: no add
        summed, sh = len({self._module_of_grad.get(t, t) for t in tasks}), self.shape
        if summed == 1:
            return sink.add(kind=COMPUTE, stream="compute", op="join", phase="backward",
                            deps=tuple(tasks), kernels=0, label=f"grad.{node.name}", **ctx)
        local = sh.rows(layout) * sh.cols(layout, node.features) * sh.act_bytes * node.rows_scale
        return sink.add(kind=COMPUTE, stream="compute", op="grad_accumulate", phase="backward",
                        deps=tuple(tasks), bytes=local * (summed + 1), op_class=MEMORY,
                        label=f"grad.{node.name}", **ctx)

    def _emit_backward_node(self, sink: TaskSink, ctx: dict, node: Node, ready: int):
        """Backward of one node; returns [(input node, (task, grad layout)), ...]."""
        tp1 = self.shape.tp == 1
        if node.kind == "linear":
            flops, nbytes, (m, n, k) = self.linear_cost(node)
            common = dict(kind=COMPUTE, stream="compute", phase="backward", flops=flops,
                          bytes=nbytes, op_class=GEMM, gemm_dtype=self._gemm_dtype(node),
                          efficiency=node.efficiency, kernels=node.launches,
                          launch_streams=node.launch_streams, **ctx)
            if ready in self._fp8_grads:   # cast before its all-gather
                if transpose_bytes(self.shape.recipe):   # the wgrad reads a transpose
                    return self._transposed_backward(sink, ctx, node, ready, common)
            else:
                ready, = self._fp8_cast(sink, ctx, node, flops, (m, n, k), (ready,),
                                        "backward", f"grad.{node.name}")
            if ready in self._chunks:    # the gathered output gradient, chunk by chunk
                dgrad, wgrad = chunked_backward(
                    sink, self._chunks[ready], flops, nbytes, (m, n, k), node.name,
                    op=node.name, phase="backward", gemm_dtype=self._gemm_dtype(node),
                    weight_grad=not node.frozen, **ctx)
                if not node.frozen:
                    self.wgrad_tasks[self._weight_keys[node.id]] = wgrad
            else:
                dgrad = sink.add(op=node.name, deps=(ready,), gemm_mnk=(m, k, n),
                                 label=f"{node.name}.dgrad", **common)
            if ready not in self._chunks and not node.frozen:
                wgrad = dict(op=node.name, deps=(ready,), label=f"{node.name}.wgrad",
                             **{**common, **wgrad_shape(node, m, n, k)})
                if self.options.tp_overlap == USERBUFFERS and node.strategy == "col":
                    # bulk overlap: the dgrad's reduce-scatter runs beside this wgrad
                    self._deferred.append((self._weight_keys[node.id], wgrad))
                else:
                    self.wgrad_tasks[self._weight_keys[node.id]] = sink.add(**wgrad)
            # both GEMMs' outputs (m x k and k x n) rescaled, priced after the dgrad
            dgrad = backward_rescale_task(sink, ctx, self.shape, (m + n) * k, dgrad,
                                          f"grad.{node.name}", node.bf16)
            layout = "R" if tp1 else STRATEGY_LAYOUTS[node.strategy][2]
            return [(node.inputs[0], (dgrad, layout))]
        if node.kind == "comm":
            if node.comm.bwd_op is None:
                return []
            task = node.comm.emit(sink, ctx, node.name, (ready,), "backward", backward=True)
            return [(node.inputs[0], (task, self._ep_grad_layouts[node.id]))]
        if node.kind == "attention":
            task = self._attention.emit_backward(sink, ctx, ready)
            return [(x, (task, "R" if tp1 else "P" if x.id in self._head_shared else "H"))
                    for x in node.inputs]
        task = self.elementwise_task(sink, ctx, node, "backward", (ready,))
        # A partial-sum output's gradient is whole (R) on every rank, and so is its input's.
        layout = (self._ep_grad_layouts[node.id] if node.passthrough else
                  grad_layout_needed(node.layout) if not tp1 else node.layout)
        return [(x, (task, layout)) for x in node.inputs]
