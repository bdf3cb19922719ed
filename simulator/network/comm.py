"""What the engine calls: a collective as a SimPy event, on links shared with the rest.

`CommModel.collective` waits the plan's latency, then pushes its flows through the
`Network`, where they share links max-min fairly with every other transfer in flight.

Twins. The engine simulates one representative of a class of identical ranks, so a
collective on the representative's group stands for the same collective on other groups
("twins") at the same moment. Their flows are not simulated; instead each representative
flow counts on a link as itself plus its part of the twins' load there: a rep flow that
shares link l with k twin flows (of the same size) counts k+1 times on l. With several rep
flows on l, the twins' bytes on l are spread over them by the rep bytes (multiplicity
1 + twin_bytes(l) / rep_bytes(l)). Only twins whose links meet the rep's matter: twins
in no shared domain and not both crossing a shared leaf group's spine links are skipped
before any route is computed, and the result is cached per (op, group, twins, algorithm).
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict

import simpy

from .collectives import CollectiveModel, CollectivePlan, CommOptions
from .fluid import Network, ShapeCache

# The size-independent and size-keyed work of the network model (NCCL's plans and their
# flow templates, flow shapes and their idle-link schedules, max-min rates) depends on the
# topology and the collective options alone, never on the program: simulations of one
# topology share it (a search's thousands of reduced simulations, a study alternating two
# clusters). Kept for the last SHARED_TOPOLOGIES (topology object, options) pairs: an
# entry holds its topology, so the id stays that object's, and keeps it alive until
# newer pairs replace it. A shape cache past MAX_SHARED_SHAPES entries (shapes, their
# lookups by identity, rate sets) starts again; the plans' cache bounds itself.
SHARED_TOPOLOGIES = 2
MAX_SHARED_SHAPES = 200_000
_shared: OrderedDict[tuple[int, CommOptions], tuple] = OrderedDict()


def shared_models(topology, options: CommOptions) -> tuple[CollectiveModel, ShapeCache]:
    """The CollectiveModel and ShapeCache of (topology, options), the same objects for
    every simulation of that topology object while it is among the recent ones."""
    key = (id(topology), options)
    entry = _shared.get(key)
    if entry is None:
        entry = (topology, CollectiveModel(topology, options), ShapeCache())
        _shared[key] = entry
        while len(_shared) > SHARED_TOPOLOGIES:
            _shared.popitem(last=False)
    _shared.move_to_end(key)
    cache = entry[2]
    if len(cache.shapes) + len(cache.by_id) + len(cache.rates) > MAX_SHARED_SHAPES:
        entry = _shared[key] = (topology, entry[1], ShapeCache())
    return entry[1], entry[2]


class CommModel:
    """Collectives for the engine: closed-form plans plus flow-level link sharing."""

    def __init__(self, env: simpy.Environment, topology,
                 options: CommOptions = CommOptions()) -> None:
        self.env = env
        self.topology = topology
        self.options = options
        self.model, shapes = shared_models(topology, options)
        self.network = Network(env, topology, shapes)
        self._twin_ratio: dict = {}
        self._twin_weights: dict = {}

    def plan(self, op: str, ranks: tuple[int, ...], size_bytes: float) -> CollectivePlan:
        """The closed-form plan (cached in the CollectiveModel)."""
        return self.model.plan(op, ranks, size_bytes)

    def collective(self, op: str, ranks: tuple[int, ...], size_bytes: float,
                   twins: tuple[tuple[int, ...], ...] = (),
                   kernel_min_s: float = 0.0) -> simpy.Event:
        """An event that fires when the collective is done, and not before `kernel_min_s`
        from now (the measured time of the kernel that runs it, where that is slower than
        the links: Task.kernel_Bps); its value is the plan used."""
        plan = self.model.plan(op, ranks, size_bytes)
        if not plan.flows or not self.options.flow_sharing:
            return self.env.timeout(max(plan.closed_form_s, kernel_min_s), value=plan)
        weights = self._weights(op, tuple(ranks), tuple(twins), plan) if twins else None
        return self.env.process(self._run(plan, weights, kernel_min_s))

    def _run(self, plan: CollectivePlan, weights, kernel_min_s: float = 0.0):
        # The flows start after NCCL's latency (and the NVLS fill); a ring's further
        # passes pay their steps' latencies while the bytes move, taken here after them.
        start = self.env.now
        if plan.latency_s - plan.passes_s > 0:
            yield self.env.timeout(plan.latency_s - plan.passes_s)
        yield self.network.transfer(plan.flows, weights)
        if plan.passes_s > 0:
            yield self.env.timeout(plan.passes_s)
        if self.env.now < start + kernel_min_s:
            yield self.env.timeout(start + kernel_min_s - self.env.now)
        return plan

    # -- twins ------------------------------------------------------------------------
    def _weights(self, op, ranks, twins, plan: CollectivePlan):
        key = (op, ranks, twins, plan.algorithm)
        if key in self._twin_weights:
            return self._twin_weights[key]
        ratio = self.twin_load_ratio(op, ranks, twins, plan.algorithm)
        weights = None
        if ratio:   # template and plan list the same routes in the same order
            # A tuple, never mutated: the Network caches its shapes by its identity.
            weights = tuple({l: 1.0 + ratio[l] for l in route if l in ratio} or None
                            for route, _ in plan.flows)
        self._twin_weights[key] = weights
        return weights

    def twin_load_ratio(self, op: str, ranks: tuple[int, ...],
                        twins: tuple[tuple[int, ...], ...], algorithm: str) -> dict[int, float]:
        """link id -> twin bytes / rep bytes on that link, for links the rep uses (cached)."""
        key = (op, ranks, twins, algorithm)
        ratio = self._twin_ratio.get(key)
        if ratio is not None:
            return ratio
        rep_bytes: dict[int, float] = defaultdict(float)
        for route, w in self.model.template(op, ranks, algorithm).flows:
            for link in route:
                rep_bytes[link] += w
        twin_bytes: dict[int, float] = defaultdict(float)
        for twin in self._relevant(ranks, twins):
            algo = algorithm if algorithm in self.model.algorithms(op, twin) else \
                self.model.algorithms(op, twin)[0]
            for route, w in self.model.template(op, twin, algo).flows:
                for link in route:
                    if link in rep_bytes:
                        twin_bytes[link] += w
        ratio = {l: b / rep_bytes[l] for l, b in twin_bytes.items()}
        self._twin_ratio[key] = ratio
        return ratio

    def _relevant(self, ranks, twins):
        """Twins that can share a link with the rep group (cheap, no routes)."""
        topo = self.topology
        per_leaf = max(topo.domains_per_leaf, 1)
        rep_domains = {topo.domain_of(r) for r in ranks}
        rep_leaves = {d // per_leaf for d in rep_domains}
        rep_spine = len(rep_leaves) > 1
        out = []
        for twin in twins:
            if len(twin) <= 1 or tuple(twin) == ranks:
                continue
            domains = {topo.domain_of(r) for r in twin}
            if domains & rep_domains:
                out.append(tuple(twin))
                continue
            leaves = {d // per_leaf for d in domains}
            if rep_spine and len(leaves) > 1 and leaves & rep_leaves:
                out.append(tuple(twin))
        return out
