"""Stopping a sweep on SIGINT or SIGTERM without losing a finished point.

While a study runs, `StopSignals` replaces the handlers of SIGINT (Ctrl-C) and SIGTERM
(`kill`, a batch scheduler's time limit) by one that raises `SweepInterrupted`, a
KeyboardInterrupt that remembers the signal. Recording a finished point (a checkpoint
line) is a critical section (`held`): a signal arriving there is kept and raised once
the line is written, so the checkpoint never misses a point the study already has.
`python -m simulator whatif` exits 128 + the signal's number: 130 after SIGINT, 143
after SIGTERM (the shell's convention).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SweepInterrupted(KeyboardInterrupt):
    """A study stopped by a signal; its finished points are in the checkpoint."""

    def __init__(self, signum: int, checkpoint: str | None = None, kept: int = 0,
                 total: int = 0) -> None:
        super().__init__(signum)
        self.signum, self.checkpoint, self.kept, self.total = signum, checkpoint, kept, total

    @property
    def exit_status(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum)

    def message(self) -> str:
        """One line for stderr: what stopped the study and where its points are."""
        name = signal.Signals(self.signum).name
        if self.checkpoint is None:
            return f"interrupted by {name}: {self.kept} of {self.total} points finished " \
                   "(nothing kept: run with -o FILE.parquet to keep them)"
        return (f"interrupted by {name}: {self.kept} of {self.total} points kept in "
                f"{self.checkpoint}; rerun the same command with --resume to finish")


def block_stop_signals() -> None:
    """Hold SIGINT and SIGTERM pending in this thread (and in processes it starts)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def unblock_stop_signals() -> None:
    """Deliver SIGINT and SIGTERM again (pending ones now)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class StopSignals:
    """While active (a context manager), SIGINT and SIGTERM raise SweepInterrupted.

    Only the main thread can own signal handlers: from another thread this does nothing
    and the caller's own handling applies.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._hold = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def reclaim(self) -> None:
        """Take the signals back from a library that set its own handler meanwhile
        (ray.init makes SIGTERM call sys.exit, which would lose the checkpoint)."""
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if not self._hold:
            raise SweepInterrupted(self.signum)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A critical section: a signal inside it is raised when it ends."""
        self._hold += 1
        try:
            yield
        finally:
            self._hold -= 1
        if not self._hold and self.signum is not None:
            raise SweepInterrupted(self.signum)

    def hold_forever(self) -> None:
        """From now on signals are only recorded (the study is already stopping)."""
        self._hold += 1
