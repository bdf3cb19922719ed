"""NCCL's latency constants as each release shipped them.

The collective model prices latency with NCCL's tuning model (constants.py holds the
tables of NVIDIA/nccl 2.30.7). Earlier releases shipped other values, and a measurement
taken on one of them ran the latency NCCL chose by. The entries that differ, read from
src/graph/tuning.cc at each release tag of NVIDIA/nccl (baseLat / hwLat, later
ncclTunerConstantsDefaults):

  * up to 2.18.x (2.18.3 .. 2.18.6): Tree + Simple has no base latency; NVLS and NVLS_Tree
    carry a 23 us base latency and no NVLink per-step latency; NET per-step latency NVLS
    18, NVLS_Tree 19 us; NVLS_Tree pays 2 x (nNodes - 1) network steps (not
    2 x log2(nNodes)).
  * 2.19 .. 2.22: Tree + Simple has no base latency and 28 us per step on NVLink and NET;
    NVLS / NVLS_Tree 23 us on NVLink (25 from 2.21), NVLS_Tree 14 us per network step.
  * 2.23 .. 2.28.7: Tree + Simple base 8.4 and 4.0 / 14 us per step (as 2.30); NVLS_Tree
    14 us per network step.
  * from 2.28.9: the tables of constants.py (NVLS_Tree 20.9 us per network step).

The release's values steer NCCL's choice. The time of the chosen kernels takes a later
recalibration of an entry whose kernel did not change (RECALIBRATED_FROM).

NVLS tuning by release [NVIDIA/nccl src/transport/nvls.cc, src/enqueue.cc at each tag]:

  * up to 2.20.x an NVLS_Tree chunk starts at the Simple step, NCCL_BUFFSIZE / NCCL_STEPS
    (512 KiB by default), 64 KiB from 4 nodes on (v2.18.5-1 calcCollChunking, v2.20.5-1
    computeCollChunkInfo); from 2.21 at NCCL_NVLS_CHUNKSIZE (128 KiB), capped by
    NVLSTREE_MAX_CHUNKSIZE (64 KiB from 4 nodes on) (v2.21.5-1 computeCollChunkInfo).
  * NVLS (and NVLS_Tree) needs more than 2 GPUs of the communicator in a node up to
    2.28.3 (ncclNvlsInit returns without multicast support when gpuCount <= 2, v2.18.5-1
    .. v2.28.3-1; v2.21-v2.24 say the same of an MNNVL clique), 2 from 2.28.7
    (gpuCount < 2, v2.28.7-1).
  * Blackwell nvlsChannels: 32 up to 2.26.x (NVLS_NCHANNELS_SM100, v2.26.6-1); from 2.27
    24 in one NVLink domain (NVLS_NCHANNELS_SM100_NVL, v2.27.3-1 ncclNvlsInit); from 2.30
    the multi-node SM100 NVLS_Tree tuning sets channels and chunks by node count, NIC
    speed and GPUs per node (ncclNvlsTreeSm100Tuning, first in v2.30.3-1).
  * up to 2.19.x the NVLS and NVLS_Tree kernels give each channel (block `bid`) a
    contiguous nHeads x chunk of every loop (v2.18.5-1 src/collectives/device/
    all_reduce.h and v2.19.4-1 src/device/all_reduce.h: offset = gridOffset +
    bid*nvls->nHeads*chunkSize), so a message below channels x heads x chunk keeps the
    later channels idle; from 2.20.3 the host splits the count evenly over the channels
    (v2.20.3-1 enqueue.cc: countPerChannels = count / nChannels, 4 KiB aligned; the
    kernels read workCount / workOffset).

A version string that does not parse ("unknown", "") gets the newest tables.
"""
from __future__ import annotations

import re

US = 1e-6
# (first release it applies to, {(table, link, algorithm, protocol): microseconds}).
# table "base" ignores link; link is "nvlink" or "net" for table "hw".
_ERAS: tuple[tuple[tuple[int, int, int], dict[tuple[str, str, str, str], float]], ...] = (
    ((2, 28, 9), {}),
    ((2, 23, 0), {("hw", "net", "nvls_tree", "Simple"): 14.0}),
    ((2, 21, 0), {("base", "", "tree", "Simple"): 0.0,
                  ("hw", "nvlink", "tree", "Simple"): 28.0,
                  ("hw", "net", "tree", "Simple"): 28.0,
                  ("hw", "net", "nvls_tree", "Simple"): 14.0}),
    ((2, 19, 0), {("base", "", "tree", "Simple"): 0.0,
                  ("hw", "nvlink", "tree", "Simple"): 28.0,
                  ("hw", "net", "tree", "Simple"): 28.0,
                  ("hw", "nvlink", "nvls", "Simple"): 23.0,
                  ("hw", "nvlink", "nvls_tree", "Simple"): 23.0,
                  ("hw", "net", "nvls_tree", "Simple"): 14.0}),
    ((0, 0, 0), {("base", "", "tree", "Simple"): 0.0,
                 ("base", "", "nvls", "Simple"): 23.0,
                 ("base", "", "nvls_tree", "Simple"): 23.0,
                 ("hw", "nvlink", "nvls", "Simple"): 0.0,
                 ("hw", "nvlink", "nvls_tree", "Simple"): 0.0,
                 ("hw", "net", "nvls_tree", "Simple"): 19.0}),
)
# Before 2.19 NVLS_Tree's network latency grows with the node count, not its log
# [tuning.cc 2.18.x: 2 * (nNodes - 1) * hwLat[NET][NVLS_TREE]].
LINEAR_NVLS_TREE_BEFORE = (2, 19, 0)
# Entries a later release changed without changing the kernels they price: the newest
# value is NVIDIA's later measurement of the same kernel, so it prices the time of the
# releases listed (override_us timing), while NCCL's choice keeps the release's value.
# NVLS_Tree's latency per network step went from 14 to 20.9 us in 2.28.9, a release
# whose diff to 2.28.7 touches no NVLS_Tree device code (tuning.cc: this entry and
# Blackwell's N4 perChMaxNVLSTreeBw; release notes: a proxy-ordering fix, a GIN fix);
# from 2.26.2 to 2.28.9 the NVLS_Tree kernel is unchanged too (src/device/all_reduce.h
# differs by one ring call's signature, prims_simple.h by template plumbing)
# [NVIDIA/nccl v2.26.2-1, v2.28.7-1, v2.28.9-1]. Earlier releases are not checked and
# keep their own value.
RECALIBRATED_FROM = {("hw", "net", "nvls_tree", "Simple"): (2, 26, 2)}
# First releases of NVLS tuning changes (module docstring).
NVLS_TREE_CHUNK_FROM_NVLS_CHUNKSIZE = (2, 21, 0)
NVLS_SM100_ONE_DOMAIN_CHANNELS_FROM = (2, 27, 0)
NVLS_SM100_TREE_TUNING_FROM = (2, 30, 0)
NVLS_EVEN_CHANNEL_SPLIT_FROM = (2, 20, 3)
NVLS_TWO_GPUS_FROM = (2, 28, 7)
# One GPU per node: from 2.23 every algorithm's network step costs Tree's NET latency
# ("With ppn=1 latencies are fully exposed, use the Tree network latency", tuning.cc
# v2.23.4-1); before, each algorithm its own (v2.18.5-1 .. v2.22.3-1 interLat).
PPN1_TREE_NET_LATENCY_FROM = (2, 23, 0)
# PAT (all-gather / reduce-scatter with one GPU per node) first appears in 2.23: tuning.cc
# ncclPatEnable and NCCL_ALGO_PAT at v2.23.4-1, absent at v2.22.3-1.
PAT_FROM = (2, 23, 0)
# The releases whose tables the model carries, by (major, minor): the oldest era above was
# read at the 2.18.x tags, the newest tables (constants.py) are 2.30.7's.
MODELLED_RELEASES = ((2, 18), (2, 30))


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of an NCCL version string like '2.26.2' or '2.18.5+cuda12.2';
    None when it does not parse (the newest tables apply)."""
    match = re.match(r"\s*(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?(?![\d.])", version or "",
                     re.ASCII)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def modelled(version: str) -> bool:
    """Whether `version` parses and falls in MODELLED_RELEASES (a release asked for by
    name must be one the tables stand for; an unnamed one gets the newest)."""
    parsed = parse_version(version)
    return parsed is not None and MODELLED_RELEASES[0] <= parsed[:2] <= MODELLED_RELEASES[1]


def override_us(version: str | None, table: str, link: str, algorithm: str,
                protocol: str, timing: bool = False) -> float | None:
    """The release's value (us) of one latency entry where it differs from the newest
    tables, else None. With `timing`, an entry a later release only recalibrated
    (RECALIBRATED_FROM) gets the newest value: the release's value steers NCCL's choice,
    the recalibrated one prices the same kernel's time."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    key = (table, link if table == "hw" else "", algorithm, protocol)
    if timing and key in RECALIBRATED_FROM and parsed >= RECALIBRATED_FROM[key]:
        return None
    for first, entries in _ERAS:
        if parsed >= first:
            return entries.get((table, link if table == "hw" else "", algorithm, protocol))
    return None


def linear_nvls_tree(version: str | None) -> bool:
    """True where the release prices NVLS_Tree's network steps as 2 x (nNodes - 1)."""
    parsed = parse_version(version)
    return parsed is not None and parsed < LINEAR_NVLS_TREE_BEFORE


def released_before(version: str | None, first: tuple[int, int, int]) -> bool:
    """True where the release is older than `first`; False for an unknown release (the
    newest behaviour applies)."""
    parsed = parse_version(version)
    return parsed is not None and parsed < first
