"""Adam's states as the optimizers lay them out: Megatron-Core's precision-aware optimizer
(states in lower precision, this docstring) and Apex's DistributedFusedAdam as NeMo 1
configures it (below, `DistributedFusedAdam`). `Plan.optimizer_states` is the one reader.

A plan says `"precision_aware_optimizer": {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype":
"bf16"}` for Megatron-LM's `--use-precision-aware-optimizer --exp-avg-dtype bf16
--exp-avg-sq-dtype bf16` (the section's presence turns it on; each key defaults to
Megatron's default). What it changes, from Megatron-LM d98e8a64 (megatron/core/optimizer/
optimizer_config.py, optimizer/__init__.py, optimizer/distrib_optimizer.py) and Transformer
Engine's FusedAdam (transformer_engine/pytorch/optimizers/fused_adam.py):

* The moments (exp_avg, exp_avg_sq) are held in their own dtypes: fp32, bf16, fp16 or fp8
  (4, 2, 2, 1 bytes), against fp32 without it.
* Who holds the fp32 master weight. Transformer Engine's FusedAdam does
  (`master_weights=True`) when the main parameters are not fp32 or the run has no FP8
  recipe other than delayed scaling (OptimizerConfig.use_precision_aware_optimizer_no_fp8_
  or_ds_fp8); it then also writes the 16-bit model weight in the same kernel
  (DistributedOptimizer._copy_main_params_to_model_params returns early) and reads the
  gradient from the 16-bit gradient buffer in place (`decoupled_grad`, no `.float()` copy:
  _copy_model_grads_to_main_grads). With a BF16 model and fp32 main parameters it keeps
  only the 16 bits of each fp32 master the BF16 weight does not already hold
  (`store_param_remainders`, Megatron's default from Transformer Engine 2.1: an int16 per
  parameter in the distributed optimizer's state; FusedAdam keeps remainders where the
  parameter's dtype is bf16, fused_adam.py step). Assumption: with FP8 primary weights
  under delayed scaling it keeps remainders too (a quantized parameter reports its
  nominal bf16 dtype). Under current-scaling FP8, MXFP8 and NVFP4 with fp32 main
  parameters Megatron keeps its own fp32 master, as without the flag.
* The recipe Megatron-Core's OptimizerConfig reads is its own fp8_recipe field, not the
  model's: Megatron-LM's launcher fills it from --fp8-recipe (default "delayed", so a BF16
  run gets Transformer Engine's master), while Megatron-Bridge copies its
  MixedPrecisionConfig into it, whose fp8_recipe defaults to "tensorwise" even for BF16
  (src/megatron/bridge/training/mixed_precision.py update_config_with_precision_overrides
  at c810129341), so a Bridge BF16 run keeps Megatron's fp32 master. `master_weights`
  says which: "auto" (the rule above from the training dtype, Megatron-LM's launcher) or
  "megatron" (Megatron's fp32 master whatever the dtype, as Megatron-Bridge's configs
  give it; needs fp32 main parameters).
* `--main-grads-dtype bf16` is the plan's `ddp.grad_reduce_in_fp32: false` (Megatron-LM
  megatron/training/arguments.py: bf16 main gradients leave accumulate_allreduce_grads_in_
  fp32 off), so it is not a key here.

Megatron allows the flag with Adam only, through Transformer Engine's FusedAdam, and the
simulator prices it on the distributed optimizer (zero_stage 1 or more, no FSDP) of a
megatron-core plan; other plans are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import WorkloadError
from .fields import check_bool, check_choice, json_object, known_keys
from .precision import BF16_BYTES, FP32_BYTES

# Bytes of one element of each dtype Megatron-LM accepts for the moments (arguments.py
# --exp-avg-dtype / --exp-avg-sq-dtype choices; fp8 is stored as uint8 with a scale per
# tensor, not counted) and for the main parameters (--main-params-dtype: fp32, fp16).
STATE_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
MAIN_PARAM_DTYPES = ("fp32", "fp16")
# The 16 low bits of an fp32 master its BF16 weight does not hold (an int16 per parameter).
PARAM_REMAINDER_BYTES = 2
# The training dtypes under which Transformer Engine's FusedAdam holds an fp32 master: no
# FP8 recipe (bf16) or delayed scaling (the plan's fp8, workloads/precision.py RECIPES).
TE_MASTER_DTYPES = ("bf16", "fp8")
# The 16-bit model weight and gradient buffer elements.
MODEL_BYTES = BF16_BYTES
SECTION = "precision_aware_optimizer"
MASTER_WEIGHTS = ("auto", "megatron")


@dataclass(frozen=True)
class PrecisionAwareOptimizer:
    """The precision-aware optimizer's state dtypes (module docstring)."""

    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    store_param_remainders: bool = True
    master_weights: str = "auto"

    def __post_init__(self) -> None:
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            check_choice(getattr(self, name), f"{SECTION}.{name}", tuple(STATE_DTYPE_BYTES))
        check_choice(self.main_params_dtype, f"{SECTION}.main_params_dtype",
                     MAIN_PARAM_DTYPES)
        check_bool(self.store_param_remainders, f"{SECTION}.store_param_remainders")
        check_choice(self.master_weights, f"{SECTION}.master_weights", MASTER_WEIGHTS)
        if self.master_weights == "megatron" and self.main_params_dtype != "fp32":
            raise WorkloadError(f"{SECTION}.master_weights", self.master_weights,
                                'auto with main_params_dtype fp16 (Transformer Engine then '
                                "holds the master whatever the recipe)")

    def te_holds_master(self, dtype: str) -> bool:
        """Whether Transformer Engine's FusedAdam holds the master weight (module docstring)."""
        if self.main_params_dtype != "fp32":
            return True
        return self.master_weights == "auto" and dtype in TE_MASTER_DTYPES

    def master_bytes(self, dtype: str) -> int:
        """Bytes per parameter of the master weight under training dtype `dtype`."""
        if self.te_holds_master(dtype) and self.main_params_dtype == "fp32" \
                and self.store_param_remainders:
            return PARAM_REMAINDER_BYTES
        return STATE_DTYPE_BYTES[self.main_params_dtype]

    def moment_bytes(self) -> int:
        """Bytes per parameter of the two moments."""
        return STATE_DTYPE_BYTES[self.exp_avg_dtype] + STATE_DTYPE_BYTES[self.exp_avg_sq_dtype]

    def state_bytes(self, dtype: str, fp8_params: bool = False) -> int:
        """Optimizer-state bytes per parameter: the master weight and both moments
        (fp8_params: the module docstring's assumption covers FP8 primary weights)."""
        return self.master_bytes(dtype) + self.moment_bytes()

    def adam_bytes(self, dtype: str, grad_bytes: int, fp8_params: bool = False) -> float:
        """HBM bytes per parameter of one FusedAdam step: the gradient read at `grad_bytes`,
        each state read and written. Where Transformer Engine holds the master it also
        reads and writes the 16-bit weight (the remainders' other half) or writes it (a
        whole master); otherwise Adam reads Megatron's fp32 copy of the gradient and
        writes the 16-bit weight, as the plain fused step is priced (workloads/kernels.py
        ADAM_STEP: 30 B with fp32 states)."""
        states = self.master_bytes(dtype) + self.moment_bytes()
        if not self.te_holds_master(dtype):
            return FP32_BYTES + 2 * states + MODEL_BYTES
        remainders = self.store_param_remainders and self.main_params_dtype == "fp32"
        return grad_bytes + 2 * states + (2 if remainders else 1) * MODEL_BYTES


def parse_precision_aware_optimizer(raw: Any) -> PrecisionAwareOptimizer | None:
    """The plan's `precision_aware_optimizer` section (None when absent)."""
    if raw is None:
        return None
    raw = json_object(raw, SECTION)
    fields = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype",
              "store_param_remainders", "master_weights")
    known_keys(raw, SECTION, fields)
    return PrecisionAwareOptimizer(**{k: raw[k] for k in fields if k in raw})


def check_precision_aware_plan(plan) -> None:
    """The flag is Megatron-Core's distributed optimizer's, with FusedAdam (module
    docstring); the error names the plan setting that rules it out."""
    if plan.precision_aware_optimizer is None:
        return
    _require(plan, SECTION, (
        "megatron-core (the flag is Megatron-Core's)",
        "false (Megatron-Core's distributed optimizer, not FSDP)",
        ">= 1 (the distributed optimizer)",
        "fused (Transformer Engine's FusedAdam)",
        "a 16-bit or lower dtype (an fp32 run has no master copy)"))


def _require(plan, section: str, allowed: tuple[str, ...]) -> None:
    """WorkloadError naming the first plan setting that rules `section` out. Both state
    layouts belong to a sharded (distributed-optimizer) Adam of a 16-bit megatron-core run;
    `allowed` says why for each of the five settings, in order."""
    needs = (("framework", plan.framework, plan.framework == "megatron-core"),
             ("fsdp.enabled", plan.fsdp, not plan.fsdp),
             ("zero_stage", plan.zero_stage, plan.zero_stage >= 1),
             ("optimizer", plan.optimizer, plan.optimizer == "fused"),
             ("training.dtype", plan.training.dtype, plan.training.dtype != "fp32"))
    for (field, value, ok), why in zip(needs, allowed):
        if not ok:
            raise WorkloadError(f"{section} with {field}", value, why)


# ------------------------------------------------------------- Apex DistributedFusedAdam
# NeMo 1's `optim: name: distributed_fused_adam` is Apex's DistributedFusedAdam (apex/
# contrib/optimizers/distributed_fused_adam.py, StateBucket): per DP shard of a bucket it
# holds exp_avg and exp_avg_sq in the optimizer's `dtype`, and a copy of the parameters
# (`store_params`, in `dtype`) or the 16 low bits of fp32 ones (`store_param_remainders`,
# int16) or neither. NeMo chooses (nemo/collections/nlp/models/language_modeling/
# megatron_base_model.py setup_optimization; these four branches at v1.23.0 and v2.0.0):
# fp8_params -> store_params; optimizer dtype == the model's (bf16 under megatron_amp_O2)
# -> neither (the bf16 weight is the master); fp32 optimizer with a bf16 model ->
# remainders; any other pair -> store_params. From v2.0.0 an optim config's own
# store_params wins (NeMo decides only `if 'store_params' not in optim_config`; v1.23.0
# always decides).
APEX_SECTION = "distributed_fused_adam"
APEX_STATE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class DistributedFusedAdam:
    """Apex's DistributedFusedAdam as NeMo 1 configures it (the comment above)."""

    dtype: str = "fp32"     # the optimizer's `dtype` (its states'); Apex's default fp32
    # NeMo's choice, or the optim config's store_params (then no remainders: Apex's
    # default store_param_remainders False); None: NeMo's rule from the plan
    store_params: bool | None = None

    def __post_init__(self) -> None:
        check_choice(self.dtype, f"{APEX_SECTION}.dtype", tuple(APEX_STATE_BYTES))
        if self.store_params is not None:
            check_bool(self.store_params, f"{APEX_SECTION}.store_params")

    def master(self, dtype: str, fp8_params: bool) -> str:
        """What it keeps of the master weight: "params" (a copy in its dtype),
        "remainders" (int16) or "none" (the 16-bit model weight serves)."""
        model = "fp16" if dtype == "fp16" else "bf16"    # megatron_amp_O2's model dtype
        if self.store_params is not None:
            return "params" if self.store_params else "none"
        if fp8_params:
            return "params"
        if self.dtype == model:
            return "none"
        return "remainders" if (self.dtype, model) == ("fp32", "bf16") else "params"

    def state_bytes(self, dtype: str, fp8_params: bool = False) -> int:
        """Optimizer-state bytes per parameter (sharded over data parallelism)."""
        master = {"params": APEX_STATE_BYTES[self.dtype], "remainders": PARAM_REMAINDER_BYTES,
                  "none": 0}[self.master(dtype, fp8_params)]
        return master + 2 * APEX_STATE_BYTES[self.dtype]

    def adam_bytes(self, dtype: str, grad_bytes: int, fp8_params: bool = False) -> float:
        """HBM bytes per parameter of one step: the gradient shard read, each state read
        and written, and the 16-bit weight the all-gather sends written (and read too where
        it is the master's high half or the master itself)."""
        weight = MODEL_BYTES if self.master(dtype, fp8_params) == "params" else 2 * MODEL_BYTES
        return grad_bytes + 2 * self.state_bytes(dtype, fp8_params) + weight


def parse_distributed_fused_adam(raw: Any) -> DistributedFusedAdam | None:
    """The plan's `distributed_fused_adam` section (None when absent)."""
    if raw is None:
        return None
    raw = json_object(raw, APEX_SECTION)
    known_keys(raw, APEX_SECTION, ("dtype", "store_params"))
    return DistributedFusedAdam(**raw)


def check_optimizer_states(plan) -> None:
    """One state layout at a time, each on the plan it belongs to (the error names the
    setting that rules it out)."""
    check_precision_aware_plan(plan)
    if plan.distributed_fused_adam is None:
        return
    if plan.precision_aware_optimizer is not None:
        raise WorkloadError(APEX_SECTION, "with precision_aware_optimizer",
                            "one optimizer-state section (Apex's or Megatron-Core's)")
    _require(plan, APEX_SECTION, (
        "megatron-core (NeMo 1 trains Megatron-Core models)",
        "false (Apex shards the optimizer state itself)",
        ">= 1 (the optimizer state is sharded over data parallelism)",
        "fused (Apex's multi-tensor Adam kernel)",
        "a 16-bit or lower dtype (NeMo's megatron_amp_O2)"))
