"""The simulator's input errors: a bad flag value (UsageError), an unwritable output path
(OutputError). Library modules (whatif, search, studies) raise them; only the CLI
(simulator/cli.py) turns them, like every inputs.InputError, into exit status 2.
WriteError, an OS error while writing an output (a full disk), is not bad input: exit
status 4."""
from __future__ import annotations

from pathlib import Path

from inputs import InputError


class UsageError(InputError):
    """A bad flag or argument value; names the flag, the value and what is allowed."""


class OutputError(InputError):
    """An output path that cannot be written (exit status 2, like any bad input); `flag`
    names the option that gave it."""

    def __init__(self, path: Path | str, reason: str, flag: str = "output"):
        self.path, self.reason, self.flag = str(path), reason, flag
        super().__init__(flag, str(path), f"a writable file path ({reason})")

    def __reduce__(self):
        return (OutputError, (self.path, self.reason, self.flag))


class WriteError(Exception):
    """An OS error while writing an output (a full disk, an I/O error): not bad input, so
    its own exit status (EXIT_WRITE_FAILED) and one line naming the path and the reason."""

    def __init__(self, path: Path | str, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"cannot write {path}: {reason}")

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (WriteError, (self.path, self.reason))


# Exit statuses of `python -m simulator` (README, "Exit codes"): the CLI and the commands
# share them from here, so that no command imports the CLI module that imports them.
EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_WRITE_FAILED = 1, 2, 3, 4
