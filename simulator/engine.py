"""The SimPy engine: every simulated rank replays its stage's tasks on GPU-like streams.

Each stream is a process that runs its tasks in order; a task starts when its stream is
free and its dependencies are done. Collectives go to the network model. In rank-class
mode (default) one representative rank per pipeline stage is simulated and the identical
groups of the other ranks ("twins") load the shared links; in full mode every rank runs
and a collective starts when its last member arrives. On a faulted topology
(`fault_classes`) the classes are split by the ranks the faults touch (rank_classes.py):
one representative per class runs, a collective whose group holds several classes starts
when their representatives have all arrived, and the group's orbit-mates are its twins.

Each simulated rank's host issues its stage's tasks in program order (host_timeline.py,
Task.host_s scaled by the host CPU, compute.host_factor); a task starts no earlier than
it is issued, and after a host-synchronising task the host waits for it to finish.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import simpy

from topologies import Topology
from workloads.program import COMPUTE, COPY_ENGINE, HOST_COPY, Program, Task, gc_paused

from .compute import host_factor, stage_costs
from .host_timeline import HostTimeline
from .network import CommModel, CommOptions
from .rank_classes import RankClasses, rank_classes
from .rank_groups import RankGroups
from .sm_share import NCCL, NVLS, STATED, SmShare
from .streams import stage_streams
from .trace import TraceRecorder
from .trace_spill import SpillRecorder


def _kernel_min_s(task: Task) -> float:
    """The least time a collective takes: its bytes at the measured rate of the kernel
    that runs it (Task.kernel_Bps; 0: the links alone decide)."""
    return task.bytes / task.kernel_Bps if task.kernel_Bps else 0.0


@dataclass(frozen=True)
class SimOptions:
    """How to simulate: rank classes or every rank, communication model choices."""

    full: bool = False                      # simulate every rank (checking)
    fault_classes: bool = False             # split rank classes by the faults (faults.py)
    comm: CommOptions = field(default_factory=CommOptions)
    overlap_slowdown: bool = True           # SM sharing slows compute under collectives


class _RankState:
    """Which tasks of one simulated rank are done; events only for awaited ones; when
    each host-synchronising task finished (HostTimeline)."""

    __slots__ = ("done", "waiters", "synced_at")

    def __init__(self, num_tasks: int) -> None:
        self.done = [False] * num_tasks
        self.waiters: dict[int, simpy.Event] = {}
        self.synced_at: dict[int, float] = {}

    def wait(self, env: simpy.Environment, task_id: int) -> simpy.Event:
        """An event that fires when task `task_id` is done."""
        event = self.waiters.get(task_id)
        if event is None:
            event = self.waiters[task_id] = env.event()
        return event


class Engine:
    """Runs one Program on one Topology and records the trace."""

    def __init__(self, program: Program, topology: Topology, options: SimOptions,
                 recorder: TraceRecorder | SpillRecorder | None = None):
        self.program, self.topology, self.options = program, topology, options
        self.env = simpy.Environment()
        self.comm = CommModel(self.env, topology, options.comm)
        self.dtype = program.plan.training.dtype
        self.mesh = program.plan.parallel_dims
        self.classes: RankClasses | None = None
        if options.fault_classes and not options.full:
            self.classes = rank_classes(program, topology)
        # Faults whose classes cannot be formed (mesh and domains do not nest): every rank.
        self.full = options.full or (options.fault_classes and self.classes is None)
        if self.full:
            self.ranks = list(range(self.mesh.world_size))
        elif self.classes is not None:
            self.ranks = list(self.classes.representatives)
        else:
            self.ranks = [self.mesh.representative(s) for s in range(len(program.stages))]
        self._p2p: dict[tuple, simpy.Event] = {}
        self._rendezvous: dict[tuple, list] = {}
        self.groups = RankGroups(self.mesh, self.classes)
        self._simulated = set(self.ranks)
        self.sms = SmShare(self.ranks, topology)   # communication kernels on the SMs
        # per rank, the stream processes running a compute task now (insertion-ordered, so
        # a speed change interrupts them in a deterministic order)
        self._computing: dict[int, dict[simpy.Process, None]] = {r: {} for r in self.ranks}
        self._streams: dict[int, tuple] = {}
        self._duration_cache: dict[tuple, tuple[list[float], list[int]]] = {}
        self._host_cache: dict[tuple, HostTimeline | None] = {}
        # Every rank: the trace is spilled to disk as it is recorded (trace_spill.py).
        self.trace = (recorder if recorder is not None else
                      SpillRecorder(program.stages, self.mesh.world_size) if self.full else
                      TraceRecorder(program.stages))
        self.events = 0

    # ---- driving ------------------------------------------------------------------------
    def run(self) -> None:
        """Simulate the step to completion."""
        with gc_paused():   # the stage's tasks and the trace's rows are all long-lived
            self._run()

    def _run(self) -> None:
        for rank in self.ranks:
            stage = self.mesh.stage_of(rank)
            device = self.topology.device(rank)
            streams = self._stage_streams(
                stage, serial=not device.profile.concurrent_collectives)
            durations, grids = self._durations(stage, device)
            host = self._host(stage, device)
            state = _RankState(len(self.program.stages[stage]))
            for name in sorted(streams):
                self.env.process(self._stream(rank, stage, streams[name], state, durations,
                                              grids, host))
        self.env.run()
        # what only the run reads (per stage: stream lists, prices, host timelines, a
        # few hundred bytes a task) goes before the trace is built
        self._streams.clear()
        self._duration_cache.clear()
        self._host_cache.clear()
        stuck = [k for k, e in self._p2p.items() if not e.triggered]
        if stuck or self._rendezvous:
            raise RuntimeError(f"simulation deadlocked (unmatched point-to-point: {stuck[:3]})")

    def _stage_streams(self, stage: int, serial: bool = False
                       ) -> dict[str, tuple[list, list]]:
        """A stage's tasks by stream with their cross-stream dependencies (streams.py;
        cached per stage and seriality)."""
        key = (stage, serial)
        if key not in self._streams:
            self._streams[key] = stage_streams(self.program.stages[stage], serial)
        return self._streams[key]

    def _durations(self, stage: int, device) -> tuple[list[float], list[int]]:
        """Interference-free duration of every task of a stage on a device, and each
        persistent GEMM's thread blocks (compute.persistent_grid; 0 for others) (cached)."""
        key = (stage, id(device))  # DeviceSpec holds a mapping: not hashable
        if key not in self._duration_cache:
            self._duration_cache[key] = stage_costs(self.program.stages[stage], device,
                                                    self.dtype)
        return self._duration_cache[key]

    def _host(self, stage: int, device) -> HostTimeline | None:
        """The host timeline of a stage on a device's host (cached; None: no host cost)."""
        key = (stage, id(device))
        if key not in self._host_cache:
            tasks = self.program.stages[stage]
            self._host_cache[key] = (HostTimeline(tasks, host_factor(device))
                                     if HostTimeline.needed(tasks) else None)
        return self._host_cache[key]

    def _stream(self, rank: int, stage: int, tasks: tuple[list, list], state: "_RankState",
                durations: list[float], grids: list[int],
                host: HostTimeline | None = None) -> Iterator:
        # The hot loop, once per task of the step: look-ups hoisted, and the wait until
        # the rank's host has issued the task (HostTimeline) inline, same events in the
        # same order as a helper generator would create.
        env, record = self.env, self.trace.record
        done, waiters, synced_at = state.done, state.waiters, state.synced_at
        timeout, compute = env.timeout, self._compute
        interference = self.options.overlap_slowdown
        last_sync, offset = (host.last_sync, host.offset) if host is not None else (None, None)
        for task, cross in zip(*tasks):
            for dep in cross:
                if not done[dep]:
                    yield state.wait(env, dep)
            task_id = task.id
            if last_sync is not None:
                sync = last_sync[task_id]
                if sync >= 0 and not done[sync]:
                    yield state.wait(env, sync)
                issued = (synced_at[sync] if sync >= 0 else 0.0) + offset[task_id]
                if issued > env.now:
                    yield timeout(issued - env.now)
            start = env.now
            if task.kind == COMPUTE:
                duration = durations[task_id]
                if duration:
                    if interference and task.op_class != HOST_COPY:
                        yield from compute(rank, duration, grids[task_id])
                    else:
                        yield timeout(duration)
                record(rank, stage, task_id, start, env.now, "", "")
            else:
                algorithm, began = yield from self._communicate(rank, task)
                record(rank, stage, task_id, max(start, began), env.now,
                       self.groups.trace_name(rank, task), algorithm)
            done[task_id] = True
            if task.host_sync:
                synced_at[task_id] = env.now
            if task_id in waiters:
                waiters.pop(task_id).succeed()
            self.events += 1

    def _compute(self, rank: int, duration: float, grid: int = 0) -> Iterator:
        """Run `duration` seconds of interference-free work at the rank's changing speed.

        Only the part of a kernel that runs beside a collective is slowed: NCCL's blocks
        take SMs as the kernel's thread blocks retire (the GPU schedules blocks of
        concurrent streams as SMs free up), and give them back when the collective ends.
        So the work is integrated piecewise between speed changes (a change interrupts
        the waiting stream, _note_speed_change), not stretched whole by the state at its
        start.
        """
        env, computing = self.env, self._computing[rank]
        process, work_s = env.active_process, duration
        while True:
            speed, began = self.sms.speed(rank, grid), env.now
            computing[process] = None
            try:
                yield env.timeout(work_s / speed)
            except simpy.Interrupt:
                # (rounding may overshoot by an ulp when the change falls on its end)
                work_s = max(0.0, work_s - (env.now - began) * speed)
            else:
                del computing[process]
                return

    def _note_speed_change(self, rank: int, before: tuple) -> None:
        """Interrupt this rank's running compute tasks when the state that sets their
        speeds (SmShare.state, `before` the change) has changed; each is unlisted here
        and lists itself again at its new speed. Two changes in one
        process step (a stream ending one collective and starting the next) interrupt it
        once, and it reads the state after both; changes from two streams at one instant
        may interrupt it twice, the second with nothing done in between."""
        computing = self._computing[rank]
        if computing and self.sms.state(rank) != before:
            interrupted = list(computing)
            computing.clear()
            for process in interrupted:
                process.interrupt()

    # ---- communication ------------------------------------------------------------------
    def _communicate(self, rank: int, task: Task) -> Iterator:
        """Run a communication task; returns (algorithm, time its transfer began)."""
        if task.op == "send_recv":
            return (yield from self._point_to_point(rank, task))
        ranks = self.groups.group(rank, task.group)
        if len(ranks) == 1:
            return "", self.env.now
        profile = self.topology.device(rank).profile
        # a DTensor redistribution's host work before its collective, and the wait for
        # the other members' jittered arrival (both measured on CPU hosts, 0 on GPUs)
        redistributes = task.stream == "tp" and not task.direct_collective
        wait_s = profile.collective_skew_s + (
            profile.redistribute_overhead_s if redistributes else 0.0)
        if wait_s:
            yield self.env.timeout(wait_s)
        began = self.env.now
        if self.full:
            event = self._arrive(task, ranks)
        elif self.classes is not None:
            ranks, event = self._class_collective(rank, task)
        else:
            event = self.comm.collective(task.op, ranks, task.bytes,
                                         self.groups.twins(rank, task.group),
                                         _kernel_min_s(task))
        algorithm = yield from self._track(rank, task.op, ranks, task.bytes, event,
                                           task.sm_count)
        return algorithm, began

    def _track(self, rank: int, op: str, ranks: tuple[int, ...], size: float,
               event: simpy.Event, sm_count: int = 0) -> Iterator:
        """Wait for a collective while counting it as occupying this rank's SMs.

        An NCCL kernel occupies its SMs from launch, also while it waits for the
        other members, so the count starts at arrival. A kernel with its own SM count
        (Task.sm_count) holds that many instead of one SM per NCCL channel.
        """
        plan = self.comm.plan(op, ranks, size)
        kind = STATED if sm_count else NCCL if plan.uses_sms else NVLS
        held = [(sm_count or plan.channels, kind)] if sm_count != COPY_ENGINE else []
        for sms, kind in held:      # a copy-engine transfer holds no SM
            self._hold(rank, sms, kind, True)
        yield event
        for sms, kind in held:
            self._hold(rank, sms, kind, False)
        return plan.algorithm

    def _hold(self, rank: int, sms: int, kind: str, start: bool) -> None:
        """Count a communication kernel (sm_share: NCCL, NVLS or STATED) holding `sms` SMs
        in (start) or out of this rank's SMs."""
        before = self.sms.state(rank)
        self.sms.hold(rank, sms, kind, start)
        self._note_speed_change(rank, before)

    def _arrive(self, task: Task, ranks: tuple[int, ...]) -> simpy.Event:
        key = (task.id, ranks)
        entry = self._rendezvous.setdefault(key, [self.env.event(), 0])
        entry[1] += 1
        if entry[1] == len(ranks):
            # Complete: the members hold the event; only open rendezvous stay listed.
            del self._rendezvous[key]
            start = self.comm.collective(task.op, ranks, task.bytes,
                                         kernel_min_s=_kernel_min_s(task))
            start.callbacks.append(lambda ev, out=entry[0]: out.succeed(ev.value))
        return entry[0]

    def _class_collective(self, rank: int, task: Task) -> tuple[tuple[int, ...], simpy.Event]:
        """A collective in fault-aware class mode: (the group that runs, its event).

        The group's members fall into classes; each class's representative stands for
        its members, so the collective starts when the representatives of every class
        in the group have arrived (one class: at once). It runs on the group of the
        lowest of those representatives (the same for all of them: one orbit), with the
        other groups of its orbit in the stage as twins.
        """
        reps = self.groups.representatives(rank, task.group)
        lead = reps[0]
        ranks = self.groups.group(lead, task.group)
        if len(reps) == 1:
            return ranks, self.comm.collective(task.op, ranks, task.bytes,
                                               self.groups.twins(lead, task.group),
                                               _kernel_min_s(task))
        key = (task.id, lead)
        entry = self._rendezvous.setdefault(key, [self.env.event(), 0])
        entry[1] += 1
        if entry[1] == len(reps):
            del self._rendezvous[key]
            start = self.comm.collective(task.op, ranks, task.bytes,
                                         self.groups.twins(lead, task.group),
                                         _kernel_min_s(task))
            start.callbacks.append(lambda ev, out=entry[0]: out.succeed(ev.value))
        return ranks, entry[0]

    def _receiver(self, rank: int, dim: str, step: int, peer: int) -> int | None:
        """The simulated rank whose receive `rank`'s send to `peer` completes, or None.

        Rank classes: a peer that is not simulated is a twin of its class's
        representative, whose own sender is a twin of `rank` when it is in `rank`'s
        class; a send from another class's representative completes it otherwise. The
        stage classes: the peer itself, or `rank` when a twin does the same send.
        """
        if self.classes is None:
            return peer if peer in self._simulated else rank
        receiver = self.classes.representative(peer)
        sender = self.mesh.peer(receiver, dim, -step)
        return receiver if self.classes.class_of[sender] == self.classes.class_of[rank] else None

    def _point_to_point(self, rank: int, task: Task) -> Iterator:
        """A send (transfer, then wake the receiver) or a receive (wait for the sender).

        The peer is `task.peer` steps along the task's mesh dimension, wrapping around
        (ParallelDims.peer: a ring for context parallelism; pipeline programs never step
        past the ends, except interleaved chunks from the last stage to the first). In
        rank-class mode a peer that is not simulated is a twin of a simulated rank doing
        the same send at the same moment, so a receive from it completes with this rank's
        own matching send.
        """
        if task.stream.endswith("recv"):
            # Waiting for the sender is idle time, not communication: the row starts
            # when the transfer began (the event's value).
            began = yield self._p2p_event(task.tag, rank)
            return "p2p", began
        dim = task.group[0]
        peer = self.mesh.peer(rank, dim, task.peer)
        began = self.env.now
        twins = () if self.full else self.groups.twins(rank, (dim,), peer=task.peer)
        event = self.comm.collective("send_recv", (rank, peer), task.bytes, twins)
        algorithm = yield from self._track(rank, "send_recv", (rank, peer), task.bytes, event,
                                           task.sm_count)
        receiver = peer if self.full else self._receiver(rank, dim, task.peer, peer)
        if receiver is not None:
            self._p2p_event(task.tag, receiver).succeed(began)
        return algorithm, began

    def _p2p_event(self, tag: tuple, receiver: int) -> simpy.Event:
        key = (tag, receiver)
        if key not in self._p2p:
            self._p2p[key] = self.env.event()
        return self._p2p[key]
