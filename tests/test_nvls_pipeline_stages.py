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
