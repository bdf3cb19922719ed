"""Faults and heterogeneity applied to a built Topology: pure functions, new Topology out.

Fault strings (the CLI's `--fault`, also `parse_fault` for the API):

  straggler:gpu=5,slowdown=1.2     rank 5's peak FLOP/s and HBM bandwidth divided by 1.2
  link-down:nic=node1/3            NIC 3 of NVLink domain 1 fails (its PCIe and IB links
                                   vanish); cross-domain traffic takes another rail via
                                   NVLink PXN, or the job cannot run (TopologyError)
  link-down:link=gpu3->nvsw0       one link by name (both directions); NVLink: the GPU
                                   leaves its domain, so the job cannot run
  degraded:link=ib,factor=0.5      bandwidth x0.5 on matching links: a link class (nvlink,
                                   pcie, ib), a node (every link touching nic1.3), or a
                                   link name (gpu3->nvsw0, one direction)
  gpu:ranks=4-7,type=h200          mixed GPU types: those ranks become H200s (their NVLink
                                   links take the new GPU's rate)

A fault breaks the symmetry of the ranks it touches: the simulator splits its rank
classes around them (SimOptions(fault_classes=True), what `run --fault` and
`whatif --fault` do) or, with `--full`, simulates every rank (SimOptions(full=True)).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Iterable

import networkx as nx

from inputs import decimal

from .errors import TopologyError
from .specs import DeviceSpec, device
from .topology import Topology, gpu_node, nic_node, nvswitch_node

KINDS = ("straggler", "link-down", "degraded", "gpu")
LINK_CLASSES = ("nvlink", "pcie", "ib")
FAULT_SYNTAX = ("straggler:gpu=R,slowdown=F | link-down:nic=nodeD/R | link-down:link=NAME | "
           "degraded:link=NAME|NODE|CLASS,factor=F | gpu:ranks=A-B,type=NAME")


# The arguments each kind takes; any other (`foo=3`) is an error, not ignored.
FAULT_KEYS = {"straggler": ("gpu", "slowdown"), "link-down": ("nic", "link"),
              "degraded": ("link", "factor"), "gpu": ("ranks", "type")}


@dataclass(frozen=True)
class Fault:
    """One parsed fault: its kind and its key=value arguments (as strings)."""

    kind: str
    args: tuple[tuple[str, str], ...]
    text: str

    def get(self, key: str) -> str:
        """A required argument."""
        for k, v in self.args:
            if k == key:
                return v
        raise TopologyError(f"fault {self.text}", None, f"a {key}= argument ({FAULT_SYNTAX})")


def parse_fault(text: str) -> Fault:
    """`kind:key=value,key=value` -> Fault (TopologyError on bad syntax)."""
    kind, _, rest = text.partition(":")
    if kind not in KINDS or not rest:
        raise TopologyError("fault", text, FAULT_SYNTAX)
    args: list[tuple[str, str]] = []
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise TopologyError("fault", text, FAULT_SYNTAX)
        if key not in FAULT_KEYS[kind] or key in dict(args):
            raise TopologyError(f"fault {text}: {key}", value,
                                f"each of {', '.join(FAULT_KEYS[kind])} at most once")
        args.append((key, value))
    fault = Fault(kind, tuple(args), text)
    # Numbers are checked here, before any point runs: a bad value is a bad flag.
    for key in {"straggler": ("slowdown",), "degraded": ("factor",)}.get(kind, ()):
        _number(fault, key)
    return fault


# A factor or slowdown outside this range is a typo, not a what-if: it would also push
# transfer times past what floating point resolves over a simulated step.
FACTOR_RANGE = (1e-3, 1e3)


def _number(fault: Fault, key: str) -> float:
    raw = fault.get(key)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    low, high = FACTOR_RANGE
    if not low <= value <= high:
        raise TopologyError(f"fault {fault.text}: {key}", raw, f"a number in [{low:g}, {high:g}]")
    return value


def _rank(topo: Topology, fault: Fault, raw: str) -> int:
    rank = decimal(raw, 9)
    if rank is None or rank >= topo.world_size:
        raise TopologyError(f"fault {fault.text}: gpu", raw,
                            f"a rank 0..{topo.world_size - 1} of {topo.name}")
    return rank


def _with_graph(topo: Topology, graph: nx.DiGraph, devices: list[DeviceSpec] | None = None,
                note: str = "") -> Topology:
    """A new Topology over another graph (link arrays rebuilt by __post_init__)."""
    return replace(topo, graph=graph, devices=list(devices or topo.devices),
                   name=topo.name, description=(topo.description + note).strip())


# ---------------------------------------------------------------------------- faults
def slow_device(spec: DeviceSpec, slowdown: float) -> DeviceSpec:
    """A device whose peak FLOP/s (every dtype) and HBM bandwidth are divided by slowdown.

    The name is kept: the collective model looks up NCCL constants by device name.
    """
    peaks = MappingProxyType({k: v / slowdown for k, v in spec.peak_flops.items()})
    return replace(spec, peak_flops=peaks, hbm_Bps=spec.hbm_Bps / slowdown)


def straggler(topo: Topology, rank: int, slowdown: float) -> Topology:
    """Rank `rank` runs `slowdown` times slower (compute and HBM)."""
    devices = list(topo.devices)
    devices[rank] = slow_device(devices[rank], slowdown)
    return _with_graph(topo, topo.graph, devices, f"; gpu{rank} slowed x{slowdown:g}")


def _check_reachable(topo: Topology, graph: nx.DiGraph, what: str) -> None:
    """TopologyError if some pair of NVLink domains has no rail with both NICs working."""
    if topo.num_domains <= 1:
        return
    alive = []
    for d in range(topo.num_domains):
        rails = {r for r in range(topo.rails)
                 if graph.has_edge(gpu_node(d * topo.domain_size + r), nic_node(d, r))
                 and graph.has_edge(nic_node(d, r), gpu_node(d * topo.domain_size + r))
                 and any(graph.has_edge(nic_node(d, r), v) for v in graph.successors(nic_node(d, r))
                         if not v.startswith("gpu"))}
        if not rails:
            raise TopologyError("fault", what, f"a fault that leaves NVLink domain {d} a "
                                "working NIC (none left: the job cannot run)")
        alive.append(rails)
    for a in range(len(alive)):
        for b in range(a + 1, len(alive)):
            if not alive[a] & alive[b]:
                raise TopologyError("fault", what, f"domains {a} and {b} sharing a working "
                                    "rail (none left: the job cannot run)")


def link_down(topo: Topology, links: Iterable[tuple[str, str]], what: str) -> Topology:
    """Remove links (both directions); routing then avoids them."""
    graph = topo.graph.copy()
    removed = 0
    for u, v in links:
        for a, b in ((u, v), (v, u)):
            if graph.has_edge(a, b):
                if graph.edges[a, b]["kind"] == "nvlink":
                    raise TopologyError("fault", what, "a link that is not the only NVLink of "
                                        f"a GPU ({a}->{b} is: the GPU leaves its domain, "
                                        "the job cannot run)")
                graph.remove_edge(a, b)
                removed += 1
    if not removed:
        raise TopologyError("fault", what, f"a link of {topo.name} (none matched)")
    _check_reachable(topo, graph, what)
    return _with_graph(topo, graph, note=f"; {what}")


def nic_down(topo: Topology, domain: int, rail: int) -> Topology:
    """NIC `rail` of NVLink domain `domain` fails: its PCIe and network links go."""
    nic = nic_node(domain, rail)
    if nic not in topo.graph:
        raise TopologyError("fault link-down: nic", f"node{domain}/{rail}",
                            f"a NIC of {topo.name} (nodes 0..{topo.num_domains - 1}, NICs "
                            f"0..{topo.rails - 1}; single-domain topologies have none)")
    links = [(nic, v) for v in topo.graph.successors(nic)]
    return link_down(topo, links, f"link-down:nic=node{domain}/{rail}")


def _matches(u: str, v: str, kind: str, pattern: str) -> bool:
    return pattern in (kind, f"{u}->{v}", u, v)


def degrade(topo: Topology, pattern: str, factor: float) -> Topology:
    """Scale the bandwidth (raw and NCCL) of links matching a class, node or link name."""
    graph = topo.graph.copy()
    hits = 0
    for u, v, data in graph.edges(data=True):
        if _matches(u, v, data["kind"], pattern):
            raw = data["bandwidth"]
            data["bandwidth"] = raw * factor
            data["nccl_bandwidth"] = data.get("nccl_bandwidth", raw) * factor
            hits += 1
    if not hits:
        raise TopologyError("fault degraded: link", pattern,
                            f"a link class ({', '.join(LINK_CLASSES)}), a node (nic1.3, "
                            "gpu5) or a link name (gpu3->nvsw0) of " + topo.name)
    return _with_graph(topo, graph, note=f"; {pattern} links x{factor:g}")


def _ranks(topo: Topology, fault: Fault) -> list[int]:
    raw = fault.get("ranks")
    m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?", raw, re.ASCII)
    if not m or int(m[2] or m[1]) >= topo.world_size or int(m[1]) > int(m[2] or m[1]):
        raise TopologyError(f"fault {fault.text}: ranks", raw,
                            f"a rank or range A-B within 0..{topo.world_size - 1}")
    return list(range(int(m[1]), int(m[2] or m[1]) + 1))


def mixed_gpus(topo: Topology, ranks: Iterable[int], spec: DeviceSpec) -> Topology:
    """Those ranks get another GPU type; their NVLink links run at its rate."""
    devices = list(topo.devices)
    graph = topo.graph.copy()
    for r in ranks:
        devices[r] = spec
        sw = nvswitch_node(topo.domain_of(r))
        for a, b in ((gpu_node(r), sw), (sw, gpu_node(r))):
            graph.edges[a, b].update(bandwidth=spec.nvlink_Bps,
                                     nccl_bandwidth=spec.nccl_nvlink_Bps)
    return _with_graph(topo, graph, devices, f"; ranks {min(ranks)}-{max(ranks)} are {spec.name}")


def apply_fault(topo: Topology, fault: Fault | str) -> Topology:
    """One fault applied to a topology (a new Topology; the input is unchanged)."""
    fault = parse_fault(fault) if isinstance(fault, str) else fault
    if fault.kind == "straggler":
        return straggler(topo, _rank(topo, fault, fault.get("gpu")), _number(fault, "slowdown"))
    if fault.kind == "degraded":
        return degrade(topo, fault.get("link"), _number(fault, "factor"))
    if fault.kind == "gpu":
        return mixed_gpus(topo, _ranks(topo, fault), device(fault.get("type")))
    keys = dict(fault.args)
    if "nic" in keys:
        m = re.fullmatch(r"(?:node)?(\d{1,9})[/.](\d{1,9})", keys["nic"].removeprefix("nic"),
                      re.ASCII)
        if not m:
            raise TopologyError(f"fault {fault.text}: nic", keys["nic"], "nodeD/R, e.g. node1/3")
        return nic_down(topo, int(m[1]), int(m[2]))
    name = fault.get("link")
    u, sep, v = name.partition("->")
    if not sep:
        raise TopologyError(f"fault {fault.text}: link", name, "a link name like nic1.3->leaf0.3")
    return link_down(topo, [(u, v)], fault.text)


def apply_faults(topo: Topology, faults: Iterable[Fault | str]) -> Topology:
    """Every fault in order."""
    for fault in faults:
        topo = apply_fault(topo, fault)
    return topo
