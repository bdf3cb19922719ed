"""Hardware: device specs, cluster graphs, named presets and user topology files."""
from .builders import FabricSpec, build_cluster
from .errors import TopologyError
from .presets import ClusterSpec, build, cluster_spec, preset_names
from .specs import DEVICES, DeviceProfile, DeviceSpec, device
from .topology import MeasuredCollective, Topology

__all__ = ["ClusterSpec", "DEVICES", "DeviceProfile", "DeviceSpec", "FabricSpec",
           "MeasuredCollective", "Topology", "TopologyError", "build", "build_cluster",
           "cluster_spec", "device", "preset_names"]
