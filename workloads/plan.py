"""The plan file (docs/design.md, "Plan file"): parsed into frozen dataclasses, validated.

Every error names the field, the value and what is allowed (WorkloadError).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .errors import WorkloadError
from .kernels import KERNEL_MODES, OPTIMIZERS
from .mesh import Mesh, ParallelDims
from .models import ModelSpec, load_model
from .plan_checks import check_resolved

PROJECTIONS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
# 1D Megatron-style strategies, then the 2D/2.5D/3D tensor-parallel layouts of seed 004
# (workloads/tp_grid.py): a plan uses one grid strategy for every projection or none.
# STRATEGIES: the per-projection (1D) ones, which may be mixed freely (search enumerates
# them); ALL_STRATEGIES: everything a plan file accepts.
STRATEGIES = ("col", "row", "seq", "replicate")
GRID_STRATEGIES = ("tp2d", "tp2.5d", "tp3d_gather", "tp3d_allreduce")
ALL_STRATEGIES = STRATEGIES + GRID_STRATEGIES
# Context parallelism: ring attention (KV blocks around the CP ring), Llama 3's all-gather
# of K and V, or Ulysses all-to-all.
CP_MODES = ("ring", "all_gather", "all_to_all")
DTYPES = ("bf16", "fp8", "fp32")
# selective: the attention core (Korthikanti et al. 2022); selective_op: torchtitan's
# op-level selective checkpointing (every other matmul and attention kept); full: the layer.
RECOMPUTE = ("none", "selective", "selective_op", "full")
MAX_LOAD_IMBALANCE = 64.0
# flash: FlashAttention (scores never stored, recomputed inside the backward);
# eager: the s x s scores are materialised and kept for the backward.
ATTENTION_IMPLS = ("flash", "eager")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
BUNDLED_DIR = Path(__file__).parent / "plans"

# Megatron-LM defaults (Shoeybi et al. 2019): attention in and MLP in column-parallel,
# attention out and MLP out row-parallel.
MEGATRON = MappingProxyType({"wq": "col", "wk": "col", "wv": "col", "wo": "row",
                             "w1": "col", "w3": "col", "w2": "row"})


@dataclass(frozen=True)
class Training:
    """Batch and precision of one optimizer step."""

    global_batch: int       # sequences per step
    micro_batch: int        # sequences per micro-batch per DP rank
    seq_len: int
    dtype: str = "bf16"

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class Pipeline:
    """Pipeline schedule; layer_split gives layers per stage (None: balanced default)."""

    schedule: str = "1f1b"
    virtual_stages: int = 1
    layer_split: tuple[int, ...] | None = None


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
    attention: str = "flash"
    kernels: str = "fused"          # memory-bound ops: fused | eager (workloads/kernels.py)
    optimizer: str = "fused"        # Adam step: fused | foreach | for_loop (workloads/kernels.py)
    pipeline: Pipeline = field(default_factory=Pipeline)
    fsdp_prefetch: bool = True
    async_tp: bool = False
    collective_algorithm: str | None = None   # "collectives": {"algorithm": ..., "protocol": ...}
    collective_protocol: str | None = None
    topology: str | None = None
    cp_mode: str = "ring"           # context_parallel.mode
    load_imbalance: float = 1.0     # moe.load_imbalance: hottest EP rank's tokens / mean
    tp_depth: int = 1               # tensor_parallel.depth: the d of 2.5D (Tesseract)
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def strategies(self, layer: int) -> Mapping[str, str]:
        """Per-projection strategy of one layer, overrides applied."""
        for first, last, override in self.layer_overrides:
            if first <= layer <= last:
                return {**self.sharding, **override}
        return self.sharding

    @property
    def micro_batches(self) -> int:
        """Micro-batches per DP rank per step (gradient accumulation x pipeline)."""
        return self.training.global_batch // (self.mesh.dp * self.training.micro_batch)

    @property
    def grid_strategy(self) -> str | None:
        """The 2D/2.5D/3D TP strategy of the plan (None: 1D tensor parallelism)."""
        layers = [self.sharding] + [o for _, _, o in self.layer_overrides]
        used = {s for st in layers for s in st.values() if s in GRID_STRATEGIES}
        return used.pop() if len(used) == 1 else (None if not used else "mixed")

    @cached_property
    def parallel_dims(self) -> ParallelDims:
        """The mesh geometry of this resolved plan: ranks, groups, peers (workloads/mesh.py)."""
        return ParallelDims.from_plan(self)

    def with_mesh(self, mesh: Mesh) -> "Plan":
        """A copy of this plan with another mesh (resolved and validated later)."""
        return replace(self, mesh=mesh)


# --------------------------------------------------------------------------- parsing
def _obj(raw: Any, where: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WorkloadError(where, raw, "a JSON object")
    return raw


def _int(raw: dict, key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = raw.get(key, default)
    if value is None:
        raise WorkloadError(f"{where}.{key}", None, f"an integer >= {minimum} (required)")
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise WorkloadError(f"{where}.{key}", value, f"an integer >= {minimum}")
    return value


def _bool(raw: dict, key: str, where: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise WorkloadError(f"{where}.{key}", value, "true or false")
    return value


def _choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise WorkloadError(where, value, ", ".join(allowed))
    return value


def _known_keys(raw: dict, where: str, allowed: tuple[str, ...]) -> None:
    for key in raw:
        if key not in allowed:
            raise WorkloadError(f"{where}.{key}" if where else key, raw[key],
                                "keys " + ", ".join(allowed))


def _strategies(raw: dict, where: str, allow_sp: bool) -> tuple[dict[str, str], bool | None]:
    keys = PROJECTIONS + (("sequence_parallel",) if allow_sp else ())
    _known_keys(raw, where, keys)
    out = {p: _choice(raw[p], f"{where}.{p}", ALL_STRATEGIES) for p in PROJECTIONS if p in raw}
    sp = _bool(raw, "sequence_parallel", where, False) if "sequence_parallel" in raw else None
    return out, sp


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _layer_overrides(raw: dict, num_layers: int) -> tuple:
    out = []
    for key, value in raw.items():
        match = _RANGE.match(str(key))
        if not match:
            raise WorkloadError(f"layers.{key}", key, "a layer range like \"0-15\" or \"7\"")
        first, last = int(match[1]), int(match[2] or match[1])
        if first > last or last >= num_layers:
            raise WorkloadError(f"layers.{key}", key,
                                f"first <= last < num_layers ({num_layers})")
        strategies, _ = _strategies(_obj(value, f"layers.{key}"), f"layers.{key}", False)
        out.append((first, last, MappingProxyType(strategies)))
    return tuple(sorted(out, key=lambda t: t[0]))


def _mesh(raw: dict) -> Mesh:
    _known_keys(raw, "mesh", ("dp", "tp", "pp", "cp", "ep"))
    dp = raw.get("dp", "auto")
    if dp != "auto":
        dp = _int(raw, "dp", "mesh")
    return Mesh(pp=_int(raw, "pp", "mesh", 1), dp=0 if dp == "auto" else dp,
                cp=_int(raw, "cp", "mesh", 1), tp=_int(raw, "tp", "mesh", 1),
                ep=_int(raw, "ep", "mesh", 1))


def _pipeline(raw: dict) -> Pipeline:
    _known_keys(raw, "pipeline", ("schedule", "virtual_stages", "layer_split"))
    split = raw.get("layer_split")
    if split is not None:
        if not isinstance(split, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                  and n >= 0 for n in split):
            raise WorkloadError("pipeline.layer_split", split, "a list of non-negative integers")
        split = tuple(split)
    return Pipeline(_choice(raw.get("schedule", "1f1b"), "pipeline.schedule", SCHEDULES),
                    _int(raw, "virtual_stages", "pipeline", 1), split)


TOP_KEYS = ("name", "model", "training", "mesh", "fsdp", "zero_stage", "sharding", "layers",
            "recompute", "attention", "kernels", "optimizer", "pipeline", "overlap", "topology",
            "description",
            "context_parallel", "moe", "tensor_parallel", "collectives")


def _extensions(raw: dict) -> dict:
    """context_parallel.mode, moe.load_imbalance and tensor_parallel.depth."""
    cp = _obj(raw.get("context_parallel"), "context_parallel")
    _known_keys(cp, "context_parallel", ("mode",))
    moe = _obj(raw.get("moe"), "moe")
    _known_keys(moe, "moe", ("load_imbalance",))
    imbalance = moe.get("load_imbalance", 1.0)
    # Bounded: far beyond this the hottest rank would hold more tokens than the batch has.
    if (isinstance(imbalance, bool) or not isinstance(imbalance, (int, float))
            or not 1 <= imbalance <= MAX_LOAD_IMBALANCE):
        raise WorkloadError("moe.load_imbalance", imbalance,
                            f"a number in [1, {MAX_LOAD_IMBALANCE:g}] (1: balanced)")
    tp = _obj(raw.get("tensor_parallel"), "tensor_parallel")
    _known_keys(tp, "tensor_parallel", ("depth",))
    # Forced NCCL algorithm/protocol: names are checked by the simulator, which owns them.
    coll = _obj(raw.get("collectives"), "collectives")
    _known_keys(coll, "collectives", ("algorithm", "protocol"))
    for key in ("algorithm", "protocol"):
        if key in coll and not isinstance(coll[key], str):
            raise WorkloadError(f"collectives.{key}", coll[key], "a name (see --algorithm)")
    return {"cp_mode": _choice(cp.get("mode", "ring"), "context_parallel.mode", CP_MODES),
            "load_imbalance": float(imbalance),
            "tp_depth": _int(tp, "depth", "tensor_parallel", 1),
            "collective_algorithm": coll.get("algorithm"),
            "collective_protocol": coll.get("protocol")}


def plan_from_dict(raw: Any, base_dir: Path | None = None, default_name: str = "plan") -> Plan:
    """Parse and validate a plan object (world-size checks come in `resolve`)."""
    raw = _obj(raw, "plan")
    _known_keys(raw, "", TOP_KEYS)
    if "model" not in raw:
        raise WorkloadError("model", None, "a preset name, a model JSON path or an object")
    model = load_model(raw["model"], base_dir)
    tr = _obj(raw.get("training"), "training")
    _known_keys(tr, "training", ("global_batch", "micro_batch", "seq_len", "dtype"))
    training = Training(_int(tr, "global_batch", "training"), _int(tr, "micro_batch", "training", 1),
                        _int(tr, "seq_len", "training"),
                        _choice(tr.get("dtype", "bf16"), "training.dtype", DTYPES))
    fsdp = _obj(raw.get("fsdp"), "fsdp")
    _known_keys(fsdp, "fsdp", ("enabled", "reshard_after_forward"))
    sharding_raw = _obj(raw.get("sharding"), "sharding")
    strategies, sp = _strategies(sharding_raw, "sharding", True)
    overlap = _obj(raw.get("overlap"), "overlap")
    _known_keys(overlap, "overlap", ("fsdp_prefetch", "async_tp"))
    zero = _int(raw, "zero_stage", "", 0, minimum=0) if "zero_stage" in raw else 0
    if zero > 3:
        raise WorkloadError("zero_stage", zero, "0, 1, 2 or 3")
    topo = raw.get("topology")
    if topo is not None and not isinstance(topo, str):
        raise WorkloadError("topology", topo, "a topology name or path")
    return Plan(
        name=str(raw.get("name", default_name)), model=model, training=training,
        mesh=_mesh(_obj(raw.get("mesh"), "mesh")),
        fsdp=_bool(fsdp, "enabled", "fsdp", False),
        reshard_after_forward=_bool(fsdp, "reshard_after_forward", "fsdp", True),
        zero_stage=zero, sharding=MappingProxyType({**MEGATRON, **strategies}),
        sequence_parallel=bool(sp), layer_overrides=_layer_overrides(
            _obj(raw.get("layers"), "layers"), model.num_layers),
        recompute=_choice(raw.get("recompute", "none"), "recompute", RECOMPUTE),
        attention=_choice(raw.get("attention", "flash"), "attention", ATTENTION_IMPLS),
        kernels=_choice(raw.get("kernels", "fused"), "kernels", KERNEL_MODES),
        optimizer=_choice(raw.get("optimizer", "fused"), "optimizer", OPTIMIZERS),
        pipeline=_pipeline(_obj(raw.get("pipeline"), "pipeline")),
        fsdp_prefetch=_bool(overlap, "fsdp_prefetch", "overlap", True),
        async_tp=_bool(overlap, "async_tp", "overlap", False), topology=topo,
        source=MappingProxyType(dict(raw)), **_extensions(raw))


def reject_json_constant(name: str):
    """json.loads hook: NaN, Infinity and -Infinity are not numbers a plan may hold."""
    raise WorkloadError("plan", name, "finite JSON numbers (no NaN or Infinity)")


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
    try:
        raw = json.loads(path.read_text(), parse_constant=reject_json_constant)
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError("plan", str(path), f"a readable JSON file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError("plan", str(path), f"valid JSON (line {exc.lineno}: {exc.msg})") from None
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
