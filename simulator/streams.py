"""Which stream of a simulated GPU runs each task of a stage, and what it waits for.

A stream runs its tasks in program order, like kernels on a CUDA stream, so a task's
dependencies on its own stream are met by that order; only those on other streams are
waited for (simulator/engine.py).
"""
from __future__ import annotations

from workloads.program import COMPUTE, HOST_COPY, Task


def stage_streams(tasks: list[Task], serial: bool = False) -> dict[str, tuple[list, list]]:
    """Per stream, its tasks and, beside them, each task's dependencies on other streams.

    serial: the device runs no collective beside compute (DeviceProfile
    .concurrent_collectives false), so collectives, and compute work that other streams
    carry (FSDP's gradient copy-in), join the compute stream in program order;
    point-to-point transfers keep their streams (a receive waits for its peer), and so
    does a copy engine's transfer (it holds no SMs).
    """
    # each task's lane once (a stage holds up to millions of tasks)
    lanes = [("compute" if serial and t.op_class != HOST_COPY
              and (t.kind == COMPUTE or t.op != "send_recv") else t.stream)
             for t in tasks]
    # two lists a stream, not a (task, cross) pair a task: 64 bytes a task less
    streams: dict[str, tuple[list, list]] = {}
    for task, own in zip(tasks, lanes):
        cross = tuple(d for d in task.deps if lanes[d] != own) if task.deps else ()
        if len(cross) == len(task.deps):
            cross = task.deps       # every dependency is on another stream: shared
        if own not in streams:
            streams[own] = ([], [])
        own_tasks, own_cross = streams[own]
        own_tasks.append(task)
        own_cross.append(cross)
    return streams
