"""A study's checkpoint: its finished points as JSON lines next to the output.

`study.parquet.partial.jsonl` holds one header line (the study's fingerprint) and one
line per finished point, each flushed and fsync'd as it is written, so a study stopped
in any way (a signal, a crash, a power cut) keeps every point it had recorded;
`--resume` reads them back and runs only the others. The file exists while a study runs
and after an interrupted one (it is then the resume checkpoint); a finished study
removes it once its Parquet is written, and a failed one removes it unless it held
points from an earlier run.

Reading it back: a header that is not this study's fingerprint is refused (exit 2: the
checkpoint of another study is never mixed in). A damaged point line (cut short by a
kill, `[]`, a row without `point`, a point of another shape, a number that is not
finite) is reported on stderr with its line number and skipped: that point simply runs
again, so the resumed table is exactly the uninterrupted one.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .points import PointSpec

STATUSES = ("ok", "invalid", "error")


def checkpoint_path(output: str | Path) -> Path:
    """Where the finished points of a study writing `output` are kept."""
    return Path(f"{output}.partial.jsonl")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a finite number")


def row_problem(row: Any, points: dict[int, PointSpec]) -> str | None:
    """Why a checkpoint line cannot be a finished point of this study (None: it can)."""
    if not isinstance(row, dict):
        return f"a JSON object (got {type(row).__name__})"
    point = row.get("point")
    if type(point) is not int or point not in points:
        return f"'point' an integer from 0 to {len(points) - 1} (got {point!r})"
    if row.get("status") not in STATUSES:
        return f"'status' one of {', '.join(STATUSES)} (got {row.get('status')!r})"
    spec = points[point]
    expected = {"topo": spec["topo"]["ref"], **spec["params"]}
    for key, value in expected.items():
        if row.get(key) != value:
            return f"{key!r} {value!r} for point {point} (got {row.get(key)!r})"
    return None


class Checkpoint:
    """Append-only JSON lines, one finished point per line, fsync'd after each."""

    def __init__(self, path: Path, study: str, points: list[PointSpec], resume: bool) -> None:
        self.path, self.study = path, study
        self.rows: dict[int, dict[str, Any]] = {}
        self.resumed = False
        if resume and path.exists():
            self.rows = self._read({p["point"]: p for p in points})
            self.resumed = True
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a" if self.resumed else "w")
        if not self.resumed:
            self._write({"study": study})

    def _read(self, points: dict[int, PointSpec]) -> dict[int, dict[str, Any]]:
        try:
            lines = self.path.read_text().split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError("--resume", str(self.path), f"a readable checkpoint ({exc})") \
                from None
        try:
            header = json.loads(lines[0])
        except (json.JSONDecodeError, RecursionError):
            header = None
        if not isinstance(header, dict) or header.get("study") != self.study:
            raise UsageError("--resume", str(self.path),
                             "a checkpoint of the same study (plan, topologies, --vary, "
                             "--fault and options must match), or run without --resume")
        rows: dict[int, dict[str, Any]] = {}
        good = [lines[0]]
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_constant=_reject_constant)
                problem = row_problem(row, points)
            except (ValueError, RecursionError) as exc:   # JSONDecodeError is a ValueError
                problem = f"valid JSON with finite numbers ({exc})"
            if problem is None and row["point"] in rows:
                problem = f"each point once (point {row['point']} is repeated)"
            if problem is not None:
                print(f"warning: {self.path}:{number}: skipped a damaged line (expected "
                      f"{problem}); its point runs again", file=sys.stderr)
                continue
            rows[row["point"]] = row
            good.append(line)
        self._rewrite(good)
        return rows

    def _rewrite(self, lines: list[str]) -> None:
        """Keep only the good lines, so later appends start on a clean line."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, sort_keys=True, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def add(self, row: dict[str, Any]) -> None:
        """Record a finished point."""
        self.rows[row["point"]] = row
        self._write(row)

    def close(self, remove: bool) -> None:
        """Close; with `remove`, delete the file (the study is done or failed)."""
        self._file.close()
        if remove and self.path.exists():
            self.path.unlink()

