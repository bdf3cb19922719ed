"""NVLS channels left idle by NCCL releases before 2.20.3.

Source: NVIDIA/nccl v2.18.5-1 src/collectives/device/all_reduce.h and v2.19.4-1
src/device/all_reduce.h (NVLS and NVLS_Tree): each channel `bid` takes the block at
gridOffset + bid * nHeads * chunkSize of every loop, so a message below
channels x heads x chunk runs on ceil(size / (heads x chunk)) channels. From v2.20.3-1
enqueue.cc splits the count over all channels (countPerChannels, 4 KiB aligned).
On 8 x H100 (16 NVLS channels, 8 heads) a 128 KiB all-reduce has a 16 KiB chunk
(calcCollChunking), so 2.18.5 runs it on one channel; 2 MiB fills all 16.
"""
import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.channels import nvls_active_channels
from topologies import build

KIB = 1 << 10
MIB = 1 << 20


@pytest.mark.parametrize("version,size,expected", [
    ("2.18.5", 64 * KIB, 1), ("2.18.5", 128 * KIB, 1), ("2.19.3", 256 * KIB, 2),
    ("2.18.5", 1 * MIB, 8), ("2.18.5", 2 * MIB, 16), ("2.18.5", 64 * MIB, 16),
    ("2.20.5", 128 * KIB, 16), ("2.26.2", 64 * KIB, 16), (None, 64 * KIB, 16),
])
def test_busy_channels_by_release(version, size, expected):
    assert nvls_active_channels(size, 16, 8, 16 * KIB, version) == expected


def _plan(version, size):
    model = CollectiveModel(build("dgx-h100"), CommOptions(algorithm="nvls",
                                                           nccl_version=version))
    return model.plan("all_reduce", tuple(range(8)), size)


def test_one_busy_channel_streams_at_a_sixteenth():
    # 128 KiB: the 2.18.5 plan's fill plus transfer is 16 x the 2.20.5 plan's (the same
    # NVLS latency table for both eras: 23 us).
    old, new = _plan("2.18.5", 128 * KIB), _plan("2.20.5", 128 * KIB)
    assert (old.fill_s + old.transfer_s) == pytest.approx(16 * (new.fill_s + new.transfer_s))
    assert old.closed_form_s > new.closed_form_s + 15e-6


def test_full_channels_unchanged():
    old, new = _plan("2.18.5", 4 * MIB), _plan("2.20.5", 4 * MIB)
    assert old.closed_form_s == pytest.approx(new.closed_form_s)
