"""Graph builders: NVSwitch domains (DGX nodes, NVL72 racks) on a rail-optimised fabric.

Shape of every built cluster:
  * each NVLink domain is one logical non-blocking NVSwitch; every GPU has one link in
    each direction to it at the GPU's NVLink rate (DGX H100: 4 NVSwitch chips, all
    GPUs on all of them, non-blocking [NVIDIA NVSwitch gen3 blog]);
  * NIC r of a domain hangs off GPU r over PCIe, and goes to the rail-r leaf switch
    of its group of domains (rail-optimised: NIC k of every node on leaf k
    [DGX SuperPOD reference architecture; Juniper JVD "Rail Optimized Fabric"]);
  * leaves reach other groups through one aggregated spine layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .specs import DeviceSpec
from .transport import NetTransport
from .topology import (SPINE, Topology, gpu_node, leaf_node, nic_node, nvswitch_node)

GB = 1e9

# Assumption: NVLink/NVSwitch traversal ~0.5 us one way; NCCL's per-step NVLink
# latency (tuning.cc hwLat) covers protocol costs, so this is only used for p2p.
NVLINK_LATENCY_S = 0.5e-6
# Assumption: PCIe Gen5 hop GPU<->NIC ~0.5 us.
PCIE_LATENCY_S = 0.5e-6
# Assumption: one InfiniBand hop (cable + switch port, NDR switch ~130-230 ns) ~0.6 us.
IB_HOP_LATENCY_S = 0.6e-6
# PCIe Gen5 x16 through the DGX H100 PCIe switch a GPU shares with its NIC: 32 GT/s x 16
# lanes, about 64 GB/s per direction [PCI Express 5.0 specification; 128 GB/s bidir in
# NV-H100; the GPU-NIC pairing: NVIDIA DGX H100 User Guide, section 1.2.3].
PCIE_GEN5_BPS = 64 * GB
# PCIe Gen6 x16: 64 GT/s x 16 lanes, twice Gen5, about 128 GB/s per direction [PCI Express
# 6.0 specification]: GB300's ConnectX-8 reaches its GPU over a Gen6 x16 link (NVIDIA at
# Hot Chips 2025: a Gen6 x16 link to the Blackwell Ultra GPU, Gen5 x16 to Grace).
PCIE_GEN6_BPS = 128 * GB
# Quantum-2 QM9700 has 64 NDR ports: in a two-level rail-optimised fat tree a leaf uses
# 32 down to nodes and 32 up to spines [NVIDIA DGX SuperPOD H100 RA, 32 nodes per SU].
DOMAINS_PER_LEAF = 32


@dataclass(frozen=True)
class FabricSpec:
    """Scale-out network of a cluster: NICs per domain, rate per NIC, spine taper."""

    nics_per_domain: int
    nic_Bps: float          # raw per direction
    nic_nccl_Bps: float     # what NCCL achieves per NIC per direction
    domains_per_leaf: int = DOMAINS_PER_LEAF
    # leaf uplink capacity / downlink capacity; 1.0 = non-blocking fat tree
    spine_taper: float = 1.0
    # In-network reduction in the fabric's switches (InfiniBand SHARP), which NCCL uses
    # through its CollNet algorithms (CollNetDirect, CollNetChain) when the CollNet
    # plugin is loaded [NVIDIA/nccl src/graph/tuning.cc, `collnetEnable`]. Off by default:
    # it needs SHARP-capable switches and the nccl-rdma-sharp plugin.
    collnet: bool = False
    # Extra latency per network step that the NCCL net plugin reports (ncclNetProperties
    # `latency`, NCCL's graph->latencyInter, added once per inter-node step and twice with
    # Simple [tuning.cc]). 0 for InfiniBand verbs; a file sets it for other transports.
    latency_s: float = 0.0
    # The NCCL environment, tuner rules and per-message cost the cluster's net transport
    # runs with (topologies.transport); the default is NCCL's defaults over IB verbs.
    transport: NetTransport = NetTransport()
    # The PCIe link between a GPU and its NIC (per direction).
    pcie_Bps: float = PCIE_GEN5_BPS


# 400 Gb/s NDR: 50 GB/s per direction raw; "For NDR @ 400Gbps you should see 46-48GB/s
# per NIC" (NVIDIA/nccl-tests issue 290); NCCL's sm90 inter-node speed array
# (src/graph/search.cc) tops at 48.
NDR_400G = FabricSpec(nics_per_domain=8, nic_Bps=50 * GB, nic_nccl_Bps=48 * GB)
# 800 Gb/s XDR: one ConnectX-8 per GPU on GB300 NVL72 compute trays (NVIDIA Enterprise
# Reference Architecture "NVL72 AI factory", System Hardware & Components: 4 ConnectX-8
# HCAs per tray of 4 GPUs; ConnectX-8 SuperNIC: 800 Gb/s InfiniBand XDR, NVIDIA at Hot Chips
# 2025): 100 GB/s raw. Assumption: NCCL reaches the same 96 % of it that NDR reaches.
XDR_800G = FabricSpec(nics_per_domain=8, nic_Bps=100 * GB, nic_nccl_Bps=96 * GB,
                      pcie_Bps=PCIE_GEN6_BPS)
# 200 Gb/s HDR on DGX A100 (8 x ConnectX-6): 25 GB/s raw; assumption: same 96 %.
HDR_200G = FabricSpec(nics_per_domain=8, nic_Bps=25 * GB, nic_nccl_Bps=24 * GB)


def _link(g: nx.DiGraph, a: str, b: str, bandwidth: float, nccl: float, latency: float,
          kind: str) -> None:
    for u, v in ((a, b), (b, a)):
        g.add_edge(u, v, bandwidth=bandwidth, nccl_bandwidth=nccl, latency=latency,
                   kind=kind)


def build_cluster(name: str, devices: list[DeviceSpec], domain_size: int,
                  fabric: FabricSpec | None, description: str = "") -> Topology:
    """N NVLink domains of `domain_size` GPUs joined by a rail-optimised fat tree."""
    world = len(devices)
    if world % domain_size:
        raise ValueError(f"{world} GPUs do not fill domains of {domain_size}")
    num_domains = world // domain_size
    g = nx.DiGraph()
    for rank, dev in enumerate(devices):
        g.add_node(gpu_node(rank), kind="gpu", rank=rank, device=dev.name)
    for d in range(num_domains):
        g.add_node(nvswitch_node(d), kind="nvswitch")
        for local in range(domain_size):
            rank = d * domain_size + local
            dev = devices[rank]
            _link(g, gpu_node(rank), nvswitch_node(d), dev.nvlink_Bps, dev.nccl_nvlink_Bps,
                  NVLINK_LATENCY_S, "nvlink")
    rails = 1
    per_leaf = 1
    if fabric is not None and num_domains > 1:
        rails = fabric.nics_per_domain
        per_leaf = fabric.domains_per_leaf
        _add_fabric(g, num_domains, domain_size, fabric)
    return Topology(name=name, graph=g, gpus=[gpu_node(r) for r in range(world)],
                    devices=list(devices), domain_size=domain_size,
                    nic_Bps=fabric.nic_Bps if fabric else 0.0,
                    nic_nccl_Bps=fabric.nic_nccl_Bps if fabric else 0.0,
                    rails=rails, domains_per_leaf=per_leaf, description=description,
                    collnet=bool(fabric and fabric.collnet and num_domains > 1),
                    net_latency_s=fabric.latency_s if fabric else 0.0,
                    transport=fabric.transport if fabric else NetTransport())


def _add_fabric(g: nx.DiGraph, num_domains: int, domain_size: int, fabric: FabricSpec) -> None:
    groups = -(-num_domains // fabric.domains_per_leaf)
    for d in range(num_domains):
        group = d // fabric.domains_per_leaf
        for rail in range(fabric.nics_per_domain):
            nic = nic_node(d, rail)
            g.add_node(nic, kind="nic")
            g.add_node(leaf_node(group, rail), kind="leaf")
            _link(g, gpu_node(d * domain_size + rail), nic, fabric.pcie_Bps, fabric.pcie_Bps,
                  PCIE_LATENCY_S, "pcie")
            _link(g, nic, leaf_node(group, rail), fabric.nic_Bps, fabric.nic_nccl_Bps,
                  IB_HOP_LATENCY_S, "ib")
    if groups > 1:
        g.add_node(SPINE, kind="spine")
        for group in range(groups):
            members = min(fabric.domains_per_leaf, num_domains - group * fabric.domains_per_leaf)
            for rail in range(fabric.nics_per_domain):
                up = members * fabric.nic_Bps * fabric.spine_taper
                up_nccl = members * fabric.nic_nccl_Bps * fabric.spine_taper
                _link(g, leaf_node(group, rail), SPINE, up, up_nccl, IB_HOP_LATENCY_S, "ib")
