"""2D, 2.5D and 3D tensor-parallel transformer layers (seed 004; Colossal-AI).

The TP group of N ranks is a grid with axes tpx (stride 1), tpy and tpz (the mesh's
GridSplit and ParallelDims.layout, workloads/mesh.py).
Activations [M tokens, K features] and weights [K, N] are split over the grid; every
projection of every layer uses one strategy (wq/wk/wv fused into one "wqkv" GEMM and
w1/w3 into "w13", as Colossal-AI's fused query_key_value and gated MLP).

tp2d, Optimus (Xu et al. 2021, arXiv:2104.05343), N = q x q: A_ij and W_ij are q x q
blocks (row i = tpy, column j = tpx). C = A W by SUMMA (van de Geijn & Watts 1997): for
t < q, broadcast A_it along the row (over tpx) and W_tj along the column (over tpy), then
C_ij += A_it W_tj. Backward (Colossal-AI Matmul_AB_2D): dA = dC W^T, q x (broadcast W over
tpy, reduce the partial dA over tpx); dW = A^T dC, q x (broadcast A over tpx, reduce the
partial dW over tpy). Activations and weights 1/N.

tp2.5d, Tesseract (Wang et al. 2021, arXiv:2105.14500), N = d x q x q: the batch is split
over the depth d (tpz) and each depth layer runs 2D SUMMA on M/d tokens; weights are split
q x q and replicated over the depth, so their gradients also reduce over tpz.

tp3d_gather / tp3d_allreduce, 3D (Bian et al. 2021, arXiv:2105.14450; seed 004), N = q^3,
rank (i, j, l) = (tpz, tpy, tpx). Weight W_lj is stored split over i (1/N), all-gathered
over tpz before use, its gradient reduce-scattered over tpz.
  design 1 ("gather"): A is stored 1/N; all-gather A over tpy, C_ilj = A_il W_lj, reduce-
  scatter C over tpx (C stored 1/N). Backward: all-gather dC, reduce-scatter dA; A is
  gathered again unless the layer was just recomputed (it keeps 1/N activations).
  design 2 ("allreduce"): A_il is stored replicated over tpy (1/N^(2/3)); all-reduce C
  over tpx; backward all-reduce dA over tpy. Attention and element-wise ops then run
  redundantly over tpx.
  With activation checkpointing a linear performs, design 1: 2 x all-gather + reduce-
  scatter on A and 2 x reduce-scatter + all-gather on C; design 2: 3 x all-reduce (seed 004).
  The real algorithm alternates the roles of tpx and tpy between consecutive layers; the
  axes here stay fixed (all are of size q, so the costs are the same).

Assumptions: attention is local to a rank's block (the micro-batch is split over the token
axes, plan_checks requires it; heads over the feature axis); RMSNorm all-reduces its
per-token statistic (fp32) over the feature axis, forward and backward; the embedding and
the output layer stay vocabulary-parallel over the whole TP group, so the first layer's
input is a local slice of the replicated embedding output and the last layer's output is
all-gathered over TP (and the reverse in backward). Grid TP is not combined with CP or MoE.
"""
from __future__ import annotations

from .layer_graph import causal_attention_flops
from .mesh import grid_split
from .precision import precision
from .program import ATTENTION, COMM, COMPUTE, GEMM, MEMORY

NORM_STAT_BYTES = 4   # one fp32 statistic per token (RMSNorm: sum of squares)


def grid_linears(model) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of the fused projections of one layer."""
    d, f = model.hidden_size, model.ffn_size
    up = ("w13", d, 2 * f) if model.mlp == "swiglu" else ("w1", d, f)
    return [("wqkv", d, model.q_size + 2 * model.kv_size), ("wo", model.q_size, d), up,
            ("w2", f, d)]


def grid_param_groups(plan, layer: int, dp_dims: tuple[str, ...]) -> dict:
    """Parameters one rank holds for a grid-TP layer, by gradient-reduction dims.

    Weights: 1/N (2D, 3D) or 1/q^2 replicated over the 2.5D depth (reduced over tpz too).
    Norm weights: split over the feature axis, their gradients partial over the token axes.
    """
    m, g = plan.model, grid_split(plan)
    weights = m.layer_matmul_params() / g.weight_split
    dims = dp_dims + ("tpz",) if g.mode == "tp2.5d" else dp_dims
    groups = {dims: weights}
    norm_dims = dp_dims + g.token_axes
    groups[norm_dims] = groups.get(norm_dims, 0.0) + 2 * m.hidden_size / g.feature_split
    return groups


class GridLayer:
    """One transformer layer under a grid strategy; the interface of LayerGraph."""

    def __init__(self, plan, layer: int, shape):
        self.plan, self.layer, self.shape = plan, layer, shape
        self.act_bytes = shape.act_bytes
        self.param_bytes = precision(plan.training.dtype).param_bytes
        self.grad_bytes = precision(plan.training.dtype).grad_reduce_bytes
        self.split = grid_split(plan)
        self.model = plan.model
        self.wgrad_tasks: dict[str, int] = {}
        self.flash_attention = True
        self.recompute_attention = False
        self.recomputed = False       # its forward was a recompute: gathered A and W live
        self.first = layer == 0
        self.last = layer == plan.model.num_layers - 1

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
                             bytes=(m * k + k * n + m * n) * self.shape.gemm_bytes,
                             op_class=GEMM, gemm_mnk=(int(m), int(n), int(k)), label=label,
                             **self.ctx)

    def _elementwise(self, name, features, deps, phase, rw=2.0, label="") -> int:
        return self.sink.add(kind=COMPUTE, stream="compute", op=name, phase=phase,
                             deps=tuple(deps), bytes=self._local_bytes(features) * rw,
                             op_class=MEMORY, label=label or f"{name}.{phase[:3]}", **self.ctx)

    def _norm(self, name, deps, phase) -> int:
        task = self._elementwise(name, self.model.hidden_size, deps, phase)
        return self._comm("all_reduce", (self.split.feature_axis,), self.rows * NORM_STAT_BYTES,
                          (task,), phase, f"tpgrid.norm_stats.{name}")

    def _attention_flops(self) -> float:
        sh = self.shape
        heads = sh.heads / self.split.feature_split
        return causal_attention_flops(self.rows, sh.seq_len, sh.head_dim, heads)

    def _attention_bytes(self) -> float:
        sh = self.shape
        q = self.rows * sh.heads / self.split.feature_split * sh.head_dim
        kv = 2 * self.rows * sh.kv_heads / self.split.feature_split * sh.head_dim
        return (2 * q + kv) * self.act_bytes

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
                acc = self._gemm(name, (rows, n_out / q, k_in / q), (a, w, acc), phase,
                                 f"{name}.{phase[:3]}")
            return acc
        rows = M / q
        w = self._comm("all_gather", ("tpz",), k_in / q * n_out / q * self.param_bytes, (), phase,
                       self._label("W", name))
        if g.mode == "tp3d_gather":
            x = self._comm("all_gather", ("tpy",), rows * k_in / q * self.act_bytes, (x,), phase,
                           self._label("A", name))
        c = self._gemm(name, (rows, n_out / q, k_in / q), (x, w), phase, f"{name}.{phase[:3]}")
        op = "reduce_scatter" if g.mode == "tp3d_gather" else "all_reduce"
        return self._comm(op, ("tpx",), rows * n_out / q * self.act_bytes, (c,), phase,
                          self._label("C", name))

    def _linear_backward(self, name, k_in, n_out, grad) -> int:
        g, M, phase = self.split, self.shape.tokens, "backward"
        q = g.q
        if g.mode in ("tp2d", "tp2.5d"):
            rows = M / g.depth / q
            dx = dw = -1
            for _ in range(q):      # dA = dC W^T (Matmul_ABT_2D)
                w = self._comm("broadcast", ("tpy",), k_in / q * n_out / q * self.param_bytes, (),
                               phase, self._label("W", name))
                part = self._gemm(name, (rows, k_in / q, n_out / q), (grad, w), phase,
                                  f"{name}.dgrad")
                dx = self._comm("reduce", ("tpx",), rows * k_in / q * self.act_bytes, (part,), phase,
                                self._label("A", name))
            for _ in range(q):      # dW = A^T dC (Matmul_ATB_2D)
                a = self._comm("broadcast", ("tpx",), rows * k_in / q * self.act_bytes, (grad,),
                               phase, self._label("A", name))
                part = self._gemm(name, (k_in / q, n_out / q, rows), (grad, a), phase,
                                  f"{name}.wgrad")
                dw = self._comm("reduce", ("tpy",), k_in / q * n_out / q * self.grad_bytes,
                                (part,), phase, self._label("W", name))
            self.wgrad_tasks[name] = dw
            return dx
        rows = M / q
        deps = [grad]
        if g.mode == "tp3d_gather":
            deps = [self._comm("all_gather", ("tpx",), rows * n_out / q * self.act_bytes, (grad,),
                               phase, self._label("C", name))]
            if not self.recomputed:   # only 1/N of A was kept: gather it again for dW
                deps.append(self._comm("all_gather", ("tpy",), rows * k_in / q * self.act_bytes, (),
                                       phase, self._label("A", name)))
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
    def emit_forward(self, sink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward") -> int:
        """Forward (or recomputed forward) tasks; returns the task of the layer output."""
        self.sink, self.ctx = sink, ctx
        self.recomputed = phase == "recompute"
        m, (qkv, wo, up, w2) = self.model, grid_linears(self.model)
        x = input_dep[0] if len(input_dep) == 1 else self._elementwise(
            "join", 0, input_dep, phase, label="wait")
        h = self._norm("attention_norm", (x,), phase)
        t = self._linear_forward(*qkv, h, phase)
        t = self._elementwise("rope", m.q_size + m.kv_size, (t,), phase)
        t = self.sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                          deps=(t,), flops=self._attention_flops(),
                          bytes=self._attention_bytes(), op_class=ATTENTION,
                          label="attention.fwd", **ctx)
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
        return out

    def emit_backward(self, sink, ctx: dict, grad_dep: int) -> int:
        """Backward tasks from the output gradient; returns the input-gradient task."""
        self.sink, self.ctx, phase = sink, ctx, "backward"
        m, (qkv, wo, up, w2) = self.model, grid_linears(self.model)
        factor = 2.5 if self.flash_attention else 2.0
        g = self._elementwise("residual_add", m.hidden_size, (grad_dep,), phase)
        t = self._linear_backward(*w2, g)
        t = self._elementwise("swiglu" if m.mlp == "swiglu" else "gelu", m.ffn_size, (t,),
                              phase, rw=3.0)
        t = self._linear_backward(*up, t)
        t = self._norm("ffn_norm", (t,), phase)
        g = self._elementwise("grad_accumulate", m.hidden_size, (g, t), phase, rw=3.0)
        t = self._linear_backward(*wo, g)
        t = self.sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                          deps=(t,), flops=factor * self._attention_flops(),
                          bytes=2.0 * self._attention_bytes(), op_class=ATTENTION,
                          label="attention.bwd", **ctx)
        t = self._elementwise("rope", m.q_size + m.kv_size, (t,), phase)
        t = self._linear_backward(*qkv, t)
        t = self._norm("attention_norm", (t,), phase)
        out = self._elementwise("grad_accumulate", m.hidden_size, (g, t), phase, rw=3.0)
        if self.first:  # the embedding's backward takes the replicated gradient
            out = self.sink.add(kind=COMM, stream="tp", op="all_gather", phase=phase,
                                deps=(out,), bytes=self.shape.tokens * m.hidden_size * self.act_bytes,
                                group=("tp",), label="tpgrid.grad_to_replicated", **ctx)
        return out
