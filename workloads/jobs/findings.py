"""What an import found besides the plan: keys ignored, keys not modelled, refusals.

Every key of a job config is accounted for: mapped to a plan field, listed as ignored
(it cannot change a step's time: paths, logging, checkpointing, learning rate, data),
or reported as not modelled (it would change the step time and the simulator does not
model it). A not-modelled key is an error unless the import is lenient, where it becomes
a warning; nothing is dropped without a line saying so.
"""
from __future__ import annotations

from typing import Any

from inputs import ascii_int
from inputs.errors import shown

from ..errors import WorkloadError
from ..fields import is_int


class JobConfigError(WorkloadError):
    """A job config the importer refuses: unreadable, another schema version, bad values,
    or keys that would change the step time but are not modelled (exit status 2)."""


class Findings:
    """Collects the notes of one import; `finish` raises when something is not modelled."""

    def __init__(self, framework: str, lenient: bool = False):
        self.framework, self.lenient = framework, lenient
        self.notes: list[str] = []
        self.problems: list[tuple[str, Any, str]] = []

    def ignore(self, key: str, reason: str) -> None:
        """A key that cannot change a step's time."""
        self.notes.append(f"ignored: {key} ({reason})")

    def problem(self, key: str, value: Any, reason: str) -> None:
        """A key (and its value) that would change the step time but is not modelled."""
        self.problems.append((key, value, reason))

    def finish(self) -> list[str]:
        """The notes (warnings included when lenient); raises JobConfigError otherwise."""
        if self.problems and not self.lenient:
            keys = ", ".join(k for k, _, _ in self.problems)
            values = [v for _, v, _ in self.problems]
            whys = "; ".join(f"{k}: {why}" for k, _, why in self.problems)
            raise JobConfigError(keys, values[0] if len(values) == 1 else values,
                                 f"what the simulator models for {self.framework}, not "
                                 f"({whys}); --lenient simulates without them")
        warnings = [f"warning: not modelled, simulated without it: {k} = {shown(v)} ({why})"
                    for k, v, why in self.problems]
        return self.notes + warnings


def need_int(value: Any, key: str, minimum: int = 1) -> int:
    """An integer >= minimum read from a job config, or JobConfigError naming the key. A
    string (a flags file is text) must be ASCII digits: int() would also take "١", "2_0"
    and " 2"."""
    if isinstance(value, str) and ascii_int(value) is not None:
        value = ascii_int(value)
    if not is_int(value) or value < minimum:
        raise JobConfigError(key, value, f"an integer >= {minimum}")
    return value


def need_choice(value: Any, key: str, allowed: tuple) -> Any:
    """One of `allowed`, or JobConfigError naming the key."""
    if value not in allowed:
        raise JobConfigError(key, value, ", ".join(map(str, allowed)))
    return value


def need_bool(value: Any, key: str) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise JobConfigError(key, value, "true or false")
    return value
