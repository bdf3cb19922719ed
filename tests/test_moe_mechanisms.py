"""MoE mechanisms as events, against counts and sizes worked out by hand: the token
dispatch (all-to-all, all-gather, DeepEP), its buffers, EP with PP and FSDP, the aux loss.
The moe block's routing options (capacity, imbalance, grouped GEMM efficiency), its
checks and its Megatron flags: tests/test_moe_routing_options.py.

The small MoE model: d = 1024, E = 8 experts of FFN 1024, top-2, SwiGLU; one micro-batch
of 2048 tokens per rank (seq 2048, micro-batch 1); bf16 (2 bytes). Sizes are nccl-tests
sizes: all-to-all the per-rank buffer, all-gather the output, reduce-scatter the input.
"""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict
from workloads.lowering import lower
from workloads.memory import memory_breakdown
from workloads.moe import imbalance
from workloads.moe.dispatch import deepep_bytes
from workloads.moe.ep_rdma import achieved_rdma_Bps
from workloads.moe.layer import geometry
from workloads.layer_graph import LayerGraph
from workloads.layers import layer_shape
from workloads.params import unit_param_groups

from conftest import small_plan
from moe_small import D, E, F, K, MOE, T, layer_tasks as _tasks, moe_plan as _plan



def _comm(tasks):
    return Counter((t.phase, t.label, t.op, t.group, round(t.bytes, 6))
                   for t in tasks if t.kind == "comm" and "moe" in t.label)


def _mem(tasks, label):
    return [t.bytes for t in tasks if t.label == label]


# ---- alltoall -----------------------------------------------------------------------
def test_alltoall_events_without_tp():
    tasks = _tasks(_plan(mesh={"ep": 4}))
    rows = T * K                                  # balanced: each rank gets T x top_k rows
    tokens, probs = rows * D * 2, rows * 2
    assert _comm(tasks) == {
        # every EP rank's int64 count per expert, gathered for the all-to-all's splits
        ("forward", "moe.dispatch_counts", "all_gather", ("ep",), 4 * E * 8): 1,
        ("forward", "moe.dispatch", "all_to_all", ("ep",), tokens): 1,
        ("forward", "moe.dispatch_probs", "all_to_all", ("ep",), probs): 1,
        ("forward", "moe.combine", "all_to_all", ("ep",), tokens): 1,
        ("backward", "grad.moe.dispatch", "all_to_all", ("ep",), tokens): 1,
        ("backward", "grad.moe.dispatch_probs", "all_to_all", ("ep",), probs): 1,
        ("backward", "grad.moe.combine", "all_to_all", ("ep",), tokens): 1}
    # permute reads each token once and writes its 2 copies; unpermute the reverse; two
    # local experts, so the rows are sorted by expert after the all-to-all and back before
    assert _mem(tasks, "permute.fwd") == [T * D * 2 * (1 + K)]
    assert _mem(tasks, "unpermute.fwd") == [T * D * 2 * (1 + K)]
    assert _mem(tasks, "sort_chunks.fwd") == [rows * D * 2 * 2]
    assert _mem(tasks, "unsort_chunks.fwd") == [rows * D * 2 * 2]
    # backward of a fused copy: its input and output gradient read, its input-gradient
    # written (workloads/kernels.py FUSED_BACKWARD_FACTOR)
    assert _mem(tasks, "permute.bwd") == [T * D * 2 * (1 + K) * 1.5]
    one_each = _tasks(_plan(mesh={"ep": 8}))       # one expert per rank: nothing to sort
    assert not _mem(one_each, "sort_chunks.fwd") and _mem(one_each, "permute.fwd")
    topk = _mem(tasks, "router_topk.fwd")
    assert topk == [T * E * 2 * 4.0]              # logits read, scores, probs and map
    assert not _mem(tasks, "router_aux_loss.fwd")


def test_alltoall_with_expert_tp_gathers_rows_over_tp():
    plan = _plan(mesh={"ep": 2, "tp": 2}, sharding={"sequence_parallel": True})
    tasks = _tasks(plan)
    t = T / 2                                     # each TP rank routes its sequence shard
    rows = t * K
    comm = _comm(tasks)
    assert comm[("forward", "moe.dispatch", "all_to_all", ("ep",), rows * D * 2)] == 1
    assert comm[("forward", "moe.dispatch_gather", "all_gather", ("tp",), 2 * rows * D * 2)] == 1
    assert comm[("forward", "moe.dispatch_probs_gather", "all_gather", ("tp",),
                 2 * rows * 2)] == 1
    assert comm[("forward", "moe.combine_scatter", "reduce_scatter", ("tp",),
                 2 * rows * D * 2)] == 1
    assert comm[("backward", "grad.moe.dispatch_gather", "reduce_scatter", ("tp",),
                 2 * rows * D * 2)] == 1
    assert comm[("backward", "grad.moe.combine_scatter", "all_gather", ("tp",),
                 2 * rows * D * 2)] == 1
    w1 = [x for x in tasks if x.label == "w1.fwd"][0]
    assert w1.gemm_mnk == (int(2 * rows), F // 2, D)   # gathered rows, FFN split over ETP
    # permutes are linear: the experts' partial input gradients reach the reduce-scatter
    # of the ETP all-gather's backward unreduced (no all-reduce over TP)
    assert not [x for x in tasks if x.op == "all_reduce"]


def test_alltoall_with_etp_1_keeps_experts_whole():
    plan = _plan(mesh={"ep": 2, "tp": 2}, sharding={"sequence_parallel": True},
                 moe={"etp": 1})
    tasks = _tasks(plan)
    assert not [x for x in tasks if x.label.startswith(("moe.dispatch_gather",
                                                        "moe.combine_scatter"))]
    w1 = [x for x in tasks if x.label == "w1.fwd"][0]
    assert w1.gemm_mnk == (T // 2 * K, F, D)          # own rows, whole expert
    # Megatron-Core's expert mesh re-splits tp x dp as ep x edp (workloads/expert_mesh.py):
    # the whole local experts' gradients reduce over its edp, the TP ranks folded in
    groups = unit_param_groups(plan, 1)
    assert groups[("edp",)] == (E // 2) * 3 * D * F
    assert ("edp", "tp") not in groups
    dims = plan.parallel_dims
    assert dims.group_size(("edp",)) == plan.mesh.tp * plan.mesh.dp // 2
    assert dims.group_ranks(0, ("ep",)) == (0, 1)      # EP runs through the TP pair first


# ---- allgather ----------------------------------------------------------------------
def test_allgather_dispatcher_events():
    tasks = _tasks(_plan(mesh={"ep": 4}, moe={"dispatcher": "allgather"}))
    g = 4                                           # the TP x EP group: ep 4
    hidden, probs, rmap = T * g * D * 2, T * g * E * 2, T * g * E * 1
    assert _comm(tasks) == {
        ("forward", "moe.dispatch", "all_gather", ("ep",), hidden): 1,
        ("forward", "moe.dispatch_probs", "all_gather", ("ep",), probs): 1,
        ("forward", "moe.dispatch_map", "all_gather", ("ep",), rmap): 1,
        ("forward", "moe.combine", "reduce_scatter", ("ep",), hidden): 1,
        ("backward", "grad.moe.dispatch", "reduce_scatter", ("ep",), hidden): 1,
        ("backward", "grad.moe.dispatch_probs", "reduce_scatter", ("ep",), probs): 1,
        ("backward", "grad.moe.combine", "all_gather", ("ep",), hidden): 1}
    # local rows: the gathered tokens routed to this rank's 2 experts, T x top_k
    assert _mem(tasks, "permute.fwd") == [T * K * D * 2 * 2]
    # unpermute writes all g T gathered rows (zeros where other ranks' experts were)
    assert _mem(tasks, "unpermute.fwd") == [(T * K + T * g) * D * 2]


def test_allgather_with_expert_tp_spans_tp_and_ep():
    plan = _plan(mesh={"ep": 2, "tp": 2}, sharding={"sequence_parallel": True},
                 moe={"dispatcher": "allgather"})
    comm = _comm(_tasks(plan))
    hidden = T / 2 * 4 * D * 2                      # each rank's T/2 tokens, 4 ranks
    assert comm[("forward", "moe.dispatch", "all_gather", ("tp", "ep"), hidden)] == 1
    assert comm[("forward", "moe.combine", "reduce_scatter", ("tp", "ep"), hidden)] == 1
    assert comm[("backward", "grad.moe.dispatch", "reduce_scatter", ("tp", "ep"), hidden)] == 1
    assert not [x for x in _tasks(plan) if x.op == "all_reduce"]


# ---- deepep -------------------------------------------------------------------------
def test_deepep_inside_a_node_sends_a_token_once_per_rank():
    plan = _plan(mesh={"ep": 4}, moe={"dispatcher": "deepep"})
    # 4 EP ranks of 2 experts; P(a rank holds one of a token's 2 experts) =
    # 1 - C(6, 2) / C(8, 2) = 1 - 15/28
    size = T * D * 2 * 4 * (1 - 15 / 28)
    comm = _comm(_tasks(plan))
    assert comm == {("forward", "moe.dispatch", "all_to_all", ("ep",), round(size, 6)): 1,
                    ("forward", "moe.combine", "all_to_all", ("ep",), round(size, 6)): 1,
                    ("backward", "grad.moe.dispatch", "all_to_all", ("ep",), round(size, 6)): 1,
                    ("backward", "grad.moe.combine", "all_to_all", ("ep",), round(size, 6)): 1}
    assert size < T * K * D * 2                    # fewer bytes than k copies per token


def test_deepep_across_nodes_crosses_rdma_once_per_node():
    model = {**MOE, "num_local_experts": 16}
    plan = _plan(world=16, model=model, mesh={"ep": 16},
                 training={"global_batch": 16}, moe={"dispatcher": "deepep"})
    graph = LayerGraph(layer_shape(plan))
    geo = geometry(graph, plan, graph.input("R", D))
    # 16 ranks in 2 nodes of 8: a token crosses to the other node when one of its 2
    # experts is there: 1 - C(8, 2) / C(16, 2); the flat all-to-all puts 8/16 of its
    # buffer on the other node, so the buffer is twice the RDMA bytes
    rdma = T * D * 2 * (1 - 28 / 120)
    assert deepep_bytes(geo) == pytest.approx(rdma * 16 / 8)


def test_deepep_moves_less_over_rdma_than_alltoall(h100x2):
    from simulator import simulate
    model = {**MOE, "num_local_experts": 16, "num_experts_per_tok": 4}

    def ep_seconds(dispatcher):
        raw = small_plan(model=model, mesh={"ep": 16}, training={"global_batch": 16},
                         moe={"dispatcher": dispatcher})
        t = simulate(plan_from_dict(raw), h100x2).trace.to_pandas()
        ep = t[(t["rank"] == 0) & (t["stream"] == "ep")]
        return (ep.end_s - ep.start_s).sum()
    # top-4 of 16 experts on 2 nodes: alltoall sends 4 copies of a token, half of them
    # across; DeepEP crosses once when the other node holds one of its experts (0.96),
    # at its measured RDMA rate (workloads/moe/ep_rdma.py: DeepEP's EP16 benchmark, the
    # same for dispatch and combine)
    slowdown = 50e9 / achieved_rdma_Bps("deepep", 2)[0]   # a 400 Gb/s NIC's 50 GB/s
    assert ep_seconds("deepep") < 0.75 * slowdown * ep_seconds("alltoall")


def test_dispatch_buffers_and_gathered_expert_inputs_in_memory():
    def mem(**moe):
        return memory_breakdown(_plan(mesh={"ep": 2, "tp": 2},
                                      sharding={"sequence_parallel": True}, moe=moe))
    t = T / 2                                       # tokens each TP rank routes
    alltoall, allgather = mem(), mem(dispatcher="allgather")
    # allgather: the gathered hidden states, probabilities and routing map of the 4 TP x EP
    # ranks replace the permuted send buffer (t x top_k rows)
    assert allgather.buffers_bytes - alltoall.buffers_bytes == pytest.approx(
        t * 4 * (D * 2 + E * 3) - t * K * D * 2)
    # ETP = TP keeps the gathered expert inputs whole; ETP = 1 keeps the rank's own rows
    whole = mem(etp=1)
    layers = 4 * 1                                  # 4 MoE layers, 1 micro-batch in flight
    assert alltoall.activations_bytes - whole.activations_bytes == pytest.approx(
        layers * 2 * D * (t * K * 2) * (1 - 1 / 2))


# ---- EP with PP and FSDP, aux loss --------------------------------------------------
def test_ep_with_pipeline_stages_dispatches_on_every_stage():
    plan = _plan(mesh={"ep": 2, "pp": 2})
    for stage in lower(plan).stages:
        labels = Counter(t.label for t in stage if t.microbatch == 0)
        assert labels["moe.dispatch"] == 2 and labels["grad.moe.combine"] == 2   # 2 layers


def test_ep_with_fsdp_gathers_experts_over_expert_data_parallel_ranks():
    plan = _plan(mesh={"ep": 4}, fsdp={"enabled": True})
    gathers = {t.group for t in lower(plan).stages[0]
               if t.op == "all_gather" and t.phase == "forward" and t.layer == 1}
    assert ("edp",) in gathers and ("dp",) in gathers


def test_aux_loss_is_an_event_when_asked():
    tasks = _tasks(_plan(mesh={"ep": 4}, moe={"aux_loss": True}))
    assert _mem(tasks, "router_aux_loss.fwd") == [T * E * 2 * 1.5]
    assert _mem(tasks, "router_aux_loss.bwd")


# ---- one formula for the routed tokens and the rows sent ------------------------------
@pytest.mark.parametrize("moe", [{}, {"capacity_factor": 1.0},
                                 {"capacity_factor": 1.0, "pad_to_capacity": True}])
def test_dispatch_buffer_holds_the_rows_the_dispatch_sends(moe):
    from workloads.moe.memory import dispatch_buffer_bytes
    plan = _plan(mesh={"ep": 2, "tp": 2}, sharding={"sequence_parallel": True}, moe=moe)
    graph = LayerGraph(layer_shape(plan))
    geo = geometry(graph, plan, graph.input("S", D))
    assert geo.tokens == T / 2 == imbalance.routed_tokens(plan)
    assert dispatch_buffer_bytes(plan, 2) == geo.tokens * geo.sent * D * 2


def test_gathered_expert_inputs_are_in_the_activation_dtype():
    from workloads.moe.memory import gathered_expert_input_bytes
    bytes_of = {dtype: gathered_expert_input_bytes(_plan(
        mesh={"ep": 2, "tp": 2}, sharding={"sequence_parallel": True},
        training={**small_plan()["training"], "dtype": dtype}), 1, "selective")
        for dtype in ("bf16", "fp32")}
    # T tokens x top_k rows (balanced), d features, gathered over tp = 2: half from the peer
    assert bytes_of["bf16"] == pytest.approx(2 * D * T * K / 2)
    assert bytes_of["fp32"] == pytest.approx(4 * D * T * K / 2)


# ---- DeepEP's blocks of 8 NVLink peers on the topology --------------------------------
def _nodes_of(gpus_per_node: int, nodes: int):
    import dataclasses

    import topologies
    spec = topologies.cluster_spec("dgx-h100")
    return dataclasses.replace(spec, num_domains=nodes, domain_size=gpus_per_node).build()


def test_deepep_is_refused_where_a_node_holds_fewer_than_its_8_peers():
    from simulator import simulate
    from topologies import TopologyError
    raw = small_plan(model=MOE, mesh={"ep": 8}, moe={"dispatcher": "deepep"})
    with pytest.raises(TopologyError) as err:   # 8 EP ranks over two 4-GPU nodes
        simulate(plan_from_dict(raw), _nodes_of(4, 2))
    assert err.value.field == "moe.dispatcher" and "4 GPUs per NVLink domain" in err.value.allowed
    # 4 EP ranks inside each 4-GPU node: one of DeepEP's blocks per node, it runs
    inside = small_plan(model=MOE, mesh={"ep": 4}, moe={"dispatcher": "deepep"})
    assert simulate(plan_from_dict(inside), _nodes_of(4, 2)).summary["step_time_s"] > 0
