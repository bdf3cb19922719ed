"""Tables shared by `compare` and `search`: one row per plan, with the step-time breakdown."""
from __future__ import annotations

from typing import Any, Sequence

STRATEGY_CODE = {"col": "c", "row": "r", "seq": "s", "replicate": "x"}


def fmt_s(seconds: float) -> str:
    """Seconds, aligned: `7.931 s` / `812.3 ms`."""
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def deltas(summaries: Sequence[dict[str, Any]]) -> list[float]:
    """Step time of each summary relative to the fastest, in percent (0 for the best)."""
    best = min(s["step_time_s"] for s in summaries)
    return [100.0 * (s["step_time_s"] - best) / best if best else 0.0 for s in summaries]


def _fixed_width(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Header, rule and rows, each column as wide as its widest cell: the first column
    left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[j]) for r in cells)) for j, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) if j == 0 else c.rjust(w)   # noqa: E731
                               for j, (c, w) in enumerate(zip(r, widths)))
    return [line(headers), line(["-" * w for w in widths]), *map(line, cells)]


def render_table(rows: Sequence[dict[str, Any]], names: Sequence[str],
                 extra: dict[str, Sequence[str]] | None = None) -> str:
    """A fixed-width table of summaries: step, compute, exposed comm, bubble, memory, fits,
    MFU and the difference to the best; `extra` adds columns (header -> cells)."""
    extra = extra or {}
    delta = deltas(rows)
    headers = ["plan", "step", "compute", "exp. comm", "bubble", "peak mem", "fits", "MFU",
               "vs best", *extra]
    cells = []
    for i, (s, name) in enumerate(zip(rows, names)):
        cells.append([name, fmt_s(s["step_time_s"]), fmt_s(s["compute_s"]),
                      fmt_s(s["exposed_comm_s"]), fmt_s(s["bubble_s"]),
                      f"{s['peak_memory_bytes'] / 1e9:.1f} GB",
                      "yes" if s["fits_in_memory"] else "NO", f"{100 * s['mfu']:.1f} %",
                      "best" if delta[i] == 0 else f"+{delta[i]:.1f} %",
                      *(col[i] for col in extra.values())])
    return "\n".join(_fixed_width(headers, cells))


def render_ops_table(rows: Sequence[dict[str, Any]], names: Sequence[str],
                     top: int = 8) -> str:
    """Each summary's `top` longest operations on its critical rank (their `ops`,
    simulator/op_breakdown.py, longest first), together: one column of device time per
    summary ("-" where a plan has no such operation), the operations ordered by their
    longest time in any summary, ties by stream and name."""
    if top < 1 or len(names) != len(rows):
        raise ValueError(f"render_ops_table: top {top} (>= 1), {len(names)} names for "
                         f"{len(rows)} summaries")
    times: dict[tuple[str, str], list[float | None]] = {}
    shown: set[tuple[str, str]] = set()
    for i, summary in enumerate(rows):
        ops = summary.get("ops") or []
        for op in ops:
            times.setdefault((op["stream"], op["op"]), [None] * len(rows))[i] = op["device_s"]
        shown.update((op["stream"], op["op"]) for op in ops[:top])
    if not shown:
        return ""
    ranked = sorted(shown, key=lambda k: (-max(t for t in times[k] if t is not None), k))
    cells = [[f"{op} ({stream})", *("-" if t is None else fmt_s(t) for t in times[stream, op])]
             for stream, op in ranked]
    title = (f"longest operations: each plan's {top} longest on its critical rank, device "
             "time (streams overlap; --json: every operation, with exposed time)")
    return "\n".join([title, *_fixed_width(["operation (stream)", *names], cells)])


def describe_candidate(c) -> str:
    """Mesh, batch split, memory options and strategies of a search candidate, one line."""
    mesh = f"tp {c.tp} x pp {c.pp} x dp {c.dp}" + (f" x cp {c.cp}" if c.cp > 1 else "")
    strat = ", ".join(f"{p} {s}" for p, s in c.sharding) if c.tp > 1 else "no TP"
    return (f"{mesh}; micro-batch {c.micro_batch} ({c.micro_batches} per step); "
            f"{'FSDP' if c.fsdp else 'DDP'}; recompute {c.recompute}; "
            f"SP {'on' if c.sequence_parallel else 'off'}; {strat}")
