"""Which ranks form a task's collective group, and which other groups run it at the same time.

The engine simulates one representative rank per stage (or per fault class, rank_classes.py)
and lets the identical groups of the ranks it does not simulate ("twins") load the shared
links. This module answers the engine's group questions from the plan's mesh and the
classes, and caches each answer: a step repeats a few hundred thousand collectives over a
handful of groups.
"""
from __future__ import annotations

from workloads.program import COMPUTE, Task

from .rank_classes import RankClasses


class RankGroups:
    """Group membership, class representatives, twin groups and trace names of one mesh."""

    def __init__(self, mesh, classes: RankClasses | None) -> None:
        self.mesh, self.classes = mesh, classes
        self._groups: dict[tuple, tuple[int, ...]] = {}
        self._representatives: dict[tuple, tuple[int, ...]] = {}
        self._twins: dict[tuple, tuple] = {}
        self._names: dict[tuple, str] = {}

    def group(self, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
        """The ranks of `rank`'s group over the mesh dimensions `dims`."""
        key = (rank, dims)
        if key not in self._groups:
            self._groups[key] = self.mesh.group_ranks(rank, dims)
        return self._groups[key]

    def representatives(self, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
        """Representatives of the classes in `rank`'s group over `dims`, ascending."""
        key = (rank, dims)
        if key not in self._representatives:
            self._representatives[key] = tuple(sorted(
                {self.classes.representative(m) for m in self.group(rank, dims)}))
        return self._representatives[key]

    def twins(self, rank: int, dims: tuple[str, ...], peer: int = 0) -> tuple:
        """Groups that run the same collective at the same time as `rank`'s group.

        They are the other groups over `dims` among the ranks of the same stage. For a
        point-to-point step along one dim (`peer` != 0) each twin is (sender, receiver).
        With fault-aware classes only groups of the same orbit are twins (the others run
        on their own), and only senders of `rank`'s class.
        """
        key = (rank, dims, peer)
        if key in self._twins:
            return self._twins[key]
        alike = self._orbit_test(rank, dims, peer)
        seen, twins = set(self.group(rank, dims)), []
        for member in self.mesh.stage_ranks(self.mesh.stage_of(rank)):
            if member in seen:
                continue
            if peer:
                if alike(member):
                    twins.append((member, self.mesh.peer(member, dims[0], peer)))
                seen.add(member)
            else:
                group = self.group(member, dims)
                seen.update(group)
                if alike(member):
                    twins.append(group)
        self._twins[key] = tuple(twins)
        return self._twins[key]

    def _orbit_test(self, rank: int, dims: tuple[str, ...], peer: int):
        """member -> whether its group (or, for a send, itself) is an orbit-mate of
        `rank`'s: always with the stage classes."""
        classes = self.classes
        if classes is None:
            return lambda member: True
        if peer:
            own_class = classes.class_of[rank]
            return lambda member: classes.class_of[member] == own_class
        fixed = ~classes.varied_digits(dims)
        own_key = classes.group_key(rank, fixed)
        return lambda member: classes.group_key(member, fixed) == own_key

    def trace_name(self, rank: int, task: Task) -> str:
        """The trace's group column of a task on `rank`: "" for compute, "dim:src->dst"
        for a pipeline or ring transfer, the mesh dimensions otherwise."""
        if task.kind == COMPUTE:
            return ""
        key = (rank, task.op == "send_recv", task.group, task.peer, task.stream)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = self._new_name(rank, task)
        return name

    def _new_name(self, rank: int, task: Task) -> str:
        if task.op == "send_recv":
            dim = task.group[0]
            here = self.mesh.index(rank, dim)
            there = self.mesh.index(self.mesh.peer(rank, dim, task.peer), dim)
            src, dst = (here, there) if task.stream.endswith("send") else (there, here)
            return f"{dim}:{src}->{dst}"
        return ",".join(task.group)
