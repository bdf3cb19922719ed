"""Built-in studies, `python -m simulator study NAME`.

A study is a module of this package that defines:
  NAME: str                       the name users type (e.g. "tp-scaling")
  HELP: str                       one line for --help
  add_arguments(parser) -> None   its flags (every study takes --json and --plot FILE.png)
  run(args) -> int                prints a table (or JSON with --json), writes the plot
Modules are discovered, so adding a study is adding a file.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def registry() -> dict[str, ModuleType]:
    """Study name -> module, for every module here that defines NAME and run."""
    studies: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            studies[module.NAME] = module
    return studies
