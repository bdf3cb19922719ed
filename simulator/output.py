"""Outputs: files written atomically (temporary file in the same folder, then rename), so
that a reader never sees a half-written trace, table, plan or plot; and JSON on stdout.

Library code (studies, what-if) and the commands both write through here, so neither
needs the other."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import OutputError


def print_json(obj: Any) -> None:
    """Stable, valid JSON on stdout (sorted keys, two-space indent).

    A non-finite number is printed as null and named on stderr (simulator.jsonsafe
    says why); the text is built whole before it is written, so an error never leaves
    half a document on stdout."""
    from .jsonsafe import dumps_finite, warn_replaced
    text, replaced = dumps_finite(obj, indent=2, sort_keys=True)
    warn_replaced(replaced, sys.stderr)
    sys.stdout.write(text + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`.

    Missing parent folders are created; the file gets the usual permissions (0666 less
    the umask; mkstemp alone would leave 0600).
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(path, "it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise OutputError(path, exc.strerror or type(exc).__name__) from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
