"""Running the points of a study: local worker processes or Ray tasks, with a checkpoint.

Every finished point is appended to a JSON-lines checkpoint next to the output
(simulator.whatif.checkpoint), so an interrupted study loses at most the points in
flight; `resume=True` reads it back and skips those points. Rows come back in point
order whatever order the workers finish in.

Interruptions (simulator.whatif.signals, simulator.whatif.pool): SIGINT or SIGTERM stops
the study within a fraction of a second, records every point already finished and
raises SweepInterrupted (a KeyboardInterrupt); the checkpoint then stays, to be resumed.
With the Ray engine the same holds for the driver (exit 130 or 143; a local Ray instance
takes a few seconds to shut down): rows of batches that have returned are kept, pending
tasks are cancelled; a batch cut short by the stop runs again on resume. Ray's own
processes belong to Ray: a local instance started here ends with the driver, a remote
cluster cleans up the tasks of a driver that died. An address whose port does not answer
fails within RAY_CONNECT_TIMEOUT_S (exit 2) instead of ray.init's minutes of retries.
"""
from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from typing import Any, Callable

from inputs import decimal

from ..errors import UsageError
from .checkpoint import Checkpoint, checkpoint_path
from .points import PointSpec, evaluate, evaluate_many, fingerprint
from .pool import LocalPool
from .signals import StopSignals, SweepInterrupted

ENGINES = ("local", "ray")
# How long `--engine ray --address HOST:PORT` waits for the head node's port to accept a
# TCP connection before giving up (exit 2). Without the check ray.init retries an
# unreachable address for minutes; a reachable head answers in milliseconds on a LAN.
RAY_CONNECT_TIMEOUT_S = 5.0
# The most `--workers` asked for: far more local processes than any machine's cores, or
# Ray batches than a cluster's CPUs, would only cost memory (each worker imports the
# simulator). Local workers are further capped at os.cpu_count().
MAX_WORKERS = 1024


def check_workers(workers: int | None) -> None:
    """Refuse (UsageError, exit 2) a worker count outside 1..MAX_WORKERS (None: default)."""
    if workers is not None and (type(workers) is not int or not 1 <= workers <= MAX_WORKERS):
        raise UsageError("--workers", workers, f"an integer from 1 to {MAX_WORKERS} (local "
                                               f"workers are capped at the core count)")


def local_workers(workers: int | None, points: int) -> int:
    """How many local processes run `points` points: the request (default: every core),
    never more than the cores or the points."""
    cores = os.cpu_count() or 1
    return min(workers or cores, cores, points)


def _progress(total: int, initial: int, enabled: bool):
    """A tqdm bar on stderr if tqdm is importable (and stderr a terminal), else a no-op."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        class _Null:
            def update(self, n: int = 1) -> None:
                pass

            def close(self) -> None:
                pass
        return _Null()
    return tqdm(total=total, initial=initial, unit="point", desc="whatif", disable=None)


def _serial(points: list[PointSpec], record: Callable[[dict], None],
            stop: StopSignals) -> None:
    for p in points:
        row = evaluate(p)
        with stop.held():
            record(row)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--engine", "ray", "local, or install Ray first "
                         "(pip install 'shardsim[ray]')") from None
    return ray


def check_ray_address(address: str | None) -> None:
    """Refuse (UsageError, exit 2) a Ray address whose port does not accept a TCP
    connection within RAY_CONNECT_TIMEOUT_S; None, `auto` and `local` are Ray's to find."""
    if address is None or address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    number = decimal(port, 5)
    if not sep or not host or number is None or not 0 < number < 65536:
        raise UsageError("--address", address, "HOST:PORT or ray://HOST:PORT of a Ray head "
                         "node, or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise UsageError("--address", address, f"a reachable Ray head node (no connection "
                         f"within {RAY_CONNECT_TIMEOUT_S:g} s: {reason})") from None


def _ray(points: list[PointSpec], workers: int, address: str | None,
         record: Callable[[dict], None], stop: StopSignals) -> None:
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        stop.reclaim()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Batches amortise the per-task overhead: about 4 batches per CPU.
    size = max(1, math.ceil(len(points) / (4 * max(cpus, workers or 1))))
    remote = ray.remote(num_cpus=1)(evaluate_many)
    pending = [remote.remote(points[i:i + size]) for i in range(0, len(points), size)]
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rows = ray.get(ready[0])
            with stop.held():
                for row in rows:
                    record(row)
    except BaseException:
        stop.hold_forever()
        for ref in pending:   # an interrupted driver leaves no work behind
            try:
                ray.cancel(ref, force=True)
            except Exception:   # already finished or gone: nothing to cancel
                pass
        raise


def run_points(points: list[PointSpec], engine: str = "local", workers: int | None = None,
               address: str | None = None, output: str | Path | None = None,
               resume: bool = False, progress: bool = True,
               stop_after: int | None = None) -> list[dict[str, Any]]:
    """Simulate every point; rows in point order.

    With `output`, finished points go to its checkpoint as they come; `resume` skips the
    ones already there. SIGINT or SIGTERM raise SweepInterrupted, the checkpoint kept; any
    other failure removes the checkpoint unless it was resumed (it holds earlier work).
    `stop_after` (tests) simulates an interruption: only that many new points are run
    and the checkpoint is kept.
    """
    if engine not in ENGINES:
        raise UsageError("--engine", engine, ", ".join(ENGINES))
    check_workers(workers)
    if resume and output is None:
        raise UsageError("--resume", True, "only with -o FILE.parquet (the checkpoint's place)")
    if engine == "ray" and not _import_ray().is_initialized():
        check_ray_address(address)   # before anything is written
    ckpt = Checkpoint(checkpoint_path(output), fingerprint(points), points, resume) \
        if output else None
    finished = dict(ckpt.rows) if ckpt else {}
    todo = [p for p in points if p["point"] not in finished]
    if stop_after is not None:
        todo = todo[:stop_after]
    bar = _progress(len(points), len(finished), progress)

    def record(row: dict[str, Any]) -> None:
        finished[row["point"]] = row
        if ckpt:
            ckpt.add(row)
        bar.update(1)

    failed = True
    try:
        with StopSignals() as stop:
            n = local_workers(workers, len(todo))
            if engine == "ray":
                _ray(todo, workers or 0, address, record, stop)
            elif n <= 1:
                _serial(todo, record, stop)
            else:
                LocalPool(n, stop, record).run(todo)
        failed = False
    except KeyboardInterrupt as exc:
        failed = False   # interrupted, not failed: the checkpoint is the way to resume
        if isinstance(exc, SweepInterrupted):
            exc.checkpoint = str(ckpt.path) if ckpt else None
            exc.kept, exc.total = len(finished), len(points)
        raise
    finally:
        bar.close()
        if ckpt:
            ckpt.close(remove=failed and not ckpt.resumed)
    return [finished[p["point"]] for p in points if p["point"] in finished]


def drop_checkpoint(output: str | Path) -> None:
    """Remove a study's checkpoint (after its final output is written)."""
    path = checkpoint_path(output)
    if path.exists():
        path.unlink()
