"""The host of a simulated rank: when it issues each task of its stage.

A framework's Python issues every kernel and collective of a step from one host thread,
asynchronously: the device runs a queue of issued work, and the host runs ahead of it
while its own time per task (Task.host_s) is shorter than the device's. Where the host
reads something the device computes (a device-to-host copy it then waits for: Task.
host_sync, such as the MoE dispatcher's tokens per expert), it blocks until the device has
finished everything before that copy; the device's queue is then empty, and the host time
of what follows shows in the step until the host is ahead again. The engine
(simulator/engine.py) starts a task no earlier than its issue time.
"""
from __future__ import annotations

from array import array

from workloads.program import Task


class HostTimeline:
    """When the host of one rank issues each task of its stage, relative to the last
    host-synchronising task before it (or the step's start).

    The host issues the tasks in list order (the order the framework's Python runs them),
    spending each task's host time; after a task with `host_sync` it blocks until that
    task is done. So task i is issued at  end(last_sync[i]) + offset[i],  where offset[i]
    sums the host time of the tasks after that sync up to i (end(-1) = 0, the step's start).
    """

    __slots__ = ("last_sync", "offset")

    def __init__(self, tasks: list[Task], factor: float) -> None:
        # machine values, not Python objects: a stage holds up to millions of tasks
        self.last_sync = array("q", [-1]) * len(tasks)
        self.offset = array("d", [0.0]) * len(tasks)
        sync, elapsed = -1, 0.0
        for task in tasks:
            elapsed += task.host_s * factor
            self.last_sync[task.id], self.offset[task.id] = sync, elapsed
            if task.host_sync:
                sync, elapsed = task.id, 0.0

    @staticmethod
    def needed(tasks: list[Task]) -> bool:
        """Whether any task costs host time or synchronises the host."""
        return any(t.host_s or t.host_sync for t in tasks)
