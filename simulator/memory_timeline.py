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

from workloads.activation_offload import offloaded_layers, release_layer
from workloads.memory import memory_breakdown, output_activation_bytes, saved_layer_bytes
from workloads.program import Program


def _rank_deltas(plan, stage: int, layer, microbatch, phase, op, end, stream) -> np.ndarray:
    """Bytes allocated (+) or freed (-) at the end of each row of one rank.

    Only compute-stream rows count: a layer's gradient reduce-scatter, which ends later,
    does not hold its activations.
    """
    deltas = np.zeros(len(end))
    first_fwd: dict[tuple[int, int], int] = {}
    last_fwd: dict[tuple[int, int], int] = {}
    last_bwd: dict[tuple[int, int], int] = {}
    for i in np.argsort(end, kind="stable"):
        if stream[i] != "compute":
            continue
        key = (int(layer[i]), int(microbatch[i]))
        if key[0] >= 0 or op[i] in ("cross_entropy", "output"):
            key = key if key[0] >= 0 else (-1, key[1])
            if phase[i] == "forward" and (key[0] >= 0 or op[i] == "cross_entropy"):
                last_fwd[key] = i
                first_fwd.setdefault(key, i)
            elif phase[i] == "backward" and (key[0] >= 0 or op[i] == "output"):
                last_bwd[key] = i
    logits = output_activation_bytes(plan)
    for key, i in last_fwd.items():
        size = logits if key[0] < 0 else saved_layer_bytes(plan, key[0])
        deltas[i] += size
        if key in last_bwd:
            deltas[last_bwd[key]] -= size
    for layer in offloaded_layers(plan):
        # freed when layer L - N + i's forward starts, back when that layer's backward is
        # done (workloads/activation_offload.py), each at the end of that row
        size, at = saved_layer_bytes(plan, layer), release_layer(plan, layer)
        for mb in {k[1] for k in first_fwd if k[0] == at}:
            deltas[first_fwd[(at, mb)]] -= size
            if (at, mb) in last_bwd:
                deltas[last_bwd[(at, mb)]] += size
    return deltas


def memory_column(program: Program, trace: pa.Table) -> pa.Array:
    """`memory_bytes` for every row of a trace sorted by (rank, start_s, end_s)."""
    plan = program.plan
    cols = {n: trace[n].to_numpy(zero_copy_only=False)
            for n in ("rank", "layer", "microbatch", "phase", "op", "end_s", "stream")}
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
        deltas = _rank_deltas(plan, stage, cols["layer"][sl], cols["microbatch"][sl],
                              cols["phase"][sl], cols["op"][sl], end, cols["stream"][sl])
        order = np.argsort(end, kind="stable")
        in_use = np.empty(len(end))
        in_use[order] = static + np.cumsum(deltas[order])
        out[sl] = in_use
    return pa.array(out, type=pa.float64())
