"""The multi-token-prediction layer in the combined 1F1B (workloads/moe/a2a_overlap.py).

Megatron-Core builds a chunk's schedule plan over the decoder's layers and then over the
MTP block's layers (NVIDIA/Megatron-LM megatron/core/models/common/
model_chunk_schedule_plan.py, TransformerModelChunkSchedulePlan.__init__ calls
_build_layer_schedule_plan on model.decoder, then on model.mtp; core_v0.14.0 to
d98e8a64). The MTP layer is one more layer of the last chunk: the combined step pairs it
with a layer of the other micro-batch like any other, so its all-to-alls hide behind the
partner's compute. Its nodes (fine_grained_callables.py, the MTP layer's callables):
- pre_dispatch: the decoder's final layernorm (core_v0.14.0 / core_v0.15.0 apply it in the
  MTP's first node; d98e8a64 in the last decoder layer's combine), the MTP's embedding of
  the shifted tokens, its two norms, their concatenation and eh_proj, then the transformer
  layer's attention and router;
- dispatch, mlp, combine as a decoder layer's;
- mtp_post_process: the MTP's final layernorm alone (MultiTokenPredictionLayer.
  _postprocess), on the computation stream, in the forward after the combine and the
  partner's pre_dispatch backward, in the backward first, before the combine's gradient
  (TransformerLayerSchedulePlan.run).
The MTP's output layer and loss run with the model's in the post-process node
(GPTModel._postprocess, the mtp_process branch), after the chunk's layers and sends in the
forward and first in the backward (ModelChunkSchedulePlan.run).

The simulator builds the MTP module inside the head unit (workloads/layers.py build_head:
the final norm, the model's output and loss, the module, its norm, output and loss, the
losses' sum). `split_forward` and `split_backward` cut the head unit's tasks back into the
post-process and a `LayerSpan` for the MTP layer (the overlap takes at most one:
workloads/moe_options.py check_a2a_overlap), by the ops that open and close each piece and
by what waits for the layer; the lowering's own order inside each piece is kept, and a
piece that does not open or close where expected is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..program import Task

FINAL_NORM_OP = "final_norm"   # the decoder's final norm, which the MTP layer reads
MTP_INPUT_OP = "mtp_hnorm"     # the MTP module's first forward op (its last backward one)
MTP_POST_OP = "mtp_norm"       # its post-process: the MTP's final norm


@dataclass
class LayerSpan:
    """The tasks of one layer of a pass, in issue order; `post` holds the MTP layer's
    post-process (empty for a decoder layer)."""

    ids: list[int]
    post: list[int] = field(default_factory=list)


def decoder_spans(ranges: list[range]) -> list[LayerSpan]:
    """Decoder layers' ranges as spans."""
    return [LayerSpan(list(r)) for r in ranges]


def _has_mtp(tasks: list[Task], ids: range) -> bool:
    return any(tasks[i].op == MTP_INPUT_OP for i in ids)


def split_forward(tasks: list[Task], ids: range) -> tuple[list[int], list[LayerSpan]]:
    """A head unit's forward as (the post-process: both output layers and losses, the
    losses' sum; the MTP layer). The lowering emits the unit's entry (its input's join),
    the final norm, the model's output and loss, the MTP module from its input norm on,
    the MTP norm, the MTP's output and loss, the sum; the entry and the final norm open the
    MTP layer, which reads them."""
    if not _has_mtp(tasks, ids):
        return list(ids), []
    main: list[int] = []
    mtp = LayerSpan([])
    where = mtp.ids
    for i in ids:
        op = tasks[i].op
        if op == MTP_POST_OP:
            mtp.post.append(i)
            where = main
            continue
        if op == MTP_INPUT_OP:
            where = mtp.ids
        where.append(i)
        if op == FINAL_NORM_OP:
            where = main
    _check(tasks, main, mtp, forward=True)
    return main, [mtp]


def split_backward(tasks: list[Task], ids: range) -> tuple[list[int], list[LayerSpan]]:
    """A head unit's backward as (the post-process, the MTP layer). The lowering emits the
    losses' sum, the MTP's loss and output, its norm, its layer down to its input norm, then
    the model's loss and output and the final norm; what of that tail waits for the MTP
    layer (the final norm's gradient join, the norm, the input's join) goes to the end of
    the MTP layer, as the final norm is its pre_dispatch's."""
    if not _has_mtp(tasks, ids):
        return list(ids), []
    main: list[int] = []
    mtp = LayerSpan([])
    piece = "post-process"       # then "layer", then "tail"
    for i in ids:
        op = tasks[i].op
        if piece == "post-process" and op == MTP_POST_OP:
            mtp.post.append(i)
            piece = "layer"
        elif piece == "layer":
            mtp.ids.append(i)
            piece = "tail" if op == MTP_INPUT_OP else piece
        elif piece == "tail" and _waits_for(tasks, i, mtp.ids):
            mtp.ids.append(i)
        else:
            main.append(i)
    _check(tasks, main, mtp, forward=False)
    return main, [mtp]


def _waits_for(tasks: list[Task], i: int, ids: list[int]) -> bool:
    return any(d in ids for d in tasks[i].deps)


def _check(tasks: list[Task], main: list[int], mtp: LayerSpan, forward: bool) -> None:
    """The pieces are cut by position in the lowering's order: fail loudly where that order
    and the data flow disagree. The forward's post-process runs after the MTP layer, so
    nothing of the layer may wait for it; the backward's runs first, so it may wait for
    nothing of the layer; and the MTP's post-process is its one norm."""
    first, then = (main, mtp.ids + mtp.post) if forward else (mtp.ids + mtp.post, main)
    earlier = set(first)
    if len(mtp.post) != 1 or any(d in earlier for i in then for d in tasks[i].deps):
        raise ValueError("the head unit's tasks do not split into the post-process and "
                         "the MTP layer")
