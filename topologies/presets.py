"""Named clusters users type (`dgx-h100x4`, `nvl72x2`, ...) and the lookup of a preset name
or a user topology file.

A preset or file becomes a ClusterSpec (plain data, topologies/presets_spec.py), then a
Topology. What-if studies change the ClusterSpec (another GPU, twice the NIC bandwidth)
and build again. Topology files are read by topologies/presets_file.py; ClusterSpec,
MAX_GPUS, check_gpu_count and load_file stay importable from here.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from .builders import HDR_200G, NDR_400G, XDR_800G, FabricSpec
from .errors import TopologyError
from .power_capped import POWER_CAPPED
from .presets_file import GB, MAX_COUNT, MAX_LINKS, MAX_SMS, load_file
from .presets_spec import MAX_GPUS, ClusterSpec, check_gpu_count
from .racks import rack_layout
from .specs import device
from .topology import Topology


def _dgx(gpu: str, fabric: FabricSpec, title: str,
         family: str | None = None) -> Callable[[int], ClusterSpec]:
    family = family or f"dgx-{gpu}"
    spec = POWER_CAPPED[gpu] if gpu in POWER_CAPPED else device(gpu)

    def make(nodes: int) -> ClusterSpec:
        name = family if nodes == 1 else f"{family}x{nodes}"
        return ClusterSpec(name, spec, nodes, 8, fabric,
                           f"{nodes} x {title} (8 GPUs on NVSwitch each), rail-optimised "
                           f"{fabric.nic_Bps * 8 / 1e9:.0f} Gb/s InfiniBand, one NIC per GPU")
    return make


# GB200 NVL72: 18 compute trays of 4 GPUs, 72 GPUs in one NVLink5 domain [NVIDIA GB200
# NVL72 datasheet]; scale-out through one 400 Gb/s ConnectX-7 per GPU, 4 per compute tray
# (NVIDIA DGX SuperPOD GB200 reference architecture; an assumption to check per
# deployment, which may use 800 Gb/s ConnectX-8: a topology file says so).
NVL72_GPUS, NVL72_TRAY_GPUS = 72, 4


def _rack72(family: str, gpu: str, nic: FabricSpec) -> Callable[[int], ClusterSpec]:
    """NVL72 racks of `gpu` (18 trays of 4 in one NVLink domain), one `nic` per GPU."""
    fabric = FabricSpec(nics_per_domain=NVL72_GPUS, nic_Bps=nic.nic_Bps,
                        nic_nccl_Bps=nic.nic_nccl_Bps, pcie_Bps=nic.pcie_Bps)
    title = f"{gpu.upper()} NVL72 rack"

    def make(racks: int) -> ClusterSpec:
        name = family if racks == 1 else f"{family}x{racks}"
        return ClusterSpec(name, device(gpu), racks, NVL72_GPUS, fabric,
                           f"{racks} x {title} (18 trays of 4 GPUs in one NVLink domain), "
                           f"{nic.nic_Bps * 8 / 1e9:.0f} Gb/s InfiniBand per GPU between racks",
                           layout=rack_layout(NVL72_GPUS, NVL72_TRAY_GPUS))
    return make


_nvl72 = _rack72("nvl72", "gb200", NDR_400G)
# GB300 NVL72: the same rack of 18 trays of 4 Blackwell Ultra GPUs in one NVLink5 domain,
# with one 800 Gb/s ConnectX-8 per GPU (topologies/builders.py XDR_800G); an assumption to
# check per deployment, which may run the ConnectX-8 as 2 x 400 Gb/s Ethernet.
_nvl72_gb300 = _rack72("nvl72-gb300", "gb300", XDR_800G)


# family prefix -> (builder of N, description of N)
FAMILIES: dict[str, Callable[[int], ClusterSpec]] = {
    "dgx-a100": _dgx("a100", HDR_200G, "DGX A100"),
    # DGX A100 with the 40 GB A100 (HBM2 at 1,555 GB/s): the 2020 systems, same fabric.
    "dgx-a100-40gb": _dgx("a100-40gb", HDR_200G, "DGX A100 40GB"),
    "dgx-h100": _dgx("h100", NDR_400G, "DGX H100"),
    "dgx-h200": _dgx("h200", NDR_400G, "DGX H200"),
    # Meta Grand Teton hosts of 8 x H100 HBM2e/500 W (the torchtitan benchmark's cluster):
    # 400 Gb/s of RDMA per GPU [torchtitan benchmarks/llama3_h100_202412_torchtitan.md],
    # modelled as the same rail-optimised 400 Gb/s fabric as DGX H100.
    "grandteton-h100": _dgx("h100-hbm2e", NDR_400G, "Grand Teton H100 HBM2e 500 W",
                            "grandteton-h100"),
    # DGX B200: 8 x ConnectX-7 400 Gb/s for the compute fabric [NVIDIA DGX B200 datasheet].
    "dgx-b200": _dgx("b200", NDR_400G, "DGX B200"),
    # DGX B300: eight ConnectX-8 800 Gb/s, one per GPU, on the GPU tray, cabled to eight
    # 800 Gb/s front ports for the compute fabric [NVIDIA DGX B300 User Guide, hardware
    # overview] (topologies/builders.py XDR_800G).
    "dgx-b300": _dgx("b300", XDR_800G, "DGX B300"),
    # 8 x B200 under a 750 W power limit (Meta's B200 hosts, where the torchao / torchtitan
    # B200 training benchmark ran): topologies/power_capped.py.
    "dgx-b200-750w": _dgx("b200-750w", NDR_400G, "B200 750 W host", "dgx-b200-750w"),
    "nvl72": _nvl72,
    "nvl72-gb300": _nvl72_gb300,
}
_NAME = re.compile(r"(?P<family>[a-z0-9-]+?)(?:x(?P<n>\d{1,9}))?", re.ASCII)


def preset_names() -> list[str]:
    """The names `list topologies` shows: each family alone and with xN."""
    return [n for fam in FAMILIES for n in (fam, f"{fam}xN")]


def cluster_spec(name_or_path: str, max_gpus: int = MAX_GPUS) -> ClusterSpec:
    """Parse a preset name or a topology JSON file into a ClusterSpec of at most
    `max_gpus` GPUs."""
    if not isinstance(name_or_path, str):
        raise TopologyError("topology", name_or_path, "a preset name or a JSON file path")
    if name_or_path.endswith(".json") or os.sep in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise TopologyError("topology", name_or_path,
                                "a preset (" + ", ".join(preset_names()) + ") or a JSON file")
        spec = load_file(path)
    else:
        match = _NAME.fullmatch(name_or_path.lower())
        if not match or match["family"] not in FAMILIES:
            raise TopologyError("topology", name_or_path,
                                ", ".join(preset_names()) + ", or a topology JSON file")
        count = int(match["n"]) if match["n"] else 1
        if count < 1:
            raise TopologyError("topology", name_or_path, "a domain count of at least 1")
        if count > max_gpus:   # before building even the spec
            raise TopologyError("topology", name_or_path,
                                f"at most {max_gpus:,} GPUs (--max-gpus raises the limit)")
        spec = FAMILIES[match["family"]](count)
    check_gpu_count(spec, max_gpus)
    return spec


def build(name_or_path: str, max_gpus: int = MAX_GPUS) -> Topology:
    """A Topology from a preset name or a topology JSON file (at most `max_gpus` GPUs)."""
    return cluster_spec(name_or_path, max_gpus).build(max_gpus)


__all__ = ["FAMILIES", "GB", "MAX_COUNT", "MAX_GPUS", "MAX_LINKS", "MAX_SMS", "NVL72_GPUS",
           "NVL72_TRAY_GPUS", "ClusterSpec", "build", "check_gpu_count", "cluster_spec",
           "load_file", "preset_names"]
