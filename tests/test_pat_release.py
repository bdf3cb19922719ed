"""PAT (NCCL's Parallel Aggregated Trees) runs all-gather and reduce-scatter with one GPU
per node, and only from NCCL 2.23: NVIDIA/nccl src/graph/tuning.cc has ncclPatEnable and
NCCL_ALGO_PAT at v2.23.4-1 and neither at v2.22.3-1."""
from __future__ import annotations

import pytest

from simulator.network.algorithms import available, group_shape
from topologies import build


@pytest.mark.parametrize("version,pat", [("2.18.5", False), ("2.22.3", False),
                                         ("2.23.4", True), ("2.26.2", True), (None, True)])
def test_pat_with_one_gpu_per_node_from_2_23(version, pat):
    topo = build("dgx-h100x2")
    one_per_node = group_shape(topo, (0, 8))
    for op in ("all_gather", "reduce_scatter"):
        assert ("pat" in available(topo, one_per_node, op, version)) is pat
    # two GPUs per node: never PAT
    assert "pat" not in available(topo, group_shape(topo, (0, 1, 8, 9)), "all_gather", version)
