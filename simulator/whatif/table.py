"""A study's rows as a table: Parquet (atomic), a stacked-bar PNG and a terminal table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from ..trace import write_parquet
from .points import LEAD_COLUMNS


def columns(rows: list[dict[str, Any]], varied: list[str]) -> list[str]:
    """Fixed column order: lead columns, varied parameters, then the rest sorted."""
    lead = list(LEAD_COLUMNS[:2]) + [v for v in varied if v not in LEAD_COLUMNS]
    lead += list(LEAD_COLUMNS[2:])
    rest = sorted({k for r in rows for k in r} - set(lead))
    return lead + rest


def to_table(rows: list[dict[str, Any]], varied: list[str]) -> pa.Table:
    """One row per point (point order); missing fields of invalid points are null."""
    names = columns(rows, varied)
    data = {name: [r.get(name) for r in rows] for name in names}
    arrays = {}
    for name, values in data.items():
        kinds = {type(v) for v in values if v is not None}
        if kinds == {int, float}:   # ints and floats in one column: floats
            values = [None if v is None else float(v) for v in values]
        elif len(kinds) > 1:        # mixed kinds (a varied dp of auto and 2): strings
            values = [None if v is None else str(v) for v in values]
        arrays[name] = values
    if not rows:
        return pa.table({n: pa.array([], pa.string()) for n in names})
    return pa.table(arrays)


def write_table(table: pa.Table, path: str | Path, metadata: dict[str, Any]) -> None:
    """Parquet, written to a temporary file and renamed (never half-written)."""
    write_parquet(table, Path(path), metadata)


def point_label(row: dict[str, Any], varied: list[str], many_topos: bool) -> str:
    """x-axis label of a point."""
    parts = [str(row["topo"])] if many_topos or not varied else []
    parts += [f"{v}={row.get(v)}" for v in varied]
    return "\n".join(parts) if len(parts) <= 3 else " ".join(parts)


def plot(rows: list[dict[str, Any]], varied: list[str], path: str | Path, title: str) -> None:
    """Step time per point, stacked: compute / exposed communication / bubble (ms).

    Invalid points get an empty slot marked with an x and their row's status.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many = len({r["topo"] for r in rows}) > 1
    labels = [point_label(r, varied, many) for r in rows]
    x = list(range(len(rows)))
    width = max(6.0, min(0.45 * len(rows) + 2, 40.0))
    fig, ax = plt.subplots(figsize=(width, 4.5))
    bottom = [0.0] * len(rows)
    for key, name, color in (("compute_s", "compute", "#4c72b0"),
                             ("exposed_comm_s", "exposed communication", "#dd8452"),
                             ("bubble_s", "bubble / waiting", "#8c8c8c")):
        vals = [1e3 * (r.get(key) or 0.0) if r["status"] == "ok" else 0.0 for r in rows]
        ax.bar(x, vals, bottom=bottom, color=color, label=name, width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        if r["status"] != "ok":
            ax.plot([i], [0], marker="x", color="#c44e52")
            ax.annotate(r["status"], (i, 0), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=7, color="#c44e52", rotation=90)
    ax.set_xticks(x)
    longest = max((len(line) for lab in labels for line in lab.split("\n")), default=0)
    if len(rows) * max(longest, 1) * 0.07 > width:   # would overlap: one slanted line each
        ax.set_xticklabels([lab.replace("\n", " ") for lab in labels], fontsize=7,
                           rotation=60, ha="right")
    else:
        ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    from ..output import save_figure
    save_figure(fig, path)
    plt.close(fig)


def render(rows: list[dict[str, Any]], varied: list[str]) -> str:
    """The terminal table: one line per point."""
    head = ["point", "topo"] + varied + ["step (ms)", "compute", "exp.comm", "bubble",
                                         "MFU %", "mem GB", "fits", "status"]
    body = []
    for r in rows:
        cells = [str(r["point"]), str(r["topo"])] + [str(r.get(v)) for v in varied]
        if r["status"] == "ok":
            cells += [f"{1e3 * r['step_time_s']:.2f}", f"{1e3 * r['compute_s']:.2f}",
                      f"{1e3 * r['exposed_comm_s']:.2f}", f"{1e3 * r['bubble_s']:.2f}",
                      f"{100 * r['mfu']:.1f}", f"{r['peak_memory_bytes'] / 1e9:.1f}",
                      "yes" if r["fits_in_memory"] else "NO", "ok"]
        else:
            cells += ["-"] * 7 + [f"{r['status']}: {r['error']}"]
        body.append(cells)
    widths = [max(len(h), *(len(c) for c in col)) if body else len(h)
              for h, col in zip(head, zip(*body) if body else [()] * len(head))]
    widths[-1] = len(head[-1])
    fmt = lambda cells: "  ".join(c.rjust(w) if i < len(cells) - 1 else c   # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head)] + [fmt(c) for c in body])
