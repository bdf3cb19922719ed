"""The search space: candidate plans (mesh, batch split, memory options, per-projection
strategies) and their enumeration, with equivalent candidates folded into one.

A Candidate is a point of the space; `to_plan_dict` turns it into a plan file that
`python -m simulator run` accepts, so the search and `run` simulate the very same plan.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

from workloads import ModelSpec
from workloads.attention_impls import scores_on_chip
from workloads.plan import MEGATRON, PROJECTIONS, RECOMPUTE, STRATEGIES

# Projection groups the default search assigns one strategy to (the adaptive-sharding study's table rows).
GROUPS: dict[str, tuple[str, ...]] = {
    "attn_in": ("wq", "wk", "wv"), "wo": ("wo",), "mlp_in": ("w1", "w3"), "w2": ("w2",)}
GRANULARITIES = ("group", "projection", "megatron")
# The per-projection (1D) strategies, which mix freely; the 2D/2.5D/3D grid layouts apply
# to every projection at once and are not enumerated here.
ONE_D = ("col", "row", "seq", "replicate")


@dataclass(frozen=True)
class SearchSpace:
    """What the search may choose; every field is a tuple of allowed values."""

    tp: tuple[int, ...] | None = None          # None: every divisor that the model allows
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] = (1,)
    micro_batch: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    fsdp: tuple[bool, ...] = (True, False)
    sequence_parallel: tuple[bool, ...] = (True, False)
    strategies: tuple[str, ...] = ONE_D
    granularity: str = "group"                 # group | projection | megatron
    schedule: str = "1f1b"
    attention: str = "flash"
    framework: str = "generic"                 # the plans' "framework" (its profile)

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}")
        for r in self.recompute:
            if r not in RECOMPUTE:
                raise ValueError(f"recompute {r!r} not in {RECOMPUTE}")
        for s in self.strategies:
            if s not in STRATEGIES:
                raise ValueError(f"strategy {s!r} not in {STRATEGIES}")


@dataclass(frozen=True, order=True)
class Candidate:
    """One plan of the search space (mesh degrees resolved, dp explicit)."""

    tp: int
    pp: int
    dp: int
    cp: int
    micro_batch: int
    fsdp: bool
    recompute: str
    sequence_parallel: bool
    sharding: tuple[tuple[str, str], ...]       # (projection, strategy), PROJECTIONS order
    global_batch: int = field(compare=False)
    seq_len: int = field(compare=False)
    dtype: str = field(default="bf16", compare=False)
    schedule: str = field(default="1f1b", compare=False)
    attention: str = field(default="flash", compare=False)
    framework: str = field(default="generic", compare=False)

    @property
    def strategies(self) -> dict[str, str]:
        """Projection -> strategy."""
        return dict(self.sharding)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per DP rank per step."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def key(self) -> tuple:
        """A stable, total sort key (ties between equal step times break on it)."""
        return (self.tp, self.pp, self.dp, self.cp, self.micro_batch, not self.fsdp,
                RECOMPUTE.index(self.recompute), not self.sequence_parallel,
                tuple((STRATEGIES + (s,)).index(s) for _, s in self.sharding))

    def label(self) -> str:
        """A short human-readable name, e.g. `tp8.pp1.dp4.mb1.fsdp.sp.rc-none.ccrcccr`."""
        code = {"col": "c", "row": "r", "seq": "s", "replicate": "x"}
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        parts += [f"mb{self.micro_batch}", "fsdp" if self.fsdp else "ddp",
                  "sp" if self.sequence_parallel else "nosp", f"rc-{self.recompute}"]
        if self.tp > 1:
            parts.append("".join(code.get(s, f"[{s}]") for _, s in self.sharding))
        return ".".join(parts)

    def to_plan_dict(self, model_ref: Any, topology: str | None = None,
                     name: str | None = None) -> dict[str, Any]:
        """The candidate as a plan file object (docs/design.md, "Plan file")."""
        plan: dict[str, Any] = {
            "name": name or self.label(),
            "model": model_ref,
            "training": {"global_batch": self.global_batch, "micro_batch": self.micro_batch,
                         "seq_len": self.seq_len, "dtype": self.dtype},
            "mesh": {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp},
            "fsdp": {"enabled": self.fsdp, "reshard_after_forward": True},
            "zero_stage": 0,
            "sharding": {**self.strategies, "sequence_parallel": self.sequence_parallel},
            "recompute": self.recompute,
            "attention": self.attention,
            "pipeline": {"schedule": self.schedule},
        }
        if self.framework != "generic":
            plan["framework"] = self.framework
        if topology:
            plan["topology"] = topology
        return plan


# What each framework's config can express (workloads/jobs): one TP layout (Megatron's
# column/row), the recompute modes it has; torchtitan's TP always shards the norms over
# the sequence (sequence parallelism), and it shards with FSDP whenever CP is on.
FRAMEWORK_SPACES = {
    "torchtitan": {"recompute": ("none", "selective_op", "full"), "sequence_parallel": (True,),
                   # SDPA with the backend torchtitan picks by GPU (its profile's default,
                   # workloads/frameworks.py; named per topology by simulator/api.py)
                   "attention": "sdpa"},
    "megatron-core": {"recompute": ("none", "selective", "full")},
    # Megatron-LM 2020-2021 had full recompute only (--checkpoint-activations, arguments.py)
    "megatron-lm": {"recompute": ("none", "full")},
}


def for_framework(space: SearchSpace, framework: str) -> SearchSpace:
    """The part of `space` whose plans `framework`'s job config can express."""
    if framework == "generic":
        return space
    limits = FRAMEWORK_SPACES[framework]
    recompute = tuple(r for r in space.recompute if r in limits["recompute"])
    if not recompute:
        raise ValueError(f"no recompute mode of {space.recompute} is expressible in "
                         f"{framework} ({', '.join(limits['recompute'])})")
    return dataclasses.replace(space, framework=framework, granularity="megatron",
                               recompute=recompute, sequence_parallel=limits.get(
                                   "sequence_parallel", space.sequence_parallel),
                               attention=limits.get("attention", space.attention))


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def strategy_assignments(space: SearchSpace, model: ModelSpec, tp: int) -> list[tuple]:
    """Every per-projection assignment of the space for a TP degree, as sorted tuples.

    With tp = 1 every strategy lowers to the same program, so only Megatron's is kept.
    """
    names = [p for p in PROJECTIONS if p in model.projection_shapes()]
    if tp == 1 or space.granularity == "megatron":
        return [tuple((p, MEGATRON[p]) for p in names)]
    if space.granularity == "projection":
        units = [(p,) for p in names]
    else:
        units = [tuple(p for p in group if p in names) for group in GROUPS.values()]
        units = [u for u in units if u]
    out = []
    for choice in itertools.product(space.strategies, repeat=len(units)):
        chosen = {p: s for unit, s in zip(units, choice) for p in unit}
        out.append(tuple((p, chosen[p]) for p in names))
    return out


def meshes(space: SearchSpace, world_size: int) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) factorisations of the world size within the space."""
    for tp in space.tp or divisors(world_size):
        for pp in space.pp or divisors(world_size):
            for cp in space.cp:
                rest = tp * pp * cp
                if world_size % rest == 0:
                    yield tp, pp, cp, world_size // rest


@dataclass
class Enumeration:
    """Candidates of the space, and how many points were folded into others and why."""

    candidates: list[Candidate]
    folded: dict[str, int]
    raw_points: int


def enumerate_space(space: SearchSpace, model: ModelSpec, world_size: int, global_batch: int,
                    seq_len: int, dtype: str = "bf16") -> Enumeration:
    """Every distinct candidate, in a stable order.

    Folded (counted, not kept): sequence parallelism at tp = 1 (nothing to shard over),
    selective recompute under flash attention (flash already recomputes the scores, so
    it is the same program and memory as none), fsdp at dp*cp = 1 (nothing to shard).
    """
    folded: dict[str, int] = {}
    seen: set[Candidate] = set()
    out: list[Candidate] = []
    raw = 0

    def fold(reason: str, n: int) -> None:
        folded[reason] = folded.get(reason, 0) + n

    for tp, pp, cp, dp in meshes(space, world_size):
        assignments = strategy_assignments(space, model, tp)
        for mb, fsdp, rc, sp in itertools.product(space.micro_batch, space.fsdp,
                                                  space.recompute, space.sequence_parallel):
            raw += len(assignments)
            if sp and tp == 1:
                if False in space.sequence_parallel:
                    fold("sequence parallelism needs tp > 1", len(assignments))
                    continue
                sp = False
            if rc == "selective" and scores_on_chip(space.attention):
                if "none" in space.recompute:
                    fold("selective recompute = none under flash attention", len(assignments))
                    continue
            if fsdp and dp * cp == 1:
                if False in space.fsdp:
                    fold("fsdp needs dp*cp > 1", len(assignments))
                    continue
            if space.framework == "torchtitan" and cp > 1 and not fsdp:
                fold("torchtitan shards with FSDP when cp > 1", len(assignments))
                continue
            for sharding in assignments:
                c = Candidate(tp, pp, dp, cp, mb, fsdp, rc, sp, sharding, global_batch,
                              seq_len, dtype, space.schedule, space.attention, space.framework)
                if c not in seen:
                    seen.add(c)
                    out.append(c)
    out.sort(key=lambda c: c.key)
    return Enumeration(out, folded, raw)


def space_size(space: SearchSpace, model: ModelSpec, world_size: int) -> int:
    """Points of the raw space (before folding and feasibility)."""
    per_mesh = len(space.micro_batch) * len(space.fsdp) * len(space.recompute) * \
        len(space.sequence_parallel)
    return sum(per_mesh * len(strategy_assignments(space, model, tp))
               for tp, _, _, _ in meshes(space, world_size)) if per_mesh else 0


__all__ = ["Candidate", "Enumeration", "FRAMEWORK_SPACES", "GROUPS", "SearchSpace", "divisors",
           "enumerate_space", "for_framework", "meshes", "space_size", "strategy_assignments"]
