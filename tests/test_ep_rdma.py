"""The fused EP kernels' measured RDMA rates across nodes (workloads/moe/ep_rdma.py).

Golden figures: deepseek-ai/DeepEP docs/README_Hybrid-EP.md (commit 5fbafce2, H100
Platform, kernel only, BF16, 16 SMs) and docs/legacy.md (commit dd758caf, internode normal
kernels); both count the token's own node in their "RDMA" bytes.
"""
from __future__ import annotations

import math

import pytest

from workloads import plan_from_dict
from workloads.errors import WorkloadError
from workloads.layer_graph import LayerGraph
from workloads.layers import layer_shape
from workloads.lowering import lower
from workloads.moe.dispatch import deepep_bytes
from workloads.moe.ep_rdma import achieved_rdma_Bps, rdma_kernel_Bps
from workloads.moe.layer import geometry

from conftest import small_plan
from moe_small import D, MOE, moe_plan


def test_hybridep_two_nodes_moves_half_its_counted_bytes_over_rdma():
    # 16 ranks: 71.71 / 62.95 GB/s counted over both nodes, half of them remote
    dispatch, combine = achieved_rdma_Bps("hybridep", 2)
    assert dispatch == pytest.approx(71.71e9 / 2)
    assert combine == pytest.approx(62.95e9 / 2)
    assert rdma_kernel_Bps("hybridep", 2, "h100") == pytest.approx((35.855e9, 31.475e9))


def test_deepep_legacy_rates_by_node_count():
    # EP32: 58 / 57 GB/s over 4 nodes, 3/4 remote; EP64: 51 / 50 over 8 nodes
    assert achieved_rdma_Bps("deepep", 4) == pytest.approx((43.5e9, 42.75e9))
    assert achieved_rdma_Bps("deepep", 8) == pytest.approx((51e9 * 7 / 8, 50e9 * 7 / 8))
    # past the largest measured group: its figures; between two: the smaller group's
    assert achieved_rdma_Bps("deepep", 16) == achieved_rdma_Bps("deepep", 8)
    assert achieved_rdma_Bps("hybridep", 6) == achieved_rdma_Bps("hybridep", 4)


def test_no_rdma_rate_on_one_node_or_inside_an_nvl72_domain():
    assert rdma_kernel_Bps("hybridep", 1, "h100") == (0.0, 0.0)
    assert rdma_kernel_Bps("hybridep", 4, "GB200") == (0.0, 0.0)


def _ep16(backend):
    model = {**MOE, "num_local_experts": 16}
    return moe_plan(world=16, model=model, mesh={"ep": 16}, training={"global_batch": 16},
                    moe={"dispatcher": "deepep", "flex_backend": backend})


def _sizes(plan, gpu):
    tasks = [t for t in lower(plan, gpu).tasks() if t.layer == 1 and t.microbatch == 0]
    return {t.label: t.bytes for t in tasks if t.op == "all_to_all"}


def _rates(plan, gpu):
    tasks = [t for t in lower(plan, gpu).tasks() if t.layer == 1 and t.microbatch == 0]
    return {t.label: t.kernel_Bps for t in tasks if t.op == "all_to_all"}


@pytest.mark.parametrize("backend", ["hybridep", "deepep"])
def test_dispatch_and_combine_last_their_kernels_rdma_time(backend):
    """The links carry the kernels' bytes; each lasts at least its inter-node bytes at its
    kernel's measured RDMA rate (Task.kernel_Bps on the flat buffer, half of which crosses
    between the 2 nodes), so a transfer beside it finds the NIC as busy as the kernel
    keeps it."""
    plan = _ep16(backend)
    graph = LayerGraph(layer_shape(plan))
    flat = deepep_bytes(geometry(graph, plan, graph.input("R", D)))
    assert list(_sizes(plan, "h100").values()) == pytest.approx([flat] * 4)
    dispatch, combine = achieved_rdma_Bps(backend, 2)
    rates = _rates(plan, "h100")
    # the dispatch's backward is a combine, the combine's a dispatch
    assert rates["moe.dispatch"] == pytest.approx(dispatch * 2)
    assert rates["grad.moe.dispatch"] == pytest.approx(combine * 2)
    assert rates["moe.combine"] == pytest.approx(combine * 2)
    assert rates["grad.moe.combine"] == pytest.approx(dispatch * 2)
    # the floor is longer than the remote half takes at a 400 Gb/s NIC's 50 GB/s
    assert flat / rates["moe.dispatch"] > flat / 2 / 50e9
    # an NVL72 rack: no RDMA stage; HybridEP sends each token once to every rank it needs
    # (one NVLink domain), DeepEP keeps its 8-peer blocks
    rack_graph = LayerGraph(layer_shape(plan, "gb200"))
    rack = deepep_bytes(geometry(rack_graph, plan, rack_graph.input("R", D)))
    assert list(_sizes(plan, "gb200").values()) == pytest.approx([rack] * 4)
    assert (rack > flat) == (backend == "hybridep")
    assert (rack == pytest.approx(flat)) == (backend == "deepep")


def test_the_engine_holds_each_kernel_to_its_floor(h100x2):
    from simulator import simulate
    plan = _ep16("deepep")
    trace = simulate(plan, h100x2).trace.to_pylist()
    rates = _rates(plan, "h100")
    a2a = [t for t in trace if t["op"] == "all_to_all" and t["label"] in rates]
    assert a2a
    for t in a2a:
        assert t["end_s"] - t["start_s"] >= t["bytes"] / rates[t["label"]] * (1 - 1e-9)


def test_unknown_flex_backend_is_refused():
    with pytest.raises(WorkloadError):
        plan_from_dict(small_plan(model=MOE, moe={"dispatcher": "deepep",
                                                  "flex_backend": "nccl"}))


# Megatron Core MoE report (NVIDIA, arXiv 2603.07685, Table 7): HybridEP on H100 over
# InfiniBand, DeepSeek-V3's shape (hidden 7168, 4096 tokens per rank, 256 experts, top-8),
# BF16, "communication latency only", microseconds (dispatch, combine) by nodes (8 GPUs each).
REPORT_H100_HYBRIDEP_US = {2: (1485, 1688), 4: (3064, 3088), 8: (4626, 4398)}
TORCH_API_COUNTED_Bps = {2: (54.47e9, 53.35e9), 4: (47.36e9, 52.53e9), 8: (41.24e9, 46.57e9)}


@pytest.mark.parametrize("nodes", sorted(REPORT_H100_HYBRIDEP_US))
def test_kernel_rates_time_the_reports_h100_dispatches(nodes):
    """The counted (token, node) bytes at the kernel-only rates take 10-42 % longer than the
    report's latency-only times (+10 % on 2 nodes, +35/+42 % on 8); at the Torch API's rates
    they would take 30-63 % longer, further at every point."""
    tokens, hidden, experts, top_k = 4096, 7168, 256, 8
    per_node = experts // nodes
    reach = 1 - math.comb(experts - per_node, top_k) / math.comb(experts, top_k)
    counted_bytes = tokens * nodes * reach * hidden * 2
    remote = (nodes - 1) / nodes
    rates = achieved_rdma_Bps("hybridep", nodes)
    for rate, torch_api, measured_us in zip(rates, TORCH_API_COUNTED_Bps[nodes],
                                            REPORT_H100_HYBRIDEP_US[nodes]):
        priced_us = counted_bytes * remote / rate * 1e6
        assert measured_us < priced_us < 1.45 * measured_us
        assert priced_us < counted_bytes / torch_api * 1e6
