"""Apex's DistributedFusedAdam as NeMo 1 configures it (workloads/optimizer_states.py):
the states it keeps by NeMo's rule (nemo/collections/nlp/models/language_modeling/
megatron_base_model.py setup_optimization; Apex StateBucket), the plan section and its
refusals, the Adam step's traffic, the export note and the reference CSV column."""
from __future__ import annotations

import pytest

from validation.reference_rows import plan_dict
from workloads.errors import WorkloadError
from workloads.jobs import write_megatron
from workloads.grad_state import sharded_state_bytes
from workloads.memory import memory_breakdown
from workloads.optimizer_states import DistributedFusedAdam
from workloads.plan import plan_from_dict, resolve

BASE = {"framework": "megatron-core", "model": "llama3-8b", "zero_stage": 1,
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 4096, "dtype": "bf16"},
        "mesh": {"dp": 8, "tp": 1, "pp": 1}}


def _plan(section=None, dtype="bf16", fp8_params=False, **over):
    raw = {**BASE, "training": {**BASE["training"], "dtype": dtype}, **over}
    if section is not None:
        raw["distributed_fused_adam"] = section
    if fp8_params:
        raw["ddp"] = {"fp8_param_gather": True}
    return resolve(plan_from_dict(raw), 8)


@pytest.mark.parametrize("optim, dtype, fp8_params, master, expected", [
    # fp32 states beside a bf16 model (megatron_amp_O2): int16 remainders, 2 + 4 + 4
    ("fp32", "bf16", False, "remainders", 10),
    ("fp32", "fp8", False, "remainders", 10),     # the model's weights are still bf16
    # the optimizer in the model's dtype: the bf16 weight is the master, 0 + 2 + 2
    ("bf16", "bf16", False, "none", 4),
    # fp8_params: a copy of the parameters in the optimizer's dtype (store_params)
    ("fp32", "fp8", True, "params", 12),
    ("bf16", "fp8", True, "params", 6),
    # an fp16 model: fp32 states keep a whole fp32 copy (no remainders for fp16)
    ("fp32", "fp16", False, "params", 12),
    ("fp16", "fp16", False, "none", 4),
    ("bf16", "fp16", False, "params", 6),
])
def test_state_bytes_follow_nemos_choice(optim, dtype, fp8_params, master, expected):
    states = DistributedFusedAdam(optim)
    assert states.master(dtype, fp8_params) == master
    assert states.state_bytes(dtype, fp8_params) == expected


def test_plan_memory_holds_apex_states():
    plain, fp32, bf16 = _plan(), _plan({}), _plan({"dtype": "bf16"})
    assert sharded_state_bytes(plain) == (2, 12)
    assert sharded_state_bytes(fp32) == (2, 10)      # Apex's default dtype: remainders
    assert sharded_state_bytes(bf16) == (2, 4)
    before, after = memory_breakdown(plain), memory_breakdown(bf16)
    assert after.optimizer_bytes == pytest.approx(before.optimizer_bytes * 4 / 12)
    assert after.params_bytes == before.params_bytes
    assert after.grads_bytes == before.grads_bytes
    # FP8 primary weights make NeMo store the parameters in the optimizer's dtype
    assert sharded_state_bytes(_plan({"dtype": "bf16"}, "fp8", fp8_params=True))[1] == 6


@pytest.mark.parametrize("over, field", [
    ({"framework": "torchtitan"}, "framework"),
    ({"fsdp": {"enabled": True}, "zero_stage": 0}, "fsdp.enabled"),
    ({"zero_stage": 0}, "zero_stage"),
    ({"optimizer": "megatron_float16"}, "optimizer"),
])
def test_refused_where_nemo_has_no_such_optimizer(over, field):
    with pytest.raises(WorkloadError) as err:
        _plan({}, **over)
    assert str(err.value).startswith(f"distributed_fused_adam with {field}:")


def test_refused_with_fp32_training_and_beside_megatrons_section():
    with pytest.raises(WorkloadError, match="^distributed_fused_adam with training.dtype:"):
        _plan({}, "fp32")
    with pytest.raises(WorkloadError, match="one optimizer-state section"):
        _plan({}, precision_aware_optimizer={})


@pytest.mark.parametrize("section, field", [
    ({"dtype": "fp8"}, "distributed_fused_adam.dtype"),
    ({"dtype": "bf16", "master": "fp32"}, "distributed_fused_adam.master"),
    ("bf16", "distributed_fused_adam"),
])
def test_bad_sections_name_the_field(section, field):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict({**BASE, "distributed_fused_adam": section})
    assert str(err.value).startswith(f"{field}:")


def test_adam_step_traffic():
    # remainders: bf16 gradient, the states read and written, the bf16 weight read and
    # written (the master's high half)
    assert DistributedFusedAdam().adam_bytes("bf16", 2) == 2 + 2 * 10 + 2 * 2
    # no master: the bf16 weight is read and written as the master
    assert DistributedFusedAdam("bf16").adam_bytes("bf16", 2) == 2 + 2 * 4 + 2 * 2
    # store_params: the copy is read and written, the bf16 weight only written
    assert DistributedFusedAdam("bf16").adam_bytes("fp8", 2, True) == 2 + 2 * 6 + 2


def test_the_optimizer_step_reads_less_with_bf16_states():
    from simulator import SimOptions, simulate
    from topologies.presets import build

    def adam_s(plan):
        trace = simulate(plan, build("dgx-h100"), SimOptions()).trace.to_pandas()
        adam = trace[(trace["op"] == "adam") & (trace["rank"] == 0)]
        return float((adam["end_s"] - adam["start_s"]).sum())

    plain, bf16 = adam_s(_plan()), adam_s(_plan({"dtype": "bf16"}))
    # the plain fused step's 30 B against the fp32 gradient buffer (megatron-core's
    # default grad_reduce_in_fp32), bf16 moments and the bf16 weight read and written
    assert bf16 / plain == pytest.approx((4 + 2 * 4 + 2 * 2) / 30, rel=0.02)


def test_megatron_export_notes_what_it_cannot_say():
    exported = write_megatron(_plan({"dtype": "bf16"}))
    assert any(n.startswith("not expressible in Megatron-LM: distributed_fused_adam")
               and "NeMo 1" in n for n in exported.notes)


def test_a_reference_row_column_sets_the_section():
    row = {"id": "r", "model": "llama3-8b", "gpus": "8", "tp": "1", "pp": "1", "dp": "8",
           "global_batch_seqs": "16", "seq_len": "4096", "dtype": "bf16", "micro_batch": "1",
           "framework": "megatron-core", "zero_stage": "1", "distributed_fused_adam": "bf16"}
    assert plan_dict(row)["distributed_fused_adam"] == {"dtype": "bf16"}
    assert "distributed_fused_adam" not in plan_dict({**row, "distributed_fused_adam": ""})


def test_an_optim_configs_store_params_wins_over_nemos_rule():
    # NeMo sets store_params only where the optim config does not; a config's own value
    # leaves Apex's store_param_remainders at its default, off
    assert DistributedFusedAdam("fp32", store_params=True).state_bytes("bf16") == 12
    assert DistributedFusedAdam("fp32", store_params=False).state_bytes("fp8", True) == 8
    assert sharded_state_bytes(_plan({"store_params": True}))[1] == 12
    with pytest.raises(WorkloadError, match="^distributed_fused_adam.store_params:"):
        plan_from_dict({**BASE, "distributed_fused_adam": {"store_params": "yes"}})


def test_the_csv_column_says_store_params_where_a_bf16_run_keeps_a_copy():
    row = {"id": "r", "model": "llama3-8b", "gpus": "8", "tp": "1", "pp": "1", "dp": "8",
           "global_batch_seqs": "16", "seq_len": "4096", "dtype": "bf16", "micro_batch": "1",
           "framework": "megatron-core", "zero_stage": "1",
           "distributed_fused_adam": "fp32+store_params"}
    assert plan_dict(row)["distributed_fused_adam"] == {"dtype": "fp32", "store_params": True}
