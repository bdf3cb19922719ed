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
    left = np.array([b for _, b in live])
    ones = [np.ones(len(r)) for r in routes]
    clock = 0.0
    while len(routes):
        rates = _FlowSet(routes, ones, capacity).rates()
        finish = left / rates
        dt = finish.min()
        clock += dt
        left = left - rates * dt
        keep = finish > dt * (1 + _REL_TOL)
        routes = [r for r, k in zip(routes, keep) if k]
        ones = [o for o, k in zip(ones, keep) if k]
        left = left[keep]
    return clock


class Network:
    """Links shared max-min fairly by concurrent flows, driven by a SimPy environment.

    Capacities are `topology.link_nccl_Bps`: the per-link rates NCCL achieves (NVLink
    20.6 GB/s x 18 links on H100, 48 GB/s per NDR NIC), so one collective alone moves at
    the rate NCCL's tuner plans with.
    """

    def __init__(self, env: simpy.Environment, topology) -> None:
        self.env = env
        self.capacity = np.asarray(topology.link_nccl_Bps, dtype=float)
        self._routes: list[np.ndarray] = []
        self._mults: list[np.ndarray] = []
        self._left = np.zeros(0)
        self._rates = np.zeros(0)
        self._owner: list[list] = []     # per flow: [event, flows still running]
        self._last = env.now
        self._generation = 0

    @property
    def active_flows(self) -> int:
        """Number of flows in progress."""
        return len(self._routes)

    def transfer(self, flows: Sequence[Flow],
                 weights: Sequence[Mapping[int, float] | None] | None = None) -> simpy.Event:
        """Start `flows` now; the returned event fires when all of them have finished.

        `weights[i]`, if given, maps link id -> multiplicity of flow i on that link
        (1 where absent): the flow stands for that many identical flows on the link.
        """
        done = self.env.event()
        new_routes, new_mults, new_left = [], [], []
        for i, (route, size) in enumerate(flows):
            if not route or size <= 0:
                continue
            r = np.asarray(route, dtype=np.int64)
            w = weights[i] if weights is not None else None
            m = np.array([w.get(int(l), 1.0) for l in r]) if w else np.ones(len(r))
            new_routes.append(r)
            new_mults.append(m)
            new_left.append(float(size))
        if not new_routes:
            done.succeed()
            return done
        self._advance()
        owner = [done, len(new_routes)]
        self._routes += new_routes
        self._mults += new_mults
        self._owner += [owner] * len(new_routes)
        self._left = np.concatenate([self._left, new_left])
        self._reschedule()
        return done

    # -- internals --------------------------------------------------------------------
    def _advance(self) -> None:
        """Move every flow forward to `env.now` at its current rate."""
        dt = self.env.now - self._last
        if dt > 0 and len(self._left):
            self._left = self._left - self._rates * dt
        self._last = self.env.now

    def _reschedule(self) -> None:
        self._generation += 1
        if not self._routes:
            self._rates = np.zeros(0)
            return
        self._rates = _FlowSet(self._routes, self._mults, self.capacity).rates()
        dt = float((np.maximum(self._left, 0.0) / self._rates).min())
        generation = self._generation
        timer = self.env.timeout(dt)
        timer.callbacks.append(lambda _ev: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by a later start or finish
        self._advance()
        # A flow is done when what is left would take under ~1 ns (float slack).
        finished = self._left <= self._rates * 1e-9 + 1e-6
        if not finished.any():
            finished = self._left <= self._left.min()
        keep = ~finished
        for i in np.flatnonzero(finished):
            owner = self._owner[i]
            owner[1] -= 1
            if owner[1] == 0:
                owner[0].succeed()
        self._routes = [r for r, k in zip(self._routes, keep) if k]
        self._mults = [m for m, k in zip(self._mults, keep) if k]
        self._owner = [o for o, k in zip(self._owner, keep) if k]
        self._left = self._left[keep]
        self._reschedule()
