"""Training-framework profiles: what `"framework"` in a plan sets by default.

A profile gives the defaults of the plan keys a framework decides for its users (the
overlap flags, FSDP's version and resharding, kernels, optimizer implementation, ZeRO
stage, recompute, CUDA graphs, host overhead); a key the plan gives overrides it. Each
default carries the framework code or documentation it is read from. `generic` sets
nothing: it is the simulator's behaviour before profiles existed.

The profile is applied when a plan file is parsed (`workloads.plan.plan_from_dict`); the
Plan then holds the resolved values, so `dataclasses.replace(plan, framework=...)` changes
the name only, not the defaults already applied.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from .errors import WorkloadError
from .fields import check_choice, int_as_float, is_int, json_object, known_keys
from .framework_profiles import (  # noqa: F401 (the profiles, re-exported)
    EAGER_HOST_KERNEL_S, FRAMEWORKS, GENERIC_DEFAULTS, MEGATRON_CORE, MEGATRON_LM,
    MEGATRON_PROFILES, NEMO_AUTOMODEL, PROFILES, RESHARD_UNLESS_PP, TORCHTITAN,
    framework_defaults)
from .framework_traits import traits
from .kernels import KERNEL_FAMILIES


# ------------------------------------------------------------------ plan-file keys
# The plan file's keys for the profile's fields: section -> {key: Plan field}.
OVERLAP_KEYS = {"fsdp_prefetch": "fsdp_prefetch", "async_tp": "async_tp",
                "grad_reduce": "grad_reduce_overlap", "param_gather": "param_gather_overlap",
                "param_gather_align": "param_gather_align", "tp_comm": "tp_comm_overlap"}
FSDP_KEYS = {"enabled": "fsdp", "reshard_after_forward": "reshard_after_forward",
             "version": "fsdp_version", "float8_all_gather": "fsdp_float8_all_gather",
             "grad_sync": "fsdp_grad_sync"}
HOST_KEYS = {"per_step_s": "host_step_s", "per_kernel_s": "host_kernel_s"}
DDP_KEYS = {"bucket_params": "grad_bucket", "grad_reduce_in_fp32": "grad_reduce_fp32",
            "fp8_param_gather": "fp8_param_gather",
            "gradient_accumulation_fusion": "grad_accumulation_fusion",
            "gradient_as_bucket_view": "grad_as_bucket_view"}
LOSS_KEYS = {"kernels": "loss_kernels",     # workloads/loss_memory.py
             "metrics": "loss_metrics"}     # workloads/train_metrics.py
# The dtypes whose Megatron-Bridge recipes turn fp8_param_gather on (the profile's default
# where the plan does not say): bf16_with_fp8_delayed_scaling_mixed, _current_scaling_ and
# bf16_with_mxfp8_mixed; bf16_with_fp8_subchannel_scaling_mixed (block scales) sets it
# false, as does Megatron-LM's --fp8-param-gather default
# (src/megatron/bridge/training/mixed_precision.py at c810129341).
FP8_PARAM_DEFAULT_DTYPES = ("fp8", "fp8_cs", "mxfp8")


def _sharding_sp(raw: dict) -> bool:
    """Whether a raw plan asks for TP > 1 with sequence parallelism."""
    mesh, sharding = raw.get("mesh"), raw.get("sharding")
    tp = mesh.get("tp", 1) if isinstance(mesh, dict) else 1
    sp = sharding.get("sequence_parallel", False) if isinstance(sharding, dict) else False
    return is_int(tp) and tp > 1 and sp is True


def check_megatron_sharding(framework: str, values: dict) -> None:
    """Megatron shards parameters only as FSDP, and the Megatron-LM of 2020-2021 not at all."""
    if framework == "megatron-lm" and values["fsdp"] is True:
        # FSDP came to Megatron with Megatron-Core (--use-torch-fsdp2, --use-megatron-fsdp)
        raise WorkloadError("fsdp.enabled", True, 'false under framework "megatron-lm" (the '
                            '2020-2021 Megatron-LM it models has no FSDP; use "megatron-core")')
    if framework == "megatron-lm" and values["zero_stage"] in (1, 2):
        # the distributed optimizer came with --use-distributed-optimizer in 2022
        # (megatron/optimizer/distrib_optimizer.py); the 2020-2021 optimizers keep every
        # state on every data-parallel rank (megatron/optimizer/optimizer.py @a8d172b)
        raise WorkloadError("zero_stage", values["zero_stage"], '0 under framework '
                            '"megatron-lm" (its 2020-2021 code has no distributed optimizer; '
                            'use "megatron-core")')
    if framework in MEGATRON_PROFILES and values["zero_stage"] == 3 and values["fsdp"] is not True:
        # Megatron has no ZeRO-3 of its own: its distributed optimizer shards the optimizer
        # states and main weights only (megatron/core/optimizer/distrib_optimizer.py);
        # parameters are sharded by Megatron-FSDP or torch FSDP2 (--use-megatron-fsdp,
        # --use-torch-fsdp2: megatron/training/arguments.py), the plan's fsdp section.
        raise WorkloadError("zero_stage", 3, f'0, 1 or 2 under framework "{framework}" (Megatron '
                            'has no ZeRO-3; Megatron-Core shards parameters as FSDP: fsdp.enabled)')


def _pipeline_degree(raw: dict) -> int:
    """The raw plan's mesh.pp where it is an integer (1 otherwise: Plan checks it)."""
    mesh = raw.get("mesh")
    pp = mesh.get("pp", 1) if isinstance(mesh, dict) else 1
    return pp if is_int(pp) else 1


def _interleaved(raw: dict) -> bool:
    """Whether the plan's pipeline, as written, is interleaved with chunks to align."""
    pipeline = raw.get("pipeline")
    return (isinstance(pipeline, dict) and pipeline.get("schedule") == "interleaved"
            and pipeline.get("virtual_stages", 1) != 1)


def kernel_modes(value: Any, framework: str) -> dict:
    """The plan's `kernels` as Plan fields: a mode for every family ("fused", "eager"), or
    an object {"default": MODE, FAMILY: MODE, ...} (workloads/kernels.py KERNEL_FAMILIES)
    whose default is the profile's where it names none. The modes are checked by Plan."""
    if not isinstance(value, Mapping):
        return {"kernels": value, "kernels_by_family": MappingProxyType({})}
    known_keys(value, "kernels", ("default",) + KERNEL_FAMILIES)
    default = value.get("default", framework_defaults(framework)["kernels"])
    return {"kernels": default, "kernels_by_family": MappingProxyType(
        {family: mode for family, mode in value.items() if family != "default"})}


def framework_values(raw: dict) -> dict:
    """The Plan fields a framework profile sets defaults for, from a raw plan object: the
    profile's value unless the plan gives one. Values are checked by Plan."""
    framework = raw.get("framework", "generic")
    check_choice(framework, "framework", FRAMEWORKS)
    given: dict = {}
    for section, keys in (("overlap", OVERLAP_KEYS), ("fsdp", FSDP_KEYS),
                          ("host_overhead", HOST_KEYS), ("ddp", DDP_KEYS),
                          ("loss", LOSS_KEYS)):
        obj = json_object(raw.get(section), section)
        known_keys(obj, section, tuple(keys))
        given.update({keys[k]: v for k, v in obj.items()})
    for key in ("zero_stage", "recompute", "kernels", "optimizer", "cuda_graphs",
                "attention"):
        if key in raw:
            given[key] = raw[key]
    if "kernels" in given:
        given.update(kernel_modes(given["kernels"], framework))
    # (ddp.gradient_accumulation_fusion is checked with the FSDP it meets: plan_checks.py)
    if "grad_reduce_fp32" in given and framework != "megatron-core":
        raise WorkloadError("ddp.grad_reduce_in_fp32", given["grad_reduce_fp32"],
                            'a key of framework "megatron-core" only (its DDP gradient buffer)')
    torch_loss = traits(framework).torch_cross_entropy
    if given.get("loss_metrics") and framework != "generic":
        raise WorkloadError("loss.metrics", given["loss_metrics"], 'a key of framework '
                            '"generic" only (Megatron-Core and torchtitan compute the loss '
                            'alone: 0)')
    values = {**framework_defaults(framework), **given}
    # The loss runs as the model's kernels do unless the plan says otherwise: torch.compile
    # compiles it with the model (torchtitan from bbb1b616e: workloads/loss_memory.py);
    # Megatron-Core's vocab-parallel cross-entropy is its fused kernel unless the plan says
    # "unfused" (--cross-entropy-loss-fusion, which Megatron-Bridge sets on the models it
    # converts, is off in Megatron-LM by default: workloads/jobs/megatron.py reads it),
    # Megatron-LM's as its profile says.
    values.setdefault("loss_kernels", values["kernels"] if torch_loss else "fused")
    if "fsdp" not in given and given.get("zero_stage") in (1, 2):
        values["fsdp"] = False      # the plan's ZeRO 1/2 over a profile's FSDP
    if values["fsdp"] is True and "zero_stage" not in given:
        values["zero_stage"] = 0    # FSDP is ZeRO-3 by itself (a profile's ZeRO-1 yields)
    if raw.get("muon") is not None and "zero_stage" not in given:
        values["zero_stage"] = 0    # Muon's layer-wise optimizer replaces the distributed
                                    # one (workloads/muon.py; a profile's ZeRO-1 yields)
    check_megatron_sharding(framework, values)
    # A profile's overlap default applies only where the mechanism exists: the parameter
    # all-gather of ZeRO 1/2, TP communication under sequence parallelism (Megatron asserts
    # both: arguments.py); the plan's own value is checked against them by resolve.
    if "param_gather_overlap" not in given and (values["fsdp"] is True
                                                 or values["zero_stage"] not in (1, 2)):
        values["param_gather_overlap"] = False
    if "param_gather_align" not in given and not (values["param_gather_overlap"]
                                                   and _interleaved(raw)):
        values["param_gather_align"] = False    # it aligns the interleaved chunks' gathers
    training = raw.get("training")
    dtype = training.get("dtype") if isinstance(training, dict) else None
    if "fp8_param_gather" not in given and (values["fsdp"] is True
                                             or dtype not in FP8_PARAM_DEFAULT_DTYPES
                                             or raw.get("muon") is not None):
        # FP8 weights only with an FP8 recipe, and not under Muon (Megatron-Bridge v0.5.0
        # kimi_llm_pretrain.py turns them off: they need the distributed optimizer)
        values["fp8_param_gather"] = False
    if "grad_reduce_fp32" in given and values["fsdp"] is True \
            and values["fsdp_version"] != "megatron":
        # Megatron-Core's torch FSDP2 wrapper calls fully_shard without a
        # MixedPrecisionPolicy (megatron/core/distributed/torch_fully_sharded_data_parallel.py
        # at d98e8a64): there is no main_grad buffer whose dtype the key would set
        raise WorkloadError("ddp.grad_reduce_in_fp32", given["grad_reduce_fp32"],
                            'a key of Megatron-Core\'s DDP / distributed optimizer or of '
                            'fsdp.version "megatron" (its torch FSDP2 takes no gradient dtype)')
    sharded = values["fsdp"] is True or values["zero_stage"] == 3
    if framework in RESHARD_UNLESS_PP and "reshard_after_forward" not in given \
            and _pipeline_degree(raw) > 1 and sharded:
        values["reshard_after_forward"] = False
    if "fsdp_grad_sync" not in given and not sharded:
        values["fsdp_grad_sync"] = "auto"   # a profile's FSDP sync needs FSDP
    if values["fsdp"] is True and "grad_bucket" not in given:
        values["grad_bucket"] = "unit"    # FSDP reduces per unit; DDP buckets do not apply
    tp_sp = _sharding_sp(raw)
    for key in ("tp_comm_overlap", "async_tp"):
        if key not in given and not tp_sp:
            values[key] = False
    for key in ("host_step_s", "host_kernel_s"):   # JSON 0 is a number of seconds too
        values[key] = int_as_float(values[key])
    return {"framework": framework, **values}
