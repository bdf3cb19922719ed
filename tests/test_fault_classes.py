"""Faults without every rank: fault-aware rank classes (simulator/rank_classes.py) against
full mode (every rank simulated) on jobs small enough for both: same step time within 1 %,
with a fraction of the ranks simulated."""
from __future__ import annotations

import json

import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.cli import main
from simulator.rank_classes import rank_classes
from topologies.faults import apply_faults
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

PP_TP_DP = small_plan(mesh={"pp": 4, "tp": 4}, training={"global_batch": 32},
                      fsdp={"enabled": True, "reshard_after_forward": False})

CASES = {
    # A straggler in stage 2 of a pipeline: its TP group, its DP group and its pipeline
    # wait on it; TP 4 on 8-GPU nodes splits dp at the node boundary.
    "straggler pp-tp-dp x64": ("dgx-h100x8", PP_TP_DP, ["straggler:gpu=37,slowdown=1.3"]),
    # One NIC at a quarter of its rate under DDP's gradient all-reduce.
    "degraded nic ddp x32": ("dgx-h100x4", small_plan(training={"global_batch": 64}),
                             ["degraded:link=nic1.3,factor=0.25"]),
    # A failed NIC: its rail's traffic falls back to the next rail of the node.
    "link-down fsdp x64": ("dgx-h100x8", small_plan(training={"global_batch": 64},
                                                    fsdp={"enabled": True}),
                           ["link-down:nic=node2/5"]),
    # A node of slower GPUs (A100s among H100s) under TP 8 + FSDP.
    "mixed gpus tp-sp-fsdp x32": ("dgx-h100x4", small_plan(
        mesh={"tp": 8}, fsdp={"enabled": True}, training={"global_batch": 8},
        sharding={"sequence_parallel": True}), ["gpu:ranks=8-15,type=a100"]),
    # One NVLink direction at half rate inside a TP 4 group.
    "degraded nvlink tp4 x16": ("dgx-h100x2", small_plan(
        mesh={"tp": 4}, fsdp={"enabled": True}, training={"global_batch": 8}),
        ["degraded:link=gpu3->nvsw0,factor=0.5"]),
    # A straggler in a context-parallel ring (point-to-point steps around cp).
    "cp ring straggler x16": ("dgx-h100x2", small_plan(
        mesh={"cp": 2, "tp": 4}, fsdp={"enabled": True},
        training={"global_batch": 8, "seq_len": 4096}), ["straggler:gpu=6,slowdown=1.5"]),
    # 256 GPUs, pipeline 4 x TP 8 x DP 8, a failed NIC and a straggler in another stage.
    "link-down + straggler pp x256": ("dgx-h100x32", small_plan(
        mesh={"pp": 4, "tp": 8}, training={"global_batch": 64},
        fsdp={"enabled": True, "reshard_after_forward": False}),
        ["link-down:nic=node5/2", "straggler:gpu=200,slowdown=1.25"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fault_classes_match_full_mode(case):
    topo_name, raw, faults = CASES[case]
    plan = plan_from_dict(raw)
    healthy = simulate(plan, topologies.build(topo_name)).summary
    topo = apply_faults(topologies.build(topo_name), faults)
    classes = simulate(plan, topo, SimOptions(fault_classes=True)).summary
    full = simulate(plan, topo, SimOptions(full=True)).summary
    assert full["step_time_s"] > healthy["step_time_s"] * 1.001     # the fault matters
    assert classes["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
    assert plan.mesh.pp < classes["simulated_ranks"] <= topo.world_size // 2


def _classes(raw, topo):
    plan = resolve(plan_from_dict(raw), topo.world_size)
    return rank_classes(lower(plan), topo)


def test_a_straggler_is_its_own_class_and_its_groups_split_by_relation():
    topo = apply_faults(topologies.build("dgx-h100x8"), ["straggler:gpu=37,slowdown=1.3"])
    classes = _classes(PP_TP_DP, topo)
    mesh = classes.mesh
    assert [r for r in range(64) if classes.class_of[r] == classes.class_of[37]] == [37]
    assert classes.representative(37) == 37
    # Within every stage, two ranks share a class exactly when they stand in the same
    # relation to the straggler: same tp index or not, same node half (dp % 2) or not,
    # same dp pair (dp // 2) or not (the node boundary splits dp into two digits).
    g = mesh.coords(37)

    def relation(rank):
        c = mesh.coords(rank)
        return (c["pp"], c["tp"] == g["tp"], c["dp"] % 2 == g["dp"] % 2,
                c["dp"] // 2 == g["dp"] // 2)

    for a in range(64):
        for b in range(64):
            same = classes.class_of[a] == classes.class_of[b]
            assert same == (relation(a) == relation(b)), (a, b)


def test_symmetric_faults_and_no_faults_keep_the_stage_classes():
    raw = small_plan(mesh={"pp": 2, "tp": 8}, training={"global_batch": 16})
    healthy = topologies.build("dgx-h100x4")
    classes = _classes(raw, healthy)
    assert classes.trivial and classes.representatives == (0, 16)
    # Every IB link at half rate breaks no symmetry: same classes, same result.
    slow_ib = apply_faults(healthy, ["degraded:link=ib,factor=0.5"])
    assert _classes(raw, slow_ib).trivial
    plan = plan_from_dict(raw)
    plain = simulate(plan, slow_ib).summary
    split = simulate(plan, slow_ib, SimOptions(fault_classes=True)).summary
    assert split == plain


def test_a_failed_nic_marks_the_rail_that_relays_its_traffic():
    topo = apply_faults(topologies.build("dgx-h100x4"), ["link-down:nic=node1/3"])
    classes = _classes(small_plan(mesh={"tp": 8}, training={"global_batch": 8}), topo)
    by_class = {}
    for r in range(32):
        by_class.setdefault(int(classes.class_of[r]), []).append(r)
    groups = sorted(by_class.values())
    # tp index 3 (the failed rail), 4 (the rail that takes its traffic) and the rest,
    # each in node 1 or elsewhere.
    assert [11] in groups and [12] in groups
    assert [3, 19, 27] in groups and [4, 20, 28] in groups
    assert len(groups) == 6


def test_run_with_a_fault_simulates_classes_and_full_every_rank(capsys):
    args = ["run", "--plan", "fsdp", "--topo", "dgx-h100x2", "--json",
            "--fault", "straggler:gpu=9,slowdown=1.5"]
    assert main(args) == 0
    classes = json.loads(capsys.readouterr().out)
    assert main(args + ["--full"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert classes["simulated_ranks"] == 4 and full["simulated_ranks"] == 16
    assert classes["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
    assert classes["critical_rank"] == full["critical_rank"] == 9


def test_a_mesh_that_does_not_nest_in_the_domains_falls_back_to_every_rank():
    from simulator.rank_classes import _digit_spans
    from workloads.mesh import ParallelDims
    node8 = topologies.build("dgx-h100x3")
    # TP 3 groups straddle the 8-GPU domains: no digit split fits both.
    assert _digit_spans(ParallelDims(dp=8, tp=3), node8) is None
    assert _digit_spans(ParallelDims(dp=6, tp=4), node8) == [(1, 4), (4, 8), (8, 24)]
