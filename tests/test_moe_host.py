"""The host as a timeline: tasks start no earlier than the host issues them, host time
hides behind long kernels, and a host-synchronising task (the MoE dispatcher's tokens per
expert) exposes what the host issues after it (simulator/host_timeline.py,
workloads/host_cost.py, workloads/moe/dispatch.py host_sync_label)."""
from __future__ import annotations

import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.compute import GRACE_HOST_FACTOR, host_factor
from simulator.engine import Engine
from simulator.host_timeline import HostTimeline
from workloads import plan_from_dict, resolve
from workloads.host_cost import TE_MODULE_HOST_S
from workloads.lowering import lower
from workloads.program import Task

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024}


def _raw(**over):
    return small_plan(model=MOE, framework="megatron-core", mesh={"ep": 4}, **over)


def _stage(raw, world=8):
    return lower(resolve(plan_from_dict(raw), world)).stages[0]


def _step(program, topo) -> float:
    engine = Engine(program, topo, SimOptions())
    engine.run()
    return max(end for *_, end in _ends(engine))


def _ends(engine):
    table = engine.trace.table()
    return zip(table["start_s"].to_pylist(), table["end_s"].to_pylist())


# ---- the timeline itself ------------------------------------------------------------
def test_issue_offsets_restart_after_each_sync():
    tasks = [Task(id=i, kind="compute", stream="compute", op="x", phase="forward", layer=0,
                  microbatch=0, host_s=1.0, host_sync=(i == 1)) for i in range(4)]
    host = HostTimeline(tasks, factor=2.0)
    assert list(host.last_sync) == [-1, -1, 1, 1]
    assert list(host.offset) == [2.0, 4.0, 2.0, 4.0]   # host time x the CPU factor, summed


def test_grace_hosts_issue_slower_than_x86_dgx_hosts():
    assert host_factor(topologies.build("dgx-h100").device(0)) == 1.0
    assert host_factor(topologies.build("dgx-b200").device(0)) == 1.0
    assert GRACE_HOST_FACTOR["gb200"] == pytest.approx(37.08 / 13.48)


# ---- host time hides behind the device, except after a sync -------------------------
def _dense_program(host_s: float, sync_every: int = 0):
    """A dense small plan's program with every compute task costing the host `host_s`
    (and every `sync_every`-th compute task a host sync)."""
    plan = resolve(plan_from_dict(small_plan(training={"global_batch": 8})), 8)
    program = lower(plan)
    compute = [t for t in program.stages[0] if t.kind == "compute"]
    for k, task in enumerate(compute):
        task.host_s = host_s
        task.host_sync = bool(sync_every) and k % sync_every == 0
    return program


def test_host_time_below_the_device_time_is_hidden(h100):
    device_only = _step(_dense_program(0.0), h100)
    # 5 us per task is far below the step's device time per task: the host runs ahead
    hidden = _step(_dense_program(5e-6), h100)
    assert hidden == pytest.approx(device_only, rel=0.02)


def test_a_host_bound_step_lasts_the_host_time(h100):
    program = _dense_program(2e-3)
    tasks = sum(1 for t in program.stages[0] if t.kind == "compute")
    assert _step(program, h100) >= tasks * 2e-3


def test_syncs_expose_host_time_the_timeline_otherwise_hides(h100):
    free = _step(_dense_program(5e-6), h100)
    synced = _step(_dense_program(5e-6, sync_every=1), h100)
    # with the host waiting for every task, each task's host time adds to the step
    tasks = sum(1 for t in _dense_program(0.0).stages[0] if t.kind == "compute")
    assert synced - free == pytest.approx(tasks * 5e-6, rel=0.25)


# ---- the MoE sync points ------------------------------------------------------------
def _syncs(raw):
    return [(t.label, t.phase) for t in _stage(raw) if t.host_sync]


def test_alltoall_host_waits_for_the_counts_once_per_moe_forward():
    syncs = _syncs(_raw())
    layers = MOE["num_hidden_layers"]
    micro = 8 // 8           # global batch 8 over dp 8
    assert syncs == [("moe.dispatch_counts", "forward")] * layers * micro


def test_deepep_host_waits_for_the_router_and_padding_removes_the_sync():
    assert {s for s in _syncs(_raw(moe={"dispatcher": "deepep"}))} == {
        ("router_topk.fwd", "forward")}
    assert _syncs(_raw(moe={"capacity_factor": 1.0, "pad_to_capacity": True})) == []


def test_hybridep_host_waits_for_the_gathered_routing_maps():
    # DeepEP hybrid-ep executor.cu: the blocking dispatch synchronises after the metadata
    # preprocessing, whose routing maps are all-gathered over the group first
    raw = _raw(moe={"dispatcher": "deepep", "flex_backend": "hybridep"})
    assert {s for s in _syncs(raw)} == {("moe.routing_map", "forward")}
    tasks = _stage(raw)
    gathers = [t for t in tasks if t.label == "moe.routing_map"]
    layers = MOE["num_hidden_layers"]
    assert len(gathers) == layers and {t.phase for t in gathers} == {"forward"}
    # every rank's map of 2048 tokens x 8 experts, a byte each, over EP 4
    assert {(t.op, t.bytes) for t in gathers} == {("all_gather", 4 * 2048 * 8 * 1)}
    dispatch = next(t for t in tasks if t.label == "moe.dispatch" and t.layer == 1)
    assert next(t.id for t in gathers if t.layer == 1) in dispatch.deps
    # DeepEP's own kernels gather no maps
    assert not any(t.label == "moe.routing_map"
                   for t in _stage(_raw(moe={"dispatcher": "deepep"})))


def test_a_cuda_graphed_step_has_no_host_time_and_no_sync():
    tasks = _stage(_raw(cuda_graphs=True))
    assert not any(t.host_sync or t.host_s for t in tasks)


def test_dependency_joins_cost_the_host_nothing():
    joins = [t for t in _stage(_raw()) if t.op == "join"]
    assert joins and not any(t.host_s for t in joins)


def test_te_module_host_time_once_per_call_fused_linears_share_it():
    tasks = {t.label: t for t in _stage(_raw()) if t.layer == 1 and t.microbatch == 0}
    launch = 10e-6                                   # megatron-core's per-kernel host time
    assert tasks["wq.fwd"].host_s == pytest.approx(TE_MODULE_HOST_S)
    assert tasks["wk.fwd"].host_s == pytest.approx(launch)     # linear_qkv: one module
    assert tasks["wv.fwd"].host_s == pytest.approx(launch)
    # the backward is one call: dgrad carries the module time, wgrad its launch
    assert tasks["wo.dgrad"].host_s == pytest.approx(TE_MODULE_HOST_S)
    assert tasks["wo.wgrad"].host_s == pytest.approx(launch)
    # grouped experts (2 local experts at ep 4): the module plus one launch per expert
    assert tasks["w1.fwd"].host_s == pytest.approx(TE_MODULE_HOST_S + launch)


def test_the_moe_sync_makes_an_eager_moe_step_slower(h100):
    raw = _raw(training={"global_batch": 16})
    eager = simulate(plan_from_dict(raw), h100, SimOptions()).summary["step_time_s"]
    program = lower(resolve(plan_from_dict(raw), 8))
    for task in program.stages[0]:
        task.host_sync = False
    unsynced = _step(program, h100)
    assert eager > unsynced


def test_hybridep_routing_maps_widen_with_expert_tp_and_have_no_backward():
    # Megatron-Core hands HybridEP ETP x the experts (_HybridEPManager num_experts at
    # d98e8a64); with EP 1 the group is ETP's, and the host still waits for the gather
    raw = small_plan(model=MOE, framework="megatron-core", mesh={"ep": 1, "tp": 2},
                     moe={"dispatcher": "deepep", "flex_backend": "hybridep", "etp": 2})
    tasks = _stage(raw)
    gathers = [t for t in tasks if t.label.endswith("moe.routing_map")]
    assert gathers and {t.phase for t in gathers} == {"forward"}
    # 2 ranks' maps of 1024 tokens (the sequence shard) x 2 x 8 columns
    assert {t.bytes for t in gathers} == {2 * 1024 * 2 * 8}
    assert {s for s in _syncs(raw)} == {("moe.routing_map", "forward")}
