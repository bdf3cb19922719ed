"""The mechanisms NeMo AutoModel's runs need, each against a count worked out by hand: the
round-robin gate (moe.gate), FSDP's gradient sync under gradient accumulation
(fsdp.grad_sync), kernel modes by family (kernels as an object), a pipeline schedule run
several times per step (pipeline.rounds), and the nemo-automodel profile. Each bad value
exits 2 with one line naming the field.

The small MoE model (tests/moe_small.py): d = 1024, E = 8 experts of FFN 1024, top-2; one
micro-batch of 2048 tokens per rank; bf16.
"""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from simulator.cli import main
from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.lowering import lower
from workloads.moe import imbalance
from workloads.moe.group_routing import block_hit, round_robin_hit
from workloads.schedules import stage_slots

from conftest import small_plan
from moe_small import D, E, K, T, layer_tasks, moe_plan

ROUND_ROBIN = {"dispatcher": "deepep", "gate": "round_robin"}


# ---- the round-robin gate ---------------------------------------------------------------
def _brute_force_hit(experts: int, blocks: int, k: int) -> float:
    """Mean over blocks of the share of tokens t whose experts t k .. t k + k - 1 (mod E)
    meet the block, over one period of E tokens."""
    size = experts // blocks
    hits = sum(len({(t * k + j) % experts // size for j in range(k)}) for t in range(experts))
    return hits / (experts * blocks)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(8, 2), (16, 4), (32, 4), (64, 8), (128, 8), (256, 8), (384, 8),
                        (60, 6), (12, 5)]), st.integers(1, 64))
def test_round_robin_hit_counts_the_windows_that_meet_each_block(model, blocks):
    experts, k = model
    if experts % blocks or k > experts:
        return
    assert round_robin_hit(experts, blocks, k) == pytest.approx(
        _brute_force_hit(experts, blocks, k))


@pytest.mark.parametrize("experts, blocks, k, reached", [
    (128, 8, 8, 1.0),    # Qwen3-30B-A3B on EP 8: a token's 8 experts on one rank
    (256, 64, 8, 2.0),   # DeepSeek-V3 on EP 64: 4 experts a rank, two ranks
    (256, 8, 8, 1.0),    # ... and one node of 8 of them
    (384, 32, 8, 4 / 3),  # Kimi K2 on EP 32: 12 experts a rank, a window crosses 1 in 3
])
def test_round_robin_reaches_fewer_ranks_than_random_routing(experts, blocks, k, reached):
    assert round_robin_hit(experts, blocks, k) * blocks == pytest.approx(reached)
    assert block_hit(experts, blocks, k) * blocks > reached


def test_round_robin_gate_has_no_router_and_balances_every_expert():
    plan = moe_plan(mesh={"ep": 4}, moe=ROUND_ROBIN)
    labels = {t.label for t in layer_tasks(plan)}
    assert "router_round_robin.fwd" in labels
    assert not {"router.fwd", "router_topk.fwd"} & labels
    assert imbalance.imbalance(plan, T) == 1.0
    # its weights (fp32 ones, divided, cast to bf16: 4 + 8 + 4 + 2 B a slot) and indices
    # (arange, remainder: 8 + 16 B) over 5 launches, no backward
    gate = [t for t in lower(plan).stages[0] if t.label == "router_round_robin.fwd"][0]
    assert gate.bytes == pytest.approx(T * K * (18 + 24)) and gate.kernels == 5
    backward = [t for t in lower(plan).stages[0] if t.op == "router_round_robin"
                and t.phase == "backward"]
    assert all(t.bytes == 0 and t.kernels == 0 for t in backward)


@pytest.mark.parametrize("moe, ep", [(ROUND_ROBIN, 4),
                                     ({**ROUND_ROBIN, "flex_backend": "hybridep"}, 1)])
def test_the_host_waits_for_the_round_robin_gate_before_deepep_dispatches(moe, ep):
    plan = moe_plan(mesh={"ep": ep}, moe=moe, host_overhead={"per_kernel_s": 1e-5})
    syncs = {t.label for t in lower(plan).stages[0] if t.host_sync}
    assert syncs == {"router_round_robin.fwd"}


def test_round_robin_dispatch_moves_one_row_per_destination_rank():
    # E = 8 over EP 4: 2 experts a rank, top-2 windows start at even experts -> one rank
    rr = moe_plan(mesh={"ep": 4}, moe=ROUND_ROBIN)
    forced = moe_plan(mesh={"ep": 4}, moe={"dispatcher": "deepep", "force_balance": True})
    rr_bytes = [t for t in layer_tasks(rr) if t.label == "moe.dispatch"][0].bytes
    assert rr_bytes == pytest.approx(T * D * 2 * 1.0)
    assert [t for t in layer_tasks(forced) if t.label == "moe.dispatch"][0].bytes > rr_bytes


def test_round_robin_gate_holds_no_router_weights():
    rr = moe_plan(mesh={"ep": 4}, moe=ROUND_ROBIN, fsdp={"enabled": True})
    learned = moe_plan(mesh={"ep": 4}, moe={"dispatcher": "deepep"}, fsdp={"enabled": True})

    def gathered(plan):
        return sum(t.bytes for t in lower(plan).stages[0]
                   if t.op == "all_gather" and t.label == "fsdp.gather.1" and t.microbatch == 0
                   and t.phase == "forward")
    assert gathered(learned) - gathered(rr) == pytest.approx(D * E * 2)


@pytest.mark.parametrize("moe, field", [
    ({"gate": "random"}, "moe.gate"),
    ({"gate": "round_robin", "force_balance": True}, "moe.force_balance"),
    ({"gate": "round_robin", "aux_loss": True}, "moe.aux_loss"),
    ({"gate": "round_robin", "load_imbalance": [1, 2, 3, 4, 1, 1, 1, 1]}, "moe.load_imbalance"),
    ({"gate": "round_robin", "load_imbalance": 1.2}, "moe.load_imbalance"),
    ({"gate": "round_robin", "capacity_factor": 1.0}, "moe.capacity_factor"),
])
def test_round_robin_gate_refusals_name_the_field(moe, field):
    with pytest.raises(WorkloadError) as err:
        moe_plan(mesh={"ep": 4}, moe=moe)
    assert str(err.value).startswith(f"{field}:")


# ---- FSDP's gradient sync ---------------------------------------------------------------
def _reductions(plan) -> list:
    return [t for t in lower(plan).stages[0] if t.op == "reduce_scatter"]


def _fsdp_plan(world=8, fsdp=None):
    raw = small_plan(fsdp={"enabled": True, **(fsdp or {})}, training={"global_batch": 32})
    return resolve(plan_from_dict(raw), world)


def test_grad_sync_step_reduces_once_and_keeps_parameters_gathered():
    every = _fsdp_plan()                               # torch's default: each micro-batch
    once = _fsdp_plan(fsdp={"grad_sync": "step"})
    units = len({t.label for t in _reductions(every)})
    assert every.micro_batches == 4
    assert len(_reductions(every)) == 4 * units
    assert len(_reductions(once)) == units
    assert {t.microbatch for t in _reductions(once)} == {3}
    # parameters stay gathered after each backward (reshard_after_backward off), so only
    # the first micro-batch's forward gathers; each backward gathers again, as the forward
    # resharded them (reshard_after_forward)
    def gathers(plan, phase):
        return {t.microbatch for t in lower(plan).stages[0]
                if t.op == "all_gather" and t.phase == phase}
    assert gathers(once, "forward") == {0} and gathers(every, "forward") == {0, 1, 2, 3}
    assert gathers(once, "backward") == {0, 1, 2, 3}


def test_grad_sync_microbatch_under_pipelining_reduces_every_micro_batch():
    base = {"mesh": {"dp": "auto", "pp": 2}, "training": {"global_batch": 32}}
    auto = resolve(plan_from_dict(small_plan(fsdp={"enabled": True}, **base)), 8)
    every = resolve(plan_from_dict(small_plan(
        fsdp={"enabled": True, "grad_sync": "microbatch"}, **base)), 8)
    assert {t.microbatch for t in _reductions(auto)} == {auto.micro_batches - 1}
    assert {t.microbatch for t in _reductions(every)} == set(range(every.micro_batches))


@pytest.mark.parametrize("over", [
    {"fsdp": {"grad_sync": "step"}},                                  # no FSDP
    {"fsdp": {"enabled": True, "grad_sync": "sometimes"}},
])
def test_grad_sync_refusals_name_the_field(over):
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(**over)), 8)
    assert str(err.value).startswith("fsdp.grad_sync:")


# ---- kernel modes by family -------------------------------------------------------------
def _op_bytes(plan, op: str) -> float:
    return sum(t.bytes for t in lower(plan).stages[0]
               if t.op == op and t.layer == 1 and t.microbatch == 0 and t.phase == "forward")


def test_a_family_runs_in_its_own_mode_beside_the_default():
    def plan(kernels):
        return resolve(plan_from_dict(small_plan(kernels=kernels)), 8)
    fused, eager = plan("fused"), plan("eager")
    mixed = plan({"default": "eager", "norm": "fused"})
    assert _op_bytes(mixed, "attention_norm") == _op_bytes(fused, "attention_norm")
    assert _op_bytes(mixed, "rope") == _op_bytes(eager, "rope")
    assert _op_bytes(eager, "attention_norm") > _op_bytes(fused, "attention_norm")
    # the default may be left to the profile: generic's is fused
    assert plan({"rope": "eager"}).kernels == "fused"


@pytest.mark.parametrize("kernels, field", [
    ({"default": "eager", "norms": "fused"}, "kernels.norms"),
    ({"default": "eager", "norm": "compiled"}, "kernels.norm"),
    ({"default": "triton"}, "kernels"),
])
def test_kernel_family_refusals_name_the_field(kernels, field):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(kernels=kernels))
    assert str(err.value).startswith(f"{field}:")


# ---- pipeline rounds --------------------------------------------------------------------
def test_rounds_run_the_schedule_again_after_a_full_drain():
    once = stage_slots("interleaved", 0, 4, 8, 2)
    twice = stage_slots("interleaved", 0, 4, 16, 2, rounds=2)
    assert twice[:len(once)] == once
    assert twice[len(once):] == [tuple((k, mb + 8, c) for k, mb, c in slot) for slot in once]
    assert twice != stage_slots("interleaved", 0, 4, 16, 2)


def test_rounds_add_a_pipeline_bubble_per_round(h100):
    from simulator import simulate

    def step(rounds):
        raw = small_plan(mesh={"dp": 2, "pp": 4}, training={"global_batch": 32},
                         pipeline={"schedule": "1f1b", "rounds": rounds},
                         fsdp={"enabled": True})
        return simulate(plan_from_dict(raw), h100).summary["step_time_s"]
    assert step(4) > step(2) > step(1)


@pytest.mark.parametrize("over", [
    {"pipeline": {"rounds": 3}, "mesh": {"dp": 1, "pp": 4}, "training": {"global_batch": 16}},
    {"pipeline": {"rounds": 2}},                                          # no PP
    {"pipeline": {"rounds": 0}, "mesh": {"dp": 1, "pp": 4}},
])
def test_rounds_refusals_name_the_field(over):
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(**over)), 8 if "pp" not in over.get("mesh", {})
                else 4)
    assert str(err.value).startswith("pipeline.rounds:")


# ---- the nemo-automodel profile ---------------------------------------------------------
def test_the_profile_sets_automodels_defaults_and_the_plan_keys_win():
    plan = plan_from_dict(small_plan(framework="nemo-automodel"))
    assert (plan.fsdp, plan.fsdp_version, plan.fsdp_grad_sync, plan.optimizer,
            plan.loss_kernels, plan.attention) == (True, 2, "step", "foreach", "eager", "flash")
    assert (plan.kernels, dict(plan.kernels_by_family)) == (
        "eager", {"norm": "fused", "swiglu": "fused"})
    own = plan_from_dict(small_plan(framework="nemo-automodel", kernels="fused",
                                    fsdp={"grad_sync": "microbatch"}))
    assert (own.kernels, dict(own.kernels_by_family), own.fsdp_grad_sync) == (
        "fused", {}, "microbatch")


@pytest.mark.parametrize("framework", ["nemo-automodel", "torchtitan"])
def test_fsdp_keeps_parameters_gathered_after_forward_under_pipelining(framework):
    flat = plan_from_dict(small_plan(framework=framework))
    piped = plan_from_dict(small_plan(framework=framework, mesh={"dp": "auto", "pp": 2}))
    said = plan_from_dict(small_plan(framework=framework, mesh={"dp": "auto", "pp": 2},
                                     fsdp={"reshard_after_forward": True}))
    assert (flat.reshard_after_forward, piped.reshard_after_forward,
            said.reshard_after_forward) == (True, False, True)
    assert plan_from_dict(small_plan(mesh={"dp": "auto", "pp": 2})).reshard_after_forward


def test_a_bad_kernels_object_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(small_plan(kernels={"default": "eager", "rope": 3})))
    assert main(["run", "--plan", str(path), "--topo", "dgx-h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kernels.rope" in err[0]


def test_every_gate_and_sync_combination_simulates(h100):
    from simulator import simulate
    for gate, sync in itertools.product(("router", "round_robin"), ("microbatch", "step")):
        raw = small_plan(model=moe_plan.__defaults__[1], mesh={"dp": "auto", "ep": 4},
                         moe={"dispatcher": "deepep", "gate": gate},
                         fsdp={"enabled": True, "grad_sync": sync},
                         training={"global_batch": 16})
        assert simulate(plan_from_dict(raw), h100).summary["step_time_s"] > 0


# ---- a model trained in 16 bits (framework_traits.model_params_16bit) -------------------
def test_a_16_bit_model_holds_half_the_states_of_fsdp2s_fp32_master():
    from workloads.memory import memory_breakdown

    def states(framework):
        raw = small_plan(framework=framework, kernels="fused", recompute="none",
                         optimizer="foreach",
                         fsdp={"enabled": True, "grad_sync": "microbatch"})
        mem = memory_breakdown(resolve(plan_from_dict(raw), 8))
        return mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes
    (p16, g16, o16), (p32, g32, o32) = states("nemo-automodel"), states("generic")
    # FSDP2 over an fp32 master: 4 + 4 + 8 bytes a parameter; AutoModel's bf16 model: 2 + 2 + 4
    assert (p16 / p32, g16 / g32, o16 / o32) == pytest.approx((0.5, 0.5, 0.5))
    assert o32 == pytest.approx(2 * p32)


def test_the_16_bit_adam_step_moves_what_torch_counts_over_bf16_tensors():
    import torch
    from test_kernels import CountBytes
    from workloads.grad_state import adam_bytes_per_param

    n, tensors = 1 << 12, 3
    params = [torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(n, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    opt.step()
    with CountBytes() as counted:
        opt.step()
    plan = resolve(plan_from_dict(small_plan(framework="nemo-automodel")), 8)
    assert adam_bytes_per_param(plan) == pytest.approx(counted.moved / (tensors * n))
    assert adam_bytes_per_param(resolve(plan_from_dict(small_plan()), 8)) is None


def test_fsdp_gathers_a_16_bit_shard_without_casting_it():
    def copy_in(framework):
        raw = small_plan(framework=framework, fsdp={"enabled": True})
        return [t for t in lower(resolve(plan_from_dict(raw), 8)).stages[0]
                if t.op == "fsdp_gather_copy_in"][1]
    bf16_model, fp32_master = copy_in("nemo-automodel"), copy_in("generic")
    assert bf16_model.kernels == 1 and fp32_master.kernels == 2
    # a copy of the 2-byte shard into the gather buffer (read and write) against the fp32
    # shard's cast (read 4, write 2) and that copy
    assert bf16_model.bytes / fp32_master.bytes == pytest.approx(4 / (6 + 4))


# ---- review fixes: FSDP-only defaults, one schedule's buffers, ungathered groups -------
@pytest.mark.parametrize("framework", ["torchtitan", "nemo-automodel"])
def test_profile_fsdp_defaults_do_not_reach_a_plan_without_fsdp(framework):
    raw = small_plan(framework=framework, fsdp={"enabled": False},
                     mesh={"dp": "auto", "pp": 2}, attention="flash")
    plan = resolve(plan_from_dict(raw), 8)
    assert plan.reshard_after_forward and plan.fsdp_grad_sync == "auto"


def _piped(rounds, **over):
    raw = small_plan(framework="nemo-automodel", mesh={"dp": "auto", "pp": 2},
                     training={"global_batch": 32}, pipeline={"rounds": rounds}, **over)
    return resolve(plan_from_dict(raw), 8)


def test_torch_pipelining_buffers_are_one_schedule_calls():
    from workloads.memory import pipeline_buffer_count
    once, twice = _piped(1), _piped(2)
    assert pipeline_buffer_count(twice, [0], 2) * 2 == pipeline_buffer_count(once, [0], 2)


def test_sync_once_a_step_reduces_at_the_end_of_each_schedule_call():
    plan = _piped(2, fsdp={"grad_sync": "step"})
    per_round = plan.micro_batches // 2
    assert {t.microbatch for t in _reductions(plan)} == {per_round - 1, 2 * per_round - 1}


def test_rounds_need_fsdp_where_gradients_are_reduced():
    raw = small_plan(mesh={"dp": "auto", "pp": 2}, training={"global_batch": 32},
                     pipeline={"rounds": 2})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert str(err.value).startswith("pipeline.rounds:")


def test_experts_that_fsdp_never_gathers_hold_no_gather_buffer():
    from workloads.memory import _fsdp_units
    from workloads.params import unit_param_groups
    from workloads.schedules import stage_layers

    def layer_unit(ep):
        plan = moe_plan(mesh={"ep": ep}, moe=ROUND_ROBIN, framework="nemo-automodel")
        units = dict(_fsdp_units(plan, 0, stage_layers(plan)))
        unit = [u for u in units if u == 1][0]
        return units[unit], sum(unit_param_groups(plan, unit).values())
    gathered8, total8 = layer_unit(8)   # EP 8 = DP 8: its one expert is never gathered
    gathered4, total4 = layer_unit(4)   # EP 4: its two experts gathered over 2 ranks
    assert total8 - gathered8 == pytest.approx(3 * D * 1024)
    assert gathered4 == total4


def test_automodels_unpoliced_expert_groups_reduce_in_bf16():
    plan = moe_plan(mesh={"ep": 4}, moe=ROUND_ROBIN, framework="nemo-automodel",
                    fsdp={"grad_sync": "microbatch"})
    scatters = [t for t in _reductions(plan) if t.label == "grad.reduce.1"
                and t.microbatch == 0]
    by_group = {t.group: t.bytes for t in scatters}
    experts = [g for g in by_group if "edp" in g][0]
    dense = [g for g in by_group if "edp" not in g][0]
    # 2 local experts x 3 matrices of D x F in bf16 against the attention's fp32
    assert by_group[experts] == pytest.approx((E // 4) * 3 * D * 1024 * 2)
    assert by_group[dense] / by_group[experts] > 0.1
