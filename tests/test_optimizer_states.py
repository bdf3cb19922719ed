"""Megatron-Core's precision-aware optimizer (workloads/optimizer_states.py): state bytes
per parameter from Megatron-LM d98e8a64's optimizer code, the plan section, its refusals,
the Adam step's traffic, job-config import / export, and the reference CSV column."""
from __future__ import annotations

import pytest
from megatron_flags import LLAMA3_8B_FLAGS

from validation.reference_rows import plan_dict
from workloads.errors import WorkloadError
from workloads.jobs import JobConfigError, read_megatron, write_megatron
from workloads.grad_state import sharded_state_bytes
from workloads.memory import memory_breakdown
from workloads.optimizer_states import PrecisionAwareOptimizer
from workloads.plan import plan_from_dict, resolve

BASE = {"framework": "megatron-core", "model": "llama3-8b", "zero_stage": 1,
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 4096, "dtype": "bf16"},
        "mesh": {"dp": 8, "tp": 1, "pp": 1}}


def _plan(section=None, **over):
    raw = {**BASE, **over}
    if section is not None:
        raw["precision_aware_optimizer"] = section
    return resolve(plan_from_dict(raw), 8)


@pytest.mark.parametrize("dtype, moments, main, remainders, expected", [
    # BF16 model, fp32 main parameters: FusedAdam holds the master as int16 remainders
    ("bf16", "fp32", "fp32", True, 2 + 4 + 4),
    ("bf16", "bf16", "fp32", True, 2 + 2 + 2),
    ("bf16", "fp8", "fp32", True, 2 + 1 + 1),
    ("bf16", "bf16", "fp32", False, 4 + 2 + 2),      # remainders off: the whole fp32 master
    ("bf16", "bf16", "fp16", True, 2 + 2 + 2),       # an fp16 master
    ("fp8", "bf16", "fp32", True, 2 + 2 + 2),        # delayed scaling: FusedAdam's master
    # current scaling / MXFP8 with fp32 main parameters: Megatron keeps its fp32 master
    ("mxfp8", "bf16", "fp32", True, 4 + 2 + 2),
    ("fp8_cs", "fp32", "fp32", True, 4 + 4 + 4),
])
def test_state_bytes_follow_who_holds_the_master(dtype, moments, main, remainders, expected):
    states = PrecisionAwareOptimizer(moments, moments, main, remainders)
    assert states.state_bytes(dtype) == expected


def test_plan_memory_holds_the_lower_precision_states():
    plain, lowered = _plan(), _plan({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"})
    assert sharded_state_bytes(plain) == (2, 12)
    assert sharded_state_bytes(lowered) == (2, 6)
    before, after = memory_breakdown(plain), memory_breakdown(lowered)
    assert after.optimizer_bytes == pytest.approx(before.optimizer_bytes * 6 / 12)
    assert after.params_bytes == before.params_bytes
    assert after.grads_bytes == before.grads_bytes


def test_the_section_defaults_to_megatrons_flags():
    plan = _plan({})
    assert plan.precision_aware_optimizer == PrecisionAwareOptimizer()
    assert sharded_state_bytes(plan) == (2, 10)      # fp32 moments, remainder master


@pytest.mark.parametrize("over, field", [
    ({"framework": "generic"}, "framework"),
    ({"fsdp": {"enabled": True}, "zero_stage": 0}, "fsdp.enabled"),
    ({"zero_stage": 0}, "zero_stage"),
    ({"optimizer": "foreach"}, "optimizer"),
    ({"training": {**BASE["training"], "dtype": "fp32"}}, "training.dtype"),
])
def test_refused_where_megatron_has_no_such_optimizer(over, field):
    with pytest.raises(WorkloadError) as err:
        _plan({"exp_avg_dtype": "bf16"}, **over)
    assert str(err.value).startswith(f"precision_aware_optimizer with {field}:")


@pytest.mark.parametrize("section, field", [
    ({"exp_avg_dtype": "int4"}, "precision_aware_optimizer.exp_avg_dtype"),
    ({"main_params_dtype": "bf16"}, "precision_aware_optimizer.main_params_dtype"),
    ({"store_param_remainders": "yes"}, "precision_aware_optimizer.store_param_remainders"),
    ({"main_grads_dtype": "bf16"}, "precision_aware_optimizer.main_grads_dtype"),
    ([], "precision_aware_optimizer"),
])
def test_bad_sections_name_the_field(section, field):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict({**BASE, "precision_aware_optimizer": section})
    assert str(err.value).startswith(f"{field}:")


def test_adam_step_traffic():
    # Megatron holds the fp32 master: the plain fused step's 30 B with fp32 states
    assert PrecisionAwareOptimizer().adam_bytes("mxfp8", 2) == 30
    assert PrecisionAwareOptimizer("bf16", "bf16").adam_bytes("mxfp8", 2) == 4 + 2 * 8 + 2
    # FusedAdam holds it as remainders: the bf16 gradient, states and the 16-bit weight
    assert PrecisionAwareOptimizer().adam_bytes("bf16", 2) == 2 + 2 * 10 + 2 * 2
    assert PrecisionAwareOptimizer("bf16", "bf16").adam_bytes("bf16", 2) == 2 + 2 * 6 + 2 * 2


def test_the_optimizer_step_reads_less_with_bf16_moments():
    from simulator import SimOptions, simulate
    from topologies.presets import build

    def adam_s(plan):
        trace = simulate(plan, build("dgx-h100"), SimOptions()).trace.to_pandas()
        adam = trace[(trace["op"] == "adam") & (trace["rank"] == 0)]
        return float((adam["end_s"] - adam["start_s"]).sum())

    plain = adam_s(_plan())
    lowered = adam_s(_plan({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}))
    assert lowered < plain
    # the fp32 gradient buffer (megatron-core's default grad_reduce_in_fp32), the
    # remainders and bf16 moments read and written, the 16-bit weight read and written
    assert lowered / plain == pytest.approx((4 + 2 * 6 + 2 * 2) / 30, rel=0.02)


FLAGS = LLAMA3_8B_FLAGS


def test_megatron_flags_import_and_export():
    plan = plan_from_dict(read_megatron(FLAGS.format(
        extra="--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"
    )).plan)
    assert plan.precision_aware_optimizer == PrecisionAwareOptimizer("bf16", "bf16")
    assert plan_from_dict(read_megatron(FLAGS.format(extra="")).plan) \
        .precision_aware_optimizer is None
    exported = write_megatron(plan)
    assert exported.notes == []
    assert "--use-precision-aware-optimizer" in exported.text
    back = plan_from_dict(read_megatron(exported.text).plan)
    assert back.precision_aware_optimizer == plan.precision_aware_optimizer


def test_low_precision_states_without_the_switch_are_refused():
    with pytest.raises(JobConfigError) as err:
        read_megatron(FLAGS.format(extra="--exp-avg-dtype bf16"))
    assert "--exp-avg-dtype" in str(err.value)
    with pytest.raises(JobConfigError):
        read_megatron(FLAGS.format(extra="--use-precision-aware-optimizer "
                                         "--exp-avg-dtype int4"))


def test_a_reference_row_column_sets_the_section():
    row = {"id": "r", "model": "llama3-8b", "gpus": "8", "tp": "1", "pp": "1", "dp": "8",
           "global_batch_seqs": "16", "seq_len": "4096", "dtype": "bf16", "micro_batch": "1",
           "framework": "megatron-core", "zero_stage": "1",
           "precision_aware_optimizer": "bf16"}
    section = plan_dict(row)["precision_aware_optimizer"]
    assert section == {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16",
                       "master_weights": "auto"}
    # a Megatron-Bridge BF16 run: its optimizer config carries a tensorwise recipe
    bridge = {**row, "source": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md"}
    assert plan_dict(bridge)["precision_aware_optimizer"]["master_weights"] == "megatron"
    bridge_fp8 = {**bridge, "dtype": "fp8"}         # delayed scaling: the dtype's own rule
    assert plan_dict(bridge_fp8)["precision_aware_optimizer"]["master_weights"] == "auto"


def test_megatron_master_weights_keep_the_fp32_master_under_bf16():
    # Megatron-Bridge's MixedPrecisionConfig copies fp8_recipe "tensorwise" into the
    # optimizer config, so use_precision_aware_optimizer_no_fp8_or_ds_fp8 is false
    bridge = PrecisionAwareOptimizer("bf16", "bf16", master_weights="megatron")
    assert bridge.state_bytes("bf16") == 4 + 2 + 2
    assert bridge.adam_bytes("bf16", 2) == 4 + 2 * 8 + 2
    assert PrecisionAwareOptimizer("bf16", "bf16").state_bytes("bf16") == 2 + 2 + 2
    with pytest.raises(WorkloadError, match="master_weights"):
        PrecisionAwareOptimizer(main_params_dtype="fp16", master_weights="megatron")


def test_megatron_master_weights_read_and_written_as_the_optimizers_recipe():
    flags = FLAGS.format(extra="--use-precision-aware-optimizer --fp8-recipe tensorwise")
    plan = plan_from_dict(read_megatron(flags).plan)
    assert plan.training.dtype == "bf16"
    assert plan.precision_aware_optimizer.master_weights == "megatron"
    exported = write_megatron(plan)
    assert "--fp8-recipe tensorwise" in exported.text and exported.notes == []
    back = plan_from_dict(read_megatron(exported.text).plan)
    assert back.precision_aware_optimizer == plan.precision_aware_optimizer


def test_a_bridge_yaml_optimizer_section_with_torch_dtypes():
    from tests.test_jobs_megatron import BRIDGE
    text = BRIDGE.format(extra="").replace(
        "  use_distributed_optimizer: true\ncomm_overlap:",
        "  use_distributed_optimizer: true\n  use_precision_aware_optimizer: true\n"
        "  exp_avg_dtype: torch.bfloat16\n  exp_avg_sq_dtype:\n"
        "    _target_: torch.bfloat16\n    _call_: false\ncomm_overlap:")
    plan = plan_from_dict(read_megatron(text, "run_config.yaml").plan)
    # the YAML's model is FP8 (hybrid): the training dtype's own rule holds the master
    assert plan.precision_aware_optimizer == PrecisionAwareOptimizer("bf16", "bf16")
