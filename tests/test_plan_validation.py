"""Plans are valid by construction: every route to a Plan (the parser, dataclasses.replace,
whatif --vary, the search) runs the same field checks, with the plan file's message."""
from __future__ import annotations

import json
import pickle
import re
from dataclasses import replace

import pytest

from inputs import InputError
from simulator.cli import main
from simulator.errors import OutputError, UsageError
from topologies import TopologyError
from validation import ValidationError
from workloads import WorkloadError, plan_from_dict, resolve

from conftest import small_plan

# One tiny layer: a what-if point simulates in tens of milliseconds.
TINY = {"name": "tiny",
        "model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 512},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 128},
        "mesh": {"dp": "auto", "tp": 1}, "fsdp": {"enabled": True}}


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _message(raw) -> str:
    with pytest.raises(WorkloadError) as info:
        plan_from_dict(raw)
    return str(info.value)


# (what replace() changes, the same mistake in a plan file)
SAME_MESSAGE = {
    "zero_stage": (lambda p: replace(p, zero_stage=5), small_plan(zero_stage=5)),
    "recompute": (lambda p: replace(p, recompute="bogus"), small_plan(recompute="bogus")),
    "dtype": (lambda p: replace(p, training=replace(p.training, dtype="fp16")),
              small_plan(training={"dtype": "fp16"})),
    "micro_batch": (lambda p: replace(p, training=replace(p.training, micro_batch=0)),
                    small_plan(training={"micro_batch": 0})),
    "schedule": (lambda p: replace(p, pipeline=replace(p.pipeline, schedule="zigzag")),
                 small_plan(pipeline={"schedule": "zigzag"})),
    "fsdp not bool": (lambda p: replace(p, fsdp="yes"), small_plan(fsdp={"enabled": "yes"})),
    "strategy": (lambda p: replace(p, sharding={**p.sharding, "wq": "diagonal"}),
                 small_plan(sharding={"wq": "diagonal"})),
    "imbalance": (lambda p: replace(p, load_imbalance=float("inf")),
                  small_plan(moe={"load_imbalance": 1e400})),
    "cp mode": (lambda p: replace(p, cp_mode="spiral"),
                small_plan(context_parallel={"mode": "spiral"})),
    "tp depth": (lambda p: replace(p, tp_depth=0), small_plan(tensor_parallel={"depth": 0})),
}


@pytest.mark.parametrize("case", sorted(SAME_MESSAGE))
def test_replace_raises_the_plan_files_message(case):
    change, raw = SAME_MESSAGE[case]
    base = plan_from_dict(small_plan())
    with pytest.raises(WorkloadError) as info:
        change(base)
    assert str(info.value) == _message(raw)


def test_zero_stage_5_by_replace_names_the_allowed_stages():
    with pytest.raises(WorkloadError, match=r"^zero_stage: got 5; allowed: 0, 1, 2 or 3$"):
        replace(plan_from_dict(small_plan()), zero_stage=5)
    for bad in (-1, True, 1.0, "3"):
        with pytest.raises(WorkloadError):
            replace(plan_from_dict(small_plan()), zero_stage=bad)


def test_async_tp_false_is_the_default_and_true_is_accepted():
    assert plan_from_dict(small_plan(overlap={"async_tp": False})) == plan_from_dict(small_plan())
    assert plan_from_dict(small_plan(overlap={"async_tp": True})).async_tp is True


@pytest.mark.parametrize("section,key,bad,field", [
    ("overlap", "grad_reduce", 1, "overlap.grad_reduce"),
    ("overlap", "param_gather", "yes", "overlap.param_gather"),
    ("overlap", "tp_comm", None, "overlap.tp_comm"),
    ("overlap", "async_tp", 0, "overlap.async_tp"),
    ("fsdp", "version", 3, "fsdp.version"),
    ("fsdp", "version", True, "fsdp.version"),
    ("host_overhead", "per_step_s", -1.0, "host_overhead.per_step_s"),
    ("host_overhead", "per_kernel_s", float("inf"), "host_overhead.per_kernel_s"),
])
def test_framework_vocabulary_bad_values_name_the_field(section, key, bad, field):
    with pytest.raises(WorkloadError, match=rf"^{re.escape(field)}: got "):
        plan_from_dict(small_plan(**{section: {key: bad}}))


def test_unknown_framework_and_keys_are_refused():
    with pytest.raises(WorkloadError, match=r"^framework: got 'deepspeed'; allowed: generic, "):
        plan_from_dict(small_plan(framework="deepspeed"))
    with pytest.raises(WorkloadError, match=r"^overlap.bogus: "):
        plan_from_dict(small_plan(overlap={"bogus": True}))
    with pytest.raises(WorkloadError, match=r'^fsdp.version: got 0; allowed: 1, 2 or "megatron"$'):
        replace(plan_from_dict(small_plan()), fsdp_version=0)


def test_generic_is_todays_defaults_and_profiles_yield_to_the_plan():
    generic = plan_from_dict(small_plan(framework="generic"))
    assert generic == plan_from_dict(small_plan())
    assert (generic.fsdp_version, generic.grad_reduce_overlap, generic.param_gather_overlap,
            generic.tp_comm_overlap, generic.async_tp, generic.cuda_graphs,
            generic.host_step_s, generic.host_kernel_s, generic.grad_bucket) == (
        2, True, False, False, False, False, 0.0, 0.0, "unit")
    mcore = plan_from_dict(small_plan(framework="megatron-core"))
    assert (mcore.zero_stage, mcore.grad_reduce_overlap, mcore.param_gather_overlap,
            mcore.tp_comm_overlap, mcore.kernels, mcore.grad_bucket) == (
        1, True, True, False, "fused", 128 * 1024 * 1024)   # no TP: no TP overlap
    sp = plan_from_dict(small_plan(framework="megatron-core", mesh={"tp": 2},
                                   sharding={"sequence_parallel": True}))
    assert sp.tp_comm_overlap is True
    own = plan_from_dict(small_plan(framework="megatron-core", zero_stage=0,
                                    overlap={"grad_reduce": False}))
    # without the distributed optimizer there is no parameter all-gather to overlap
    assert (own.zero_stage, own.grad_reduce_overlap, own.param_gather_overlap) == (0, False, False)
    titan = plan_from_dict(small_plan(framework="torchtitan"))
    assert (titan.fsdp, titan.fsdp_version, titan.kernels, titan.recompute,
            titan.zero_stage) == (True, 2, "eager", "selective_op", 0)
    assert plan_from_dict(small_plan(framework="torchtitan", kernels="fused")).kernels == "fused"
    zero1 = plan_from_dict(small_plan(framework="torchtitan", zero_stage=1))
    assert (zero1.fsdp, zero1.zero_stage) == (False, 1)
    # a plan enabling FSDP under a ZeRO-1 profile gets FSDP's own sharding, not an error
    fsdp = plan_from_dict(small_plan(framework="megatron-core", fsdp={"enabled": True}))
    assert (fsdp.zero_stage, fsdp.param_gather_overlap, fsdp.grad_bucket) == (0, False, "unit")


@pytest.mark.parametrize("over,field", [
    ({"zero_stage": 0, "overlap": {"param_gather": True}}, "overlap.param_gather"),
    ({"fsdp": {"enabled": True}, "overlap": {"param_gather": True}}, "overlap.param_gather"),
    ({"overlap": {"tp_comm": True}}, "overlap.tp_comm"),
    ({"mesh": {"tp": 2}, "overlap": {"async_tp": True}}, "overlap.async_tp"),
    ({"mesh": {"tp": 2}, "sharding": {"sequence_parallel": True},
      "overlap": {"async_tp": True, "tp_comm": True}}, "overlap.async_tp"),
    ({"fsdp": {"enabled": True}, "overlap": {"grad_reduce": False}}, "overlap.grad_reduce"),
    ({"fsdp": {"enabled": True}, "ddp": {"bucket_params": 1000}}, "ddp.bucket_params"),
    ({"fsdp": {"version": 1}}, "fsdp.version"),
    ({"cuda_graphs": True}, "cuda_graphs"),
])
def test_framework_keys_only_where_their_mechanism_exists(over, field):
    plan = plan_from_dict(small_plan(**over))
    with pytest.raises(WorkloadError, match=rf"^{re.escape(field)}: got "):
        resolve(plan, 8)


def test_every_input_error_is_one_type_and_pickles():
    for cls in (WorkloadError, TopologyError, ValidationError, UsageError):
        exc = cls("field", 3, "1 or 2")
        assert isinstance(exc, InputError) and str(exc) == "field: got 3; allowed: 1 or 2"
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is cls and str(back) == str(exc)
    out = pickle.loads(pickle.dumps(OutputError("/x/y.png", "it is a folder")))
    assert type(out) is OutputError and out.field == "output" and "folder" in out.allowed


# ----------------------------------------------------------------- whatif --vary values
@pytest.mark.parametrize("vary, field", [
    ("zero_stage=0,5", "zero_stage"),
    ("recompute=none,bogus", "recompute"),
    ("dtype=bf16,fp16", "training.dtype"),
    ("ib_bandwidth=x1,xinf", "--vary ib_bandwidth"),
    ("ib_bandwidth=x1e-300", "--vary ib_bandwidth"),
    ("ib_bandwidth=1e400", "--vary ib_bandwidth"),
    ("ib_bandwidth=x0", "--vary ib_bandwidth"),
    ("nvlink_bandwidth=xnan", "--vary nvlink_bandwidth"),
    ("global_batch=8,-8", "training.global_batch"),
])
def test_whatif_value_no_plan_can_take_exits_2_and_writes_nothing(vary, field, tmp_path,
                                                                   write_json, capsys):
    plan = write_json("tiny.json", TINY)
    out = tmp_path / "study.parquet"
    code, stdout, err = _cli(capsys, "whatif", "--plan", plan, "--topo", "dgx-h100x2",
                             "--vary", vary, "-o", str(out), "--workers", "1",
                             "--no-progress")
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {field}: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json"]   # nothing written


def test_whatif_value_gets_the_bad_plan_files_message(write_json, capsys):
    bad_plan = write_json("bad.json", {**TINY, "zero_stage": 5})
    _, _, plan_err = _cli(capsys, "run", "--topo", "dgx-h100", "--plan", bad_plan)
    plan = write_json("tiny.json", TINY)
    _, _, vary_err = _cli(capsys, "whatif", "--plan", plan, "--topo", "dgx-h100",
                          "--vary", "zero_stage=5", "--no-progress")
    assert vary_err == plan_err and plan_err.startswith("error: zero_stage: got 5")


def test_bandwidth_bounds_accept_the_documented_range(write_json, capsys):
    from simulator.whatif.variations import parse_vary
    assert parse_vary("ib_bandwidth=x0.01,x100,0.1,10000").values == (
        "x0.01", "x100", "0.1", "10000")
    with pytest.raises(UsageError, match=r"xF with F in \[0.01, 100\]"):
        parse_vary("ib_bandwidth=x100.5")


def test_combination_invalid_at_some_points_is_an_invalid_row(write_json, capsys):
    # 16 heads, so that tp 16 divides the model; it needs 16 GPUs: two DGX H100 nodes
    # hold it, one (8 GPUs) does not.
    raw = {**TINY, "model": {**TINY["model"], "hidden_size": 512, "num_attention_heads": 16,
                             "num_key_value_heads": 16, "intermediate_size": 1024},
           "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 128}}
    plan = write_json("tiny16.json", raw)
    code, out, err = _cli(capsys, "whatif", "--plan", plan, "--topo", "dgx-h100",
                          "--topo", "dgx-h100x2", "--vary", "tp=8,16", "--workers", "1",
                          "--no-progress", "--json")
    assert code == 0, err
    rows = {(r["topo"], r["tp"]): r for r in json.loads(out)}
    assert rows[("dgx-h100x2", 16)]["status"] == "ok"
    assert rows[("dgx-h100", 8)]["status"] == "ok"
    bad = rows[("dgx-h100", 16)]
    assert bad["status"] == "invalid"
    # the row carries the very message a plan file with tp 16 gets on that topology
    bad_plan = write_json("tp16.json", {**raw, "mesh": {"dp": "auto", "tp": 16}})
    code, _, plan_err = _cli(capsys, "run", "--topo", "dgx-h100", "--plan", bad_plan)
    assert code == 2 and plan_err.strip() == f"error: {bad['error']}"
