"""`whatif --vary` over the framework-level plan keys (framework profile, overlap flags,
FSDP version, CUDA graphs, kernels, optimizer, DDP buckets, host overhead): parsed
strictly, written into the plan at their plan-file keys so that a profile's defaults
follow the point's values, and simulated."""
from __future__ import annotations

import dataclasses
import json

import pytest

from inputs import InputError
from simulator.cli import build_parser, main
from simulator.errors import UsageError
from simulator.whatif import whatif
from simulator.whatif.variations import (FRAMEWORK_PARAMS, PARAMS, PLAN_KEYS, PLAN_PARAMS,
                                         apply_plan, parse_vary, point_raw)
from workloads import Plan
from workloads.frameworks import EAGER_HOST_KERNEL_S, MEGATRON_CORE

# One tiny layer (a point simulates in milliseconds), Megatron TP with sequence parallelism.
TINY = {"name": "tiny",
        "model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 512},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 128},
        "mesh": {"dp": "auto", "tp": 1}, "sharding": {"sequence_parallel": True}}

# A value of each framework-level key that differs from the generic default.
OTHER_VALUE = {"framework": "torchtitan", "kernels": "eager", "loss_kernels": "eager",
               "optimizer": "foreach", "fsdp_grad_sync": "step",
               "fsdp_version": 1, "grad_bucket": 1000, "async_tp": True,
               "grad_reduce_overlap": False, "param_gather_overlap": True,
               "param_gather_align": True, "tp_comm_overlap": True,
               "reshard_after_forward": False, "cuda_graphs": True,
               "host_step_s": 0.002, "host_kernel_s": 5e-6,
               "grad_reduce_fp32": False, "grad_accumulation_fusion": False,
               "grad_as_bucket_view": True, "fp8_param_gather": True,
               "fsdp_float8_all_gather": True, "loss_metrics": 2}
# Keys a framework profile alone accepts: their point runs on that framework's plan.
ONLY_UNDER = {"grad_reduce_fp32": "megatron-core", "grad_accumulation_fusion": "megatron-core"}


def test_every_plan_parameter_has_a_plan_file_key_and_a_plan_field():
    assert set(PLAN_KEYS) == set(PLAN_PARAMS)
    fields = {f.name for f in dataclasses.fields(Plan)}
    assert set(FRAMEWORK_PARAMS) <= fields and set(FRAMEWORK_PARAMS) <= set(PARAMS)
    assert set(OTHER_VALUE) == set(FRAMEWORK_PARAMS)
    assert PLAN_KEYS["tp_comm_overlap"] == ("overlap", "tp_comm")
    assert PLAN_KEYS["fsdp_version"] == ("fsdp", "version")
    assert PLAN_KEYS["host_kernel_s"] == ("host_overhead", "per_kernel_s")
    assert PLAN_KEYS["framework"] == (None, "framework")


@pytest.mark.parametrize("name", sorted(OTHER_VALUE))
def test_each_framework_key_reaches_its_plan_field(name):
    value = OTHER_VALUE[name]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    assert parse_vary(f"{name}={text}").values == (value,)
    plan = {**TINY, "framework": ONLY_UNDER[name]} if name in ONLY_UNDER else TINY
    base = apply_plan(plan, {})
    assert getattr(base, name) != value
    assert getattr(apply_plan(plan, {name: value}), name) == value
    assert TINY == json.loads(json.dumps(TINY)) and "overlap" not in TINY   # not mutated


def test_framework_applies_the_profile_and_the_plan_keys_still_win():
    # Replacing Plan.framework alone would change the name only (workloads/frameworks.py):
    # the point re-parses the plan, so megatron-core's defaults arrive.
    plan = apply_plan(TINY, {"framework": "megatron-core"})
    assert (plan.framework, plan.zero_stage, plan.host_kernel_s, plan.grad_bucket) == (
        "megatron-core", MEGATRON_CORE["zero_stage"], EAGER_HOST_KERNEL_S,
        MEGATRON_CORE["grad_bucket"])
    own = apply_plan({**TINY, "zero_stage": 0, "cuda_graphs": False},
                     {"framework": "megatron-core"})
    assert own.zero_stage == 0
    torchtitan = apply_plan(TINY, {"framework": "torchtitan"})
    assert (torchtitan.fsdp, torchtitan.recompute, torchtitan.kernels) == (
        True, "selective_op", "eager")
    # A key varied alongside the framework overrides the profile, as in a plan file.
    assert apply_plan(TINY, {"framework": "torchtitan", "recompute": "none"}).recompute == "none"


def test_profile_rules_follow_the_varied_tp():
    # megatron-core turns TP overlap on only at TP > 1 with sequence parallelism: a point
    # at tp=2 gets it although the base plan has tp=1.
    assert not apply_plan(TINY, {"framework": "megatron-core", "tp": 1}).tp_comm_overlap
    assert apply_plan(TINY, {"framework": "megatron-core", "tp": 2}).tp_comm_overlap


def test_point_raw_writes_plan_file_keys_without_touching_the_base():
    raw = point_raw(TINY, {"tp_comm_overlap": True, "fsdp_version": 1, "tp": 2,
                           "framework": "megatron-core", "ib_bandwidth": "x2"})
    assert raw["overlap"] == {"tp_comm": True} and raw["fsdp"] == {"version": 1}
    assert raw["mesh"] == {"dp": "auto", "tp": 2} and raw["framework"] == "megatron-core"
    assert "ib_bandwidth" not in raw and TINY["mesh"] == {"dp": "auto", "tp": 1}


@pytest.mark.parametrize("arg, allowed", [
    ("framework=pytorch", "generic, megatron-core, megatron-lm, torchtitan, nemo-automodel"),
    ("kernels=triton", "fused, eager"),
    ("fsdp_version=3", "1, 2 or megatron"),
    ("grad_bucket=0", "unit, megatron or a number of parameters in [1, 2^53]"),
    ("cuda_graphs=sometimes", "true or false"),
    ("tp_comm_overlap=2", "true or false"),
    ("host_kernel_s=11", "a number of seconds in [0, 10]"),
    ("host_step_s=nan", "a number of seconds in [0, 10]"),
    ("host_step_s=-1e-3", "a number of seconds in [0, 10]"),
])
def test_bad_values_exit_2_naming_key_value_and_allowed(arg, allowed, tmp_path, capsys):
    name, _, value = arg.partition("=")
    with pytest.raises(UsageError):
        parse_vary(arg)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TINY))
    rc = main(["whatif", "--plan", str(plan), "--topo", "dgx-h100", "--vary", arg,
               "--no-progress", "--workers", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == f"error: --vary {name}: got {value!r}; allowed: {allowed}"


def test_a_sweep_over_framework_and_cuda_graphs_simulates_each_point():
    rows = whatif(TINY, ["dgx-h100"], ["framework=generic,megatron-core",
                                       "cuda_graphs=false,true"], workers=1)
    by = {(r["framework"], r["cuda_graphs"]): r for r in rows}
    # generic has no per-kernel host cost, so capturing the step is refused (resolve).
    assert by[("generic", True)]["status"] == "invalid"
    assert "cuda_graphs" in by[("generic", True)]["error"]
    eager, graphed = by[("megatron-core", False)], by[("megatron-core", True)]
    assert eager["status"] == graphed["status"] == by[("generic", False)]["status"] == "ok"
    # The tiny step is host-bound under megatron-core's eager launches (10 us per kernel):
    # a CUDA graph removes that cost, and the profile's host cost makes it slower than
    # generic's (none).
    assert graphed["step_time_s"] < eager["step_time_s"]
    assert by[("generic", False)]["step_time_s"] < eager["step_time_s"]


def test_a_key_only_a_varied_framework_takes_is_an_invalid_row_not_an_error():
    # grad_reduce_fp32 is a Megatron key: refused on the generic base plan alone, but the
    # study also varies the framework, so only the generic points are invalid.
    rows = whatif(TINY, ["dgx-h100"], ["framework=generic,megatron-core",
                                       "grad_reduce_fp32=true,false"], workers=1)
    status = {(r["framework"], r["grad_reduce_fp32"]): r["status"] for r in rows}
    assert status == {("generic", True): "invalid", ("generic", False): "invalid",
                      ("megatron-core", True): "ok", ("megatron-core", False): "ok"}
    # without the framework varied, no point could take it: exit 2 before anything runs
    with pytest.raises(InputError, match="grad_reduce_in_fp32"):
        whatif(TINY, ["dgx-h100"], ["grad_reduce_fp32=true"], workers=1)


def test_vary_names_are_frozen():
    # Like tests/test_cli.py's frozen surface: renaming a --vary name breaks users' sweeps;
    # change this on purpose. The framework-level names are the Plan fields.
    assert set(PARAMS) >= {
        "gpu", "ib_bandwidth", "nvlink_bandwidth", "nodes", "tp", "pp", "dp", "cp",
        "micro_batch", "global_batch", "seq_len", "packed_segment", "zero_stage", "recompute",
        "attention",
        "dtype", "schedule", "fsdp", "sequence_parallel", "fsdp_prefetch", "framework",
        "kernels", "optimizer", "fsdp_version", "grad_bucket", "async_tp",
        "grad_reduce_overlap", "param_gather_overlap", "param_gather_align",
        "tp_comm_overlap", "reshard_after_forward", "cuda_graphs", "host_step_s",
        "host_kernel_s"}


def test_help_lists_the_framework_keys():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["whatif"].format_help()
    for name in FRAMEWORK_PARAMS:
        assert name in text, name


def test_a_point_without_fsdp_drops_the_plans_fsdp_only_keys():
    # fsdp_noreshard.json keeps FSDP's parameters gathered (reshard_after_forward false): the
    # fsdp=false point is plain DDP, where that key may not be given (plan_checks.py)
    from workloads import resolve
    from workloads.plan import BUNDLED_DIR

    raw = json.loads((BUNDLED_DIR / "fsdp_noreshard.json").read_text())
    assert raw["fsdp"]["reshard_after_forward"] is False
    plan = resolve(apply_plan(raw, {"fsdp": False}), 8)
    assert not plan.fsdp and plan.reshard_after_forward is True
    assert raw["fsdp"]["reshard_after_forward"] is False      # the base plan is not changed
    assert apply_plan(raw, {"fsdp": True}).reshard_after_forward is False


def test_vary_muon_adds_or_drops_the_section_and_the_profile_follows():
    # on a megatron-core plan, muon=true is Muon's layer-wise optimizer (the profile's ZeRO-1
    # yields), muon=false Megatron's distributed Adam (the profile's ZeRO-1); a plan's own
    # muon section is kept (its ns_steps), and the base plan is not changed
    raw = {**TINY, "framework": "megatron-core", "muon": {"ns_steps": 10}}
    on, off = apply_plan(raw, {"muon": True}), apply_plan(raw, {"muon": False})
    assert on.muon is not None and on.muon.ns_steps == 10 and on.zero_stage == 0
    assert off.muon is None and off.zero_stage == 1
    assert raw["muon"] == {"ns_steps": 10}
    plain = {**TINY, "framework": "megatron-core"}
    assert apply_plan(plain, {"muon": True}).muon.ns_steps == 5
    assert parse_vary("muon=on,off").values == (True, False)
    assert "muon" in PARAMS
