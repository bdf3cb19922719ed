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

Sizes: a K+V block is tokens_local x 2 kv_heads/tp x head_dim x 2 bytes; an all-to-all's
nccl-tests size is the per-rank buffer (the local tensor).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .program import ATTENTION, COMM, COMPUTE, MEMORY

if TYPE_CHECKING:  # pragma: no cover
    from .layer_graph import LayerGraph, TaskSink

# KV blocks and dK/dV partials on separate stream pairs, so a dK/dV transfer never holds
# up the next KV block (NCCL: separate communicators).
RING_SEND, RING_RECV, CP_STREAM = "cp_send", "cp_recv", "cp"
GRAD_SEND, GRAD_RECV = "cp_grad_send", "cp_grad_recv"


def kv_block_bytes(graph: "LayerGraph") -> float:
    """Bytes of one rank's K and V block (local tokens, its TP share of the KV heads)."""
    sh = graph.shape
    return 2.0 * sh.tokens * sh.kv_heads / sh.tp * sh.head_dim * sh.act_bytes


def _q_bytes(graph: "LayerGraph") -> float:
    sh = graph.shape
    return sh.tokens * sh.heads / sh.tp * sh.head_dim * sh.act_bytes


def _kv_bytes(graph: "LayerGraph") -> float:
    return kv_block_bytes(graph) / 2


def _send_recv(sink: "TaskSink", ctx: dict, tag: tuple, size: float, deps, phase: str,
               label: str, streams: tuple[str, str] = (RING_SEND, RING_RECV)) -> int:
    """A send to the next CP rank and the matching receive from the previous one; returns
    the receive (which completes when the block has arrived)."""
    sink.add(kind=COMM, stream=streams[0], op="send_recv", phase=phase, deps=tuple(deps),
             bytes=size, group=("cp",), peer=+1, tag=tag, label=f"{label}.send", **ctx)
    return sink.add(kind=COMM, stream=streams[1], op="send_recv", phase=phase, deps=(),
                    bytes=size, group=("cp",), peer=-1, tag=tag, label=f"{label}.recv", **ctx)


def _join(sink: "TaskSink", ctx: dict, deps, phase: str, label: str) -> int:
    deps = tuple(d for d in deps if d >= 0)
    if len(deps) == 1:
        return deps[0]
    return sink.add(kind=COMPUTE, stream="compute", op="join", phase=phase, deps=deps,
                    op_class=MEMORY, label=label, **ctx)


def attention_forward(graph: "LayerGraph", sink: "TaskSink", ctx: dict, deps, phase: str) -> int:
    """Forward (or recomputed forward) of the attention core under CP; returns its last task."""
    sh = graph.shape
    key = (ctx["layer"], ctx["microbatch"], phase)
    if sh.cp_mode == "all_gather":
        kv = sink.add(kind=COMM, stream=CP_STREAM, op="all_gather", phase=phase,
                      deps=tuple(d for d in deps if d >= 0), bytes=sh.cp * kv_block_bytes(graph),
                      group=("cp",), label="cp.all_gather.kv", **ctx)
        return sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                        deps=(kv,), flops=graph.attention_flops(), bytes=graph.attention_bytes(),
                        op_class=ATTENTION, label="attention.fwd", **ctx)
    if sh.cp_mode == "all_to_all":
        moved = [_a2a(sink, ctx, size, (d,), phase, f"cp.a2a.{name}")
                 for name, size, d in zip(("q", "k", "v"),
                                          (_q_bytes(graph), _kv_bytes(graph), _kv_bytes(graph)),
                                          deps)]
        core = sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                        deps=tuple(moved), flops=graph.attention_flops(),
                        bytes=graph.attention_bytes(), op_class=ATTENTION,
                        label="attention.fwd", **ctx)
        return _a2a(sink, ctx, _q_bytes(graph), (core,), phase, "cp.a2a.out")
    block = _join(sink, ctx, deps, phase, "cp.ring.start")
    compute = -1
    for step in range(sh.cp):
        if step < sh.cp - 1:
            nxt = _send_recv(sink, ctx, ("cp.kv",) + key + (step,), kv_block_bytes(graph),
                             (block,), phase, "cp.ring.kv")
        compute = sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                           deps=tuple(d for d in (block, compute) if d >= 0),
                           flops=graph.attention_flops() / sh.cp,
                           bytes=graph.attention_bytes(), op_class=ATTENTION,
                           label=f"attention.fwd.{step}", **ctx)
        if step < sh.cp - 1:
            block = nxt
    return compute


def attention_backward(graph: "LayerGraph", sink: "TaskSink", ctx: dict, ready: int) -> int:
    """Backward of the attention core under CP; returns the task that has dQ, dK and dV."""
    sh = graph.shape
    factor = 2.5 if graph.flash_attention else 2.0   # see LayerGraph._emit_backward_node
    if graph.recompute_attention:
        ready = attention_forward(graph, sink, ctx, (ready,), "recompute")
    if sh.cp_mode == "all_gather":
        core = sink.add(kind=COMPUTE, stream="compute", op="attention", phase="backward",
                        deps=(ready,), flops=factor * graph.attention_flops(),
                        bytes=2.0 * graph.attention_bytes(), op_class=ATTENTION,
                        label="attention.bwd", **ctx)
        dkv = sink.add(kind=COMM, stream=CP_STREAM, op="reduce_scatter", phase="backward",
                       deps=(core,), bytes=sh.cp * kv_block_bytes(graph), group=("cp",),
                       label="cp.reduce_scatter.dkv", **ctx)
        return _join(sink, ctx, (core, dkv), "backward", "cp.all_gather.dq_dkv")
    if sh.cp_mode == "all_to_all":
        d_out = _a2a(sink, ctx, _q_bytes(graph), (ready,), "backward", "cp.a2a.grad_out")
        core = sink.add(kind=COMPUTE, stream="compute", op="attention", phase="backward",
                        deps=(d_out,), flops=factor * graph.attention_flops(),
                        bytes=2.0 * graph.attention_bytes(), op_class=ATTENTION,
                        label="attention.bwd", **ctx)
        back = [_a2a(sink, ctx, size, (core,), "backward", f"cp.a2a.grad_{name}")
                for name, size in (("q", _q_bytes(graph)), ("k", _kv_bytes(graph)),
                                   ("v", _kv_bytes(graph)))]
        return _join(sink, ctx, back, "backward", "cp.a2a.grads")
    key = (ctx["layer"], ctx["microbatch"], "backward")
    block, compute, dkv = ready, -1, -1
    for step in range(sh.cp):
        if step < sh.cp - 1:
            nxt = _send_recv(sink, ctx, ("cp.kv",) + key + (step,), kv_block_bytes(graph),
                             (block,), "backward", "cp.ring.kv")
        compute = sink.add(kind=COMPUTE, stream="compute", op="attention", phase="backward",
                           deps=tuple(d for d in (block, compute) if d >= 0),
                           flops=factor * graph.attention_flops() / sh.cp,
                           bytes=2.0 * graph.attention_bytes(), op_class=ATTENTION,
                           label=f"attention.bwd.{step}", **ctx)
        # The dK/dV partial of this block, with this rank's share added, moves on (after
        # the last step it returns to the block's owner).
        dkv = _send_recv(sink, ctx, ("cp.dkv",) + key + (step,), kv_block_bytes(graph),
                         tuple(d for d in (compute, dkv) if d >= 0), "backward", "cp.ring.dkv",
                         (GRAD_SEND, GRAD_RECV))
        if step < sh.cp - 1:
            block = nxt
    return _join(sink, ctx, (compute, dkv), "backward", "cp.ring.grads")


def _a2a(sink: "TaskSink", ctx: dict, size: float, deps, phase: str, label: str) -> int:
    return sink.add(kind=COMM, stream=CP_STREAM, op="all_to_all", phase=phase,
                    deps=tuple(deps), bytes=size, group=("cp",), label=label, **ctx)
