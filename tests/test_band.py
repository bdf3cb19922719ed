"""The prediction band narrows to runs of the plan's model kind when enough exist."""
from __future__ import annotations

import json

import pytest

from simulator.band import PERCENTILE_MIN_ROWS, prediction_band


def _write(tmp_path, rows):
    path = tmp_path / "residuals.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def _row(i, kind, error):
    return {"id": f"r{i}", "hardware": "gb200", "framework": "megatron-core",
            "model_kind": kind, "error_pct": error}


def test_moe_plan_gets_the_moe_runs_band_when_ten_exist(tmp_path):
    # ten MoE runs all simulated 25 % too slow, three dense runs exact
    rows = [_row(i, "moe", 25.0) for i in range(PERCENTILE_MIN_ROWS)]
    rows += [_row(100 + i, "dense", 0.0) for i in range(3)]
    path = _write(tmp_path, rows)
    moe = prediction_band("gb200", "megatron-core", 1.0, path, model_kind="moe")
    assert moe["step_time_band"]["group"] == "hardware:gb200 framework:megatron-core model:moe"
    assert moe["step_time_band"]["n"] == PERCENTILE_MIN_ROWS
    assert moe["step_time_band_s"] == pytest.approx([0.8, 0.8])      # 1 / 1.25
    # too few dense runs of their own: the dense plan keeps every comparable run
    dense = prediction_band("gb200", "megatron-core", 1.0, path, model_kind="dense")
    assert dense["step_time_band"]["group"] == "hardware:gb200 framework:megatron-core"
    assert dense["step_time_band"]["n"] == PERCENTILE_MIN_ROWS + 3
    # no kind given: every comparable run, as before
    assert prediction_band("gb200", "megatron-core", 1.0, path)["step_time_band"]["n"] == 13


def test_the_residuals_file_carries_each_runs_model_kind(tmp_path):
    from validation.reference_scoring import residuals_document
    results = [{"id": f"m{i}", "source": "s", "hardware": "gb200", "framework": "megatron-core",
                "model": "moe", "error_pct": 25.0} for i in range(PERCENTILE_MIN_ROWS)]
    results.append({"id": "d", "source": "s", "hardware": "gb200",
                    "framework": "megatron-core", "model": "dense", "error_pct": 0.0})
    path = tmp_path / "residuals.json"
    path.write_text(json.dumps(residuals_document(results)))
    band = prediction_band("gb200", "megatron-core", 1.0, path, model_kind="moe")
    assert band["step_time_band"]["n"] == PERCENTILE_MIN_ROWS
    assert band["step_time_band"]["group"].endswith("model:moe")
