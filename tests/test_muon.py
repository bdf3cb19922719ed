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
from workloads.muon import MUON_STEP_BYTES, ns_flops
from workloads.muon_ownership import layer_matrices, owned, unit_tensors
from workloads.schedules import EMBED, HEAD
from workloads.params import layer_param_groups, unit_param_groups

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


# Stage 0's tensors (pp 1: the embedding and the output layer too), dealt smallest first to
# 8 data-parallel ranks in the loop 0..7, 7..0: the final norm (1,024) to rank 0, the four
# layers' norm pairs (2,048) to 1-4, their routers (8 x 1024) to 5, 6, 7, 7, wk and wv
# (512 x 1024) to 6, 5, 4, 3, 2, 1, 0, 0, wq and wo (1024 x 1024) to 1-7, 7, the embedding
# and the output layer (8192 x 1024) to 6 and 5. The busiest in Newton-Schulz work is rank
# 7 (two routers, wq and wo); the fullest in state bytes rank 5 (a router, wk, wq and the
# output layer: 12 B a parameter for Adam's). The 16 expert tensors (fc2 1024 x 1024, fc1
# 1024 x 2048) go to 2 expert-data-parallel ranks as 0, 1, 1, 0, ...: 4 of each a rank.
WQ, WK, ROUTER, VOCAB = 1024 * 1024, 512 * 1024, 8 * 1024, 8192 * 1024
EXPERTS = 4 * 1024 * 2048 + 4 * 1024 * 1024


def test_each_rank_updates_what_the_ping_pong_deal_gives_it():
    step, memory = owned(muon_plan(), [EMBED, 0, 1, 2, 3, HEAD])
    assert step.shapes == {(1024, 1024): 2 + 4, (1024, 8): 2, (1024, 2048): 4}
    assert step.adam_params == 0
    assert memory.muon_params == ROUTER + WK + WQ + EXPERTS
    assert memory.adam_params == VOCAB


def test_the_step_runs_the_busiest_ranks_newton_schulz_gemms():
    plan = muon_plan()
    tasks = lower(plan).stages[0]
    ns = [t for t in tasks if t.op == "muon_ns"]
    flops = (2 * ns_flops(1024, 1024, 5) + 2 * ns_flops(1024, 8, 5)
             + 4 * ns_flops(1024, 2048, 5) + 4 * ns_flops(1024, 1024, 5))
    assert sum(t.flops for t in ns) == pytest.approx(flops)
    assert {t.phase for t in ns} == {"optimizer"} and all(t.op_class == "gemm" for t in ns)
    elementwise = [t for t in tasks if t.op == "muon"]
    muon_params = 2 * WQ + 2 * ROUTER + EXPERTS
    assert len(elementwise) == 1
    assert elementwise[0].bytes == pytest.approx(muon_params * MUON_STEP_BYTES)
    # nine per-weight passes over its 12 weights (wq, wo, two routers, 4 fc1 and 4 fc2)
    assert elementwise[0].kernels == 12 * 9
    assert sum(t.kernels for t in ns) == 12 * 3 * 5   # 3 GEMMs x 5 steps a weight
    adam = [t for t in tasks if t.op == "adam"]
    assert len(adam) == 1 and adam[0].bytes == 0   # the busiest rank holds no Adam tensor


def test_gradients_are_all_reduced_and_the_updated_weights_gathered_after_the_step():
    tasks = lower(muon_plan()).stages[0]
    backward = {t.op for t in tasks if t.kind == "comm" and t.phase == "backward"
                and t.group and t.group[0] in ("dp", "edp")}
    assert "all_reduce" in backward and "reduce_scatter" not in backward
    gathers = [t for t in tasks if t.op == "all_gather" and t.phase == "optimizer"]
    # one over dp of every tensor but the experts' (bf16), one over expert DP of theirs
    assert sorted((t.group, t.bytes) for t in gathers) == [
        (("dp",), 2 * (2 * VOCAB + 4 * (2 * WQ + 2 * WK + ROUTER + 2048) + 1024)),
        (("edp",), 2 * 4 * 2 * (1024 * 2048 + 1024 * 1024))]
    step = max(t.id for t in tasks if t.op in ("muon_ns", "adam"))
    assert all(min(t.deps) >= step for t in gathers)


def test_one_data_parallel_rank_shards_nothing():
    plan = resolve(plan_from_dict(small_plan(model=MOE, **{
        "muon": {}, "framework": "megatron-core", "mesh": {"dp": 1, "tp": 1}})), 1)
    tasks = lower(plan).stages[0]
    assert not [t for t in tasks if t.op == "all_gather" and t.phase == "optimizer"]
    step, _ = owned(plan, [EMBED, 0])
    assert step.adam_params == VOCAB + 2048 and step.muon_params == (
        2 * WQ + 2 * WK + ROUTER + 8 * (1024 * 2048 + 1024 * 1024))


def test_muon_weights_keep_a_main_copy_and_one_moment_on_their_owner():
    muon = muon_plan()
    assert memory_breakdown(muon).optimizer_bytes == pytest.approx(
        12 * VOCAB + 8 * (ROUTER + WK + WQ + EXPERTS))


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
    ({"training": {"dtype": "fp32"}}, "training.dtype"),
    ({"optimizer": "foreach"}, "optimizer"),
    ({"sharding": {"w3": "row"}}, "sharding.w3"),
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


MLA = {**MOE, "num_key_value_heads": 16, "q_lora_rank": 256, "kv_lora_rank": 128,
       "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}


@pytest.mark.parametrize("model", [MOE, MLA, {**MLA, "q_lora_rank": 0}])
@pytest.mark.parametrize("tp, sp, cp, ep, etp, mtp", [
    (1, False, 1, 4, None, 0), (2, True, 1, 2, None, 1), (2, False, 2, 2, 1, 0),
    (2, True, 2, 1, 1, 1), (2, True, 1, 4, 1, 0)])
def test_a_units_tensors_are_its_parameters_whatever_the_sharding(model, tp, sp, cp, ep,
                                                                    etp, mtp):
    # the Muon weights of muon_ownership plus one Adam remainder (norms) make up exactly
    # the parameters params.py gives the unit: never more (a negative Adam share), never
    # fewer than the matrices (TP-split shapes, MLA, shared experts, expert TP, MTP)
    raw = small_plan(model={**model, "mtp_layers": mtp}, muon={},
                     framework="megatron-core", mesh={"dp": "auto", "tp": tp, "cp": cp,
                                                      "ep": ep},
                     sharding={"sequence_parallel": sp}, **({"moe": {"etp": etp}} if etp else {}))
    plan = resolve(plan_from_dict(raw), 8)
    assert plan.model.mtp_layers == mtp and plan.sequence_parallel == sp
    for unit in (EMBED, 0, 1, 2, 3, HEAD):
        tensors = unit_tensors(plan, unit)
        assert sum(t.numel for t in tensors) == pytest.approx(
            sum(unit_param_groups(plan, unit).values()))
        assert sum(1 for t in tensors if not t.muon and t.cols == 1) <= 1
    # MTP's transformer block and eh_proj are matrices Muon updates (the output layer: Adam)
    head = unit_tensors(plan, HEAD)
    assert any(t.muon for t in head) == bool(mtp)
    assert any(t.muon and (t.rows, t.cols) == (2 * 1024, 1024 // tp) for t in head) == bool(mtp)
