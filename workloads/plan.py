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

from .attention_impls import ATTENTION_IMPLS  # noqa: F401 (the plan's names)
from .errors import WorkloadError
from .fields import MAX_INT, check_optional_name, json_object as _obj, known_keys as _known_keys
from .frameworks import framework_values
from .mesh import Mesh, ParallelDims
from .models import ModelSpec, load_model
from .layouts import MEGATRON
from .lora import LoRA
from .muon import Muon
from .optimizer_states import DistributedFusedAdam, PrecisionAwareOptimizer
from .activation_offload import ActivationOffload
from .moe_options import MoEOptions
from .plan_checks import check_resolved
from .plan_fields import (CP_MODES, FSDP_VERSIONS,  # noqa: F401 (the plan's names)
                          GRID_STRATEGIES, MAX_HOST_OVERHEAD_S, PROJECTIONS, RECOMPUTE,
                          STRATEGIES, check_plan_fields)
from .plan_sections import (DTYPES, LOW_PRECISION, SCHEDULES,  # noqa: F401 (the plan's names)
                            TOP_KEYS, Pipeline, Training, extensions, pipeline_section)

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
    # the kernel families that run otherwise than `kernels` ("kernels": {"default": ...,
    # "norm": ...} in a plan file: workloads/kernels.py KERNEL_FAMILIES)
    kernels_by_family: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
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
    # fsdp.grad_sync: "microbatch" | "step" | "auto" (workloads/grad_state.py fsdp_no_sync)
    fsdp_grad_sync: str = "auto"
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
    # Muon under Megatron-Core's layer-wise distributed optimizer (workloads/muon.py)
    muon: Muon | None = None
    # saved tensors of the first layers kept in host memory (workloads/activation_offload.py)
    activation_offload: ActivationOffload | None = None
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Every single-field check (workloads/plan_fields.py)."""
        check_plan_fields(self)

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
