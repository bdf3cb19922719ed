"""Memory over the step: bytes in use on each simulated rank when each traced task ends.

Model states (parameters, gradients, optimizer) and buffers are held at their analytic
values (workloads.memory) for the whole step; activations follow the trace: a layer's
saved tensors of a micro-batch are allocated when its forward ends and freed when its
backward ends, and the last stage's logits live from the loss to the output layer's
backward; an offloaded layer's saved tensors leave the GPU from the forward of layer
L - N + i to that layer's backward (workloads/activation_offload.py). The timeline's
maximum is what the schedule actually keeps in flight, which the analytic peak bounds
from above.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workloads.activation_offload import offloaded_layers, release_layer
from workloads.memory import memory_breakdown, output_activation_bytes, saved_layer_bytes
from workloads.program import Program


def _row_per_key(rows: np.ndarray, key: np.ndarray, pos: np.ndarray, first: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For each key of `rows`, its row that comes last (first: first) in end order `pos`:
    (the keys in ascending order, their rows)."""
    if not len(rows):
        return key[:0], rows
    rows = rows[np.lexsort((pos[rows], key[rows]))]
    keys = key[rows]
    change = keys[1:] != keys[:-1]
    pick = np.insert(change, 0, True) if first else np.append(change, True)
    return keys[pick], rows[pick]


def _rank_deltas(plan, layer, microbatch, masks: dict[str, np.ndarray], end
                 ) -> np.ndarray:
    """Bytes allocated (+) or freed (-) at the end of each row of one rank.

    A layer's saved tensors of a micro-batch (key: layer, micro-batch; the output layer's
    logits: layer -1) are allocated when its last forward row ends and freed when its
    last backward row ends. Only compute-stream rows count: a layer's gradient
    reduce-scatter, which ends later, does not hold its activations. Rows are taken in end
    order, ties in row order (a stable sort), so each key has one last row.
    """
    deltas = np.zeros(len(end))
    pos = np.empty(len(end), dtype=np.int64)
    pos[np.argsort(end, kind="stable")] = np.arange(len(end))
    in_layer = layer >= 0
    compute = masks["compute"]
    key_layer = np.where(in_layer, layer, -1).astype(np.int64)
    # one number per (layer, micro-batch) key, whatever the micro-batch numbers
    mb = microbatch.astype(np.int64) - int(microbatch.min(initial=0))
    key = key_layer * (int(mb.max(initial=0)) + 1) + mb
    forward = np.flatnonzero(compute & masks["forward"] & (in_layer | masks["cross_entropy"]))
    backward = np.flatnonzero(compute & masks["backward"] & (in_layer | masks["output"]))
    fwd_keys, last_fwd = _row_per_key(forward, key, pos)
    bwd_keys, last_bwd = _row_per_key(backward, key, pos)
    saved_bytes = _saved_bytes(plan, key_layer[last_fwd])
    deltas[last_fwd] += saved_bytes
    freed = np.isin(fwd_keys, bwd_keys)
    deltas[last_bwd[np.searchsorted(bwd_keys, fwd_keys[freed])]] -= saved_bytes[freed]
    offloaded = offloaded_layers(plan)
    if offloaded:
        first_keys, first_fwd = _row_per_key(forward, key, pos, first=True)
        first = dict(zip(first_keys.tolist(), first_fwd.tolist()))
        freed_at = dict(zip(bwd_keys.tolist(), last_bwd.tolist()))
        for saved in offloaded:
            # freed when layer L - N + i's forward starts, back when that layer's backward
            # is done (workloads/activation_offload.py), each at the end of that row
            size_bytes, at = saved_layer_bytes(plan, saved), release_layer(plan, saved)
            for k in first_keys[key_layer[first_fwd] == at].tolist():
                deltas[first[k]] -= size_bytes
                if k in freed_at:
                    deltas[freed_at[k]] += size_bytes
    return deltas


def _saved_bytes(plan, key_layers: np.ndarray) -> np.ndarray:
    """Bytes each key saves: its layer's activations, or the logits (key layer -1)."""
    per_layer = {int(n): (saved_layer_bytes(plan, int(n)) if n >= 0 else
                          output_activation_bytes(plan)) for n in np.unique(key_layers)}
    return np.array([per_layer[n] for n in key_layers.tolist()], dtype=np.float64)


def memory_column(program: Program, trace: pa.Table) -> pa.Array:
    """`memory_bytes` for every row of a trace sorted by (rank, start_s, end_s)."""
    plan = program.plan
    cols = {n: trace[n].to_numpy() for n in ("rank", "layer", "microbatch", "end_s")}
    # the string columns the timeline reads, as masks (not millions of Python strings)
    masks = {name: pc.equal(trace[column], name).to_numpy()
             for column, name in (("stream", "compute"), ("phase", "forward"),
                                  ("phase", "backward"), ("op", "cross_entropy"),
                                  ("op", "output"))}
    out = np.zeros(trace.num_rows)
    ranks, starts = np.unique(cols["rank"], return_index=True)
    bounds = list(starts[1:]) + [trace.num_rows]
    static_by_stage: dict[int, float] = {}
    for rank, lo, hi in zip(ranks, starts, bounds):
        stage = plan.parallel_dims.stage_of(int(rank))
        if stage not in static_by_stage:
            b = memory_breakdown(plan, stage)
            static_by_stage[stage] = (b.params_bytes + b.grads_bytes + b.optimizer_bytes
                                      + b.buffers_bytes)
        static = static_by_stage[stage]
        sl = slice(lo, hi)
        end = cols["end_s"][sl]
        deltas = _rank_deltas(plan, cols["layer"][sl], cols["microbatch"][sl],
                              {name: mask[sl] for name, mask in masks.items()}, end)
        order = np.argsort(end, kind="stable")
        in_use = np.empty(len(end))
        in_use[order] = static + np.cumsum(deltas[order])
        out[sl] = in_use
    return pa.array(out, type=pa.float64())
