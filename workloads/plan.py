"""The plan file (docs/design.md, "Plan file"): parsed into frozen dataclasses, validated.

Every error names the field, the value and what is allowed (WorkloadError).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .errors import WorkloadError
from .models import ModelSpec, load_model

PROJECTIONS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
STRATEGIES = ("col", "row", "seq", "replicate")
DTYPES = ("bf16", "fp8")
RECOMPUTE = ("none", "selective", "full")
# flash: FlashAttention (scores never stored, recomputed inside the backward);
# eager: the s x s scores are materialised and kept for the backward.
ATTENTION_IMPLS = ("flash", "eager")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
MESH_DIMS = ("pp", "dp", "cp", "tp")  # outermost first; tp ranks are contiguous
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
class Mesh:
    """Parallel degrees; `dp` may be 0 meaning "auto" until resolved for a world size."""

    pp: int = 1
    dp: int = 0
    cp: int = 1
    tp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        """Product of the degrees (ep folds into dp, as in torchtitan)."""
        return self.pp * self.dp * self.cp * self.tp

    def size(self, dim: str) -> int:
        """Degree of one mesh dimension by name."""
        return getattr(self, dim)


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
    pipeline: Pipeline = field(default_factory=Pipeline)
    fsdp_prefetch: bool = True
    async_tp: bool = False
    topology: str | None = None
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
    out = {p: _choice(raw[p], f"{where}.{p}", STRATEGIES) for p in PROJECTIONS if p in raw}
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
                                                  and n >= 1 for n in split):
            raise WorkloadError("pipeline.layer_split", split, "a list of positive integers")
        split = tuple(split)
    return Pipeline(_choice(raw.get("schedule", "1f1b"), "pipeline.schedule", SCHEDULES),
                    _int(raw, "virtual_stages", "pipeline", 1), split)


TOP_KEYS = ("name", "model", "training", "mesh", "fsdp", "zero_stage", "sharding", "layers",
            "recompute", "attention", "pipeline", "overlap", "topology", "description")


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
        pipeline=_pipeline(_obj(raw.get("pipeline"), "pipeline")),
        fsdp_prefetch=_bool(overlap, "fsdp_prefetch", "overlap", True),
        async_tp=_bool(overlap, "async_tp", "overlap", False), topology=topo,
        source=MappingProxyType(dict(raw)))


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
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError("plan", str(path), f"a readable JSON file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError("plan", str(path), f"valid JSON (line {exc.lineno}: {exc.msg})") from None
    return plan_from_dict(raw, base_dir=path.parent, default_name=path.stem)


def bundled_plans() -> list[str]:
    """Names of the example plans shipped with the package."""
    return sorted(p.name for p in BUNDLED_DIR.glob("*.json"))


# ------------------------------------------------------------------ world-size checks
def _divides(value: int, by: int, field_name: str, what: str) -> None:
    if by and value % by:
        raise WorkloadError(field_name, by, f"a divisor of {what} ({value})")


def resolve(plan: Plan, world_size: int) -> Plan:
    """The plan with `dp: auto` filled in and every degree checked against the model.

    Each check names the factor that fails, as torchtitan's ParallelDims does.
    """
    m, mesh, tr = plan.model, plan.mesh, plan.training
    others = mesh.pp * mesh.cp * mesh.tp
    if mesh.dp == 0:
        if world_size % others:
            raise WorkloadError("mesh", f"pp*cp*tp={others}",
                                f"a divisor of the topology's {world_size} GPUs")
        mesh = replace(mesh, dp=world_size // others)
    if mesh.world_size != world_size:
        raise WorkloadError("mesh", f"pp*dp*cp*tp={mesh.world_size}",
                            f"the topology's GPU count ({world_size})")
    _divides(m.num_heads, mesh.tp, "mesh.tp", "num_attention_heads")
    _divides(m.num_kv_heads, mesh.tp, "mesh.tp", "num_key_value_heads")
    _divides(m.ffn_size, mesh.tp, "mesh.tp", "intermediate_size")
    _divides(m.hidden_size, mesh.tp, "mesh.tp", "hidden_size")
    _divides(tr.seq_len, mesh.tp * mesh.cp if plan.sequence_parallel or _uses_seq(plan) else mesh.cp,
             "mesh.tp*cp" if plan.sequence_parallel else "mesh.cp", "seq_len")
    if m.num_experts:
        _divides(m.num_experts, mesh.ep, "mesh.ep", "num_experts")
    if mesh.ep > 1 and (mesh.dp * mesh.cp) % mesh.ep:
        raise WorkloadError("mesh.ep", mesh.ep, f"a divisor of dp*cp ({mesh.dp * mesh.cp})")
    if tr.global_batch % (mesh.dp * tr.micro_batch):
        raise WorkloadError("training.global_batch", tr.global_batch,
                            f"a multiple of dp*micro_batch ({mesh.dp}*{tr.micro_batch})")
    _check_pipeline(plan, mesh)
    if plan.fsdp and plan.zero_stage not in (0, 3):
        raise WorkloadError("zero_stage", plan.zero_stage, "0 or 3 when fsdp.enabled (FSDP is ZeRO-3)")
    return replace(plan, mesh=mesh)


def _uses_seq(plan: Plan) -> bool:
    layers = [plan.sharding] + [o for _, _, o in plan.layer_overrides]
    return any(s == "seq" for strategies in layers for s in strategies.values())


def _check_pipeline(plan: Plan, mesh: Mesh) -> None:
    layers, pipe = plan.model.num_layers, plan.pipeline
    chunks = mesh.pp * pipe.virtual_stages
    if chunks > layers:
        raise WorkloadError("mesh.pp", mesh.pp,
                            f"pp*virtual_stages <= num_layers ({layers})")
    if pipe.schedule != "interleaved" and pipe.virtual_stages != 1:
        raise WorkloadError("pipeline.virtual_stages", pipe.virtual_stages,
                            "1 unless schedule is interleaved")
    micro = plan.training.global_batch // (mesh.dp * plan.training.micro_batch)
    if pipe.schedule == "interleaved" and micro % mesh.pp:
        raise WorkloadError("training.global_batch", plan.training.global_batch,
                            f"micro-batches ({micro}) a multiple of pp ({mesh.pp}) for interleaved")
    if pipe.layer_split is not None:
        if len(pipe.layer_split) != chunks:
            raise WorkloadError("pipeline.layer_split", list(pipe.layer_split),
                                f"{chunks} entries (pp*virtual_stages)")
        if sum(pipe.layer_split) != layers:
            raise WorkloadError("pipeline.layer_split", list(pipe.layer_split),
                                f"entries that add up to num_layers ({layers})")
