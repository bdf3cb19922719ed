"""Flow-level network: weighted max-min fair sharing of link capacity, in numpy.

A flow is (route, bytes): a tuple of link ids and the bytes it must push through all of
them. Rates follow max-min fairness by progressive filling: every unfrozen flow's rate
grows at the same pace until a link saturates; the flows on saturated links freeze.
A flow may count `m` times on a link (weights): it then stands for itself and `m - 1`
identical twin flows that the engine does not simulate (rank classes), so the link's
capacity is split as if they were there.

Rates are recomputed whenever a flow starts or ends (`Network`), and the same code gives
the completion time of a set of flows on idle links (`idle_time_s`), which is what the
closed-form collective model uses, so the two agree by construction.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import simpy

Flow = tuple[tuple[int, ...], float]
_REL_TOL = 1e-9


def maxmin_rates(entry_link: np.ndarray, entry_flow: np.ndarray, entry_mult: np.ndarray,
                 capacity: np.ndarray, num_flows: int) -> np.ndarray:
    """Weighted max-min fair rates (bytes/s) per flow.

    entry_* describe the (flow, link) incidences: `entry_link` indexes `capacity` (compact
    link numbering), `entry_flow` the flow, `entry_mult` how many times the flow counts on
    that link. Every flow must cross at least one link.
    """
    rates = np.zeros(num_flows)
    frozen = np.zeros(num_flows, dtype=bool)
    remaining = capacity.astype(float).copy()
    num_links = len(capacity)
    while True:
        active = ~frozen[entry_flow]
        if not active.any():
            return rates
        demand = np.bincount(entry_link[active], weights=entry_mult[active],
                             minlength=num_links)
        used = demand > 0
        share = np.full(num_links, np.inf)
        share[used] = np.maximum(remaining[used], 0.0) / demand[used]
        step = share.min()
        rates[~frozen] += step
        remaining -= step * demand
        bottleneck = used & (share <= step * (1 + _REL_TOL) + 1e-300)
        frozen[entry_flow[active & bottleneck[entry_link]]] = True


class _FlowSet:
    """Incidence arrays for a list of flows, with links renumbered compactly."""

    def __init__(self, routes: Sequence[np.ndarray], mults: Sequence[np.ndarray],
                 capacity: np.ndarray) -> None:
        lengths = np.array([len(r) for r in routes], dtype=np.int64)
        self.entry_flow = np.repeat(np.arange(len(routes)), lengths)
        links = np.concatenate(routes) if routes else np.zeros(0, dtype=np.int64)
        self.links, self.entry_link = np.unique(links, return_inverse=True)
        self.entry_mult = (np.concatenate(mults) if mults else np.zeros(0))
        self.capacity = capacity[self.links]
        self.num_flows = len(routes)

    def rates(self) -> np.ndarray:
        """Max-min fair rate of each flow."""
        return maxmin_rates(self.entry_link, self.entry_flow, self.entry_mult,
                            self.capacity, self.num_flows)


def idle_time_s(flows: Sequence[Flow], capacity: np.ndarray) -> float:
    """Time for `flows`, all starting together on otherwise idle links, to finish."""
    live = [(np.asarray(r, dtype=np.int64), float(b)) for r, b in flows if r and b > 0]
    if not live:
        return 0.0
    routes = [r for r, _ in live]
    phases = _idle_phases(routes, [np.ones(len(r)) for r in routes],
                          np.array([b for _, b in live]), capacity)
    return phases[-1][0]


class _Transfer:
    """One call to Network.transfer: its flows, their progress and its completion event."""

    __slots__ = ("seq", "shape", "left", "rates", "last", "done", "generation",
                 "isolated_since")

    def __init__(self, seq: int, shape: "_Shape", done: simpy.Event, now: float) -> None:
        self.seq = seq                              # start order: a deterministic sort key
        self.shape = shape
        self.left = shape.sizes.copy()
        self.rates = np.zeros(len(shape.sizes))
        self.last = now
        self.done = done
        self.generation = 0
        self.isolated_since: float | None = None   # start of the cached idle schedule


class _Shape:
    """Size-independent arrays of a transfer, and its schedule on idle links (cached)."""

    __slots__ = ("id", "routes", "mults", "sizes", "links", "link_ids", "phases")

    def __init__(self, shape_id: int, routes, mults, sizes, capacity: np.ndarray) -> None:
        self.id = shape_id
        self.routes, self.mults = routes, mults
        self.sizes = np.asarray(sizes, dtype=float)
        self.links = np.unique(np.concatenate(routes))
        self.link_ids = tuple(int(l) for l in self.links)   # for the per-link index
        self.phases = _idle_phases(routes, mults, self.sizes, capacity)

    def state_at(self, elapsed: float) -> tuple[np.ndarray, np.ndarray]:
        """(bytes left, rates) of every flow `elapsed` seconds into the idle schedule."""
        left = self.sizes.copy()
        clock = 0.0
        for end, rates in self.phases:
            span = min(end, elapsed) - clock
            if span > 0:
                left = left - rates * span
            clock = end
            if end >= elapsed:
                return np.maximum(left, 0.0), rates
        return np.zeros_like(left), np.zeros_like(left)


def _idle_phases(routes, mults, sizes: np.ndarray, capacity: np.ndarray):
    """Piecewise-constant rates of flows alone on idle links: [(end time, rates), ...]."""
    left = sizes.astype(float).copy()
    alive = left > 0
    phases, clock = [], 0.0
    while alive.any():
        idx = np.flatnonzero(alive)
        rates = np.zeros(len(left))
        rates[idx] = _FlowSet([routes[i] for i in idx], [mults[i] for i in idx],
                              capacity).rates()
        finish = left[idx] / rates[idx]
        dt = float(finish.min())
        clock += dt
        left = left - rates * dt
        phases.append((clock, rates))
        alive[idx[finish <= dt * (1 + _REL_TOL)]] = False
    return phases


class ShapeCache:
    """What a Network computes once per topology, whatever the program: the shapes of its
    transfers (with their schedules on idle links) and max-min rates of sets of them. Pure
    functions of the flows and the link capacities, so simulations of one topology may
    share one (simulator/network/comm.py shared_models)."""

    def __init__(self) -> None:
        self.shapes: dict[tuple, _Shape] = {}
        # (id(flows), id(weights)) -> (flows, weights, shape), for immutable arguments
        # (Network._shape); holding the objects keeps their ids from being reused.
        self.by_id: dict[tuple[int, int], tuple] = {}
        # Rates depend only on which flows of which shapes are running, not on bytes
        # left: a training step repeats the same overlaps, so they are cached.
        self.rates: dict[tuple, list[tuple[np.ndarray, np.ndarray]]] = {}


class Network:
    """Links shared max-min fairly by concurrent flows, driven by a SimPy environment.

    Capacities are `topology.link_nccl_Bps`: the per-link rates NCCL achieves (NVLink
    20.6 GB/s x 18 links on H100, 48 GB/s per NDR NIC), so one collective alone moves at
    the rate NCCL's tuner plans with.

    Only transfers that share links are solved together: a transfer whose links no other
    transfer uses runs on its cached idle-link schedule (one timer, no solver), and when a
    transfer starts or a flow ends, rates are recomputed for the connected component of
    transfers around it only. Most collectives of a training step (TP inside a node, DP
    on its own rail) never meet another transfer, so the solver runs only where transfers
    really overlap on links.
    """

    def __init__(self, env: simpy.Environment, topology,
                 cache: "ShapeCache | None" = None) -> None:
        self.env = env
        self.capacity = np.asarray(topology.link_nccl_Bps, dtype=float)
        # link id -> how many active transfers use it (no zero entries): whether a new
        # transfer starts alone on idle links, without an array scan per transfer.
        self._link_users: dict[int, int] = {}
        self._active: dict[int, _Transfer] = {}                       # seq -> transfer
        cache = cache or ShapeCache()
        self._shapes, self._shapes_by_id, self._rates = cache.shapes, cache.by_id, cache.rates
        self._seq = 0

    @property
    def active_flows(self) -> int:
        """Number of flows in progress."""
        return sum(int((t.left > 0).sum()) for t in self._active.values())

    def transfer(self, flows: Sequence[Flow],
                 weights: Sequence[Mapping[int, float] | None] | None = None) -> simpy.Event:
        """Start `flows` now; the returned event fires when all of them have finished.

        `weights[i]`, if given, maps link id -> multiplicity of flow i on that link
        (1 where absent): the flow stands for that many identical flows on the link.
        A tuple `flows` (of tuple routes) and a tuple `weights` are cached by identity:
        the caller must not mutate the mappings in a `weights` tuple afterwards.
        """
        done = self.env.event()
        shape = self._shape(flows, weights)
        if shape is None:
            done.succeed()
            return done
        self._seq += 1
        transfer = _Transfer(self._seq, shape, done, self.env.now)
        users = self._link_users
        isolated = not any(l in users for l in shape.link_ids)
        for l in shape.link_ids:
            users[l] = users.get(l, 0) + 1
        self._active[transfer.seq] = transfer
        if isolated:
            transfer.isolated_since = self.env.now
            self._schedule(transfer, shape.phases[-1][0])
        else:
            self._resolve(self._component([transfer]))
        return done

    # -- internals --------------------------------------------------------------------
    def _shape(self, flows, weights) -> _Shape | None:
        # Tuples cannot change, so the same objects give the same shape without hashing
        # every route again (CommModel passes its cached plans' flows and twin weights).
        by_id = type(flows) is tuple and (weights is None or type(weights) is tuple)
        if by_id:
            hit = self._shapes_by_id.get((id(flows), id(weights)))
            if hit is not None:
                return hit[2]
        shape = self._shape_by_content(flows, weights)
        if by_id:
            self._shapes_by_id[(id(flows), id(weights))] = (flows, weights, shape)
        return shape

    def _shape_by_content(self, flows, weights) -> _Shape | None:
        wkey = None if weights is None else tuple(
            None if w is None else tuple(sorted(w.items())) for w in weights)
        key = (tuple(flows), wkey)
        shape = self._shapes.get(key)
        if shape is None and key not in self._shapes:
            routes, mults, sizes = [], [], []
            for i, (route, size) in enumerate(flows):
                if not route or size <= 0:
                    continue
                r = np.asarray(route, dtype=np.int64)
                w = weights[i] if weights is not None else None
                routes.append(r)
                mults.append(np.array([w.get(int(l), 1.0) for l in r]) if w else np.ones(len(r)))
                sizes.append(float(size))
            shape = (_Shape(len(self._shapes), routes, mults, sizes, self.capacity)
                     if routes else None)
            self._shapes[key] = shape
        return shape

    def _component(self, seeds) -> list[_Transfer]:
        """Active transfers connected to `seeds` through shared links, in start order."""
        # a set of link ids: a transfer crosses a handful of links, and testing those one
        # by one costs less than a NumPy mask look-up per active transfer (this search on
        # Google's 405B row at 28 micro-batches a stage: 8.6 -> 2.9 s, benchmarks/README.md)
        linked: set[int] = set()
        members = {t.seq: t for t in seeds}
        for t in seeds:
            linked.update(t.shape.link_ids)
        grew = True
        while grew:
            grew = False
            for seq, t in self._active.items():
                if seq not in members and not linked.isdisjoint(t.shape.link_ids):
                    members[seq] = t
                    linked.update(t.shape.link_ids)
                    grew = True
        return [members[s] for s in sorted(members)]

    def _advance(self, t: _Transfer) -> None:
        """Bring a transfer's bytes left to env.now at its current rates."""
        now = self.env.now
        if t.isolated_since is not None:
            t.left, t.rates = t.shape.state_at(now - t.isolated_since)
            t.isolated_since = None
        elif now > t.last:
            t.left = np.maximum(t.left - t.rates * (now - t.last), 0.0)
        t.last = now

    def _resolve(self, component: list[_Transfer]) -> None:
        """Recompute max-min rates of a component and schedule each transfer's next event."""
        for t in component:
            self._advance(t)
        masks = [t.left > 0 for t in component]
        key = tuple((t.shape.id, m.tobytes()) for t, m in zip(component, masks))
        solved = self._rates.get(key)
        if solved is None:
            solved = self._rates[key] = self._solve(component, masks)
        for t, (idx, rates) in zip(component, solved):
            t.rates = rates     # shared with the cache: rate arrays are never written to
            if len(idx):
                self._schedule(t, float((t.left[idx] / rates[idx]).min()))

    def _solve(self, component: list[_Transfer], masks: list[np.ndarray]) -> list[tuple]:
        """[(indices of live flows, rate of every flow), ...] per transfer of a component."""
        live = [(t, np.flatnonzero(m)) for t, m in zip(component, masks)]
        routes = [t.shape.routes[i] for t, idx in live for i in idx]
        mults = [t.shape.mults[i] for t, idx in live for i in idx]
        rates = _FlowSet(routes, mults, self.capacity).rates() if routes else np.zeros(0)
        solved, offset = [], 0
        for t, idx in live:
            full = np.zeros(len(t.left))
            full[idx] = rates[offset:offset + len(idx)]
            offset += len(idx)
            solved.append((idx, full))
        return solved

    def _schedule(self, t: _Transfer, delay: float) -> None:
        t.generation += 1
        generation = t.generation
        timer = self.env.timeout(max(delay, 0.0))
        timer.callbacks.append(lambda _ev: self._on_timer(t, generation))

    def _on_timer(self, t: _Transfer, generation: int) -> None:
        if generation != t.generation:
            return  # superseded by a later recomputation
        neighbours = self._component([t])
        self._advance(t)
        # A flow is done when what is left would take under ~1 ns, or under what the
        # simulated clock can still resolve (otherwise its timer would fire at the same
        # instant forever).
        resolution_s = max(1e-9, 4 * np.spacing(self.env.now))
        t.left[t.left <= t.rates * resolution_s + 1e-6] = 0.0
        if (t.left > 0).any():
            if len(neighbours) == 1:
                self._resolve([t])
            else:
                self._resolve(neighbours)
            return
        users = self._link_users
        for l in t.shape.link_ids:
            if users[l] == 1:
                del users[l]
            else:
                users[l] -= 1
        del self._active[t.seq]
        t.generation += 1
        t.done.succeed()
        rest = [n for n in neighbours if n is not t]
        while rest:
            component = self._component([rest[0]])
            self._resolve(component)
            seqs = {c.seq for c in component}
            rest = [n for n in rest if n.seq not in seqs]
