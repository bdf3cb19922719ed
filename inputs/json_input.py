"""The one strict JSON reader of every input file (plans, models, topologies, checkpoints).

Python's json module accepts what no input file of this project may hold, and fails on
some inputs with something other than a one-line error:
  * NaN, Infinity and -Infinity (not JSON, RFC 8259 section 6): rejected;
  * a key given twice in one object (RFC 8259 section 4 leaves it to the reader; json
    keeps the last silently): rejected, so that `{"tp": 8, "tp": 4}` is not a plan with
    tp 4 by accident;
  * nesting a few thousand levels deep makes the C scanner raise RecursionError: the
    depth is measured before parsing and bounded by MAX_DEPTH;
  * a file of gigabytes would be read whole: bounded by MAX_BYTES;
  * an integer of more digits than the interpreter converts (sys.get_int_max_str_digits,
    4300 by default) raises a bare ValueError: turned into the caller's error.
Every failure is the caller's InputError subclass (WorkloadError, TopologyError, ...)
naming the field, so the CLIs print one line and exit 2.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from .errors import InputError

# The deepest input of the project is a topology's measured collective points
# (topology > measured_collectives > op > size > points > pair: 6 levels); 64 leaves room
# and stays far below the interpreter's recursion limit (1,000 frames by default).
MAX_DEPTH = 64
# The largest input of the project is a calibrated topology file of a few kilobytes;
# 64 MiB bounds what one read may take without refusing any real file.
MAX_BYTES = 64 << 20

_TOKEN = re.compile(r'["\[\]{}]')
_STRING_STOP = re.compile(r'["\\]')


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in a JSON text (strings skipped).

    One pass, linear in the text: a string is skipped by jumping from one quote or
    backslash to the next (a regular expression for a whole string would rescan an
    unterminated one from every quote in it: quadratic).
    """
    depth = deepest = pos = 0
    while (token := _TOKEN.search(text, pos)) is not None:
        pos = token.end()
        if token.group() == '"':
            while (stop := _STRING_STOP.search(text, pos)) is not None \
                    and stop.group() == "\\":
                pos = stop.end() + 1          # an escape: skip the escaped character
            if stop is None:
                return deepest                # unterminated: the parser says so
            pos = stop.end()
        elif token.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_json(text: str, field: str, error: type[InputError] = InputError,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse a JSON text strictly (module docstring); errors name `field`."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(field, f"JSON nested {depth} levels deep",
                    f"JSON nested at most {max_depth} levels")

    def reject_constant(name: str):
        raise error(field, name, "finite JSON numbers (no NaN or Infinity)")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{field}.{key}", value, "each key once per object (it is given twice)")
            out[key] = value
        return out

    try:
        value = json.loads(text, parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise error(field, text[:60] if len(text) < 60 else text[:57] + "...",
                    f"valid JSON (line {exc.lineno}: {exc.msg})") from None
    except InputError:   # a hook's own error (NaN, a key given twice): as raised
        raise
    except ValueError:   # an integer longer than the interpreter converts (sys limit)
        digits = sys.get_int_max_str_digits()
        raise error(field, f"an integer of more than {digits} digits",
                    f"integers of at most {digits} digits") from None
    except RecursionError:   # belt and braces: the depth check above should prevent it
        raise error(field, "deeply nested JSON", f"JSON nested at most {max_depth} levels") from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise error(field, "a lone UTF-16 surrogate escape in a string",
                    "valid Unicode text (a surrogate escape only as half of a pair)")
    return value


# json decodes "\ud800" alone into a lone surrogate, a str that cannot be printed or written
# as UTF-8 (only a pair of escapes makes a character); found only through such an escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string in a parsed JSON value (keys included) is not valid Unicode."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# What a path that is not a regular file names, for the refusal's message.
_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def require_regular_file(path: str | os.PathLike, field: str,
                         error: type[InputError] = InputError) -> None:
    """`error` naming `field` unless `path` is a regular file (or a link to one). Checked
    before the file is opened: opening a FIFO blocks until a writer comes (for ever, in a
    script), a folder is walked as a dataset by pyarrow, and a device such as /dev/zero
    never ends; none of them is an input file."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:   # ValueError: a NUL byte in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(field, str(path), f"a readable file ({reason})") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
        raise error(field, str(path), f"a regular file (it is {kind})")


def read_text_file(path: str | Path, field: str, error: type[InputError] = InputError,
                   max_bytes: int = MAX_BYTES, kind: str = "") -> str:
    """A UTF-8 text file's contents, at most `max_bytes` of them; errors name `field` and
    the path. Only a regular file is read (require_regular_file)."""
    path = Path(path)
    what = f"{kind} file" if kind else "file"
    require_regular_file(path, field, error)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(field, str(path), f"a {what} of at most {max_bytes >> 20} MiB "
                                          f"(it has {size:,} bytes)")
        with open(path, encoding="utf-8") as fh:
            text = fh.read(max_bytes + 1)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise error(field, str(path), f"a readable UTF-8 {what} ({reason})") from None
    if len(text) > max_bytes:   # a file that grew, or a device that never ends
        raise error(field, str(path), f"a {what} of at most {max_bytes >> 20} MiB")
    return text


def load_json_file(path: str | Path, field: str, error: type[InputError] = InputError,
                   max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse a JSON file strictly; errors name `field` and the path."""
    text = read_text_file(path, field, error, max_bytes, "JSON")
    try:
        return parse_json(text, field, error, max_depth)
    except InputError as exc:
        if exc.field == field and str(exc.allowed).startswith("valid JSON"):
            raise error(field, str(path), exc.allowed) from None
        raise
