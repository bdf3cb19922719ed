"""How many channels (CUDA blocks) NCCL gives one collective, and the chunks they move.

Sources: NVIDIA/nccl at commit 5067397c (2.30.7):
  * src/enqueue.cc `topoGetAlgoInfo`: ring and tree drop channels while
    nBytes < nChannels x nThreads x threadThreshold; NVLS and NVLS_Tree always use
    `nvlsChannels`; CollNet its own count.
  * src/transport/nvls.cc `ncclNvlsTuning`: nvlsChannels 16 on Hopper (SM90); on Blackwell
    (SM100) 24 in one NVLink domain, 32 across domains, then the SM100 multi-node tuning
    by node count, NIC speed and GPUs per node.
  * src/enqueue.cc `calcCollChunking`: the NVLS and NVLS_Tree chunk size shrinks with the
    message (a chunk per concurrent op: channels x NVLS heads).
  * src/graph/connect.cc: the ring graph's search channels are duplicated (x2), and on
    SM90+ multi-node doubled again below 16 when the intra-node speed is > 45 GB/s.
  * src/include/comm.h thread thresholds (LL 8 x nRanks for ring, LL128 8, Simple 64
    bytes per thread), src/include/device.h thread counts (LL and Simple 512, LL128 640).
"""
from __future__ import annotations

import math

from .constants import arch_of
from .tuning_versions import (NVLS_EVEN_CHANNEL_SPLIT_FROM,
                              NVLS_SM100_ONE_DOMAIN_CHANNELS_FROM,
                              NVLS_SM100_TREE_TUNING_FROM,
                              NVLS_TREE_CHUNK_FROM_NVLS_CHUNKSIZE, released_before)

# NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS [device.h]; Simple ring adds a sync warp, which the
# channel test does not count.
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
# NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD [comm.h]; ring LL multiplies by nRanks [tuning.cc].
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# Ring graph search channels NCCL finds on an NVSwitch node: one per NIC across nodes
# (the graph pairs each channel with a NIC, DGX H100/B200 have 8), and, in one node,
# enough for the GPU's NVLink bandwidth at the search's per-channel speeds (sm90: 24-60
# GB/s, sm100: 40-90 [search.cc speed arrays]). Assumption: 16 search channels in one
# node (NCCL's INIT log on 8 x H100 reports "32 coll channels", i.e. 16 x 2). MAXCHANNELS
# is 64 [device.h].
ONE_NODE_SEARCH_CHANNELS = 16
# Ampere: NCCL's search (v2.18.5-1 search.cc) starts at the first speedArrayIntra entry
# under the GPU's NVLink bandwidth, 12 links x SM80_NVLINK_BW 20 GB/s = 240 GB/s [topo.h]:
# 6 rings at 40 GB/s, duplicated to 12 at 20 (bwIntra >= 25), then x2 in connect.cc = 24
# coll channels, as NCCL's log of 8 x A100 SXM4 on NVSwitch shows ("Channel 23/24",
# NVIDIA/nccl-tests issue 100). The speeds, SM80_NVLINK_BW and the duplication rule are
# the same at 5067397c.
SEARCH_CHANNELS_ONE_NODE_BY_ARCH = {"ampere": 12}
MAX_CHANNELS = 64
# The ring graph searches at most MAXCHANNELS / 2 channels [init.cc]; trees reuse them.
MAX_RING_SEARCH_CHANNELS = MAX_CHANNELS // 2
# NVLS channels [nvls.cc NVLS_NCHANNELS_SM90, _SM100, _SM100_NVL].
NVLS_CHANNELS_SM90, NVLS_CHANNELS_SM100_MULTI, NVLS_CHANNELS_SM100_ONE = 16, 32, 24
# NVLS heads: the NVLS graph has at most NCCL_MAX_NVLS_ARITY (32) channels, one per GPU
# that reaches a NIC [search.cc: maxChannels = min(NCCL_MAX_NVLS_ARITY, GPUs)].
MAX_NVLS_ARITY = 32
# NCCL_NVLS_CHUNKSIZE default 128 KiB [nvls.cc]; NVLS_Tree's max chunk 64 KiB from 4
# nodes on, else the chunk size [nvls.cc ncclNvlsTuning].
NVLS_CHUNK_BYTES = 128 * 1024


# Per-channel speeds the graph search tries, fastest first (GB/s) [search.cc
# sm90SpeedArrayIntra, sm100SpeedArrayIntra, speedArrayIntra].
SPEED_ARRAY_INTRA = {
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
    "other": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
}


def nvls_search_speed_GBps(arch: str, heads: int, nvlink_GBps: float) -> float:
    """Per-head speed NCCL's NVLS graph search settles on in one domain: the fastest speed
    at which every GPU's NVLink carries all heads' traffic, its own head's twice
    [search.cc ncclTopoSearchTryNvls: NVS<->GPU paths of each GPU, x2 for the head]."""
    speeds = SPEED_ARRAY_INTRA.get(arch, SPEED_ARRAY_INTRA["other"])
    for speed in speeds:
        if (heads + 1) * speed <= nvlink_GBps * (1 + 1e-9):
            return speed
    return speeds[-1]


def one_node_search_channels(arch: str) -> int:
    """Ring graph channels NCCL's search finds in one NVSwitch node, before connect.cc
    duplicates them."""
    return SEARCH_CHANNELS_ONE_NODE_BY_ARCH.get(arch, ONE_NODE_SEARCH_CHANNELS)


def coll_channels(arch: str, nodes: int, rails: int) -> int:
    """comm->nChannels for ring/tree: the ring graph's channels, duplicated [connect.cc]."""
    search = one_node_search_channels(arch) if nodes <= 1 else min(
        max(rails, 1), MAX_RING_SEARCH_CHANNELS)
    channels = 2 * search
    if arch in ("hopper", "blackwell") and nodes > 1 and channels < 16:
        channels *= 2   # "Use 4 compute channels per search channel ... on <8 PPN"
    return min(channels, MAX_CHANNELS)


def nvls_channels(arch: str, nodes: int, ppn: int, nic_GBps: float,
                  version: str | None = None) -> int:
    """comm->nvlsChannels of the NCCL release [nvls.cc ncclNvlsTuning,
    ncclNvlsTreeSm100Tuning; before 2.27 and 2.30: tuning_versions]."""
    if arch != "blackwell":
        return NVLS_CHANNELS_SM90
    if released_before(version, NVLS_SM100_ONE_DOMAIN_CHANNELS_FROM):
        return NVLS_CHANNELS_SM100_MULTI
    if released_before(version, NVLS_SM100_TREE_TUNING_FROM):
        return NVLS_CHANNELS_SM100_ONE if nodes <= 1 else NVLS_CHANNELS_SM100_MULTI
    if nodes <= 1:
        return NVLS_CHANNELS_SM100_ONE
    if nodes == 2 and nic_GBps >= 48:
        return 32
    if nic_GBps >= 96:
        return 24 if ppn <= 8 else 32
    if nic_GBps >= 48:
        return 24
    return NVLS_CHANNELS_SM100_MULTI


def tuned_channels(base: int, algorithm: str, protocol: str, size_bytes: float,
                   n: int) -> int:
    """Channels a ring/tree collective of `size_bytes` runs on [enqueue.cc topoGetAlgoInfo]."""
    if algorithm not in ("ring", "tree"):
        return base
    threshold = THREAD_THRESHOLD[protocol] * (n if algorithm == "ring" and protocol == "LL"
                                              else 1)
    nc = base
    while nc >= 2 and size_bytes < nc * MAX_THREADS[protocol] * threshold:
        nc -= 1
    return nc


def nvls_tree_max_chunk(arch: str, nodes: int, ppn: int, nic_GBps: float,
                        nic_behind_switch: bool, version: str | None = None,
                        simple_buffsize_bytes: int = 0) -> tuple[int, int]:
    """(nvlsChunkSize, nvlsTreeMaxChunkSize) [nvls.cc ncclNvlsTuning and, on Blackwell
    across nodes from 2.30, ncclNvlsTreeSm100Tuning: by node count, NIC speed, GPUs per
    node and whether the GPU reaches its NIC through a PCIe switch (PATH_PXB)]. Before
    2.21 an NVLS_Tree chunk starts at the Simple step (NCCL_BUFFSIZE / NCCL_STEPS), not
    at the NVLS chunk size (tuning_versions)."""
    chunk, tree_max = NVLS_CHUNK_BYTES, 0
    if released_before(version, NVLS_TREE_CHUNK_FROM_NVLS_CHUNKSIZE):
        step = (simple_buffsize_bytes or DEFAULT_SIMPLE_BUFFSIZE_BYTES) // NCCL_STEPS
        return step, (65536 if nodes >= 4 else step)
    if arch == "blackwell" and nodes > 1 and not released_before(
            version, NVLS_SM100_TREE_TUNING_FROM):
        if nodes == 2 and nic_GBps >= 48:
            tree_max = 128 * 1024
            if ppn <= 4:
                chunk = tree_max = 256 * 1024
            elif ppn >= 16 or (ppn <= 8 and nic_behind_switch and nic_GBps < 96):
                tree_max = 64 * 1024
        elif nic_GBps >= 96:
            if ppn <= 8:
                chunk = tree_max = 256 * 1024
            else:
                tree_max = 128 * 1024 if ppn < 32 else 64 * 1024
        elif nic_GBps >= 48:
            tree_max = 64 * 1024 if nic_behind_switch else 128 * 1024
    if tree_max == 0:
        tree_max = 65536 if nodes >= 4 else chunk
    return chunk, tree_max


def nvls_chunk_bytes(algorithm: str, size_bytes: float, channels: int, heads: int,
                     chunk: int = NVLS_CHUNK_BYTES, tree_max: int = NVLS_CHUNK_BYTES) -> int:
    """The chunk an NVLS or NVLS_Tree collective moves per step [enqueue.cc calcCollChunking]."""
    ops = channels * heads
    if algorithm == "nvls":
        chunk = min(chunk, NVLS_CHUNK_BYTES)
        for factor, limit in ((64, 65536), (8, 32768), (2, 16384)):
            if size_bytes < factor * ops * chunk and chunk > limit:
                chunk = limit
        return chunk
    chunk = min(chunk, tree_max)
    for factor, limit in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if size_bytes < factor * ops * chunk and chunk > limit:
            chunk = limit
    return chunk


def nvls_active_channels(size_bytes: float, channels: int, heads: int, chunk_bytes: int,
                         version: str | None = None) -> int:
    """Channels that carry data in an NVLS or NVLS_Tree all-reduce. Up to NCCL 2.19 each
    channel takes a block of heads x chunk bytes per loop, so a smaller message runs on
    ceil(size / (heads x chunk)) channels; from 2.20.3 the count is split over all of
    them (tuning_versions)."""
    if not released_before(version, NVLS_EVEN_CHANNEL_SPLIT_FROM):
        return channels
    block = max(heads * chunk_bytes, 1)
    return max(1, min(channels, math.ceil(size_bytes / block)))


# The ring's chunk: what one channel moves for one rank in one pass of the ring's loop
# [enqueue.cc calcCollChunking: stepSize = buffSizes[protocol] / NCCL_STEPS; a Simple
# ring takes chunkSteps = NCCL_STEPS / 2 steps (ALLREDUCE/ALLGATHER/REDUCESCATTER_
# CHUNKSTEPS, collectives.h), LL half a step (its flags), LL128 a step less its flag words
# (120 of 128 bytes); all_reduce.h / all_gather.h runRing: a pass covers nranks chunks
# per channel]. buffSizes [init.cc computeBuffSizes]: Simple DEFAULT_BUFFSIZE 4 MiB
# (NCCL_BUFFSIZE), LL 8 lines x 512 threads x NCCL_STEPS x 16 bytes, LL128 120 elements
# x 640 threads x NCCL_STEPS x 8 bytes [device.h].
NCCL_STEPS = 8
DEFAULT_SIMPLE_BUFFSIZE_BYTES = 1 << 22
LL_BUFFSIZE_BYTES = 8 * 512 * NCCL_STEPS * 16
LL128_BUFFSIZE_BYTES = 120 * 640 * NCCL_STEPS * 8
RING_SIMPLE_CHUNK_STEPS = NCCL_STEPS // 2


def ring_chunk_bytes(protocol: str, simple_buffsize_bytes: int = 0) -> int:
    """Bytes one channel moves per rank in one pass of a ring all-reduce, all-gather or
    reduce-scatter (`simple_buffsize_bytes`: NCCL_BUFFSIZE, 0 = NCCL's 4 MiB)."""
    if protocol == "LL":
        return LL_BUFFSIZE_BYTES // NCCL_STEPS // 2
    if protocol == "LL128":
        return LL128_BUFFSIZE_BYTES // NCCL_STEPS // 128 * 120
    buffsize = simple_buffsize_bytes or DEFAULT_SIMPLE_BUFFSIZE_BYTES
    return buffsize // NCCL_STEPS * RING_SIMPLE_CHUNK_STEPS


def ring_passes(size_bytes: float, ranks: int, channels: int, chunk_bytes: int) -> int:
    """Passes of the ring's loop: the collective's S (all-reduce buffer, all-gather
    output, reduce-scatter input) over channels x ranks x chunk [all_reduce.h runRing:
    loopCount = nranks x chunkCount over the channel's share; all_gather.h likewise]."""
    per_pass = max(channels, 1) * max(ranks, 1) * max(chunk_bytes, 1)
    return max(1, math.ceil(size_bytes / per_pass))


def device_arch(device_name: str) -> str:
    """NCCL's compute-capability class of a device (volta/ampere/hopper/blackwell)."""
    return arch_of(device_name)
