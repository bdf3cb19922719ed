"""network.gpudirect_rdma false: NCCL stages a GPU's network traffic through host memory
(paths.cc), its search prices the GPU-CPU-NIC path at 48 GB/s / INTEL_P2P_OVERHEAD = 40 GB/s
(search.cc, topo.h), and the graph's PATH_PHB turns LL128 off across nodes (tuning.cc)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.network import CollectiveModel
from topologies import build
from topologies.transport import HOST_STAGED_NIC_BPS, host_staged_nic_Bps

FILES = Path(__file__).resolve().parents[1] / "validation" / "references" / "nccl_topologies"
GIB = 1 << 30


def _file(tmp_path, gdr: bool | None):
    raw = json.loads((FILES / "gcp-a3ultra-2x1.json").read_text())
    raw["network"].pop("gpudirect_rdma")
    if gdr is not None:
        raw["network"]["gpudirect_rdma"] = gdr
    path = tmp_path / f"t-{gdr}.json"
    path.write_text(json.dumps(raw))
    return path


def test_host_path_rate_is_nccl_pcie_gen5_over_the_intel_overhead():
    assert HOST_STAGED_NIC_BPS == pytest.approx(48e9 / 1.2)
    assert host_staged_nic_Bps(48e9, True) == 48e9
    assert host_staged_nic_Bps(48e9, False) == pytest.approx(40e9)
    assert host_staged_nic_Bps(24e9, False) == 24e9      # a slower NIC still binds


def test_default_is_gpudirect_and_the_flag_lowers_the_nic_rate(tmp_path):
    with_gdr, without = build(str(_file(tmp_path, None))), build(str(_file(tmp_path, False)))
    assert with_gdr.transport.gpudirect_rdma and not without.transport.gpudirect_rdma
    assert with_gdr.nic_nccl_Bps == pytest.approx(48e9)
    assert without.nic_nccl_Bps == pytest.approx(40e9)


def test_one_gpu_per_node_all_gather_plateau_and_no_ll128(tmp_path):
    topo = build(str(FILES / "gcp-a3ultra-2x1.json"))
    model = CollectiveModel(topo)
    big = model.plan("all_gather", (0, 8), 8 * GIB)
    # The links' rate: (n-1)/n of algbw, n = 2, on the transfer part (its 512 ring passes
    # of 16 MiB add a 14 us network step each, as latency: test_collectives_ring_passes).
    busbw = 8 * GIB / big.transfer_s / 2 / 1e9
    assert busbw == pytest.approx(40.0, rel=0.01)
    small = model.plan("all_gather", (0, 8), 64 << 10)
    assert small.protocol != "LL128"        # the tuner's LL128 rule cannot apply
    gdr = CollectiveModel(build(str(_file(tmp_path, True)))).plan("all_gather", (0, 8), 64 << 10)
    assert gdr.protocol == "LL128"


def test_one_node_keeps_ll128_without_gpudirect(tmp_path):
    topo = build(str(_file(tmp_path, False)))
    plan = CollectiveModel(topo).plan("all_reduce", tuple(range(8)), 1 << 20)
    assert plan.protocol in ("LL", "LL128", "Simple")
    assert CollectiveModel(topo).plan("all_reduce", tuple(range(8)), 256 << 10).protocol \
        == CollectiveModel(build(str(_file(tmp_path, True)))).plan(
            "all_reduce", tuple(range(8)), 256 << 10).protocol


def test_bad_flag_is_a_topology_error_naming_the_field(tmp_path):
    from topologies import TopologyError
    raw = json.loads((FILES / "gcp-a3ultra-2x1.json").read_text())
    raw["network"]["gpudirect_rdma"] = "no"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(TopologyError) as err:
        build(str(path))
    assert "network.gpudirect_rdma" in str(err.value)
