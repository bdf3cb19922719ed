"""`validation references --row ID` (validation/reference_detail.py): one published run,
simulated with the score `references` gives it and the simulator's own table."""
from __future__ import annotations

import json

from validation.cli import main
from validation.reference_detail import row_detail
from validation.reference_rows import DEFAULT_CSV, load_rows, row_id
from validation.reference_scoring import RESIDUALS_PATH
from validation.references import simulate_row

# Megatron-LM 2020's GPT-2 2.0B on 2 A100s (TP 2): one micro-batch, a second to simulate.
ROW = "megatron2020-gpt2-2.0b-2"


def _bundled(wanted: str) -> dict:
    return next(r for r in load_rows(DEFAULT_CSV) if row_id(r) == wanted)


def test_the_row_scores_as_the_table_scores_it():
    detail = row_detail(None, ROW)
    scored = simulate_row(_bundled(ROW))
    assert {k: v for k, v in detail.items() if k != "summary"} == scored
    assert detail["summary"]["step_time_s"] == scored["simulated_step_s"]
    assert detail["summary"]["ops"]


def test_table_names_the_error_and_the_longest_operations(capsys):
    before = RESIDUALS_PATH.read_bytes()
    assert main(["references", "--row", ROW]) == 0
    out = capsys.readouterr().out.splitlines()
    error = simulate_row(_bundled(ROW))["error_pct"]
    assert out[0].startswith(f"row {ROW} (") and out[0].endswith(f"error {error:+.1f} %")
    assert out[1].startswith(f"plan {ROW}:")
    assert any(line.startswith("  longest operations (rank") for line in out)
    assert RESIDUALS_PATH.read_bytes() == before   # one row never rewrites the residuals


def test_json_is_the_row_with_its_summary(capsys):
    assert main(["references", "--row", ROW, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["id"] == ROW and "ops" in detail["summary"]


def test_an_unknown_id_is_one_line_and_exit_2(capsys):
    assert main(["references", "--row", "no-such-row"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--row: got 'no-such-row'" in err
    assert "training_runs.csv" in err
