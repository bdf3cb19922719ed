"""`validation references`' worker pool: the table's order whatever the workers do, and a
lost worker costs a rebuilt pool, not the run. A one-pool run of the full table once lost a
worker (the kernel's OOM killer, 23 GB) after an hour, and every row with it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from validation.reference_rows import DEFAULT_CSV, load_rows, row_id
from validation.references import _lost, map_in_workers, submission_order


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


def append_to(item: tuple[int, str]) -> int:
    """item = (n, log path): notes n in the log as the worker takes it."""
    n, log = item
    with open(log, "a") as fh:
        fh.write(f"{n}\n")
    return n * n


def test_items_go_to_the_workers_in_the_order_given_and_come_back_in_theirs(tmp_path):
    log = str(tmp_path / "taken")
    items = [(n, log) for n in range(6)]
    got = map_in_workers(append_to, items, 1, lambda item: None, order=[4, 2, 0, 5, 1, 3])
    assert got == [n * n for n in range(6)]
    assert Path(log).read_text().split() == ["4", "2", "0", "5", "1", "3"]


def test_the_order_given_must_name_every_item_once():
    with pytest.raises(ValueError, match="permutation"):
        map_in_workers(append_to, [(0, os.devnull), (1, os.devnull)], 1, lambda item: None,
                       order=[0, 0])


def test_the_largest_estimated_row_goes_first_and_the_rest_keep_the_table_order():
    rows = {row_id(r): r for r in load_rows(DEFAULT_CSV)}
    small, large, largest = (rows[i] for i in ("lf-mpt-1b-h100-128", "narayanan-gpt-1008b",
                                               "gcp-llama3.1-405b-b200-fp8-224"))
    # estimated simulated tasks (workloads/budget.py): the Google 405B row (1,008
    # micro-batches a stage x 14 stages) 15.5 million, the 1T row (64 stages x 512) 13.1
    # million, the MPT 1B row a few thousand
    assert submission_order([small, large, largest, small]) == [2, 0, 1, 3]
    assert submission_order([large, small]) == [0, 1]
    assert submission_order([small, dict(small)]) == [0, 1]     # ties: the table's first
    assert submission_order([]) == []


def test_an_unplannable_row_counts_no_work():
    rows = {row_id(r): r for r in load_rows(DEFAULT_CSV)}
    small = rows["lf-mpt-1b-h100-128"]
    unplannable = {**small, "tp": "3"}    # 128 GPUs do not divide into TP 3
    assert submission_order([unplannable, small]) == [1, 0]
