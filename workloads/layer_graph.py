"""One transformer layer as a small dataflow graph over TP layouts, lowered to tasks.

The forward graph records every op with the layout of its output; a consumer that needs
another layout gets a redistribution node (one per source and layout, so wq/wk/wv share
one all-gather). The backward walks the graph in reverse like autograd: each node sums
the gradients of its consumers (converted, by collective where needed, to the layout its
own backward wants) and passes input-gradients on. Redistribution nodes pass gradients
straight through, so an all-gather in forward becomes one reduce-scatter of the summed
partial gradients in backward, as DTensor does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from .kernels import FP8_CAST_BYTES_PER_ELEMENT, elementwise_cost
from .layouts import STRATEGY_LAYOUTS, collective, collective_bytes, grad_layout_needed
from .program import ATTENTION, COMM, COMPUTE, GEMM, MEMORY, RELAYOUT, Task


@dataclass
class Node:
    """A tensor produced by an op: its layout, feature width and how it was made."""

    id: int
    kind: str                      # input | elementwise | linear | attention | redistribute
    name: str
    layout: str
    features: int
    inputs: list["Node"] = field(default_factory=list)
    strategy: str = ""             # linear only
    in_features: int = 0           # linear only
    rw: tuple[float, float] = (1.0, 1.0)   # elementwise: tensors read, written (x features)
    task: int = -1                 # id of the task that produced it in forward
    rows_scale: float = 1.0        # token rows relative to the layer's (MoE: top_k x imbalance)
    experts: int = 0               # linear only: a grouped GEMM over this many local experts
    bf16: bool = False             # linear only: stays a bf16 GEMM under FP8 training


class TaskSink:
    """Appends tasks with sequential ids; shared by all lowering steps of one stage."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def add(self, **fields) -> int:
        """Append a task and return its id."""
        task = Task(id=len(self.tasks), **fields)
        self.tasks.append(task)
        return task.id


@dataclass(frozen=True)
class LayerShape:
    """Per-rank sizes of one micro-batch through one layer."""

    tokens: int            # tokens of this micro-batch on this rank before TP (b * s / cp)
    seq_len: int           # full sequence (keys seen by attention)
    tp: int
    heads: int
    kv_heads: int
    head_dim: int
    act_bytes: int         # bytes per activation element (bf16: 2)
    gemm_bytes: int        # bytes per GEMM operand element (bf16: 2, fp8: 1)
    cp: int = 1            # context-parallel degree (workloads/context_parallel.py)
    cp_mode: str = "ring"  # ring | all_gather | all_to_all

    def rows(self, layout: str) -> float:
        """Local token rows of a tensor in a layout."""
        return self.tokens / self.tp if layout == "S" else self.tokens

    def cols(self, layout: str, features: int) -> float:
        """Local feature columns of a tensor in a layout."""
        return features / self.tp if layout == "H" else features


def causal_attention_flops(queries: float, keys: float, head_dim: int, heads: float) -> float:
    """Forward FLOPs of causal attention: QK^T and PV, 2 * s_q * s_k * d each per head,
    halved by the causal mask (the convention of Megatron-LM's and FlashAttention's
    causal FLOP counts). `queries` counts query tokens over the batch."""
    return 4.0 * queries * keys * head_dim * heads * 0.5


class LayerGraph:
    """Build one layer's forward graph, then emit forward and backward tasks."""

    def __init__(self, shape: LayerShape):
        self.shape = shape
        self.nodes: list[Node] = []
        self._redistributed: dict[tuple[int, str], Node] = {}
        self.wgrad_tasks: dict[str, int] = {}      # projection -> wgrad task (backward)
        self._ep_grad_layouts: dict[int, str] = {}  # all-to-all node -> its gradient's layout
        # Selective recompute (Korthikanti et al. 2022, arXiv:2205.05198 section 5):
        # the attention core's forward runs again just before its backward.
        self.recompute_attention = False
        # FlashAttention recomputes the scores inside its backward instead.
        self.flash_attention = True
        # How memory-bound ops run: fused kernels or PyTorch eager (workloads/kernels.py).
        self.kernel_mode = "fused"

    # ---- graph building ----------------------------------------------------------
    def _node(self, **fields) -> Node:
        node = Node(id=len(self.nodes), **fields)
        self.nodes.append(node)
        return node

    def input(self, layout: str, features: int) -> Node:
        """The layer input (the residual stream)."""
        return self._node(kind="input", name="input", layout=layout, features=features)

    def to_layout(self, node: Node, layout: str) -> Node:
        """`node` in `layout`, through a redistribution when the layouts differ."""
        if node.layout == layout or self.shape.tp == 1:
            return node
        key = (node.id, layout)
        if key not in self._redistributed:
            self._redistributed[key] = self._node(
                kind="redistribute", name=f"{node.name}->{layout}", layout=layout,
                features=node.features, inputs=[node], rows_scale=node.rows_scale)
        return self._redistributed[key]

    def elementwise(self, name: str, inputs: list[Node], layout: str | None = None,
                    features: int | None = None, rw: tuple[float, float] = (1.0, 1.0),
                    rows_scale: float | None = None) -> Node:
        """A memory-bound op; all inputs are first brought to one layout. By default it
        works on as many token rows as its inputs (MoE: the dispatched expert rows)."""
        layout = layout or inputs[0].layout
        inputs = [self.to_layout(x, layout) for x in inputs]
        rows = max((x.rows_scale for x in inputs), default=1.0) if rows_scale is None \
            else rows_scale
        return self._node(kind="elementwise", name=name, layout=layout,
                          features=features or inputs[0].features, inputs=inputs, rw=rw,
                          rows_scale=rows)

    def linear(self, name: str, x: Node, strategy: str, out_features: int,
               experts: int = 0, bf16: bool = False) -> Node:
        """A projection under a strategy (col | row | seq | replicate); `experts` > 0 makes
        it a grouped GEMM over that many local experts on the input's (dispatched) rows."""
        needs, produces, _ = STRATEGY_LAYOUTS[strategy]
        x = self.to_layout(x, needs)
        return self._node(kind="linear", name=name, layout=produces if self.shape.tp > 1 else "R",
                          features=out_features, inputs=[x], strategy=strategy,
                          in_features=x.features, rows_scale=x.rows_scale, experts=experts,
                          bf16=bf16)

    def ep_all_to_all(self, name: str, x: Node, rows_scale: float) -> Node:
        """An expert-parallel all-to-all (MoE dispatch or combine) over the "ep" group; the
        layout is kept, `rows_scale` is the token rows it moves (top_k x imbalance)."""
        return self._node(kind="ep_a2a", name=name, layout=x.layout, features=x.features,
                          inputs=[x], rows_scale=rows_scale)

    def attention(self, q: Node, k: Node, v: Node) -> Node:
        """Head-parallel causal attention core (flash-attention style)."""
        ins = [self.to_layout(t, "H") for t in (q, k, v)]
        return self._node(kind="attention", name="attention", layout="H" if self.shape.tp > 1 else "R",
                          features=q.features, inputs=ins)

    # ---- costs ------------------------------------------------------------------------
    def linear_cost(self, node: Node) -> tuple[float, float, tuple[int, int, int]]:
        """FLOPs, bytes and (m, n, k) of one GEMM of a linear node (fwd = dgrad = wgrad)."""
        sh, st = self.shape, node.strategy
        m = sh.rows(STRATEGY_LAYOUTS[st][0] if sh.tp > 1 else "R") * node.rows_scale
        k = node.in_features / sh.tp if (st == "row" and sh.tp > 1) else node.in_features
        n = node.features / sh.tp if (st == "col" and sh.tp > 1) else node.features
        flops = 2.0 * m * k * n
        operand = max(sh.gemm_bytes, 2) if node.bf16 else sh.gemm_bytes
        if node.experts:
            # Grouped GEMM: the rows split evenly over the local experts, each its weight.
            nbytes = (m * k + node.experts * k * n + m * n) * operand
            return flops, nbytes, (int(m / node.experts), int(n), int(k))
        return flops, (m * k + k * n + m * n) * operand, (int(m), int(n), int(k))

    def attention_flops(self) -> float:
        """Forward FLOPs of this rank's causal attention (its heads, its tokens)."""
        sh = self.shape
        return causal_attention_flops(sh.tokens, sh.seq_len, sh.head_dim, sh.heads / sh.tp)

    def attention_bytes(self) -> float:
        """HBM traffic of a flash-attention forward: read q, k, v, write o (and lse)."""
        sh = self.shape
        q = sh.tokens * sh.heads / sh.tp * sh.head_dim
        kv = 2 * sh.tokens * sh.kv_heads / sh.tp * sh.head_dim
        return (2 * q + kv) * sh.act_bytes

    def elementwise_cost(self, node: Node, phase: str = "forward") -> tuple[float, int]:
        """(HBM bytes, kernel launches) of a memory-bound op in forward or backward."""
        sh = self.shape
        local = sh.rows(node.layout) * sh.cols(node.layout, node.features) * sh.act_bytes
        passes, kernels = elementwise_cost(node.name, self.kernel_mode, sh.act_bytes,
                                           node.rw[0] + node.rw[1], phase)
        return local * node.rows_scale * passes, kernels

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
        for node in self.nodes:
            deps = tuple(x.task for x in node.inputs) if node.inputs else input_dep
            if node.id in saved:
                node.task = input_dep[0] if input_dep else -1
                continue
            node.task = self._emit_forward_node(sink, ctx, node, deps, phase)
        return self.nodes[-1].task

    def _emit_forward_node(self, sink: TaskSink, ctx: dict, node: Node, deps, phase) -> int:
        sh = self.shape
        if node.kind == "input":
            return deps[0] if deps else -1
        if node.kind == "redistribute":
            return self._comm(sink, ctx, node.inputs[0].layout, node.layout, node.features,
                              deps, phase, f"{node.name}", node.rows_scale)
        if node.kind == "linear":
            flops, nbytes, mnk = self.linear_cost(node)
            deps = self._fp8_cast(sink, ctx, node, flops / (2 * mnk[1]), deps, phase, node.name)
            return sink.add(kind=COMPUTE, stream="compute", op=node.name, phase=phase,
                            deps=deps, flops=flops, bytes=nbytes, op_class=GEMM, gemm_mnk=mnk,
                            gemm_dtype=self._gemm_dtype(node), label=f"{node.name}.fwd", **ctx)
        if node.kind == "ep_a2a":
            return self._ep_a2a(sink, ctx, node, deps, phase, f"moe.{node.name}")
        if node.kind == "attention" and sh.cp > 1:
            from .context_parallel import attention_forward
            return attention_forward(self, sink, ctx, deps, phase)
        if node.kind == "attention":
            return sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                            deps=deps, flops=self.attention_flops(),
                            bytes=self.attention_bytes(), op_class=ATTENTION,
                            label="attention.fwd", **ctx)
        nbytes, kernels = self.elementwise_cost(node)
        return sink.add(kind=COMPUTE, stream="compute", op=node.name, phase=phase, deps=deps,
                        bytes=nbytes, op_class=MEMORY, kernels=kernels,
                        label=f"{node.name}.fwd", **ctx)

    def _gemm_dtype(self, node: Node) -> str:
        return "bf16" if node.bf16 and self.shape.gemm_bytes == 1 else ""

    def _fp8_cast(self, sink: TaskSink, ctx: dict, node: Node, elements: float, deps,
                  phase: str, name: str) -> tuple[int, ...]:
        """Under FP8 GEMMs, the cast (and transpose) of an activation operand before the
        GEMM (workloads/kernels.py); returns the GEMM's dependencies."""
        if self.shape.gemm_bytes != 1 or node.bf16:
            return tuple(deps)
        return (sink.add(kind=COMPUTE, stream="compute", op="fp8_cast", phase=phase,
                         deps=tuple(deps), bytes=elements * FP8_CAST_BYTES_PER_ELEMENT,
                         op_class=MEMORY, label=f"{name}.fp8_cast", **ctx),)

    def _ep_a2a(self, sink: TaskSink, ctx: dict, node: Node, deps, phase: str, label: str) -> int:
        """All-to-all over EP of the node's rows; size: this rank's send buffer (the most
        loaded rank's, imbalance included, sets the time)."""
        sh = self.shape
        size = (sh.rows(node.layout) * sh.cols(node.layout, node.features) * node.rows_scale
                * sh.act_bytes)
        return sink.add(kind=COMM, stream="ep", op="all_to_all", phase=phase, deps=tuple(deps),
                        bytes=size, group=("ep",), label=label, **ctx)

    def _comm(self, sink: TaskSink, ctx: dict, src: str, dst: str, features: int, deps,
              phase: str, label: str, rows_scale: float = 1.0) -> int:
        op = collective(src, dst)
        if op is None:
            return deps[0] if len(deps) == 1 else sink.add(
                kind=COMPUTE, stream="compute", op="join", phase=phase, deps=tuple(deps),
                op_class=MEMORY, label=label, **ctx)
        sh = self.shape
        full = sh.tokens * features * sh.act_bytes * rows_scale
        # Activations are [batch, sequence, features]: the sequence (S) and feature (H)
        # shards are not dim 0, so DTensor chunks and concatenates around the collective,
        # one read and one write of the local tensor (autoparallel's redistribute cost:
        # non-dim-0 gather/scatter and Shard->Shard add compute_read_write_time(2 x bytes);
        # cost-models.md section 1.1).
        copy = {"all_gather": 2 * full, "reduce_scatter": 2 * full,
                "all_to_all": 2 * full / sh.tp}.get(op, 0.0)
        deps = tuple(deps)
        if copy and op == "reduce_scatter":   # the input is made contiguous per shard first
            deps = (sink.add(kind=COMPUTE, stream="compute", op=RELAYOUT, phase=phase,
                             deps=deps, bytes=copy, op_class=MEMORY, label=f"{label}.relayout",
                             **ctx),)
        task = sink.add(kind=COMM, stream="tp", op=op, phase=phase, deps=deps,
                        bytes=collective_bytes(op, full, sh.tp), group=("tp",),
                        label=label, **ctx)
        if copy and op != "reduce_scatter":   # the gathered chunks are concatenated after
            task = sink.add(kind=COMPUTE, stream="compute", op=RELAYOUT, phase=phase,
                            deps=(task,), bytes=copy, op_class=MEMORY,
                            label=f"{label}.relayout", **ctx)
        return task

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Emit backward tasks given the output-gradient task.

        Returns the task producing the gradient of the graph's input, or, for a graph
        without an input (the embedding), its last backward task.
        """
        grads: dict[int, list[tuple[int, str]]] = {n.id: [] for n in self.nodes}
        out = self.nodes[-1]
        grads[self._through(out).id].append((grad_dep, out.layout))
        result = grad_dep
        for node in reversed(self.nodes):
            if node.kind == "redistribute" or not grads[node.id]:
                continue
            result = self._combine(sink, ctx, node, grads[node.id])
            if node.kind == "input":
                continue
            produced = self._emit_backward_node(sink, ctx, node, result)
            for source, grad in produced:
                grads[self._through(source).id].append(grad)
            result = produced[0][1][0] if produced else sink.tasks[-1].id
        return result

    @staticmethod
    def _through(node: Node) -> Node:
        while node.kind == "redistribute":
            node = node.inputs[0]
        return node

    def _combine(self, sink: TaskSink, ctx: dict, node: Node, grads) -> int:
        """Convert consumers' gradients to the layout this node's backward needs, sum."""
        target = grad_layout_needed(node.layout) if self.shape.tp > 1 else node.layout
        if node.kind == "ep_a2a" and len({layout for _, layout in grads}) == 1:
            # An all-to-all is linear: partial sums over TP pass through it and are
            # reduced once, on the token rows, before the router's input (Megatron-LM).
            target = grads[0][1]
        if node.kind == "ep_a2a":
            self._ep_grad_layouts[node.id] = target
        by_layout: dict[str, list[int]] = {}
        for task, layout in grads:
            by_layout.setdefault(layout if self.shape.tp > 1 else target, []).append(task)
        ready = []
        for layout, tasks in sorted(by_layout.items()):
            summed = tasks[0] if len(tasks) == 1 else self._accumulate(sink, ctx, node, layout, tasks)
            ready.append(self._comm(sink, ctx, layout, target, node.features, (summed,),
                                    "backward", f"grad.{node.name}", node.rows_scale)
                         if layout != target else summed)
        return ready[0] if len(ready) == 1 else self._accumulate(sink, ctx, node, target, ready)

    def _accumulate(self, sink: TaskSink, ctx: dict, node: Node, layout: str, tasks) -> int:
        sh = self.shape
        local = sh.rows(layout) * sh.cols(layout, node.features) * sh.act_bytes * node.rows_scale
        return sink.add(kind=COMPUTE, stream="compute", op="grad_accumulate", phase="backward",
                        deps=tuple(tasks), bytes=local * (len(tasks) + 1), op_class=MEMORY,
                        label=f"grad.{node.name}", **ctx)

    def _emit_backward_node(self, sink: TaskSink, ctx: dict, node: Node, ready: int):
        """Backward of one node; returns [(input node, (task, grad layout)), ...]."""
        tp1 = self.shape.tp == 1
        if node.kind == "linear":
            flops, nbytes, (m, n, k) = self.linear_cost(node)
            common = dict(kind=COMPUTE, stream="compute", phase="backward", flops=flops,
                          bytes=nbytes, op_class=GEMM, gemm_dtype=self._gemm_dtype(node), **ctx)
            ready, = self._fp8_cast(sink, ctx, node, flops / (2 * k), (ready,), "backward",
                                    f"grad.{node.name}")
            dgrad = sink.add(op=node.name, deps=(ready,), gemm_mnk=(m, k, n),
                             label=f"{node.name}.dgrad", **common)
            self.wgrad_tasks[node.name] = sink.add(op=node.name, deps=(ready,),
                                                   gemm_mnk=(k, n, m),
                                                   label=f"{node.name}.wgrad", **common)
            layout = "R" if tp1 else STRATEGY_LAYOUTS[node.strategy][2]
            return [(node.inputs[0], (dgrad, layout))]
        if node.kind == "ep_a2a":
            task = self._ep_a2a(sink, ctx, node, (ready,), "backward", f"grad.moe.{node.name}")
            return [(node.inputs[0], (task, self._ep_grad_layouts[node.id]))]
        if node.kind == "attention" and self.shape.cp > 1:
            from .context_parallel import attention_backward
            task = attention_backward(self, sink, ctx, ready)
            return [(x, (task, "R" if tp1 else "H")) for x in node.inputs]
        if node.kind == "attention":
            if self.recompute_attention:
                ready = sink.add(kind=COMPUTE, stream="compute", op="attention",
                                 phase="recompute", deps=(ready,), flops=self.attention_flops(),
                                 bytes=self.attention_bytes(), op_class=ATTENTION,
                                 label="attention.recompute", **ctx)
            # Backward of attention: dV, dP, dQ, dK GEMMs = 2x forward FLOPs; flash
            # attention also recomputes S = QK^T: 5 GEMMs = 2.5x forward (Dao 2023,
            # FlashAttention-2, arXiv:2307.08691, Algorithm 2).
            factor = 2.5 if self.flash_attention else 2.0
            task = sink.add(kind=COMPUTE, stream="compute", op="attention", phase="backward",
                            deps=(ready,), flops=factor * self.attention_flops(),
                            # reads q, k, v, o, dO and writes dq, dk, dv: about twice
                            # the forward's traffic (FlashAttention-2, Algorithm 2)
                            bytes=2.0 * self.attention_bytes(), op_class=ATTENTION,
                            label="attention.bwd", **ctx)
            return [(x, (task, "R" if tp1 else "H")) for x in node.inputs]
        nbytes, kernels = self.elementwise_cost(node, "backward")
        task = sink.add(kind=COMPUTE, stream="compute", op=node.name, phase="backward",
                        deps=(ready,), bytes=nbytes, op_class=MEMORY, kernels=kernels,
                        label=f"{node.name}.bwd", **ctx)
        # A partial-sum output's gradient is whole (R) on every rank, and so is its input's.
        return [(x, (task, grad_layout_needed(node.layout) if not tp1 else node.layout))
                for x in node.inputs]
