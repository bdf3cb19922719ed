"""Expert-parallel all-to-all overlap: one micro-batch's forward interleaved with another's
backward, layer by layer (Megatron-Core's overlap_moe_expert_parallel_comm, the combined
1F1B schedule), as task order on the compute and communication streams.

Megatron-Core (NVIDIA/Megatron-LM d98e8a64) splits each transformer layer into five
callables (megatron/core/models/gpt/fine_grained_callables.py): pre_dispatch (attention,
the pre-MLP norm, the shared experts, the router and the dispatcher's preprocess: permute
and token counts), dispatch (the all-to-all), mlp (dispatch postprocess, the routed
experts, combine preprocess), combine (the all-to-all, combine postprocess: unpermute,
the shared experts' add and the residual add) and MTP postprocess. dispatch and combine
run on a communication stream, the others on the computation stream. A combined step runs
forward layer i with backward layer n - 1 - i of the other micro-batch
(megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):

    comm stream: combine_bwd       | dispatch_fwd -> dispatch_bwd     | combine_fwd
    comp stream: pre_dispatch_fwd  | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd (+dw)

Each stream waits for the other only where data flows, so the backward's combine hides
behind the forward's attention, the forward's dispatch behind the backward's experts, the
backward's dispatch behind the experts' weight gradients and the forward's experts, and
the forward's combine behind the backward's attention; what a partner's compute does not
cover stays exposed. With delay_wgrad_compute the weight gradients of the experts (mlp
backward_dw) and of the attention and shared experts (pre_dispatch backward_dw) run after
the dgrads of their callable, so the dispatch backward and the next layer's combine
backward start after the dgrads alone. A chunk runs (ModelChunkSchedulePlan.run): the
forward's receive and embedding, the backward's receive and output layer, the paired
layers (the MTP layer is the last chunk's last layer: workloads/moe/mtp_overlap.py),
the backward's remaining layers, the forward's remaining layers, both sends, the
forward's output layer, the backward's embedding.

The lowering builds the forward and the backward as usual (their tasks and dependencies
are unchanged); `combined_order` gives the order in which Megatron-Core issues them, and
`reorder` renumbers the stage's tasks so that the streams run them in that order.
Assumption: compute moved to the communication stream (unpermute, the residual add) runs
beside the other stream's compute at full speed (they are small memory-bound kernels).

The schedule nodes cost the host work of their own (`node_calls`, `add_node_host_time`),
on top of the kernels and Transformer Engine module calls the tasks already carry.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..graph_node import FUSED_INTO
from ..main_grad import GRAD_ACCUMULATE_OPS
from ..dp_impl import DDP_COPY_IN
from ..program import COMM, Task
from ..schedules import EMBED, HEAD
from .mtp_overlap import LayerSpan, decoder_spans, split_backward, split_forward

COMM_STREAM = "ep"          # Megatron-Core's a2a communication stream
COMPUTE_STREAM = "compute"
# (HybridEP's routing-map gather runs inside the dispatch node: Megatron-Core's flex
# dispatcher calls HybridEP in token_dispatch, after dispatch_preprocess)
DISPATCH_LABELS = ("moe.routing_map", "moe.dispatch", "moe.dispatch_probs")
COMBINE_LABEL = "moe.combine"
GRAD_DISPATCH_LABELS = ("grad.moe.dispatch", "grad.moe.dispatch_probs")
GRAD_COMBINE_LABEL = "grad.moe.combine"

# Host work of the combined 1F1B's schedule nodes, counted from NVIDIA/Megatron-LM
# (core_v0.16.0, core_v0.17.0, d98e8a64: megatron/core/pipeline_parallel/utils.py
# ScheduleNode; megatron/core/models/gpt/fine_grained_callables.py TransformerLayerNode):
# - every node call, forward or backward, runs inside stream_acquire_context: its stream
#   waits for the micro-batch's shared CUDA event first and records it after
#   (event.wait(stream), event.record(stream)): two CUDA API calls from Python;
# - every backward node runs its own autograd engine call (default_backward_func:
#   Variable._execution_engine.run_backward), where the plain schedule makes one per chunk;
# - with delay_wgrad_compute, TransformerLayerNode.backward_dw calls backward_dw() of each
#   Transformer Engine module (Attention: linear_qkv, linear_proj; the experts: linear_fc1,
#   linear_fc2; the shared experts'), a Python call of its own per module, apart from the
#   dgrad's autograd call that the module's host time (workloads/host_cost.py) covers.
# A layer with experts has four nodes (attention with the router and the dispatch
# preprocess, moe_dispatch, mlp, moe_combine), a dense one two (attn, mlp; the others are
# NoopScheduleNode). core_v0.14.0 / core_v0.15.0 split the first into attn and post_attn
# (one node more per MoE layer), not priced here; nor are the per-input detach, record_stream
# and storage frees around each node (tensor bookkeeping without a CUDA call).
# The router's weight is a plain parameter (megatron/core/transformer/moe/router.py
# TopKRouter), not a Transformer Engine module: it has no backward_dw call.
# Each is one operator at the framework's per-operator host time (plan.host_kernel_s).
NON_TE_GEMMS = ("router",)
NODE_OPS = 2                    # event wait + record
BACKWARD_NODE_OPS = NODE_OPS + 1   # and its autograd engine call
DENSE_NODES = 2                 # attn, mlp


@dataclass
class PassPieces:
    """Task id ranges [begin, end) of one pass through a chunk: what comes before its
    units (receive), each unit's tasks in pass order, what comes after (send, flush)."""

    pre: list[range] = field(default_factory=list)
    units: list[tuple[object, range]] = field(default_factory=list)
    post: list[range] = field(default_factory=list)

    def layers(self) -> list[range]:
        """The transformer layers' ranges, in pass order."""
        return [r for unit, r in self.units if isinstance(unit, int)]


def forward_segments(tasks: list[Task], ids: Sequence[int]) -> tuple[list[int], ...]:
    """A forward layer's tasks as (pre_dispatch, dispatch, mlp, combine), by data flow:
    combine is the combine all-to-all and what follows from it (unpermute, the shared
    experts' add, the residual add), mlp what follows from the dispatch, pre_dispatch the
    rest (with the shared experts, which Megatron-Core computes there). A layer without
    expert-parallel all-to-alls (a dense layer) is pre_dispatch alone."""
    pre, disp, mlp, comb = [], [], [], []
    from_disp: set[int] = set()
    from_comb: set[int] = set()
    for i in ids:
        t = tasks[i]
        if t.label == COMBINE_LABEL or any(d in from_comb for d in t.deps):
            from_comb.add(i)
            comb.append(i)
        elif t.stream == COMM_STREAM and t.label in DISPATCH_LABELS:
            from_disp.add(i)
            disp.append(i)
        elif any(d in from_disp for d in t.deps):
            from_disp.add(i)
            mlp.append(i)
        else:
            pre.append(i)
    return pre, disp, mlp, comb


def _pull(tasks: list[Task], segments: list[list[int]], k: int,
          waiting: list[int] | None = None) -> None:
    """Move into segments[k] the tasks of later segments that it (or `waiting`) waits
    for, and what those wait for (in place, each segment kept in emission order)."""
    later = {i: j for j in range(k + 1, len(segments)) for i in segments[j]
             if i not in (waiting or ())}
    todo = [d for i in (waiting or segments[k]) for d in tasks[i].deps]
    while todo:
        d = todo.pop()
        j = later.pop(d, None)
        if j is not None:
            segments[j].remove(d)
            segments[k].append(d)
            todo += tasks[d].deps
    segments[k].sort()


# What the lowering issues once a layer's gradients are done, beside its reductions: their
# accumulation (workloads/main_grad.py) and torch DDP's copy into its buckets.
AFTER_LAYER_OPS = GRAD_ACCUMULATE_OPS + (DDP_COPY_IN,)


def backward_segments(tasks: list[Task], ids: Sequence[int], delay_wgrad: bool
                      ) -> tuple[list[int], ...]:
    """A backward layer's tasks as (combine_bwd, mlp_bwd, mlp_dw, dispatch_bwd,
    pre_dispatch_bwd, pre_dispatch_dw, after): after holds what the lowering issues once
    the layer's gradients are done (their accumulation and reductions). The dw lists are
    empty without delay_wgrad."""
    comb, mlp, mlp_dw, disp, pre, pre_dw, after = [], [], [], [], [], [], []
    seen_combine = seen_dispatch = False
    moe = any(tasks[i].label == GRAD_COMBINE_LABEL for i in ids)
    combine_waits = _waits_of(tasks, ids, GRAD_COMBINE_LABEL)
    for i in ids:
        t = tasks[i]
        wgrad = delay_wgrad and t.label.endswith(".wgrad")
        if t.stream.startswith("dp_") or t.op in AFTER_LAYER_OPS:
            after.append(i)
        elif t.label == GRAD_COMBINE_LABEL:
            seen_combine = True
            comb.append(i)
        elif t.stream == COMM_STREAM and t.label in GRAD_DISPATCH_LABELS:
            seen_dispatch = True
            disp.append(i)
        elif (not seen_combine and i not in combine_waits) or seen_dispatch or not moe:
            (pre_dw if wgrad else pre).append(i)
        elif seen_combine:
            (mlp_dw if wgrad else mlp).append(i)
        else:
            comb.append(i)
    # what the dispatch's gradient waits for is mlp backward, wherever the graph emitted
    # it (the accumulation of the experts' input gradients); what mlp backward waits for
    # is there too
    segments = [comb, mlp, mlp_dw, disp, pre, pre_dw, after]
    _pull(tasks, segments, 1, waiting=disp)
    _pull(tasks, segments, 1)
    _pull(tasks, segments, 0)
    return tuple(segments)


def _waits_of(tasks: list[Task], ids: Sequence[int], label: str) -> set[int]:
    """The tasks of `ids` that the task labelled `label` waits for, directly or not."""
    out: set[int] = set()
    members = set(ids)
    todo = [i for i in ids if tasks[i].label == label]
    while todo:
        for d in tasks[todo.pop()].deps:
            if d in members and d not in out:
                out.add(d)
                todo.append(d)
    return out


def _on(tasks: list[Task], ids: list[int], stream: str) -> list[int]:
    # the callable's kernels and EP collectives; TP and other streams keep their own
    for i in ids:
        if tasks[i].stream in (COMPUTE_STREAM, COMM_STREAM):
            tasks[i].stream = stream
    return ids


def _off_comm(tasks: list[Task], ids: list[int]) -> list[int]:
    # an all-to-all dispatcher's token-count gather in pre_dispatch runs on the computation
    # stream there (MoEAlltoAllTokenDispatcher.preprocess, issued from pre_dispatch)
    for i in ids:
        if tasks[i].stream == COMM_STREAM and tasks[i].kind == COMM:
            tasks[i].stream = COMPUTE_STREAM
    return ids


def _wgrad_modules(tasks: list[Task], ids: list[int]) -> int:
    """Transformer Engine modules whose delayed weight gradients `ids` hold (one
    backward_dw call each)."""
    return len({FUSED_INTO.get(tasks[i].op, tasks[i].op) for i in ids
                if tasks[i].label.endswith(".wgrad") and tasks[i].op not in NON_TE_GEMMS})


def node_calls(tasks: list[Task], fp: tuple, bp: tuple) -> list[tuple[Task, int]]:
    """The host operators of one layer pair's schedule-node calls (constants above), as
    (the node's first task, operators): fp / bp are the forward's and the backward's
    segments (forward_segments, backward_segments), either all empty when absent."""
    pre, disp, mlp, comb = fp
    b_comb, b_mlp, b_mlp_dw, b_disp, b_pre, b_pre_dw, _after = bp
    out = []
    for nodes, ops in (((pre, disp, mlp, comb), NODE_OPS),
                       ((b_comb, b_mlp, b_disp, b_pre), BACKWARD_NODE_OPS)):
        calls = [n for n in nodes if n]
        if len(calls) == 1:     # a dense layer: attn and mlp in one segment
            out.append((tasks[calls[0][0]], DENSE_NODES * ops))
        else:
            out += [(tasks[n[0]], ops) for n in calls]
    out += [(tasks[dw[0]], _wgrad_modules(tasks, dw)) for dw in (b_mlp_dw, b_pre_dw)
            if _wgrad_modules(tasks, dw)]
    return out


def lone_node_calls(tasks: list[Task], pieces: PassPieces, forward: bool,
                    delay_wgrad: bool) -> list[tuple[Task, int]]:
    """node_calls of a pass run alone (a warm-up forward, a cool-down backward): under
    the overlap Megatron-Core runs those through the schedule nodes too
    (schedules.py forward_backward_helper_wrapper and combined_1f1b_schedule_for_
    no_pipelining call combined_forward_backward_step with one side None; core_v0.15.0)."""
    out: list[tuple[Task, int]] = []
    for span in _spans(tasks, pieces, forward)[0]:
        fp = forward_segments(tasks, span.ids) if forward else ([], [], [], [])
        bp = backward_segments(tasks, span.ids, delay_wgrad) if not forward else ([],) * 7
        out += node_calls(tasks, fp, bp)
        if span.post:
            out.append((tasks[span.post[0]], NODE_OPS if forward else BACKWARD_NODE_OPS))
    return out


def add_node_host_time(calls: list[tuple[Task, int]], plan) -> None:
    """Charge each schedule-node call its host operators at the framework's per-operator
    host time; none under a CUDA-graphed step or without per-kernel host cost (as
    workloads/host_cost.py)."""
    if plan.cuda_graphs or not plan.host_kernel_s:
        return
    for task, ops in calls:
        task.host_s += ops * plan.host_kernel_s


def layer_pair(tasks: list[Task], f: LayerSpan | None, b: LayerSpan | None,
               delay_wgrad: bool, deferred: list[int] | None = None,
               calls: list[tuple[Task, int]] | None = None) -> list[int]:
    """Issue order of forward layer `f` with backward layer `b` (either may be None), and
    the streams Megatron-Core runs each callable on (set on the tasks). `deferred`: where
    the backward's pre_dispatch weight gradients go instead (the chunk's last backward
    layer: Megatron-Core runs them after the pipeline sends). `calls`: where the node
    calls' host operators go (node_calls). An MTP layer's post-process runs on the
    computation stream, first in the backward and after the partner's pre_dispatch
    backward in the forward (workloads/moe/mtp_overlap.py)."""
    fp = forward_segments(tasks, f.ids) if f is not None else ([], [], [], [])
    bp = (backward_segments(tasks, b.ids, delay_wgrad) if b is not None
          else ([], [], [], [], [], [], []))
    f_post = f.post if f is not None else []
    b_post = b.post if b is not None else []
    if calls is not None:
        calls += node_calls(tasks, fp, bp)
        calls += [(tasks[post[0]], ops) for post, ops in
                  ((f_post, NODE_OPS), (b_post, BACKWARD_NODE_OPS)) if post]
    pre, disp, mlp, comb = fp
    b_comb, b_mlp, b_mlp_dw, b_disp, b_pre, b_pre_dw, after = bp
    if deferred is not None:   # the reductions wait for those gradients: after them
        deferred += b_pre_dw + after
        b_pre_dw, after = [], []
    return (_off_comm(tasks, b_post) + _on(tasks, b_comb, COMM_STREAM)
            + _off_comm(tasks, pre) + _off_comm(tasks, b_mlp)
            + _on(tasks, disp, COMM_STREAM) + b_mlp_dw + _on(tasks, b_disp, COMM_STREAM)
            + _off_comm(tasks, mlp) + _on(tasks, comb, COMM_STREAM)
            + _off_comm(tasks, b_pre) + _off_comm(tasks, f_post) + b_pre_dw + after)


def _spans(tasks: list[Task], pieces: PassPieces, forward: bool
           ) -> tuple[list[LayerSpan], list[int], list[int]]:
    """A pass's layers in the order the schedule plan runs them (decoder layers, then the
    MTP layer; the backward pops them from the end), its embedding's tasks and its head
    unit's without the MTP layer (workloads/moe/mtp_overlap.py)."""
    layers = decoder_spans(pieces.layers())
    embed: list[int] = []
    head: list[int] = []
    for unit, r in pieces.units:
        if unit == EMBED:
            embed += r
        elif unit == HEAD:
            main, mtp = split_forward(tasks, r) if forward else split_backward(tasks, r)
            head += main
            layers = layers + mtp if forward else mtp + layers
    return layers, embed, head


def combined_order(tasks: list[Task], fwd: PassPieces, bwd: PassPieces,
                   delay_wgrad: bool, calls: list[tuple[Task, int]] | None = None
                   ) -> list[int]:
    """Issue order of a combined step's tasks (the forward's and the backward's);
    `calls` collects its schedule-node calls' host operators (node_calls). The forward's
    embedding and the backward's output unit run before the layers, the forward's output
    unit and the backward's embedding after them."""
    def ids(ranges):
        return [i for r in ranges for i in r]
    f_layers, f_embed, f_head = _spans(tasks, fwd, True)
    b_layers, b_embed, b_head = _spans(tasks, bwd, False)
    order = ids(fwd.pre) + ids(bwd.pre) + f_embed + b_head
    paired = min(len(f_layers), len(b_layers))
    deferred: list[int] = []
    for i, b in enumerate(b_layers):
        f = f_layers[i] if i < paired else None
        last = deferred if i == len(b_layers) - 1 else None
        order += layer_pair(tasks, f, b, delay_wgrad, last, calls)
    for f in f_layers[paired:]:
        order += layer_pair(tasks, f, None, delay_wgrad, calls=calls)
    post = ids(bwd.post)
    sends = [i for i in post if not tasks[i].stream.startswith("dp_")]
    flush = [i for i in post if tasks[i].stream.startswith("dp_")]
    return order + ids(fwd.post) + sends + deferred + flush + f_head + b_embed


def reorder(tasks: list[Task], steps: list[tuple[range, list[int]]]) -> None:
    """Put each combined step's tasks (its id range) in the given order and renumber
    every task of the stage, dependencies included. Each dependency must still come
    earlier: the order is an issue order, so a task never waits for a later one."""
    new_id = list(range(len(tasks)))
    perm = list(range(len(tasks)))
    for span, order in steps:
        if sorted(order) != list(span):
            raise ValueError(f"combined step {span} ordered {len(order)} tasks")
        perm[span.start:span.stop] = order
    for pos, old in enumerate(perm):
        new_id[old] = pos
    moved = [tasks[old] for old in perm]
    for pos, task in enumerate(moved):   # (millions of tasks: no generator per task)
        task.id = pos
        if task.deps:
            deps = task.deps = tuple([new_id[d] for d in task.deps])
            if max(deps) >= pos:
                raise ValueError(f"task {task.label} would wait for a later task")
    tasks[:] = moved
