"""The plan's vocabulary (the names a plan file accepts for its strategies, modes and
stages) and the checks of its single fields, which Plan.__post_init__ runs
(workloads/plan.py); each error names the field, the value and what is allowed.
"""
from __future__ import annotations

from collections.abc import Mapping

from .attention_impls import ATTENTION_IMPLS, BY_GPU_IMPLS, VARLEN_IMPL
from .ddp_buckets import BUCKET_MODES
from .errors import WorkloadError
from .fields import MAX_INT, check_bool, check_choice, check_int, check_number, \
    check_optional_name, is_int
from .framework_traits import traits
from .frameworks import FRAMEWORKS
from .kernels import KERNEL_FAMILIES, KERNEL_MODES, LOSS_KERNEL_MODES, OPTIMIZERS
from .module_recompute import RECOMPUTE_MODULES
from .lora import LoRA
from .optimizer_states import DistributedFusedAdam, PrecisionAwareOptimizer
from .train_metrics import MAX_LOSS_METRICS
from .activation_offload import ActivationOffload
from .moe_options import MoEOptions

PROJECTIONS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
# 1D Megatron-style strategies, then the 2D/2.5D/3D tensor-parallel layouts (Xu et al.
# 2021 arXiv:2104.05343, Wang et al. 2021 arXiv:2105.14500, Bian et al. 2021
# arXiv:2105.14450; workloads/tp_grid.py): a plan uses one grid strategy for every
# projection or none.
# STRATEGIES: the per-projection (1D) ones, which may be mixed freely (search enumerates
# them); ALL_STRATEGIES: everything a plan file accepts.
STRATEGIES = ("col", "row", "seq", "replicate")
GRID_STRATEGIES = ("tp2d", "tp2.5d", "tp3d_gather", "tp3d_allreduce")
ALL_STRATEGIES = STRATEGIES + GRID_STRATEGIES
# Context parallelism: ring attention (KV blocks around the CP ring), Llama 3's all-gather
# of K and V, or Ulysses all-to-all.
CP_MODES = ("ring", "all_gather", "all_to_all")
# selective: the attention core (Korthikanti et al. 2022); selective_op: torchtitan's
# op-level selective checkpointing (every other matmul and attention kept); full: the layer.
RECOMPUTE = ("none", "selective", "selective_op", "full")
MAX_LOAD_IMBALANCE = 64.0
ZERO_STAGES = (0, 1, 2, 3)   # ZeRO (Rajbhandari et al. 2020): none, optimizer, +grads, +params
# ATTENTION_IMPLS (workloads/attention_impls.py): flash (FlashAttention: scores never
# stored, recomputed inside the backward); eager and fused_softmax (PyTorch's math path,
# Megatron-LM's pre-FlashAttention path): the s x s scores are materialised and kept;
# cudnn (SDPA's cuDNN backend, priced as flash); sdpa (torchtitan: the backend its SDPA
# picks on the topology's GPU, named by the simulator); flash_varlen (flash with flash-attn's
# unpad and pad copies around it: workloads/varlen_padding.py).
# FSDP1 (FlatParameter per wrapped unit) | FSDP2 (fully_shard) | Megatron-FSDP (flat buffers
# per unit whose views the parameters and gradients are: workloads/stage_dp.py)
FSDP_VERSIONS = (1, 2, "megatron")
# fsdp.grad_sync: reduce-scatter every micro-batch, once a step (gradient sync and
# reshard-after-backward off until the last backward), or torch's rule (workloads/
# grad_state.py fsdp_no_sync)
FSDP_GRAD_SYNC = ("auto", "microbatch", "step")
MAX_HOST_OVERHEAD_S = 10.0   # bound on host_overhead values: far beyond any real step


def check_plan_fields(plan) -> None:
    """Every single-field check of a Plan (combinations of fields are checked by
    `resolve`); a WorkloadError names the first field that fails."""
    _check_flags(plan)
    _check_compute(plan)
    _check_sections(plan)
    _check_sharding(plan)


def _check_flags(plan) -> None:
    """The switches, the framework, the reduction buckets, host overheads and ZeRO."""
    for name, where in (("fsdp", "fsdp.enabled"),
                        ("reshard_after_forward", "fsdp.reshard_after_forward"),
                        ("sequence_parallel", "sharding.sequence_parallel"),
                        ("fsdp_prefetch", "overlap.fsdp_prefetch"),
                        ("async_tp", "overlap.async_tp"),
                        ("grad_reduce_overlap", "overlap.grad_reduce"),
                        ("param_gather_overlap", "overlap.param_gather"),
                        ("param_gather_align", "overlap.param_gather_align"),
                        ("tp_comm_overlap", "overlap.tp_comm"),
                        ("grad_reduce_fp32", "ddp.grad_reduce_in_fp32"),
                        ("grad_accumulation_fusion", "ddp.gradient_accumulation_fusion"),
                        ("grad_as_bucket_view", "ddp.gradient_as_bucket_view"),
                        ("fp8_param_gather", "ddp.fp8_param_gather"),
                        ("fsdp_float8_all_gather", "fsdp.float8_all_gather"),
                        ("cuda_graphs", "cuda_graphs")):
        check_bool(getattr(plan, name), where)
    if plan.fsdp_version != "megatron" and not (is_int(plan.fsdp_version)
                                                and plan.fsdp_version in FSDP_VERSIONS):
        raise WorkloadError("fsdp.version", plan.fsdp_version, '1, 2 or "megatron"')
    check_choice(plan.fsdp_grad_sync, "fsdp.grad_sync", FSDP_GRAD_SYNC)
    check_choice(plan.framework, "framework", FRAMEWORKS)
    if not (plan.grad_bucket in BUCKET_MODES
            or (is_int(plan.grad_bucket) and 1 <= plan.grad_bucket <= MAX_INT)):
        raise WorkloadError("ddp.bucket_params", plan.grad_bucket,
                            '"unit", "megatron" or a number of parameters in [1, 2^53]')
    for name, where in (("host_step_s", "host_overhead.per_step_s"),
                        ("host_kernel_s", "host_overhead.per_kernel_s")):
        check_number(getattr(plan, name), where, 0.0, MAX_HOST_OVERHEAD_S,
                     f"a number of seconds in [0, {MAX_HOST_OVERHEAD_S:g}]")
    if not is_int(plan.zero_stage) or plan.zero_stage not in ZERO_STAGES:
        raise WorkloadError("zero_stage", plan.zero_stage, "0, 1, 2 or 3")


def _check_compute(plan) -> None:
    """Recompute, attention, kernels, optimizer and loss: known names that the framework
    runs."""
    for name, allowed in (("recompute", RECOMPUTE), ("attention", ATTENTION_IMPLS),
                          ("kernels", KERNEL_MODES), ("optimizer", OPTIMIZERS)):
        check_choice(getattr(plan, name), name, allowed)
    by_family = plan.kernels_by_family
    if not isinstance(by_family, Mapping) or not set(by_family) <= set(KERNEL_FAMILIES):
        raise WorkloadError("kernels", dict(by_family) if isinstance(by_family, Mapping)
                            else by_family, f"an object of default, {', '.join(KERNEL_FAMILIES)}")
    for family, mode in by_family.items():
        check_choice(mode, f"kernels.{family}", KERNEL_MODES)
    check_choice(plan.loss_kernels, "loss.kernels", LOSS_KERNEL_MODES)
    runs = traits(plan.framework).loss_kernels   # torch's or Megatron's cross-entropy
    if plan.loss_kernels not in runs:
        raise WorkloadError("loss.kernels", plan.loss_kernels,
                            f"{' or '.join(runs)} under framework {plan.framework!r}")
    if not is_int(plan.loss_metrics) or not 0 <= plan.loss_metrics <= MAX_LOSS_METRICS:
        raise WorkloadError("loss.metrics", plan.loss_metrics,
                            f"an integer in [0, {MAX_LOSS_METRICS}]")
    if not is_int(plan.recompute_layers) or not 0 <= plan.recompute_layers <= MAX_INT:
        raise WorkloadError("recompute_layers", plan.recompute_layers,
                            "an integer in [0, 2^53] (0: every layer)")
    mods = plan.recompute_modules   # names once each (a JSON list may hold anything)
    if not isinstance(mods, tuple) or not all(m in RECOMPUTE_MODULES for m in mods) or \
            len(set(mods)) < len(mods) or (mods and plan.recompute not in ("none",
                                                                         "selective")):
        raise WorkloadError("recompute_modules", list(mods) if isinstance(mods, tuple)
                            else mods, f"a list of distinct {', '.join(RECOMPUTE_MODULES)} "
                            "(with recompute none or selective)")
    if plan.recompute_layers and plan.recompute != "full":
        raise WorkloadError("recompute_layers", plan.recompute_layers,
                            '0 unless recompute is "full"')
    frameworks = BY_GPU_IMPLS.get(plan.attention)
    if frameworks is not None and plan.framework not in frameworks:
        raise WorkloadError("attention", plan.attention, f"flash, cudnn, eager or "
                            f"fused_softmax under framework {plan.framework!r} ("
                            f"{plan.attention!r}: framework {', '.join(frameworks)} only, "
                            "whose SDPA backend order per GPU is modelled)")
    if plan.attention == VARLEN_IMPL and plan.framework != "generic":
        raise WorkloadError("attention", plan.attention, "another implementation under "
                            f"framework {plan.framework!r} (flash_varlen: flash-attn's "
                            "unpad and pad around its variable-length kernel, framework "
                            "generic only)")


def _check_sections(plan) -> None:
    """Context parallelism, the MoE load, the optional sections, collectives, topology."""
    check_choice(plan.cp_mode, "context_parallel.mode", CP_MODES)
    # Bounded: far beyond this the hottest rank would hold more tokens than the batch has.
    check_number(plan.load_imbalance, "moe.load_imbalance", 1.0, MAX_LOAD_IMBALANCE,
                 f"a number in [1, {MAX_LOAD_IMBALANCE:g}] (1: balanced)")
    for name, kind, module in (("moe", MoEOptions, "moe_options"), ("lora", (
            LoRA, type(None)), "lora"), ("precision_aware_optimizer", (
            PrecisionAwareOptimizer, type(None)), "optimizer_states"), (
            "distributed_fused_adam", (DistributedFusedAdam, type(None)),
            "optimizer_states"), (
            "activation_offload", (ActivationOffload, type(None)), "activation_offload")):
        if not isinstance(getattr(plan, name), kind):
            raise WorkloadError(name, getattr(plan, name), f"an object (workloads/{module}.py)")
    check_int(plan.tp_depth, "tensor_parallel.depth")
    for name, key in (("collective_algorithm", "algorithm"),
                      ("collective_protocol", "protocol")):
        # the names themselves are checked by the simulator, which owns them
        check_optional_name(getattr(plan, name), f"collectives.{key}",
                            "a name (see --algorithm)")
    check_optional_name(plan.topology, "topology", "a topology name or path")


def _check_sharding(plan) -> None:
    """Strategies are known; layer overrides name layers the model has."""
    for p, strategy in plan.sharding.items():
        check_choice(p, "sharding", PROJECTIONS)
        check_choice(strategy, f"sharding.{p}", ALL_STRATEGIES)
    for first, last, override in plan.layer_overrides:
        key = f"{first}" if first == last else f"{first}-{last}"
        if not 0 <= first <= last < plan.model.num_layers:
            raise WorkloadError(f"layers.{key}", key,
                                f"first <= last < num_layers ({plan.model.num_layers})")
        for p, strategy in override.items():
            check_choice(strategy, f"layers.{key}.{p}", ALL_STRATEGIES)
