"""Tree with the LL protocol across nodes follows NCCL's tuning model.

NCCL caps Tree/LL bus bandwidth at llMaxBw (39 GB/s on 2 nodes with Intel hosts) in
ncclTopoTuneModel, then multiplies the capped bandwidth by treeCorrectionFactor[LL][log2(
S / 64)] in ncclTopoGetAlgoTime, and converts bus to algorithm bandwidth with Tree's
ratio 0.5 [NVIDIA/nccl src/graph/tuning.cc]. On 2 x DGX H100 the links allow far more
than 39 GB/s, so the cap binds and the transfer part of a Tree/LL all-reduce of S bytes is
S / (39 GB/s x 0.5 x correction). If the correction were left off the cap (as it once
was), 256 KiB would move 2.5 x faster than NCCL's model says, and 2-node all-reduces of
64-512 KiB would be priced below their measured times (2 x HGX H100, 64 KiB: 33.8 us
[NVIDIA/nccl-tests issue 309], see test_collectives_golden.py).
"""
import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.constants import LL_MAX_BW_MULTI_NODE_BPS, tree_correction
from topologies import build

KIB = 1 << 10


@pytest.fixture(scope="module")
def tree_ll():
    return CollectiveModel(build("dgx-h100x2"), CommOptions("tree", "LL"))


@pytest.mark.parametrize("size", [16 * KIB, 64 * KIB, 256 * KIB, 512 * KIB])
def test_tree_ll_transfer_is_nccl_capped_and_corrected(tree_ll, size):
    plan = tree_ll.plan("all_reduce", tuple(range(16)), size)
    assert (plan.algorithm, plan.protocol) == ("tree", "LL")
    algbw_Bps = LL_MAX_BW_MULTI_NODE_BPS[0] * 0.5 * tree_correction("LL", size)
    assert plan.transfer_s == pytest.approx(size / algbw_Bps, rel=1e-6)


def test_correction_slows_mid_sizes_per_byte(tree_ll):
    # treeCorrectionFactor[LL]: 0.7 at 16 KiB (index log2(16 KiB / 64) = 8) and 0.4 at
    # 256 KiB (index 12): per byte, 256 KiB moves 0.7 / 0.4 = 1.75 x slower.
    ranks = tuple(range(16))
    per_byte = [tree_ll.plan("all_reduce", ranks, s).transfer_s / s for s in (16 * KIB, 256 * KIB)]
    assert per_byte[1] / per_byte[0] == pytest.approx(
        tree_correction("LL", 16 * KIB) / tree_correction("LL", 256 * KIB), rel=1e-6)
    assert per_byte[1] > per_byte[0]
