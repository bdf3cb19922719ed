"""GB300 NVL72 racks (`nvl72-gb300[xN]`), the NCCL constants NCCL keys by architecture,
and the reference rows that run on them."""
from __future__ import annotations

import pytest

from simulator.network.constants import ll_max_bw_Bps, nvls_efficiency
from topologies import build
from topologies.builders import PCIE_GEN5_BPS, PCIE_GEN6_BPS, XDR_800G
from topologies.presets import cluster_spec
from validation.reference_rows import hardware_name, plan_dict, topology_for
from workloads.moe.ep_nvlink import nvlink_kernel_Bps


def test_gb300_rack_preset():
    """Two GB300 racks: 144 Blackwell Ultra GPUs in domains of 72 (18 trays of 4), one
    800 Gb/s NIC per GPU behind a PCIe Gen6 link (a Gen5 link would cap it at 64 GB/s)."""
    topo = build("nvl72-gb300x2")
    assert topo.world_size == 144 and topo.num_domains == 2
    assert {d.name for d in topo.devices} == {"gb300"}
    assert topo.nic_Bps == XDR_800G.nic_Bps == 100e9
    spec = cluster_spec("nvl72-gb300")
    assert spec.fabric.pcie_Bps == PCIE_GEN6_BPS > XDR_800G.nic_Bps
    # GB200 racks keep ConnectX-7 at 400 Gb/s behind Gen5
    gb200 = cluster_spec("nvl72")
    assert gb200.gpu.name == "gb200" and gb200.fabric.nic_Bps == 50e9
    assert gb200.fabric.pcie_Bps == PCIE_GEN5_BPS


@pytest.mark.parametrize("gpu,nvls,ll_one_node", [
    ("h100", 0.85, 141e9), ("h200", 0.85, 141e9), ("b200", 0.74, 282e9),
    ("gb200", 0.74, 282e9), ("gb300", 0.74, 282e9), ("a100", 0.85, 87.7e9)])
def test_nccl_tables_keyed_by_architecture(gpu, nvls, ll_one_node):
    """nvlsEfficiency and llMaxBw are rows of NCCL's compute-capability classes
    (tuning.cc): GB300 takes Blackwell's, not the Hopper default a name table would give."""
    assert nvls_efficiency(gpu) == nvls
    assert ll_max_bw_Bps(gpu, 1) == ll_one_node


def test_hybridep_on_gb300_takes_gb200s_measured_rates():
    """GB300's rack has GB200's NVLink5 and MNNVL path: its HybridEP kernels are priced at
    GB200's measured rates (an assumption), not left to the plain all-to-all."""
    assert nvlink_kernel_Bps("hybridep", "gb300", 16) == nvlink_kernel_Bps("hybridep", "gb200", 16)
    assert nvlink_kernel_Bps("hybridep", "gb300", 16) is not None


def test_reference_rows_on_gb300_racks():
    """A row on `nvl72-gb300` with 64 GPUs used per rack is 4 domains of 64 GB300s, in
    the gb300 hardware group."""
    row = {"topology": "nvl72-gb300", "gpus": "256", "rack_gpus": "64"}
    topo = topology_for(row)
    assert topo.world_size == 256 and topo.domain_size == 64
    assert {d.name for d in topo.devices} == {"gb300"}
    assert hardware_name(row) == "gb300"


def _row(**cells):
    row = {"model": "llama3-8b", "framework": "megatron-core", "gpus": "8", "tp": "1",
           "pp": "1", "dp": "8", "global_batch_seqs": "8", "seq_len": "4096"}
    row.update(cells)
    return row


def test_grad_reduce_fp32_column():
    """`grad_reduce_fp32` sets Megatron-Core's gradient buffer dtype; empty keeps the
    profile's (fp32) except for Megatron-Bridge performance-script runs (off)."""
    assert "ddp" not in plan_dict(_row())
    assert plan_dict(_row(grad_reduce_fp32="false"))["ddp"] == {"grad_reduce_in_fp32": False}
    perf = "Megatron-Bridge@abc src/megatron/bridge/perf_recipes/x.py"
    assert plan_dict(_row(settings=perf))["ddp"] == {"grad_reduce_in_fp32": False}
    assert plan_dict(_row(settings=perf, grad_reduce_fp32="true"))["ddp"] == {
        "grad_reduce_in_fp32": True}


def test_dgx_b300_preset_and_its_rows():
    """Two DGX B300 nodes: 16 B300s in NVLink domains of 8, one 800 Gb/s ConnectX-8 per GPU
    (DGX B200 keeps 400 Gb/s); a `dgx-b300` reference row is in the b300 hardware group and
    runs on B300s."""
    topo = build("dgx-b300x2")
    assert topo.world_size == 16 and topo.num_domains == 2
    assert {d.name for d in topo.devices} == {"b300"}
    assert topo.nic_Bps == XDR_800G.nic_Bps > cluster_spec("dgx-b200").fabric.nic_Bps
    row = {"topology": "dgx-b300", "gpus": "64"}
    assert hardware_name(row) == "b300"
    assert {d.name for d in topology_for(row).devices} == {"b300"}
