"""The published-runs table, its scoring and the prediction band built from it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulator.band import describe_band, prediction_band
from validation.reference_rows import (DEFAULT_CSV, cannot_express, load_excluded, load_rows,
                                       measured_step_s, parallelism_name, plan_dict)
from validation.reference_scoring import groups, residuals_document, score
from validation.references import format_table, run_references, unverified_fraction
from workloads import plan_from_dict


def _result(id_, source, hardware, error, framework="megatron-core", parallelism="dp"):
    return {"id": id_, "source": source, "hardware": hardware, "framework": framework,
            "parallelism": parallelism, "error_pct": error}


def test_table_has_the_rows_and_sources_the_claim_rests_on():
    rows = load_rows(DEFAULT_CSV)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) >= 120
    assert len({r["source_family"] for r in rows}) >= 5
    assert {"dgx-a100", "dgx-h100", "dgx-b200"} <= {r["topology"] for r in rows}
    # one configuration counts once: no two rows share every setting that shapes the run
    shape = ("model", "topology", "gpus", "tp", "pp", "cp", "dp", "global_batch_seqs",
             "seq_len", "dtype", "micro_batch", "recompute", "kernels", "overlap", "metric")
    keys = [tuple(r[c] for c in shape) + (r["value"],) for r in rows]
    assert len(keys) == len(set(keys))
    for row in rows:
        assert row["source"] and row["settings"], row["id"]
        assert float(row["value"]) > 0
    excluded = load_excluded()
    assert all(e["reason"] for e in excluded)
    assert len(excluded) <= 0.10 * (len(rows) + len(excluded))
    # the README states the count and share the files give
    in_scope = len(rows) + len(excluded)
    readme = (Path(__file__).parents[1] / "validation" / "README.md").read_text()
    stated = (f"{len(excluded)} rows ({100 * len(excluded) / in_scope:.1f} % of the "
              f"{in_scope} in scope")
    assert stated in " ".join(readme.split()), stated


def test_every_row_is_a_valid_plan_with_its_mesh():
    for row in load_rows(DEFAULT_CSV):
        if cannot_express(row):   # listed with the reason (tests/test_moe_rows.py)
            continue
        plan = plan_from_dict(plan_dict(row))
        mesh = plan.mesh
        assert (mesh.dp, mesh.tp, mesh.pp, mesh.cp) == tuple(
            int(row[k]) for k in ("dp", "tp", "pp", "cp")), row["id"]
        assert mesh.dp * mesh.tp * mesh.pp * mesh.cp == int(row["gpus"]), row["id"]
        assert plan.framework == row["framework"]
        assert plan.async_tp == ("async_tp" in row["overlap"]), row["id"]


def test_metrics_become_step_times_with_the_sources_flop_counts():
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    row = rows["titan-8b-fsdp8"]      # 5,762 tokens/s/GPU, 16 x 8192 tokens on 8 GPUs
    plan = plan_from_dict(plan_dict(row))
    assert measured_step_s(row, plan) == pytest.approx(16 * 8192 / (5762 * 8))
    row = rows["narayanan-gpt-1.7b"]  # 137 TFLOP/s/GPU on 32 GPUs, Narayanan's formula
    plan = plan_from_dict(plan_dict(row))
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert measured_step_s(row, plan) == pytest.approx(flops / (137e12 * 32))
    assert parallelism_name(rows["dgxc-llama3-70b-bf16-64"]) == "tp+cp+pp+dp"


def test_groups_bias_and_equal_source_weighting():
    results = [_result("a", "s1", "h100", 10.0), _result("b", "s1", "h100", -20.0),
               _result("c", "s2", "b200", 4.0, framework="torchtitan", parallelism="tp+dp")]
    report = score(results)
    assert report["n"] == 3
    assert report["mape_pct"] == pytest.approx(34 / 3)
    assert report["bias_pct"] == pytest.approx(-2.0)
    assert report["mape_equal_sources_pct"] == pytest.approx((15.0 + 4.0) / 2)
    g = groups(results)
    assert g["source:s1"] == {"n": 2, "mape_pct": 15.0, "bias_pct": -5.0}
    assert g["hardware:b200"]["n"] == 1 and g["parallelism:tp+dp"]["n"] == 1
    assert set(g) == {"source:s1", "source:s2", "hardware:h100", "hardware:b200",
                      "framework:megatron-core", "framework:torchtitan", "parallelism:dp",
                      "parallelism:tp+dp"}


def test_a_sources_predictions_do_not_depend_on_its_measurements(tmp_path):
    """No constant is fitted to the runs: scaling one source's measured values changes its
    errors and nothing else, and leaves every prediction where it was."""
    from validation.references import run_references

    wanted = ("megatron2020-gpt2-1.2b-1", "titan-b200-8b-bf16", "dgxc-llama3-8b-bf16-8")
    rows = [r for r in load_rows(DEFAULT_CSV) if r["id"] in wanted]
    assert len({r["source_family"] for r in rows}) == 3

    def write(path, scale_source, factor):
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            for r in rows:
                value = float(r["value"]) * (factor if r["source_family"] == scale_source else 1)
                w.writerow({**r, "value": repr(value)})
        return path

    base = run_references(write(tmp_path / "a.csv", None, 1.0), jobs=1)
    moved = run_references(write(tmp_path / "b.csv", "torchtitan", 1.3), jobs=1)
    for a, b in zip(base["rows"], moved["rows"]):
        assert a["simulated_step_s"] == b["simulated_step_s"], a["id"]
        if a["source"] == "torchtitan":
            assert b["measured_step_s"] == pytest.approx(a["measured_step_s"] / 1.3)
        else:
            assert b["error_pct"] == a["error_pct"]


def test_residuals_file_and_band(tmp_path):
    results = [_result(f"r{i}", "s", "h100", e) for i, e in enumerate((-10.0, 0.0, 10.0))]
    results.append(_result("t", "s", "h100-hbm2e", 25.0, framework="torchtitan"))
    path = tmp_path / "residuals.json"
    path.write_text(json.dumps(residuals_document(results)))
    band = prediction_band("h100", "generic", 2.0, path)
    # measured / simulated - 1 = 1 / (1 + e) - 1: +11.1 % .. -9.1 % (fewer than 10: the range)
    assert band["step_time_band"]["n"] == 3
    assert band["step_time_band_s"] == pytest.approx([2.0 / 1.1, 2.0 / 0.9])
    assert "n = 3" in describe_band(band) and "-9 % .. +11 %" in describe_band(band)
    named = prediction_band("h100-hbm2e", "torchtitan", 1.0, path)
    assert named["step_time_band"]["group"] == "hardware:h100-hbm2e framework:torchtitan"
    assert named["step_time_band_s"] == pytest.approx([0.8, 0.8])
    none = prediction_band("h100", "torchtitan", 1.0, path)
    assert none["step_time_band_s"] is None and none["step_time_band"]["n"] == 0
    assert describe_band(none).startswith("(no published runs of this kind")


def test_band_takes_the_central_80_percent_of_ten_or_more_runs(tmp_path):
    results = [_result(f"r{i}", "s", "a100", e) for i, e in
               enumerate((-50.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100.0))]
    path = tmp_path / "residuals.json"
    path.write_text(json.dumps(residuals_document(results)))
    band = prediction_band("a100", "generic", 1.0, path)["step_time_band"]
    assert band["n"] == 11 and band["low_pct"] == pytest.approx(0.0)
    assert band["high_pct"] == pytest.approx(0.0)


def test_run_json_carries_the_band(capsys):
    from simulator.cli import main

    assert main(["run", "--topo", "dgx-h100x4", "--plan", "col.json", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    band = out["step_time_band"]
    # col.json is a dense model under the generic profile: H100 runs of dense models
    assert band["group"] == "hardware:h100 model:dense" and band["n"] > 0
    low, high = out["step_time_band_s"]
    assert low <= high and low < out["step_time_s"] * 2


def test_fp8_param_gather_column_sets_the_plan_key_or_leaves_the_default():
    # NeMo-Framework-Launcher@24.07's pre-training YAMLs keep no fp8_params: those rows
    # gather bf16 weights; a blank cell leaves the megatron-core profile's FP8 default
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    stated = plan_from_dict(plan_dict(rows["nemo-gpt3-20b-64"]))
    assert rows["nemo-gpt3-20b-64"]["fp8_param_gather"] == "false"
    assert stated.fp8_param_gather is False
    default = rows["mb-llama3-8b-b200-fp8-8"]
    assert default["fp8_param_gather"] == "" and default["dtype"] == "fp8_cs"
    assert plan_from_dict(plan_dict(default)).fp8_param_gather is True


def test_published_profiles_are_read_and_compared_with_the_simulated_split():
    from validation.reference_scoring import format_profiles, profile_score
    from validation.references import _profile
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    # NVIDIA-NeMo/Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md
    # (067f987df), 'Measured Evidence': Nsight A/B of Qwen3 30B-A3B on 16 H100, rank 0
    off = rows["mbv-qwen3-30b-h100-bf16-16-hybridep"]
    on = rows["mbv-qwen3-30b-h100-bf16-16-hybridep-a2a"]
    assert (float(off["measured_busy_s"]), float(off["measured_comm_hidden_pct"])) == (22.821, 0.11)
    assert (float(on["measured_busy_s"]), float(on["measured_comm_hidden_pct"])) == (21.221, 36.55)
    assert sum(1 for r in rows.values() if r["measured_busy_s"]) == 2
    # busy = compute union + exposed communication; hidden = the overlapped share of comm
    summary = {"compute_s": 10.0, "comm_s": 4.0, "exposed_comm_s": 1.0}
    got = _profile(on, summary)
    assert got["simulated_busy_s"] == pytest.approx(11.0)
    assert got["simulated_comm_hidden_pct"] == pytest.approx(75.0)
    assert _profile(rows["titan-8b-fsdp8"], summary) == {}
    with pytest.raises(ValueError, match="measured_comm_hidden_pct"):
        _profile({**on, "measured_comm_hidden_pct": ""}, summary)
    result = {"id": on["id"], **got}
    (entry,) = profile_score([result, {"id": "no-profile"}])
    assert entry["busy_error_pct"] == pytest.approx(100.0 * (11.0 - 21.221) / 21.221)
    assert "| mbv-qwen3-30b-h100-bf16-16-hybridep-a2a | 21.221 s | 11.000 s |" in \
        format_profiles([entry])


def test_rows_simulated_as_not_fitting_are_listed():
    from validation.reference_scoring import memory_score
    results = [{"id": "b", "fits_in_memory": False}, {"id": "a", "fits_in_memory": False},
               {"id": "c", "fits_in_memory": True}, {"id": "d", "fits_in_memory": None}]
    # every row trained, so a row simulated as not fitting is a memory overestimate
    assert memory_score(results)["trained_but_not_fitting"] == ["a", "b"]


def test_rows_scored_on_an_assumed_setting_are_named_and_counted():
    # A row whose settings call one of its training settings an assumption names it in the
    # `assumed` column, and only such rows do: the column is what the report counts.
    rows = load_rows(DEFAULT_CSV)
    for row in rows:
        says = "(assumption)" in row["settings"] or "assumed)" in row["settings"]
        assert says == bool(row.get("assumed")), row["id"]
    assumed = [r["id"] for r in rows if r.get("assumed")]
    assert "llama3-405b-8k" in assumed and "nemo-longseq-llama2-7b-4k" in assumed
    # the excluded rows and the table's unverified ones count against the rows in scope
    assert unverified_fraction(90, 10, 5) == pytest.approx(15 / 100)
    assert unverified_fraction(0, 0, 0) == 0.0
    report = {"rows": [], "skipped": [], "inexpressible": [], "n": 0, "memory": {"n": 0},
              "profiles": [], "excluded": [{"id": "x", "reason": "r"}],
              "assumed": [{"id": "row-a", "assumed": "micro_batch 1: not published"}],
              "unverified_fraction": 0.25, "scope": "table and excluded list"}
    text = format_table(report)
    assert "row-a: micro_batch 1: not published" in text
    assert "unverified: 25.0 % of the rows in scope" in text


def test_a_csv_run_counts_its_assumed_and_inexpressible_rows_once(tmp_path):
    # One scored row that assumes a setting and one that cannot be expressed and assumes
    # one too: 2 of the CSV's 2 rows unverified, each counted once; no excluded list.
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    scored = dict(rows["mbv-qwen3-30b-gb300-mxfp8-32"], assumed="micro_batch: a test")
    blocked = dict(scored, id="blocked", model="no-such-model", assumed="micro_batch: a test")
    path = tmp_path / "two.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(scored))
        writer.writeheader()
        writer.writerows([scored, blocked])
    report = run_references(path, jobs=1)
    assert [r["id"] for r in report["rows"]] == [scored["id"]]
    assert [r["id"] for r in report["inexpressible"]] == ["blocked"]
    assert report["excluded"] == [] and len(report["assumed"]) == 2
    assert report["unverified_fraction"] == pytest.approx(1.0)
    assert "of this CSV's rows" in format_table(report)
