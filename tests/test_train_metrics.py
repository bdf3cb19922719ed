"""A trainer's training metrics on the logits (plan `"loss": {"metrics": N}`,
workloads/train_metrics.py): priced as N eager cross-entropy forwards per micro-batch,
outside the backward, under framework "generic" only.

Source of the llm-foundry rows' 2: llm-foundry 5e85bd62d ComposerMPTCausalLM's train
metrics [LanguageCrossEntropy(), LanguagePerplexity()], which Composer v0.17.2's
`_eval_train_metrics` updates after every micro-batch's backward.
"""
from __future__ import annotations

import pytest

from simulator import SimOptions, simulate
from topologies import build
from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict
from workloads import WorkloadError, plan_from_dict
from workloads.kernels import EAGER
from workloads.train_metrics import MAX_LOSS_METRICS, TRAIN_METRICS_OP

VOCAB, SEQ, MICRO = 50368, 2048, 2


def _plan(metrics: int | None = None, framework: str = "generic", **extra) -> dict:
    raw = {"name": "m", "model": "llama3-8b", "framework": framework,
           "mesh": {"dp": 8}, "fsdp": {"enabled": True},
           "training": {"global_batch": 32, "micro_batch": MICRO, "seq_len": SEQ,
                        "dtype": "bf16"}, **extra}
    if metrics is not None:
        raw["loss"] = {"metrics": metrics}
    return raw


def _tasks(raw: dict):
    result = simulate(plan_from_dict(raw), build("dgx-h100x1"), SimOptions())
    rank = result.summary["critical_rank"]
    rows = [t for t in result.trace.to_pylist() if t["rank"] == rank]
    return result, rows


def test_two_metrics_cost_two_eager_cross_entropy_forwards_per_micro_batch():
    base, base_rows = _tasks(_plan())
    with_metrics, rows = _tasks(_plan(2))
    metric = [t for t in rows if t["op"] == TRAIN_METRICS_OP]
    micro_batches = 32 // 8 // MICRO
    assert len(metric) == micro_batches
    assert {t["phase"] for t in metric} == {"forward"}
    vocab = plan_from_dict(_plan()).model.vocab_size
    passes = EAGER[2]["cross_entropy"][0]     # .float(), log_softmax, nll_loss over bf16 logits
    logits_bytes = MICRO * SEQ * vocab * 2
    for task in metric:
        assert task["bytes"] == pytest.approx(2 * passes * logits_bytes)
    # nothing else changes: the backward starts from the loss, not from the metrics
    others = [(t["op"], t["phase"], t["bytes"]) for t in rows if t["op"] != TRAIN_METRICS_OP]
    assert others == [(t["op"], t["phase"], t["bytes"]) for t in base_rows]
    added = sum(t["end_s"] - t["start_s"] for t in metric)
    assert with_metrics.summary["step_time_s"] == pytest.approx(
        base.summary["step_time_s"] + added, rel=0.02)
    assert with_metrics.summary["step_time_s"] > base.summary["step_time_s"]


def test_zero_metrics_is_the_default():
    _, rows = _tasks(_plan(0))
    assert not [t for t in rows if t["op"] == TRAIN_METRICS_OP]


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-lm", "torchtitan"])
def test_only_the_generic_profile_takes_metrics(framework):
    plain_dp = {"fsdp": {"enabled": False}}   # megatron-lm (2020-2021) has no FSDP
    with pytest.raises(WorkloadError, match=r"^loss\.metrics: got 2; .*generic"):
        plan_from_dict(_plan(2, framework, **plain_dp))
    plan_from_dict(_plan(0, framework, **plain_dp))     # zero is what they compute


@pytest.mark.parametrize("value", [-1, MAX_LOSS_METRICS + 1, "2", True, 1.5])
def test_a_bad_count_is_refused_naming_the_key(value):
    with pytest.raises(WorkloadError, match=r"^loss\.metrics: got "):
        plan_from_dict(_plan(value))


def test_the_llm_foundry_rows_carry_composers_two_metrics():
    rows = [r for r in load_rows(DEFAULT_CSV) if r["source_family"] == "llm-foundry"]
    assert len(rows) == 12
    for row in rows:
        assert plan_from_dict(plan_dict(row)).loss_metrics == 2, row["id"]
    others = [r for r in load_rows(DEFAULT_CSV) if r["source_family"] != "llm-foundry"]
    assert all(plan_from_dict(plan_dict(r)).loss_metrics == 0 for r in others[:40])
