"""`validation op-shares`: the published runs' step-time errors against where their
simulated time goes.

A mechanism the simulator misprices leaves a mark in its errors: the rows that spend more
of their step in the mispriced operations miss by more. For every row of the references
table (or of `--csv`) that the simulator expresses, this simulates the row and reads the
shares of its simulated step from the summary's `ops` (simulator/op_breakdown.py: the
critical rank's device time per operation), by class:

    attention   compute operations named attention* that carry FLOPs (the attention core)
    gemm        the other compute operations that carry FLOPs (linears, grouped expert
                GEMMs, the output layer, the router)
    memory      compute operations without FLOPs (norms, activations, casts, copies, the
                optimizer: memory-bound kernels)
    exp_<s>     communication's exposed time (while the rank computed nothing) on the
                streams of one family, the stream name's first word: tp, dp, ep, pp, cp

Then, per group of rows (source, hardware and model kind, as `references` groups them)
with at least MIN_ROWS rows: the rows' MAPE and bias, each class's mean share and the
Pearson correlation of the error with it. A correlation names a suspect, not a cause (the
rows of one group share more than their shares); the command changes no constant, and
validation/README.md records what each lead became.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .reference_rows import DEFAULT_CSV, load_rows, row_id
from .references import map_rows, simulate_or_skip, simulate_row

# A group's correlation is printed from this many rows on: with fewer, one row sets it.
MIN_ROWS = 5
COMPUTE_CLASSES = ("attention", "gemm", "memory")
STREAM_FAMILIES = ("tp", "dp", "ep", "pp", "cp")


def step_shares(ops: list[dict[str, Any]], step_s: float) -> dict[str, float]:
    """Each class's device time (exposed time for communication) over the step time."""
    shares = dict.fromkeys([*COMPUTE_CLASSES, *(f"exp_{f}" for f in STREAM_FAMILIES)], 0.0)
    for op in ops:
        if op["kind"] == "compute":
            name = ("attention" if op["flops"] and op["op"].startswith("attention") else
                    "gemm" if op["flops"] else "memory")
            shares[name] += op["device_s"]
        elif op["kind"] == "comm":
            family = f"exp_{op['stream'].split('_')[0]}"
            if family in shares:
                shares[family] += op["exposed_s"]
    return {k: v / step_s if step_s else 0.0 for k, v in shares.items()}


def _simulated(row: dict[str, str]) -> dict[str, Any]:
    return simulate_row(row, with_summary=True)


def row_shares(row: dict[str, str]) -> dict[str, Any]:
    """One row's error, group and step shares, or its id and why it has none
    (`references`' reasons: inexpressible or skipped); runs in a worker process."""
    kind, result = simulate_or_skip(row, _simulated)
    if kind != "row":
        return {"id": result["id"], "status": kind}
    summary = result.pop("summary")
    return {"id": result["id"], "status": "row", "error_pct": result["error_pct"],
            "framework": result["framework"],
            "group": f"{result['source']} / {result['hardware']} / {result['model']}",
            "shares": step_shares(summary["ops"], summary["step_time_s"])}


def _lost(row: dict[str, str]) -> dict[str, Any]:
    return {"id": row_id(row), "status": "lost"}


def group_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group of MIN_ROWS rows or more: n, MAPE, bias and per class the mean share and
    the error's correlation with it (None where the share does not vary)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    table = []
    for name in sorted(groups):
        members = groups[name]
        if len(members) < MIN_ROWS:
            continue
        errors = np.array([r["error_pct"] for r in members])
        classes = {}
        for key in members[0]["shares"]:
            share = np.array([r["shares"][key] for r in members])
            spread = share.std() > 1e-9 and errors.std() > 1e-9
            classes[key] = {"mean_share": float(share.mean()),
                            "r": float(np.corrcoef(share, errors)[0, 1]) if spread else None}
        table.append({"group": name, "n": len(members),
                      "mape_pct": float(np.abs(errors).mean()),
                      "bias_pct": float(errors.mean()), "classes": classes})
    return table


def format_groups(table: list[dict[str, Any]]) -> str:
    """The group table: each class as `mean share (r)`."""
    if not table:
        return f"no group of {MIN_ROWS} rows or more"
    keys = list(table[0]["classes"])
    lines = [f"{'group':48} {'n':>4} {'MAPE':>6} {'bias':>7}  "
             + "  ".join(f"{k:>13}" for k in keys)]
    for g in table:
        cells = [f"{c['mean_share']:.2f} ({'  - ' if c['r'] is None else format(c['r'], '+.2f')})"
                 for c in g["classes"].values()]
        lines.append(f"{g['group'][:48]:48} {g['n']:>4} {g['mape_pct']:5.1f}% "
                     f"{g['bias_pct']:+6.1f}%  " + "  ".join(f"{c:>13}" for c in cells))
    return "\n".join(lines)


def op_shares_main(path: str | None, as_json: bool, jobs: int | None = None) -> int:
    """CLI body of `validation op-shares`."""
    from simulator.output import print_json

    rows = load_rows(Path(path) if path else DEFAULT_CSV)
    found = map_rows(row_shares, rows, jobs, _lost)
    scored = [r for r in found if r["status"] == "row"]
    unscored = {k: sum(r["status"] == k for r in found) for k in ("inexpressible", "skipped",
                                                                  "lost")}
    table = group_table(scored)
    if as_json:
        print_json({"rows": scored, "unscored": unscored, "groups": table,
                    "min_rows": MIN_ROWS})
        return 0
    print(f"{len(scored)} rows simulated (not: " + ", ".join(
        f"{n} {k}" for k, n in unscored.items()) + f"); groups of {MIN_ROWS} rows or more; "
        "each class: mean share of the simulated step (correlation of the step-time error "
        "with it)")
    print(format_groups(table))
    return 0
