"""Megatron-LM's precision-aware optimizer flags <-> the plan's precision_aware_optimizer
section (workloads/optimizer_states.py), and which FSDP the flags turn on.

core_v0.15.0's megatron/training/arguments.py: --use-precision-aware-optimizer turns it on;
--exp-avg-dtype and --exp-avg-sq-dtype take fp32, fp16, bf16 or fp8 and --main-params-dtype
fp32 or fp16 (megatron/core/optimizer/optimizer_config.py asserts fp32 for each without the
switch); --main-grads-dtype is the gradient buffer's dtype (megatron.py _grad_reduce_fp32).
A Megatron-Bridge YAML writes the dtypes as torch dtypes (torch.bfloat16: the flags'
map_dtype in reverse). store_param_remainders has no flag: Megatron's default (true).
master_weights "megatron" (a BF16 run whose optimizer config carries a recipe other than
delayed scaling) reads from a Bridge YAML or from --fp8-recipe without an FP8 format, and
is written back as --fp8-recipe tensorwise.
"""
from __future__ import annotations

from typing import Any

from .findings import JobConfigError
from ..optimizer_states import MAIN_PARAM_DTYPES, STATE_DTYPE_BYTES

SWITCH = "use-precision-aware-optimizer"
DTYPE_FLAGS = {"exp-avg-dtype": tuple(STATE_DTYPE_BYTES),
               "exp-avg-sq-dtype": tuple(STATE_DTYPE_BYTES),
               "main-params-dtype": MAIN_PARAM_DTYPES}
# megatron/training/arguments.py map_dtype, read backwards (fp8 states are torch.uint8)
TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
                "torch.uint8": "fp8"}


def precision_aware_section(get) -> dict[str, Any] | None:
    """The plan's precision_aware_optimizer section from the flags (None: switch off)."""
    dtypes = {}
    for flag, allowed in DTYPE_FLAGS.items():
        value = _dtype_name(get.str(flag, "fp32"))
        if value not in allowed:
            raise JobConfigError(get.name(flag), value, ", ".join(allowed))
        dtypes[flag.replace("-", "_")] = value
    if get.on(SWITCH):
        if _megatron_master(get):
            dtypes["master_weights"] = "megatron"
        return dtypes
    # --main-grads-dtype too (megatron/core/optimizer/optimizer_config.py at core_v0.15.0)
    dtypes["main_grads_dtype"] = _dtype_name(get.str("main-grads-dtype", "fp32"))
    for flag, value in dtypes.items():
        if value != "fp32":
            raise JobConfigError(get.name(flag.replace("_", "-")), value, "fp32 without "
                                 f"{get.name(SWITCH)} (Megatron-Core asserts it)")
    return None


def _megatron_master(get) -> bool:
    """Whether a BF16 run's optimizer config carries a recipe other than delayed scaling,
    so Megatron-Core keeps its own fp32 master (workloads/optimizer_states.py): a
    Megatron-Bridge YAML (its MixedPrecisionConfig's fp8_recipe, default "tensorwise", is
    copied into the optimizer config), or Megatron-LM flags with --fp8-recipe other than
    delayed and no FP8/FP4 format."""
    if get.str("fp8-format") is not None or get.str("fp4-format") is not None:
        return False       # a quantized run: the training dtype's own rule
    if get.bridge_yaml:
        return True
    return get.str("fp8-recipe", "delayed") != "delayed"


def _dtype_name(value: Any) -> Any:
    """A flag's dtype name; a Bridge YAML's torch dtype (a string, or a `_target_` object)
    read as the flag's name (TORCH_DTYPES)."""
    if isinstance(value, dict):
        value = value.get("_target_")
    return TORCH_DTYPES.get(value, value) if isinstance(value, str) else value


def precision_aware_flags(plan) -> list[str]:
    """The flags of a plan's precision_aware_optimizer section."""
    section = plan.precision_aware_optimizer
    if section is None:
        return []
    flags = [f"--{SWITCH}", f"--exp-avg-dtype {section.exp_avg_dtype}",
             f"--exp-avg-sq-dtype {section.exp_avg_sq_dtype}",
             f"--main-params-dtype {section.main_params_dtype}"]
    if section.master_weights == "megatron" and plan.training.dtype == "bf16":
        # the optimizer config's recipe, which a BF16 model does not use (_megatron_master)
        flags.append("--fp8-recipe tensorwise")
    return flags


def fsdp_version(get) -> int | str | None:
    """The FSDP the flags turn on: torch's FSDP2, Megatron-FSDP (sharding everything:
    data-parallel-sharding-strategy optim_grads_params; the others are findings of
    megatron.py's _classify), or None."""
    torch_fsdp, megatron_fsdp = get.on("use-torch-fsdp2"), get.on("use-megatron-fsdp")
    if torch_fsdp and megatron_fsdp:
        raise JobConfigError(get.name("use-megatron-fsdp"), True,
                             "false with --use-torch-fsdp2 (one FSDP at a time)")
    strategy = get.str("data-parallel-sharding-strategy", "no_shard")
    if megatron_fsdp and strategy != "optim_grads_params":
        raise JobConfigError(get.name("data-parallel-sharding-strategy"), strategy,
                             "optim_grads_params with --use-megatron-fsdp (ZeRO-3, the "
                             "strategy the simulator models)")
    return 2 if torch_fsdp else "megatron" if megatron_fsdp else None


def megatron_fsdp_findings(get, findings) -> None:
    """Flags Megatron-FSDP takes that the simulator does not price its way: FP8 weights
    gathered at 1 byte (the plan gathers Megatron-FSDP's units in BF16) and the DDP bucket
    size (Megatron-FSDP buckets per unit: suggested_communication_unit_size)."""
    if get.on("fp8-param-gather"):
        findings.problem(get.name("fp8-param-gather"), True, "FP8 weights gathered at 1 "
                         "byte under Megatron-FSDP (simulated gathering BF16)")
    if get.int("ddp-bucket-size") is not None:
        findings.ignore(get.name("ddp-bucket-size"), "Megatron-FSDP buckets per FSDP unit")
