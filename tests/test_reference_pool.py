"""`validation references`' worker pool: the table's order whatever the workers do, and a
lost worker costs a rebuilt pool, not the run. A one-pool run of the full table once lost a
worker (the kernel's OOM killer, 23 GB) after an hour, and every row with it."""
from __future__ import annotations

import os
from pathlib import Path

from validation.references import _lost, map_in_workers


def square_or_die_once(item: tuple[int, str]) -> int:
    """item = (n, marker path): the first worker to reach n == 3 dies without a word (as a
    worker killed for memory does); every later call returns n * n."""
    n, marker = item
    if n == 3 and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return n * n


def die_on_seven(n: int) -> int:
    """A row that kills every worker that takes it, alone or not."""
    if n == 7:
        os._exit(1)
    return n * n


def test_a_lost_worker_costs_a_rebuilt_pool_and_keeps_the_order(tmp_path):
    marker = str(tmp_path / "died")
    items = [(n, marker) for n in range(12)]
    assert map_in_workers(square_or_die_once, items, 2, lambda item: None) == [
        n * n for n in range(12)]
    assert os.path.exists(marker)   # a worker did die


def test_only_a_row_that_kills_its_worker_alone_is_lost():
    got = map_in_workers(die_on_seven, list(range(10)), 2, lambda n: ("lost", n))
    assert got == [n * n for n in range(7)] + [("lost", 7), 64, 81]


def test_a_lost_row_is_reported_as_not_simulated():
    kind, detail = _lost({"id": "some-row"})
    assert kind == "skipped" and detail["id"] == "some-row" and "died" in detail["reason"]
