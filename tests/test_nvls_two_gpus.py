"""NVLS needs more than 2 GPUs of the communicator per node before NCCL 2.28.7.

NVIDIA/nccl src/transport/nvls.cc ncclNvlsInit returns without multicast support (so
neither NVLS nor NVLS_Tree runs) when `gpuCount <= 2` in v2.18.5-1 .. v2.28.3-1
(v2.21-v2.24: also an MNNVL clique of <= 2), and only when `gpuCount < 2` from
v2.28.7-1. gpuCount is the number of the communicator's GPUs in the node's topology.
"""
from __future__ import annotations

import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.algorithms import available, group_shape
from topologies import build

GIB = 1 << 30


@pytest.mark.parametrize("version,ranks,nvls", [
    ("2.26.6", (0, 1), False),      # gcp-a4-b200-2's release: 2 GPUs, no multicast
    ("2.28.3", (0, 1), False),      # last release with gpuCount <= 2
    ("2.28.7", (0, 1), True),       # gpuCount < 2 from here
    (None, (0, 1), True),           # newest tables
    ("2.26.6", (0, 1, 2), True),    # 3 GPUs: NVLS in every release
])
def test_nvls_in_one_node_by_gpu_count_and_release(version, ranks, nvls):
    topo = build("dgx-b200")
    algos = available(topo, group_shape(topo, ranks), "all_reduce", version)
    assert ("nvls" in algos) is nvls
    assert ("nvls" in available(topo, group_shape(topo, ranks), "all_gather", version)) is nvls


@pytest.mark.parametrize("version,ranks,nvls_tree", [
    ("2.26.2", (0, 1, 8, 9), False),        # 2 GPUs per node
    ("2.26.2", (0, 1, 2, 8, 9, 10), True),  # 3 GPUs per node
    ("2.28.7", (0, 1, 8, 9), True),
])
def test_nvls_tree_by_gpus_per_node_and_release(version, ranks, nvls_tree):
    topo = build("dgx-b200x2")
    algos = available(topo, group_shape(topo, ranks), "all_reduce", version)
    assert ("nvls_tree" in algos) is nvls_tree


def test_forced_nvls_on_two_gpus_falls_back_before_2_28_7():
    topo = build("dgx-b200")
    old = CollectiveModel(topo, CommOptions(algorithm="nvls", nccl_version="2.26.6"))
    new = CollectiveModel(topo, CommOptions(algorithm="nvls", nccl_version="2.28.7"))
    assert old.plan("all_reduce", (0, 1), GIB).algorithm != "nvls"
    assert new.plan("all_reduce", (0, 1), GIB).algorithm == "nvls"
