"""The fast paths of the simulator's speed work give what the plain code gave.

The interval union of the summary is vectorised (simulator/summary.py); here it is checked
against the plain merge it replaced, on random intervals with ties, nesting and empty
ones. gc_paused (workloads/program.py) must leave the collector as it found it, also
when the block raises.
"""
from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from simulator.intervals import union as _union
from workloads.program import gc_paused


def _plain_union(starts, ends):
    """The merge of sorted (start, end) pairs, one at a time (the code _union replaced)."""
    merged = []
    for s, e in sorted(zip(starts.tolist(), ends.tolist())):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def test_union_matches_the_plain_merge():
    rng = random.Random(7)
    for _ in range(2000):
        k = rng.randint(0, 25)
        grid = rng.choice([3, 10, 1000])     # a small grid makes ties and touching ends
        starts = np.array([rng.randint(0, grid) / 7 for _ in range(k)], dtype=float)
        ends = np.array([rng.randint(0, grid) / 7 for _ in range(k)], dtype=float)
        assert _union(starts, ends) == _plain_union(starts, ends)


def test_union_merges_touching_and_nested_intervals():
    starts = np.array([0.0, 1.0, 0.5, 3.0, 2.0, 5.0])
    ends = np.array([1.0, 2.0, 0.7, 4.0, 2.0, 4.0])   # (2, 2) and (5, 4) are empty
    assert _union(starts, ends) == [(0.0, 2.0), (3.0, 4.0)]
    assert _union(np.array([]), np.array([])) == []


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()    # it was off before: it stays off
    finally:
        gc.enable()
