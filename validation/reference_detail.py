"""`validation references --row ID`: one published run, simulated and taken apart.

Before a mechanism is changed for a row that misses, the question is where its simulated
time goes. This prints the row's measured and simulated step time and error, then the
simulator's own table for the plan the row becomes (`python -m simulator run`'s: the step's
breakdown, memory and the critical rank's longest operations, simulator/op_breakdown.py);
`--json` gives the same with the summary's every operation. The residuals file is not
touched.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ValidationError
from .reference_rows import DEFAULT_CSV, cannot_express, load_rows, row_id
from .references import simulate_row


def row_detail(path: str | Path | None, wanted: str) -> dict[str, Any]:
    """The row `wanted` of a reference CSV (default: the bundled table), simulated, with
    the simulator's summary under "summary"; a bad id or an inexpressible row is a
    ValidationError naming it."""
    source = Path(path) if path else DEFAULT_CSV
    rows = load_rows(source)
    match = [row for row in rows if row_id(row) == wanted]
    if not match:
        example = f", e.g. {row_id(rows[0])}" if rows else ""
        raise ValidationError("--row", wanted,
                              f"an id of {source.name} ({len(rows)} rows{example})")
    reason = cannot_express(match[0])
    if reason:
        raise ValidationError("--row", wanted, f"a row the simulator expresses (this one "
                              f"is listed as inexpressible: {reason})")
    return simulate_row(match[0], with_summary=True)


def row_main(path: str | None, wanted: str, as_json: bool) -> int:
    """CLI body of `validation references --row`."""
    from simulator.commands.run import render
    from simulator.output import print_json

    detail = row_detail(path, wanted)
    if as_json:
        print_json(detail)
        return 0
    print(f"row {detail['id']} ({detail['source']}, {detail['metric']} {detail['measured']:g}): "
          f"measured step {detail['measured_step_s']:.3f} s, simulated "
          f"{detail['simulated_step_s']:.3f} s, error {detail['error_pct']:+.1f} %")
    print(render(detail["summary"]))
    return 0
