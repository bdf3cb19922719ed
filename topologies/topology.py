"""The Topology type: a directed networkx graph of GPUs, switches and NICs, plus queries.

Every directed edge is one link direction with a raw line rate (`bandwidth`, bytes/s),
the rate NCCL's tuner plans with on it (`nccl_bandwidth`, bytes/s), a one-way
latency (`latency`, s) and a `kind` (nvlink, pcie, ib). Links are also numbered so that
the network model can keep per-link state in numpy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Sequence

import networkx as nx
import numpy as np

from .errors import TopologyError
from .specs import DeviceSpec
from .transport import NetTransport

SPINE = "spine"


def gpu_node(rank: int) -> str:
    """Graph node name of a GPU."""
    return f"gpu{rank}"


def nvswitch_node(domain: int) -> str:
    """Graph node of a domain's NVSwitch fabric (one non-blocking logical switch)."""
    return f"nvsw{domain}"


def nic_node(domain: int, rail: int) -> str:
    """Graph node of NIC `rail` of a domain."""
    return f"nic{domain}.{rail}"


def leaf_node(group: int, rail: int) -> str:
    """Graph node of the rail-`rail` leaf switch of a group of domains."""
    return f"leaf{group}.{rail}"


# The collectives a topology may carry measurements of and the network model prices
# (simulator/network/collectives.py): NCCL's collectives and a point-to-point transfer.
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                  "reduce", "send_recv")


@dataclass(frozen=True)
class MeasuredCollective:
    """A calibrated collective: time = latency_s + bytes / algbw, busbw = algbw * factor.

    Written by `python -m validation calibrate` for hosts (CPU gloo groups) where no
    link-level model exists; when present it replaces the NCCL model for that group size.
    `points` ((bytes, seconds), ascending) are the measurements themselves: within their
    range the time is interpolated between them, so that a host whose collectives are not
    linear in size (page faults, cache sizes) is priced as measured.
    """

    latency_s: float
    busbw_Bps: float
    points: tuple[tuple[float, float], ...] = ()

    def time_s(self, size: float, algbw_Bps: float) -> float:
        """Seconds for a collective of `size` bytes (nccl-tests size)."""
        pts = self.points
        if len(pts) < 2 or not pts[0][0] <= size <= pts[-1][0]:
            return self.latency_s + size / algbw_Bps
        for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
            if size <= s1:
                return t0 + (t1 - t0) * (size - s0) / (s1 - s0)
        return pts[-1][1]


@dataclass
class Topology:
    """A cluster: GPUs in rank order, NVLink domains, and the network between them."""

    name: str
    graph: nx.DiGraph
    gpus: list[str]                 # graph node of each rank
    devices: list[DeviceSpec]       # device of each rank (heterogeneous clusters allowed)
    domain_size: int                # GPUs per NVLink domain (8 for DGX, 72 for NVL72)
    nic_Bps: float                  # per NIC per direction, raw (0 when single-domain)
    nic_nccl_Bps: float             # per NIC per direction NCCL achieves
    rails: int = 1                  # NICs per domain; rail r = NIC r of every domain
    domains_per_leaf: int = 1       # domains whose rail-r NICs share one leaf switch
    description: str = ""
    # Whether the scale-out switches reduce in the network (InfiniBand SHARP, NCCL CollNet).
    collnet: bool = False
    # Extra latency per network step the net plugin reports (NCCL graph->latencyInter).
    net_latency_s: float = 0.0
    # NCCL environment, tuner rules and per-message cost of the net transport (also
    # inside one domain: the environment applies to every communicator).
    transport: NetTransport = field(default_factory=NetTransport)
    # op name -> {group size -> MeasuredCollective}; empty for modelled hardware.
    measured: Mapping[str, Mapping[int, MeasuredCollective]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        edges = sorted(self.graph.edges)  # sorted: link ids independent of build order
        self.edge_id = {e: i for i, e in enumerate(edges)}
        data = [self.graph.edges[e] for e in edges]
        self.link_names = [f"{u}->{v}" for u, v in edges]
        self.link_bandwidth_Bps = np.array([d["bandwidth"] for d in data], dtype=float)
        self.link_nccl_Bps = np.array([d.get("nccl_bandwidth", d["bandwidth"]) for d in data])
        self.link_latency_s = np.array([d["latency"] for d in data], dtype=float)
        self.link_kind = [d["kind"] for d in data]
        self._route = lru_cache(maxsize=1 << 20)(self._compute_route)

    # -- sizes ---------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of GPUs (ranks)."""
        return len(self.gpus)

    @property
    def num_domains(self) -> int:
        """Number of NVLink domains (DGX nodes, NVL72 racks)."""
        return self.world_size // self.domain_size

    def device(self, rank: int) -> DeviceSpec:
        """Device spec of one rank."""
        return self.devices[rank]

    def domain_of(self, rank: int) -> int:
        """NVLink domain index of a rank (ranks are numbered domain by domain)."""
        return rank // self.domain_size

    def local_index(self, rank: int) -> int:
        """Position of a rank inside its NVLink domain (its rail)."""
        return rank % self.domain_size

    def same_domain(self, ranks: Sequence[int]) -> bool:
        """Whether all ranks share one NVLink domain."""
        return len({self.domain_of(r) for r in ranks}) == 1

    # -- routing -------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids a transfer from rank `src` to rank `dst` crosses, in order.

        Inside a domain: GPU -> NVSwitch -> GPU. Across domains, NCCL's PXN is
        assumed (on by default since NCCL 2.12): data first moves over NVLink to the
        sender-node GPU on the destination's rail, then leaves through that GPU's NIC,
        so traffic stays on one rail of the rail-optimised fabric. Links removed by a
        fault (topologies.faults) are avoided: cross-domain traffic takes the next rail
        whose links all work; TopologyError when no path is left.
        """
        return self._route(src, dst)

    def _compute_route(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        ds, dd = self.domain_of(src), self.domain_of(dst)
        if ds == dd:
            return self._edges([gpu_node(src), nvswitch_node(ds), gpu_node(dst)], src, dst)
        # The destination's rail first; when a failed link (topologies.faults) cuts it,
        # the other rails in order: PXN relays over NVLink to that rail's GPU and NIC.
        preferred = self.local_index(dst) % self.rails
        for k in range(self.rails):
            nodes = self._cross_domain_nodes(src, dst, (preferred + k) % self.rails)
            if all(self.graph.has_edge(u, v) for u, v in zip(nodes, nodes[1:])):
                return self._edges(nodes, src, dst)
        raise TopologyError("route", f"gpu{src}->gpu{dst}",
                            "a path of working links (every rail between the two NVLink "
                            "domains has a failed link: the job cannot run)")

    def _cross_domain_nodes(self, src: int, dst: int, rail: int) -> list[str]:
        """Graph nodes of the PXN path from `src` to `dst` (other domain) on one rail."""
        ds, dd = self.domain_of(src), self.domain_of(dst)
        relay = ds * self.domain_size + rail
        nodes = [gpu_node(src), nvswitch_node(ds)] if relay != src else []
        gs, gd = ds // self.domains_per_leaf, dd // self.domains_per_leaf
        nodes += [gpu_node(relay), nic_node(ds, rail), leaf_node(gs, rail)]
        if gs != gd:
            nodes += [SPINE, leaf_node(gd, rail)]
        landing = dd * self.domain_size + rail
        nodes += [nic_node(dd, rail), gpu_node(landing)]
        if landing != dst:
            nodes += [nvswitch_node(dd), gpu_node(dst)]
        return nodes

    def _edges(self, nodes: list[str], src: int, dst: int) -> tuple[int, ...]:
        try:
            return tuple(self.edge_id[(u, v)] for u, v in zip(nodes, nodes[1:]))
        except KeyError as exc:
            raise TopologyError("route", f"gpu{src}->gpu{dst}",
                                f"a path of working links (link {exc.args[0][0]}->"
                                f"{exc.args[0][1]} is down: the job cannot run)") from None

    def path_bandwidth_Bps(self, src: int, dst: int, nccl: bool = True) -> float:
        """Bottleneck bandwidth of the route between two ranks."""
        links = self.route(src, dst)
        if not links:
            return float("inf")
        caps = self.link_nccl_Bps if nccl else self.link_bandwidth_Bps
        return float(caps[list(links)].min())

    def path_latency_s(self, src: int, dst: int) -> float:
        """Sum of link latencies along the route between two ranks."""
        return float(self.link_latency_s[list(self.route(src, dst))].sum())

    def describe(self) -> dict:
        """A JSON-able description: GPUs, domains, devices and link classes."""
        kinds: dict[str, dict] = {}
        for i, kind in enumerate(self.link_kind):
            entry = kinds.setdefault(kind, {"links": 0, "bandwidth_GBps": set(),
                                            "nccl_bandwidth_GBps": set()})
            entry["links"] += 1
            entry["bandwidth_GBps"].add(round(self.link_bandwidth_Bps[i] / 1e9, 3))
            entry["nccl_bandwidth_GBps"].add(round(self.link_nccl_Bps[i] / 1e9, 3))
        for entry in kinds.values():
            entry["bandwidth_GBps"] = sorted(entry["bandwidth_GBps"])
            entry["nccl_bandwidth_GBps"] = sorted(entry["nccl_bandwidth_GBps"])
        devices = sorted({d.name for d in self.devices})
        return {
            "name": self.name, "description": self.description,
            "gpus": self.world_size, "domains": self.num_domains,
            "gpus_per_domain": self.domain_size, "devices": devices,
            "nvls": all(d.nvls for d in self.devices), "collnet": self.collnet,
            "links": {k: kinds[k] for k in sorted(kinds)},
        }
