"""NVLS_Tree across GB200 NVL72 racks: each NVLS head's share crosses the network at
NVLS_TREE_HEAD_NET_BPS, once each way on 2 racks and twice beyond (double binary tree).

The rate is estimated from CoreWeave's 2-rack nccl-tests run and scored on its 20-rack
run (simulator/network/constants.py says how); these tests check the mechanism: the
load doubling past 2 racks, the split between NCCL's choice and the plan's time, and
that 8-GPU nodes (every GPU a head) are untouched.
"""
import pytest

import simulator.network.collectives as collectives
from simulator.network import CollectiveModel, bus_factor
from simulator.network.constants import NVLS_TREE_HEAD_NET_BPS
from topologies import build

GIB = 1 << 30


def busbw_GBps(preset: str, size: float) -> tuple[float, str]:
    topo = build(preset)
    n = topo.world_size
    plan = CollectiveModel(topo).plan("all_reduce", tuple(range(n)), size)
    return size / plan.closed_form_s * bus_factor("all_reduce", n) / 1e9, plan.algorithm


def test_two_racks_run_at_twice_the_head_rate():
    # 2 racks: algbw -> 32 heads x 13 GB/s x 2 (each NIC carries its share once each
    # way), busbw = 2 x 143/144 of that, less latency and pipeline fill at 16 GiB.
    bw, algo = busbw_GBps("nvl72x2", 16 * GIB)
    assert algo == "nvls_tree"
    ceiling = 32 * NVLS_TREE_HEAD_NET_BPS * 2 * 143 / 144 / 1e9
    assert 0.95 * ceiling < bw <= ceiling


def test_more_racks_halve_the_network_rate():
    # Past 2 racks an inner node's head NIC carries its share twice each way (up from
    # two children in one tree, down to them), so the bus bandwidth about halves.
    two, _ = busbw_GBps("nvl72x2", 16 * GIB)
    four, algo = busbw_GBps("nvl72x4", 16 * GIB)
    assert algo == "nvls_tree"
    assert four / two == pytest.approx(0.5, rel=0.06)


def test_head_rate_slows_the_plan_not_nccls_choice(monkeypatch):
    # NCCL's tuner prices NVLS_Tree at the NVLS graph's bwInter, not at the heads' real
    # network rate: a much slower rate keeps NVLS_Tree chosen and only lengthens it.
    topo = build("nvl72x4")
    ranks = tuple(range(topo.world_size))
    base = CollectiveModel(topo).plan("all_reduce", ranks, 4 * GIB)
    monkeypatch.setattr(collectives, "NVLS_TREE_HEAD_NET_BPS", NVLS_TREE_HEAD_NET_BPS / 4)
    slow = CollectiveModel(topo).plan("all_reduce", ranks, 4 * GIB)
    assert base.algorithm == slow.algorithm == "nvls_tree"
    assert slow.transfer_s == pytest.approx(4 * base.transfer_s, rel=0.02)


def test_eight_gpu_nodes_are_not_limited_by_it(monkeypatch):
    # HGX nodes: every GPU is an NVLS head with its own NIC; the estimate does not apply.
    topo = build("dgx-h100x2")
    ranks = tuple(range(16))
    base = CollectiveModel(topo).plan("all_reduce", ranks, GIB)
    monkeypatch.setattr(collectives, "NVLS_TREE_HEAD_NET_BPS", 1e6)
    same = CollectiveModel(topo).plan("all_reduce", ranks, GIB)
    assert base.algorithm == "nvls_tree"
    assert same.closed_form_s == base.closed_form_s
