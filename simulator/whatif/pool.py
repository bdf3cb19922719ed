"""The local engine: worker processes that stop at once and never outlive the study.

Each worker is a `spawn`ed process (not forked: a fork copies whatever threads and locks
the caller holds, and spawn behaves the same on every system) with a pipe to the main
process, which sends it one point at a time and records each row as it comes back
(simulator.whatif.engines passes the recorder, which appends to the checkpoint). A pool
of our own instead of concurrent.futures, because of what an interruption must do:

* Stop promptly. On SIGINT or SIGTERM the main process stops handing out points and
  sends SIGTERM to every worker; a point being simulated is abandoned (it runs again on
  `--resume`). Ctrl-C reaches the whole process group, but workers ignore SIGINT: the
  main process alone decides, so a worker is never killed half-way through a reply.
* Keep every finished point. A worker blocks SIGTERM while it sends a row, so a row it
  has started to send arrives whole; the main process reads every pipe to its end before
  it returns, and records what it finds, even when the signal came first.
* Survive a worker's death. A point that kills its worker (out of memory) becomes an
  `error` row, like a point whose simulation raised, and a new worker takes its place.
* Never outlive the main process. Workers ask Linux to SIGKILL them when their parent
  dies (prctl PR_SET_PDEATHSIG), and on every system a watchdog thread in each worker
  exits when the parent process id changes (the parent is gone; checked every
  PARENT_POLL_S), so `kill -9` of the main process takes its workers with it.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator

from .points import PointSpec, error_row, evaluate
from .signals import (STOP_SIGNALS, StopSignals, SweepInterrupted, block_stop_signals,
                      unblock_stop_signals)

PARENT_POLL_S = 0.25     # how often a worker checks that its parent is alive
DRAIN_TIMEOUT_S = 5.0    # after SIGTERM: how long rows in flight may take to arrive
PR_SET_PDEATHSIG = 1     # from <linux/prctl.h>


# ----------------------------------------------------------------------- in the worker
def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent dies (Linux), and poll the parent everywhere."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass   # the watchdog below still applies
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def worker_main(conn: Connection, parent_pid: int) -> None:
    """A worker: points in, rows out, until the pipe closes or a None arrives.

    Started with SIGINT and SIGTERM blocked (inherited from the main process, see
    LocalPool.start): SIGINT is ignored from the start, SIGTERM keeps its default action
    (end the process) except while a row is being sent.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    unblock_stop_signals()
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            return
        if spec is None:
            return
        row = evaluate(spec)
        block_stop_signals()   # a row is sent whole or not at all
        try:
            conn.send(row)
        finally:
            unblock_stop_signals()


# --------------------------------------------------------------- in the main process
class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_main, args=(child, os.getpid()),
                                   name="whatif-worker", daemon=True)
        self.process.start()
        child.close()
        self.spec: PointSpec | None = None   # the point it is simulating

    @property
    def point(self) -> int | None:
        """The index of the point it is simulating (None: idle)."""
        return None if self.spec is None else self.spec["point"]

    def give(self, spec: PointSpec | None) -> None:
        self.spec = spec
        self.conn.send(spec)

    def death_row(self) -> dict[str, Any]:
        """Its pipe closed with a point outstanding: the point's `error` row, or
        SweepInterrupted when a stop signal sent to the group ended it."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is not None and -code in STOP_SIGNALS + (signal.SIGHUP,):
            # stopped from outside with the group (kill -TERM -PGID): an interruption
            raise SweepInterrupted(-code)
        reason = f"signal {signal.Signals(-code).name}" if code and code < 0 else \
            f"exit status {code}"
        return error_row(self.spec, f"WorkerDied: its worker process ended ({reason}; "
                                    "out of memory?)")


class LocalPool:
    """`workers` processes simulating `points`; `record(row)` is called for each row."""

    def __init__(self, workers: int, stop: StopSignals,
                 record: Callable[[dict[str, Any]], None]) -> None:
        self.size, self.stop, self.record = workers, stop, record
        self.workers: list[_Worker] = []

    def start(self) -> None:
        """Start the workers."""
        self.workers.extend(self._spawn(self.size))

    @staticmethod
    def _spawn(count: int) -> list[_Worker]:
        """Workers started with SIGINT and SIGTERM blocked, so that no signal reaches one
        before it has set its handlers (pending signals come after)."""
        ctx = multiprocessing.get_context("spawn")
        started: list[_Worker] = []
        block_stop_signals()
        try:
            for _ in range(count):
                started.append(_Worker(ctx))
        finally:
            unblock_stop_signals()
        return started

    def run(self, points: list[PointSpec]) -> None:
        """Simulate every point; on any exception stop the workers, keeping their rows."""
        todo: Iterator[PointSpec] = iter(points)
        try:
            self.start()
            for worker in list(self.workers):
                self._give(worker, next(todo, None))
            busy = {w.conn: w for w in self.workers if w.point is not None}
            while busy:
                for conn in wait(list(busy)):
                    with self.stop.held():
                        worker = busy.pop(conn)
                        try:
                            row = conn.recv()
                        except (EOFError, OSError):   # a point the worker could not survive
                            row, worker = worker.death_row(), self._replace(worker)
                        self.record(row)
                        worker = self._give(worker, next(todo, None))
                        if worker.point is not None:
                            busy[worker.conn] = worker
        except BaseException:
            self.stop.hold_forever()
            self._stop_now()
            raise
        finally:
            self._reap()

    def _give(self, worker: _Worker, spec: PointSpec | None) -> _Worker:
        """Hand a point (None: stop) to a worker, or to a new one if it has died."""
        try:
            worker.give(spec)
        except OSError:   # its pipe is closed: it died between two points
            if spec is None:
                worker.spec = None
                return worker
            worker = self._replace(worker)
            worker.give(spec)
        return worker

    def _replace(self, dead: _Worker) -> _Worker:
        """A new worker in the place of one that died (the study goes on)."""
        if dead.process.is_alive():   # closed its pipe yet still there: make sure
            dead.process.kill()
        dead.process.join()
        dead.conn.close()
        fresh = self._spawn(1)[0]
        self.workers[self.workers.index(dead)] = fresh
        return fresh

    def _stop_now(self) -> None:
        """SIGTERM every worker, then record the rows already on their way."""
        for worker in self.workers:
            if worker.process.is_alive():
                try:
                    os.kill(worker.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for worker in self.workers:
            while True:
                left = deadline - time.monotonic()
                try:
                    if left <= 0 or not worker.conn.poll(left):
                        break
                    row = worker.conn.recv()
                except (EOFError, OSError):
                    break
                self.record(row)

    def _reap(self) -> None:
        for worker in self.workers:
            worker.process.join(DRAIN_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
