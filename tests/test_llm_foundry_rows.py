"""MosaicML's MPT benchmark rows (source family `llm-foundry`): mosaicml/llm-foundry
scripts/train/benchmarking/README.md, table "H100 80GB BF16 (Large Scale, >= 128 GPUs)",
added at 5e85bd62d (2024-01-06) and unchanged since; settings from that commit's
scripts/train/benchmarking/sweep.py and submit_benchmarks.py."""
from __future__ import annotations

import pytest

from validation.reference_rows import (DEFAULT_CSV, load_excluded, load_rows, measured_step_s,
                                       plan_dict)
from workloads import plan_from_dict

ROWS = {r["id"]: r for r in load_rows(DEFAULT_CSV) if r["source_family"] == "llm-foundry"}
# The table's NumParams at SeqLen 2048 (its last column).
NUM_PARAMS = {"1b": 1_315_950_592, "3b": 2_651_837_440, "7b": 6_658_859_008,
              "70b": 64_862_437_376}


def test_the_flash_rows_are_in_and_the_triton_rows_listed_with_the_reason():
    assert sorted(ROWS) == sorted(f"lf-mpt-{size}-h100-{gpus}" for size in NUM_PARAMS
                                  for gpus in (128, 256, 512))
    excluded = {e["id"]: e["reason"] for e in load_excluded() if e["id"].startswith("lf-mpt")}
    assert sorted(excluded) == sorted(f"lf-mpt-{size}-h100-{gpus}" for size in ("13b", "30b")
                                      for gpus in (128, 256, 512))
    assert all("triton" in reason for reason in excluded.values())


def test_step_time_is_the_tables_global_batch_over_its_throughput():
    row = ROWS["lf-mpt-7b-h100-128"]   # 768 x 2048 tokens at 1,340,830 tokens/s (10,475 per GPU)
    plan = plan_from_dict(plan_dict(row))
    assert measured_step_s(row, plan) == pytest.approx(768 * 2048 / 1_340_830, rel=1e-4)


@pytest.mark.parametrize("size", sorted(NUM_PARAMS))
def test_model_dimensions_reproduce_the_tables_parameter_count(size):
    # ModelSpec counts the matrices, the norm weights and the (tied) embedding; MPT adds a
    # bias to each of its 4 projections (9 d) and to each LayerNorm (2 d per layer, d for
    # the final one), and a learned position table of max_seq_len x d (2048 here)
    model = plan_from_dict(plan_dict(ROWS[f"lf-mpt-{size}-h100-128"])).model
    d, layers = model.hidden_size, model.num_layers
    extra = layers * (9 * d + 2 * d) + d + 2048 * d
    assert model.total_params() + extra == NUM_PARAMS[size]


def test_rows_run_the_sweeps_fsdp_settings():
    for row_id, row in ROWS.items():
        plan = plan_from_dict(plan_dict(row))
        size = row_id.split("-")[2]
        # llm-foundry's flash_attn_fn unpads q, k, v and pads the output around
        # flash_attn_varlen_func; Composer updates the MPT's two train metrics per batch
        assert plan.fsdp and plan.fsdp_version == 1 and plan.attention == "flash_varlen"
        assert plan.loss_metrics == 2 and plan.optimizer == "for_loop"
        # SHARD_GRAD_OP for 1b and 3b keeps the gathered parameters to the backward
        assert plan.reshard_after_forward == (size not in ("1b", "3b")), row_id
        assert (plan.recompute == "full") == (size == "70b"), row_id
        assert plan.model.linear_bias and plan.model.position_embedding == "learned_absolute"
