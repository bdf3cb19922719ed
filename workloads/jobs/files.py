"""Job config files: which framework a file is for (by its suffix), and reading one."""
from __future__ import annotations

from pathlib import Path

from inputs import read_text_file

from ..plan import Plan, plan_from_dict
from .common import Imported
from .findings import JobConfigError
from .megatron import read_megatron
from .torchtitan import read_torchtitan

READERS = {"torchtitan": read_torchtitan, "megatron": read_megatron}
# .toml: a torchtitan job config; .yaml/.yml: a Megatron-Bridge run config; .txt, .args,
# .sh: a file of Megatron pretrain_gpt.py flags.
SUFFIXES = {".toml": "torchtitan", ".yaml": "megatron", ".yml": "megatron",
            ".txt": "megatron", ".args": "megatron", ".sh": "megatron"}


def job_framework(path: str | Path) -> str | None:
    """The framework whose config a path's suffix names (None: not a job config)."""
    return SUFFIXES.get(Path(path).suffix.lower())


def read_job(path: str | Path, framework: str | None = None, lenient: bool = False,
             model: str | dict | None = None) -> Imported:
    """Read a job config file as a plan object (framework: by the suffix if None)."""
    framework = framework or job_framework(path)
    if framework not in READERS:
        raise JobConfigError("job config", str(path), "a .toml (torchtitan), .yaml/.yml "
                             "(Megatron-Bridge) or .txt/.args/.sh (Megatron flags) file")
    text = read_text_file(path, "job config", JobConfigError, kind="job config")
    return READERS[framework](text, str(path), lenient=lenient, model=model)


def load_job(path: str | Path, lenient: bool = False) -> tuple[Plan, list[str]]:
    """A validated Plan from a job config file, named after the file, and the notes."""
    imported = read_job(path, lenient=lenient)
    return plan_from_dict(imported.plan, default_name=Path(path).stem), imported.notes
