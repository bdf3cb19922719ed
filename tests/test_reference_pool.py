"""`validation references`' worker pool: the table's order whatever the workers do, and a
lost worker costs a rebuilt pool, not the run (a one-pool run of the full table once lost
a worker near its end after an hour, and every row with it)."""
from __future__ import annotations

import os
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from validation.references import map_in_workers


def square_or_die_once(item: tuple[int, str]) -> int:
    """item = (n, marker path): the first worker to reach n == 3 dies without a word (as a
    worker killed for memory does); every later call returns n * n."""
    n, marker = item
    if n == 3 and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return n * n


def always_die(item: int) -> int:
    """A row that kills every worker that takes it."""
    os._exit(1)


def test_a_lost_worker_costs_a_rebuilt_pool_and_keeps_the_order(tmp_path):
    marker = str(tmp_path / "died")
    items = [(n, marker) for n in range(12)]
    assert map_in_workers(square_or_die_once, items, jobs=2) == [n * n for n in range(12)]
    assert os.path.exists(marker)   # a worker did die


def test_a_row_that_always_kills_its_worker_fails_the_run():
    with pytest.raises(BrokenProcessPool):
        map_in_workers(always_die, [1, 2], jobs=2)
