"""`trace summary|plot FILE.parquet`: look at a trace written by `run --trace`.

`summary` prints the step's summary (from the file's metadata), each rank's breakdown and,
for traces of every rank (`--full`, faults), who waits for whom: a collective starts when
its last member arrives, so each member's row runs from its own arrival; the wait of a
member is the last arrival minus its own. `plot` draws a per-rank timeline with the
streams as lanes.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from inputs import InputError, decimal, finite, parse_json

from ..errors import UsageError
from ..summary import rank_breakdowns
from ..table_input import FLOAT, INT, TEXT, check_columns, check_order
from .common import fmt_time, print_json

STREAM_ORDER = ("compute", "tp", "dp_ag", "dp_rs", "pp_send", "pp_recv")


def register(sub) -> None:
    """Add `trace summary` and `trace plot`."""
    p = sub.add_parser("trace", help="summarise or plot a Parquet trace")
    cmds = p.add_subparsers(dest="trace_command", required=True, parser_class=type(p))
    s = cmds.add_parser("summary", help="per-rank breakdown and who waits for whom")
    s.add_argument("file", help="a Parquet trace (run --trace FILE.parquet)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    s.set_defaults(handler=handle_summary)
    t = cmds.add_parser("plot", help="per-rank timeline, streams as lanes (PNG)")
    t.add_argument("file", help="a Parquet trace")
    t.add_argument("-o", "--output", required=True, metavar="FILE.png")
    t.add_argument("--ranks", default=None, help="ranks to draw: A-B or a list (default: "
                                                 "the first 16)")
    t.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    t.set_defaults(handler=handle_plot)


def read_trace(path: str) -> tuple[pa.Table, dict[str, Any]]:
    """The trace table and its JSON metadata; UsageError for a missing or foreign file."""
    if not Path(path).is_file():
        raise UsageError("trace", path, "an existing Parquet trace file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError("trace", path, f"a Parquet trace ({exc})") from None
    check_columns(table, TRACE_REQUIRED, TRACE_OPTIONAL, "trace", path, UsageError)
    check_order(table, "start_s", "end_s", "trace", path, UsageError)
    meta = {}
    for key, value in (table.schema.metadata or {}).items():
        try:
            meta[key.decode()] = parse_json(value.decode(), "trace metadata")
        except (UnicodeDecodeError, InputError):
            continue
    if not isinstance(meta.get("summary"), dict) or not all(
            _finite_number(meta["summary"].get(k)) for k in SUMMARY_TIMES):
        meta.pop("summary", None)   # a foreign or damaged summary: the rows still tell
    return table, meta


def _finite_number(value: Any) -> bool:
    """A JSON number a float holds (not a bool, NaN, infinity or a 400-digit integer)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)


# The columns the trace commands read, and their kinds (simulator/trace.py COLUMNS).
TRACE_REQUIRED = {"rank": INT, "stream": TEXT, "kind": TEXT, "start_s": FLOAT, "end_s": FLOAT}
TRACE_OPTIONAL = {"phase": TEXT, "op": TEXT, "label": TEXT, "layer": INT, "microbatch": INT}
SUMMARY_TIMES = ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s")


def waits(table: pa.Table) -> dict[str, Any]:
    """Per rank: seconds spent waiting for later members of collectives, and how often
    it was the last to arrive (the one the others waited for).

    Rows of one collective are those with the same stream, label, op, phase, layer,
    micro-batch and end time. Only meaningful when every member rank is in the trace.
    """
    cols = table.select([c for c in ("rank", "stream", "kind", "op", "phase", "layer",
                                     "microbatch", "label", "start_s", "end_s")
                         if c in table.column_names]).to_pydict()
    groups: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for i, kind in enumerate(cols["kind"]):
        if kind != "comm" or cols.get("op", [""] * (i + 1))[i] == "send_recv":
            continue
        key = tuple(cols[c][i] for c in ("stream", "op", "phase", "layer", "microbatch",
                                         "label") if c in cols) + (round(cols["end_s"][i], 12),)
        groups[key].append((cols["rank"][i], cols["start_s"][i]))
    waited: dict[int, float] = defaultdict(float)
    last: dict[int, int] = defaultdict(int)
    for members in groups.values():
        if len(members) < 2:
            continue
        latest = max(s for _, s in members)
        for rank, start in members:
            waited[rank] += latest - start
        culprit = min(r for r, s in members if s == latest)
        if any(s < latest for _, s in members):
            last[culprit] += 1
    ranks = sorted(set(cols["rank"]))
    return {"collectives": sum(1 for m in groups.values() if len(m) > 1),
            "wait_s": {r: waited.get(r, 0.0) for r in ranks},
            "last_to_arrive": {r: last.get(r, 0) for r in ranks}}


def summarize_trace(table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    """Summary (metadata), per-rank breakdown, per-stream busy time, waits."""
    # rank_breakdowns needs rows grouped by rank: a foreign trace may not be sorted.
    table = table.sort_by([("rank", "ascending"), ("start_s", "ascending")])
    per_rank = rank_breakdowns(table)
    ranks = sorted(per_rank)
    streams: dict[str, float] = defaultdict(float)
    cols = table.select(["stream", "start_s", "end_s"]).to_pydict()
    for s, a, b in zip(cols["stream"], cols["start_s"], cols["end_s"]):
        streams[s] += b - a
    return {"file_summary": meta.get("summary"), "topology": meta.get("topology"),
            "rows": table.num_rows, "ranks": ranks, "per_rank": per_rank,
            "stream_busy_s": dict(sorted(streams.items())), "waits": waits(table)}


def _rank(text: str) -> int:
    """A rank of --ranks in ASCII digits (ValueError otherwise, as int() raised)."""
    value = decimal(text, 9)
    if value is None:
        raise ValueError(text)
    return value


def handle_summary(args: argparse.Namespace) -> int:
    """Print the trace summary."""
    table, meta = read_trace(args.file)
    out = summarize_trace(table, meta)
    if args.json:
        print_json({**out, "per_rank": {str(k): v for k, v in out["per_rank"].items()},
                    "waits": {**out["waits"],
                              "wait_s": {str(k): v for k, v in out["waits"]["wait_s"].items()},
                              "last_to_arrive": {str(k): v for k, v in
                                                 out["waits"]["last_to_arrive"].items()}}})
        return 0
    s = out["file_summary"] or {}
    print(f"{args.file}: {out['rows']:,} rows, {len(out['ranks'])} rank(s)"
          + (f", plan {s.get('plan')} on {s.get('topology')}" if s else ""))
    if s:
        print(f"  step time {fmt_time(s['step_time_s'])}, compute {fmt_time(s['compute_s'])}, "
              f"exposed comm {fmt_time(s['exposed_comm_s'])}, bubble {fmt_time(s['bubble_s'])}")
    print(f"  {'rank':>5} {'end':>11} {'compute':>11} {'comm':>11} {'exposed':>11} "
          f"{'idle':>11} {'waited':>11} {'last in':>8}")
    w = out["waits"]
    for r, b in out["per_rank"].items():
        print(f"  {r:>5} {fmt_time(b['end_s']):>11} {fmt_time(b['compute_s']):>11} "
              f"{fmt_time(b['comm_s']):>11} {fmt_time(b['exposed_comm_s']):>11} "
              f"{fmt_time(b['idle_s']):>11} {fmt_time(w['wait_s'][r]):>11} "
              f"{w['last_to_arrive'][r]:>8}")
    if len(out["ranks"]) > 1 and w["collectives"]:
        worst = max(out["ranks"], key=lambda r: (w["last_to_arrive"][r], -r))
        if w["last_to_arrive"][worst]:
            print(f"  rank {worst} arrived last at {w['last_to_arrive'][worst]} of "
                  f"{w['collectives']} collectives: the others waited for it")
    print("  stream busy: " + ", ".join(f"{k} {fmt_time(v)}"
                                        for k, v in out["stream_busy_s"].items()))
    return 0


# Lanes (rank x stream) one timeline draws: 16 ranks of a simulator trace's ~10 streams
# fit many times over.
MAX_LANES = 1000


def _ranks(spec: str | None, available: list[int]) -> list[int]:
    if spec is None:
        return available[:16]
    try:
        if "-" in spec:
            a, b = (_rank(x) for x in spec.split("-"))
            # Bounded by the trace's ranks before a range is built (a typo of 10**12).
            wanted = range(max(a, available[0]), min(b, available[-1]) + 1)
        else:
            wanted = [_rank(x) for x in spec.split(",")]
    except ValueError:
        raise UsageError("--ranks", spec, "A-B or a comma-separated list of ranks") from None
    present = set(available)
    picked = [r for r in wanted if r in present]
    if not picked:
        raise UsageError("--ranks", spec, f"ranks in the trace ({available[0]}..{available[-1]})")
    return picked


def handle_plot(args: argparse.Namespace) -> int:
    """Draw the timeline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure

    table, meta = read_trace(args.file)
    ranks = _ranks(args.ranks, sorted(set(table["rank"].to_pylist())))
    cols = table.to_pydict()
    phases = cols.get("phase") or [""] * table.num_rows   # optional column
    present = set(cols["stream"])
    streams = [s for s in STREAM_ORDER if s in present] + sorted(present - set(STREAM_ORDER))
    # 0.22 inch per lane at 120 dpi: past MAX_LANES the PNG is taller than matplotlib
    # draws in reasonable time (20,000 lanes ran for minutes); checked before drawing
    if len(streams) > MAX_LANES:
        raise UsageError("file", args.file, f"a trace of at most {MAX_LANES} streams "
                                            f"(it has {len(streams):,})")
    if len(ranks) * len(streams) > MAX_LANES:
        raise UsageError("--ranks", args.ranks or f"(default) the first {len(ranks)}",
                         f"at most {MAX_LANES // len(streams)} ranks: each draws one lane "
                         f"per stream, and this trace has {len(streams)} streams")
    lane = {(r, s): i for i, (r, s) in enumerate((r, s) for r in ranks for s in streams)}
    colors = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#8172b2",
              "optimizer": "#937860"}
    comm = {"tp": "#dd8452", "dp_ag": "#c44e52", "dp_rs": "#da8bc3", "pp_send": "#ccb974",
            "pp_recv": "#64b5cd"}
    bars: dict[tuple[int, str], list] = defaultdict(list)
    for i in range(table.num_rows):
        key = (cols["rank"][i], cols["stream"][i])
        if key in lane and cols["end_s"][i] > cols["start_s"][i]:
            c = (colors.get(phases[i], "#4c72b0") if cols["kind"][i] == "compute"
                 else comm.get(cols["stream"][i], "#999999"))
            bars[key].append((1e3 * cols["start_s"][i],
                              1e3 * (cols["end_s"][i] - cols["start_s"][i]), c))
    fig, ax = plt.subplots(figsize=(14, max(2.5, 0.22 * len(lane) + 1.2)))
    for key, items in bars.items():
        y = lane[key]
        ax.broken_barh([(a, w) for a, w, _ in items], (y - 0.4, 0.8),
                       facecolors=[c for _, _, c in items], linewidth=0)
    ax.set_yticks(list(lane.values()))
    ax.set_yticklabels([f"r{r} {s}" for r, s in lane], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    summary = meta.get("summary") or {}
    ax.set_title(f"{Path(args.file).name}: {summary.get('plan', '')} on "
                 f"{summary.get('topology', meta.get('topology', ''))}".rstrip(": on"))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in list(colors.values()) + list(comm.values())]
    ax.legend(handles, list(colors) + list(comm), fontsize=6, ncol=9, loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(lane) < 20 else -0.04))
    save_figure(fig, args.output)
    plt.close(fig)
    print(f"wrote {args.output}: {len(ranks)} rank(s), {len(streams)} stream(s)")
    return 0
