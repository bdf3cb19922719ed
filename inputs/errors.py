"""InputError: a bad input, named by its field, the value given and what is allowed.

Every package that reads input (a plan, a model, a topology, a flag, an output path)
raises a subclass of it: WorkloadError (workloads), TopologyError (topologies),
ValidationError (validation), UsageError and OutputError (simulator). The subclasses add
no behaviour; they exist so that a traceback, a test or an `except` still says which
package rejected the input (the search, for one, drops a candidate on a WorkloadError
but lets a TopologyError through). The CLIs catch InputError alone and turn it into one
line on stderr and exit status 2.
"""
from __future__ import annotations

import reprlib


class InputError(ValueError):
    """An input is invalid; names the field, the value and what is allowed.

    str(error) is the one line the CLIs print: "FIELD: got VALUE; allowed: ALLOWED".
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        # `allowed` is the program's own text, whose every choice matters: cut only far
        # past any list of choices (a few messages quote the input there too)
        super().__init__(f"{_short(_printable(field))}: got {shown(value)}; "
                         f"allowed: {_short(_printable(allowed), MAX_ALLOWED_CHARS)}")

    def __reduce__(self):
        # Pickle by the three parts (the what-if workers send errors between processes;
        # ValueError's default would call __init__ with the message alone).
        return (type(self), (self.field, self.value, self.allowed))


# A message stays a readable line: a value echoed from a file or a flag (a list of a
# million items, an integer of thousands of digits) is cut to its start and its length.
MAX_SHOWN_CHARS = 300
MAX_ALLOWED_CHARS = 2000

# A value with more parts than this (a YAML alias bomb: a few lines naming 10^9 items) is
# shown by reprlib, which stops after a few items and levels, not by repr, which would
# walk every part.
MAX_SHOWN_PARTS = 1000


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr, which also names an integer too long to print (a TOML or
    YAML hex literal of thousands of digits passes the decimal limit, and then its repr
    raises ValueError)."""

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<an integer of {x.bit_length():,} bits>"


_BOUNDED = _BoundedRepr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 4, MAX_SHOWN_CHARS, MAX_SHOWN_CHARS
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = 20


def shown(value: object) -> str:
    """repr(value) for a message: whole when it is small, else bounded (MAX_SHOWN_PARTS,
    MAX_SHOWN_CHARS) before it is built."""
    if _parts(value, MAX_SHOWN_PARTS) >= MAX_SHOWN_PARTS:
        return _short(_BOUNDED.repr(value))
    try:
        return _short(repr(value))
    except ValueError:    # an integer past the interpreter's digit limit, somewhere inside
        return _short(_BOUNDED.repr(value))


def _parts(value: object, limit: int) -> int:
    """How many containers and items `value` holds, counted up to `limit`."""
    count, stack = 0, [value]
    while stack and count < limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return count


def _short(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def _printable(text: str) -> str:
    """`text` with each unprintable character escaped, so that a field named by a user's
    key (a file's JSON key may hold a line or record separator) stays on one line."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
