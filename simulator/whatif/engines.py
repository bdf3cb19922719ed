"""Running the points of a study: local worker processes or Ray tasks, with a checkpoint.

Every finished point is appended to a JSON-lines checkpoint next to the output
(`study.parquet.partial.jsonl`) and fsync'd, so an interrupted study loses at most the
points in flight; `resume=True` reads it back and skips those points. The first line
holds the study's fingerprint: a checkpoint of another study is refused, not mixed in.
Rows come back in point order whatever order the workers finish in.
"""
from __future__ import annotations

import json
import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from .points import PointSpec, evaluate, evaluate_many, fingerprint

ENGINES = ("local", "ray")


def checkpoint_path(output: str | Path) -> Path:
    """Where the finished points of a study writing `output` are kept."""
    return Path(f"{output}.partial.jsonl")


class Checkpoint:
    """Append-only JSON lines, one finished point per line, fsync'd after each."""

    def __init__(self, path: Path, study: str, resume: bool) -> None:
        self.path, self.study = path, study
        self.rows: dict[int, dict[str, Any]] = {}
        if resume and path.exists():
            self.rows = self._read()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w" if not self.rows else "a")
        if not self.rows:
            self._write({"study": study})

    def _read(self) -> dict[int, dict[str, Any]]:
        rows: dict[int, dict[str, Any]] = {}
        with open(self.path) as f:
            lines = f.read().split("\n")
        try:
            header = json.loads(lines[0])
        except (json.JSONDecodeError, IndexError):
            header = {}
        if header.get("study") != self.study:
            raise UsageError("--resume", str(self.path),
                             "a checkpoint of the same study (plan, topologies, --vary, "
                             "--fault and options must match), or run without --resume")
        good = [lines[0]]
        for line in lines[1:]:
            try:   # a line cut short by the interruption is dropped
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[row["point"]] = row
            good.append(line)
        # Rewrite without torn lines so later appends start on a clean line.
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write("\n".join(good) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return rows

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def add(self, row: dict[str, Any]) -> None:
        """Record a finished point."""
        self.rows[row["point"]] = row
        self._write(row)

    def close(self, remove: bool) -> None:
        """Close; remove the file once the final output is written."""
        self._file.close()
        if remove and self.path.exists():
            self.path.unlink()


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


def _local(points: list[PointSpec], workers: int, done: Callable[[dict], None]) -> None:
    if workers <= 1 or len(points) <= 1:
        for p in points:
            done(evaluate(p))
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(points))) as pool:
        futures = [pool.submit(evaluate, p) for p in points]
        for future in as_completed(futures):
            done(future.result())


def _ray(points: list[PointSpec], workers: int, address: str | None,
         done: Callable[[dict], None]) -> None:
    try:
        import ray
    except ImportError:
        raise UsageError("--engine", "ray", "local, or install Ray first "
                         "(pip install 'shardsim[ray]')") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Batches amortise the per-task overhead: about 4 batches per CPU.
    size = max(1, math.ceil(len(points) / (4 * max(cpus, workers or 1))))
    remote = ray.remote(num_cpus=1)(evaluate_many)
    pending = [remote.remote(points[i:i + size]) for i in range(0, len(points), size)]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for row in ray.get(ready[0]):
            done(row)


def run_points(points: list[PointSpec], engine: str = "local", workers: int | None = None,
               address: str | None = None, output: str | Path | None = None,
               resume: bool = False, progress: bool = True,
               stop_after: int | None = None) -> list[dict[str, Any]]:
    """Simulate every point; rows in point order.

    With `output`, finished points go to its checkpoint as they come; `resume` skips the
    ones already there. `stop_after` (tests) simulates an interruption: only that many
    new points are run and the checkpoint is kept.
    """
    if engine not in ENGINES:
        raise UsageError("--engine", engine, ", ".join(ENGINES))
    if resume and output is None:
        raise UsageError("--resume", True, "only with -o FILE.parquet (the checkpoint's place)")
    ckpt = Checkpoint(checkpoint_path(output), fingerprint(points), resume) if output else None
    finished = dict(ckpt.rows) if ckpt else {}
    todo = [p for p in points if p["point"] not in finished]
    if stop_after is not None:
        todo = todo[:stop_after]
    bar = _progress(len(points), len(finished), progress)

    def done(row: dict[str, Any]) -> None:
        finished[row["point"]] = row
        if ckpt:
            ckpt.add(row)
        bar.update(1)

    try:
        if engine == "ray":
            _ray(todo, workers or 0, address, done)
        else:
            _local(todo, workers or os.cpu_count() or 1, done)
    finally:
        bar.close()
        if ckpt:
            ckpt.close(remove=False)
    return [finished[p["point"]] for p in points if p["point"] in finished]


def drop_checkpoint(output: str | Path) -> None:
    """Remove a study's checkpoint (after its final output is written)."""
    path = checkpoint_path(output)
    if path.exists():
        path.unlink()

