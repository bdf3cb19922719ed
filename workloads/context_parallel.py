"""Context parallelism: the attention core of one layer over a CP group of `cp` ranks.

Each CP rank holds 1/cp of every sequence's tokens (after TP: of its heads). Three variants
(plan `"context_parallel": {"mode": "ring" | "all_gather" | "all_to_all"}`):

Ring attention (Liu et al. 2023, arXiv:2310.01889; Megatron-LM / Transformer Engine's
P2P context parallelism; Llama 3, arXiv:2407.21783 section 3.3.2). The sequence is cut
into 2 cp chunks and rank i keeps chunks i and 2cp-1-i, so every rank does the same share
of the causal work (causal load balancing). Forward: cp steps; at step j a rank computes
its queries against the KV block of rank i - j (step 0: its own) while it passes the block
it holds to rank i + 1 (send/recv along "cp", cp - 1 transfers of one K+V block): each step
is 1/cp of the rank's causal attention FLOPs, and the transfer of block j + 1 overlaps the
compute of block j. Backward: the KV blocks travel the ring again (cp - 1 transfers) and
every block's dK/dV partial travels with it, accumulated at each hop, and returns to its
owner (cp transfers of one K+V-sized block, bf16): (2 cp - 1) blocks sent per rank.

All-gather (Llama 3, arXiv:2407.21783 section 3.3.2: "we first all-gather the key (K)
and value (V) tensors, and then compute attention output for the local query (Q) tensor
chunk"). The same 2 cp chunks per rank as ring; one all-gather of K and V before the
attention (exposed: nothing overlaps it), the gathered K and V kept for the backward, and
one reduce-scatter of the dK/dV partials after it. Both of cp K+V blocks (nccl-tests size).

All-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509): all-to-alls over
"cp" turn q, k, v from sequence-sharded into head-sharded (full sequence, heads / cp), the
attention runs locally, and one all-to-all turns the output back: 4 all-to-alls forward
and 4 backward (dO in; dQ, dK, dV out), each of a rank's local tensor.

Sizes (workloads/attention.py AttentionCost): a K+V block is tokens_local x kv_heads/tp x
(head_dim + v_head_dim) x 2 bytes (MLA: the up-projected per-head K and V, not the latent,
as Transformer Engine's context parallelism receives them); an all-to-all's nccl-tests
size is the per-rank buffer (the local tensor). The attention compute tasks are workloads/attention.py's.
"""
from __future__ import annotations

from .attention import AttentionCore, AttentionCost, attention_task
from .layer_builder import BuildOptions, TaskSink
from .plan import CP_MODES
from .program import COMM, COMPUTE, MEMORY

# KV blocks and dK/dV partials on separate stream pairs, so a dK/dV transfer never holds
# up the next KV block (NCCL: separate communicators).
RING_SEND, RING_RECV, CP_STREAM = "cp_send", "cp_recv", "cp"
GRAD_SEND, GRAD_RECV = "cp_grad_send", "cp_grad_recv"


class ContextParallelAttention(AttentionCore):
    """The attention core of one layer across a CP group of `cp` ranks (a layer builder:
    workloads/layer_builder.py)."""

    def __init__(self, cost: AttentionCost, options: BuildOptions, cp: int, mode: str):
        if mode not in CP_MODES:
            raise ValueError(f"context-parallel mode must be one of {CP_MODES}, got {mode!r}")
        super().__init__(cost, options)
        self.cp, self.mode = cp, mode

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """Forward (or recomputed forward) of the attention core under CP; `input_dep`
        holds the q, k and v tasks. Returns its last task."""
        emit = {"all_gather": self._all_gather_forward, "all_to_all": self._ulysses_forward,
                "ring": self._ring_forward}[self.mode]
        self._output = emit(sink, ctx, tuple(input_dep), phase)
        return self._output

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Backward of the attention core under CP (after selective recompute's forward,
        if asked); returns the task that has dQ, dK and dV."""
        ready = grad_dep
        if self.options.recompute_attention:
            ready = self.emit_forward(sink, ctx, (ready,), "recompute")
        emit = {"all_gather": self._all_gather_backward, "all_to_all": self._ulysses_backward,
                "ring": self._ring_backward}[self.mode]
        return emit(sink, ctx, ready)

    # ---- all-gather (Llama 3) ------------------------------------------------------
    def _all_gather_forward(self, sink, ctx, deps, phase) -> int:
        kv = sink.add(kind=COMM, stream=CP_STREAM, op="all_gather", phase=phase,
                      deps=tuple(d for d in deps if d >= 0),
                      bytes=self.cp * self.cost.kv_block_bytes, group=("cp",),
                      label="cp.all_gather.kv", **ctx)
        return attention_task(sink, ctx, self.cost, phase, (kv,))

    def _all_gather_backward(self, sink, ctx, ready) -> int:
        core = attention_task(sink, ctx, self.cost, "backward", (ready,))
        dkv = sink.add(kind=COMM, stream=CP_STREAM, op="reduce_scatter", phase="backward",
                       deps=(core,), bytes=self.cp * self.cost.kv_block_bytes, group=("cp",),
                       label="cp.reduce_scatter.dkv", **ctx)
        return _join(sink, ctx, (core, dkv), "backward", "cp.all_gather.dq_dkv")

    # ---- all-to-all (DeepSpeed-Ulysses) --------------------------------------------
    def _ulysses_forward(self, sink, ctx, deps, phase) -> int:
        c = self.cost
        if len(deps) == 1:   # a recompute starts q, k and v from one task
            deps = deps * 3
        moved = [_a2a(sink, ctx, size, (d,), phase, f"cp.a2a.{name}")
                 for name, size, d in zip(("q", "k", "v"), (c.q_bytes, c.kv_bytes, c.v_bytes),
                                          deps)]
        core = attention_task(sink, ctx, c, phase, moved)
        return _a2a(sink, ctx, c.o_bytes, (core,), phase, "cp.a2a.out")

    def _ulysses_backward(self, sink, ctx, ready) -> int:
        c = self.cost
        d_out = _a2a(sink, ctx, c.o_bytes, (ready,), "backward", "cp.a2a.grad_out")
        core = attention_task(sink, ctx, c, "backward", (d_out,))
        back = [_a2a(sink, ctx, size, (core,), "backward", f"cp.a2a.grad_{name}")
                for name, size in (("q", c.q_bytes), ("k", c.kv_bytes), ("v", c.v_bytes))]
        return _join(sink, ctx, back, "backward", "cp.a2a.grads")

    # ---- ring ----------------------------------------------------------------------
    def _ring_forward(self, sink, ctx, deps, phase) -> int:
        key = (ctx["layer"], ctx["microbatch"], phase)
        block = _join(sink, ctx, deps, phase, "cp.ring.start")
        compute = -1
        for step in range(self.cp):
            if step < self.cp - 1:
                nxt = _send_recv(sink, ctx, ("cp.kv",) + key + (step,),
                                 self.cost.kv_block_bytes, (block,), phase, "cp.ring.kv")
            compute = attention_task(sink, ctx, self.cost, phase, (block, compute),
                                     f"attention.fwd.{step}", parts=self.cp)
            if step < self.cp - 1:
                block = nxt
        return compute

    def _ring_backward(self, sink, ctx, ready) -> int:
        key = (ctx["layer"], ctx["microbatch"], "backward")
        block, compute, dkv = ready, -1, -1
        for step in range(self.cp):
            if step < self.cp - 1:
                nxt = _send_recv(sink, ctx, ("cp.kv",) + key + (step,),
                                 self.cost.kv_block_bytes, (block,), "backward", "cp.ring.kv")
            compute = attention_task(sink, ctx, self.cost, "backward", (block, compute),
                                     f"attention.bwd.{step}", parts=self.cp)
            # The dK/dV partial of this block, with this rank's share added, moves on
            # (after the last step it returns to the block's owner).
            dkv = _send_recv(sink, ctx, ("cp.dkv",) + key + (step,), self.cost.kv_block_bytes,
                             tuple(d for d in (compute, dkv) if d >= 0), "backward",
                             "cp.ring.dkv", (GRAD_SEND, GRAD_RECV))
            if step < self.cp - 1:
                block = nxt
        return _join(sink, ctx, (compute, dkv), "backward", "cp.ring.grads")


def _send_recv(sink: TaskSink, ctx: dict, tag: tuple, size: float, deps, phase: str,
               label: str, streams: tuple[str, str] = (RING_SEND, RING_RECV)) -> int:
    """A send to the next CP rank and the matching receive from the previous one; returns
    the receive (which completes when the block has arrived)."""
    sink.add(kind=COMM, stream=streams[0], op="send_recv", phase=phase, deps=tuple(deps),
             bytes=size, group=("cp",), peer=+1, tag=tag, label=f"{label}.send", **ctx)
    return sink.add(kind=COMM, stream=streams[1], op="send_recv", phase=phase, deps=(),
                    bytes=size, group=("cp",), peer=-1, tag=tag, label=f"{label}.recv", **ctx)


def _join(sink: TaskSink, ctx: dict, deps, phase: str, label: str) -> int:
    deps = tuple(d for d in deps if d >= 0)
    if len(deps) == 1:
        return deps[0]
    return sink.add(kind=COMPUTE, stream="compute", op="join", phase=phase, deps=deps,
                    op_class=MEMORY, label=label, **ctx)


def _a2a(sink: TaskSink, ctx: dict, size: float, deps, phase: str, label: str) -> int:
    return sink.add(kind=COMM, stream=CP_STREAM, op="all_to_all", phase=phase,
                    deps=tuple(deps), bytes=size, group=("cp",), label=label, **ctx)
