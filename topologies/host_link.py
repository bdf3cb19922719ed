"""The link between a GPU and its host's memory: what a copy to or from pinned host memory
moves per second, per direction, per GPU (activation offloading: workloads/
activation_offload.py).

x86 systems (DGX / HGX A100, H100, H200, B200, B300) reach the host over PCIe; Grace systems
(GH200, GB200, GB300) over NVLink-C2C. Each figure is a copy-engine (cudaMemcpyAsync)
rate, the engine Transformer Engine's offload uses (transformer_engine/pytorch/
cpu_offload.py at v2.13: copy_(non_blocking=True) on its own stream).

- PCIe Gen5 x16 (H100, H200, B200): 52.8 GB/s device to host, measured with nvbandwidth
  on each of the 8 GPUs of an H100 node (NVIDIA/nvbandwidth issue 24, 2024: 52.77 GB/s,
  device_to_host_memcpy; the same issue's host-to-device SM copy is slower, 35.3 GB/s, a
  copy-kernel effect the copy engine does not share). Assumption: B200 and H200 in
  DGX/HGX nodes reach it too (the same PCIe Gen5 x16 host slot); B300's ConnectX-8 is
  PCIe Gen6, but its host link is priced as Gen5 (no measurement).
- PCIe Gen4 x16 (A100): half the Gen5 rate (16 against 32 GT/s per lane; assumption).
- NVLink-C2C, GH200: 346 GB/s host to device through the copy engine (NVIDIA/
  nvbandwidth issue 23, 2024, GH200 480 GB), of the link's 450 GB/s per direction
  (900 GB/s bidirectional, NVIDIA's GH200 datasheet): 77 %.
- NVLink-C2C, GB200 / GB300: one Grace serves two GPUs over its 900 GB/s bidirectional
  NVLink-C2C (NVIDIA GB200 NVL72 product page). Assumption: both GPUs offload at once
  and split it, each at GH200's measured fraction of its half: 450 / 2 x 346 / 450 =
  173 GB/s per direction.
A GPU this table does not name (a user's device file) is priced at the PCIe Gen5 rate.
"""
from __future__ import annotations

from .specs import DeviceSpec

GB = 1e9
# NVIDIA/nvbandwidth issue 24: device_to_host_memcpy, 8 x H100 (52.76 .. 52.78 GB/s)
PCIE_GEN5_X16_COPY_BPS = 52.77 * GB
PCIE_GEN4_X16_COPY_BPS = PCIE_GEN5_X16_COPY_BPS / 2           # assumption (docstring)
# NVIDIA/nvbandwidth issue 23: host_to_device_memcpy_ce on GH200, 346 GB/s
GH200_C2C_COPY_BPS = 346 * GB
C2C_PER_DIRECTION_BPS = 450 * GB                                 # 900 GB/s bidirectional
GRACE_BLACKWELL_COPY_BPS = C2C_PER_DIRECTION_BPS / 2 * (GH200_C2C_COPY_BPS
                                                        / C2C_PER_DIRECTION_BPS)

HOST_LINK_BPS = {
    "a100": PCIE_GEN4_X16_COPY_BPS, "a100-40gb": PCIE_GEN4_X16_COPY_BPS,
    "h100": PCIE_GEN5_X16_COPY_BPS, "h100-hbm2e": PCIE_GEN5_X16_COPY_BPS,
    "h200": PCIE_GEN5_X16_COPY_BPS, "b200": PCIE_GEN5_X16_COPY_BPS,
    "b300": PCIE_GEN5_X16_COPY_BPS, "gh200": GH200_C2C_COPY_BPS,
    "gb200": GRACE_BLACKWELL_COPY_BPS, "gb300": GRACE_BLACKWELL_COPY_BPS,
}


def host_link_Bps(device: DeviceSpec) -> float:
    """Bytes per second one GPU copies to (or from) pinned host memory, per direction."""
    return HOST_LINK_BPS.get(device.name, PCIE_GEN5_X16_COPY_BPS)
