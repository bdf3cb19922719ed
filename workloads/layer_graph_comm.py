"""The tensor-parallel communication of a LayerGraph (workloads/layer_graph.py).

A layout change between two nodes is a DTensor redistribution: a collective over the TP
group plus the copies DTensor makes around it. Under TP communication overlap
(workloads/tp_overlap.py) the sequence-parallel all-gather runs as ring steps whose
chunks the consuming GEMMs take as they arrive, and a row-parallel GEMM feeding a
reduce-scatter is chunked with it. LayerGraph inherits these methods; they read its
shape, options, nodes and the chunk / reduction records it keeps.
"""
from __future__ import annotations

from .graph_node import Node
from .layer_builder import TaskSink
from .layouts import collective, collective_bytes
from .program import COMM, COMPUTE, MEMORY, RELAYOUT
from .tp_overlap import chunked_gemm, gemm_reduce_scatter, ring_gather


class TPCommMixin:
    """Redistributions and overlapped TP transfers of one layer's graph."""

    def _comm(self, sink: TaskSink, ctx: dict, src: str, dst: str, features: int, deps,
              phase: str, label: str, rows_scale: float = 1.0, chunked: bool = False) -> int:
        op = collective(src, dst)
        if chunked and op == "all_gather" and self.options.tp_overlap:
            return self._ring_gather(sink, ctx, features, deps, phase, label, rows_scale)
        if op is None:
            return deps[0] if len(deps) == 1 else sink.add(
                kind=COMPUTE, stream="compute", op="join", phase=phase, deps=tuple(deps),
                op_class=MEMORY, label=label, **ctx)
        sh = self.shape
        full = sh.tokens * features * sh.act_bytes * rows_scale
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
        task = sink.add(kind=COMM, stream="tp", op=op, phase=phase, deps=deps,
                        bytes=collective_bytes(op, full, sh.tp), group=("tp",),
                        label=label, **ctx)
        if copy and op != "reduce_scatter":   # the gathered chunks are concatenated after
            task = sink.add(kind=COMPUTE, stream="compute", op=RELAYOUT, phase=phase,
                            deps=(task,), bytes=copy, op_class=MEMORY,
                            label=f"{label}.relayout", **ctx)
        return task

    def _feeds_only_linears(self, node: Node) -> bool:
        users = [n for n in self.nodes if node in n.inputs]
        return bool(users) and all(n.kind == "linear" and not n.experts for n in users)

    def _ring_gather(self, sink: TaskSink, ctx: dict, features: int, deps, phase: str,
                     label: str, rows_scale: float) -> int:
        """A sequence-parallel all-gather as tp ring steps; its consumers GEMM each chunk
        as it arrives (chunked_gemm). Returns the last arrival."""
        sh = self.shape
        chunk = sh.tokens * features * sh.act_bytes * rows_scale / sh.tp
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
