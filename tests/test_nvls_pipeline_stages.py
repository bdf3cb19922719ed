"""NVLS pipeline fill counts the stages of NCCL's NVLS kernels: all-reduce scatter,
reduce+multicast (one primitive), gather; all-gather multicast, gather; reduce-scatter
scatter, reduce; NVLS_Tree adds one stage up and one down per tree level [NVIDIA/nccl
src/device/all_reduce.h, all_gather.h, reduce_scatter.h]."""
from __future__ import annotations

import pytest

from simulator.network.algorithms import GroupShape
from simulator.network.constants import NVLS_STAGES
from simulator.network.latency import nvls_fill_s


def _shape(nodes: int, ppn: int = 8) -> GroupShape:
    ranks = tuple(range(nodes * ppn))
    return GroupShape(ranks, tuple(range(nodes)),
                      tuple(tuple(range(d * ppn, (d + 1) * ppn)) for d in range(nodes)))


def _waves(op: str, algo: str, nodes: int) -> float:
    size, channels, heads, unit = 1 << 30, 16, 8, 1e-12
    fill, chunk = nvls_fill_s(op, algo, _shape(nodes), size, channels, heads, unit)
    return fill / (channels * heads * chunk * unit)


def test_stage_counts_are_the_kernels_warp_groups():
    assert NVLS_STAGES == {"all_reduce": 3, "all_gather": 2, "reduce_scatter": 2}


@pytest.mark.parametrize("op,algo,nodes,waves", [
    ("all_reduce", "nvls", 1, 2),          # scatter -> reduce+multicast -> gather
    ("all_gather", "nvls", 1, 1),          # multicast -> gather
    ("reduce_scatter", "nvls", 1, 1),      # scatter -> reduce
    ("all_reduce", "nvls_tree", 2, 4),     # + reduce/send up, recv/broadcast down
    ("all_reduce", "nvls_tree", 4, 6),     # two tree levels
])
def test_fill_is_stages_minus_one_waves(op, algo, nodes, waves):
    assert _waves(op, algo, nodes) == pytest.approx(waves)


def test_the_pipeline_fills_through_every_stage_but_the_slowest():
    # 2 nodes: 3 NVLink stages at u and 2 network stages at 3u: the network streams, the
    # fill is one wave through the 3 NVLink stages and the other network stage.
    size, channels, heads, unit = 1 << 30, 16, 8, 1e-12
    fill, chunk = nvls_fill_s("all_reduce", "nvls_tree", _shape(2), size, channels, heads,
                              unit, net_unit_time_s=3 * unit)
    assert fill / (channels * heads * chunk * unit) == pytest.approx(3 + 3)
    # NVLink slower than the network: two NVLink stages and both network hops.
    fill, _ = nvls_fill_s("all_reduce", "nvls_tree", _shape(2), size, channels, heads,
                          unit, net_unit_time_s=unit / 2)
    assert fill / (channels * heads * chunk * unit) == pytest.approx(2 + 1)


def test_nvls_tree_template_splits_nvlink_and_network_rates():
    from simulator.network import CollectiveModel
    from topologies import build

    topo = build("dgx-h100x2")
    t = CollectiveModel(topo).template("all_reduce", tuple(range(16)), "nvls_tree")
    assert t.nvlink_unit_s > 0 and t.net_unit_s > 0
    # The two parts use disjoint links, so together they stream at the slower one.
    assert t.unit_time_s == pytest.approx(max(t.nvlink_unit_s, t.net_unit_s), rel=1e-6)


def test_nvl72_network_stages_run_at_the_heads_network_rate(monkeypatch):
    # Across NVL72 racks the heads' network rate (NVLS_TREE_HEAD_NET_BPS) bounds the
    # network stages, so a slower head rate lengthens the fill, not only the stream.
    import simulator.network.collectives as collectives
    from simulator.network import CollectiveModel
    from simulator.network.constants import NVLS_TREE_HEAD_NET_BPS
    from topologies import build

    topo = build("nvl72x4")
    ranks = tuple(range(topo.world_size))
    base = CollectiveModel(topo).plan("all_reduce", ranks, 1 << 30)
    monkeypatch.setattr(collectives, "NVLS_TREE_HEAD_NET_BPS", NVLS_TREE_HEAD_NET_BPS / 2)
    slow = CollectiveModel(topo).plan("all_reduce", ranks, 1 << 30)
    assert base.algorithm == slow.algorithm == "nvls_tree"
    assert slow.fill_s > 1.5 * base.fill_s


@pytest.mark.parametrize("size,measured_us", [(8 << 20, 80.7), (16 << 20, 122.1)])
def test_one_node_nvls_fill_is_not_a_free_local_copy(size, measured_us):
    # Scatter and gather copy within the rank's own memory (ucBuff, NVIDIA/nccl
    # src/transport/nvls.cc), yet the one-node NVLS all-reduce pays about two waves
    # beyond its stream: 8 x H200, NCCL 2.20.5, NCCL_ALGO=NVLS, -g 8, busbw 181.94 GB/s
    # at 8 MiB and 240.41 GB/s at 16 MiB [Azure/AI-benchmarking-guide,
    # Azure_Results/ND_H200_v5_results.md]: 80.7 and 122.1 us. Pricing the two copies
    # at the HBM rate (a fill of ~0.4 waves) gives 56.8 and 86.8 us, 30 % short.
    from simulator.network import CollectiveModel, CommOptions
    from topologies import build

    model = CollectiveModel(build("dgx-h200"), CommOptions(gpus_per_process=8,
                                                           nccl_version="2.20.5"))
    plan = model.plan("all_reduce", tuple(range(8)), size)
    assert plan.algorithm == "nvls"
    assert plan.fill_s > 0.5 * (plan.closed_form_s - plan.latency_s)
    assert plan.closed_form_s * 1e6 == pytest.approx(measured_us, rel=0.15)
