"""Closed-form collective model: NCCL's tuner over algorithms and protocols, on links.

time(op, group, S) = latency(algorithm, protocol) + transfer time of the algorithm's flows
on idle links, where flow bytes include the protocol's wire overhead. The latency part is
NCCL's tuning.cc model; the transfer part replaces NCCL's per-channel bandwidth tables by
the topology's links (rates NCCL achieves per link: `topology.link_nccl_Bps`), so
non-aligned groups, odd fabrics and what-if link changes need no new tables. Like
`ncclTopoGetAlgoTime`, the tuner takes the fastest (algorithm, protocol).
"""
from __future__ import annotations

from dataclasses import dataclass

from topologies.topology import COLLECTIVE_OPS

from .algorithms import (GroupShape, Template, available, build_template, group_shape,
                         nvls_heads, ring_rails)
from .channels import (coll_channels, device_arch, nvls_active_channels, nvls_channels,
                       nvls_search_speed_GBps, one_node_search_channels, ring_chunk_bytes,
                       ring_passes, tuned_channels)
from .constants import (COLLNET_DIRECT_SM90_EFFICIENCY, NVLS_TREE_HEAD_NET_BPS,
                        PAT_EFFICIENCY, RING_EFFICIENCY, TREE_EFFICIENCY,
                        TREE_LL128_ONE_NODE_EFFICIENCY, bus_factor, ll_max_bw_Bps,
                        nvls_efficiency, per_channel_cap_Bps, ring_efficiency,
                        tree_correction)
from .fluid import Flow
from .latency import (host_floor_s, net_message_floor_s, nccl_latency_s, nvls_fill_s,
                      ring_pass_latency_s)

OPS = COLLECTIVE_OPS
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat",
              "hierarchical")
# NVLS, NVLS_Tree and CollNet run Simple only [tuning.cc]. NCCL's p2p path
# uses LL below NCCL_P2P_LL_THRESHOLD and Simple above (no LL128).
_PROTOCOLS = {"nvls": ("Simple",), "nvls_tree": ("Simple",), "collnet_direct": ("Simple",),
              "collnet_chain": ("Simple",), "pat": ("Simple",), "p2p": ("LL", "Simple")}
_ALL_PROTOCOLS = ("LL", "LL128", "Simple")
# Algorithms the tuner may pick by itself; "hierarchical" only when forced (not NCCL's).
_AUTO = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat", "p2p")
_NVLS = ("nvls", "nvls_tree")


@dataclass(frozen=True)
class CommOptions:
    """Knobs of the communication model.

    algorithm / protocol force NCCL's choice (like NCCL_ALGO / NCCL_PROTO); a forced value
    the collective cannot use is ignored for that collective (e.g. "tree" for an
    all-gather). flow_sharing=False skips the network model: each collective takes its
    closed-form time whatever else is running.
    """

    algorithm: str | None = None
    protocol: str | None = None
    flow_sharing: bool = True
    # GPUs one process drives (nccl-tests -g N): an nccl-tests iteration takes at least
    # N host enqueues. 1 = one process per GPU, as training jobs (and mpirun -np N) run.
    gpus_per_process: int = 1
    # NCCL release whose tuning constants price latency ("2.18.5"); None: the newest
    # (simulator.network.tuning_versions).
    nccl_version: str | None = None


@dataclass(frozen=True)
class CollectivePlan:
    """How one collective runs: algorithm, protocol, latency and flows on links."""

    op: str
    algorithm: str
    protocol: str
    latency_s: float
    flows: tuple[Flow, ...]     # (route link ids, wire bytes incl. protocol overhead)
    closed_form_s: float        # latency_s + transfer time on idle links
    uses_sms: bool              # False for in-switch reduction (NVLS): little SM work
    nvls: bool
    channels: int = 0           # CUDA blocks NCCL runs it on
    fill_s: float = 0.0         # NVLS pipeline fill, part of latency_s
    floor_s: float = 0.0        # host-floor excess (nccl-tests -g N), part of latency_s
    chunk_bytes: int = 0        # NVLS chunk per channel and head (0: not NVLS)
    passes_s: float = 0.0       # ring passes beyond the first, part of latency_s

    @property
    def transfer_s(self) -> float:
        """Transfer part of the closed form (idle links)."""
        return self.closed_form_s - self.latency_s


class CollectiveModel:
    """Plans collectives on a topology; plans and templates are cached."""

    def __init__(self, topology, options: CommOptions = CommOptions()) -> None:
        for value, allowed in ((options.algorithm, ALGORITHMS), (options.protocol, _ALL_PROTOCOLS)):
            if value is not None and value not in allowed:
                raise ValueError(f"unknown {value!r}; expected one of {', '.join(allowed)}")
        self.topology = topology
        self.options = options
        self._plans: dict = {}
        self._templates: dict = {}
        self._shapes: dict = {}

    # -- public -----------------------------------------------------------------------
    def plan(self, op: str, ranks: tuple[int, ...], size_bytes: float) -> CollectivePlan:
        """The plan NCCL would run for `op` of `size_bytes` on `ranks` (cached)."""
        key = (op, ranks, size_bytes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 1_000_000:
                self._plans.clear()
            plan = self._plans[key] = self._plan(op, tuple(ranks), float(size_bytes))
        return plan

    def time_s(self, op: str, ranks: tuple[int, ...], size_bytes: float) -> float:
        """Closed-form time of the collective on idle links."""
        return self.plan(op, ranks, size_bytes).closed_form_s

    def shape(self, ranks: tuple[int, ...]) -> GroupShape:
        """Per-domain layout of a group (cached)."""
        s = self._shapes.get(ranks)
        if s is None:
            s = self._shapes[ranks] = group_shape(self.topology, ranks)
        return s

    def template(self, op: str, ranks: tuple[int, ...], algorithm: str) -> Template:
        """Size-independent flows of (op, group, algorithm) (cached)."""
        key = (op, ranks, algorithm)
        t = self._templates.get(key)
        if t is None:
            t = self._templates[key] = build_template(self.topology, self.shape(ranks), op,
                                                      algorithm)
        return t

    def algorithms(self, op: str, ranks: tuple[int, ...]) -> tuple[str, ...]:
        """Algorithms the tuner considers for (op, group), honouring a forced one."""
        avail = available(self.topology, self.shape(ranks), op, self.options.nccl_version)
        forced = self.options.algorithm
        if forced == "nvls" and "nvls" not in avail and "nvls_tree" in avail:
            forced = "nvls_tree"   # NVLS across domains is NVLS_Tree in NCCL
        if forced in avail:
            return (forced,)
        env = self.topology.transport.nccl_env   # the cluster's NCCL_ALGO / NVLS_ENABLE
        allowed = tuple(a for a in avail if a in _AUTO and env.allows_algorithm(a))
        return allowed or tuple(a for a in avail if a in _AUTO)

    # -- internals --------------------------------------------------------------------
    def _plan(self, op: str, ranks: tuple[int, ...], size: float) -> CollectivePlan:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
        if op == "send_recv" and len(ranks) != 2:
            raise ValueError(f"send_recv needs ranks=(src, dst), got {ranks}")
        n = len(set(ranks))
        if n <= 1 or size <= 0:
            return CollectivePlan(op, "none", "none", 0.0, (), 0.0, False, False)
        measured = self.topology.measured.get(op, {}).get(n)
        shape = self.shape(ranks)
        if measured is not None:
            # timed by the measurement; the SMs its kernel holds are the ring's channels
            algbw = measured.busbw_Bps / bus_factor(op, n)
            return CollectivePlan(op, "measured", "measured", measured.latency_s, (),
                                  measured.time_s(size, algbw), True, False,
                                  self._channels(shape, "ring", "Simple", size))
        best = None
        rule = self._tuner_rule(op, shape, size)
        for algo in self.algorithms(op, ranks):
            if rule and rule.algorithm and rule.algorithm != algo:
                continue
            template = self.template(op, ranks, algo)
            for proto in self._protocols(algo, shape):
                if rule and rule.protocol and rule.protocol != proto:
                    continue
                eff = self._efficiency(shape, op, algo, proto, size, template)
                channels = self._channels(shape, algo, proto, size)
                if rule and rule.channels > 0 and algo not in _NVLS:
                    channels = rule.channels
                version = self.options.nccl_version
                lat = nccl_latency_s(shape, op, algo, proto, size, channels,
                                     self.topology.net_latency_s, version)
                # The time: the wire's latency where the plugin reports another one, and
                # later recalibrations of the release's constants (tuning_versions).
                wire = self.topology.transport.wire_latency_s
                lat_wire = nccl_latency_s(shape, op, algo, proto, size, channels,
                                          self.topology.net_latency_s if wire is None
                                          else wire, version, timing=True)
                # NCCL's tuner chooses by its own model, which has no pipeline fill
                # [enqueue.cc topoGetAlgoInfo]; the fill is paid after the choice.
                tuned = lat + template.unit_time_s * size / eff
                if best is None or tuned < best[0]:
                    best = (tuned, lat_wire, channels, algo, proto, eff, template)
        tuned, lat, channels, algo, proto, eff, template = best
        if algo == "nvls_tree":
            # The heads' network rate is not in NCCL's tuner (it prices NVLS_Tree at the
            # NVLS graph's bwInter): it slows the chosen plan, not the choice.
            eff = self._efficiency(shape, op, algo, proto, size, template, tuner=False)
        fill, chunk = 0.0, 0
        if algo in _NVLS:
            fill, chunk = self._nvls_fill(op, algo, shape, size, channels, template, eff)
            # Releases before 2.20.3 leave an all-reduce's channels idle below channels
            # x heads x chunk; the busy ones stream at their share of the rate
            # (tuning_versions). The slowdown joins the fill (latency_s); the flows keep
            # the bytes. All-gather / reduce-scatter (blocks of one chunk) not modelled.
            busy = channels if op != "all_reduce" else nvls_active_channels(
                size, channels, nvls_heads(shape), chunk, self.options.nccl_version)
            fill = (fill + template.unit_time_s * size / eff) * channels / busy \
                - template.unit_time_s * size / eff
        t = lat + template.unit_time_s * size / eff + fill
        passes = self._extra_passes_s(op, algo, proto, shape, size, channels)
        t, lat = t + passes, lat + passes
        # A transport that serialises each connection's messages (topologies.transport).
        transport = self.topology.transport
        excess = max(net_message_floor_s(op, algo, shape, size, channels, transport.message_s,
                                         transport.max_message_bytes) - t, 0.0)
        t, lat = t + excess, lat + excess
        floor = max(host_floor_s(self.options.gpus_per_process) - t, 0.0)
        flows = tuple((route, w * size / eff) for route, w in template.flows)
        is_nvls = algo in _NVLS
        return CollectivePlan(op, algo, proto, lat + fill + floor, flows, t + floor,
                              not is_nvls, is_nvls, channels, fill, floor, chunk, passes)

    def _extra_passes_s(self, op: str, algo: str, proto: str, shape: GroupShape,
                        size: float, channels: int) -> float:
        """Per-step latencies of a ring's passes beyond the first (latency.
        ring_pass_latency_s), at the wire's network latency; 0 for other algorithms.
        Like the NVLS fill, NCCL's tuner does not see them: they follow the choice."""
        if algo != "ring" or op not in ("all_reduce", "all_gather", "reduce_scatter"):
            return 0.0
        transport = self.topology.transport
        chunk = ring_chunk_bytes(proto, transport.nccl_env.buffsize_bytes)
        extra = ring_passes(size, shape.n, channels, chunk) - 1
        if extra <= 0:
            return 0.0
        wire = transport.wire_latency_s
        inter = self.topology.net_latency_s if wire is None else wire
        return extra * ring_pass_latency_s(shape, op, proto, inter, self.options.nccl_version)

    def _tuner_rule(self, op: str, shape: GroupShape, size: float):
        """The cluster's tuner-plugin rule for this collective (topologies.transport), or
        None; a forced CommOptions algorithm or protocol overrides the tuner."""
        if self.options.algorithm or self.options.protocol:
            return None
        rule = self.topology.transport.tuner_rule(op, size, shape.num_domains, shape.n)
        if rule is None:
            return None
        # NCCL ignores a tuner's choice of an (algorithm, protocol) it cannot run.
        algos = [a for a in self.algorithms(op, shape.ranks)
                 if rule.algorithm in (None, a)
                 and (rule.protocol is None or rule.protocol in self._protocols(a, shape))]
        return rule if algos else None

    def _nvls_fill(self, op: str, algo: str, shape: GroupShape, size: float, channels: int,
                   template: Template, eff: float) -> tuple[float, int]:
        """NVLS pipeline fill and chunk. The GPU reaches its NIC through a PCIe switch
        (PATH_PXB) on 8-GPU HGX/DGX boards (NVIDIA DGX B200 user guide: GPUs and NICs
        share PCIe switches); assumption: not on GB200, where each compute tray's
        ConnectX NICs attach to the superchips directly."""
        device = self.topology.devices[shape.ranks[0]]
        behind_switch = device.name.lower() not in ("gb200", "gb300")
        nvlink_unit, net_unit = self._nvls_stage_units(shape, op, template, eff)
        return nvls_fill_s(op, algo, shape, size, channels, nvls_heads(shape), nvlink_unit,
                           device_arch(device.name), self.topology.nic_nccl_Bps / 1e9,
                           behind_switch, net_unit, self.options.nccl_version,
                           self.topology.transport.nccl_env.buffsize_bytes)

    def _nvls_stage_units(self, shape: GroupShape, op: str, template: Template,
                          eff: float) -> tuple[float, float]:
        """Streaming time per byte of S of an NVLS pipeline's NVLink stages and of its
        network stages, each at its own part's rate: the in-switch flows bounded by NCCL's
        searched per-head speed; the tree's flows bounded by NVLS_Tree's per-channel cap
        [tuning.cc perChMaxNVLSTreeBw] and, where a domain has more GPUs than heads, the
        heads' network rate. Neither is slower than the whole (template / eff)."""
        whole = template.unit_time_s / eff
        nvlink = max(template.nvlink_unit_s, 1.0 / self._nvls_search_algbw(shape, op))
        net = template.net_unit_s
        if template.algorithm == "nvls_tree":
            device = self.topology.devices[shape.ranks[0]]
            cap = nvls_heads(shape) * per_channel_cap_Bps(
                "nvls_tree", device_arch(device.name), shape.num_domains)
            net = max(net, bus_factor(op, shape.n) / cap,
                      1.0 / self._nvls_search_algbw(shape, op, head_net=True,
                                                    net_only=True))
        return min(nvlink, whole), min(net, whole)

    def _channels(self, shape: GroupShape, algo: str, proto: str, size: float) -> int:
        """Channels NCCL runs the collective on (enqueue.cc topoGetAlgoInfo)."""
        device = self.topology.devices[shape.ranks[0]]
        arch = device_arch(device.name)
        if algo in _NVLS:
            return nvls_channels(arch, shape.num_domains, shape.ppn,
                                 self.topology.nic_nccl_Bps / 1e9, self.options.nccl_version)
        base = coll_channels(arch, shape.num_domains, min(shape.channels, self.topology.rails)
                             if shape.num_domains > 1 else 0)
        base = self.topology.transport.nccl_env.clamp_channels(base)  # NCCL_MIN/MAX_NCHANNELS
        return tuned_channels(base, algo, proto, size, shape.n)

    def _nvls_search_algbw(self, shape: GroupShape, op: str, head_net: bool = False,
                           net_only: bool = False) -> float:
        """NVLS algorithm bandwidth (bytes/s) at NCCL's searched per-head speed: heads x
        speed x nvlsEfficiency x (heads-1)/heads, x2 for all-reduce ("pipelines two
        operations", then x n/nsteps) or x (n-1)/n for all-gather / reduce-scatter
        [tuning.cc ncclTopoTuneModel]; unbounded when every GPU is a head.

        With `head_net`, NVLS_Tree across such domains also moves each head's share
        through the network at NVLS_TREE_HEAD_NET_BPS, in NCCL's shape of that term: x2 on
        2 domains, where each is the root of one double binary tree and a leaf of the
        other, so a head's NIC carries its share once each way instead of twice
        [tuning.cc: interBw = bwInter x (nNodes <= 2 ? 2 : 1); trees.cc ncclGetDtree].
        `net_only` keeps that network term alone (the rate of NVLS_Tree's network
        stages)."""
        device = self.topology.devices[shape.ranks[0]]
        heads, n = nvls_heads(shape), shape.n
        if heads < 2 or heads >= shape.ppn:
            # One head per GPU (<= 32 GPUs per domain): the links alone match nccl-tests
            # (5-8 x H100 NVLS 420-480 GB/s, NVIDIA/nccl issue 1455), where the search's
            # quantised speed would say 408 at 7 GPUs. With more GPUs than heads (NVL72),
            # every GPU's NVLink carries 33 head paths at one searched speed.
            return float("inf")
        speed = nvls_search_speed_GBps(device_arch(device.name), heads,
                                       device.nccl_nvlink_Bps / 1e9) * 1e9
        per_head = speed * nvls_efficiency(device.name) * (heads - 1) / heads
        if net_only:
            per_head = float("inf")
        if op == "all_reduce":
            per_head *= 2
            if head_net and shape.num_domains > 1:
                per_head = min(per_head, NVLS_TREE_HEAD_NET_BPS
                               * (2 if shape.num_domains <= 2 else 1))
            return heads * per_head * n / (2 * (n - 1))
        return heads * per_head * (n - 1) / n

    def _protocols(self, algo: str, shape: GroupShape | None = None) -> tuple[str, ...]:
        protos = _PROTOCOLS.get(algo, _ALL_PROTOCOLS)
        transport = self.topology.transport
        if shape is not None and shape.num_domains > 1 and not transport.gpudirect_rdma:
            # host-staged NIC path (PATH_PHB): NCCL turns LL128 off [tuning.cc typeInter]
            protos = tuple(p for p in protos if p != "LL128") or protos
        forced = self.options.protocol
        if forced in protos:
            return (forced,)
        env = self.topology.transport.nccl_env   # the cluster's NCCL_PROTO
        return tuple(p for p in protos if env.allows_protocol(p)) or protos

    def _efficiency(self, shape: GroupShape, op: str, algo: str, proto: str, size: float,
                    template: Template, tuner: bool = True) -> float:
        """Payload fraction of wire bytes for (algorithm, protocol) at this size.

        NCCL's llMaxBw cap on LL bus bandwidth becomes a lower payload fraction, so the
        flows carry it too: eff = min(LL factor, llMaxBw / link-limited busBw).
        """
        device = self.topology.devices[shape.ranks[0]]
        if algo in _NVLS and template.unit_time_s > 0:
            # nvlsEfficiency is in the template's flows; NCCL's searched per-head speed
            # bounds the in-domain part, and NVLS_Tree's heads have NCCL's per-channel cap.
            eff = min(1.0, self._nvls_search_algbw(shape, op, head_net=not tuner)
                      * template.unit_time_s)
            if algo == "nvls_tree":
                cap = nvls_heads(shape) * per_channel_cap_Bps(
                    "nvls_tree", device_arch(device.name), shape.num_domains)
                eff = min(eff, cap * template.unit_time_s / bus_factor(op, shape.n))
            return eff
        if algo in _NVLS or algo == "collnet_chain":
            return 1.0
        if algo == "pat":
            return PAT_EFFICIENCY
        if algo == "collnet_direct":
            hopper_on = device_arch(device.name) in ("hopper", "blackwell")
            return COLLNET_DIRECT_SM90_EFFICIENCY if hopper_on else 1.0
        if algo == "tree":
            eff = TREE_EFFICIENCY[proto]
            if proto == "LL128" and shape.num_domains == 1:
                eff = TREE_LL128_ONE_NODE_EFFICIENCY
            eff *= tree_correction(proto, size)
            link_busbw = 2.0 / template.unit_time_s   # Tree: busBw = 2 x algBw (NCCL)
        else:
            eff = (ring_efficiency(op, proto, shape.num_domains, shape.ppn,
                                   self.options.nccl_version)   # the release's rating
                   if algo == "ring" else RING_EFFICIENCY[proto])
            link_busbw = bus_factor(op, shape.n) / template.unit_time_s
        if proto == "LL" and algo != "p2p" and template.unit_time_s > 0:
            # Tree's size correction multiplies the capped bandwidth too: NCCL caps busBw
            # at llMaxBw in ncclTopoTuneModel and applies treeCorrectionFactor to the
            # result in ncclTopoGetAlgoTime [tuning.cc].
            eff = min(eff, ll_max_bw_Bps(device.name, shape.num_domains,
                                         self.options.nccl_version) / link_busbw
                      * (tree_correction(proto, size) if algo == "tree" else 1.0))
        kind = {("ring", "LL128"): "ring_LL128", ("tree", "LL128"): "tree_LL128"}.get(
            (algo, proto), "tree" if algo == "tree" else None)
        if kind and template.unit_time_s > 0:
            # Across nodes one search channel per NIC rail the group reaches [search.cc].
            search = (min(ring_rails(shape), self.topology.rails) if shape.num_domains > 1
                      else one_node_search_channels(device_arch(device.name)))
            cap = search * per_channel_cap_Bps(kind, device_arch(device.name),
                                               shape.num_domains)
            eff = min(eff, cap / link_busbw * (tree_correction(proto, size)
                                               if algo == "tree" else 1.0))
        return eff
