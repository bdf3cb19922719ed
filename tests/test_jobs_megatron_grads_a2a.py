"""Megatron flags for the DDP gradient buffer's dtype and the EP all-to-all overlap.

Rules of Megatron-LM core_v0.15.0: megatron/training/arguments.py validate_args (with --bf16
the buffer is fp32 unless --grad-reduce-in-bf16 or --main-grads-dtype bf16) and
megatron/core/transformer/transformer_config.py __post_init__ (what
overlap_moe_expert_parallel_comm and delay_wgrad_compute assert). Megatron-Bridge v0.6.0
YAML: its DDP config as written, a bf16 mixed-precision recipe's value over it.
"""
from __future__ import annotations

import pytest

from simulator.cli import main
from workloads.errors import WorkloadError
from workloads.jobs import JobConfigError, read_megatron
from workloads.plan import plan_from_dict, resolve

from test_jobs_megatron import ARGS, BRIDGE


def _grad_fp32(extra: str, drop: str = "--accumulate-allreduce-grads-in-fp32") -> bool:
    text = ARGS.format(extra=extra).replace(drop, "")
    plan = read_megatron(text).plan
    assert plan_from_dict(plan).grad_reduce_fp32 == plan["ddp"]["grad_reduce_in_fp32"]
    return plan["ddp"]["grad_reduce_in_fp32"]


def test_grad_buffer_dtype_follows_validate_args():
    assert _grad_fp32("") is True                     # --bf16 alone: fp32 (validate_args)
    assert _grad_fp32("", drop="") is True            # the switch given
    assert _grad_fp32("--grad-reduce-in-bf16") is False
    assert _grad_fp32("--grad-reduce-in-bf16", drop="") is False   # bf16 reduce wins
    assert _grad_fp32("--main-grads-dtype bf16 --use-precision-aware-optimizer") is False
    with pytest.raises(JobConfigError, match="--main-grads-dtype"):   # only with the switch
        _grad_fp32("--main-grads-dtype bf16")
    # without --bf16 the parameters are fp32: the switch as given
    assert _grad_fp32("", drop="--bf16 --accumulate-allreduce-grads-in-fp32") is False
    assert _grad_fp32("", drop="--bf16") is True
    with pytest.raises(JobConfigError, match="--main-grads-dtype"):   # Megatron asserts
        _grad_fp32("--main-grads-dtype bf16", drop="")
    with pytest.raises(JobConfigError, match="--main-grads-dtype"):
        _grad_fp32("--main-grads-dtype fp16")
    # torch FSDP2's config takes no such field: no ddp block
    fsdp = read_megatron(ARGS.format(extra="--use-torch-fsdp2").replace(
        "--use-distributed-optimizer ", "")).plan
    assert "ddp" not in fsdp


def _bridge_grad_fp32(ddp_value: str | None, recipe: str = "") -> bool:
    text = BRIDGE.format(extra=recipe)
    line = "  grad_reduce_in_fp32: true\n"
    text = text.replace(line, "" if ddp_value is None else
                        f"  grad_reduce_in_fp32: {ddp_value}\n")
    return read_megatron(text, "run.yaml").plan["ddp"]["grad_reduce_in_fp32"]


def test_bridge_yaml_grad_buffer_is_its_ddp_config():
    assert _bridge_grad_fp32("true") is True
    assert _bridge_grad_fp32("false") is False     # the Bridge performance scripts' value
    assert _bridge_grad_fp32(None) is False         # Megatron-Core's DDP default
    # a bf16 recipe's grad_reduce_in_fp32 (true) is copied over the DDP config's
    assert _bridge_grad_fp32("false", "mixed_precision: bf16_mixed") is True
    # a MixedPrecisionConfig's own field (default true) wins the same way
    assert _bridge_grad_fp32("true", "mixed_precision:\n  bf16: true\n"
                                     "  grad_reduce_in_fp32: false") is False
    assert _bridge_grad_fp32("false", "mixed_precision:\n  bf16: true") is True


MOE = ARGS.format(extra="{extra}").replace(
    "--num-layers 32", "--num-layers 32 --num-experts 8 --moe-router-topk 2 "
    "--moe-token-dispatcher-type alltoall --expert-model-parallel-size 4").replace(
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", "")
OVERLAP = "--overlap-moe-expert-parallel-comm"


def test_a2a_overlap_flags_set_the_moe_keys():
    plan = read_megatron(MOE.format(extra=OVERLAP)).plan
    assert plan["moe"]["overlap_a2a"] is True and "delay_wgrad" not in plan["moe"]
    plan = read_megatron(MOE.format(extra=f"{OVERLAP} --delay-wgrad-compute")).plan
    assert plan["moe"]["overlap_a2a"] is True and plan["moe"]["delay_wgrad"] is True
    resolved = resolve(plan_from_dict(plan), 16)
    assert resolved.moe.overlap_a2a and resolved.moe.delay_wgrad
    assert "overlap_a2a" not in read_megatron(MOE.format(extra="")).plan["moe"]


# (extra flags, text replaced, the flag named, a word of the reason). Each is refused by
# Megatron-Core (or, FSDP, not modelled), and the plan refuses its moe key there too.
REFUSED = {
    "delay-alone": ("--delay-wgrad-compute", {}, "--delay-wgrad-compute", "overlap"),
    "no-ep": (OVERLAP, {"--expert-model-parallel-size 4": ""}, OVERLAP, "expert-model"),
    "allgather-default": (OVERLAP, {"--moe-token-dispatcher-type alltoall": ""}, OVERLAP,
                          "allgather"),
    "pp-no-vpp": (OVERLAP, {"--num-layers-per-virtual-pipeline-stage 4": ""}, OVERLAP,
                  "virtual"),
    "full-recompute": (f"{OVERLAP} --recompute-granularity full --recompute-method block "
                       "--recompute-num-layers 2", {}, OVERLAP, "granularity full"),
    "recompute-method": (f"{OVERLAP} --recompute-num-layers 2", {}, OVERLAP,
                         "--recompute-num-layers"),
    "fp32": (OVERLAP, {"--bf16": ""}, OVERLAP, "bf16"),
    "fsdp": (f"{OVERLAP} --use-torch-fsdp2", {"--use-distributed-optimizer": ""}, OVERLAP,
             "FSDP"),
    "dense": (OVERLAP, {"--num-experts 8 --moe-router-topk 2 ": "",
                        "--moe-token-dispatcher-type alltoall ": "",
                        "--expert-model-parallel-size 4": ""}, OVERLAP, "dense"),
}

# Megatron's asserts on flags that a plan has no key for (a layer count with selective
# recompute): refused on import only.
MEGATRON_ONLY = ("recompute-method",)


def _text(name: str) -> str:
    extra, swaps, _, _ = REFUSED[name]
    text = MOE.format(extra=extra)
    for old, new in swaps.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_bridge_yaml_overlap_keys_read_as_the_flags():
    text = BRIDGE.format(extra="").replace("  tp_comm_overlap: true\n", "  tp_comm_overlap: "
                                           "true\n  overlap_moe_expert_parallel_comm: true\n")
    with pytest.raises(JobConfigError) as err:       # a dense model
        read_megatron(text, "run.yaml")
    assert err.value.field == "comm_overlap.overlap_moe_expert_parallel_comm"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a2a_overlap_refusals_name_the_flag(name):
    _, _, flag, why = REFUSED[name]
    with pytest.raises(JobConfigError) as err:
        read_megatron(_text(name))
    assert err.value.field == flag and why in str(err.value)
    if name in MEGATRON_ONLY:
        return
    # the plan refuses the same: the flags without the switches, the moe keys by hand
    plan = read_megatron(_text(name).replace("--delay-wgrad-compute", "").replace(
        OVERLAP, "")).plan
    plan.setdefault("moe", {}).update({"overlap_a2a": name != "delay-alone",
                                       "delay_wgrad": name == "delay-alone"})
    with pytest.raises(WorkloadError, match="moe"):
        resolve(plan_from_dict(plan), 16)


def test_the_cli_exits_2_with_one_line_naming_the_flag(tmp_path, capsys):
    args = tmp_path / "args.txt"
    args.write_text(_text("no-ep"))
    assert main(["import", "megatron", str(args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and OVERLAP in err[0] and "Traceback" not in err[0]
