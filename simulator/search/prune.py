"""Cheap checks before any simulation: feasibility (divisibility, lowering support, memory)
and a lower bound on the step time from the compute stream alone.

The lower bound is valid because a rank's compute stream runs its kernels one after the
other: the step is at least the sum of its compute kernels (without the SM-sharing
slowdown, which only lengthens them). With a pipeline, stage s cannot start before the
upstream stages have run the first micro-batch's forward, and after its last kernel the
upstream stages still run the last micro-batch's backward; both are idle time of s.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from topologies import Topology
from workloads import Plan, WorkloadError, plan_from_dict, resolve
from workloads.lowering import lower
from workloads.schedules import stage_layers
from workloads.memory import peak_memory
from workloads.program import COMPUTE

from ..compute import compute_time_s
from .space import Candidate

EMBED_NAMES = ("embedding",)


def candidate_plan(c: Candidate, model_ref: Any, topology: str | None = None) -> Plan:
    """The validated Plan of a candidate, parsed from its plan file object like `run` does."""
    return plan_from_dict(c.to_plan_dict(model_ref, topology))


def reduced_plan(plan: Plan, layers_per_stage: int, micro_batches: int) -> Plan:
    """The plan with fewer layers (the same remainder pattern over stages) and micro-batches.

    Stage s of the reduced plan holds `layers_per_stage` layers, plus one where the full
    plan's default split gives stage s one extra, so extrapolating in layers per stage
    keeps every stage's share.
    """
    pp = plan.mesh.pp
    extra = plan.model.num_layers % pp
    layers = layers_per_stage * pp + extra
    model = dataclasses.replace(plan.model, num_layers=layers)
    tr = plan.training
    training = dataclasses.replace(tr, global_batch=plan.mesh.dp * tr.micro_batch * micro_batches)
    return dataclasses.replace(plan, model=model, training=training, layer_overrides=(),
                               pipeline=dataclasses.replace(plan.pipeline, layer_split=None),
                               source={})


@dataclass
class Feasibility:
    """The outcome of the cheap checks: a resolved plan, or why the candidate is dropped."""

    plan: Plan | None
    reason: str | None
    peak_memory_bytes: float = 0.0


class Checker:
    """Feasibility checks with caches (lowering support is probed once per feature set)."""

    def __init__(self, topology: Topology, budget_bytes: float, model_ref: Any):
        self.topology, self.budget_bytes, self.model_ref = topology, budget_bytes, model_ref
        self._lowerable: dict[tuple, str | None] = {}
        self._memory: dict[tuple, float] = {}

    def check(self, c: Candidate) -> Feasibility:
        """Resolve (divisibility), probe the lowering, check memory against the budget."""
        try:
            plan = resolve(candidate_plan(c, self.model_ref), self.topology.world_size)
        except WorkloadError as exc:
            return Feasibility(None, f"divisibility: {exc.field}" if hasattr(exc, "field")
                               else f"invalid: {exc}")
        reason = self._lowering_support(plan)
        if reason:
            return Feasibility(None, reason)
        peak = self._peak_bytes(c, plan)
        if peak > self.budget_bytes:
            return Feasibility(None, "memory: exceeds budget", peak)
        return Feasibility(plan, None, peak)

    def _peak_bytes(self, c: Candidate, plan: Plan) -> float:
        """workloads.memory's peak, cached by the candidate with its strategies reduced to
        which projections are replicated (the only strategy the memory model sees: col,
        row and seq weights are all stored sharded over TP)."""
        mask = tuple(s == "replicate" for _, s in c.sharding)
        key = dataclasses.astuple(dataclasses.replace(c, sharding=())) + (mask,)
        if key not in self._memory:
            self._memory[key] = peak_memory(plan).peak_bytes
        return self._memory[key]

    def _lowering_support(self, plan: Plan) -> str | None:
        """Try lowering a one-layer, one-micro-batch version of plans with these features."""
        key = (plan.mesh.cp > 1, plan.mesh.pp > 1, plan.pipeline.schedule, plan.fsdp)
        if key not in self._lowerable:
            try:
                lower(reduced_plan(plan, 1, 1))
                self._lowerable[key] = None
            except WorkloadError as exc:
                self._lowerable[key] = f"not lowered yet: {getattr(exc, 'field', exc)}"
        return self._lowerable[key]


@dataclass(frozen=True)
class UnitCompute:
    """Uncontended compute-stream seconds of one micro-batch through each unit kind."""

    layer_fwd_s: float
    layer_bwd_s: float          # backward, recompute included
    embed_s: float
    head_s: float


class LowerBound:
    """Compute-stream lower bound on the step time, with per-layer results cached.

    One layer's compute kernels depend only on (tp, cp, micro-batch, sequence
    parallelism, recompute, strategies, dtype, attention); they come from lowering a
    one-layer, one-stage, one-micro-batch version of the plan, so they are the kernels
    the full program has.
    """

    def __init__(self, topology: Topology):
        self.devices: list = []
        for d in topology.devices:          # the distinct device specs (equality, not hash)
            if not any(d == u for u in self.devices):
                self.devices.append(d)
        self._units: dict[tuple, UnitCompute] = {}

    def units(self, plan: Plan) -> UnitCompute:
        """Per-unit compute seconds (cached by the layer-relevant fields of the plan)."""
        key = (plan.mesh.tp, plan.mesh.cp, plan.training.micro_batch, plan.training.seq_len,
               plan.training.dtype, plan.sequence_parallel, plan.recompute, plan.attention,
               tuple(sorted(plan.strategies(0).items())))
        if key not in self._units:
            self._units[key] = self._measure(plan)
        return self._units[key]

    def _measure(self, plan: Plan) -> UnitCompute:
        mesh = dataclasses.replace(plan.mesh, pp=1, dp=1)
        one = reduced_plan(dataclasses.replace(plan, mesh=mesh, fsdp=False, zero_stage=0), 1, 1)
        one = dataclasses.replace(one, model=dataclasses.replace(one.model, num_layers=1))
        tasks = lower(one).stages[0]
        fwd = bwd = embed = head = 0.0
        for t in tasks:
            if t.kind != COMPUTE or t.phase == "optimizer":
                continue
            d = min(compute_time_s(t, dev, plan.training.dtype) for dev in self.devices)
            if t.layer >= 0:
                if t.phase == "forward":
                    fwd += d
                else:
                    bwd += d
            elif any(n in t.label for n in EMBED_NAMES):
                embed += d
            else:
                head += d
        return UnitCompute(fwd, bwd, embed, head)

    def bound_s(self, plan: Plan) -> float:
        """max over stages s of: upstream forwards and backwards of one micro-batch plus
        the compute of stage s for every micro-batch (the optimizer is left out)."""
        u = self.units(plan)
        m, ranges = plan.micro_batches, stage_layers(plan)
        last = len(ranges) - 1
        per_mb = []
        for s, layers in enumerate(ranges):
            f = len(layers) * u.layer_fwd_s
            b = len(layers) * u.layer_bwd_s
            ends = (u.embed_s if s == 0 else 0.0) + (u.head_s if s == last else 0.0)
            per_mb.append((f, b, ends))
        best, upstream = 0.0, 0.0
        for f, b, ends in per_mb:
            best = max(best, upstream + m * (f + b + ends))
            upstream += f + b
        return best
