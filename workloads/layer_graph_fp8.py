"""The FP8 / FP4 casts of a LayerGraph's linears (workloads/layer_graph.py).

Under a quantised GEMM recipe each linear's operands are cast before its GEMMs: the
input in forward, the output gradient in backward, and the weights where the recipe casts
them every step. A cast is shared where the framework shares it (one activation read by
several linears, one Transformer Engine module's GEMMs), and an operand that came through
a TP all-gather already in FP8 (workloads/fp8_gather.py) is cast before that gather; its
wgrad then reads a transpose of the gathered tensor on Hopper. LayerGraph inherits these
methods; they read its shape, options and the cast records it keeps per pass.
"""
from __future__ import annotations

from .fp8_gather import transpose_bytes
from .graph_node import FUSED_INTO, Node, wgrad_shape
from .layer_builder import TaskSink, fp8_cast_task
from .layouts import STRATEGY_LAYOUTS
from .program import COMPUTE, MEMORY
from .tp_overlap import chunked_gemm


class FP8CastMixin:
    """The casts before a linear's quantised GEMMs, and its FP8-gathered backward."""

    def _fp8_cast(self, sink: TaskSink, ctx: dict, node: Node, flops: float, mnk, deps,
                  phase: str, name: str) -> tuple[int, ...]:
        """Under FP8/FP4 GEMMs, the casts before the linear's GEMMs of `phase` (its input
        in forward, its output gradient in backward, and whatever else the recipe casts
        there), except for the linears that stay in bf16; returns the GEMM's deps."""
        _, n, k = mnk   # m x k inputs, m x n grads; none where an epilogue wrote them quantized
        inputs = 0.0 if node.quantized_input and phase != "backward" else flops / (2 * n)
        grads = 0.0 if node.quantized_grad and phase == "backward" else flops / (2 * k)
        weights = k * n * (node.experts or 1)
        source, recipe = node.inputs[0].id, self.shape.recipe
        if source in self._fp8_gathered:   # cast before its all-gather
            if phase != "backward":
                self._gathered_weight_cast(sink, ctx, node, phase)
                return tuple(deps)
            # the gathered input's transpose feeds the wgrad, which a frozen weight lacks
            if not node.frozen and source not in self._fp8_transposed:
                self._fp8_transposed[source] = self._fp8_transpose(
                    sink, ctx, inputs, deps[0], f"{name}.input")
            if source in self._fp8_transposed:
                deps = (self._fp8_transposed[source],)
        if recipe is not None and recipe.shares_input_casts and source in self._cast_inputs:
            inputs = 0.0    # a linear reading the same activation: its cast is done
            deps = (*deps, self._cast_inputs[source])
        module = FUSED_INTO.get(node.name, node.name)
        if phase != "backward" and self.options.fused_te_modules \
                and module in self._module_casts:
            inputs = 0.0    # one TE module's input, cast once for all its GEMMs
            deps = (*deps, self._module_casts[module])
        ready = fp8_cast_task(sink, ctx, self.shape, grads if phase == "backward" else inputs,
                              deps, phase, name, node.bf16, (inputs, weights, grads),
                              # w3's splits were cast with w1's (one linear_fc1 module)
                              0 if node.name in FUSED_INTO or node.group_cast else node.experts,
                              weight_grad=not node.frozen)
        if ready != tuple(deps):   # a cast was emitted
            self._cast_inputs.setdefault(source, ready[0])
            self._module_casts.setdefault(module, ready[0])
        return ready

    def _gathered_weight_cast(self, sink: TaskSink, ctx: dict, node: Node, phase: str) -> None:
        """The weight's cast of a linear whose activation operand came gathered in FP8,
        where the recipe casts weights every step (torchao; Transformer Engine keeps its
        FP8 weights): ordered on the compute stream before the GEMM, waiting for nothing."""
        if self.shape.recipe.casts is None:
            return
        _, n, k = self.linear_cost(node)[2]
        fp8_cast_task(sink, ctx, self.shape, 0.0, (), phase, f"{node.name}.weight", node.bf16,
                      (0.0, k * n * (node.experts or 1), 0.0))

    def _fp8_transpose(self, sink: TaskSink, ctx: dict, elements: float, dep: int,
                       label: str) -> int:
        """The transpose of a gathered FP8 tensor the wgrad GEMM reads (Hopper); `dep`
        itself where the recipe needs none."""
        per_element = transpose_bytes(self.shape.recipe)
        if not per_element:
            return dep
        recipe = self.shape.recipe.name
        return sink.add(kind=COMPUTE, stream="compute", op=f"{recipe}_transpose",
                        phase="backward", deps=(dep,), bytes=elements * per_element,
                        op_class=MEMORY, kernels=1, label=f"{label}.{recipe}_transpose", **ctx)

    def _transposed_backward(self, sink: TaskSink, ctx: dict, node: Node, ready: int,
                             common: dict) -> list:
        """A linear's backward on its FP8-gathered output gradient: the dgrad GEMM (chunk
        by chunk as the gradient arrives under TP overlap), then the transpose of the
        gathered gradient and the wgrad GEMM on it (TE v1.10 module/linear.py backward)."""
        flops, nbytes, (m, n, k) = self.linear_cost(node)
        self._gathered_weight_cast(sink, ctx, node, "backward")
        if ready in self._chunks:
            operand = nbytes / max(1, m * k + k * n + m * n)
            dgrad = chunked_gemm(sink, self._chunks[ready], flops, operand, (m, k, n), 0,
                                 f"{node.name}.dgrad", op=node.name, phase="backward",
                                 gemm_dtype=common["gemm_dtype"], **ctx)
        else:
            dgrad = sink.add(op=node.name, deps=(ready,), gemm_mnk=(m, k, n),
                             label=f"{node.name}.dgrad", **common)
        if node.frozen:   # LoRA's base weight: no transpose, no wgrad
            return [(node.inputs[0], (dgrad, STRATEGY_LAYOUTS[node.strategy][2]))]
        transposed = self._fp8_transpose(sink, ctx, m * n, ready, f"grad.{node.name}")
        self.wgrad_tasks[self._weight_keys[node.id]] = sink.add(
            op=node.name, deps=(transposed,), label=f"{node.name}.wgrad",
            **{**common, **wgrad_shape(node, m, n, k)})
        return [(node.inputs[0], (dgrad, STRATEGY_LAYOUTS[node.strategy][2]))]
