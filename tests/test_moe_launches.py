"""Grouped-GEMM kernel launches: Transformer Engine's GroupedLinear (Megatron-Core) issues
one cuBLAS GEMM per local expert; other frameworks launch one grouped kernel."""
from __future__ import annotations

from dataclasses import replace

import pytest

from workloads import plan_from_dict, resolve
from workloads.host_cost import TE_MODULE_HOST_S
from workloads.lowering import lower
from workloads.moe.grouped_gemm import grouped_gemm_launches

from conftest import small_plan

E = 8
MOE = {**small_plan()["model"], "num_local_experts": E, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024}


def _expert_tasks(framework: str, ep: int = 2):
    plan = resolve(plan_from_dict(small_plan(model=MOE, mesh={"ep": ep}, framework=framework)), 8)
    # on an H100 (torchtitan's SDPA runs flash there)
    tasks = [t for t in lower(plan, "h100").stages[0] if t.layer == 1 and t.microbatch == 0]
    return plan, {(t.op, t.phase, t.label): t for t in tasks if t.op in ("w1", "w3", "w2")}


def test_launches_per_framework():
    assert grouped_gemm_launches("megatron-core", 16) == 16
    assert grouped_gemm_launches("megatron-core", 0) == 1
    assert grouped_gemm_launches("torchtitan", 16) == 1
    assert grouped_gemm_launches("generic", 4) == 1


def test_megatron_core_launches_one_gemm_per_local_expert():
    _, tasks = _expert_tasks("megatron-core", ep=2)
    local = E // 2
    for (op, phase, label), task in tasks.items():
        # w3 is the other half of Megatron's fused linear_fc1, whose launches w1 carries
        assert task.kernels == (1 if op == "w3" else local), (op, phase, label)
    # forward, dgrad and wgrad of w1 and w2 all loop over the experts
    assert sum(1 for (op, _, _) in tasks if op == "w2") == 3


def test_generic_grouped_gemm_is_one_launch():
    _, tasks = _expert_tasks("generic")
    assert {t.kernels for t in tasks.values()} == {1}


def test_per_expert_launches_cost_host_and_device_time(h100):
    from simulator.compute import compute_time_s, device_time_s
    plan, te = _expert_tasks("megatron-core", ep=2)
    _, one = _expert_tasks("generic", ep=2)
    key = next(k for k in te if k[0] == "w2" and k[1] == "forward")
    device = h100.device(0)
    launch_s = device.profile.launch_overhead_s
    # 4 experts on TE's 4 compute streams: their launch gaps overlap into one
    assert te[key].kernels == 4 and te[key].launch_streams == 4
    extra = device_time_s(te[key], device, "bf16") - device_time_s(one[key], device, "bf16")
    assert extra == pytest.approx(0.0)
    eight = replace(te[key], kernels=8)       # 8 experts: two rounds of launches
    extra = device_time_s(eight, device, "bf16") - device_time_s(one[key], device, "bf16")
    assert extra == pytest.approx(launch_s)
    # Megatron-Core issues each launch from Python-driven host code (no CUDA graph here),
    # inside one Transformer Engine module call (workloads/host_cost.py): the module's
    # host time replaces its first launch's
    assert not plan.cuda_graphs
    assert te[key].host_s == pytest.approx(E // 2 * plan.host_kernel_s
                                           + TE_MODULE_HOST_S - plan.host_kernel_s)
    assert compute_time_s(te[key], device, "bf16") >= te[key].host_s


def _tasks(ep: int):
    plan = resolve(plan_from_dict(small_plan(model=MOE, mesh={"ep": ep})), 8)
    return [t for t in lower(plan).stages[0] if t.layer == 1 and t.microbatch == 0]


def test_alltoall_dispatcher_counts_tokens_before_the_all_to_all():
    from workloads.moe.dispatch import (COUNT_LAUNCHES_EP, COUNT_LAUNCHES_LOCAL,
                                        PERMUTE_LAUNCHES, SORT_CHUNKS_LAUNCHES)
    tasks = _tasks(ep=4)
    by_label = {t.label: t for t in tasks}
    assert by_label["permute.fwd"].kernels == COUNT_LAUNCHES_EP + PERMUTE_LAUNCHES == 15
    assert by_label["sort_chunks.fwd"].kernels == SORT_CHUNKS_LAUNCHES
    assert by_label["permute.bwd"].kernels == 1          # the backward: one unpermute
    counts = by_label["moe.dispatch_counts"]
    assert counts.op == "all_gather" and counts.bytes == 4 * E * 8
    # the all-to-all's splits come from the gathered counts
    dispatch = next(t for t in tasks if t.label == "moe.dispatch" and t.phase == "forward")
    assert tasks.index(counts) < tasks.index(dispatch)
    assert counts.id in dispatch.deps
    local = {t.label: t for t in _tasks(ep=1)}
    assert local["permute.fwd"].kernels == COUNT_LAUNCHES_LOCAL + PERMUTE_LAUNCHES
    assert "moe.dispatch_counts" not in local


def test_deepep_dispatch_waits_for_the_routing():
    plan = resolve(plan_from_dict(small_plan(model=MOE, mesh={"ep": 4},
                                             moe={"dispatcher": "deepep"})), 8)
    tasks = [t for t in lower(plan).stages[0] if t.layer == 1 and t.microbatch == 0]
    topk = next(t for t in tasks if t.label == "router_topk.fwd")
    dispatch = next(t for t in tasks if t.label == "moe.dispatch" and t.phase == "forward")
    assert topk.id in dispatch.deps
    # the routing still gets its gradient (through the combine's probabilities)
    assert any(t.label == "router_topk.bwd" for t in tasks)
