"""Racks as jobs see them: trays, partial racks and NVLink partitions.

A GB200 NVL72 rack is 18 compute trays of 4 GPUs (2 GB200 superchips of 1 Grace + 2
B200 each) on one NVLink5 switch fabric of 9 switch trays; each compute tray carries one
scale-out NIC per GPU [NVIDIA GB200 NVL72 datasheet; NVIDIA DGX GB200 user guide,
"compute tray"]. A job does not always see the whole rack:
  * partial racks: a job uses `gpus_used_per_domain` of the rack's GPUs (for example 64 of
    72: 16 trays, the other two kept as spares), so its NVLink domain is those GPUs;
  * NVLink partitions: the rack's NVLink fabric is split into partitions of
    `nvlink_partition` GPUs (NVL4 = one tray, NVL8, NVL36 = half a rack), between which
    only the scale-out network runs [NVIDIA NVLink partitioning in the GB200 NVL72
    system software: Fabric Manager / IMEX partitions].
The job's NVLink domain is then min(used, partition) GPUs, and each rack holds
used / domain of them. NICs follow their GPUs: a domain of g GPUs has g x (NICs per rack /
GPUs per rack) NICs.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TopologyError


@dataclass(frozen=True)
class RackLayout:
    """How a job's NVLink domains sit in its racks."""

    rack_gpus: int           # GPUs per physical rack / node (NVLink fabric)
    tray_gpus: int           # GPUs per compute tray (0: no trays, e.g. DGX)
    used_gpus: int           # GPUs of each rack the job uses
    partition_gpus: int      # GPUs per NVLink partition

    @property
    def domain_gpus(self) -> int:
        """GPUs per NVLink domain the job sees."""
        return min(self.used_gpus, self.partition_gpus)

    @property
    def domains_per_rack(self) -> int:
        """The job's NVLink domains in one rack."""
        return self.used_gpus // self.domain_gpus

    def nics_per_domain(self, nics_per_rack: int) -> int:
        """Scale-out NICs of one job domain: the NICs of its GPUs."""
        return nics_per_rack * self.domain_gpus // self.rack_gpus

    def describe(self) -> str:
        """A short phrase for topology descriptions ('' for a whole, unpartitioned rack)."""
        parts = []
        if self.used_gpus < self.rack_gpus:
            parts.append(f"{self.used_gpus} of {self.rack_gpus} GPUs per rack used")
        if self.partition_gpus < self.rack_gpus:
            parts.append(f"NVLink partitions of {self.partition_gpus} GPUs")
        return "; ".join(parts)


def rack_layout(rack_gpus: int, tray_gpus: int = 0, used_gpus: int | None = None,
                partition_gpus: int | None = None, nics_per_rack: int | None = None,
                where: str = "topology") -> RackLayout:
    """Check and build a RackLayout; TopologyError names the field, value and what is allowed."""
    used = rack_gpus if used_gpus is None else used_gpus
    part = rack_gpus if partition_gpus is None else partition_gpus
    unit = tray_gpus or 1
    if tray_gpus and rack_gpus % tray_gpus:
        raise TopologyError(f"{where}.gpus_per_tray", tray_gpus,
                            f"a divisor of gpus_per_domain ({rack_gpus})")
    if not 1 <= used <= rack_gpus or used % unit:
        raise TopologyError(f"{where}.gpus_used_per_domain", used,
                            f"a multiple of gpus_per_tray ({unit}) from {unit} to "
                            f"gpus_per_domain ({rack_gpus})")
    if not 1 <= part <= rack_gpus or rack_gpus % part or part % unit:
        allowed = [d for d in range(unit, rack_gpus + 1, unit) if rack_gpus % d == 0]
        raise TopologyError(f"{where}.nvlink_partition", part,
                            "GPUs per partition, one of " + ", ".join(map(str, allowed)))
    layout = RackLayout(rack_gpus, tray_gpus, used, part)
    if used % layout.domain_gpus:
        raise TopologyError(f"{where}.gpus_used_per_domain", used,
                            f"a multiple of nvlink_partition ({part}) when larger than it")
    if nics_per_rack is not None and (nics_per_rack * layout.domain_gpus) % rack_gpus:
        raise TopologyError("network.nics_per_domain", nics_per_rack,
                            f"a NIC count that splits evenly over NVLink domains of "
                            f"{layout.domain_gpus} of the {rack_gpus} GPUs")
    return layout
