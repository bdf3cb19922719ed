"""Muon under Megatron-Core's layer-wise distributed optimizer: the plan's "muon" section
(parsed and checked here; workloads/muon_step.py lowers it into the step's tasks).

What a Megatron-Core run with `optimizer: dist_muon` does each step (Megatron-LM d0b3b775,
the Megatron-Bridge v0.5.0 submodule: megatron/core/optimizer/layer_wise_optimizer.py,
emerging_optimizers.py; NVIDIA-NeMo/Emerging-Optimizers orthogonalized_optimizer.py and
muon_utils.py), and how it is lowered here:

* Gradients: DDP all-reduces every gradient over its data-parallel group (dp x cp; the
  routed experts' over expert DP), in buckets overlapped with the backward. Muon needs
  Megatron's distributed optimizer off (Megatron-Bridge recipes/kimi/kimi_k2.py: "Muon
  needs this to be False"), so the plan's zero_stage is 0 and the reduction is the
  ordinary one (workloads/stage_dp.py).
* Ownership: each data-parallel rank updates whole parameters of its own, dealt by size
  ("ping-pong" by numel when DDP has no distributed-optimizer layout); the step and the
  memory are the busiest rank's (workloads/muon_ownership.py).
* Muon on every 2-D weight that is not the embedding or the output layer (the router and
  each expert's fused fc1 / fc2 included, MLA's five projections as five): momentum,
  Nesterov, then `ns_steps` Newton-Schulz steps in bf16 (the recipe's fp32_matmul_prec
  "medium": the momentum is cast to bf16 and back), each X X^T, A A and B X on the weight
  oriented so that X is m x n with m <= n: 4 m^2 n + 2 m^3 FLOPs a step (ns_flops), as
  GEMMs priced by the GEMM model at their own shapes. Tensor parallelism is "blockwise"
  (muon_tp_mode, Megatron-Bridge's default): each TP shard is orthogonalised alone, at its
  shard's shape. Adam (the plan's `optimizer` implementation) updates the rest.
* Element-wise work of a Muon weight, fp32 passes in a loop over the parameters
  (MUON_STEP_BYTES, per owned parameter): the main gradient made fp32 (read 2, write 4),
  its norm (read 4), decoupled weight decay p += -wd lr p (read 4, write 4), the momentum
  lerp (read 8, write 4), Nesterov's lerp into a new tensor (read 8, write 4), the
  Frobenius normalisation (read 4; read 4, write 4), the cast to bf16 (read 4, write 2)
  and back (read 2, write 4), the spectral scale (read 4, write 4), the update p += -lr u
  (read 8, write 4) and the copy back to the bf16 model weight (read 4, write 2): 92 B,
  nine launches per weight (MUON_STEP_LAUNCHES) beside its 3 x ns_steps GEMMs.
* After the step the updated parameters are all-gathered, not overlapped
  (overlap_param_gather is off with Muon): one all-gather over dp x cp of the stage's
  tensors but the routed experts', one over expert DP of theirs (allgather_params:
  flatten, all_gather, unflatten), with the flatten and unflatten copies (read 2, write 2
  per gathered parameter).
* Memory: a Muon weight keeps one fp32 moment fewer than an Adam one (its momentum, no
  variance): 8 B per owned parameter against the plan's 12 (fp32 main copy and moments),
  both on the owning rank only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import WorkloadError
from .fields import is_int, json_object, known_keys

SECTION = "muon"
# Megatron-Bridge recipes/utils/optimizer_utils.py distributed_muon_with_cosine_annealing:
# muon_num_ns_steps = 5 (the quintic coefficient set has 5 entries; Emerging-Optimizers
# requires a multiple of them)
NS_STEPS_DEFAULT = 5
MAX_NS_STEPS = 50   # bound on the work one plan asks for (5 is every published setting)
MUON_STEP_BYTES = 92.0       # HBM bytes per owned Muon parameter (module docstring)
# element-wise launches per Muon weight: weight decay, the momentum lerp, Nesterov's lerp,
# the norm and the division, the casts to bf16 and back, the scale and the update (the
# main-gradient copy, the gradient norm and the copy back are multi-tensor launches over
# all weights; module docstring)
MUON_STEP_LAUNCHES = 9
FP32_MOMENT_BYTES = 4        # the moment Muon keeps fewer than Adam (momentum, no variance)
GATHER_COPY_BYTES = 4        # flatten / unflatten copy per gathered bf16 parameter


@dataclass(frozen=True)
class Muon:
    """The plan's "muon" section: Newton-Schulz steps per update."""

    ns_steps: int = NS_STEPS_DEFAULT


def parse_muon(raw: Any) -> Muon | None:
    """The plan's `muon` section (None when absent)."""
    if raw is None:
        return None
    raw = json_object(raw, SECTION)
    known_keys(raw, SECTION, ("ns_steps",))
    steps = raw.get("ns_steps", NS_STEPS_DEFAULT)
    if not is_int(steps) or not 1 <= steps <= MAX_NS_STEPS:
        raise WorkloadError(f"{SECTION}.ns_steps", steps,
                            f"an integer in [1, {MAX_NS_STEPS}] (Megatron-Bridge: 5)")
    return Muon(steps)


def check_muon(plan) -> None:
    """Muon as Megatron-Core runs it; the error names the setting that rules it out."""
    if plan.muon is None:
        return
    if not isinstance(plan.muon, Muon):
        raise WorkloadError(SECTION, plan.muon, "an object (workloads/muon.py)")
    rules = (("framework", plan.framework, plan.framework == "megatron-core",
              'megatron-core (the layer-wise distributed optimizer is Megatron-Core\'s)'),
             ("fsdp.enabled", plan.fsdp, not plan.fsdp, "false under muon (DDP all-reduces "
              "the gradients; each rank updates whole parameters)"),
             ("zero_stage", plan.zero_stage, plan.zero_stage == 0, "0 under muon (Muon "
              "needs Megatron's distributed optimizer off; its layer-wise optimizer shards "
              "the states itself)"),
             ("ddp.fp8_param_gather", plan.fp8_param_gather, not plan.fp8_param_gather,
              "false under muon (FP8 primary weights need Megatron's distributed "
              "optimizer: Megatron-Bridge's Kimi K2 recipes turn them off)"),
             ("precision_aware_optimizer", "set", plan.optimizer_states is None,
              "absent under muon (fp32 main weights and momentum)"),
             ("lora", "set", plan.lora is None, "absent under muon"),
             ("training.dtype", plan.training.dtype, plan.training.dtype != "fp32",
              "a 16-bit or lower dtype under muon (the step priced is the bf16 one: "
              "Megatron's Float16OptimizerWithFloat16Params around Muon)"),
             ("optimizer", plan.optimizer, plan.optimizer == "fused", "fused under muon "
              "(Megatron-Core's Adam for the non-matrix weights is the fused one)"),
             ("sharding", "a 2D/2.5D/3D TP grid", plan.grid_strategy is None,
              "1D tensor parallelism under muon"))
    for field, value, ok, allowed in rules:
        if not ok:
            raise WorkloadError(field, value, allowed)
    if "w3" in plan.model.mlp_matrices:
        for layer in range(plan.model.num_layers + plan.model.mtp_layers):
            st = plan.strategies(layer)
            if st["w1"] != st["w3"]:   # Megatron's linear_fc1 is one tensor
                raise WorkloadError("sharding.w3", st["w3"], f"w1's strategy ({st['w1']}) "
                                    "under muon: Megatron-Core holds w1 and w3 as one "
                                    "weight, orthogonalised whole")


def ns_flops(rows: int, cols: int, steps: int) -> float:
    """FLOPs of `steps` Newton-Schulz steps on one rows x cols weight: per step X X^T
    (2 m^2 n), A A (2 m^3) and B X (2 m^2 n), m <= n (muon_utils.newton_schulz)."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def ns_gemms(rows: int, cols: int) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of one Newton-Schulz step's three GEMMs on a rows x cols weight."""
    m, n = min(rows, cols), max(rows, cols)
    return ((m, m, n), (m, m, m), (m, n, m))
