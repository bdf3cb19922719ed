"""Megatron-Core's vocab-parallel cross-entropy, fused or not: `loss.kernels` "fused"
(--cross-entropy-loss-fusion, megatron/core/fusions/fused_cross_entropy.py) or "unfused"
(its default, megatron/core/tensor_parallel/cross_entropy.py: torch ops one at a time on
the fp32 copy, three TP all-reduces), read from and written to its job configs."""
from __future__ import annotations

import pytest

from workloads import WorkloadError, plan_from_dict, resolve
from workloads.jobs import JobConfigError, read_megatron, write_megatron
from workloads.kernels import UNFUSED_CE
from workloads.lowering import lower

from conftest import small_plan
from megatron_flags import LLAMA3_8B_FLAGS
from test_jobs_megatron import BRIDGE, _bridge

LLAMA = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
         "num_key_value_heads": 16, "intermediate_size": 2816, "vocab_size": 32000}
TRAINING = {"global_batch": 2, "micro_batch": 1, "seq_len": 1024}


def _loss_tasks(loss_kernels: str):
    plan = resolve(plan_from_dict(small_plan(
        framework="megatron-core", model=LLAMA, mesh={"dp": 1, "tp": 2},
        sharding={"sequence_parallel": True}, training=TRAINING,
        loss={"kernels": loss_kernels})), 2)
    tasks = lower(plan, gpu="h100").stages[0]
    forward = [t for t in tasks if t.op == "cross_entropy" and t.phase == "forward"
               and t.microbatch == 0]
    reduces = [t for t in tasks if t.label.startswith("loss.") and t.op == "all_reduce"
               and t.microbatch == 0]
    return forward, reduces


def test_the_unfused_loss_runs_megatrons_torch_ops_and_three_all_reduces():
    """38 B per bf16 logit in 6 kernels (cast, max, sub_, exp, sum, div_) against the
    fused kernel's read and write; max, predicted logit and sum of exponentials
    all-reduced one by one (3), where the fused path sends the last two together (2)."""
    (unfused,), unfused_reduces = _loss_tasks("unfused")
    (fused,), fused_reduces = _loss_tasks("fused")
    logits_bytes = 1024 * 32000 / 2 * 2                       # tokens x vocab / TP, bf16
    assert unfused.bytes == pytest.approx(UNFUSED_CE[2][0] / 2 * logits_bytes)
    assert unfused.kernels == UNFUSED_CE[2][2] and fused.kernels == 1
    assert unfused.bytes > 4 * fused.bytes
    assert len(unfused_reduces) == 3 and len(fused_reduces) == 2
    assert sum(t.bytes for t in unfused_reduces) == sum(t.bytes for t in fused_reduces)


@pytest.mark.parametrize("framework,kernels,allowed", [
    ("megatron-core", "eager", "fused or unfused"),
    ("megatron-lm", "fused", "unfused"),
    ("generic", "unfused", "fused or eager"),
])
def test_each_framework_takes_the_loss_kernels_its_code_runs(framework, kernels, allowed):
    with pytest.raises(WorkloadError, match=f"allowed: {allowed} under framework"):
        plan_from_dict(small_plan(framework=framework, model=LLAMA, mesh={"dp": 1},
                                  training=TRAINING, loss={"kernels": kernels}))


def test_megatron_flags_run_the_unfused_loss_unless_they_ask_for_the_fusion():
    without = read_megatron(LLAMA3_8B_FLAGS.format(extra=""))
    with_flag = read_megatron(LLAMA3_8B_FLAGS.format(extra="--cross-entropy-loss-fusion"))
    te_impl = read_megatron(LLAMA3_8B_FLAGS.format(
        extra="--cross-entropy-loss-fusion --cross-entropy-fusion-impl te"))
    assert plan_from_dict(without.plan).loss_kernels == "unfused"
    assert plan_from_dict(with_flag.plan).loss_kernels == "fused"
    assert plan_from_dict(te_impl.plan).loss_kernels == "fused"
    with pytest.raises(JobConfigError, match="--cross-entropy-fusion-impl"):
        read_megatron(LLAMA3_8B_FLAGS.format(extra="--cross-entropy-fusion-impl apex"))


def test_a_bridge_yaml_fuses_the_loss_unless_it_turns_the_fusion_off():
    """Megatron-Bridge's GPTModelProvider defaults cross_entropy_loss_fusion to True."""
    assert plan_from_dict(_bridge().plan).loss_kernels == "fused"
    off = BRIDGE.format(extra="").replace("model:\n", "model:\n  cross_entropy_loss_fusion: "
                                          "false\n", 1)
    assert plan_from_dict(read_megatron(off, "run_config.yaml").plan).loss_kernels == "unfused"


@pytest.mark.parametrize("kernels", ["fused", "unfused"])
def test_the_exporter_writes_the_fusion_flag_and_reads_it_back(kernels):
    plan = plan_from_dict(small_plan(framework="megatron-core", model="llama3-8b",
                                     mesh={"dp": 8}, training=TRAINING,
                                     loss={"kernels": kernels}))
    exported = write_megatron(plan)
    assert ("--cross-entropy-loss-fusion" in exported.text) == (kernels == "fused")
    assert plan_from_dict(read_megatron(exported.text).plan).loss_kernels == kernels
    assert not [n for n in exported.notes if "loss_kernels" in n]
