"""How a cluster's NCCL runs on its network: the NCCL environment, a tuner plugin's rules
and the net transport's per-message cost.

Cloud clusters ship NCCL with settings that change what the tuner may pick, and net
plugins that do not behave like InfiniBand verbs:

  * `nccl_env` holds the NCCL environment variables that restrict the tuner
    (NCCL_ALGO, NCCL_PROTO, with NCCL's "^" exclusion form; NCCL_MIN_NCHANNELS,
    NCCL_MAX_NCHANNELS; NCCL_NVLS_ENABLE) and NCCL_BUFFSIZE, the Simple protocol's
    buffer, which sets a ring pass's chunk [NVIDIA NCCL documentation, "Environment
    Variables"]. E.g. Google's GPUDirect-TCPX recipe runs NCCL_ALGO=Ring,
    NCCL_PROTO=Simple and 8 channels; its TCPXO profile NCCL_PROTO=Simple,LL128.
  * `tuner` holds rules in the form of NCCL's example tuner plugin (its CSV: collective,
    min_bytes, max_bytes, algorithm, protocol, channels, nNodes, nRanks; -1 = any /
    keep NCCL's) [NVIDIA/nccl plugins/tuner/example]: the first rule matching a
    collective's type, size, node and rank count sets its algorithm, protocol and
    channels, as a tuner plugin does by zeroing that entry of NCCL's cost table.
  * `wire_latency_s`: the latency a network step really takes, where the net plugin
    reports another to NCCL (aws-ofi-nccl reports 75 us on p4d/p5 "to make NCCL choose"
    the right algorithm, its commit d87d61e0; the TCPXO plugin reports 0): NCCL chooses
    by the reported value, the collective takes the wire's.
  * `message_s` / `max_message_bytes`: a transport that completes one message of a
    connection before the next (its cost not overlapped), and the largest message it
    moves (the chunk its NCCL sends per network operation). 0 = InfiniBand-like
    (messages pipelined, only NCCL's per-step latency).

Bad values raise TopologyError naming the field, the value and what is allowed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inputs import decimal

from .errors import TopologyError

# NCCL_ALGO names (case-insensitive in NCCL) -> the simulator's algorithm names.
NCCL_ALGO_NAMES = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree",
                   "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
                   "collnet": "collnet_direct", "pat": "pat"}
NCCL_PROTO_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
NCCL_ENV_KEYS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
                 "NCCL_NVLS_ENABLE", "NCCL_BUFFSIZE")
# NCCL_BUFFSIZE accepted here: 64 KiB (8 steps of 8 KiB) to 1 GiB; NCCL's default is 4 MiB
# [src/init.cc DEFAULT_BUFFSIZE].
BUFFSIZE_RANGE_BYTES = (1 << 16, 1 << 30)
# MAXCHANNELS [NVIDIA/nccl src/include/device.h].
MAX_CHANNELS = 64
# The tuner plugin example's collective names [plugins/tuner/example] -> the simulator's.
TUNER_COLLECTIVES = {"allreduce": "all_reduce", "allgather": "all_gather",
                     "reducescatter": "reduce_scatter", "broadcast": "broadcast",
                     "reduce": "reduce"}
TUNER_KEYS = ("collective", "min_bytes", "max_bytes", "algorithm", "protocol", "channels",
              "nodes", "ranks")


@dataclass(frozen=True)
class NcclEnv:
    """The NCCL environment a cluster runs with (None / 0: NCCL's default)."""

    algorithms: frozenset[str] | None = None   # simulator names NCCL_ALGO allows
    protocols: frozenset[str] | None = None    # NCCL_PROTO allows
    min_channels: int = 0
    max_channels: int = 0
    nvls: bool = True                          # NCCL_NVLS_ENABLE
    buffsize_bytes: int = 0                    # NCCL_BUFFSIZE (0: NCCL's 4 MiB)

    def allows_algorithm(self, algorithm: str) -> bool:
        """Whether NCCL_ALGO / NCCL_NVLS_ENABLE let the tuner consider `algorithm`."""
        if not self.nvls and algorithm in ("nvls", "nvls_tree"):
            return False
        return self.algorithms is None or algorithm in self.algorithms or algorithm == "p2p"

    def allows_protocol(self, protocol: str) -> bool:
        """Whether NCCL_PROTO lets the tuner consider `protocol`."""
        return self.protocols is None or protocol in self.protocols

    def clamp_channels(self, channels: int) -> int:
        """comm->nChannels within NCCL_MIN_NCHANNELS..NCCL_MAX_NCHANNELS [init.cc]."""
        if self.max_channels:
            channels = min(channels, self.max_channels)
        return max(channels, self.min_channels)


@dataclass(frozen=True)
class TunerRule:
    """One rule of a tuner plugin's table; None / -1 fields match anything or keep NCCL's."""

    collective: str
    min_bytes: float = 0.0
    max_bytes: float = math.inf
    algorithm: str | None = None
    protocol: str | None = None
    channels: int = -1
    nodes: int = -1
    ranks: int = -1

    def matches(self, op: str, size_bytes: float, nodes: int, ranks: int) -> bool:
        """Whether the rule applies to `op` of `size_bytes` on `nodes` nodes, `ranks` ranks."""
        return (self.collective == op and self.min_bytes <= size_bytes <= self.max_bytes
                and self.nodes in (-1, nodes) and self.ranks in (-1, ranks))


# Without GPUDirect RDMA (network.gpudirect_rdma false: the NIC cannot reach the GPU's
# memory, or NCCL_NET_GDR_LEVEL refuses it because the GPU is farther from the NIC than
# that level) NCCL diverts a GPU's network traffic through host memory of the CPU local
# to the GPU [NVIDIA/nccl src/graph/paths.cc ncclTopoComputePaths, "divert all traffic
# through the CPU"; ncclTopoCheckGdr]. Its search then prices the GPU-CPU-NIC path at
# the PCIe Gen5 x16 rate NCCL assigns (32 GT/s: 240 x 16 lanes / 80 = 48 GB/s, src/graph/
# topo.cc kvDictPciGen) divided by INTEL_P2P_OVERHEAD, 6/5, on an Intel root complex
# [src/graph/search.cc ncclTopoFollowPath, topo.h]: 40 GB/s per NIC; a path across the
# two sockets of an Emerald Rapids host meets the same 40 GB/s (topo.h ERP_QPI_BW).
NCCL_PCIE_GEN5_X16_BPS = 48e9
INTEL_P2P_OVERHEAD = 6 / 5
HOST_STAGED_NIC_BPS = NCCL_PCIE_GEN5_X16_BPS / INTEL_P2P_OVERHEAD


def host_staged_nic_Bps(nic_nccl_Bps: float, gpudirect_rdma: bool) -> float:
    """The per-NIC rate NCCL's search gives a GPU's network traffic: the NIC's own, or
    without GPUDirect RDMA at most the host path's through an Intel CPU."""
    return nic_nccl_Bps if gpudirect_rdma else min(nic_nccl_Bps, HOST_STAGED_NIC_BPS)


@dataclass(frozen=True)
class NetTransport:
    """NCCL environment, tuner rules and message cost of a cluster's net transport."""

    nccl_env: NcclEnv = NcclEnv()
    tuner: tuple[TunerRule, ...] = ()
    message_s: float = 0.0
    max_message_bytes: int = 0
    # Latency per network step the wire takes, when it differs from what the plugin
    # reports to NCCL (network.latency_us, which NCCL's tuner chooses by); None = same.
    wire_latency_s: float | None = None
    # network.gpudirect_rdma: false where the GPU's traffic is staged through host memory
    # (see HOST_STAGED_NIC_BPS); NCCL's graph then reaches the NIC through the CPU
    # (PATH_PHB), which also turns LL128 off across nodes [tuning.cc: LL128 only while
    # graph->typeInter <= PATH_PXN on Hopper and later, <= PATH_PXB before].
    gpudirect_rdma: bool = True

    def tuner_rule(self, op: str, size_bytes: float, nodes: int, ranks: int
                   ) -> TunerRule | None:
        """The first tuner rule for this collective, or None."""
        return next((r for r in self.tuner if r.matches(op, size_bytes, nodes, ranks)), None)


# ---------------------------------------------------------------------------- parsing
def _names(field: str, value: Any, table: dict[str, str]) -> frozenset[str]:
    """A comma list of names, or "^a,b" for all but those [NCCL's NCCL_ALGO/PROTO form]."""
    allowed = "a comma list of " + ", ".join(sorted(set(table))) + " (optionally ^-prefixed)"
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(field, value, allowed)
    text = value.strip()
    exclude = text.startswith("^")
    picked = set()
    for part in text.lstrip("^").split(","):
        key = part.strip().lower()
        if key not in table:
            raise TopologyError(field, value, allowed)
        picked.add(table[key])
    names = set(table.values()) - picked if exclude else picked
    if not names:
        raise TopologyError(field, value, allowed + " leaving at least one")
    return frozenset(names)


def _count(field: str, value: Any, low: int, high: int) -> int:
    """An integer in [low, high], as a JSON number or a string (environment form)."""
    if isinstance(value, str) and decimal(value.strip(), 18) is not None:
        value = decimal(value.strip(), 18)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TopologyError(field, value, f"an integer from {low} to {high}")
    return value


def parse_nccl_env(raw: Any, where: str = "network.nccl_env") -> NcclEnv:
    """An NcclEnv from {"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple", ...}."""
    if raw is None:
        return NcclEnv()
    if not isinstance(raw, dict):
        raise TopologyError(where, raw, "an object of NCCL variables: " + ", ".join(NCCL_ENV_KEYS))
    for key in raw:
        if key not in NCCL_ENV_KEYS:
            raise TopologyError(f"{where}.{key}", raw[key], "keys " + ", ".join(NCCL_ENV_KEYS))
    algos = protos = None
    if "NCCL_ALGO" in raw:
        algos = _names(f"{where}.NCCL_ALGO", raw["NCCL_ALGO"], NCCL_ALGO_NAMES)
    if "NCCL_PROTO" in raw:
        protos = _names(f"{where}.NCCL_PROTO", raw["NCCL_PROTO"], NCCL_PROTO_NAMES)
    low = _count(f"{where}.NCCL_MIN_NCHANNELS", raw.get("NCCL_MIN_NCHANNELS", 0), 0, MAX_CHANNELS)
    high = _count(f"{where}.NCCL_MAX_NCHANNELS", raw.get("NCCL_MAX_NCHANNELS", 0), 0, MAX_CHANNELS)
    if high and low > high:
        raise TopologyError(f"{where}.NCCL_MIN_NCHANNELS", low,
                            f"at most NCCL_MAX_NCHANNELS ({high})")
    nvls = _count(f"{where}.NCCL_NVLS_ENABLE", raw.get("NCCL_NVLS_ENABLE", 1), 0, 1)
    buffsize = 0
    if "NCCL_BUFFSIZE" in raw:
        buffsize = _count(f"{where}.NCCL_BUFFSIZE", raw["NCCL_BUFFSIZE"], *BUFFSIZE_RANGE_BYTES)
    return NcclEnv(algos, protos, low, high, bool(nvls), buffsize)


def _one_name(field: str, value: Any, table: dict[str, str]) -> str | None:
    if value in (None, -1, "-1", "default"):
        return None
    if not isinstance(value, str) or value.strip().lower() not in table:
        raise TopologyError(field, value, "one of " + ", ".join(sorted(set(table))) + " or -1")
    return table[value.strip().lower()]


def _bytes(field: str, value: Any, default: float) -> float:
    if value is None or value == -1:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 62:
        raise TopologyError(field, value, "a byte count in [0, 2^62] (an integer) or -1")
    return float(value)


def parse_tuner(raw: Any, where: str = "network.nccl_tuner") -> tuple[TunerRule, ...]:
    """Tuner rules from a list of objects with TUNER_KEYS (NCCL's example tuner format)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TopologyError(where, raw, "a list of rules {" + ", ".join(TUNER_KEYS) + "}")
    rules = []
    for i, rule in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(rule, dict):
            raise TopologyError(at, rule, "an object with keys " + ", ".join(TUNER_KEYS))
        for key in rule:
            if key not in TUNER_KEYS:
                raise TopologyError(f"{at}.{key}", rule[key], "keys " + ", ".join(TUNER_KEYS))
        op = _one_name(f"{at}.collective", rule.get("collective"), TUNER_COLLECTIVES)
        if op is None:
            raise TopologyError(f"{at}.collective", rule.get("collective"),
                                "one of " + ", ".join(TUNER_COLLECTIVES))
        low = _bytes(f"{at}.min_bytes", rule.get("min_bytes"), 0.0)
        high = _bytes(f"{at}.max_bytes", rule.get("max_bytes"), math.inf)
        if high < low:
            raise TopologyError(f"{at}.max_bytes", rule.get("max_bytes"), f"at least min_bytes ({low:g})")
        rules.append(TunerRule(
            op, low, high,
            _one_name(f"{at}.algorithm", rule.get("algorithm"), NCCL_ALGO_NAMES),
            _one_name(f"{at}.protocol", rule.get("protocol"), NCCL_PROTO_NAMES),
            -1 if rule.get("channels", -1) == -1 else _count(f"{at}.channels", rule["channels"], 1, MAX_CHANNELS),
            -1 if rule.get("nodes", -1) == -1 else _count(f"{at}.nodes", rule["nodes"], 1, 1 << 30),
            -1 if rule.get("ranks", -1) == -1 else _count(f"{at}.ranks", rule["ranks"], 1, 1 << 30)))
    return tuple(rules)
