"""NCCL facts that differ by GPU generation or by release, as the collective model uses them.

  * Ampere's ring graph: NCCL's search (NVIDIA/nccl v2.18.5-1 src/graph/search.cc,
    topo.h SM80_NVLINK_BW = 20) finds 6 rings at 40 GB/s on 12 NVLinks, duplicates them
    to 12, and connect.cc doubles them: 24 coll channels on 8 x A100 / NVSwitch, as
    NCCL's log in NVIDIA/nccl-tests issue 100 shows ("Channel 23/24").
  * Ring LL's rating in tuning.cc: busBw x 1/4 (all-reduce, reduce, or across nodes) and
    x 1/3 (other collectives in one node) up to v2.20.5-1; x .5 from v2.21.5-1.
"""
import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.channels import coll_channels, one_node_search_channels
from simulator.network.constants import ll_max_bw_Bps, ring_efficiency, ring_ll_efficiency
from topologies import build

MIB = 1 << 20
GIB = 1 << 30


def test_ampere_one_node_has_24_coll_channels():
    assert one_node_search_channels("ampere") == 12
    assert coll_channels("ampere", 1, 0) == 24
    # Hopper keeps the 32 its INIT log reports; across nodes the rails decide.
    assert coll_channels("hopper", 1, 0) == 32
    assert coll_channels("ampere", 2, 8) == 16


def test_8xa100_ring_runs_on_24_channels():
    model = CollectiveModel(build("dgx-a100"), CommOptions(algorithm="ring"))
    plan = model.plan("all_reduce", tuple(range(8)), 1 * GIB)
    assert (plan.protocol, plan.channels) == ("Simple", 24)


@pytest.mark.parametrize("version,op,nodes,expected", [
    ("2.18.5", "all_reduce", 1, 0.25),
    ("2.20.5", "reduce", 1, 0.25),
    ("2.18.5", "all_gather", 1, 1 / 3),
    ("2.18.5", "reduce_scatter", 2, 0.25),
    ("2.21.5", "all_reduce", 1, 0.5),
    ("2.26.2", "all_gather", 2, 0.5),
    (None, "all_reduce", 1, 0.5),
    ("unknown", "all_reduce", 1, 0.5),
])
def test_ring_ll_rating_by_release(version, op, nodes, expected):
    assert ring_ll_efficiency(op, nodes, version) == pytest.approx(expected)


def test_release_sets_ring_ll_bandwidth_on_8xa100():
    # 8 x A100 all-reduce, ring LL at 1 MiB: the payload fraction is 2.18's 1/4 against
    # 2.26's 0.5, each capped by Ampere's llMaxBw (87.7 GB/s of bus bandwidth).
    topo = build("dgx-a100")
    ranks, size = tuple(range(8)), 1 * MIB

    def plan(version):
        options = CommOptions(algorithm="ring", protocol="LL", nccl_version=version)
        model = CollectiveModel(topo, options)
        return model, model.plan("all_reduce", ranks, size)

    model, new = plan("2.26.2")
    _, old = plan("2.18.5")
    link_busbw = 2 * 7 / 8 / model.template("all_reduce", ranks, "ring").unit_time_s
    cap = ll_max_bw_Bps("a100", 1) / link_busbw
    assert cap < 0.5   # the cap binds 2.26's rating, not 2.18's
    assert old.transfer_s / new.transfer_s == pytest.approx(min(0.5, cap) / 0.25, rel=1e-6)


def test_hopper_one_node_ll_cap_by_release():
    # tuning.cc llMaxBws: Hopper's one-node row 87.7 GB/s up to v2.20.5-1, 141 from
    # v2.21.5-1; Ampere's 87.7 and the Intel multi-node row (39 at 2 nodes) never moved.
    assert ll_max_bw_Bps("h100", 1, "2.18.5") == pytest.approx(87.7e9)
    assert ll_max_bw_Bps("h200", 1, "2.20.5") == pytest.approx(87.7e9)
    assert ll_max_bw_Bps("h100", 1, "2.21.5") == pytest.approx(141e9)
    assert ll_max_bw_Bps("h100", 1) == pytest.approx(141e9)
    assert ll_max_bw_Bps("a100", 1, "2.18.5") == ll_max_bw_Bps("a100", 1) == pytest.approx(87.7e9)
    assert ll_max_bw_Bps("h100", 2, "2.18.5") == ll_max_bw_Bps("h100", 2) == pytest.approx(39e9)


def test_8xh100_ring_ll_under_2_18_is_capped_lower():
    # One node of 8 x H100, ring LL forced at 4 MiB: 2.18's rating (x 1/4) and cap (87.7)
    # make it slower than the newest release's (x .5, 141).
    topo = build("dgx-h100")
    ranks, size = tuple(range(8)), 4 * MIB
    times = {v: CollectiveModel(topo, CommOptions(algorithm="ring", protocol="LL",
                                                  nccl_version=v)).plan("all_reduce", ranks,
                                                                        size).transfer_s
             for v in ("2.18.5", "2.26.2")}
    assert times["2.18.5"] > times["2.26.2"]


def _two_nodes_one_gpu_each():
    """Two DGX H100 nodes, one GPU of each: ranks 0 and 8 (one GPU per node)."""
    return build("dgx-h100x2"), (0, 8)


def test_one_gpu_per_node_takes_tree_net_latency_from_2_23():
    # tuning.cc v2.23.4-1: "With ppn=1 latencies are fully exposed, use the Tree network
    # latency"; v2.22.3-1 and older price each algorithm's own NET latency.
    from simulator.network.constants import hw_latency_s
    topo, ranks = _two_nodes_one_gpu_each()

    def latency(version):
        options = CommOptions(algorithm="ring", protocol="LL", nccl_version=version)
        return CollectiveModel(topo, options).plan("all_gather", ranks, 1024).latency_s

    tree_net = hw_latency_s("net", "tree", "LL", "2.23.4")
    ring_net = hw_latency_s("net", "ring", "LL", "2.22.3")
    assert tree_net != ring_net
    assert latency("2.23.4") - latency("2.22.3") == pytest.approx(tree_net - ring_net,
                                                                  abs=1e-9)


def test_one_gpu_per_node_ring_ll128_is_discounted_before_2_23():
    # tuning.cc v2.18.5-1 .. v2.22.3-1: ring LL128 at ppn < 2 rates 0.7 of busBw, not
    # 0.92 (120/128); v2.23.4-1 drops the discount. The transfer part carries it.
    topo, ranks = _two_nodes_one_gpu_each()

    def transfer(version, protocol="LL128"):
        options = CommOptions(algorithm="ring", protocol=protocol, nccl_version=version)
        return CollectiveModel(topo, options).plan("all_gather", ranks, 64 * MIB).transfer_s

    # Simple carries the payload at 1.0: LL128's transfer over it is 1 / its fraction
    assert transfer("2.22.3") / transfer("2.22.3", "Simple") == pytest.approx(1 / 0.7,
                                                                               rel=1e-6)
    assert transfer("2.23.4") < transfer("2.22.3")   # 0.92, or Hopper's per-channel cap
    # eight GPUs per node keep 0.92 in every release
    eight = CommOptions(algorithm="ring", protocol="LL128", nccl_version="2.22.3")
    new = CommOptions(algorithm="ring", protocol="LL128", nccl_version="2.23.4")
    group = tuple(range(16))
    assert (CollectiveModel(topo, eight).plan("all_gather", group, 64 * MIB).transfer_s
            == pytest.approx(CollectiveModel(topo, new).plan("all_gather", group,
                                                             64 * MIB).transfer_s))


@pytest.mark.parametrize("version,ppn,expected", [
    ("2.22.3", 1, 0.7), ("2.18.5", 1, 0.7), ("2.23.4", 1, 0.92), ("2.22.3", 8, 0.92),
    (None, 1, 0.92)])
def test_ring_ll128_rating_by_release_and_gpus_per_node(version, ppn, expected):
    assert ring_efficiency("all_gather", "LL128", 2, ppn, version) == pytest.approx(expected)
    assert ring_efficiency("all_gather", "Simple", 2, ppn, version) == 1.0
