"""The token dispatchers: what an MoE layer moves, over which group, as graph events.

Megatron-LM (NVIDIA/Megatron-LM commit d98e8a64, megatron/core/transformer/moe/
token_dispatcher.py) and DeepEP (deepseek-ai/DeepEP commit dd758caf). T is the tokens a
rank routes (its sequence shard under sequence parallelism), r the rows the hottest rank's
experts get per routed token (top_k x imbalance, capacity applied: imbalance.py), d the
hidden size, b the activation bytes; sizes are nccl-tests sizes (all-to-all: the per-rank
buffer; all-gather: the output; reduce-scatter: the input). Megatron's expert-TP group
(ETP, expt_tp) is the TP group when etp = tp; etp = 1 keeps each expert whole on a rank.

alltoall (MoEAlltoAllTokenDispatcher): permute (token rows sorted by expert, k copies);
  all-to-all over EP of the rows (T r d b) and of their probabilities (T r b); with ETP an
  all-gather of both over ETP (tp T r d b, tp T r b) and, when a rank holds several
  experts, sort_chunks_by_idxs (rows regrouped by local expert); the experts; the reverse
  sort, a reduce-scatter over ETP, the combine all-to-all (T r d b) and unpermute (each
  token's k rows summed back). Backward: the transpose of each collective, same sizes.
allgather (MoEAllGatherTokenDispatcher): all-gathers over TP x EP (ETP x EP) of the hidden
  states (T g d b for a group of g ranks), the probabilities and the routing map (T g E b
  and T g E bytes: one per token and expert; the map has no gradient); a local permute of
  the rows for the rank's experts; unpermute back to all g T gathered rows, then a
  reduce-scatter over the same group (T g d b).
deepep (Megatron's flex dispatcher with the DeepEP backend, _DeepepManager): one fused
  dispatch and one fused combine kernel over TP x EP, the probabilities inside; DeepEP
  sends a token once per destination rank (is_token_in_rank), and across nodes once per
  destination node over RDMA, forwarded over NVLink inside it (csrc/kernels/legacy/
  internode.cu; its normal kernels group ranks by 8 NVLink peers, csrc/legacy/buffer.hpp
  LEGACY_NUM_MAX_NVL_PEERS). The engine prices a flat all-to-all, so the dispatch is one of
  the per-rank size that puts DeepEP's RDMA bytes on the inter-node links (deepep_bytes).
  Across nodes the kernels move their inter-node bytes slower than the NIC's line rate:
  the flat all-to-all lasts at least those bytes at the rate their own benchmarks give
  (ep_rdma.py: HybridEP on H100 and DeepEP's legacy kernels, 21-45 GB/s of a 50 GB/s NIC),
  while its links carry only the bytes; the dispatch's backward is a combine and the
  combine's a dispatch, each at its own rate. HybridEP
  on an NVL72 rack (its MNNVL path) holds the whole group in one NVLink domain: a token
  goes once to each rank holding one of its experts, and inside one domain the kernels
  run no faster than their own benchmark (ep_nvlink.py). HybridEP first all-gathers the
  ranks' routing maps over the group (T g ETP E bytes) for its metadata, once per forward
  dispatch, and the host waits for it (_routing_map_gather, host_sync_label).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..explicit_comm import ExplicitComm
from ..layouts import R, S
from .ep_nvlink import nvlink_kernel_Bps
from .ep_rdma import MNNVL_GPUS, rdma_kernel_Bps
from .group_routing import block_hit, round_robin_hit

if TYPE_CHECKING:  # pragma: no cover
    from ..layer_graph import LayerGraph, Node

# DeepEP's normal (legacy) kernels: NVLink peers per node (NUM_MAX_NVL_PEERS,
# csrc/legacy/buffer.hpp). DeepEP itself, not the topology, groups the ranks: each block of
# 8 consecutive ranks are one node's NVLink peers, the blocks talk over RDMA. Where a
# topology's NVLink domains do not hold whole blocks (say 4 GPUs per node), DeepEP cannot
# run that way: the simulator refuses the plan there (simulator/api.py, check_deepep).
DEEPEP_NVL_PEERS = 8


def deepep_blocks(ranks) -> list[tuple[int, ...]]:
    """The ranks of a dispatch group split into DeepEP's NVLink-peer blocks."""
    blocks: dict[int, list[int]] = {}
    for rank in ranks:
        blocks.setdefault(rank // DEEPEP_NVL_PEERS, []).append(rank)
    return [tuple(block) for block in blocks.values()]
MAP_BYTES = 1   # the routing map is a bool per token and expert

# Kernel launches of the alltoall dispatcher's forward, as Megatron-LM runs it with
# moe_permute_fusion (which the Megatron-Bridge MoE recipes set) (NVIDIA/Megatron-LM
# d98e8a64 token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess and
# _maybe_dtoh_and_synchronize; Transformer Engine d0067d0d transformer_engine/pytorch/
# triton/permutation.py):
# - token counting with EP > 1: routing_map.sum(0) and .long() (2), the input splits'
#   sum (1), the local experts' slice .contiguous() (1), the sums for the output splits,
#   the TP splits and the local experts' counts (3), and the device-to-host copies of
#   tokens_per_expert, input_splits, output_splits and output_splits_tp (4): 11; the
#   counts' all-gather over the EP group is its own collective (COUNT_BYTES per expert).
#   Without EP: the sum, .long() and one copy (3).
# - the fused permute: make_row_id_map's three Triton passes and the permute kernel (4);
#   sort_chunks_by_map: make_chunk_sort_map and the sort (2).
# The host then waits for those copies before the all-to-all (cuda_sync_point
# "before_ep_alltoall"), so the GPU's queue is empty when the host resumes: the kernels
# after it run as fast as the host issues them (host_sync_label; the engine's host
# timeline, simulator/host_timeline.py); the wait's own wake-up latency is not priced.
COUNT_LAUNCHES_EP = 11
COUNT_LAUNCHES_LOCAL = 3
PERMUTE_LAUNCHES = 4
SORT_CHUNKS_LAUNCHES = 2
COUNT_BYTES = 8   # tokens per expert as int64 (routing_map.sum(dim=0).long())


# The task of an MoE layer's forward after which the host waits for the device, by
# dispatcher. Dropless routing gives each expert a number of rows known only on the device,
# and the host needs it: Transformer Engine's GroupedLinear takes the rows per expert as a
# host list (m_splits), and the collectives take host split sizes.
# - alltoall: the tokens-per-expert copies wait for the counts' all-gather over EP
#   (MoEAlltoAllTokenDispatcher.preprocess, cuda_sync_point "before_ep_alltoall" with EP or
#   TP > 1); without EP the sync point moves later, after the local permute whose counts
#   it reads. With moe_pad_expert_input_to_capacity every expert gets its capacity: no copy,
#   no sync (preprocess sets cuda_sync_point "no_sync" under drop_and_pad).
# - allgather: MoEAllGatherTokenDispatcher copies tokens_per_expert to the host after the
#   local permute, before the experts (token_dispatcher.py, token_permutation).
# - deepep: the normal dispatch's host waits for the received-token counts its notify
#   kernel writes to host-mapped memory before it sizes the receive buffers (DeepEP
#   csrc/legacy/deep_ep.cpp, Buffer::dispatch busy-waits on moe_recv_counter), i.e. right
#   after the router's output it reads: the host waits for the router.
# - deepep with HybridEP's kernels: its blocking dispatch synchronises the stream after the
#   metadata preprocessing, whose routing maps are gathered over the group first
#   (_routing_map_gather; DeepEP hybrid-ep executor.cu cudaStreamSynchronize, "Stream Sync
#   (blocking)" in docs/Hybrid-EP_Implementation.md): Megatron-Core passes no
#   num_permuted_tokens without moe_expert_rank_capacity_factor, so the dispatch blocks.
# (NVIDIA/Megatron-LM d98e8a64 megatron/core/transformer/moe/token_dispatcher.py,
# _HybridEPManager.setup_metadata.)
SYNC_LABELS = {"alltoall": "moe.dispatch_counts", "allgather": "permute.fwd",
               "deepep": "router_topk.fwd", "hybridep": "moe.routing_map"}


def host_sync_label(dispatcher: str, ep: int, pad_to_capacity: bool,
                    flex_backend: str = "deepep", etp: int = 1,
                    gate: str = "router") -> str | None:
    """Label of the forward task an MoE layer's host waits for (None: no wait). HybridEP's
    kernels wait for the routing maps' gather wherever their group (ETP x EP) has more
    than one rank. DeepEP's host waits for what precedes its dispatch, the round-robin
    gate's indices where that gate replaces the router (moe.gate)."""
    if pad_to_capacity:
        return None
    if dispatcher == "alltoall" and ep == 1:
        return "permute.fwd"
    if dispatcher == "deepep" and flex_backend == "hybridep" and ep * etp > 1:
        return SYNC_LABELS["hybridep"]
    label = SYNC_LABELS[dispatcher]
    return "router_round_robin.fwd" if label == "router_topk.fwd" and gate == "round_robin" \
        else label


@dataclass(frozen=True)
class Geometry:
    """Per-rank sizes of one MoE layer for one micro-batch."""

    tokens: float        # tokens this rank routes (T)
    top_k: int
    rows: float          # rows per routed token the hottest rank's experts get (r)
    sent: float          # rows per routed token a rank permutes and sends
    hidden: int
    num_experts: int
    act_bytes: int
    tp: int
    etp: int
    ep: int
    group: tuple[str, ...]   # the dispatcher's group: ("ep",) or ("tp", "ep") with ETP
    group_ranks: tuple[int, ...]   # rank 0's members of that group (DeepEP's node split)
    gpu: str = ""        # the device lowered for (ep_rdma.py: NVL72 GPUs have no RDMA stage)
    flex_backend: str = "deepep"   # the deepep dispatcher's kernels: deepep | hybridep
    flex_sms: int = 0    # SMs those kernels hold (MoEOptions.dispatcher_sms)
    expert_groups: int = 0        # group-limited routing: groups, and a token's groups
    groups_per_token: int = 0     # (ModelSpec.expert_groups; moe/group_routing.py)
    round_robin: bool = False     # moe.gate "round_robin": consecutive experts per token

    @property
    def local_experts(self) -> int:
        """Experts one EP rank holds."""
        return self.num_experts // self.ep

    @property
    def group_size(self) -> int:
        """Ranks of the dispatcher's group."""
        return len(self.group_ranks)

    @property
    def expert_layout(self) -> str:
        """Layout of the expert rows over TP: gathered (R) with ETP, else the rank's own
        sequence shard (S), or R with no TP."""
        return R if self.etp > 1 or self.tp == 1 else S


def dispatch(g: "LayerGraph", geo: Geometry, dispatcher: str, x: "Node", gate: "Node"):
    """The dispatch events; returns (expert input rows, the probabilities node the
    combine consumes)."""
    return {"alltoall": _alltoall_dispatch, "allgather": _allgather_dispatch,
            "deepep": _deepep_dispatch}[dispatcher](g, geo, x, gate)


def combine(g: "LayerGraph", geo: Geometry, dispatcher: str, y: "Node", probs: list,
            out_layout: str) -> "Node":
    """The combine events after the experts' output `y`; returns the tokens in
    `out_layout` (the dispatcher's input layout)."""
    return {"alltoall": _alltoall_combine, "allgather": _allgather_combine,
            "deepep": _deepep_combine}[dispatcher](g, geo, y, probs, out_layout)


def _both_ways(op: str, group: tuple[str, ...], nbytes: float, bwd_op: str | None,
               grad_layout: str | None = None, stream: str = "ep") -> ExplicitComm:
    return ExplicitComm(op, group, nbytes, bwd_op, nbytes if bwd_op else 0.0, grad_layout,
                        stream)


# ---- alltoall ---------------------------------------------------------------------------
def _alltoall_dispatch(g, geo: Geometry, x, gate):
    t, r, d, b = geo.tokens, geo.rows, geo.hidden, geo.act_bytes
    counting = COUNT_LAUNCHES_EP if geo.ep > 1 else COUNT_LAUNCHES_LOCAL
    # permute: read each token once, write its `sent` routed copies (with the token
    # counting's launches before it)
    rows = g.elementwise("permute", [x], rows_scale=geo.sent, rw=(1.0 / geo.sent, 1.0),
                         passthrough=True, launches=counting + PERMUTE_LAUNCHES)
    probs = gate
    if geo.ep > 1:
        # every EP rank's tokens per expert, gathered (gather_from_sequence_parallel_region
        # over the tp_ep group); the all-to-all's splits wait for it on the host
        counts = g.explicit_comm("dispatch_counts", gate, _both_ways(
            "all_gather", ("ep",), geo.ep * geo.num_experts * COUNT_BYTES, None), features=1)
        a2a = _both_ways("all_to_all", ("ep",), t * r * d * b, "all_to_all")
        rows = g.explicit_comm("dispatch", rows, a2a, rows_scale=r)
        rows.inputs.append(counts)
        pa2a = _both_ways("all_to_all", ("ep",), t * r * b, "all_to_all")
        probs = g.explicit_comm("dispatch_probs", gate, pa2a, rows_scale=r, features=1)
    if geo.etp > 1:
        gather = _both_ways("all_gather", ("tp",), geo.tp * t * r * d * b, "reduce_scatter",
                            S, stream="tp")
        rows = g.explicit_comm("dispatch_gather", rows, gather, layout=R, rows_scale=r)
        pgather = _both_ways("all_gather", ("tp",), geo.tp * t * r * b, "reduce_scatter",
                             S, stream="tp")
        probs = g.explicit_comm("dispatch_probs_gather", probs, pgather, layout=R,
                                rows_scale=r, features=1)
    if geo.local_experts > 1:
        # rows arrive grouped by source rank; regrouped by local expert (Megatron-LM
        # sort_chunks_by_idxs runs whenever a rank holds several experts)
        rows = g.elementwise("sort_chunks", [rows], rw=(1.0, 1.0), passthrough=True,
                             launches=SORT_CHUNKS_LAUNCHES)
    return rows, probs


def _alltoall_combine(g, geo: Geometry, y, probs, out_layout):
    t, r, d, b = geo.tokens, geo.rows, geo.hidden, geo.act_bytes
    if geo.local_experts > 1:
        y = g.elementwise("unsort_chunks", [y], rw=(1.0, 1.0), passthrough=True,
                          launches=SORT_CHUNKS_LAUNCHES)
    if geo.etp > 1:
        scatter = _both_ways("reduce_scatter", ("tp",), geo.tp * t * r * d * b, "all_gather",
                             R, stream="tp")
        y = g.explicit_comm("combine_scatter", y, scatter, layout=S)
    if geo.ep > 1:
        y = g.explicit_comm("combine", y, _both_ways("all_to_all", ("ep",), t * r * d * b,
                                                     "all_to_all"))
    # unpermute: each token's routed rows, weighted, summed into one
    out = g.elementwise("unpermute", [y], layout=out_layout, rows_scale=1.0,
                        rw=(geo.sent, 1.0), passthrough=True)
    out.inputs.extend(probs)   # probabilities (and aux loss): their gradients flow back
    return out


# ---- allgather --------------------------------------------------------------------------
def _allgather_dispatch(g, geo: Geometry, x, gate):
    t, d, b, n, e = geo.tokens, geo.hidden, geo.act_bytes, geo.group_size, geo.num_experts
    layout = geo.expert_layout
    rows, probs = x, gate
    if n > 1:
        grad = x.layout
        gather = _both_ways("all_gather", geo.group, t * n * d * b, "reduce_scatter", grad)
        rows = g.explicit_comm("dispatch", x, gather, layout=layout, rows_scale=geo.ep)
        pgather = _both_ways("all_gather", geo.group, t * n * e * b, "reduce_scatter",
                             gate.layout)
        probs = g.explicit_comm("dispatch_probs", gate, pgather, layout=layout,
                                rows_scale=geo.ep)
        mgather = _both_ways("all_gather", geo.group, t * n * e * MAP_BYTES, None)
        g.explicit_comm("dispatch_map", gate, mgather, layout=layout, rows_scale=geo.ep)
    # the gathered rows routed to this rank's experts, in expert order
    rows = g.elementwise("permute", [rows], rows_scale=geo.rows, rw=(1.0, 1.0),
                         passthrough=True)
    return rows, probs


def _allgather_combine(g, geo: Geometry, y, probs, out_layout):
    t, d, b, n = geo.tokens, geo.hidden, geo.act_bytes, geo.group_size
    # unpermute into all gathered rows (zeros where another rank's experts were)
    out = g.elementwise("unpermute", [y], rows_scale=float(geo.ep),
                        rw=(geo.rows / geo.ep, 1.0), passthrough=True)
    out.inputs.extend(probs)   # probabilities (and aux loss): their gradients flow back
    if n > 1:
        grad = R if geo.etp > 1 or geo.tp == 1 else S
        scatter = _both_ways("reduce_scatter", geo.group, t * n * d * b, "all_gather", grad)
        out = g.explicit_comm("combine", out, scatter, layout=out_layout, rows_scale=1.0)
    return out


# ---- deepep -----------------------------------------------------------------------------
def _deepep_dispatch(g, geo: Geometry, x, gate):
    rows = x
    if geo.group_size > 1:
        grad = x.layout
        fused = _deepep_comm(geo, grad, combine=False)
        gathered = _routing_map_gather(g, geo, gate) if geo.flex_backend == "hybridep" \
            else None
        rows = g.explicit_comm("dispatch", x, fused, layout=geo.expert_layout,
                               rows_scale=geo.rows)
        rows.inputs.append(gate)   # the fused dispatch sends each token where it is routed
        if gathered is not None:
            rows.inputs.append(gathered)
    # received tokens expanded to one row per local expert they chose, in expert order
    rows = g.elementwise("permute", [rows], rows_scale=geo.rows, rw=(1.0, 1.0),
                         passthrough=True)
    return rows, gate


def _routing_map_gather(g, geo: Geometry, gate):
    """HybridEP's metadata preprocessing gathers every rank's routing map (a bool per
    token and expert; Megatron-Core widens it to ETP x the experts, _HybridEPManager's
    num_experts at d98e8a64) over the dispatch group before each forward dispatch, then
    its metadata kernel fills the handle that the combine and the backward reuse: one
    gather per forward dispatch (again in a recomputed forward), none in the backward
    (deepseek-ai/DeepEP hybrid-ep branch: deep_ep/hybrid_ep_buffer.py's
    all_gather_into_tensor since c9f647d, September 2025, moved into
    csrc/hybrid_ep/executor/executor.cu Executor::allgather_routing_map at a484936, January
    2026; at 94a9f8f). Across nodes it is NCCL's all-gather. Assumptions: inside one
    NVLink domain too (HybridEP's own all-gather, enable_custom_allgather, was its default
    from spring to July 2026 and Megatron-Core does not set it: its rate is not measured);
    the metadata kernel's scan of the gathered maps is not priced."""
    nbytes = geo.group_size * geo.tokens * geo.etp * geo.num_experts * MAP_BYTES
    return g.explicit_comm("routing_map", gate, _both_ways("all_gather", geo.group, nbytes,
                                                           None), features=1)


def _deepep_combine(g, geo: Geometry, y, probs, out_layout):
    # each received token's local expert rows summed back into one (weighted)
    out = g.elementwise("unpermute", [y], rw=(1.0, 1.0), passthrough=True)
    out.inputs.extend(probs)   # probabilities (and aux loss): their gradients flow back
    if geo.group_size > 1:
        grad = R if geo.etp > 1 or geo.tp == 1 else S
        fused = _deepep_comm(geo, grad, combine=True)
        out = g.explicit_comm("combine", out, fused, layout=out_layout, rows_scale=1.0)
    return out


def _deepep_comm(geo: Geometry, grad: str, combine: bool) -> ExplicitComm:
    """The fused dispatch's (or combine's) all-to-all, forward and backward: the backward
    of a dispatch is a combine and that of a combine a dispatch, each no faster than its
    kernel is measured: across nodes its inter-node bytes (the (g - p) / g of the flat
    buffer that leaves the node) at the kernel's RDMA rate (ep_rdma.py), inside one NVLink
    domain the buffer at the kernel's rate there (ep_nvlink.py)."""
    nbytes = deepep_bytes(geo)
    nodes = _nodes(geo)
    if nodes == 1:
        rates = nvlink_kernel_Bps(geo.flex_backend, geo.gpu, geo.group_size) or (0.0, 0.0)
    else:   # the buffer's rate that puts its inter-node bytes at the kernel's RDMA rate
        rates = tuple(r / _remote_fraction(geo, nodes)
                      for r in rdma_kernel_Bps(geo.flex_backend, nodes, geo.gpu))
    fwd_Bps, bwd_Bps = (rates[1], rates[0]) if combine else rates
    return ExplicitComm("all_to_all", geo.group, nbytes, "all_to_all", nbytes,
                        grad, "ep", kernel_Bps=fwd_Bps, bwd_kernel_Bps=bwd_Bps,
                        sm_count=geo.flex_sms)


def _remote_fraction(geo: Geometry, nodes: int) -> float:
    """The share of a flat all-to-all's buffer that leaves the node, (g - p) / g with p
    the group's ranks per node."""
    g = geo.group_size
    return (g - g // nodes) / g


def _hit(geo: Geometry, blocks: int) -> float:
    """Probability that a token reaches a block of the experts split into `blocks` equal
    contiguous blocks (EP ranks, or nodes of them), under the model's routing."""
    if geo.round_robin:
        return round_robin_hit(geo.num_experts, blocks, geo.top_k)
    return block_hit(geo.num_experts, blocks, geo.top_k, geo.expert_groups,
                     geo.groups_per_token)


def _nodes(geo: Geometry) -> int:
    """NVLink domains the dispatch group spans as the kernels see it: DeepEP's blocks of
    NVLink peers, or one for HybridEP on a rack whose NVLink spans the group (its MNNVL
    path, ep_rdma.py MNNVL_GPUS), which sends a token once to each rank it needs."""
    if geo.flex_backend == "hybridep" and geo.gpu.lower() in MNNVL_GPUS:
        return 1
    return len(deepep_blocks(geo.group_ranks))


def deepep_bytes(geo: Geometry) -> float:
    """Per-rank all-to-all size that carries DeepEP's traffic through a flat all-to-all.

    The group's ranks split into nodes of DeepEP's NVLink peers (consecutive blocks of
    DEEPEP_NVL_PEERS ranks; HybridEP on an NVL72 rack: one, _nodes). Within one node a
    token goes once to each rank holding one of its experts: T x (expected ranks hit)
    rows, the rows HybridEP's benchmark counts (ep_nvlink.py). Across n nodes it crosses
    RDMA once per other node holding one of its experts: T (n - 1) P(node hit) rows, and a flat
    all-to-all puts (g - p) / g of its buffer on other nodes (p group ranks per node), so
    the buffer is that over (g - p) / g. Routing uniform over experts, or over the groups a
    group-limited router allows (DeepSeek-V3: group_routing.py), an expert's ETP ranks all
    receiving the token, times the hottest rank's imbalance r / top_k.
    """
    n = _nodes(geo)
    row = geo.tokens * geo.hidden * geo.act_bytes * geo.rows / geo.top_k
    if n == 1:
        return row * geo.ep * _hit(geo, geo.ep) * geo.etp
    return row * (n - 1) * _hit(geo, n) / _remote_fraction(geo, n)
