"""The copies of activation offloading as tasks of a stage (workloads/activation_offload.py
says what Megatron-Core and Transformer Engine do and when): per micro-batch and offloaded
layer i, a copy to the host after layer i's forward, which layer L - N + i's forward waits
for, and a copy back issued before layer L - 1 - N + i's backward (after the backward
issued before it), which layer i's backward waits for. Both run on the "offload" stream, a
copy engine: no SMs, at the host link's rate in its direction (topologies/host_link.py).
Assumption: a layer's copy out is one transfer after its last forward kernel, and its
backward waits for the whole copy back. Transformer Engine records an event per saved
tensor (its copies start as each tensor is saved) and the backward waits per tensor
(pop_tensor), so where the link is the bottleneck the model's copies start later and are
waited for longer than Transformer Engine's.
"""
from __future__ import annotations

from typing import Callable

from .activation_offload import offloaded_layers, release_layer, reload_layer
from .program import COMPUTE, HOST_COPY, Task

OFFLOAD_STREAM = "offload"
OFFLOAD_OP, RELOAD_OP = "activation_offload", "activation_reload"


def _compute_spans(tasks: list[Task]) -> dict[tuple, list[int]]:
    """(phase, layer, micro-batch) -> the ids of its compute-stream tasks, in order."""
    spans: dict[tuple, list[int]] = {}
    for task in tasks:
        if task.kind == COMPUTE and task.stream == "compute" and task.layer >= 0:
            spans.setdefault((task.phase, task.layer, task.microbatch), []).append(task.id)
    return spans


def insert_offload_copies(tasks: list[Task], plan,
                          saved_bytes: Callable[[int], float]) -> None:
    """Add each offloaded layer's copy out and copy back per micro-batch, with the waits
    of the module docstring, and renumber the stage's tasks (in place). `saved_bytes(i)`
    is what layer i keeps for its backward."""
    if not plan.activation_offload:
        return
    spans = _compute_spans(tasks)
    before: dict[int, list[Task]] = {}     # task id -> copies issued just before it
    after: dict[int, list[Task]] = {}      # task id -> copies issued just after it
    extra_deps: dict[int, list[Task]] = {}
    for mb in range(plan.micro_batches):
        for layer in offloaded_layers(plan):
            fwd = spans[("forward", layer, mb)]
            out = Task(id=-1, kind=COMPUTE, stream=OFFLOAD_STREAM, op=OFFLOAD_OP,
                       phase="forward", layer=layer, microbatch=mb, bytes=saved_bytes(layer),
                       op_class=HOST_COPY, label=f"{OFFLOAD_OP}.fwd", deps=(fwd[-1],))
            after.setdefault(fwd[-1], []).append(out)
            extra_deps.setdefault(spans[("forward", release_layer(plan, layer), mb)][0],
                                  []).append(out)
            reload_at = spans[("backward", reload_layer(plan, layer), mb)][0]
            previous = spans[("backward", reload_layer(plan, layer) + 1, mb)][-1]
            back = Task(id=-1, kind=COMPUTE, stream=OFFLOAD_STREAM, op=RELOAD_OP,
                        phase="backward", layer=layer, microbatch=mb,
                        bytes=saved_bytes(layer), op_class=HOST_COPY,
                        label=f"{RELOAD_OP}.bwd", deps=(previous,))
            before.setdefault(reload_at, []).append(back)
            extra_deps.setdefault(spans[("backward", layer, mb)][0], []).append(back)
    _splice(tasks, before, after, extra_deps)


def _splice(tasks: list[Task], before: dict, after: dict, extra_deps: dict) -> None:
    """Insert the new tasks around their anchors, then renumber ids and dependencies."""
    order: list[Task] = []
    for task in tasks:
        order += before.get(task.id, [])
        order.append(task)
        order += after.get(task.id, [])
    old_ids = {id(t): t.id for t in tasks}
    new_of_old = {}
    for pos, task in enumerate(order):
        if id(task) in old_ids:
            new_of_old[old_ids[id(task)]] = pos
    new_of_copy = {id(t): pos for pos, t in enumerate(order) if id(t) not in old_ids}
    for pos, task in enumerate(order):
        waits = extra_deps.get(old_ids[id(task)], []) if id(task) in old_ids else []
        task.deps = tuple(new_of_old[d] for d in task.deps) + tuple(
            new_of_copy[id(c)] for c in waits)
        task.id = pos
    tasks[:] = order
