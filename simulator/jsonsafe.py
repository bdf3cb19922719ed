"""JSON that is always valid: non-finite numbers become null, and say where.

JSON has no NaN or Infinity; Python's json module writes them anyway unless told not
to, and most parsers then refuse the whole document. Every JSON the simulator prints
(simulator.output.print_json) or records (what-if checkpoints) goes through
`finite_json`, which replaces a non-finite float by null: such a number only comes from
a quantity that has no value at that point (a ratio over a zero duration, a mean of
nothing), and null is how JSON says "no value". The caller reports the paths it replaced
(`warning:` on stderr), so nothing is hidden; inputs that would make a number non-finite
(a NaN memory budget, a NaN step time) are refused where they are read.
"""
from __future__ import annotations

import json
import math
from typing import Any


def finite_json(obj: Any, path: str = "$") -> tuple[Any, list[str]]:
    """(a copy of `obj` made of JSON types with every non-finite float as None, the
    JSON paths of the replaced numbers). Objects json cannot write (numpy scalars)
    become floats, as json.dump(default=float) would."""
    replaced: list[str] = []
    return _clean(obj, path, replaced), replaced


def _clean(value: Any, path: str, replaced: list[str]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {k: _clean(v, f"{path}.{k}", replaced) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, f"{path}[{i}]", replaced) for i, v in enumerate(value)]
    number = float(value)   # float itself, or what default=float made of it before
    if not math.isfinite(number):
        replaced.append(path)
        return None
    return number


def dumps_finite(obj: Any, **kwargs: Any) -> tuple[str, list[str]]:
    """json.dumps of finite_json(obj) (never NaN or Infinity), and the replaced paths."""
    clean, replaced = finite_json(obj)
    return json.dumps(clean, allow_nan=False, **kwargs), replaced


def warn_replaced(replaced: list[str], stream) -> None:
    """One stderr line naming the numbers printed as null, if any."""
    if replaced:
        more = f" and {len(replaced) - 3} more" if len(replaced) > 3 else ""
        print(f"warning: not a finite number, written as null: {', '.join(replaced[:3])}"
              f"{more}", file=stream)
