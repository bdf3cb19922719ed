"""Cheap checks before any simulation: feasibility (divisibility, lowering support, memory)
and a lower bound on the step time from the compute stream and the host.

The lower bound is the larger of two, each valid alone:
  * the device: a rank's compute stream runs its kernels one after the other, so the step
    is at least the sum of their device times (without the SM-sharing slowdown, which only
    lengthens them). With a pipeline, stage s cannot start before the upstream stages have
    run the first micro-batch's forward, and after its last kernel the upstream stages
    still run the last micro-batch's backward; both are idle time of s.
  * the host: a rank's host issues its stage's tasks one after the other, each after its
    host time (simulator/host_timeline.py), and a task starts no earlier than its issue, so
    the step is at least the sum of the stage's host times.
They are not added task by task (max(device, host) per task, simulator.compute.
compute_time_s): the host runs ahead of the device, so one task's host time hides behind
another's device time, and such a sum can exceed the simulated step.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from topologies import Topology, TopologyError
from workloads import Plan, WorkloadError, plan_from_dict
from workloads.attention_impls import COMPUTE_CAPABILITY
from workloads.lowering import lower
from workloads.schedules import stage_layers
from workloads.memory import peak_memory
from workloads.precision import non_tn_fp8_gemms
from workloads.program import COMPUTE, HOST_COPY

from ..api import resolve_on
from ..compute import device_time_s, host_factor
from .space import Candidate

EMBED_NAMES = ("embedding",)
# A candidate's fields but its sharding: with the replicated projections, what its peak
# memory depends on (Checker._peak_bytes; read by name, not through dataclasses.astuple,
# which copies every field once per candidate).
_MEMORY_KEY_FIELDS = tuple(f.name for f in dataclasses.fields(Candidate) if f.name != "sharding")
# col and row split a weight over TP alike; seq and replicate keep it whole (differently)
_MEMORY_CLASS = {"col": "split", "row": "split"}


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
                               activation_offload=_reduced_offload(plan, layers), source={})


def _reduced_offload(plan: Plan, layers: int):
    """Activation offloading over `layers` layers: the same share of them, fewer than all
    (workloads/activation_offload.py); None where no layer is left to offload."""
    offload = plan.activation_offload
    if offload is None:
        return None
    kept = min(layers - 1, round(offload.layers * layers / plan.model.num_layers))
    return dataclasses.replace(offload, layers=kept) if kept >= 1 else None


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
            # resolved as `run` does: dp for the world size, `sdpa` as the GPU's backend
            plan = resolve_on(candidate_plan(c, self.model_ref), self.topology)
        except (WorkloadError, TopologyError) as exc:
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
        what the memory model sees of them (workloads/params.py): col and row weights are
        split over TP, a seq weight is whole on every TP rank (its gradient reduced, and
        under FSDP sharded, over DP and TP), a replicated one whole (over DP only)."""
        classes = tuple(_MEMORY_CLASS.get(s, s) for _, s in c.sharding)
        key = tuple(getattr(c, name) for name in _MEMORY_KEY_FIELDS) + (classes,)
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
    """Uncontended compute-stream seconds of one micro-batch through each unit kind, and
    the host's seconds to issue them (per micro-batch too)."""

    layer_fwd_s: float
    layer_bwd_s: float          # backward, recompute included
    embed_s: float
    head_s: float
    layer_host_s: float = 0.0   # forward, backward and recompute of one layer
    embed_host_s: float = 0.0
    head_host_s: float = 0.0


class LowerBound:
    """Lower bound on the step time from the device and the host, with per-layer results
    cached.

    One layer's tasks come from lowering a one-layer, one-stage, one-micro-batch version
    of the plan, so they are the tasks the full program has per layer; the cache is keyed
    by every field that version keeps (_layer_key: the kernels, the host cost and the
    framework change a layer's tasks as much as the mesh does).
    """

    def __init__(self, topology: Topology):
        self.devices: list = []
        for d in topology.devices:          # the distinct device specs (equality, not hash)
            if not any(d == u for u in self.devices):
                self.devices.append(d)
        # the fastest host among the devices': host time is at least its
        self.host_factor = min(host_factor(d) for d in self.devices)
        # the GPU whose recipe casts the least (Blackwell's FP8 casts write no transpose:
        # workloads/precision.py te_recipe), so the bound stays a bound on every device
        self.cast_gpu = next((d.name for d in self.devices if non_tn_fp8_gemms(
            COMPUTE_CAPABILITY.get(d.name.lower(), (0, 0)))), self.devices[0].name)
        self._units: dict[str, UnitCompute] = {}

    def units(self, plan: Plan) -> UnitCompute:
        """Per-unit device and host seconds (cached by the one-layer plan)."""
        key = _layer_key(plan)
        if key not in self._units:
            self._units[key] = self._measure(_one_layer(plan), plan.training.dtype)
        return self._units[key]

    def _measure(self, one: Plan, dtype: str) -> UnitCompute:
        # simulate lowers for the first device's name (its attention kernel's length curve:
        # workloads/attention.py kernel_speed), the cast bound for cast_gpu's: each unit
        # keeps the smaller of the two, so the bound holds for either lowering
        lowerings = [self._measure_lowered(one, dtype, gpu)
                     for gpu in dict.fromkeys((self.cast_gpu, self.devices[0].name))]
        return UnitCompute(*(min(values) for values in zip(*lowerings)))

    def _measure_lowered(self, one: Plan, dtype: str, gpu: str) -> tuple[float, ...]:
        """The UnitCompute fields of `one` lowered for `gpu`, each task at its fastest
        device."""
        device = dict(fwd=0.0, bwd=0.0, embed=0.0, head=0.0)
        host = dict(fwd=0.0, bwd=0.0, embed=0.0, head=0.0)
        for t in lower(one, gpu).stages[0]:
            if t.kind != COMPUTE or t.phase == "optimizer" or t.microbatch < 0:
                continue   # per step (optimizer, host_step): not scaled by micro-batches
            if t.layer >= 0:
                unit = "fwd" if t.phase == "forward" else "bwd"
            else:
                unit = "embed" if any(n in t.label for n in EMBED_NAMES) else "head"
            if t.op_class != HOST_COPY:   # a copy engine's transfer may run beside compute
                device[unit] += min(device_time_s(t, dev, dtype) for dev in self.devices)
            host[unit] += t.host_s * self.host_factor
        return (device["fwd"], device["bwd"], device["embed"], device["head"],
                host["fwd"] + host["bwd"], host["embed"], host["head"])

    def bound_s(self, plan: Plan) -> float:
        """The larger of the device bound and the host bound (module docstring)."""
        u = self.units(plan)
        return max(self._device_bound_s(plan, u), self._host_bound_s(plan, u))

    def _device_bound_s(self, plan: Plan, u: UnitCompute) -> float:
        """max over stages s of: upstream forwards and backwards of one micro-batch plus
        the compute of stage s for every micro-batch (the optimizer is left out)."""
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

    def _host_bound_s(self, plan: Plan, u: UnitCompute) -> float:
        """max over stages of the host time of its tasks: every micro-batch through its
        layers and ends, and the step's own host work once (the optimizer left out)."""
        m, ranges = plan.micro_batches, stage_layers(plan)
        last = len(ranges) - 1
        step_s = plan.host_step_s * self.host_factor
        return max(m * (len(layers) * u.layer_host_s + (u.embed_host_s if s == 0 else 0.0)
                        + (u.head_host_s if s == last else 0.0)) + step_s
                   for s, layers in enumerate(ranges))


# What _one_layer sets whatever the plan says (Plan fields; Mesh, Training and ModelSpec
# fields within those): left out of the cache key, everything else is in it.
_SET_BY_ONE_LAYER = {"plan": ("name", "source", "fsdp", "zero_stage", "layer_overrides",
                              "mesh", "training", "model"),
                     "mesh": ("pp", "dp"), "training": ("global_batch",),
                     "model": ("num_layers",)}


def _fields(obj: Any, kind: str) -> tuple:
    return tuple((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)
                 if f.name not in _SET_BY_ONE_LAYER[kind])


def _layer_key(plan: Plan) -> str:
    """The cache key of a plan's per-layer times: every field its one-layer version keeps
    (a field too many costs a lowering; one too few would mix plans up)."""
    return repr((_fields(plan, "plan"), _fields(plan.mesh, "mesh"),
                 _fields(plan.training, "training"), _fields(plan.model, "model")))


def _one_layer(plan: Plan) -> Plan:
    """The plan's one-layer, one-stage, one-micro-batch version without data parallelism
    (no FSDP or ZeRO), whose lowering gives one layer's tasks."""
    mesh = dataclasses.replace(plan.mesh, pp=1, dp=1)
    one = reduced_plan(dataclasses.replace(plan, mesh=mesh, fsdp=False, zero_stage=0), 1, 1)
    return dataclasses.replace(one, model=dataclasses.replace(one.model, num_layers=1))
