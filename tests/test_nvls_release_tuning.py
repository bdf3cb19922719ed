"""NVLS chunk and channel counts by NCCL release (NVIDIA/nccl at each tag):

  * NVLS_Tree's first chunk: the Simple step NCCL_BUFFSIZE / NCCL_STEPS = 4 MiB / 8 =
    512 KiB up to 2.20 (v2.18.5-1 enqueue.cc calcCollChunking, v2.20.5-1
    computeCollChunkInfo), NCCL_NVLS_CHUNKSIZE 128 KiB from 2.21 (v2.21.5-1); 64 KiB from
    4 nodes on in every release before the SM100 tuning.
  * Blackwell nvlsChannels: NVLS_NCHANNELS_SM100 32 up to 2.26 (v2.26.6-1 nvls.cc); from
    2.27 NVLS_NCHANNELS_SM100_NVL 24 in one NVLink domain (v2.27.3-1 ncclNvlsInit); from
    2.30 ncclNvlsTreeSm100Tuning across nodes (v2.30.3-1).
"""
from __future__ import annotations

import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.channels import nvls_channels, nvls_chunk_bytes, nvls_tree_max_chunk
from simulator.network.tuning_versions import released_before
from topologies import build

KIB = 1024
GIB = 1 << 30


@pytest.mark.parametrize("version,nodes,expected", [
    ("2.18.5", 2, (512 * KIB, 512 * KIB)),   # the Simple step, 4 MiB / 8
    ("2.20.5", 8, (512 * KIB, 64 * KIB)),    # 64 KiB from 4 nodes on
    ("2.21.5", 2, (128 * KIB, 128 * KIB)),   # NCCL_NVLS_CHUNKSIZE
    ("2.26.2", 20, (128 * KIB, 64 * KIB)),
])
def test_nvls_tree_first_chunk_by_release(version, nodes, expected):
    assert nvls_tree_max_chunk("hopper", nodes, 8, 48.0, True, version) == expected


def test_a_larger_buffsize_grows_the_old_first_chunk():
    assert nvls_tree_max_chunk("hopper", 2, 8, 48.0, True, "2.18.5", 8 << 20) == (
        1024 * KIB, 1024 * KIB)


def test_sm100_tree_tuning_only_from_2_30():
    # 2 nodes of 8 B200 behind PCIe switches at 400 Gb/s: 64 KiB in 2.30's SM100 tuning,
    # NCCL_NVLS_CHUNKSIZE before it.
    assert nvls_tree_max_chunk("blackwell", 2, 8, 48.0, True, "2.30.7") == (128 * KIB,
                                                                             64 * KIB)
    assert nvls_tree_max_chunk("blackwell", 2, 8, 48.0, True, "2.26.2") == (128 * KIB,
                                                                             128 * KIB)
    # GB200 racks (72 GPUs per domain) on 2 racks: 64 KiB in 2.30, 128 KiB in 2.26.
    assert nvls_tree_max_chunk("blackwell", 2, 72, 48.0, False, "2.30.7")[1] == 64 * KIB
    assert nvls_tree_max_chunk("blackwell", 2, 72, 48.0, False, "2.26.2")[1] == 128 * KIB


@pytest.mark.parametrize("version,nodes,channels", [
    ("2.26.2", 1, 32), ("2.26.2", 2, 32),     # NVLS_NCHANNELS_SM100
    ("2.27.3", 1, 24), ("2.27.3", 2, 32),     # + NVLS_NCHANNELS_SM100_NVL in one domain
    ("2.30.7", 1, 24), (None, 1, 24),
])
def test_blackwell_nvls_channels_by_release(version, nodes, channels):
    assert nvls_channels("blackwell", nodes, 8, 48.0, version) == channels


def test_hopper_keeps_16_nvls_channels_in_every_release():
    for version in ("2.18.5", "2.26.2", None):
        assert nvls_channels("hopper", 2, 8, 48.0, version) == 16


def test_unknown_release_is_the_newest():
    assert not released_before("unknown", (2, 30, 0))
    assert released_before("2.29.7", (2, 30, 0))


def test_old_release_nvls_tree_fills_with_its_larger_chunk():
    # 2 x 8 H100 at 1 GiB: 2.18.5 moves 256 KiB chunks (512 KiB halved once by the size
    # ladder), 2.26 128 KiB; the fill grows with the chunk.
    topo = build("dgx-h100x2")
    ranks = tuple(range(16))
    old = CollectiveModel(topo, CommOptions(algorithm="nvls_tree", nccl_version="2.18.5"))
    new = CollectiveModel(topo, CommOptions(algorithm="nvls_tree", nccl_version="2.26.2"))
    p_old, p_new = (m.plan("all_reduce", ranks, GIB) for m in (old, new))
    assert (p_old.chunk_bytes, p_new.chunk_bytes) == (256 * KIB, 128 * KIB)
    assert p_old.fill_s == pytest.approx(2 * p_new.fill_s, rel=1e-6)
    assert nvls_chunk_bytes("nvls_tree", GIB, 16, 8, 512 * KIB, 512 * KIB) == 256 * KIB
