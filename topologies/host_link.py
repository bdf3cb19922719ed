"""The link between a GPU and its host's memory: what one GPU's copy to or from pinned host
memory moves per second, in each direction (activation offloading: workloads/
activation_offload.py, whose copies Transformer Engine issues as copy_(non_blocking=True)
on a side stream: transformer_engine/pytorch/cpu_offload.py at v2.13).

x86 systems (DGX / HGX A100, H100, H200, B200, B300) reach the host over PCIe; Grace systems
(GH200, GB200, GB300) over NVLink-C2C.

- PCIe Gen5 x16 (H100, H200, B200, B300): 52.77 GB/s device to host, measured with
  nvbandwidth's SM copy (device_to_host_memcpy_sm) on each of the 8 GPUs of an H100 node
  (NVIDIA/nvbandwidth issue 24, 2024). Assumptions: a copy engine moves the same (the
  issue's host-to-device SM copy, 35.3 GB/s, is a copy-kernel effect, so host to device is
  taken at the device-to-host rate too); the 8 GPUs copying at once each keep that rate
  (shared PCIe uplinks not modelled); H200, B200 and B300 in DGX/HGX nodes reach it (a
  PCIe Gen5 x16 host slot; B300's ConnectX-8 is Gen6, its host link is not measured).
- PCIe Gen4 x16 (A100): half the Gen5 rate (16 against 32 GT/s per lane; assumption).
- NVLink-C2C, GH200: 346 GB/s host to device through the copy engine (NVIDIA/nvbandwidth
  issue 23, 2024, GH200 480 GB); the same report finds host to device about 15 % faster
  than device to host: 346 / 1.15 = 301 GB/s device to host.
- NVLink-C2C, GB200 / GB300: one Grace serves two GPUs over its 900 GB/s bidirectional
  NVLink-C2C (NVIDIA GB200 NVL72 product page). Assumption: both GPUs copy at once and
  split it, each at GH200's measured rates halved (the same Grace and C2C generation).
A GPU this table does not name (a user's device file) is priced at the PCIe Gen5 rate
(assumption: the common x86 host slot).
"""
from __future__ import annotations

from .specs import DeviceSpec

GB = 1e9
# NVIDIA/nvbandwidth issue 24: device_to_host_memcpy_sm, 8 x H100 (52.76 .. 52.78 GB/s)
PCIE_GEN5_X16_COPY_BPS = 52.77 * GB
PCIE_GEN4_X16_COPY_BPS = PCIE_GEN5_X16_COPY_BPS / 2           # assumption (docstring)
# NVIDIA/nvbandwidth issue 23: host_to_device_memcpy_ce on GH200, 346 GB/s; device to
# host about 15 % slower (the same issue)
GH200_C2C_H2D_BPS = 346 * GB
GH200_C2C_D2H_BPS = GH200_C2C_H2D_BPS / 1.15
GRACE_GPUS = 2                       # GPUs one Grace serves in a GB200 / GB300 superchip

# device -> (device to host, host to device) bytes per second
HOST_LINK_BPS = {
    **{name: (PCIE_GEN4_X16_COPY_BPS,) * 2 for name in ("a100", "a100-40gb")},
    **{name: (PCIE_GEN5_X16_COPY_BPS,) * 2
       for name in ("h100", "h100-hbm2e", "h200", "b200", "b300")},
    "gh200": (GH200_C2C_D2H_BPS, GH200_C2C_H2D_BPS),
    **{name: (GH200_C2C_D2H_BPS / GRACE_GPUS, GH200_C2C_H2D_BPS / GRACE_GPUS)
       for name in ("gb200", "gb300")},
}


def host_link_Bps(device: DeviceSpec, to_host: bool) -> float:
    """Bytes per second one GPU copies to (to_host) or from pinned host memory."""
    d2h, h2d = HOST_LINK_BPS.get(device.name, (PCIE_GEN5_X16_COPY_BPS,) * 2)
    return d2h if to_host else h2d
