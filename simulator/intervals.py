"""Interval arithmetic over a rank's trace rows: merged unions, their lengths and
overlaps, and how much of each interval lies outside a union (simulator/summary.py's
breakdown of the step, simulator/op_breakdown.py's exposed time per operation)."""
from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[float, float]]:
    """Merge intervals into disjoint, sorted ones (empty ones dropped).

    Sorted by (start, end), an interval opens a new merged one when it starts after the
    furthest end so far, and a merged interval ends at the furthest end of its members;
    vectorised, since a rank's trace holds up to a million rows.
    """
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return []
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    opens = np.empty(len(starts), dtype=bool)
    opens[0] = True
    opens[1:] = starts[1:] > np.maximum.accumulate(ends)[:-1]
    first = np.flatnonzero(opens)
    return list(zip(starts[first].tolist(), np.maximum.reduceat(ends, first).tolist()))


def total_length(intervals: list[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in intervals)


def overlap_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two disjoint sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def uncovered_s(starts: np.ndarray, ends: np.ndarray,
                merged: list[tuple[float, float]]) -> np.ndarray:
    """Per interval (starts[i], ends[i]), its length outside `merged` (disjoint, sorted:
    `union`'s result).

    covered(x), the union's length before x, is a running sum read at x's place among the
    union's starts; an interval's covered part is covered(end) - covered(start)."""
    lengths = ends - starts
    if not merged:
        return lengths
    bounds = np.asarray(merged)
    u_start, u_end = bounds[:, 0], bounds[:, 1]
    before = np.concatenate(([0.0], np.cumsum(u_end - u_start)))

    def covered(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(u_start, x, side="right")   # union intervals starting <= x
        last = np.maximum(i - 1, 0)
        inside = np.clip(x - u_start[last], 0.0, u_end[last] - u_start[last])
        return np.where(i > 0, before[last] + inside, 0.0)

    # two running sums subtracted: a hidden interval may come out a rounding error above 0
    return np.maximum(lengths - (covered(ends) - covered(starts)), 0.0)
