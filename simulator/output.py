"""Writing outputs atomically (temporary file in the same folder, then rename), so that a
reader never sees a half-written trace, table, plan or plot."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


class OutputError(ValueError):
    """An output path that cannot be written (exit status 2, like any bad input)."""

    def __init__(self, path: Path, reason: str):
        self.field, self.value, self.allowed = "output", str(path), f"a writable file path ({reason})"
        super().__init__(f"{self.field}: got {self.value!r}; allowed: {self.allowed}")


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
