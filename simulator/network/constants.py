"""NCCL tuning constants the collective model uses, each with its source.

Unless marked otherwise, numbers come from NVIDIA/nccl `src/graph/tuning.cc`
(`ncclTunerConstantsDefaults`, `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`) at commit
5067397c (docs/references.md, section 1, lists them with context). Protocol order in
every tuple is (LL, LL128, Simple). Latencies are in microseconds there and converted to
seconds here (`_s` names).
"""
from __future__ import annotations

from .tuning_versions import override_us, parse_version

US = 1e-6
PROTOCOLS = ("LL", "LL128", "Simple")
_P = {p: i for i, p in enumerate(PROTOCOLS)}

# baseLatencies (us) [tuning.cc]. "hierarchical" is not an NCCL
# algorithm: assumption, it pays the ring's base latency once.
_BASE_LAT_US = {
    "ring": (6.6, 14.0, 8.4),
    "tree": (6.8, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}
# hwLatencies (us per step) for NVLINK and NET [tuning.cc].
_HW_LAT_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0),
               "collnet_direct": (0.0, 0.0, 3.7), "collnet_chain": (0.0, 0.0, 2.8),
               "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0),
               "pat": (0.0, 0.0, 4.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0),
            "collnet_direct": (0.0, 0.0, 31.0), "collnet_chain": (0.0, 0.0, 30.0),
            "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9),
            "pat": (0.0, 0.0, 14.0)},
}
# PAT (Parallel Aggregated Trees, all-gather / reduce-scatter with one GPU per node): its
# bandwidth is x0.75 of the graph's, its latency base + log2(nodes) x NET / 3.5 + 2.8 us
# per rank [tuning.cc].
PAT_EFFICIENCY = 0.75
PAT_PER_RANK_LAT_S = 2.8 * US
PAT_NET_DIVISOR = 3.5
# CollNetDirect: 0.4 us of "arity serialization latency" per local rank [tuning.cc].
COLLNET_ARITY_LAT_S = 0.4 * US
# CollNetDirect and CollNetChain run only with at most NCCL_MAX_DIRECT_ARITY + 1 = 8 GPUs
# per node [enqueue.cc updateCollCostTable; device.h]; CollNetDirect's bandwidth is x0.85
# from SM90 on [tuning.cc].
COLLNET_MAX_LOCAL_RANKS = 8
COLLNET_DIRECT_SM90_EFFICIENCY = 0.85
# getNetOverhead(): 1.0 us on Intel x86 (2.0 on AMD) [tuning.cc].
# Assumption: Intel hosts (DGX H100 ships Xeon 8480C). Tripled for Simple.
NET_OVERHEAD_S = 1.0 * US
# graph->latencyInter: extra network latency the net plugin reports. Assumption: 0 for IB.
LATENCY_INTER_S = 0.0
# Ring + Simple + all-reduce across nodes: latency x1.4 once nBytes/(nCh*n) >= 64
# ("plateau effect", x1.9 before SM80) [tuning.cc ncclTopoGetAlgoTime].
RING_PLATEAU_FACTOR = 1.4


def base_latency_s(algorithm: str, protocol: str, version: str | None = None) -> float:
    """NCCL baseLatencies[algorithm][protocol] in seconds, as NCCL `version` shipped it
    (None or unparsable: the tables above) [tuning_versions]."""
    value = override_us(version, "base", "", algorithm, protocol)
    return (_BASE_LAT_US[algorithm][_P[protocol]] if value is None else value) * US


# Ring LL128 with one GPU per node: before 2.23 NCCL rates it at 0.7 of the ring's bus
# bandwidth instead of 120/128 ("if ppn < 2 ... apply some bw discount", tuning.cc
# v2.18.5-1 .. v2.22.3-1); 2.23 drops the discount (v2.23.4-1).
RING_LL128_PPN1_EFFICIENCY = 0.7
RING_LL128_PPN1_DISCOUNT_BEFORE = (2, 23, 0)


def ring_efficiency(op: str, protocol: str, nodes: int, ppn: int,
                    version: str | None = None) -> float:
    """Ring's payload fraction for `protocol` as NCCL `version` rates it: LL's rating by
    release (ring_ll_efficiency), LL128's discount with one GPU per node before 2.23,
    else RING_EFFICIENCY [tuning.cc]."""
    if protocol == "LL":
        return ring_ll_efficiency(op, nodes, version)
    parsed = parse_version(version)
    if (protocol == "LL128" and ppn < 2 and parsed is not None
            and parsed < RING_LL128_PPN1_DISCOUNT_BEFORE):
        return RING_LL128_PPN1_EFFICIENCY
    return RING_EFFICIENCY[protocol]


def ring_ll_efficiency(op: str, nodes: int, version: str | None = None) -> float:
    """Ring LL's payload fraction as NCCL `version` rates it (None or unparsable: the
    newest, 0.5) [tuning.cc; RING_LL_EFFICIENCY_BEFORE_2_21]."""
    parsed = parse_version(version)
    if parsed is None or parsed >= RING_LL_HALF_FROM:
        return RING_EFFICIENCY["LL"]
    quarter, third = RING_LL_EFFICIENCY_BEFORE_2_21
    return quarter if nodes > 1 or op in ("all_reduce", "reduce") else third


def hw_latency_s(link: str, algorithm: str, protocol: str,
                 version: str | None = None, timing: bool = False) -> float:
    """NCCL hwLatencies[link][algorithm][protocol] per step in seconds (link: nvlink|net),
    as NCCL `version` shipped it, or with `timing` as later recalibrated
    [tuning_versions]."""
    value = override_us(version, "hw", link, algorithm, protocol, timing)
    return (_HW_LAT_US[link][algorithm][_P[protocol]] if value is None else value) * US


# Bandwidth efficiency per protocol: what fraction of a link's rate carries payload.
# Ring: LL 8-byte stores of 4 B data + 4 B flag -> busBw*0.5; LL128 120 B of 128 ->
# busBw*0.92; Simple 1.0 [tuning.cc refinements].
RING_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
# Before 2.21 NCCL rated ring LL lower: busBw x 1/4 for all-reduce, reduce and any
# collective across nodes, x 1/3 for the others on one node [tuning.cc at v2.18.5-1 ..
# v2.20.5-1; v2.21.5-1 has busBw x .5]. The rating is NCCL's own measure of the LL
# kernels' rate in that release: it sets the tuner's LL -> LL128 switch and, in this
# model, LL's payload fraction.
RING_LL_EFFICIENCY_BEFORE_2_21 = (0.25, 1.0 / 3.0)   # (AR/reduce/multi-node, others)
RING_LL_HALF_FROM = (2, 21, 0)
# Tree all-reduce: busBw*0.92 for every protocol, then LL /3.8 and LL128 x120/128
# across nodes (x7/9 on one node) [tuning.cc].
TREE_EFFICIENCY = {"LL": 0.92 / 3.8, "LL128": 0.92 * 120 / 128, "Simple": 0.92}
TREE_LL128_ONE_NODE_EFFICIENCY = 0.92 * 7 / 9
# nvlsEfficiency by compute-capability class: Hopper 0.85, Blackwell 0.74 [tuning.cc].
# Assumption: other NVLS-capable devices (custom files) get Hopper's value.
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
NVLS_EFFICIENCY_DEFAULT = 0.85

# llMaxBws (GB/s, total busBw cap of the LL protocol) [tuning.cc]:
# on one node the row of the GPU's architecture (Ampere 87.7, Hopper 141, Blackwell 282);
# across nodes the CPU vendor's row, Intel assumed: 39 at 2 nodes, 20.4 beyond.
LL_MAX_BW_ONE_NODE_BPS = {"ampere": 87.7e9, "hopper": 141e9, "blackwell": 282e9}
LL_MAX_BW_ONE_NODE_DEFAULT_BPS = 141e9   # assumption: Hopper row for custom devices
LL_MAX_BW_MULTI_NODE_BPS = (39e9, 20.4e9)  # Intel row, [2 nodes, >= 3 nodes]
# Up to 2.20 the Hopper row (every GPU of compute capability >= 9.0) was Ampere's 87.7 on
# one node; v2.21.5-1 raised it to 141 in the same retune that rated ring LL x .5
# [tuning.cc llMaxBws at v2.20.5-1 and v2.21.5-1]. The Intel multi-node row is unchanged.
LL_MAX_BW_HOPPER_ONE_NODE_BEFORE_2_21_BPS = 87.7e9


# Per-channel bus-bandwidth caps (GB/s) NCCL's tuner applies, by architecture and by
# [1 node, 2 nodes, >= 3 nodes] [tuning.cc perChMaxRingLL128Bws, perChMaxTreeLL128Bws,
# perChMaxTreeBws, perChMaxNVLSTreeBws]: what one channel (one CUDA block) sustains.
PER_CHANNEL_CAP_GBPS = {
    "ring_LL128": {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7),
                   "blackwell": (40.0, 40.0, 40.0)},
    "tree_LL128": {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
                   "blackwell": (55.6, 31.67, 20.0)},
    "tree": {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
             "blackwell": (70.0, 42.8, 24.0)},
    "nvls_tree": {"ampere": (24.0, 23.6, 17.8), "hopper": (0.0, 57.7, 45.5),
                  "blackwell": (0.0, 96.0, 80.0)},
}


def per_channel_cap_Bps(kind: str, arch: str, nodes: int) -> float:
    """NCCL's per-channel cap for (kind, architecture, node count); inf when none."""
    row = PER_CHANNEL_CAP_GBPS[kind].get(arch)
    if row is None:
        return float("inf")
    value = row[0 if nodes <= 1 else 1 if nodes == 2 else 2]
    return value * 1e9 if value > 0 else float("inf")


def ll_max_bw_Bps(device_name: str, nodes: int, version: str | None = None) -> float:
    """NCCL llMaxBw: the cap on LL bus bandwidth, as NCCL `version` shipped it (None or
    unparsable: the newest)."""
    if nodes <= 1:
        parsed = parse_version(version)
        if (parsed is not None and parsed < RING_LL_HALF_FROM
                and arch_of(device_name) in ("hopper", "blackwell")):
            return LL_MAX_BW_HOPPER_ONE_NODE_BEFORE_2_21_BPS
        return LL_MAX_BW_ONE_NODE_BPS.get(arch_of(device_name), LL_MAX_BW_ONE_NODE_DEFAULT_BPS)
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


# NCCL's compute-capability classes [tuning.cc compCapIndex]: the devices the simulator
# knows, by name. Assumption: a custom device with NVLS is Hopper-class, else Ampere.
_ARCH = {"a100": "ampere", "h100": "hopper", "h100-hbm2e": "hopper", "h200": "hopper",
         "h20": "hopper", "b200": "blackwell", "gb200": "blackwell", "b300": "blackwell",
         "gb300": "blackwell"}


def arch_of(device_name: str, nvls: bool = True) -> str:
    """volta / ampere / hopper / blackwell for a device name."""
    return _ARCH.get(device_name.lower(), "hopper" if nvls else "ampere")


def nvls_efficiency(device_name: str) -> float:
    """NCCL nvlsEfficiency for a device (Hopper 0.85, Blackwell 0.74)."""
    return NVLS_EFFICIENCY.get(arch_of(device_name), NVLS_EFFICIENCY_DEFAULT)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw/algbw factor [nccl-tests doc/PERFORMANCE.md]."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send_recv


# -- nccl-tests' measurement and the NCCL kernels' pipelines --------------------------
# nccl-tests times a loop of back-to-back collectives; with `-g N` one host thread
# enqueues the collective on N GPUs per iteration (ncclGroupStart/End around N calls),
# so an iteration cannot take less than N host enqueues [NVIDIA/nccl-tests
# src/common.cu, startColl/completeColl]. Host cost of one enqueue: 3.85 us, an
# ESTIMATE from one system's measurement (Azure ND GB200 v6, -g 4, all-reduce of 1 KiB
# forced to Ring: 15.4 us per iteration / 4 GPUs [Azure/AI-benchmarking-guide,
# Azure_Results/ND_GB200_v6_results.md]); it binds only when N x 3.85 us exceeds the
# device time, i.e. for small messages driven by one process per node.
HOST_ENQUEUE_S = 3.85 * US
# Pipeline stages of one chunk through NCCL's NVLS kernels: the warp groups that hand a
# chunk on to each other, each one data movement [NVIDIA/nccl src/device/all_reduce.h
# RunWorkColl NVLS, one node: scatter into the NVLS buffer; reduce and broadcast in one
# primitive (multimem.ld_reduce then multimem.st, "Reduce, broadcast through NVLS");
# gather out of the buffer. all_gather.h NVLS: broadcast through NVLS, gather.
# reduce_scatter.h NVLS: scatter, reduce through NVLS]. NVLS_Tree (all_reduce.h
# NVLS_TREE) adds per tree level one stage up (reduce fused with the send to the parent)
# and one down (receive fused with the broadcast). A pipeline of k stages fills in k - 1
# waves of channels x heads x chunk bytes.
# Assumption: every stage at the in-switch rate. Scatter and gather cross no NVLink: the
# buffer they write and read is ucBuff, the rank's own memory bound into the multicast
# object (src/transport/nvls.cc, v2.18.5-1 and v2.26.2-1), so they are local copies by
# 6-8 warps of each channel, at a rate no source gives. At the device's HBM rate instead,
# the one-node NVLS rows come out 26-46 % fast (azure-nd-h100-v5-8, 128 KiB-32 MiB) and
# 28-42 % (azure-nd-h200-v5-8, 2-32 MiB) (nccl_topologies/README.md, "NVLS stage pricing").
NVLS_STAGES = {"all_reduce": 3, "all_gather": 2, "reduce_scatter": 2}

# NVLS_Tree across GB200 NVL72 racks: the rate at which one NVLS head's share crosses
# the scale-out network, where a domain has more GPUs than NVLS heads (32 of 72).
# ESTIMATED from one system, CoreWeave's 2-rack nccl-tests all-reduce (144 GPUs, NCCL
# 2.26.2 [coreweave/nccl-tests README, Expected Performance, GB200, 2 Racks]): from 8 to
# 16 GiB the time grows by 20,574 us for 8 GiB, 417.5 GB/s of algorithm bandwidth, which
# on 2 racks is 32 heads x 13.0 GB/s (each head's NIC carries its share once each way).
# Scored on the 20-rack run, where the double binary tree doubles each head's network
# load. What holds a head to about a quarter of its 400 Gb/s NIC (the NVLS search's head
# count over 72 GPUs, the proxy, the fabric) is not identified.
NVLS_TREE_HEAD_NET_BPS = 13.0e9

# Assumptions and estimates of the collective model, for `validation collectives` to
# list: (name, value, what it rests on).
ASSUMPTIONS = (
    ("NET_OVERHEAD_S", "1.0 us", "NCCL getNetOverhead() on Intel x86 hosts (2.0 on AMD); "
     "Intel assumed [nccl src/graph/tuning.cc]"),
    ("LATENCY_INTER_S", "0 unless network.latency_us", "graph->latencyInter, the latency a "
     "net plugin reports; 0 for InfiniBand verbs, a topology file sets it for other "
     "transports (EFA, TCPXO)"),
    ("NVLS_EFFICIENCY_DEFAULT", "0.85", "Hopper's nvlsEfficiency for NVLS-capable devices "
     "NCCL's table does not name [tuning.cc]"),
    ("LL_MAX_BW_ONE_NODE_DEFAULT_BPS", "141 GB/s", "Hopper's llMaxBw row for custom devices"),
    ("LL_MAX_BW_MULTI_NODE_BPS", "39 / 20.4 GB/s", "llMaxBw across nodes, Intel CPU row"),
    ("hierarchical base latency", "ring's", "not an NCCL algorithm; only when forced"),
    ("HOST_ENQUEUE_S", "3.85 us per GPU a process drives",
     "ESTIMATED on azure-nd-gb200-v6-4 (1 KiB, -g 4, Ring: 15.4 us / 4); in-sample there, "
     "scored on the other -g N systems"),
    ("NVLS_STAGES", "AR 3, AG/RS 2 pipeline stages",
     "NCCL NVLS kernels' warp groups: scatter, reduce+multicast (one primitive), gather; "
     "AG multicast, gather; RS scatter, reduce [all_reduce.h, all_gather.h, "
     "reduce_scatter.h]; each stage assumed to take one wave at the streaming rate "
     "(scatter and gather are local copies into / out of the rank's own multicast-bound "
     "memory [nvls.cc], at a rate no source gives; at HBM rate the one-node NVLS rows go "
     "26-46 % fast)"),
    ("NVLS idle channels before 2.20.3", "all-reduce busy channels = ceil(size / "
     "(heads x chunk)), each at 1/channels of the rate",
     "NCCL 2.18-2.19 NVLS kernels give channel bid the block bid x nHeads x chunk of each "
     "loop [all_reduce.h v2.18.5-1, v2.19.4-1]; 2.20.3+ split the count over all channels "
     "[enqueue.cc v2.20.3-1 countPerChannels]; a channel's share of the rate: NCCL's "
     "comment 'NVLS should not need more than 16 channels to get peak BW' [enqueue.cc "
     "v2.18.5-1 getAlgoInfo]; assumption, no constant estimated; after NCCL's choice"),
    ("ONE_NODE_SEARCH_CHANNELS", "16 (32 coll channels); Ampere 12 (24)",
     "NCCL INIT log of 8 x H100; the channels NCCL's per-channel caps multiply in one node "
     "(links bind first there). Ampere: NCCL's search at 12 NVLinks x SM80_NVLINK_BW 20 "
     "GB/s finds 6 rings at 40 GB/s, duplicated to 12 [search.cc, topo.h at v2.18.5-1], "
     "x2 in connect.cc = 24, as the 8 x A100 log in NVIDIA/nccl-tests issue 100 shows"),
    ("ring LL rating before NCCL 2.21", "busBw x 1/4 (AR, reduce, multi-node), x 1/3; "
     "Hopper+ llMaxBw 87.7 GB/s on one node",
     "tuning.cc v2.18.5-1 .. v2.20.5-1 (x .5 and 141 GB/s from v2.21.5-1); sets the LL -> "
     "LL128 switch and LL's payload fraction for rows of those releases"),
    ("NVLS_Tree fill", "+2 stages per tree level, each at its part's rate",
     "a chunk crosses one network hop per level up and down (NCCL's double binary tree "
     "[trees.cc]); the pipeline streams at its slowest stage and fills through the others, "
     "NVLink stages at the in-switch flows' rate (NVLS search speed), network stages at the "
     "tree flows' rate (perChMaxNVLSTreeBw, NVL72 heads' network rate)"),
    ("NCCL version", "the row's release; 2.30.7's tables when unknown",
     "baseLat / hwLat differ by release (2.18, 2.19-2.22, 2.23-2.28.7, 2.28.9+) "
     "[tuning.cc at each tag]; so do NVLS_Tree's first chunk (the Simple step, 512 KiB, "
     "up to 2.20; NVLS_CHUNKSIZE 128 KiB from 2.21) and Blackwell's NVLS channels (32 up "
     "to 2.26; 24 in one domain from 2.27; ncclNvlsTreeSm100Tuning from 2.30) [enqueue.cc, "
     "nvls.cc at each tag]; a row without a version gets the newest. The release's "
     "latencies steer the choice; the time takes a later recalibration of an entry "
     "whose kernel did not change (NVLS_Tree's 20.9 us per network step from 2.28.9, "
     "for 2.26.2+: tuning_versions.RECALIBRATED_FROM)"),
    ("NVLS search speed", "only with more GPUs than heads (NVL72)", "NCCL's search fits "
     "(heads+1) x speed in each GPU's NVLink [search.cc]; with one head per GPU the links "
     "match 5-8 x H100 NVLS (NVIDIA/nccl issue 1455)"),
    ("GB200 NIC path", "not behind a PCIe switch", "selects ncclNvlsTreeSm100Tuning's chunk "
     "(NCCL 2.30+); HGX/DGX boards are (DGX B200 user guide)"),
    ("NVLS heads", "min(32, GPUs per domain)", "NCCL_MAX_NVLS_ARITY [search.cc, device.h]"),
    ("NVLS_TREE_HEAD_NET_BPS", "13.0 GB/s per NVLS head (x2 on 2 racks)",
     "ESTIMATED on coreweave-gb200-nvl72-144 (8 -> 16 GiB slope, 417.5 GB/s / 32 heads); "
     "in-sample there, scored on coreweave-gb200-nvl72-1440; applies only where a domain "
     "has more GPUs than NVLS heads (NVL72), to the stream and to the fill's network "
     "stages; its cause is not identified"),
    ("nvl72 scale-out", "one 400 Gb/s NIC per GPU", "typical GB200 deployments; a topology "
     "file sets another"),
    ("nvl72-gb300 scale-out", "one 800 Gb/s ConnectX-8 per GPU, 96 GB/s for NCCL",
     "the GB300 NVL72 reference architecture's one HCA per GPU; NCCL's share of it as NDR's "
     "(96 %); a deployment may run it as 2 x 400 Gb/s Ethernet"),
    ("HDR_200G nic_nccl_Bps", "24 GB/s", "96 % of 25 GB/s, the ratio NDR reaches "
     "(46-48 of 50 GB/s, NVIDIA/nccl-tests issue 290)"),
    ("GPUDirect-TCPXO wire_latency_us", "40.7 us per network step",
     "ESTIMATED on gcp-a3mega-h100-16 (all-gather of 1 KiB, ring LL128 under the TCPXO "
     "profile's NCCL_PROTO=Simple,LL128: 85.3 us measured, 44.6 us modelled without it; "
     "the plugin reports 0); in-sample there; set in its topology file"),
    ("GPUDirect-TCPX message_us", "66.4 us per message, one at a time per connection",
     "ESTIMATED on gcp-a3high-h100-16's cluster-toolkit run at 1 MiB (996.7 us / 15 ring "
     "steps; flat from 1 to 16 MiB); scored on its other sizes and the dstack run; "
     "messages of 512 KiB (NCCL_DYNAMIC_CHUNK_SIZE of Google's TCPX recipe)"),
    ("Google tuner configurations", "LL128 below 1 MiB, Simple from 1 MiB",
     "gIB's tuner_config_*.txtpb and TCPXO's a3plus_tuner_config.textproto are not "
     "published; ESTIMATED on gcp-a4-b200-16 (all-gather: 46 us at 512 KiB, 82 us at "
     "1 MiB), scored on the A3 Ultra and A3 Mega systems; network.nccl_tuner in their files"),
    ("EFA latency_us", "75 us on p4d/p4de and p5/p5e, for NCCL's choice",
     "the internode latency aws-ofi-nccl reports to NCCL (src/platform-aws.cpp platform "
     "table), a tuner value ('below 75us ... makes NCCL choose the wrong algorithm for "
     "the 2 nodes case', its commit d87d61e0)"),
    ("EFA wire_latency_us on p4de and p5", "35 us",
     "aws-ofi-nccl's empirically searched value for p5en/p6 (commit 2496e7de) taken for "
     "p5's and p4de's per-step latency; scored on aws-p5-h100-16, its EKS run and "
     "aws-p4de-a100-16"),
    ("p4de NCCL_PROTO", "Simple", "aws-ofi-nccl forces NCCL_PROTO=simple where EFA "
     "lacks 128-byte in-order writes, as on p4d/p4de (platform table force_proto_simple, "
     "commit 0bac2382; nccl_ofi_net.cpp); the run's sbatch does not override it"),
    ("ring passes", "NCCL's per-step latencies once per pass of the ring's loop",
     "NCCL's tuner prices one pass [tuning.cc]; the kernel loops over passes of channels x "
     "ranks x chunk (Simple: NCCL_BUFFSIZE / 8 steps x 4) [enqueue.cc calcCollChunking, "
     "all_reduce.h runRing]; each further pass assumed to pay the steps' latencies again, "
     "after NCCL's choice; no constant estimated"),
    ("CollNet (SHARP)", "switch reduces at NIC rate", "off unless network.collnet; "
     "NCCL's CollNet latencies and x0.85 Direct factor [tuning.cc]"),
    ("gcp-a3ultra-2x1 gpudirect_rdma", "false (host-staged, 40 GB/s, no LL128)",
     "INFERRED: google/dranet's pods take any one GPU and the NIC gpu1rdma0 under gIB's "
     "NCCL_NET_GDR_LEVEL=PIX, and their GPUs sit at different PCI addresses, so at least "
     "one is not on its NIC's switch (its README also notes GKE lacked nvidia-peermem); "
     "NCCL then routes through the CPU: 48 GB/s PCIe / INTEL_P2P_OVERHEAD 1.2 [search.cc], "
     "typeInter PHB, LL128 off [tuning.cc]; NCCL's LL latency has no host-staging term"),
)
