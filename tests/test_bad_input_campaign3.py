"""Inputs a third adversarial campaign found escaping the bad-input contract: a vocabulary
smaller than the TP degree (a division by zero in the lowering), and `validation
calibrate -o` at an empty path, at /dev/null (the summary re-read the file written there)
or at a full device (a write error inside the spawned worker surfaced as its traceback)."""
from __future__ import annotations

import json

import pytest

from tests.test_fuzz_inputs import TINY_PLAN, call, holds_contract, write
from validation.cli import main as validation_main

# What `validation calibrate` rank 0 writes, reduced to the keys the summary reads.
CALIBRATED = {"name": "host", "gpu": {"bf16_tflops": 0.05, "hbm_GBps": 10.0, "profile": {}},
              "measured_collectives": {"all_reduce": {"2": {"latency_us": 50.0,
                                                           "busbw_GBps": 1.0}}}}


@pytest.mark.parametrize("vocab, tp", [(1, 2), (3, 4)])
def test_a_vocabulary_smaller_than_tp_is_refused(tmp_path, vocab, tp):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "mesh": {"tp": tp},
                                      "model": {**TINY_PLAN["model"], "vocab_size": vocab}})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith("error: model.vocab_size: got "), err


def test_a_vocabulary_of_tp_rows_runs(tmp_path):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": {**TINY_PLAN["model"],
                                                              "vocab_size": 2}})
    assert holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])[0] == 0


def test_calibrate_refuses_an_empty_output_path_before_benchmarking():
    status, _, err = call(["calibrate", "--quick", "-o", ""], validation_main)
    assert status == 2 and err.strip() == (
        "error: -o: got ''; allowed: a writable file path (the path is empty)")


@pytest.fixture
def fake_workers(monkeypatch):
    """torch.multiprocessing.spawn replaced by rank 0's write of a calibrated topology to
    the path it is given (the benchmarks themselves are tests/test_validation_e2e.py's)."""
    import torch.multiprocessing as mp

    def spawn(fn, args, nprocs, join):
        path = args[4]
        with open(path, "w") as fh:
            json.dump(CALIBRATED, fh)
    monkeypatch.setattr(mp, "spawn", spawn)


def test_calibrate_to_dev_null_prints_its_summary(fake_workers):
    status, out, err = call(["calibrate", "--quick", "-o", "/dev/null"], validation_main)
    assert status == 0, err
    assert out.startswith("wrote /dev/null in ") and "all_reduce x2" in out


def test_calibrate_to_a_full_device_is_one_line_exit_4(fake_workers):
    status, _, err = call(["calibrate", "--quick", "-o", "/dev/full"], validation_main)
    assert status == 4 and err.strip() == "error: cannot write /dev/full: No space left on device"


def test_calibrate_writes_the_topology_atomically_at_the_path(fake_workers, tmp_path):
    out = tmp_path / "host.json"
    status, _, err = call(["calibrate", "--quick", "-o", str(out)], validation_main)
    assert status == 0, err
    assert json.loads(out.read_text()) == CALIBRATED
    assert [p.name for p in tmp_path.iterdir()] == ["host.json"]   # no temporary left
