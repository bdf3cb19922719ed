"""The plan file (docs/design.md, "Plan file"): parsed into frozen dataclasses, validated.

A plan is valid by construction: Training, Pipeline and Plan check their own fields in
__post_init__, which also runs under `dataclasses.replace`, so a plan built by the parser,
by `whatif --vary`, by the search or by a study passes the same checks with the same
messages. The parser checks only the JSON's shape (objects, known keys, required keys,
lists). Checks that relate a plan to a world size and a model run in `resolve`.
Every error names the field, the value and what is allowed (WorkloadError).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from inputs import load_json_file

from .attention_impls import (ATTENTION_IMPLS, BY_GPU_IMPLS,  # noqa: F401 (the plan's names)
                              VARLEN_IMPL)
from .errors import WorkloadError
from .ddp_buckets import BUCKET_MODES
from .fields import (MAX_INT, check_bool, check_choice, check_int, check_number, check_optional_name,
                     is_int, json_object as _obj, known_keys as _known_keys)
from .framework_traits import traits
from .frameworks import FRAMEWORKS, framework_values
from .kernels import KERNEL_MODES, LOSS_KERNEL_MODES, OPTIMIZERS
from .mesh import Mesh, ParallelDims
from .models import ModelSpec, load_model
from .module_recompute import RECOMPUTE_MODULES
from .layouts import MEGATRON
from .lora import LoRA
from .optimizer_states import DistributedFusedAdam, PrecisionAwareOptimizer
from .train_metrics import MAX_LOSS_METRICS
from .activation_offload import ActivationOffload
from .moe_options import MoEOptions
from .plan_checks import check_resolved
from .plan_sections import (DTYPES, LOW_PRECISION, SCHEDULES,  # noqa: F401 (the plan's names)
                            TOP_KEYS, Pipeline, Training, extensions, pipeline_section)

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
# per unit whose views the parameters and gradients are: workloads/stage_lowering.py)
FSDP_VERSIONS = (1, 2, "megatron")
MAX_HOST_OVERHEAD_S = 10.0   # bound on host_overhead values: far beyond any real step
BUNDLED_DIR = Path(__file__).parent / "plans"



@dataclass(frozen=True)
class Plan:
    """A validated plan: model, batch, mesh, sharding strategies and schedule options."""

    name: str
    model: ModelSpec
    training: Training
    mesh: Mesh
    fsdp: bool = False
    reshard_after_forward: bool = True
    zero_stage: int = 0
    sharding: Mapping[str, str] = field(default_factory=lambda: MEGATRON)
    sequence_parallel: bool = False
    layer_overrides: tuple[tuple[int, int, Mapping[str, str]], ...] = ()
    recompute: str = "none"
    # recompute_layers: under full recompute, only the first N transformer layers of each
    # pipeline chunk rerun their forward (Megatron-LM's --recompute-method block with
    # --recompute-num-layers N: megatron/core/transformer/transformer_block.py,
    # _checkpointed_forward); 0: every layer (the uniform method over single layers)
    recompute_layers: int = 0
    # Megatron-Core's recompute_modules beyond the attention core (workloads/
    # module_recompute.py): () or some of "layernorm", "moe_act", "moe"
    recompute_modules: tuple[str, ...] = ()
    attention: str = "flash"
    kernels: str = "fused"          # memory-bound ops: fused | eager (workloads/kernels.py)
    # loss.kernels: the cross-entropy compiled (fused) or ATen's eager ops, whose time and
    # fp32 copies differ (workloads/loss_memory.py); the parser defaults it to `kernels`;
    # "unfused": Megatron's vocab-parallel cross-entropy as torch ops (megatron-lm; and
    # megatron-core without --cross-entropy-loss-fusion); framework_traits.loss_kernels
    loss_kernels: str = "fused"
    # loss.metrics: cross-entropies the trainer computes again on each micro-batch's logits,
    # without gradients, for its training metrics (workloads/train_metrics.py)
    loss_metrics: int = 0
    optimizer: str = "fused"        # Adam step: fused | foreach | for_loop (workloads/kernels.py)
    pipeline: Pipeline = field(default_factory=Pipeline)
    fsdp_prefetch: bool = True
    fsdp_version: int | str = 2     # fsdp.version: 1 FSDP1 | 2 FSDP2 | "megatron" Megatron-FSDP
    fsdp_float8_all_gather: bool = False    # fsdp.float8_all_gather (workloads/fsdp_float8.py)
    # "overlap" (workloads/frameworks.py has each framework's defaults and their sources)
    async_tp: bool = False          # torch async TP: micro-pipelined AG-matmul / matmul-RS
    grad_reduce_overlap: bool = True    # gradients reduced while the backward runs
    grad_bucket: str | int = "unit"     # ddp.bucket_params: unit | megatron | a count
    grad_reduce_fp32: bool = True       # ddp.grad_reduce_in_fp32 (megatron-core): fp32 main_grad
    # ddp.gradient_accumulation_fusion (megatron-core): weight-gradient GEMMs write main_grad
    # themselves; false: autograd's gradient is added / copied into it (workloads/main_grad.py)
    grad_accumulation_fusion: bool = True
    # ddp.gradient_as_bucket_view (torch DDP): gradients are views into the Reducer's
    # buckets, so no copy back and no second copy in memory (workloads/torch_ddp.py)
    grad_as_bucket_view: bool = False
    fp8_param_gather: bool = False      # ddp.fp8_param_gather: FP8 weights gathered (1 B)
    param_gather_overlap: bool = False  # distributed optimizer: param all-gather in forward
    param_gather_align: bool = False    # interleaved: chunk gathers one chunk ahead, aligned
    tp_comm_overlap: bool = False   # Megatron --tp-comm-overlap (TE userbuffers)
    framework: str = "generic"      # the profile whose defaults the parser applied
    cuda_graphs: bool = False       # the step is captured: no host cost per kernel launch
    host_step_s: float = 0.0        # host_overhead.per_step_s: host work per step
    host_kernel_s: float = 0.0      # host_overhead.per_kernel_s: host issue time per kernel
    collective_algorithm: str | None = None   # "collectives": {"algorithm": ..., "protocol": ...}
    collective_protocol: str | None = None
    topology: str | None = None
    cp_mode: str = "ring"           # context_parallel.mode
    load_imbalance: float = 1.0     # moe.load_imbalance: hottest EP rank's tokens / mean
    moe: MoEOptions = field(default_factory=MoEOptions)   # the rest of the moe block
    tp_depth: int = 1               # tensor_parallel.depth: the d of 2.5D (Tesseract)
    lora: LoRA | None = None        # LoRA fine-tuning (workloads/lora.py); None: every weight trains
    # Adam's states in lower precision (workloads/optimizer_states.py); None: fp32 states
    precision_aware_optimizer: PrecisionAwareOptimizer | None = None
    distributed_fused_adam: DistributedFusedAdam | None = None    # Apex's, under NeMo 1
    # saved tensors of the first layers kept in host memory (workloads/activation_offload.py)
    activation_offload: ActivationOffload | None = None
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Every single-field check (combinations of fields are checked by `resolve`)."""
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
            check_bool(getattr(self, name), where)
        if self.fsdp_version != "megatron" and not (is_int(self.fsdp_version)
                                                    and self.fsdp_version in FSDP_VERSIONS):
            raise WorkloadError("fsdp.version", self.fsdp_version, '1, 2 or "megatron"')
        check_choice(self.framework, "framework", FRAMEWORKS)
        if not (self.grad_bucket in BUCKET_MODES
                or (is_int(self.grad_bucket) and 1 <= self.grad_bucket <= MAX_INT)):
            raise WorkloadError("ddp.bucket_params", self.grad_bucket,
                                '"unit", "megatron" or a number of parameters in [1, 2^53]')
        for name, where in (("host_step_s", "host_overhead.per_step_s"),
                            ("host_kernel_s", "host_overhead.per_kernel_s")):
            check_number(getattr(self, name), where, 0.0, MAX_HOST_OVERHEAD_S,
                         f"a number of seconds in [0, {MAX_HOST_OVERHEAD_S:g}]")
        if not is_int(self.zero_stage) or self.zero_stage not in ZERO_STAGES:
            raise WorkloadError("zero_stage", self.zero_stage, "0, 1, 2 or 3")
        for name, allowed in (("recompute", RECOMPUTE), ("attention", ATTENTION_IMPLS),
                              ("kernels", KERNEL_MODES), ("optimizer", OPTIMIZERS)):
            check_choice(getattr(self, name), name, allowed)
        check_choice(self.loss_kernels, "loss.kernels", LOSS_KERNEL_MODES)
        runs = traits(self.framework).loss_kernels   # torch's or Megatron's cross-entropy
        if self.loss_kernels not in runs:
            raise WorkloadError("loss.kernels", self.loss_kernels,
                                f"{' or '.join(runs)} under framework {self.framework!r}")
        if not is_int(self.loss_metrics) or not 0 <= self.loss_metrics <= MAX_LOSS_METRICS:
            raise WorkloadError("loss.metrics", self.loss_metrics,
                                f"an integer in [0, {MAX_LOSS_METRICS}]")
        if not is_int(self.recompute_layers) or not 0 <= self.recompute_layers <= MAX_INT:
            raise WorkloadError("recompute_layers", self.recompute_layers,
                                "an integer in [0, 2^53] (0: every layer)")
        mods = self.recompute_modules   # names once each (a JSON list may hold anything)
        if not isinstance(mods, tuple) or not all(m in RECOMPUTE_MODULES for m in mods) or \
                len(set(mods)) < len(mods) or (mods and self.recompute not in ("none",
                                                                             "selective")):
            raise WorkloadError("recompute_modules", list(mods) if isinstance(mods, tuple)
                                else mods, f"a list of distinct {', '.join(RECOMPUTE_MODULES)} "
                                "(with recompute none or selective)")
        if self.recompute_layers and self.recompute != "full":
            raise WorkloadError("recompute_layers", self.recompute_layers,
                                '0 unless recompute is "full"')
        frameworks = BY_GPU_IMPLS.get(self.attention)
        if frameworks is not None and self.framework not in frameworks:
            raise WorkloadError("attention", self.attention, f"flash, cudnn, eager or "
                                f"fused_softmax under framework {self.framework!r} ("
                                f"{self.attention!r}: framework {', '.join(frameworks)} only, "
                                "whose SDPA backend order per GPU is modelled)")
        if self.attention == VARLEN_IMPL and self.framework != "generic":
            raise WorkloadError("attention", self.attention, "another implementation under "
                                f"framework {self.framework!r} (flash_varlen: flash-attn's "
                                "unpad and pad around its variable-length kernel, framework "
                                "generic only)")
        check_choice(self.cp_mode, "context_parallel.mode", CP_MODES)
        # Bounded: far beyond this the hottest rank would hold more tokens than the batch has.
        check_number(self.load_imbalance, "moe.load_imbalance", 1.0, MAX_LOAD_IMBALANCE,
                     f"a number in [1, {MAX_LOAD_IMBALANCE:g}] (1: balanced)")
        for name, kind, module in (("moe", MoEOptions, "moe_options"), ("lora", (
                LoRA, type(None)), "lora"), ("precision_aware_optimizer", (
                PrecisionAwareOptimizer, type(None)), "optimizer_states"), (
                "distributed_fused_adam", (DistributedFusedAdam, type(None)),
                "optimizer_states"), (
                "activation_offload", (ActivationOffload, type(None)), "activation_offload")):
            if not isinstance(getattr(self, name), kind):
                raise WorkloadError(name, getattr(self, name), f"an object (workloads/{module}.py)")
        check_int(self.tp_depth, "tensor_parallel.depth")
        for name, key in (("collective_algorithm", "algorithm"),
                          ("collective_protocol", "protocol")):
            # the names themselves are checked by the simulator, which owns them
            check_optional_name(getattr(self, name), f"collectives.{key}",
                                "a name (see --algorithm)")
        check_optional_name(self.topology, "topology", "a topology name or path")
        self._check_sharding()

    def _check_sharding(self) -> None:
        """Strategies are known; layer overrides name layers the model has."""
        for p, strategy in self.sharding.items():
            check_choice(p, "sharding", PROJECTIONS)
            check_choice(strategy, f"sharding.{p}", ALL_STRATEGIES)
        for first, last, override in self.layer_overrides:
            key = f"{first}" if first == last else f"{first}-{last}"
            if not 0 <= first <= last < self.model.num_layers:
                raise WorkloadError(f"layers.{key}", key,
                                    f"first <= last < num_layers ({self.model.num_layers})")
            for p, strategy in override.items():
                check_choice(strategy, f"layers.{key}.{p}", ALL_STRATEGIES)

    def strategies(self, layer: int) -> Mapping[str, str]:
        """Per-projection strategy of one layer, overrides applied."""
        for first, last, override in self.layer_overrides:
            if first <= layer <= last:
                return {**self.sharding, **override}
        return self.sharding

    def recomputes(self, position: int) -> bool:
        """Whether the transformer layer at `position` (0-based) among its pipeline chunk's
        layers reruns its forward in the backward (full or op-level recompute)."""
        if self.recompute not in ("full", "selective_op"):
            return False
        return not self.recompute_layers or position < self.recompute_layers

    @property
    def micro_batches(self) -> int:
        """Micro-batches per DP rank per step (gradient accumulation x pipeline)."""
        return self.training.global_batch // (self.mesh.dp * self.training.micro_batch)

    @cached_property
    def grid_strategy(self) -> str | None:
        """The 2D/2.5D/3D TP strategy of the plan (None: 1D tensor parallelism); cached,
        as the memory model asks it per layer and the plan never changes."""
        layers = [self.sharding] + [o for _, _, o in self.layer_overrides]
        used = {s for st in layers for s in st.values() if s in GRID_STRATEGIES}
        return used.pop() if len(used) == 1 else (None if not used else "mixed")

    @property
    def optimizer_states(self) -> PrecisionAwareOptimizer | DistributedFusedAdam | None:
        """The section that lays out Adam's states, if any (workloads/optimizer_states.py)."""
        return self.precision_aware_optimizer or self.distributed_fused_adam

    @cached_property
    def parallel_dims(self) -> ParallelDims:
        """The mesh geometry of this resolved plan: ranks, groups, peers (workloads/mesh.py)."""
        return ParallelDims.from_plan(self)

    def with_mesh(self, mesh: Mesh) -> "Plan":
        """A copy of this plan with another mesh (resolved and validated later)."""
        return replace(self, mesh=mesh)


# --------------------------------------------------------------------------- parsing
def _required(raw: dict, key: str, where: str) -> Any:
    """A key the plan must have (its value is checked by the type it goes into)."""
    if raw.get(key) is None:
        raise WorkloadError(f"{where}.{key}", None, "an integer >= 1 (required)")
    return raw[key]


def _int(raw: dict, key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = raw.get(key, default)
    if value is None:
        raise WorkloadError(f"{where}.{key}", None, f"an integer >= {minimum} (required)")
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise WorkloadError(f"{where}.{key}", value, f"an integer >= {minimum} and <= {MAX_INT:,}")
    return value


def _strategies(raw: dict, where: str, allow_sp: bool) -> dict[str, str]:
    """The projections' strategies (checked by Plan)."""
    keys = PROJECTIONS + (("sequence_parallel",) if allow_sp else ())
    _known_keys(raw, where, keys)
    return {p: raw[p] for p in PROJECTIONS if p in raw}


_RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?", re.ASCII)   # ASCII digits only


def _layer_overrides(raw: dict, num_layers: int) -> tuple:
    out = []
    for key, value in raw.items():
        match = _RANGE.fullmatch(str(key))
        if not match:
            raise WorkloadError(f"layers.{key}", key, "a layer range like \"0-15\" or \"7\"")
        first, last = int(match[1]), int(match[2] or match[1])
        if first > last or last >= num_layers:   # checked here to name the key as written
            raise WorkloadError(f"layers.{key}", key,
                                f"first <= last < num_layers ({num_layers})")
        strategies = _strategies(_obj(value, f"layers.{key}"), f"layers.{key}", False)
        out.append((first, last, MappingProxyType(strategies)))
    return tuple(sorted(out, key=lambda t: t[0]))


def _mesh(raw: dict) -> Mesh:
    """The mesh object: degrees, and optionally `order`, the dims innermost first (a list
    of tp, cp, ep, dp, pp; checked by Mesh)."""
    _known_keys(raw, "mesh", ("dp", "tp", "pp", "cp", "ep", "order"))
    dp = raw.get("dp", "auto")
    if dp != "auto":
        dp = _int(raw, "dp", "mesh")
    order = raw.get("order")
    return Mesh(pp=_int(raw, "pp", "mesh", 1), dp=0 if dp == "auto" else dp,
                cp=_int(raw, "cp", "mesh", 1), tp=_int(raw, "tp", "mesh", 1),
                ep=_int(raw, "ep", "mesh", 1),
                order=tuple(order) if isinstance(order, list) else order)


def plan_from_dict(raw: Any, base_dir: Path | None = None, default_name: str = "plan") -> Plan:
    """Parse and validate a plan object (world-size checks come in `resolve`)."""
    raw = _obj(raw, "plan")
    _known_keys(raw, "", TOP_KEYS)
    check_optional_name(raw.get("name"), "name", "a string")
    if "model" not in raw:
        raise WorkloadError("model", None, "a preset name, a model JSON path or an object")
    model = load_model(raw["model"], base_dir)
    tr = _obj(raw.get("training"), "training")
    _known_keys(tr, "training", ("global_batch", "micro_batch", "seq_len", "dtype",
                                 "bf16_layers", "packed_segment", "fp8_attention"))
    bf16_layers = tr.get("bf16_layers")
    training = Training(_required(tr, "global_batch", "training"), tr.get("micro_batch", 1),
                        _required(tr, "seq_len", "training"), tr.get("dtype", "bf16"),
                        tuple(bf16_layers) if isinstance(bf16_layers, list) else bf16_layers,
                        tr.get("packed_segment", 0), tr.get("fp8_attention", False))
    sharding_raw = _obj(raw.get("sharding"), "sharding")
    strategies = _strategies(sharding_raw, "sharding", True)
    return Plan(
        name=str(raw.get("name", default_name)), model=model, training=training,
        mesh=_mesh(_obj(raw.get("mesh"), "mesh")),
        sharding=MappingProxyType({**MEGATRON, **strategies}),
        sequence_parallel=sharding_raw.get("sequence_parallel", False),
        layer_overrides=_layer_overrides(_obj(raw.get("layers"), "layers"), model.num_layers),
        pipeline=pipeline_section(_obj(raw.get("pipeline"), "pipeline")),
        topology=raw.get("topology"),
        source=MappingProxyType(dict(raw)), **framework_values(raw), **extensions(raw))


def find_plan(ref: str) -> Path:
    """A plan path: the file if it exists, else the bundled plan of that name."""
    path = Path(ref)
    if path.is_file():
        return path
    for candidate in (BUNDLED_DIR / ref, BUNDLED_DIR / f"{ref}.json"):
        if candidate.is_file():
            return candidate
    bundled = ", ".join(sorted(p.name for p in BUNDLED_DIR.glob("*.json")))
    raise WorkloadError("plan", ref, f"an existing plan file or a bundled plan ({bundled})")


def load_plan(ref: str) -> Plan:
    """Read a plan file (or bundled plan name) and validate it."""
    path = find_plan(ref)
    raw = load_json_file(path, "plan", WorkloadError)
    return plan_from_dict(raw, base_dir=path.parent, default_name=path.stem)


def bundled_plans() -> list[str]:
    """Names of the example plans shipped with the package."""
    return sorted(p.name for p in BUNDLED_DIR.glob("*.json"))


# ------------------------------------------------------------------ world-size checks
def resolve(plan: Plan, world_size: int) -> Plan:
    """The plan with `dp: auto` filled in and every degree checked against the model.

    Each check names the factor that fails, as torchtitan's ParallelDims does: the world
    size (Mesh.resolved), then the sharding layout, the mesh's own degrees
    (ParallelDims) and how the model fits them (workloads/plan_checks.py).
    """
    resolved = replace(plan, mesh=plan.mesh.resolved(world_size))
    check_resolved(resolved)
    return resolved
