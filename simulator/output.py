"""Outputs: files written atomically (temporary file in the same folder, then rename), so
that a reader never sees a half-written trace, table, plan or plot; and JSON on stdout.

The rules (README, "Outputs"): an output path is checked before the work starts
(output_kind: a folder, a missing folder, a block device, no permission: exit 2); only
regular files are replaced by rename (a symbolic link's target is replaced; a character
device or pipe is written in place); a failed write leaves no file behind; an OS error
while writing (a full disk) is one line and exit status 4. A command that writes several
files writes them inside `staged_outputs()`: all of them land, or none, and a file the
failed command would have replaced is left as it was.

Library code (studies, what-if) and the commands both write through here, so neither
needs the other."""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import OutputError, WriteError


def print_json(obj: Any) -> None:
    """Stable, valid JSON on stdout (sorted keys, two-space indent).

    A non-finite number is printed as null and named on stderr (simulator.jsonsafe
    says why); the text is built whole before it is written, so an error never leaves
    half a document on stdout."""
    from .jsonsafe import dumps_finite, warn_replaced
    text, replaced = dumps_finite(obj, indent=2, sort_keys=True)
    warn_replaced(replaced, sys.stderr)
    sys.stdout.write(text + "\n")


# The writes staged by the innermost staged_outputs() block: (order, move into place,
# discard). Copies into a device or pipe go first: they are the moves that can fail (a
# full /dev/full), where a rename within one folder does not.
_Staged = tuple[int, Callable[[], None], Callable[[], None]]
_STAGED: ContextVar[list[_Staged] | None] = ContextVar("staged_outputs", default=None)
COPY_FIRST, RENAME = 0, 1


@contextmanager
def staged_outputs() -> Iterator[None]:
    """Every atomic_write inside the block writes its temporary file at once but moves it
    into place only when the block ends without an error, so a command writing several
    files (a Parquet and a Perfetto trace) leaves all of them or none: a failure in the
    second no longer leaves the first, nor replaces a file a previous run wrote there."""
    staged: list[_Staged] = []
    token = _STAGED.set(staged)
    try:
        yield
    except BaseException:
        for _, _, discard in staged:
            discard()
        raise
    finally:
        _STAGED.reset(token)
    staged.sort(key=lambda entry: entry[0])    # stable: each kind in the order written
    for done, (_, move, _) in enumerate(staged):
        try:
            move()
        except BaseException:
            for _, _, discard in staged[done:]:
                discard()
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# What an output path may name: nothing yet (a new file), a regular file (replaced
# atomically), or a character device or pipe (/dev/null, /dev/stdout, a FIFO: written
# in place, since renaming a file over a device node would replace the device itself).
NEW, REGULAR, STREAM = "new", "regular", "stream"


def output_kind(path: str | Path, flag: str = "output", create_parents: bool = False) -> str:
    """How `path` will be written (NEW, REGULAR or STREAM), or OutputError when it cannot
    be: a folder, a block device or socket, a missing parent folder (unless
    `create_parents`), no write permission, an empty path. A symbolic link is followed:
    its target is what gets written, the link stays. Cheap: checked before any work
    starts."""
    if not str(path):   # realpath('') is the working folder: it would pass as a new file
        raise OutputError(path, "the path is empty", flag)
    if str(path).endswith(os.sep):   # realpath drops the slash: 'new/' would become a file
        raise OutputError(path, "it names a folder: it ends in /", flag)
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(path).st_mode   # follows links, /dev/stdout's to a pipe included
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(path, exc.strerror or type(exc).__name__, flag) from None
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise OutputError(path, "it is a folder", flag)
        # /dev/stdout of a shell redirect is a regular file, held open by the shell:
        # written in place, like every existing path under /dev and /proc.
        special = str(path).startswith(("/dev/", "/proc/"))
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or (special and stat.S_ISREG(mode)):
            if not os.access(path, os.W_OK):
                raise OutputError(path, "no permission to write it", flag)
            return STREAM
        if not stat.S_ISREG(mode):
            raise OutputError(path, "it is a block device or socket, not a file", flag)
    folder = target.parent
    while create_parents and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(path, f"its folder {folder} does not exist", flag)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(path, f"no permission to write in {folder}", flag)
    return NEW if mode is None else REGULAR


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`.

    Only a regular file (or a new one) is replaced so: a symbolic link's target is
    replaced, the link kept; a character device or pipe (/dev/null) is written directly,
    never renamed over. Missing parent folders are created; the file gets the usual
    permissions (0666 less the umask; mkstemp alone would leave 0600). On any failure the
    temporary file is removed (no partial file survives) and an OS error (a full disk)
    becomes a WriteError (one line, exit status 4).
    """
    kind = output_kind(path, create_parents=True)
    if kind == STREAM:
        _write_through(path, write)
        return
    target = Path(os.path.realpath(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise OutputError(path, exc.strerror or type(exc).__name__) from None
    os.close(fd)

    def discard() -> None:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:
        _guarded(path, lambda: write(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        discard()
        raise
    _commit(RENAME, lambda: _guarded(path, lambda: os.replace(tmp, target)), discard)


def _commit(order: int, move: Callable[[], None], discard: Callable[[], None]) -> None:
    """Move a written temporary file into place now, or when the staged_outputs() block
    around this write ends (discarding it if the block fails)."""
    staged = _STAGED.get()
    if staged is not None:
        staged.append((order, move, discard))
        return
    try:
        move()
    except BaseException:
        discard()
        raise


def _write_through(path: str | Path, write: Callable[[str], None]) -> None:
    """Write a character device or pipe in place: the writer fills a temporary file, whose
    bytes are then copied into `path`, opened by its own name (/dev/stdout's target may be
    a pipe's). A writer never gets the device's path itself, because some remove their
    output when they fail (pyarrow.parquet.write_table deletes it on any error, which on
    /dev/full would delete the device node)."""
    folder = tempfile.mkdtemp(prefix="shardsim-out-")
    tmp = os.path.join(folder, "output")

    def discard() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def copy() -> None:
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    try:
        write(tmp)
    except BaseException:
        discard()
        raise

    def move() -> None:
        try:
            _guarded(path, copy)
        finally:
            discard()
    _commit(COPY_FIRST, move, discard)


def _guarded(path: str | Path, action: Callable[[], None]) -> None:
    """Run a write; an OSError (ENOSPC, EIO, EDQUOT) becomes a one-line WriteError."""
    try:
        action()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise WriteError(path, reason) from None
def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def save_figure(fig, path: str | Path) -> None:
    """Save a matplotlib figure as PNG atomically."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120,
                                               bbox_inches="tight"))
