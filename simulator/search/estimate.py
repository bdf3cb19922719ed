"""Step-time estimates from reduced simulations: the same plan with fewer layers per
stage and fewer micro-batches, simulated by the real engine, then extrapolated.

Within a stage every layer lowers to the same tasks, and every steady-state micro-batch
repeats the same schedule, so the step time is close to bilinear in (layers per stage k,
micro-batches m): T(k, m) = a + b k + c m + d k m. Four reduced simulations at
k in {k1, k2}, m in {m1, m2} determine it; `screen` uses two (k1, k2 at m1) and scales
to m by the compute lower bound. Both are only used to rank; the search's final ranking
is by full simulation, and it reports the estimate's error on those.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topologies import Topology
from workloads import Plan

from ..api import simulate
from ..engine import SimOptions
from .prune import LowerBound, reduced_plan


@dataclass(frozen=True)
class Point:
    """Where the reduced simulations sit: layers per stage and micro-batches."""

    k_full: int      # layers per stage of the full plan (the base of the default split)
    m_full: int      # micro-batches of the full plan
    k: tuple[int, ...]
    m: tuple[int, ...]


def points(plan: Plan) -> Point:
    """k in {1, 2} (or the full count when it is smaller), m in {m1, m1 + 1} with m1 the
    pipeline depth (1F1B is in steady state from pp micro-batches on)."""
    k_full = plan.model.num_layers // plan.mesh.pp
    m_full = plan.micro_batches
    ks = (k_full,) if k_full <= 2 else (1, 2)
    m1 = min(m_full, plan.mesh.pp)
    ms = (m_full,) if m_full <= m1 + 1 else (m1, m1 + 1)
    return Point(k_full, m_full, ks, ms)


def _line(x: tuple[int, ...], y: list[float], at: int) -> float:
    if len(x) == 1:
        return y[0]
    return y[0] + (at - x[0]) * (y[1] - y[0]) / (x[1] - x[0])


class Estimator:
    """Reduced simulations (cached) and the extrapolations built from them."""

    def __init__(self, topology: Topology, bound: LowerBound, options: SimOptions | None = None):
        self.topology, self.bound = topology, bound
        self.options = options or SimOptions()
        self.simulations = 0
        self._cache: dict[tuple, float] = {}

    def reduced_s(self, plan: Plan, key: tuple, k: int, m: int) -> float:
        """Step time of the plan with k layers per stage and m micro-batches."""
        ck = (key, k, m)
        if ck not in self._cache:
            self.simulations += 1
            result = simulate(reduced_plan(plan, k, m), self.topology, self.options)
            self._cache[ck] = result.summary["step_time_s"]
        return self._cache[ck]

    def screen_s(self, plan: Plan, key: tuple) -> float:
        """Two reduced simulations (k1, k2 at m1), extrapolated in layers, then scaled
        from m1 to the full micro-batch count by the compute lower bound."""
        p = points(plan)
        m1 = p.m[0]
        t = _line(p.k, [self.reduced_s(plan, key, k, m1) for k in p.k], p.k_full)
        if m1 == p.m_full:
            return t
        lb_m1 = self.bound.bound_s(_with_micro_batches(plan, m1))
        return t * self.bound.bound_s(plan) / lb_m1 if lb_m1 else t

    def estimate_s(self, plan: Plan, key: tuple) -> float:
        """Four reduced simulations, bilinear extrapolation to the full plan."""
        p = points(plan)
        rows = [_line(p.k, [self.reduced_s(plan, key, k, m) for k in p.k], p.k_full)
                for m in p.m]
        return _line(p.m, rows, p.m_full)


def _with_micro_batches(plan: Plan, m: int) -> Plan:
    tr = plan.training
    return dataclasses.replace(plan, training=dataclasses.replace(
        tr, global_batch=plan.mesh.dp * tr.micro_batch * m))
