"""ClusterSpec: what a preset name or a topology file says, as plain data, and the bound
on its size (MAX_GPUS) checked before any graph is built.

topologies/presets.py names the bundled clusters, topologies/presets_file.py reads user
topology files; both give a ClusterSpec, which what-if studies change and build again.
"""
from __future__ import annotations

from dataclasses import dataclass

from .builders import FabricSpec, build_cluster
from .errors import TopologyError
from .racks import RackLayout
from .specs import DeviceSpec
from .topology import MeasuredCollective, Topology

# Largest cluster a topology may have unless asked for more (`--max-gpus`): 131,072 GPUs,
# past the largest published training clusters (about 100,000 H100s in 2024) and 8 x the
# 16,384-GPU Llama 3 405B job. Its graph takes about 7 s and 0.7 GB to build (measured
# on dgx-h100x16384); a million GPUs would take about 6 GB, checked before any of it.
MAX_GPUS = 1 << 17


@dataclass(frozen=True)
class ClusterSpec:
    """Everything needed to build a Topology: what a preset name or a file says."""

    name: str
    gpu: DeviceSpec
    num_domains: int
    domain_size: int
    fabric: FabricSpec | None
    description: str = ""
    measured: tuple = ()  # ((op, group_size, MeasuredCollective), ...)
    # Trays, partial racks and NVLink partitions the domains were cut from (None: whole
    # nodes); num_domains and domain_size already count the job's NVLink domains.
    layout: RackLayout | None = None

    def build(self, max_gpus: int | None = None) -> Topology:
        """The Topology this spec describes; TopologyError past `max_gpus` GPUs (default
        MAX_GPUS: a what-if may have grown the spec since it was read)."""
        check_gpu_count(self, MAX_GPUS if max_gpus is None else max_gpus)
        devices = [self.gpu] * (self.num_domains * self.domain_size)
        topo = build_cluster(self.name, devices, self.domain_size, self.fabric,
                             self.description)
        measured: dict[str, dict[int, MeasuredCollective]] = {}
        for op, size, m in self.measured:
            measured.setdefault(op, {})[size] = m
        topo.measured = measured
        return topo


def check_gpu_count(spec: "ClusterSpec", max_gpus: int = MAX_GPUS) -> None:
    """TopologyError when a cluster has more GPUs than `max_gpus` (before any graph)."""
    gpus = spec.num_domains * spec.domain_size
    if gpus > max_gpus:
        raise TopologyError("topology", f"{spec.name} ({gpus:,} GPUs)",
                            f"at most {max_gpus:,} GPUs (--max-gpus raises the limit)")
