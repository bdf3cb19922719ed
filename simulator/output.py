"""Writing outputs atomically (temporary file in the same folder, then rename), so that a
reader never sees a half-written trace, table, plan or plot."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
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
