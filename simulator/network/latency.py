"""Latency of one collective: NCCL's per-algorithm model, the NVLS pipeline fill, and the
host floor of nccl-tests' loop.

  * `nccl_latency_s`: NCCL's tuning model [NVIDIA/nccl src/graph/tuning.cc
    ncclTopoTuneModel, ncclTopoGetAlgoTime]: base latency + per-step hardware latencies
    (NVLink inside a domain, network across), by algorithm, protocol, GPU count and node
    count.
  * `nvls_fill_s`: NVLS and NVLS_Tree move the message in waves of channels x heads x
    chunk bytes [enqueue.cc calcCollChunking]; a chunk passes NVLS_STAGES kernel stages
    in one domain and, with NVLS_Tree, one network hop per tree level up and down. The
    pipeline streams at its slowest stage and fills in one wave through each of the
    others, each at its own rate (NVLink stages at the in-switch part's, network stages at
    the tree's).
  * `host_floor_s`: an nccl-tests iteration takes at least the host's enqueue of the
    collective on every GPU its process drives (`-g N`).
"""
from __future__ import annotations

import math

from .algorithms import GroupShape
from .channels import nvls_chunk_bytes, nvls_tree_max_chunk
from .constants import (COLLNET_ARITY_LAT_S, HOST_ENQUEUE_S, LATENCY_INTER_S,
                        NET_OVERHEAD_S, NVLS_STAGES, PAT_NET_DIVISOR, PAT_PER_RANK_LAT_S,
                        RING_PLATEAU_FACTOR, base_latency_s, hw_latency_s)
from .tuning_versions import PPN1_TREE_NET_LATENCY_FROM, linear_nvls_tree, released_before


def _log2i(x: int) -> int:
    return max(int(x).bit_length() - 1, 0)


def _net_latency_algo(algo: str, ppn: int, version: str | None) -> str:
    """Whose NET latency a network step of `algo` costs: with one GPU per node, Tree's
    from NCCL 2.23 on (tuning_versions.PPN1_TREE_NET_LATENCY_FROM), else its own."""
    if ppn == 1 and not released_before(version, PPN1_TREE_NET_LATENCY_FROM):
        return "tree"
    return algo


def nccl_latency_s(shape: GroupShape, op: str, algo: str, proto: str, size: float,
                   channels: int, latency_inter_s: float = LATENCY_INTER_S,
                   version: str | None = None, timing: bool = False) -> float:
    """NCCL tuning.cc latency of (algorithm, protocol) on this group; `latency_inter_s` is
    the net plugin's reported latency (graph->latencyInter); `version` the NCCL release
    whose constants apply (None: the newest) [tuning_versions]; `timing`: the time of
    the kernels, with later recalibrations of the release's entries (NCCL's choice uses
    the release's own)."""
    n, nodes, ppn = shape.n, shape.num_domains, shape.ppn
    multi = nodes > 1
    lat_algo = "ring" if algo in ("p2p", "hierarchical") else algo
    base = base_latency_s(lat_algo, proto, version)
    intra = hw_latency_s("nvlink", lat_algo, proto, version)
    inter = hw_latency_s("net", _net_latency_algo(lat_algo, ppn, version), proto,
                         version, timing)
    inter += latency_inter_s * (2 if proto == "Simple" else 1)
    net_oh = NET_OVERHEAD_S * (3 if proto == "Simple" else 1) if multi else 0.0
    step = max(intra, net_oh)
    if algo == "nvls":
        return base + intra + (inter if multi else 0.0)
    if algo == "nvls_tree":
        hops = 2 * (nodes - 1) if linear_nvls_tree(version) else 2 * _log2i(nodes)
        return base + intra + hops * inter
    if algo == "tree":
        return base + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    if algo == "collnet_direct":
        return base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * COLLNET_ARITY_LAT_S) + inter
    if algo == "collnet_chain":
        return base + 2 * (ppn - 1) * intra + inter
    if algo == "pat":
        return base + _log2i(nodes) * inter / PAT_NET_DIVISOR + n * PAT_PER_RANK_LAT_S
    if algo == "hierarchical":   # assumption: RS + AG ring steps inside, AR ring across
        return base + 2 * (ppn - 1) * step + 2 * (nodes - 1) * inter
    if op == "send_recv":        # assumption: one ring step (NCCL has no p2p model)
        return base + (inter if multi else intra)
    if op == "all_reduce":
        nsteps, n_inter = 2 * (n - 1), 2 * (nodes - 1)
    elif op in ("all_gather", "reduce_scatter", "all_to_all"):
        # all-to-all: assumption, priced like a ring all-gather (NCCL has no model)
        nsteps, n_inter = n - 1, nodes - 1
    else:
        nsteps, n_inter = n, nodes - 1
    lat = base + (nsteps - n_inter) * step + n_inter * inter
    if (op == "all_reduce" and proto == "Simple" and multi
            and size / (max(channels, 1) * n) >= 64):
        lat *= RING_PLATEAU_FACTOR
    return lat


def ring_pass_latency_s(shape: GroupShape, op: str, proto: str,
                        latency_inter_s: float = LATENCY_INTER_S,
                        version: str | None = None) -> float:
    """NCCL's per-step latencies of one pass of a ring all-reduce, all-gather or
    reduce-scatter: the steps of `nccl_latency_s` without the base latency [tuning.cc].

    NCCL's tuner prices these steps once. A message larger than one pass (channels x
    ranks x chunk, channels.ring_passes) runs the loop again, and every pass is again a
    chain of steps, each waiting for the previous rank's data: assumption, each further
    pass pays NCCL's per-step latencies once more (all_reduce.h / all_gather.h runRing).
    """
    n, nodes = shape.n, shape.num_domains
    intra = hw_latency_s("nvlink", "ring", proto, version)
    inter = hw_latency_s("net", _net_latency_algo("ring", shape.ppn, version), proto,
                         version)
    inter += latency_inter_s * (2 if proto == "Simple" else 1)
    step = max(intra, NET_OVERHEAD_S * (3 if proto == "Simple" else 1) if nodes > 1 else 0.0)
    if op == "all_reduce":
        nsteps, n_inter = 2 * (n - 1), 2 * (nodes - 1)
    else:
        nsteps, n_inter = n - 1, nodes - 1
    return (nsteps - n_inter) * step + n_inter * inter


def tree_depth(nodes: int) -> int:
    """Levels of NCCL's binary tree over `nodes` nodes [trees.cc ncclGetBtree]."""
    return (nodes - 1).bit_length() if nodes > 1 else 0


def nvls_fill_s(op: str, algo: str, shape: GroupShape, size: float, channels: int,
                heads: int, unit_time_s: float, arch: str = "hopper", nic_GBps: float = 0.0,
                nic_behind_switch: bool = True,
                net_unit_time_s: float | None = None, version: str | None = None,
                simple_buffsize_bytes: int = 0) -> tuple[float, int]:
    """(pipeline-fill seconds, chunk bytes) of an NVLS or NVLS_Tree collective.

    `unit_time_s` is the streaming time per byte of S of the NVLink stages, and
    `net_unit_time_s` that of the network stages (default: the same), so a wave of W bytes
    passes one stage in W x its unit time. A pipeline of stages streams at its slowest
    stage and fills in the time of the others: fill = wave x (sum of the stages' unit
    times - the largest). `version` (NCCL release) and `simple_buffsize_bytes`
    (NCCL_BUFFSIZE) set the chunk (channels.nvls_tree_max_chunk).
    """
    base, tree_max = nvls_tree_max_chunk(arch, shape.num_domains, shape.ppn, nic_GBps,
                                         nic_behind_switch, version, simple_buffsize_bytes)
    chunk = nvls_chunk_bytes(algo, size, channels, heads, base, tree_max)
    wave = min(channels * heads * chunk, size)
    units = [unit_time_s] * NVLS_STAGES.get(op, 3)
    if algo == "nvls_tree":
        net = unit_time_s if net_unit_time_s is None else net_unit_time_s
        units += [net] * (2 * tree_depth(shape.num_domains))
    return wave * (sum(units) - max(units)), chunk


def host_floor_s(gpus_per_process: int) -> float:
    """Least time of one nccl-tests iteration: one host enqueue per GPU of the process."""
    return max(gpus_per_process, 0) * HOST_ENQUEUE_S


def net_message_floor_s(op: str, algo: str, shape: GroupShape, size: float, channels: int,
                        message_s: float, max_message_bytes: int) -> float:
    """Least time of a ring across nodes on a transport whose connection completes one
    message before the next (topologies.transport: message_s > 0), 0 otherwise.

    Each ring step moves S/n per rank over every channel's network edge, cut into
    messages of at most `max_message_bytes`; the edge's messages are paid one after the
    other, so the ring takes at least steps x messages per step x message_s.
    """
    if message_s <= 0 or algo != "ring" or shape.num_domains <= 1:
        return 0.0
    n = shape.n
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    per_step = size / n / max(channels, 1)
    messages = max(1, math.ceil(per_step / max_message_bytes)) if max_message_bytes else 1
    return steps * messages * message_s
