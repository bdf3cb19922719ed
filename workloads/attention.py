"""The cost of a layer's causal attention core, and the one place that emits it as a task.

FLOPs: QK^T and PV, 2 s_q s_k d each per head, halved by the causal mask (the convention
of Megatron-LM's and FlashAttention's causal FLOP counts). The backward runs dV, dP, dQ
and dK, twice the forward's FLOPs; FlashAttention also recomputes S = QK^T in its
backward, five GEMMs or 2.5x the forward (Dao 2023, FlashAttention-2, arXiv:2307.08691,
Algorithm 2).

HBM bytes: a FlashAttention forward reads q, k and v and writes o (and the per-row
logsumexp, negligible); its backward reads q, k, v, o and dO and writes dq, dk and dv,
about twice the forward's traffic (FlashAttention-2, Algorithm 2). Attention that is not
flash ("eager": PyTorch's math path, ATen's _scaled_dot_product_attention_math) also
materialises the s_q x s_k scores of every head and passes over them between its kernels
(EAGER_SCORE_PASSES).

Head dims: q and k share head_dim, v has v_head_dim (multi-head latent attention,
DeepSeek-V3 arXiv:2412.19437 section 2.1.1: 128 + 64 for q and k, 128 for v), so QK^T
costs 2 s_q s_k d_qk and PV 2 s_q s_k d_v per head.

Sliding window (Mistral 7B, arXiv:2310.06825 section 2; GPT-OSS, arXiv:2508.10925): a
query attends to at most w keys, itself included. Over a sequence of s tokens the causal
(query, key) pairs are s^2/2 in the convention above, and with the window s w - w^2/2
(the first w queries see a triangle, the rest w keys each), so the FLOPs are bounded by
the window. FlashAttention skips the key blocks outside the window (its window_size
argument); the tiles that straddle the window's edge are computed and masked, which is
not counted (an assumption: at most one tile of keys per query tile more). Eager
attention computes every score and masks them, so it gets no saving.

Attention sinks (GPT-OSS): one learned logit per head joins every softmax denominator:
per query and head one exponential and one addition, against 2 w (d_qk + d_v) FLOPs of
the windowed core (under 0.01 % at w = 128, d = 64), so not priced; their parameters are
counted (workloads/model_spec.py).

Context parallelism splits the queries over the CP group (workloads/context_parallel.py
emits ring, all-gather and all-to-all attention from the sizes here). Selective recompute
(Korthikanti et al. 2022, arXiv:2205.05198 section 5) runs the forward again just before
the backward (LocalAttention).
"""
from __future__ import annotations

from dataclasses import dataclass

from .layer_builder import BuildOptions, TaskSink
from .program import ATTENTION, COMPUTE

# Backward FLOPs over forward FLOPs (FlashAttention-2, arXiv:2307.08691, Algorithm 2):
# dV, dP, dQ, dK are two forwards' worth; flash attention also recomputes S = QK^T.
FLASH_BACKWARD_FLOPS_FACTOR = 2.5
EAGER_BACKWARD_FLOPS_FACTOR = 2.0
# Backward HBM bytes of q, k, v, o and their gradients over the forward's (Algorithm 2:
# reads q, k, v, o, dO, writes dq, dk, dv).
BACKWARD_IO_BYTES_FACTOR = 2.0
# Passes over the s_q x s_k scores of each head in eager attention, counted from the ops
# of ATen's _scaled_dot_product_attention_math with is_causal (q and k pre-scaled):
# forward: QK^T writes S (1), the additive causal mask is added in place (read S, read
# the mask, write S: 3), softmax reads S and writes P (2), PV reads P (1) = 7; backward:
# dO V^T writes dP (1), P^T dO reads P (1), the softmax backward reads P and dP and writes
# dS (3), dS K and dS^T Q read dS (2) = 7. Elements in the activation dtype.
EAGER_SCORE_PASSES = {"forward": 7.0, "backward": 7.0}


def causal_attention_flops(queries: float, keys: float, head_dim: int, heads: float,
                           v_head_dim: int = 0, window: int = 0) -> float:
    """Forward FLOPs of causal attention: QK^T and PV, 2 * s_q * s_k * d each per head
    (d_qk for QK^T, d_v = v_head_dim for PV; 0: head_dim), halved by the causal mask.
    `queries` counts query tokens over the batch, `keys` is the sequence. With a sliding
    `window` shorter than the sequence a query sees on average w - w^2 / (2 s) keys
    instead of s / 2."""
    v = v_head_dim or head_dim
    if 0 < window < keys:
        keys_per_query = window - window * window / (2.0 * keys)
        return 2.0 * queries * keys_per_query * (head_dim + v) * heads
    if v == head_dim:
        return 4.0 * queries * keys * head_dim * heads * 0.5
    return 2.0 * queries * keys * (head_dim + v) * heads * 0.5


@dataclass(frozen=True)
class AttentionCost:
    """One rank's attention core for one micro-batch: its queries, heads and sizes."""

    queries: float      # query tokens on this rank (over the micro-batch)
    keys: int           # keys each query sees: the full sequence
    heads: float        # this rank's query heads
    kv_heads: float     # this rank's key/value heads
    head_dim: int       # of q and k
    act_bytes: int      # bytes per activation element
    flash: bool = True
    v_head_dim: int = 0  # of v and the output (0: head_dim)
    window: int = 0      # sliding window: keys a query sees at most (0: all earlier)

    @classmethod
    def of_layer(cls, shape, flash: bool, queries: float | None = None,
                 head_split: float | None = None, window: int = 0) -> "AttentionCost":
        """The attention core of a LayerShape, its heads split `head_split` ways (default
        over TP), `queries` query tokens (default the shape's tokens) and the layer's
        sliding `window` (0: none)."""
        split = shape.tp if head_split is None else head_split
        return cls(queries=shape.tokens if queries is None else queries, keys=shape.seq_len,
                   heads=shape.heads / split, kv_heads=shape.kv_heads / split,
                   head_dim=shape.head_dim, act_bytes=shape.act_bytes, flash=flash,
                   v_head_dim=shape.v_head_dim or shape.head_dim, window=window)

    # ---- sizes ---------------------------------------------------------------------
    @property
    def v_dim(self) -> int:
        """Features of one value (and output) head."""
        return self.v_head_dim or self.head_dim

    @property
    def q_bytes(self) -> float:
        """Bytes of this rank's q (and of dq)."""
        return self.queries * self.heads * self.head_dim * self.act_bytes

    @property
    def o_bytes(self) -> float:
        """Bytes of this rank's attention output (and of dO)."""
        return self.queries * self.heads * self.v_dim * self.act_bytes

    @property
    def kv_bytes(self) -> float:
        """Bytes of this rank's K for its queries' tokens."""
        return self.queries * self.kv_heads * self.head_dim * self.act_bytes

    @property
    def v_bytes(self) -> float:
        """Bytes of this rank's V for its queries' tokens."""
        return self.queries * self.kv_heads * self.v_dim * self.act_bytes

    @property
    def kv_block_bytes(self) -> float:
        """Bytes of this rank's K and V block (context parallelism moves it)."""
        return self.kv_bytes + self.v_bytes

    @property
    def score_elements(self) -> float:
        """Elements of the s_q x s_k scores of every head (eager attention writes them)."""
        return self.queries * self.keys * self.heads

    # ---- costs ---------------------------------------------------------------------
    @property
    def forward_flops(self) -> float:
        """Forward FLOPs of this rank's causal attention (flash skips the keys outside a
        sliding window; eager attention computes and masks them)."""
        return causal_attention_flops(self.queries, self.keys, self.head_dim, self.heads,
                                      self.v_dim, self.window if self.flash else 0)

    @property
    def backward_flops(self) -> float:
        """Backward FLOPs (flash: 2.5x the forward, else 2x)."""
        factor = FLASH_BACKWARD_FLOPS_FACTOR if self.flash else EAGER_BACKWARD_FLOPS_FACTOR
        return factor * self.forward_flops

    @property
    def io_bytes(self) -> float:
        """Forward HBM traffic of q, k, v and o: read q, k, v, write o."""
        return self.q_bytes + self.o_bytes + self.kv_block_bytes

    def flops(self, phase: str, parts: int = 1) -> float:
        """FLOPs in `phase` (forward and recompute alike), of one of `parts` equal
        shares (ring attention's steps)."""
        whole = self.backward_flops if phase == "backward" else self.forward_flops
        return whole / parts if parts > 1 else whole

    def bytes(self, phase: str, parts: int = 1) -> float:
        """HBM bytes in `phase` of one of `parts` shares of the work: every share reads
        the local q, k, v block again; eager scores split with the work."""
        backward = phase == "backward"
        io = BACKWARD_IO_BYTES_FACTOR * self.io_bytes if backward else self.io_bytes
        if self.flash:
            return io
        passes = EAGER_SCORE_PASSES["backward" if backward else "forward"]
        return io + passes * self.score_elements * self.act_bytes / parts


def attention_task(sink: TaskSink, ctx: dict, cost: AttentionCost, phase: str, deps,
                   label: str = "", parts: int = 1) -> int:
    """The compute task of an attention core (or of one of `parts` ring steps)."""
    label = label or ("attention.bwd" if phase == "backward" else "attention.fwd")
    return sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                    deps=tuple(d for d in deps if d >= 0), flops=cost.flops(phase, parts),
                    bytes=cost.bytes(phase, parts), op_class=ATTENTION, label=label, **ctx)


class AttentionCore:
    """What every attention-core builder shares: its cost, the build options, no weights,
    and the task that ends its forward (a layer builder: workloads/layer_builder.py)."""

    def __init__(self, cost: AttentionCost, options: BuildOptions):
        self.cost, self.options = cost, options
        self.wgrad_tasks: dict[str, int] = {}     # no weights
        self._output = -1

    @property
    def output_task(self) -> int:
        """The forward's last task (after emit_forward)."""
        return self._output


class LocalAttention(AttentionCore):
    """The attention core on one rank: all its queries' keys are local (no CP)."""

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """The forward (or recomputed forward) attention task."""
        self._output = attention_task(sink, ctx, self.cost, phase, input_dep)
        return self._output

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Selective recompute's forward if asked, then the backward task (dq, dk, dv)."""
        ready = grad_dep
        if self.options.recompute_attention:
            ready = attention_task(sink, ctx, self.cost, "recompute", (ready,),
                                   label="attention.recompute")
        return attention_task(sink, ctx, self.cost, "backward", (ready,))
