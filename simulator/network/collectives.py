"""Closed-form collective model: NCCL's tuner over algorithms and protocols, on links.

time(op, group, S) = latency(algorithm, protocol) + transfer time of the algorithm's flows
on idle links, where flow bytes include the protocol's wire overhead. The latency part is
NCCL's tuning.cc model; the transfer part replaces NCCL's per-channel bandwidth tables by
the topology's links (rates NCCL achieves per link: `topology.link_nccl_Bps`), so
non-aligned groups, odd fabrics and what-if link changes need no new tables. Like
`ncclTopoGetAlgoTime`, the tuner takes the fastest (algorithm, protocol).
"""
from __future__ import annotations

from dataclasses import dataclass

from .algorithms import GroupShape, Template, available, build_template, group_shape
from .constants import (LATENCY_INTER_S, NET_OVERHEAD_S, RING_EFFICIENCY,
                        RING_PLATEAU_FACTOR, TREE_EFFICIENCY, TREE_LL128_ONE_NODE_EFFICIENCY,
                        base_latency_s, bus_factor, hw_latency_s, ll_max_bw_Bps,
                        tree_correction)
from .fluid import Flow

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
       "send_recv")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical")
# NVLS and NVLS_Tree run Simple only [tuning.cc]. NCCL's p2p path
# uses LL below NCCL_P2P_LL_THRESHOLD and Simple above (no LL128).
_PROTOCOLS = {"nvls": ("Simple",), "nvls_tree": ("Simple",), "p2p": ("LL", "Simple")}
_ALL_PROTOCOLS = ("LL", "LL128", "Simple")
# Algorithms the tuner may pick by itself; "hierarchical" only when forced (not NCCL's).
_AUTO = ("ring", "tree", "nvls", "nvls_tree", "p2p")


@dataclass(frozen=True)
class CommOptions:
    """Knobs of the communication model.

    algorithm / protocol force NCCL's choice (like NCCL_ALGO / NCCL_PROTO); a forced value
    the collective cannot use is ignored for that collective (e.g. "tree" for an
    all-gather). flow_sharing=False skips the network model: each collective takes its
    closed-form time whatever else is running.
    """

    algorithm: str | None = None
    protocol: str | None = None
    flow_sharing: bool = True


@dataclass(frozen=True)
class CollectivePlan:
    """How one collective runs: algorithm, protocol, latency and flows on links."""

    op: str
    algorithm: str
    protocol: str
    latency_s: float
    flows: tuple[Flow, ...]     # (route link ids, wire bytes incl. protocol overhead)
    closed_form_s: float        # latency_s + transfer time on idle links
    uses_sms: bool              # False for in-switch reduction (NVLS): little SM work
    nvls: bool

    @property
    def transfer_s(self) -> float:
        """Transfer part of the closed form (idle links)."""
        return self.closed_form_s - self.latency_s


def _log2i(x: int) -> int:
    return max(int(x).bit_length() - 1, 0)


class CollectiveModel:
    """Plans collectives on a topology; plans and templates are cached."""

    def __init__(self, topology, options: CommOptions = CommOptions()) -> None:
        for value, allowed in ((options.algorithm, ALGORITHMS), (options.protocol, _ALL_PROTOCOLS)):
            if value is not None and value not in allowed:
                raise ValueError(f"unknown {value!r}; expected one of {', '.join(allowed)}")
        self.topology = topology
        self.options = options
        self._plans: dict = {}
        self._templates: dict = {}
        self._shapes: dict = {}

    # -- public -----------------------------------------------------------------------
    def plan(self, op: str, ranks: tuple[int, ...], size_bytes: float) -> CollectivePlan:
        """The plan NCCL would run for `op` of `size_bytes` on `ranks` (cached)."""
        key = (op, ranks, size_bytes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 1_000_000:
                self._plans.clear()
            plan = self._plans[key] = self._plan(op, tuple(ranks), float(size_bytes))
        return plan

    def time_s(self, op: str, ranks: tuple[int, ...], size_bytes: float) -> float:
        """Closed-form time of the collective on idle links."""
        return self.plan(op, ranks, size_bytes).closed_form_s

    def shape(self, ranks: tuple[int, ...]) -> GroupShape:
        """Per-domain layout of a group (cached)."""
        s = self._shapes.get(ranks)
        if s is None:
            s = self._shapes[ranks] = group_shape(self.topology, ranks)
        return s

    def template(self, op: str, ranks: tuple[int, ...], algorithm: str) -> Template:
        """Size-independent flows of (op, group, algorithm) (cached)."""
        key = (op, ranks, algorithm)
        t = self._templates.get(key)
        if t is None:
            t = self._templates[key] = build_template(self.topology, self.shape(ranks), op,
                                                      algorithm)
        return t

    def algorithms(self, op: str, ranks: tuple[int, ...]) -> tuple[str, ...]:
        """Algorithms the tuner considers for (op, group), honouring a forced one."""
        avail = available(self.topology, self.shape(ranks), op)
        forced = self.options.algorithm
        if forced == "nvls" and "nvls" not in avail and "nvls_tree" in avail:
            forced = "nvls_tree"   # NVLS across domains is NVLS_Tree in NCCL
        if forced in avail:
            return (forced,)
        return tuple(a for a in avail if a in _AUTO)

    # -- internals --------------------------------------------------------------------
    def _plan(self, op: str, ranks: tuple[int, ...], size: float) -> CollectivePlan:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
        if op == "send_recv" and len(ranks) != 2:
            raise ValueError(f"send_recv needs ranks=(src, dst), got {ranks}")
        n = len(set(ranks))
        if n <= 1 or size <= 0:
            return CollectivePlan(op, "none", "none", 0.0, (), 0.0, False, False)
        measured = self.topology.measured.get(op, {}).get(n)
        if measured is not None:
            algbw = measured.busbw_Bps / bus_factor(op, n)
            return CollectivePlan(op, "measured", "measured", measured.latency_s, (),
                                  measured.time_s(size, algbw), True, False)
        shape = self.shape(ranks)
        best = None
        for algo in self.algorithms(op, ranks):
            template = self.template(op, ranks, algo)
            for proto in self._protocols(algo):
                eff = self._efficiency(shape, op, algo, proto, size, template)
                lat = self._latency_s(shape, op, algo, proto, size)
                t = lat + template.unit_time_s * size / eff
                if best is None or t < best[0]:
                    best = (t, lat, algo, proto, eff, template)
        t, lat, algo, proto, eff, template = best
        flows = tuple((route, w * size / eff) for route, w in template.flows)
        is_nvls = algo in ("nvls", "nvls_tree")
        return CollectivePlan(op, algo, proto, lat, flows, t, not is_nvls, is_nvls)

    def _protocols(self, algo: str) -> tuple[str, ...]:
        protos = _PROTOCOLS.get(algo, _ALL_PROTOCOLS)
        forced = self.options.protocol
        return (forced,) if forced in protos else protos

    def _efficiency(self, shape: GroupShape, op: str, algo: str, proto: str, size: float,
                    template: Template) -> float:
        """Payload fraction of wire bytes for (algorithm, protocol) at this size.

        NCCL's llMaxBw cap on LL bus bandwidth becomes a lower payload fraction, so the
        flows carry it too: eff = min(LL factor, llMaxBw / link-limited busBw).
        """
        if algo in ("nvls", "nvls_tree"):
            return 1.0  # nvlsEfficiency is in the template's flows
        if algo == "tree":
            eff = TREE_EFFICIENCY[proto]
            if proto == "LL128" and shape.num_domains == 1:
                eff = TREE_LL128_ONE_NODE_EFFICIENCY
            eff *= tree_correction(proto, size)
            link_busbw = 2.0 / template.unit_time_s   # Tree: busBw = 2 x algBw (NCCL)
        else:
            eff = RING_EFFICIENCY[proto]
            link_busbw = bus_factor(op, shape.n) / template.unit_time_s
        if proto == "LL" and algo != "p2p" and template.unit_time_s > 0:
            device = self.topology.devices[shape.ranks[0]].name
            eff = min(eff, ll_max_bw_Bps(device, shape.num_domains) / link_busbw)
        return eff

    @staticmethod
    def _latency_s(shape: GroupShape, op: str, algo: str, proto: str, size: float) -> float:
        """NCCL tuning.cc latency of (algorithm, protocol) on this group (references 1.3)."""
        n, nodes, ppn = shape.n, shape.num_domains, shape.ppn
        multi = nodes > 1
        lat_algo = "ring" if algo in ("p2p", "hierarchical") else algo
        base = base_latency_s(lat_algo, proto)
        intra = hw_latency_s("nvlink", lat_algo, proto)
        # NCCL: with one GPU per node the network step costs Tree's NET latency.
        inter = hw_latency_s("net", "tree" if ppn == 1 and lat_algo == "ring" else lat_algo,
                             proto)
        inter += LATENCY_INTER_S * (2 if proto == "Simple" else 1)
        net_oh = NET_OVERHEAD_S * (3 if proto == "Simple" else 1) if multi else 0.0
        step = max(intra, net_oh)
        if algo == "nvls":
            return intra
        if algo == "nvls_tree":
            return base + intra + 2 * _log2i(nodes) * inter
        if algo == "tree":
            return base + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
        if algo == "hierarchical":   # assumption: RS + AG ring steps inside, AR ring across
            return base + 2 * (ppn - 1) * step + 2 * (nodes - 1) * inter
        if op == "send_recv":        # assumption: one ring step (NCCL has no p2p model)
            return base + (inter if multi else intra)
        if op == "all_reduce":
            nsteps, n_inter = 2 * (n - 1), 2 * (nodes - 1)
        elif op in ("all_gather", "reduce_scatter", "all_to_all"):
            # all-to-all: assumption, priced like a ring all-gather (NCCL has no model)
            nsteps, n_inter = n - 1, nodes - 1
        else:
            nsteps, n_inter = n, nodes - 1
        lat = base + (nsteps - n_inter) * step + n_inter * inter
        if (op == "all_reduce" and proto == "Simple" and multi
                and size / (max(shape.channels, 1) * n) >= 64):
            lat *= RING_PLATEAU_FACTOR
        return lat
