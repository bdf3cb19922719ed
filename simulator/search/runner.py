"""The staged search: enumerate, drop the infeasible, rank by cheap estimates, and rank
the finalists by full simulation.

Stages (every count is reported):
  1. enumerate the space, fold equivalent points (space.enumerate_space);
  2. drop infeasible candidates, counting reasons (divisibility, lowering, memory);
  3. contexts (everything but the per-projection strategies) in order of their compute
     lower bound; each is screened with a few strategy archetypes (Megatron, the
     adaptive-sharding study's hybrid, all-sequence, all-column) by two reduced
     simulations; a context whose lower bound exceeds the best screened time by more
     than `slack` stops the scan;
  4. for the best contexts, block-coordinate descent over the strategies: the attention
     block (attention-in, wo) and the MLP block (mlp-in, w2) meet only at the residual
     stream, whose layout sequence parallelism fixes, so each block is searched
     exhaustively with the other fixed, until nothing changes;
  5. bilinear estimates (four reduced simulations) of the best screened candidates;
  6. full simulations of the best estimated ones: the final ranking.
`exhaustive=True` skips 3-5 and fully simulates every feasible candidate (brute force).
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from topologies import Topology
from workloads import ModelSpec, Plan

from ..api import simulate
from ..engine import SimOptions
from .estimate import Estimator
from .prune import Checker, LowerBound, candidate_plan
from .space import GROUPS, Candidate, SearchSpace, enumerate_space

ARCHETYPES = (
    {"attn_in": "col", "wo": "row", "mlp_in": "col", "w2": "row"},   # Megatron
    {"attn_in": "col", "wo": "seq", "mlp_in": "col", "w2": "row"},   # adaptive-sharding study, 8B
    {"attn_in": "seq", "wo": "seq", "mlp_in": "seq", "w2": "seq"},
    {"attn_in": "col", "wo": "col", "mlp_in": "col", "w2": "col"},
)


@dataclass
class Ranked:
    """A fully simulated candidate."""

    candidate: Candidate
    plan_dict: dict[str, Any]
    summary: dict[str, Any]
    estimate_s: float | None

    @property
    def step_time_s(self) -> float:
        """Full-simulation step time."""
        return self.summary["step_time_s"]


@dataclass
class SearchResult:
    """The top candidates by full simulation, and how the search got there."""

    top: list[Ranked]
    counts: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    folded: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def best(self) -> Ranked | None:
        """The winner (None when nothing is feasible)."""
        return self.top[0] if self.top else None

    def estimate_errors(self) -> list[float]:
        """Relative error of the reduced-simulation estimate on each finalist."""
        return [(r.estimate_s - r.step_time_s) / r.step_time_s for r in self.top
                if r.estimate_s is not None and r.step_time_s]


def _with_groups(c: Candidate, groups: dict[str, str]) -> Candidate:
    chosen = {p: groups[g] for g, members in GROUPS.items() for p in members if g in groups}
    return dataclasses.replace(c, sharding=tuple((p, chosen.get(p, s)) for p, s in c.sharding))


def _context(c: Candidate) -> Candidate:
    return dataclasses.replace(c, sharding=())


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="plan", leave=False, disable=None)


class Search:
    """One search over a space for a model, batch and topology."""

    def __init__(self, model: ModelSpec, model_ref: Any, topology: Topology, topology_ref: str,
                 global_batch: int, seq_len: int, dtype: str = "bf16",
                 space: SearchSpace | None = None, budget_bytes: float | None = None,
                 top_k: int = 5, slack: float = 0.10, max_contexts: int = 6,
                 options: SimOptions | None = None, exhaustive: bool = False):
        self.model, self.model_ref = model, model_ref
        self.topology, self.topology_ref = topology, topology_ref
        self.global_batch, self.seq_len, self.dtype = global_batch, seq_len, dtype
        self.space = space or SearchSpace()
        # Default: the smallest GPU's capacity; a given budget is used as is (studies that
        # ask "which is fastest" regardless of memory pass float("inf")).
        self.budget_bytes = budget_bytes or min(d.hbm_bytes for d in topology.devices)
        self.top_k, self.slack, self.max_contexts = top_k, slack, max_contexts
        self.options = options or SimOptions()
        self.exhaustive = exhaustive
        self.bound = LowerBound(topology)
        self.estimator = Estimator(topology, self.bound, self.options)
        self.plans: dict[Candidate, Plan] = {}
        self.counts: dict[str, int] = {}

    # ---- stages ---------------------------------------------------------------------------
    def feasible(self) -> tuple[dict[Candidate, Plan], dict[str, int], dict[str, int], int]:
        """Stages 1-2: the feasible candidates with their resolved plans."""
        en = enumerate_space(self.space, self.model, self.topology.world_size,
                             self.global_batch, self.seq_len, self.dtype)
        checker = Checker(self.topology, self.budget_bytes, self.model_ref)
        dropped: dict[str, int] = {}
        plans: dict[Candidate, Plan] = {}
        for c in en.candidates:
            f = checker.check(c)
            if f.reason:
                dropped[f.reason] = dropped.get(f.reason, 0) + 1
            else:
                plans[c] = f.plan
        return plans, dropped, en.folded, en.raw_points

    def _screen(self, c: Candidate) -> float:
        self.counts["screened"] = self.counts.get("screened", 0) + 1
        return self.estimator.screen_s(self.plans[c], c.key)

    def scan_contexts(self, bar: Callable[[], None]) -> dict[Candidate, tuple[float, Candidate]]:
        """Stage 3: each context's best archetype by screening, in lower-bound order."""
        contexts: dict[Candidate, list[Candidate]] = {}
        for c in self.plans:
            contexts.setdefault(_context(c), []).append(c)
        bounds = {ctx: min(self.bound.bound_s(self.plans[c]) for c in members)
                  for ctx, members in contexts.items()}
        best = float("inf")
        scores: dict[Candidate, tuple[float, Candidate]] = {}
        for ctx in sorted(contexts, key=lambda x: (bounds[x], x.key)):
            if bounds[ctx] > best * (1 + self.slack):
                self.counts["contexts_pruned_by_bound"] = \
                    self.counts.get("contexts_pruned_by_bound", 0) + 1
                continue
            members = set(contexts[ctx])
            tried = []
            for arch in ARCHETYPES:
                c = _with_groups(contexts[ctx][0], arch)
                if c in members and c not in tried:
                    tried.append(c)
            tried = tried or sorted(members, key=lambda x: x.key)[:1]
            scored = sorted((self._screen(c), c.key, c) for c in tried)
            scores[ctx] = (scored[0][0], scored[0][2])
            best = min(best, scored[0][0])
            bar()
        return scores

    def _units(self) -> dict[str, tuple[str, ...]]:
        names = self.model.projection_shapes()
        if self.space.granularity == "projection":
            return {p: (p,) for p in names}
        return {g: tuple(p for p in m if p in names) for g, m in GROUPS.items()}

    def descend(self, start: Candidate, screened: dict[Candidate, float]) -> None:
        """Stage 4: block-coordinate descent over the strategies from `start`.

        Blocks: the attention units and the MLP units. A block of at most 64 combinations
        is searched exhaustively, a larger one a unit at a time.
        """
        if start.tp == 1 or self.space.granularity == "megatron":
            return
        units = self._units()
        attention = tuple(u for u, ps in units.items() if set(ps) <= {"wq", "wk", "wv", "wo"})
        blocks = [attention, tuple(u for u in units if u not in attention)]
        n = len(self.space.strategies)
        steps = [b for b in blocks if n ** len(b) <= 64] + \
            [(u,) for b in blocks if n ** len(b) > 64 for u in b]
        ctx, current = _context(start), start
        for _ in range(4):
            moved = False
            for block in steps:
                now = current.strategies
                for choice in itertools.product(self.space.strategies, repeat=len(block)):
                    chosen = {p: s for u, s in zip(block, choice) for p in units[u]}
                    c = dataclasses.replace(current, sharding=tuple(
                        (p, chosen.get(p, now[p])) for p, _ in current.sharding))
                    if c in self.plans and c not in screened:
                        screened[c] = self._screen(c)
                best = min((c for c in screened if _context(c) == ctx),
                           key=lambda c: (screened[c], c.key))
                if best != current:
                    current, moved = best, True
            if not moved:
                return

    def run(self) -> SearchResult:
        """All stages; the result's top list is ranked by full simulation."""
        t0 = time.perf_counter()
        self.plans, dropped, folded, raw = self.feasible()
        self.counts.update(raw_points=raw, candidates=sum(dropped.values()) + len(self.plans),
                           feasible=len(self.plans))
        if not self.plans:
            return SearchResult([], self.counts, dropped, folded, time.perf_counter() - t0)
        if self.exhaustive:
            finalists = [(None, c) for c in sorted(self.plans, key=lambda c: c.key)]
        else:
            finalists = self._shortlist()
        ranked = self._simulate_fully(finalists)
        self.counts["reduced_simulations"] = self.estimator.simulations
        return SearchResult(ranked[:self.top_k], self.counts, dropped, folded,
                            time.perf_counter() - t0)

    def _shortlist(self) -> list[tuple[float | None, Candidate]]:
        bar = _progress(0, "screening contexts")
        tick = (lambda: bar.update(1)) if bar else (lambda: None)
        scores = self.scan_contexts(tick)
        order = sorted(scores, key=lambda ctx: (scores[ctx][0], ctx.key))
        best = scores[order[0]][0]
        chosen = [ctx for ctx in order if scores[ctx][0] <= best * (1 + self.slack)]
        chosen = chosen[:self.max_contexts] or order[:1]
        self.counts["contexts_scanned"] = len(scores)
        self.counts["contexts_descended"] = len(chosen)
        screened: dict[Candidate, float] = {scores[ctx][1]: scores[ctx][0] for ctx in scores}
        for ctx in chosen:
            self.descend(scores[ctx][1], screened)
            tick()
        if bar:
            bar.close()
        pool = sorted(screened, key=lambda c: (screened[c], c.key))[:max(2 * self.top_k, 8)]
        bar = _progress(len(pool), "estimating")
        estimates = []
        for c in pool:
            estimates.append((self.estimator.estimate_s(self.plans[c], c.key), c))
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        self.counts["estimated"] = len(estimates)
        estimates.sort(key=lambda e: (e[0], e[1].key))
        return estimates[:self.top_k + 2]

    def _simulate_fully(self, finalists) -> list[Ranked]:
        bar = _progress(len(finalists), "full simulations")
        ranked = []
        for estimate, c in finalists:
            plan_dict = c.to_plan_dict(self.model_ref, self.topology_ref)
            result = simulate(candidate_plan(c, self.model_ref, self.topology_ref),
                              self.topology, self.options)
            ranked.append(Ranked(c, plan_dict, result.summary, estimate))
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        self.counts["full_simulations"] = len(ranked)
        ranked.sort(key=lambda r: (r.step_time_s, r.candidate.key))
        return ranked
