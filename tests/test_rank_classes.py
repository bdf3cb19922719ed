"""Rank-class mode (one simulated rank per pipeline stage, twins loading the shared links)
against full mode (every rank simulated) on symmetric jobs: same step time within 0.5 %."""
from __future__ import annotations

import pytest

import topologies
from simulator import SimOptions, simulate
from workloads import plan_from_dict

from conftest import small_plan

CASES = {
    # TP 8 inside nodes + FSDP across 2 nodes with sequence parallelism.
    "tp-sp-fsdp x16": ("dgx-h100x2", small_plan(
        mesh={"tp": 8}, fsdp={"enabled": True}, training={"global_batch": 4},
        sharding={"sequence_parallel": True})),
    # Pure FSDP over 64 GPUs: DP rings across 8 nodes on every rail at once.
    "fsdp x64": ("dgx-h100x8", small_plan(training={"global_batch": 64},
                                          fsdp={"enabled": True})),
    # DDP over 32 GPUs with 2 micro-batches.
    "ddp x32": ("dgx-h100x4", small_plan(training={"global_batch": 64})),
    # Pipeline 4 x TP 4 x DP 4 across 8 nodes: sends cross nodes next to DP traffic.
    "pp-tp-dp x64": ("dgx-h100x8", small_plan(
        mesh={"pp": 4, "tp": 4}, training={"global_batch": 32},
        fsdp={"enabled": True, "reshard_after_forward": False})),
    # Sequence-parallel projections: all-to-alls and 2D weight gathers.
    "seq x16": ("dgx-h100x2", small_plan(
        mesh={"tp": 4}, fsdp={"enabled": True}, training={"global_batch": 8},
        sharding={p: "seq" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")} |
        {"sequence_parallel": True})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rank_classes_match_full_mode(case):
    topo_name, raw = CASES[case]
    plan = plan_from_dict(raw)
    topo = topologies.build(topo_name)
    classes = simulate(plan, topo).summary
    full = simulate(plan, topo, SimOptions(full=True)).summary
    assert full["simulated_ranks"] == topo.world_size
    assert classes["simulated_ranks"] == plan.mesh.pp
    assert classes["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.005)
