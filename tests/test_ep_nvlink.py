"""HybridEP's measured rates inside one NVLink domain (workloads/moe/ep_nvlink.py), and the
engine's floor that a collective takes at least its bytes at its kernel's rate.

Golden figures: deepseek-ai/DeepEP branch hybrid-ep, docs/README_Hybrid-EP.md (commit
17cfb81), B200 Platform (8 ranks, 16 SMs) and GB200 Platform (32 SMs), kernel only, BF16;
cross-checked against NVIDIA's Megatron Core MoE report (arXiv 2603.07685, Table 7).
"""
from __future__ import annotations

import math

import pytest
import simpy

from simulator import SimOptions
from simulator.api import finish
from simulator.engine import Engine
from simulator.network import CommModel, CommOptions
from topologies import build
from workloads.layer_graph import LayerGraph
from workloads.layers import layer_shape
from workloads.lowering import lower
from workloads.moe.dispatch import deepep_bytes
from workloads.moe.ep_nvlink import nvlink_kernel_Bps
from workloads.moe.ep_rdma import achieved_rdma_Bps
from workloads.moe.layer import geometry

from moe_small import D, MOE, moe_plan


def test_measured_rates_by_gpu_and_group():
    assert nvlink_kernel_Bps("hybridep", "b200", 8) == pytest.approx((734.95e9, 673.84e9))
    assert nvlink_kernel_Bps("hybridep", "GB200", 16) == pytest.approx((706.95e9, 666.26e9))
    assert nvlink_kernel_Bps("hybridep", "gb200", 36) == pytest.approx((632.31e9, 596.99e9))
    # between two measured groups: the smaller's; past the largest: its; below: the least
    assert nvlink_kernel_Bps("hybridep", "gb200", 20) == nvlink_kernel_Bps("hybridep", "gb200", 16)
    assert nvlink_kernel_Bps("hybridep", "gb200", 64) == nvlink_kernel_Bps("hybridep", "gb200", 36)
    assert nvlink_kernel_Bps("hybridep", "gb200", 4) == nvlink_kernel_Bps("hybridep", "gb200", 8)


def test_no_rate_where_none_is_measured():
    assert nvlink_kernel_Bps("hybridep", "h100", 8) is None    # Hopper: IB table only
    assert nvlink_kernel_Bps("deepep", "b200", 8) is None      # DeepEP: not at Megatron's SMs
    assert nvlink_kernel_Bps("hybridep", "b200", 1) is None


def _ep(world, gpu_ep=8, micro_batch=1):
    model = {**MOE, "num_local_experts": 16}
    return moe_plan(world=world, model=model, mesh={"ep": gpu_ep},
                    training={"global_batch": world * micro_batch, "micro_batch": micro_batch},
                    moe={"dispatcher": "deepep", "flex_backend": "hybridep"})


def _rates(plan, gpu):
    tasks = [t for t in lower(plan, gpu).tasks() if t.layer == 1 and t.microbatch == 0]
    return {t.label: t.kernel_Bps for t in tasks if t.op == "all_to_all"}


def test_dispatch_and_combine_carry_their_kernels_rates_inside_one_domain():
    rates = _rates(_ep(8), "b200")
    # the dispatch's backward is a combine, the combine's a dispatch
    assert rates["moe.dispatch"] == pytest.approx(734.95e9)
    assert rates["grad.moe.dispatch"] == pytest.approx(673.84e9)
    assert rates["moe.combine"] == pytest.approx(673.84e9)
    assert rates["grad.moe.combine"] == pytest.approx(734.95e9)


def test_no_nvlink_rate_across_nodes_or_on_hopper():
    # two nodes: the RDMA floors of ep_rdma.py (HybridEP's H100 two-node figures over the
    # half of the buffer that leaves the node), not these
    dispatch, combine = achieved_rdma_Bps("hybridep", 2)
    assert sorted(set(_rates(_ep(16, 16), "b200").values())) == pytest.approx(
        sorted([2 * dispatch, 2 * combine]))
    assert set(_rates(_ep(8), "h100").values()) == {0.0}
    # an NVL72 rack holds 16 ranks in one domain
    assert sorted(set(_rates(_ep(16, 16), "gb200").values())) == pytest.approx(
        [666.26e9, 706.95e9])


def test_the_floor_counts_the_rows_a_rank_receives_on_a_rack():
    """On an NVL72 rack a 16-rank group is one NVLink domain: the dispatch's bytes are the
    rows each rank receives, its own included (HybridEP's nvl_recv_bytes), so its floor
    is those rows at the measured rate, not DeepEP's RDMA blocks of 8."""
    plan = _ep(16, 16)
    graph = LayerGraph(layer_shape(plan, "gb200"))
    geo = geometry(graph, plan, graph.input("R", D))
    received = geo.tokens * geo.hidden * geo.act_bytes * geo.rows / geo.top_k * 16 * (
        1 - math.comb(16 - 1, geo.top_k) / math.comb(16, geo.top_k))
    tasks = {t.label: t for t in lower(plan, "gb200").tasks()
             if t.layer == 1 and t.microbatch == 0 and t.op == "all_to_all"}
    assert deepep_bytes(geo) == pytest.approx(received)
    assert tasks["moe.dispatch"].bytes / tasks["moe.dispatch"].kernel_Bps == pytest.approx(
        received / 706.95e9)


# Megatron Core MoE report (NVIDIA, arXiv 2603.07685, Table 7): HybridEP on GB200,
# DeepSeek-V3's shape (hidden 7168, 4096 tokens per rank, 256 experts, top-8), BF16,
# "communication latency only", microseconds (dispatch, combine) by EP size.
REPORT_GB200_HYBRIDEP_US = {8: (391, 353), 16: (578, 527), 32: (612, 646), 64: (675, 744)}


def _report_received_bytes(ep: int) -> float:
    """Bytes a rank receives in the report's dispatch: each token of each of the ep ranks
    that routes it to one of the rank's experts, the rank's own included (4096 tokens,
    hidden 7168 in BF16, 256 experts, top-8 distinct experts, uniform routing)."""
    tokens, hidden, experts, top_k = 4096, 7168, 256, 8
    reach = 1 - math.comb(experts - experts // ep, top_k) / math.comb(experts, top_k)
    return ep * tokens * reach * hidden * 2


@pytest.mark.parametrize("ep", sorted(REPORT_GB200_HYBRIDEP_US))
def test_kernel_rates_time_the_reports_gb200_dispatches(ep):
    """The rates the simulator prices HybridEP's transfer at (kernel only: Megatron's
    dispatch_with_permute replaces the Torch API's copy-out with the permute the graph
    prices on its own) time an independent measurement of Megatron's HybridEP on GB200
    within 20 % (-6 .. +20 %); the Torch API's rates are 27-55 % slower."""
    received_bytes = _report_received_bytes(ep)
    dispatch_Bps, combine_Bps = nvlink_kernel_Bps("hybridep", "gb200", ep)
    measured_dispatch_us, measured_combine_us = REPORT_GB200_HYBRIDEP_US[ep]
    assert received_bytes / dispatch_Bps * 1e6 == pytest.approx(measured_dispatch_us, rel=0.2)
    assert received_bytes / combine_Bps * 1e6 == pytest.approx(measured_combine_us, rel=0.2)
    torch_api_dispatch_Bps = {8: 545.71e9, 16: 523.48e9, 32: 484.22e9, 64: 479.02e9}[ep]
    assert received_bytes / torch_api_dispatch_Bps * 1e6 > 1.25 * measured_dispatch_us


def test_a_collective_lasts_at_least_its_floor():
    env = simpy.Environment()
    comm = CommModel(env, build("dgx-b200"))
    ranks, size = tuple(range(8)), 64 * 2**20
    free = comm.plan("all_to_all", ranks, size).closed_form_s
    done = {}

    def run(tag, min_s):
        yield comm.collective("all_to_all", ranks, size, kernel_min_s=min_s)
        done[tag] = env.now

    env.process(run("slow", 3 * free))
    env.run()
    assert done["slow"] == pytest.approx(3 * free)
    env = simpy.Environment()
    comm = CommModel(env, build("dgx-b200"))
    env.process(run("fast", 0.1 * free))
    env.run()
    assert done["fast"] == pytest.approx(free, rel=1e-6)


def _step_s(program, topo, options) -> float:
    engine = Engine(program, topo, options)
    engine.run()
    return finish(program, topo, engine).summary["step_time_s"]


# every path of the engine that starts a collective: the representative rank's, every rank
# meeting at a rendezvous (full), rank classes (fault_classes), and the closed form
# without the network model
ENGINE_MODES = {"rep": SimOptions(), "full": SimOptions(full=True),
                "classes": SimOptions(fault_classes=True),
                "closed-form": SimOptions(comm=CommOptions(flow_sharing=False))}


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_the_measured_rate_slows_a_b200_step(mode):
    """With the rate the step is longer than with the engine's all-to-all alone, by at most
    the dispatch and combine at that rate (16 x 2048 tokens: dispatches of ~100 MB, where
    the kernel is slower than the links; small ones are latency-bound either way)."""
    topo, options = build("dgx-b200"), ENGINE_MODES[mode]
    program = lower(_ep(8, micro_batch=16), "b200")
    floors = {t.id: t.bytes / t.kernel_Bps for t in program.tasks() if t.kernel_Bps}
    with_rate = _step_s(program, topo, options)
    program = lower(_ep(8, micro_batch=16), "b200")
    for task in program.tasks():
        task.kernel_Bps = 0.0
    without = _step_s(program, topo, options)
    assert floors and without < with_rate <= without + sum(floors.values())


def test_dgx_b300_boards_take_the_hgx_b200_hybridep_rates():
    """A DGX B300 board has the HGX B200's NVLink5 switches (8 GPUs, 18 links each): its
    HybridEP kernels are priced at B200's measured 8-rank rates, not left unpriced."""
    assert nvlink_kernel_Bps("hybridep", "b300", 8) == nvlink_kernel_Bps("hybridep", "b200", 8)
    assert nvlink_kernel_Bps("hybridep", "b300", 8) is not None


def test_hopper_hybridep_inside_a_node_takes_the_engines_all_to_all():
    """H100 has no HybridEP kernel figure inside a node: the engine's NVLink all-to-all of the
    received rows prices the report's DeepSeek-V3-shaped EP 8 dispatch (661 us) and combine
    (624 us; arXiv 2603.07685, Table 7) 16 % and 23 % slow."""
    ep = 8
    received_bytes = _report_received_bytes(ep)
    comm = CommModel(simpy.Environment(), build("dgx-h100"))
    priced_us = comm.plan("all_to_all", tuple(range(ep)), received_bytes).closed_form_s * 1e6
    assert nvlink_kernel_Bps("hybridep", "h100", ep) is None
    assert 661 < priced_us < 1.25 * 661
    assert 624 < priced_us < 1.25 * 624
