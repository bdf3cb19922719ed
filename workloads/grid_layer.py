"""2D, 2.5D and 3D tensor-parallel transformer layers (Colossal-AI), as a layer builder.

The TP group of N ranks is a grid with axes tpx (stride 1), tpy and tpz; how each grid
strategy splits a layer's tensors is workloads/tp_grid.py's GridSplit. Every projection of
every layer uses one strategy (wq/wk/wv fused into one "wqkv" GEMM and w1/w3 into "w13",
as Colossal-AI's fused query_key_value and gated MLP).

tp2d, Optimus (Xu et al. 2021, arXiv:2104.05343), N = q x q: A_ij and W_ij are q x q
blocks (row i = tpy, column j = tpx). C = A W by SUMMA (van de Geijn & Watts 1997): for
t < q, broadcast A_it along the row (over tpx) and W_tj along the column (over tpy), then
C_ij += A_it W_tj. Backward (Colossal-AI Matmul_AB_2D): dA = dC W^T, q x (broadcast W over
tpy, reduce the partial dA over tpx); dW = A^T dC, q x (broadcast A over tpx, reduce the
partial dW over tpy). Activations and weights 1/N.

tp2.5d, Tesseract (Wang et al. 2021, arXiv:2105.14500), N = d x q x q: the batch is split
over the depth d (tpz) and each depth layer runs 2D SUMMA on M/d tokens; weights are split
q x q and replicated over the depth, so their gradients also reduce over tpz.

tp3d_gather / tp3d_allreduce, the 3D tensor-parallel designs (Bian et al. 2021,
arXiv:2105.14450), N = q^3, rank (i, j, l) = (tpz, tpy, tpx). Weight W_lj is stored split
over i (1/N), all-gathered over tpz before use, its gradient reduce-scattered over tpz.
  design 1 ("gather"): A is stored 1/N; all-gather A over tpy, C_ilj = A_il W_lj, reduce-
  scatter C over tpx (C stored 1/N). Backward: all-gather dC, reduce-scatter dA; A is
  gathered again unless the layer was just recomputed (it keeps 1/N activations).
  design 2 ("allreduce"): A_il is stored replicated over tpy (1/N^(2/3)); all-reduce C
  over tpx; backward all-reduce dA over tpy. Attention and element-wise ops then run
  redundantly over tpx.
  With activation checkpointing a linear performs, design 1: 2 x all-gather + reduce-
  scatter on A and 2 x reduce-scatter + all-gather on C; design 2: 3 x all-reduce (as
  Colossal-AI's maintainers count them for the two designs).
  The real algorithm alternates the roles of tpx and tpy between consecutive layers; the
  axes here stay fixed (all are of size q, so the costs are the same).

Assumptions: attention is local to a rank's block (the micro-batch is split over the token
axes, plan_checks requires it; heads over the feature axis); RMSNorm all-reduces its
per-token statistic (fp32) over the feature axis, forward and backward; the embedding and
the output layer stay vocabulary-parallel over the whole TP group, so the first layer's
input is a local slice of the replicated embedding output and the last layer's output is
all-gathered over TP (and the reverse in backward). Grid TP is not combined with CP or MoE.

Fused memory-bound ops read and write their tensors once, forward and backward alike; with
`"kernels": "eager"` the norms, RoPE (on q and on k, eager launches for each), the
activation and the residual adds cost workloads/kernels.py's eager passes, as in
LayerGraph. FP8 training casts each GEMM's activation operand before it
(workloads/layer_builder.py fp8_cast_task): in forward the A block of every GEMM (SUMMA:
each broadcast block); in backward the output-gradient block once per linear (the cast
also writes its transpose, for dW) and every A block that arrives again by a collective
(SUMMA's broadcasts, 3D design 1's re-gather: the forward's FP8 copy was a temporary).
"""
from __future__ import annotations

from .attention import AttentionCost, LocalAttention
from .layer_builder import BuildOptions, LayerShape, TaskSink, fp8_cast_task, memory_task
from .precision import precision
from .program import COMM, COMPUTE, GEMM
from .mesh import grid_split
from .tp_grid import grid_linears

NORM_STAT_BYTES = 4   # one fp32 statistic per token (RMSNorm: sum of squares)


class GridLayer:
    """One transformer layer under a grid strategy (a layer builder:
    workloads/layer_builder.py)."""

    def __init__(self, plan, layer: int, shape: LayerShape,
                 options: BuildOptions = BuildOptions()):
        self.plan, self.layer, self.shape, self.options = plan, layer, shape, options
        self.act_bytes = shape.act_bytes
        self.param_bytes = precision(plan.training.dtype).param_bytes
        self.grad_bytes = precision(plan.training.dtype).grad_reduce_bytes
        self.split = grid_split(plan)
        self.model = plan.model
        self.wgrad_tasks: dict[str, int] = {}
        self.recomputed = False       # its forward was a recompute: gathered A and W live
        self.first = layer == 0
        self.last = layer == plan.model.num_layers - 1
        self.attention = LocalAttention(
            AttentionCost.of_layer(shape, options.flash_attention, queries=self.rows,
                                   head_split=self.split.feature_split,
                                   window=plan.model.window_at(layer),
                                   impl=options.attention_impl), options)
        self._output = -1

    # ---- sizes ------------------------------------------------------------------------
    @property
    def rows(self) -> float:
        """Token rows of a stored activation block."""
        return self.shape.tokens / self.split.token_split

    def _local_bytes(self, features: int) -> float:
        return self.rows * features / self.split.feature_split * self.act_bytes

    # ---- task helpers -----------------------------------------------------------------
    def _comm(self, op, dims, size, deps, phase, label) -> int:
        return self.sink.add(kind=COMM, stream="tp", op=op, phase=phase, deps=tuple(deps),
                             bytes=size, group=dims, label=label, **self.ctx)

    def _gemm(self, name, mnk, deps, phase, label) -> int:
        m, n, k = mnk
        return self.sink.add(kind=COMPUTE, stream="compute", op=name, phase=phase,
                             deps=tuple(d for d in deps if d >= 0), flops=2.0 * m * n * k,
                             bytes=(m * k + k * n + m * n) * self.shape.operand_bytes(),
                             op_class=GEMM, gemm_mnk=(int(m), int(n), int(k)), label=label,
                             gemm_dtype=self.shape.gemm_dtype(), **self.ctx)

    def _cast(self, elements, deps, phase, label) -> tuple[int, ...]:
        """FP8 training: the cast of a GEMM's activation operand; the GEMM's deps."""
        return fp8_cast_task(self.sink, self.ctx, self.shape, elements, deps, phase, label)

    def _elementwise(self, name, features, deps, phase, rw=2.0, label="", tensors=1) -> int:
        return memory_task(self.sink, self.ctx, self.options, self.act_bytes, name, phase,
                           deps, self._local_bytes(features), (rw, 1),
                           label or f"{name}.{phase[:3]}", tensors)

    def _norm(self, name, deps, phase) -> int:
        task = self._elementwise(name, self.model.hidden_size, deps, phase)
        return self._comm("all_reduce", (self.split.feature_axis,), self.rows * NORM_STAT_BYTES,
                          (task,), phase, f"tpgrid.norm_stats.{name}")

    def _rope(self, deps, phase) -> int:
        m = self.model
        return self._elementwise("rope", m.q_size + m.kv_size, deps, phase, tensors=2)

    # ---- one linear -------------------------------------------------------------------
    def _label(self, what: str, name: str) -> str:
        prefix = "tp3d" if self.split.mode.startswith("tp3d") else self.split.mode
        return f"{prefix}.{what}.{name}"

    def _linear_forward(self, name, k_in, n_out, x, phase) -> int:
        g, M = self.split, self.shape.tokens
        q = g.q
        if g.mode in ("tp2d", "tp2.5d"):
            rows = M / g.depth / q
            acc = x
            for _ in range(q):
                a = self._comm("broadcast", ("tpx",), rows * k_in / q * self.act_bytes, (x,), phase,
                               self._label("A", name))
                w = self._comm("broadcast", ("tpy",), k_in / q * n_out / q * self.param_bytes, (),
                               phase, self._label("W", name))
                a = self._cast(rows * k_in / q, (a,), phase, name)
                acc = self._gemm(name, (rows, n_out / q, k_in / q), (*a, w, acc), phase,
                                 f"{name}.{phase[:3]}")
            return acc
        rows = M / q
        w = self._comm("all_gather", ("tpz",), k_in / q * n_out / q * self.param_bytes, (), phase,
                       self._label("W", name))
        if g.mode == "tp3d_gather":
            x = self._comm("all_gather", ("tpy",), rows * k_in / q * self.act_bytes, (x,), phase,
                           self._label("A", name))
        a = self._cast(rows * k_in / q, (x,), phase, name)
        c = self._gemm(name, (rows, n_out / q, k_in / q), (*a, w), phase, f"{name}.{phase[:3]}")
        op = "reduce_scatter" if g.mode == "tp3d_gather" else "all_reduce"
        return self._comm(op, ("tpx",), rows * n_out / q * self.act_bytes, (c,), phase,
                          self._label("C", name))

    def _linear_backward(self, name, k_in, n_out, grad) -> int:
        g, M, phase = self.split, self.shape.tokens, "backward"
        q = g.q
        if g.mode in ("tp2d", "tp2.5d"):
            rows = M / g.depth / q
            dx = dw = -1
            d_out = self._cast(rows * n_out / q, (grad,), phase, f"grad.{name}")
            for _ in range(q):      # dA = dC W^T (Matmul_ABT_2D)
                w = self._comm("broadcast", ("tpy",), k_in / q * n_out / q * self.param_bytes, (),
                               phase, self._label("W", name))
                part = self._gemm(name, (rows, k_in / q, n_out / q), (*d_out, w), phase,
                                  f"{name}.dgrad")
                dx = self._comm("reduce", ("tpx",), rows * k_in / q * self.act_bytes, (part,), phase,
                                self._label("A", name))
            for _ in range(q):      # dW = A^T dC (Matmul_ATB_2D)
                a = self._comm("broadcast", ("tpx",), rows * k_in / q * self.act_bytes, (grad,),
                               phase, self._label("A", name))
                a = self._cast(rows * k_in / q, (a,), phase, name)
                part = self._gemm(name, (k_in / q, n_out / q, rows), (*d_out, *a), phase,
                                  f"{name}.wgrad")
                dw = self._comm("reduce", ("tpy",), k_in / q * n_out / q * self.grad_bytes,
                                (part,), phase, self._label("W", name))
            self.wgrad_tasks[name] = dw
            return dx
        rows = M / q
        d_out = grad
        if g.mode == "tp3d_gather":
            d_out = self._comm("all_gather", ("tpx",), rows * n_out / q * self.act_bytes,
                               (grad,), phase, self._label("C", name))
        deps = list(self._cast(rows * n_out / q, (d_out,), phase, f"grad.{name}"))
        if g.mode == "tp3d_gather" and not self.recomputed:
            # only 1/N of A was kept: gather it again for dW
            a = self._comm("all_gather", ("tpy",), rows * k_in / q * self.act_bytes, (),
                           phase, self._label("A", name))
            deps.extend(self._cast(rows * k_in / q, (a,), phase, name))
        if not self.recomputed:
            deps.append(self._comm("all_gather", ("tpz",), k_in / q * n_out / q * self.param_bytes,
                                   (), phase, self._label("W", name)))
        dgrad = self._gemm(name, (rows, k_in / q, n_out / q), deps, phase, f"{name}.dgrad")
        wgrad = self._gemm(name, (k_in / q, n_out / q, rows), deps, phase, f"{name}.wgrad")
        self.wgrad_tasks[name] = self._comm(
            "reduce_scatter", ("tpz",), k_in / q * n_out / q * self.grad_bytes, (wgrad,),
            phase, self._label("W", name))
        op = "reduce_scatter" if g.mode == "tp3d_gather" else "all_reduce"
        return self._comm(op, ("tpy",), rows * k_in / q * self.act_bytes, (dgrad,), phase,
                          self._label("A", name))

    # ---- the layer --------------------------------------------------------------------
    @property
    def output_task(self) -> int:
        """The forward task producing the layer output (after emit_forward)."""
        return self._output

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """Forward (or recomputed forward) tasks; returns the task of the layer output.
        Op-level checkpointing (`saved`) is not modelled for grids (plan_checks)."""
        if saved:
            raise ValueError("op-level checkpointing is modelled for 1D tensor parallelism only")
        self.sink, self.ctx = sink, ctx
        self.recomputed = phase == "recompute"
        m, (qkv, wo, up, w2) = self.model, grid_linears(self.model)
        x = input_dep[0] if len(input_dep) == 1 else self._elementwise(
            "join", 0, input_dep, phase, label="wait")
        h = self._norm("attention_norm", (x,), phase)
        t = self._linear_forward(*qkv, h, phase)
        t = self._rope((t,), phase)
        t = self.attention.emit_forward(sink, ctx, (t,), phase)
        t = self._linear_forward(*wo, t, phase)
        x = self._elementwise("residual_add", m.hidden_size, (x, t), phase, rw=3.0)
        h = self._norm("ffn_norm", (x,), phase)
        t = self._linear_forward(*up, h, phase)
        t = self._elementwise("swiglu" if m.mlp == "swiglu" else "gelu", m.ffn_size, (t,),
                              phase, rw=3.0)
        t = self._linear_forward(*w2, t, phase)
        out = self._elementwise("residual_add", m.hidden_size, (x, t), phase, rw=3.0)
        if self.last:   # to the replicated layout of the vocabulary-parallel output layer
            out = self.sink.add(kind=COMM, stream="tp", op="all_gather", phase=phase,
                                deps=(out,), bytes=self.shape.tokens * m.hidden_size * self.act_bytes,
                                group=("tp",), label="tpgrid.to_replicated", **ctx)
        self._output = out
        return out

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Backward tasks from the output gradient; returns the input-gradient task."""
        self.sink, self.ctx, phase = sink, ctx, "backward"
        m, (qkv, wo, up, w2) = self.model, grid_linears(self.model)
        g = self._elementwise("residual_add", m.hidden_size, (grad_dep,), phase)
        t = self._linear_backward(*w2, g)
        t = self._elementwise("swiglu" if m.mlp == "swiglu" else "gelu", m.ffn_size, (t,),
                              phase, rw=3.0)
        t = self._linear_backward(*up, t)
        t = self._norm("ffn_norm", (t,), phase)
        g = self._elementwise("grad_accumulate", m.hidden_size, (g, t), phase, rw=3.0)
        t = self._linear_backward(*wo, g)
        t = self.attention.emit_backward(sink, ctx, t)
        t = self._rope((t,), phase)
        t = self._linear_backward(*qkv, t)
        t = self._norm("attention_norm", (t,), phase)
        out = self._elementwise("grad_accumulate", m.hidden_size, (g, t), phase, rw=3.0)
        if self.first:  # the embedding's backward takes the replicated gradient
            out = self.sink.add(kind=COMM, stream="tp", op="all_gather", phase=phase,
                                deps=(out,), bytes=self.shape.tokens * m.hidden_size * self.act_bytes,
                                group=("tp",), label="tpgrid.grad_to_replicated", **ctx)
        return out
