"""How each NCCL algorithm moves bytes: a collective as flows on the topology's links.

A `Template` is the size-independent part of a collective: its flows with bytes per byte
of the collective's size S (nccl-tests convention: all-gather output, reduce-scatter
input, all-reduce buffer, all-to-all per-rank buffer), and their completion time per
byte of S on idle links. A plan scales it by S and the protocol's wire overhead.

Decompositions (NCCL's algorithms, src/graph/tuning.cc; docs/references.md, sections 1
and 7):
  * ring: NCCL builds one ring per channel; inside a domain a channel visits the group's
    GPUs over NVLink, then leaves for the next domain. Channel c starts each domain's
    segment at the domain's c-th member, so its inter-domain edge lands on that member's
    rail: with ppn members per domain, ppn channels use ppn different NICs.
    Every ring edge carries bus_factor x S in total over the channels.
  * tree: a chain inside each domain plus NCCL's double binary tree between domains
    (ncclGetDtree), one tree per half of the data; each edge carries its share up
    (reduce) and down (broadcast).
  * nvls: in-switch reduction on one NVSwitch domain: each GPU pushes S into the switch
    (multimem.ld_reduce reads every slice: S up, S/n down) and the reduced slices are
    multicast back (S/n up, S down): (n+1)/n x S each way, at NCCL's nvlsEfficiency
    (NVLink SHARP).
  * nvls_tree: nvls inside each domain, and a double binary tree between domains on 1/ppn
    of the data per rail, all pipelined.
  * hierarchical: ring reduce-scatter inside each domain, ring all-reduce across domains
    on S/ppn per rail, ring all-gather inside, all pipelined. Not an NCCL
    algorithm (NCCL's form of it is nvls_tree): only used when forced.
  * collnet_direct / collnet_chain (InfiniBand SHARP, when the fabric has it): inside each
    domain a reduce-scatter (Direct: every GPU with its NIC is a head) or a chain to the
    channel's head (Chain), then each head sends its S/ppn share up to its leaf switch,
    which reduces across domains and sends the result back, then the domain all-gathers.
  * pat: NCCL's Parallel Aggregated Trees for all-gather / reduce-scatter with one GPU per
    node: each rank's NIC moves what the ring's does, at 0.75 of the bandwidth [tuning.cc].
  * p2p: all-to-all sends S/n from every rank to every other rank (PXN routes), send_recv
    one flow.
NVLS uses at most NCCL_MAX_NVLS_ARITY = 32 heads per domain [search.cc, device.h], so
NVLS_Tree crosses domains on at most 32 rails.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from topologies.topology import SPINE, gpu_node, leaf_node, nic_node, nvswitch_node

from .channels import MAX_NVLS_ARITY, MAX_RING_SEARCH_CHANNELS
from .constants import COLLNET_MAX_LOCAL_RANKS, bus_factor, nvls_efficiency
from .fluid import Flow, idle_time_s
from .tuning_versions import NVLS_TWO_GPUS_FROM, PAT_FROM, released_before


@dataclass(frozen=True)
class GroupShape:
    """Where a group's ranks sit: members of each NVLink domain, sorted by local index."""

    ranks: tuple[int, ...]
    domains: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        """Group size."""
        return len(self.ranks)

    @property
    def num_domains(self) -> int:
        """Number of NVLink domains the group spans."""
        return len(self.domains)

    @property
    def ppn(self) -> int:
        """Largest number of members in one domain."""
        return max(len(m) for m in self.members)

    @property
    def channels(self) -> int:
        """Rings/trees that use distinct rails: the smallest per-domain member count."""
        return min(len(m) for m in self.members)

    @property
    def regular(self) -> bool:
        """Same number of members, at the same local indices, in every domain."""
        return len({len(m) for m in self.members}) == 1


def group_shape(topology, ranks: tuple[int, ...]) -> GroupShape:
    """Split a group into per-domain member lists."""
    by_domain: dict[int, list[int]] = defaultdict(list)
    for r in ranks:
        by_domain[topology.domain_of(r)].append(r)
    domains = tuple(sorted(by_domain))
    members = tuple(tuple(sorted(by_domain[d], key=topology.local_index)) for d in domains)
    return GroupShape(tuple(ranks), domains, members)


@dataclass(frozen=True)
class Template:
    """Flows of one (op, group, algorithm) per byte of S, and their idle-link time per byte."""

    algorithm: str
    flows: tuple[Flow, ...]
    unit_time_s: float
    # NVLS / NVLS_Tree: idle-link time per byte of S of the in-switch part alone and of
    # the inter-domain tree part alone (0 when absent): the rates of the pipeline's
    # NVLink stages and network stages (latency.nvls_fill_s).
    nvlink_unit_s: float = 0.0
    net_unit_s: float = 0.0


def _rot(seq: tuple[int, ...], c: int) -> tuple[int, ...]:
    c %= len(seq)
    return seq[c:] + seq[:c]


def _ring_pairs(shape: GroupShape, op: str, root: int) -> list[tuple[int, int, float]]:
    n = shape.n
    per_edge = bus_factor(op, n)
    channels = ring_rails(shape) if shape.num_domains > 1 else 1
    pairs = []
    for c in range(channels):
        order = [r for m in shape.members for r in _rot(m, c)]
        edges = [(order[i], order[(i + 1) % n]) for i in range(n)]
        if op in ("broadcast", "reduce"):
            start = order.index(root)   # a chain from the root, open at the root
            edges = [(order[(start + i) % n], order[(start + i + 1) % n]) for i in range(n - 1)]
            if op == "reduce":
                edges = [(b, a) for a, b in edges]
        pairs += [(a, b, per_edge / channels) for a, b in edges]
    return pairs


def dtree_edges(k: int) -> list[list[tuple[int, int]]]:
    """NCCL's double binary tree on k nodes: two lists of (parent, child) edges.

    Tree 0: node r's parent clears r's lowest set bit and sets the next one (clearing
    only, if that leaves the range); odd nodes are leaves. Tree 1 mirrors it (k even) or
    shifts it by one (k odd) so that leaves of one tree are inner nodes of the other
    [NVIDIA/nccl src/graph/trees.cc ncclGetBtree/ncclGetDtree].
    """
    tree0 = []
    for r in range(1, k):
        low = r & -r
        up = (r ^ low) | (low << 1)
        if up >= k:
            up = r ^ low
        tree0.append((up, r))
    if k % 2 == 0:
        tree1 = [(k - 1 - p, k - 1 - c) for p, c in tree0]
    else:
        tree1 = [((p + 1) % k, (c + 1) % k) for p, c in tree0]
    return [tree0, tree1]


def _tree_between(heads: list[int], share: float) -> list[tuple[int, int, float]]:
    """Double binary tree among `heads`, `share` of S in total: each tree moves half of
    it up (reduce) and down (broadcast) every edge."""
    pairs = []
    for tree in dtree_edges(len(heads)):
        for p, c in tree:
            pairs += [(heads[c], heads[p], share / 2), (heads[p], heads[c], share / 2)]
    return pairs


def ring_rails(shape: GroupShape) -> int:
    """Rings (and trees) with their own NIC: one per search channel, at most
    MAXCHANNELS / 2 = 32 [NVIDIA/nccl src/init.cc ringGraph->maxChannels]."""
    return min(shape.channels, MAX_RING_SEARCH_CHANNELS)


def _tree_pairs(shape: GroupShape) -> list[tuple[int, int, float]]:
    channels = ring_rails(shape)
    pairs = []
    for c in range(channels):
        chains = [_rot(m, c) for m in shape.members]
        for chain in chains:  # reduce toward chain[0], broadcast back
            for a, b in zip(chain, chain[1:]):
                pairs += [(b, a, 1.0 / channels), (a, b, 1.0 / channels)]
        if shape.num_domains > 1:
            pairs += _tree_between([ch[0] for ch in chains], 1.0 / channels)
    return pairs


def _hier_pairs(shape: GroupShape) -> list[tuple[int, int, float]]:
    p, d = shape.ppn, shape.num_domains
    pairs = []
    for m in shape.members:  # reduce-scatter + all-gather rings inside the domain
        pairs += [(m[i], m[(i + 1) % p], 2.0 * (p - 1) / p) for i in range(p) if p > 1]
    for k in range(p):       # all-reduce ring across domains on S/p, rail of member k
        col = [m[k] for m in shape.members]
        pairs += [(col[i], col[(i + 1) % d], 2.0 * (d - 1) / d / p) for i in range(d)]
    return pairs


def _nvls_links(topology, shape: GroupShape, eff: float, op: str) -> list[Flow]:
    """Per-GPU up and down NVSwitch flows (per byte of S, / eff) of in-switch collectives.

    all-reduce: (n_d+1)/n_d x S each way; all-gather: S/n up, S down (multicast);
    reduce-scatter: S up (multimem.ld_reduce reads every slice), S/n down.
    """
    flows = []
    for dom, m in zip(shape.domains, shape.members):
        k = len(m)
        up, down = {"all_gather": (1 / k, 1.0), "reduce_scatter": (1.0, 1 / k)}.get(
            op, ((k + 1) / k, (k + 1) / k))
        sw = nvswitch_node(dom)
        for r in m:
            g = gpu_node(r)
            flows += [((topology.edge_id[(g, sw)],), up / eff),
                      ((topology.edge_id[(sw, g)],), down / eff)]
    return flows


def nvls_heads(shape: GroupShape) -> int:
    """GPUs per domain that lead an NVLS channel (and carry NVLS_Tree's network part)."""
    return min(MAX_NVLS_ARITY, shape.channels)


def _collnet_links(topology, shape: GroupShape) -> list[Flow]:
    """Each head's NIC sends its S/ppn share to its leaf switch (SHARP reduces there) and
    receives the result; leaves of different groups meet at the spine the same way."""
    ppn = shape.ppn
    flows: list[Flow] = []
    per_leaf = max(topology.domains_per_leaf, 1)
    groups = sorted({d // per_leaf for d in shape.domains})
    for k in range(ppn):
        rail = topology.local_index(shape.members[0][k]) % max(topology.rails, 1)
        for dom, m in zip(shape.domains, shape.members):
            leaf, nic, relay = leaf_node(dom // per_leaf, rail), nic_node(dom, rail), \
                gpu_node(dom * topology.domain_size + rail)
            for a, b in ((relay, nic), (nic, leaf)):
                flows += [((topology.edge_id[(a, b)],), 1.0 / ppn),
                          ((topology.edge_id[(b, a)],), 1.0 / ppn)]
        if len(groups) > 1:
            for g in groups:
                leaf = leaf_node(g, rail)
                flows += [((topology.edge_id[(leaf, SPINE)],), 1.0 / ppn),
                          ((topology.edge_id[(SPINE, leaf)],), 1.0 / ppn)]
    return flows


def _collnet_pairs(shape: GroupShape, chain: bool) -> list[tuple[int, int, float]]:
    """NVLink part of CollNet: reduce-scatter + all-gather inside (Direct) or a chain to
    and from the head (Chain)."""
    if chain:
        return _tree_pairs_intra(shape)
    pairs = []
    for m in shape.members:
        p = len(m)
        pairs += [(a, b, 2.0 / p) for a in m for b in m if a != b]
    return pairs


def _tree_pairs_intra(shape: GroupShape) -> list[tuple[int, int, float]]:
    pairs = []
    channels = shape.channels
    for c in range(channels):
        for chain in (_rot(m, c) for m in shape.members):
            for a, b in zip(chain, chain[1:]):
                pairs += [(b, a, 1.0 / channels), (a, b, 1.0 / channels)]
    return pairs


def _p2p_pairs(shape: GroupShape, op: str) -> list[tuple[int, int, float]]:
    if op == "send_recv":
        return [(shape.ranks[0], shape.ranks[1], 1.0)]
    n = shape.n
    return [(a, b, 1.0 / n) for a in shape.ranks for b in shape.ranks if a != b]


def nvls_supported(topology, shape: GroupShape, version: str | None = None) -> bool:
    """NCCL's nvlsSupport: every GPU has NVLink SHARP and, before 2.28.7, the group has
    more than 2 GPUs in each NVLink domain (ncclNvlsInit: no multicast when the
    communicator's GPUs on the node number <= 2 up to v2.28.3-1, < 2 from v2.28.7-1)
    [NVIDIA/nccl src/transport/nvls.cc at those tags; tuning_versions]."""
    least = 2 if released_before(version, NVLS_TWO_GPUS_FROM) else 1
    return (shape.channels > least
            and all(topology.devices[r].nvls for r in shape.ranks))


def available(topology, shape: GroupShape, op: str,
              version: str | None = None) -> tuple[str, ...]:
    """Algorithms that can run `op` on this group (before any forcing); `version`: the
    NCCL release (None: the newest), which sets when NVLS is supported."""
    if shape.n <= 1:
        return ()
    if op in ("all_to_all", "send_recv"):
        return ("p2p",)
    nvls = nvls_supported(topology, shape, version)
    if op in ("all_gather", "reduce_scatter"):
        # NVLS AG/RS: one domain, at most NCCL_MAX_NVLS_ARITY local ranks [enqueue.cc].
        one = nvls and shape.num_domains == 1 and shape.n <= MAX_NVLS_ARITY
        # PAT: one GPU per node only (nNodes == nRanks), from 2.23 [tuning.cc ncclPatEnable].
        pat = shape.num_domains == shape.n and not released_before(version, PAT_FROM)
        return ("ring",) + (("nvls",) if one else ()) + (("pat",) if pat else ())
    if op != "all_reduce":
        return ("ring",)
    algos = ["ring", "tree"]
    if nvls and shape.num_domains == 1:
        algos.append("nvls")
    if shape.num_domains > 1 and shape.regular:
        if nvls and shape.ppn >= 2:
            algos.append("nvls_tree")
        if getattr(topology, "collnet", False) and shape.ppn <= COLLNET_MAX_LOCAL_RANKS:
            algos += ["collnet_direct", "collnet_chain"]
        algos.append("hierarchical")
    return tuple(algos)


def build_template(topology, shape: GroupShape, op: str, algorithm: str) -> Template:
    """Flows (per byte of S) of `op` run with `algorithm` on the group, on idle links."""
    extra: list[Flow] = []
    if algorithm in ("ring", "pat"):   # PAT moves what the ring moves, per NIC
        pairs = _ring_pairs(shape, op, shape.ranks[0])
    elif algorithm == "tree":
        pairs = _tree_pairs(shape)
    elif algorithm == "hierarchical":
        pairs = _hier_pairs(shape)
    elif algorithm == "p2p":
        pairs = _p2p_pairs(shape, op)
    elif algorithm in ("collnet_direct", "collnet_chain"):
        pairs = _collnet_pairs(shape, chain=algorithm == "collnet_chain")
        extra = _collnet_links(topology, shape)
    elif algorithm in ("nvls", "nvls_tree"):
        pairs = []
        if algorithm == "nvls_tree":
            heads = nvls_heads(shape)
            for k in range(heads):
                pairs += _tree_between([m[k] for m in shape.members], 1.0 / heads)
        eff = nvls_efficiency(topology.devices[shape.ranks[0]].name)
        extra = _nvls_links(topology, shape, eff, op)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    pair_flows = _aggregate(topology, pairs, [])
    flows = _aggregate(topology, pairs, extra)
    caps = np.asarray(topology.link_nccl_Bps, dtype=float)
    if algorithm in ("nvls", "nvls_tree"):
        return Template(algorithm, flows, idle_time_s(flows, caps),
                        idle_time_s(_aggregate(topology, [], extra), caps),
                        idle_time_s(pair_flows, caps))
    return Template(algorithm, flows, idle_time_s(flows, caps))


def _aggregate(topology, pairs: list[tuple[int, int, float]],
               extra: list[Flow]) -> tuple[Flow, ...]:
    """Rank-to-rank shares routed on the topology, plus link-level flows, summed per route."""
    agg: dict[tuple[int, ...], float] = defaultdict(float)
    for a, b, w in pairs:
        route = topology.route(a, b)
        if route and w > 0:
            agg[route] += w
    for route, w in extra:
        agg[route] += w
    return tuple(sorted(agg.items()))
