"""`python -m simulator SUBCOMMAND`: argument parsing, error handling and exit codes.

Exit codes: 0 success, 2 bad input (any inputs.InputError: one line on stderr naming
field, value and what is allowed), 3 `--strict-memory` and the plan does not fit,
4 an output could not be written (a full disk: one line), 1 internal error (the codes live in simulator/errors.py). Only simulator/__main__.py
imports this module.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import sys
import traceback
from typing import Callable, Sequence

from inputs import InputError

from .errors import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_WRITE_FAILED, OutputError, UsageError,
                     WriteError)
from .commands.common import flush_notes
from .output import STREAM, output_kind


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse API
        raise UsageError(self.prog, " ".join(sys.argv[1:]) or "(no arguments)", message)


# Every bad input, whichever package read it (plans, models, topologies, flags, output
# paths), is an inputs.InputError: one line on stderr, exit 2.
BAD_INPUT = (InputError,)
COMMANDS: dict[str, Callable] = {}
# Options that name an output file, by argparse dest: checked before the work starts
# (simulator/output.py output_kind), so a run never ends by refusing where to write.
OUTPUT_OPTIONS = {"output": "--output", "trace": "--trace", "chrome_trace": "--chrome-trace",
                  "plot": "--plot"}
# Arguments that name input files, by argparse dest (a value may be a list: repeated
# flags), with what they hold; no output may replace one of them.
INPUT_OPTIONS = {"plan": "plan", "topo": "topology", "config": "job config"}
# OS errors a write meets that are not the program's fault: disk full, quota, file too
# large, I/O error (exit status 4, one line).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def check_outputs(args: argparse.Namespace) -> None:
    """OutputError (exit 2) for any output option naming a path that cannot be written, or
    the file another output option names (the second would replace the first) or an
    input file of the command (the output would replace what it was made from)."""
    files: dict[str, str] = {}
    for dest, what in INPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        for path in (value if isinstance(value, list) else [value]):
            if isinstance(path, str) and os.path.isfile(path):
                files[os.path.realpath(path)] = f"it is the input {what}"
    for dest, flag in OUTPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        if value == "":   # the commands test the path's truth: "" would write nothing
            raise OutputError(value, "it is empty", flag)
        if isinstance(value, str) and output_kind(value, flag) != STREAM:
            target = os.path.realpath(value)
            if target in files:
                raise OutputError(value, files[target], flag)
            files[target] = f"{flag} writes it too"


def build_parser() -> argparse.ArgumentParser:
    """The full CLI: one subparser per module of simulator/commands with a `register`."""
    from . import commands
    parser = OneLineParser(prog="python -m simulator",
                           description="Discrete-event simulator of sharded LLM training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__))
    # `run` first in the help; the rest alphabetically.
    for name in sorted(names, key=lambda n: (n != "run", n)):
        module = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    succeeded = False
    try:
        args = build_parser().parse_args(argv)
        check_outputs(args)
        status = int(args.handler(args) or 0)
        sys.stdout.flush()   # a full stdout (> /dev/full) fails here, not at exit
        succeeded = True
        return status
    except BAD_INPUT as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except WriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except BrokenPipeError:
        # the reader went away (`... | head`): nothing more to say, and Python's flush at
        # exit must not fail again on the closed pipe (the Python docs' signal module,
        # "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal error: one line, the traceback on request
        if "--debug" in (argv if argv is not None else sys.argv):
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        flush_notes(succeeded)
