"""NCCL tuning constants the collective model uses, each with its source.

Unless marked otherwise, numbers come from NVIDIA/nccl `src/graph/tuning.cc`
(`ncclTunerConstantsDefaults`, `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`) at commit
5067397c (docs/references.md, section 1, lists them with context). Protocol order in
every tuple is (LL, LL128, Simple). Latencies are in microseconds there and converted to
seconds here (`_s` names).
"""
from __future__ import annotations

US = 1e-6
PROTOCOLS = ("LL", "LL128", "Simple")
_P = {p: i for i, p in enumerate(PROTOCOLS)}

# baseLatencies (us) [tuning.cc]. "hierarchical" is not an NCCL
# algorithm: assumption, it pays the ring's base latency once.
_BASE_LAT_US = {
    "ring": (6.6, 14.0, 8.4),
    "tree": (6.8, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
# hwLatencies (us per step) for NVLINK and NET [tuning.cc].
_HW_LAT_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0),
               "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0),
            "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9)},
}
# getNetOverhead(): 1.0 us on Intel x86 (2.0 on AMD) [tuning.cc].
# Assumption: Intel hosts (DGX H100 ships Xeon 8480C). Tripled for Simple.
NET_OVERHEAD_S = 1.0 * US
# graph->latencyInter: extra network latency the net plugin reports. Assumption: 0 for IB.
LATENCY_INTER_S = 0.0
# Ring + Simple + all-reduce across nodes: latency x1.4 once nBytes/(nCh*n) >= 64
# ("plateau effect", x1.9 before SM80) [tuning.cc ncclTopoGetAlgoTime].
RING_PLATEAU_FACTOR = 1.4


def base_latency_s(algorithm: str, protocol: str) -> float:
    """NCCL baseLatencies[algorithm][protocol] in seconds."""
    return _BASE_LAT_US[algorithm][_P[protocol]] * US


def hw_latency_s(link: str, algorithm: str, protocol: str) -> float:
    """NCCL hwLatencies[link][algorithm][protocol] per step in seconds (link: nvlink|net)."""
    return _HW_LAT_US[link][algorithm][_P[protocol]] * US


# Bandwidth efficiency per protocol: what fraction of a link's rate carries payload.
# Ring: LL 8-byte stores of 4 B data + 4 B flag -> busBw*0.5; LL128 120 B of 128 ->
# busBw*0.92; Simple 1.0 [tuning.cc refinements].
RING_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
# Tree all-reduce: busBw*0.92 for every protocol, then LL /3.8 and LL128 x120/128
# across nodes (x7/9 on one node) [tuning.cc].
TREE_EFFICIENCY = {"LL": 0.92 / 3.8, "LL128": 0.92 * 120 / 128, "Simple": 0.92}
TREE_LL128_ONE_NODE_EFFICIENCY = 0.92 * 7 / 9
# nvlsEfficiency: Hopper 0.85, Blackwell 0.74 [tuning.cc].
# Assumption: other NVLS-capable devices (custom files) get Hopper's value.
NVLS_EFFICIENCY = {"h100": 0.85, "h100-hbm2e": 0.85, "h200": 0.85, "b200": 0.74,
                   "gb200": 0.74}
NVLS_EFFICIENCY_DEFAULT = 0.85

# llMaxBws (GB/s, total busBw cap of the LL protocol) [tuning.cc]:
# on one node the row of the GPU's architecture (Ampere 87.7, Hopper 141, Blackwell 282);
# across nodes the CPU vendor's row, Intel assumed: 39 at 2 nodes, 20.4 beyond.
LL_MAX_BW_ONE_NODE_BPS = {"a100": 87.7e9, "h100": 141e9, "h100-hbm2e": 141e9, "h200": 141e9,
                          "b200": 282e9, "gb200": 282e9}
LL_MAX_BW_ONE_NODE_DEFAULT_BPS = 141e9   # assumption: Hopper row for custom devices
LL_MAX_BW_MULTI_NODE_BPS = (39e9, 20.4e9)  # Intel row, [2 nodes, >= 3 nodes]


def ll_max_bw_Bps(device_name: str, nodes: int) -> float:
    """NCCL llMaxBw: the cap on LL bus bandwidth."""
    if nodes <= 1:
        return LL_MAX_BW_ONE_NODE_BPS.get(device_name.lower(), LL_MAX_BW_ONE_NODE_DEFAULT_BPS)
    return LL_MAX_BW_MULTI_NODE_BPS[0 if nodes == 2 else 1]


# treeCorrectionFactor[protocol][log2i(nBytes >> 6)] for logSize < 23; multiplies Tree
# all-reduce bandwidth [tuning.cc].
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1,
              1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}


def tree_correction(protocol: str, size_bytes: float) -> float:
    """NCCL's size-dependent Tree bandwidth correction (1.0 from 256 MB on)."""
    n = int(size_bytes) >> 6
    log_size = n.bit_length() - 1 if n > 0 else 0
    table = TREE_CORRECTION[protocol]
    return float(table[log_size]) if log_size < 23 else 1.0


def nvls_efficiency(device_name: str) -> float:
    """NCCL nvlsEfficiency for a device (Hopper 0.85, Blackwell 0.74)."""
    return NVLS_EFFICIENCY.get(device_name.lower(), NVLS_EFFICIENCY_DEFAULT)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw/algbw factor [nccl-tests doc/PERFORMANCE.md]."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send_recv
