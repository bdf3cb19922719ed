"""The mixture-of-experts and Blackwell rows of the references table (Megatron-Bridge
performance summaries for DGX H100, DGX B200 and GB200 NVL72; torchtitan's MXFP8 table)."""
from __future__ import annotations

import csv
from collections import Counter

import pytest

from validation.errors import ValidationError
from validation.reference_rows import (DEFAULT_CSV, cannot_express, config_key, hardware_name,
                                       load_excluded, load_rows, model_kind, plan_dict,
                                       topology_for)
from validation.reference_scoring import CLASSES, groups, row_class

# The rows of the table before the MoE and Blackwell rows were added (every other row of a
# Blackwell GPU or an MoE model is one of them).
EARLIER_BLACKWELL = {"mb-llama3-8b-b200-fp8-8", "mb-llama31-405b-b200-fp8-128",
                     "titan-b200-8b-bf16", "titan-b200-8b-fp8tw", "titan-b200-8b-fp8rw"}


def _rows():
    return load_rows(DEFAULT_CSV)


def _class(row):
    return row_class({"model": model_kind(row), "hardware": hardware_name(row)})


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_moe_and_blackwell_rows_meet_the_counts():
    rows = _rows()
    added = [r for r in rows if (model_kind(r) == "moe" or hardware_name(r) in ("b200", "gb200"))
             and r["id"] not in EARLIER_BLACKWELL]
    assert len(added) >= 40
    assert len({config_key(r) for r in added}) == len(added)   # distinct configurations
    per_class = Counter(_class(r) for r in rows)
    for name in ("moe-hopper", "moe-blackwell", "dense-b200", "dense-gb200", "dense-gb300"):
        assert per_class[name] >= 8, (name, per_class)
    for row in added:
        assert row["source"] and row["settings"], row["id"]
        if row["source_family"] == "nemo-perf-summary":
            # every unprinted setting names the recipe file and commit it was read from
            assert ("Megatron-Bridge@" in row["settings"] or "NVIDIA/NeMo@" in row["settings"]) \
                and row["release"], row["id"]
        if model_kind(row) == "moe":
            assert row["ep"] and row["moe_dispatcher"] and row["force_balanced"], row["id"]


def test_excluded_rows_have_reasons_and_stay_under_a_tenth():
    rows, excluded = _rows(), load_excluded()
    assert all(e["id"] and e["reason"] for e in excluded)
    assert len(excluded) <= 0.10 * (len(rows) + len(excluded))
    ids = {e["id"] for e in excluded}
    assert {"MB-171", "MB-149"} <= ids     # a precision the plan lacks; a recipe contradiction


def test_a_configuration_repeated_across_releases_is_refused(tmp_path):
    rows = [r for r in _rows() if r["id"] == "mb-llama3-70b-gb200-fp8-64"]
    assert len(rows) == 1
    again = dict(rows[0], id="mb-llama3-70b-gb200-fp8-64-old", release="26.02", value="4040")
    with pytest.raises(ValidationError) as err:
        load_rows(_write(tmp_path / "repeat.csv", rows + [again]))
    assert "mb-llama3-70b-gb200-fp8-64" in str(err.value) and "newest release" in str(err.value)
    # a different global batch is a different configuration
    other = dict(again, global_batch_seqs="128")
    assert len(load_rows(_write(tmp_path / "two.csv", rows + [other]))) == 2


def test_a_patch_release_runs_its_own_recipe_not_the_columns_it_copied():
    """26.02.01 is Megatron-Bridge v0.3.1 (docs/versions1.json), whose H100 Qwen3-30B FP8
    config is EP 16, PP 1, HybridEP, no a2a overlap (PR 2477, cherry-picked as f29a269f8
    after v0.3.0); its table row prints the 26.02 row's PP 2 / VP 12 / EP 8. Its 9058
    tokens/s/GPU is a release repeat of the EP 16 row, named in that row's notes."""
    rows = {r["id"]: r for r in _rows()}
    assert "mb-qwen3-30b-h100-fp8-16-pp2" not in rows
    ep16 = rows["mb-qwen3-30b-h100-fp8-16"]
    assert (ep16["pp"], ep16["ep"], ep16["moe_dispatcher"]) == ("1", "16", "hybridep")
    assert "26.02.01 (9058" in ep16["notes"] and "f29a269f8" in ep16["notes"]
    assert not [r for r in rows.values() if r["release"] == "26.02.01"
                and r["model"] == "qwen3-30b-a3b" and r["topology"] == "dgx-h100"]


@pytest.mark.parametrize("column, value", [("moe_dispatcher", "flex"), ("dtype", "fp4"),
                                           ("ep", "8x"), ("force_balanced", "yes"),
                                           ("rack_gpus", "0"), ("capacity_factor", "-1")])
def test_new_columns_are_typed(tmp_path, column, value):
    row = dict(next(r for r in _rows() if r["id"] == "mb-qwen3-30b-gb200-mxfp8-8"))
    row[column] = value
    with pytest.raises(ValidationError) as err:
        load_rows(_write(tmp_path / "bad.csv", [row]))
    assert column in str(err.value.field) and value in str(err.value)


def test_moe_columns_become_plan_keys_and_racks_become_domains():
    rows = {r["id"]: r for r in _rows()}
    row = rows["mb-qwen3-235b-h100-fp8-256"]          # TP 2 with expert TP 1, EP 32
    raw = plan_dict(row)
    assert raw["mesh"]["ep"] == 32 and raw["moe"]["etp"] == 1
    assert "dispatcher" not in raw["moe"]              # alltoall is the default
    row = rows["mb-qwen3-30b-gb200-mxfp8-8"]
    assert plan_dict(row)["moe"]["dispatcher"] == "deepep"       # HybridEP's family
    assert plan_dict(row)["moe"]["flex_backend"] == "hybridep"   # its kernels' rates
    assert "flex_backend" not in plan_dict(rows["mb-dsv3-h100-fp8-1024"])["moe"]  # DeepEP
    drop = plan_dict(rows["mb-qwen3-30b-b200-fp8-8-tokendrop"])["moe"]
    assert drop["capacity_factor"] == 1.0 and drop["pad_to_capacity"] is True
    topo = topology_for(rows["mb-llama31-405b-gb200-fp8-256"])   # 4 racks x 64 GPUs used
    assert topo.world_size == 256
    assert topo.device(0).name == "gb200"
    small = topology_for(rows["mb-qwen3-30b-gb200-mxfp8-8"])
    assert small.world_size == 8


def test_rows_the_code_cannot_express_say_why():
    reasons = {r["id"]: cannot_express(r) for r in _rows()}
    assert reasons["titan-8b-fsdp8"] is None
    for id_, reason in reasons.items():
        assert reason is None or reason.startswith("cannot express: ") and len(reason) > 30, id_


def _missing_features() -> list[str]:
    """The simulator features the MoE/Blackwell rows need that this checkout lacks."""
    from workloads import MODEL_PRESETS
    from workloads.plan import DTYPES

    missing = [f"training.dtype {d}" for d in ("mxfp8", "nvfp4") if d not in DTYPES]
    if not getattr(MODEL_PRESETS.get("deepseek-v3"), "kv_lora_rank", 0):
        missing.append("multi-head latent attention (deepseek-v3)")
    if "gpt-oss-120b" not in MODEL_PRESETS:
        missing.append("gpt-oss-120b")
    try:
        from workloads.moe_options import MOE_KEYS
    except ImportError:
        MOE_KEYS = ()
    missing += [f"moe.{k}" for k in ("dispatcher", "etp", "capacity_factor", "force_balance")
                if k not in MOE_KEYS]
    return missing


def test_at_most_a_tenth_of_the_rows_cannot_be_expressed():
    """Run after the model, MoE and Blackwell work is merged; skipped (naming what is
    missing) on a checkout without it."""
    missing = _missing_features()
    if missing:
        pytest.skip("features not in this checkout: " + ", ".join(missing))
    rows = _rows()
    blocked = {r["id"]: cannot_express(r) for r in rows}
    blocked = {k: v for k, v in blocked.items() if v}
    assert len(blocked) <= 0.10 * len(rows), blocked


def test_groups_cross_model_kind_and_gpu():
    results = [{"id": "a", "source": "s", "hardware": "gb200", "framework": "megatron-core",
                "parallelism": "pp+dp", "model": "moe", "error_pct": 10.0},
               {"id": "b", "source": "s", "hardware": "b200", "framework": "megatron-core",
                "parallelism": "dp", "model": "dense", "error_pct": -4.0},
               {"id": "c", "source": "s", "hardware": "a100", "framework": "megatron-core",
                "parallelism": "dp", "model": "dense", "error_pct": 2.0}]
    g = groups(results)
    assert g["class:moe-blackwell"] == {"n": 1, "mape_pct": 10.0, "bias_pct": 10.0}
    assert g["class:dense-b200"]["bias_pct"] == -4.0
    assert g["model:dense"]["n"] == 2 and "class:dense-a100" not in g
    assert set(CLASSES.values()) == {"moe-hopper", "moe-blackwell", "dense-b200", "dense-gb200",
                                     "dense-gb300"}


def test_the_runs_bf16_layers_reach_the_plan_or_are_reported():
    from dataclasses import fields

    from workloads.plan import Training

    row = dict(next(r for r in _rows() if r["id"] == "mb-llama3-8b-gb200-mxfp8-8"))
    two = dict(row, bf16_layers="2")
    if "bf16_layers" in {f.name for f in fields(Training)}:
        assert plan_dict(two)["training"]["bf16_layers"] == [2, 2]
        assert plan_dict(row)["training"]["bf16_layers"] == [0, 0]
        assert cannot_express(two) is None
    else:   # no plan key: only a recipe that keeps as many layers is priced
        reason = cannot_express(two)
        assert reason and "BF16" in reason


def test_rows_citing_a_current_scaling_recipe_run_it():
    """A row whose settings cite Megatron-Bridge's fp8_cs precision (current scaling) is
    priced with that recipe, not delayed scaling's (the 25.09 rows, whose table names no
    recipe, state why they keep the per-tensor default)."""
    cited = [r for r in _rows() if "fp8_cs with first_last_layers_bf16" in r["settings"]]
    assert len(cited) >= 4
    assert all(r["dtype"] == "fp8_cs" for r in cited), [r["id"] for r in cited
                                                        if r["dtype"] != "fp8_cs"]
