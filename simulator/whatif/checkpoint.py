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
again, so the resumed table is exactly the uninterrupted one. A point line is damaged
too when a result column is not what the table needs (simulator.whatif.rows: `fast`
where a time is expected, a list, an integer past 2**63), or when it is longer than
MAX_LINE_BYTES.

The checkpoint must be a regular file (a FIFO would block its open forever, a device
would be read without end) and at most checkpoint_bound(points) bytes long; otherwise
the study is refused (exit 2) before anything is written.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from inputs import require_regular_file

from ..errors import UsageError
from .points import PointSpec
from .rows import row_problem

# A row is about 1.5 KB (some 40 columns); an invalid point's reason is bounded to a few
# KB by inputs.errors. 64 KiB leaves room for many varied parameters and long internal
# error messages; a longer line is no row this program wrote.
MAX_LINE_BYTES = 64 << 10
# The whole file: the header, each point once and as many damaged lines (a kill cuts at
# most one line short, and each resume rewrites the file without them), at most 1 GiB
# (100,000 points, the most a study has, of 10 KiB each).
MAX_CHECKPOINT_BYTES = 1 << 30


def checkpoint_path(output: str | Path) -> Path:
    """Where the finished points of a study writing `output` are kept."""
    return Path(f"{output}.partial.jsonl")


def checkpoint_bound(points: int) -> int:
    """The most bytes the checkpoint of a study of `points` points may hold."""
    return min(MAX_CHECKPOINT_BYTES, (2 * points + 1) * MAX_LINE_BYTES)


def check_regular(path: Path, flag: str) -> None:
    """Refuse (UsageError) a checkpoint path that exists but is not a regular file: a FIFO
    blocks its open until another process opens the other end, a device never ends."""
    if os.path.exists(path):   # follows a link: its target is what is opened
        require_regular_file(path, flag, UsageError)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a finite number")


def _parse(line: str, points: dict[int, PointSpec]) -> tuple[Any, str | None]:
    """A checkpoint line's row, and why it cannot be a finished point (None: it can)."""
    if len(line.encode()) > MAX_LINE_BYTES:
        return None, f"a line of at most {MAX_LINE_BYTES:,} bytes"
    try:
        row = json.loads(line, parse_constant=_reject_constant)
        return row, row_problem(row, points)
    except (ValueError, RecursionError) as exc:   # JSONDecodeError is a ValueError
        return None, f"valid JSON with finite numbers ({exc})"


class Checkpoint:
    """Append-only JSON lines, one finished point per line, fsync'd after each."""

    def __init__(self, path: Path, study: str, points: list[PointSpec], resume: bool) -> None:
        self.path, self.study = path, study
        self.rows: dict[int, dict[str, Any]] = {}
        self.resumed = False
        check_regular(path, "--resume" if resume else "--output")
        if resume and path.exists():
            self.rows = self._read({p["point"]: p for p in points})
            self.resumed = True
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a" if self.resumed else "w")
        if not self.resumed:
            self._write({"study": study})

    def _text(self, limit: int) -> str:
        """The file's text, refused (exit 2) past `limit` bytes or when not a regular file
        (O_NONBLOCK: a FIFO swapped in after check_regular cannot block the open)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UsageError("--resume", str(self.path), "a regular file as the "
                                     "checkpoint (it was replaced while being opened)")
                data = f.read(limit + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError("--resume", str(self.path), f"a readable checkpoint ({exc})") \
                from None
        if len(data) > limit:
            raise UsageError("--resume", str(self.path), f"a checkpoint of at most {limit:,} "
                             f"bytes for this study, or run without --resume")
        return text

    def _read(self, points: dict[int, PointSpec]) -> dict[int, dict[str, Any]]:
        lines = self._text(checkpoint_bound(len(points))).split("\n")
        try:
            header = json.loads(lines[0])
        except (ValueError, RecursionError):   # an integer past the digit limit: ValueError
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
            row, problem = _parse(line, points)
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
        # A fresh name (mkstemp), not a fixed one that a FIFO could already hold; the
        # checkpoint's own permissions are kept.
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                   dir=self.path.parent)
        try:
            os.fchmod(fd, stat.S_IMODE(os.stat(self.path).st_mode))
            with open(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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

