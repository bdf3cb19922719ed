"""Multi-token-prediction layers in the combined 1F1B (workloads/moe/a2a_overlap.py).

Megatron-Core builds a chunk's schedule plan over the decoder's layers and then over the
MTP block's layers (NVIDIA/Megatron-LM megatron/core/models/common/
model_chunk_schedule_plan.py, TransformerModelChunkSchedulePlan.__init__ calls
_build_layer_schedule_plan on model.decoder, then on model.mtp; core_v0.14.0 to
d98e8a64). An MTP layer is one more layer of the last chunk: the combined step pairs it
with a layer of the other micro-batch like any other, so its all-to-alls hide behind the
partner's compute. Its schedule plan has one node more, mtp_post_process (the MTP's norm,
output layer and loss), on the computation stream: in the forward after the combine and
the partner's pre_dispatch backward, in the backward first, before the combine's backward
(TransformerLayerSchedulePlan.run). The MTP's input projection (its two norms, the
embedding of the shifted tokens, the concatenation and eh_proj) runs in its pre_dispatch
node (fine_grained_callables.py: the MTP layer's attention node wraps the transformer
layer's). The model's own post-process (final norm, output layer, loss) runs after the
chunk's layers in the forward and first in the backward (ModelChunkSchedulePlan.run).

The simulator builds the MTP modules inside the head unit (workloads/layers.py
build_head: the main loss, then per depth the module and its loss, then the sum of the
losses). `split_forward` and `split_backward` cut the head unit's tasks back into the
model's post-process and a `LayerSpan` for the MTP layer (the overlap takes at most one:
workloads/moe_options.py check_a2a_overlap), by the ops that open and close each piece;
the lowering's own order inside each piece is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..program import Task

MTP_INPUT_OP = "mtp_hnorm"     # an MTP module's first forward op (its last backward one)
MTP_POST_OP = "mtp_norm"       # the first forward op of its post-process (the last backward)
LOSS_SUM_OP = "loss_sum"       # the losses' sum: the model's post-process


@dataclass
class LayerSpan:
    """The tasks of one layer of a pass, in issue order; `post` holds an MTP layer's
    post-process (empty for a decoder layer)."""

    ids: list[int]
    post: list[int] = field(default_factory=list)


def decoder_spans(ranges: list[range]) -> list[LayerSpan]:
    """Decoder layers' ranges as spans."""
    return [LayerSpan(list(r)) for r in ranges]


def split_forward(tasks: list[Task], ids: range) -> tuple[list[int], list[LayerSpan]]:
    """A head unit's forward as (the model's post-process, the MTP layers in depth
    order). The model's norm, output and loss come first, each MTP module then runs its
    layer and its post-process, and the losses' sum closes the unit."""
    main: list[int] = []
    layers: list[LayerSpan] = []
    where = main
    for i in ids:
        op = tasks[i].op
        if op == MTP_INPUT_OP:
            layers.append(LayerSpan([]))
            where = layers[-1].ids
        elif op == MTP_POST_OP and layers:
            where = layers[-1].post
        elif op == LOSS_SUM_OP:
            where = main
        where.append(i)
    return main, layers


def split_backward(tasks: list[Task], ids: range) -> tuple[list[int], list[LayerSpan]]:
    """A head unit's backward as (the model's post-process, the MTP layer). The overlap
    takes at most one MTP layer (workloads/moe_options.py check_a2a_overlap, as
    Megatron-Core asserts). The lowering emits the losses' sum, the MTP's post-process
    (closed by its norm), its layer (closed by its input norm), then the model's loss,
    output and norm; what of that tail waits for the MTP layer (the join of the input's
    gradients) goes to the end of the MTP layer."""
    if not any(tasks[i].op == MTP_INPUT_OP for i in ids):
        return list(ids), []
    main: list[int] = []
    mtp = LayerSpan([])
    in_mtp: set[int] = set()
    piece = "losses"        # then "post", "layer", "tail"
    for i in ids:
        op = tasks[i].op
        if piece == "losses" and op != LOSS_SUM_OP:
            piece = "post"
        if piece == "losses":
            main.append(i)
            continue
        if piece == "post":
            mtp.post.append(i)
            piece = "layer" if op == MTP_POST_OP else piece
        elif piece == "layer":
            mtp.ids.append(i)
            piece = "tail" if op == MTP_INPUT_OP else piece
        elif any(d in in_mtp for d in tasks[i].deps):
            mtp.ids.append(i)
        else:
            main.append(i)
            continue
        in_mtp.add(i)
    return main, [mtp]
