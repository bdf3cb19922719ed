"""Muon under Megatron-Core's layer-wise distributed optimizer (the plan's "muon" section,
workloads/muon.py), each piece against a count worked out by hand.

The small MoE model (tests/moe_small.py): d = 1024, 16 heads of 64 (8 KV heads), 4 layers,
8 experts of FFN 1024 (gated), top-2, on 8 GPUs with EP 4: each rank holds 2 experts of a
layer, shared by an expert-data-parallel group of 2; the attention and the router are
shared by all 8 data-parallel ranks.
"""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.jobs import write_megatron
from workloads.lowering import lower
from workloads.memory import memory_breakdown
from workloads.muon import MAIN_AND_MOMENTUM_BYTES, MUON_STEP_BYTES, ns_flops
from workloads.muon_step import layer_matrices, owned_muon_params
from workloads.params import layer_param_groups

from conftest import small_plan
from moe_small import MOE

MEGATRON = {"framework": "megatron-core", "mesh": {"dp": "auto", "tp": 1, "ep": 4}}


def muon_plan(**over):
    return resolve(plan_from_dict(small_plan(model=MOE, **{"muon": {}, **MEGATRON, **over})), 8)


def test_newton_schulz_flops_by_hand():
    # per step X X^T 2 m^2 n, A A 2 m^3, B X 2 m^2 n, with m the smaller side
    assert ns_flops(2048, 7168, 5) == 5 * (2 * 2048 ** 2 * 7168 * 2 + 2 * 2048 ** 3)
    assert ns_flops(7168, 2048, 1) == ns_flops(2048, 7168, 1)   # oriented, not transposed
    assert ns_flops(1024, 1024, 5) == 5 * 6 * 1024 ** 3


def test_a_layers_muon_weights_by_hand_and_their_groups():
    plan = muon_plan()
    shapes = sorted((m.rows, m.cols, m.count, m.dims) for m in layer_matrices(plan, 1))
    assert shapes == sorted([
        (1024, 1024, 1, ("dp",)), (1024, 512, 1, ("dp",)), (1024, 512, 1, ("dp",)),  # q k v
        (1024, 1024, 1, ("dp",)),                                                  # o
        (1024, 8, 1, ("dp",)),                                                     # router
        (1024, 2048, 2, ("edp",)), (1024, 1024, 2, ("edp",))])   # 2 experts: fc1 (w1+w3), fc2
    # every weight of the layer but its norms: the two RMSNorm vectors of d are left to Adam
    groups = layer_param_groups(plan, 1)
    matrices = {}
    for m in layer_matrices(plan, 1):
        matrices[m.dims] = matrices.get(m.dims, 0) + m.params
    assert groups[("dp",)] - matrices[("dp",)] == 2 * 1024
    assert groups[("edp",)] == matrices[("edp",)]


def test_the_step_runs_each_owned_weights_newton_schulz_gemms():
    plan = muon_plan()
    tasks = lower(plan).stages[0]
    ns = [t for t in tasks if t.op == "muon_ns"]
    per_layer = (sum(ns_flops(r, c, 5) for r, c in ((1024, 1024), (1024, 512), (1024, 512),
                                                     (1024, 1024), (1024, 8))) / 8
                 + 2 * (ns_flops(1024, 2048, 5) + ns_flops(1024, 1024, 5)) / 2)
    assert sum(t.flops for t in ns) == pytest.approx(4 * per_layer)
    assert {t.phase for t in ns} == {"optimizer"} and all(t.op_class == "gemm" for t in ns)
    owned = owned_muon_params(plan, list(range(4)))
    elementwise = [t for t in tasks if t.op == "muon"]
    assert len(elementwise) == 1 and elementwise[0].bytes == pytest.approx(owned * MUON_STEP_BYTES)


def test_gradients_are_all_reduced_and_the_updated_weights_gathered_after_the_step():
    tasks = lower(muon_plan()).stages[0]
    backward = {t.op for t in tasks if t.kind == "comm" and t.phase == "backward"
                and t.group and t.group[0] in ("dp", "edp")}
    assert "all_reduce" in backward and "reduce_scatter" not in backward
    gathers = [t for t in tasks if t.op == "all_gather" and t.phase == "optimizer"]
    # one per group of more than one rank: the shared weights over dp, the experts over edp
    assert sorted(t.group for t in gathers) == [("dp",), ("edp",)]
    step = max(t.id for t in tasks if t.op in ("muon_ns", "adam"))
    assert all(min(t.deps) >= step for t in gathers)


def test_muon_weights_keep_a_main_copy_and_one_moment_on_their_owner():
    muon = muon_plan()
    adam = resolve(plan_from_dict(small_plan(model=MOE, zero_stage=1, **MEGATRON)), 8)
    owned = owned_muon_params(muon, list(range(4)))
    saved = (memory_breakdown(adam).optimizer_bytes - memory_breakdown(muon).optimizer_bytes)
    assert saved == pytest.approx(owned * (12 - MAIN_AND_MOMENTUM_BYTES))


def test_the_megatron_profile_yields_its_zero1_and_fp8_weights_to_muon():
    plan = muon_plan(training={"dtype": "mxfp8"})
    assert plan.zero_stage == 0 and not plan.fp8_param_gather


@pytest.mark.parametrize("over, field", [
    ({"framework": "generic"}, "framework"),
    ({"zero_stage": 1}, "zero_stage"),
    ({"fsdp": {"enabled": True}}, "fsdp.enabled"),
    ({"training": {"dtype": "mxfp8"}, "ddp": {"fp8_param_gather": True}},
     "ddp.fp8_param_gather"),
    ({"muon": {"ns_steps": 0}}, "muon.ns_steps"),
    ({"muon": {"ns_steps": 5.5}}, "muon.ns_steps"),
    ({"muon": {"steps": 5}}, "muon.steps"),
    ({"muon": 5}, "muon"),
])
def test_what_rules_muon_out_is_named(over, field):
    raw = small_plan(model=MOE, **{"muon": {}, **MEGATRON, **over})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert err.value.field == field


def test_a_megatron_export_says_its_release_has_no_muon():
    notes = write_megatron(muon_plan()).notes
    assert any("muon" in n and "dist_muon" in n for n in notes)
