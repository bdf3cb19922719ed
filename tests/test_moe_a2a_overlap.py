"""EP all-to-all overlap (moe.overlap_a2a, moe.delay_wgrad): Megatron-Core's combined 1F1B
as task order (workloads/moe/a2a_overlap.py, workloads/schedules.py stage_slots).

Expected orders are Megatron-Core's (NVIDIA/Megatron-LM d98e8a64):
megatron/core/pipeline_parallel/combined_1f1b.py (no pipelining: F0, F1+B0, ..., B last),
schedules.py get_pp_rank_microbatches (one extra warm-up forward with virtual stages) and
models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run (per layer:
comm stream combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd).
"""
from __future__ import annotations

from collections import Counter

import pytest

from simulator.api import simulate
from validation.errors import ValidationError
from validation.reference_rows import overlap_flags, plan_dict
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.lowering import lower
from workloads.schedules import stage_order, stage_slots

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024}


def _raw(overlap=True, delay=True, **over):
    """The small MoE plan: 8 ranks, EP 8, 4 micro-batches of one sequence per rank."""
    moe = {"overlap_a2a": overlap, "delay_wgrad": delay, **over.pop("moe", {})}
    training = {"global_batch": 32, **over.pop("training", {})}
    mesh = {"ep": 8, **over.pop("mesh", {})}
    return small_plan(model=over.pop("model", MOE), mesh=mesh, moe=moe, training=training,
                      **over)


def _plan(world=8, **kw):
    return resolve(plan_from_dict(_raw(**kw)), world)


# ---- schedule --------------------------------------------------------------------------
def test_no_pipelining_runs_each_forward_with_the_previous_backward():
    slots = stage_slots("1f1b", 0, 1, 4, 1, combined=True)
    assert slots == [(("F", 0, 0),), (("F", 1, 0), ("B", 0, 0)), (("F", 2, 0), ("B", 1, 0)),
                     (("F", 3, 0), ("B", 2, 0)), (("B", 3, 0),)]


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_interleaved_adds_one_warmup_forward_and_combines_the_steady_state(stage):
    p, v, m = 4, 2, 8
    plain = stage_order("interleaved", stage, p, m, v)
    slots = stage_slots("interleaved", stage, p, m, v, combined=True)
    warmup = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    assert all(len(s) == 1 and s[0][0] == "F" for s in slots[:warmup])
    assert len(slots[warmup]) == 2
    assert sum(len(s) == 2 for s in slots) == m * v - warmup
    # the same forwards and backwards, each in the plain schedule's order
    flat = [step for s in slots for step in s]
    assert [s for s in flat if s[0] == "F"] == [s for s in plain if s[0] == "F"]
    assert [s for s in flat if s[0] == "B"] == [s for s in plain if s[0] == "B"]


def test_without_the_overlap_the_slots_are_the_plain_order():
    assert stage_slots("interleaved", 1, 4, 8, 2) == [
        (s,) for s in stage_order("interleaved", 1, 4, 8, 2)]


# ---- plan keys -------------------------------------------------------------------------
@pytest.mark.parametrize("kw, field", [
    (dict(overlap=False, delay=True), "moe.delay_wgrad"),
    (dict(moe={"dispatcher": "allgather"}), "moe.overlap_a2a"),
    (dict(mesh={"ep": 1}), "moe.overlap_a2a"),
    (dict(mesh={"pp": 2, "ep": 4}), "moe.overlap_a2a"),
    (dict(recompute="full"), "moe.overlap_a2a"),
])
def test_what_megatron_core_asserts_is_refused(kw, field):
    with pytest.raises(WorkloadError) as err:
        _plan(**kw)
    assert err.value.field == field


def test_interleaved_pipeline_is_accepted():
    plan = _plan(world=16, mesh={"pp": 2},
                 pipeline={"schedule": "interleaved", "virtual_stages": 2})
    assert plan.moe.overlap_a2a and plan.moe.delay_wgrad


# ---- lowering --------------------------------------------------------------------------
def _key(t):
    return (t.phase, t.layer, t.microbatch, t.label, t.op, t.flops, t.bytes, t.kind)


def test_the_combined_order_is_a_permutation_with_earlier_dependencies():
    on, off = lower(_plan()).stages[0], lower(_plan(overlap=False, delay=False)).stages[0]
    assert Counter(map(_key, on)) == Counter(map(_key, off))
    assert all(t.id == i for i, t in enumerate(on))
    assert all(d < t.id for t in on for d in t.deps)


def _pair(tasks, f_mb, b_mb, layer_f, layer_b):
    return [t for t in tasks if (t.phase == "forward" and t.microbatch == f_mb
                                 and t.layer == layer_f)
            or (t.phase == "backward" and t.microbatch == b_mb and t.layer == layer_b)]


def test_a_layer_pair_runs_in_megatron_cores_stream_order():
    tasks = lower(_plan()).stages[0]
    # slot (F1, B0): forward layer 0 with backward layer 3 (4 layers, one chunk)
    pair = _pair(tasks, 1, 0, 0, 3)
    ep = [(t.phase, t.label) for t in pair if t.stream == "ep" and t.kind == "comm"]
    assert ep == [("backward", "grad.moe.combine"), ("forward", "moe.dispatch"),
                  ("forward", "moe.dispatch_probs"),
                  ("backward", "grad.moe.dispatch_probs"), ("backward", "grad.moe.dispatch"),
                  ("forward", "moe.combine")]
    compute = [(t.phase, t.label) for t in pair if t.stream == "compute"]
    first = {label: compute.index(label) for label in compute[::-1]}
    # pre_dispatch forward (attention) | expert backward | expert forward | attention bwd
    assert (first[("forward", "attention.fwd")] < first[("backward", "w2.dgrad")]
            < first[("forward", "w1.fwd")] < first[("backward", "attention.bwd")])
    # the token counts' gather runs on the computation stream there
    assert [t.stream for t in pair if t.label == "moe.dispatch_counts"] == ["compute"]
    # combine postprocess (unpermute) runs on the communication stream
    assert {t.stream for t in pair if t.label.startswith("unpermute")} == {"ep"}


def test_delay_wgrad_puts_expert_wgrads_after_their_dgrads():
    for delay in (True, False):
        tasks = lower(_plan(delay=delay)).stages[0]
        bwd = [t.label for t in _pair(tasks, 1, 0, 0, 3)
               if t.phase == "backward" and t.stream == "compute"]
        last_dgrad = max(bwd.index(f"{w}.dgrad") for w in ("w1", "w2", "w3"))
        first_wgrad = min(bwd.index(f"{w}.wgrad") for w in ("w1", "w2", "w3"))
        assert (first_wgrad > last_dgrad) is delay


def test_each_schedule_node_call_costs_the_host_its_event_and_autograd_calls():
    # NVIDIA/Megatron-LM core_v0.17.0 megatron/core/pipeline_parallel/utils.py ScheduleNode:
    # event.wait + event.record around every node call, one autograd engine call per
    # backward node; fine_grained_callables.py: four nodes per MoE layer (attn, dispatch,
    # mlp, combine); with delay_wgrad_compute one backward_dw call per Transformer Engine
    # module (linear_qkv, linear_proj, the experts' linear_fc1 and linear_fc2; the router's
    # weight is no TE module). Each is one operator at the plan's per-kernel host time.
    host = {"per_kernel_s": 1e-5}
    on = _pair(lower(_plan(host_overhead=host)).stages[0], 1, 0, 0, 3)
    off = _pair(lower(_plan(overlap=False, delay=False, host_overhead=host)).stages[0],
                1, 0, 0, 3)
    ops = 4 * 2 + 4 * (2 + 1) + 4
    assert sum(t.host_s for t in on) - sum(t.host_s for t in off) == pytest.approx(ops * 1e-5)
    # the first forward and the last backward run alone, through the same nodes
    # (combined_1f1b.py combined_1f1b_schedule_for_no_pipelining)
    stages = [lower(_plan(overlap=o, delay=o, host_overhead=host)).stages[0]
              for o in (True, False)]
    first, last = ([sum(t.host_s for t in tasks if t.phase == phase and t.microbatch == mb
                        and t.layer == 0) for tasks in stages]
                   for phase, mb in (("forward", 0), ("backward", 3)))
    assert first[0] - first[1] == pytest.approx(4 * 2 * 1e-5)
    assert last[0] - last[1] == pytest.approx((4 * 3 + 4) * 1e-5)
    # a CUDA-graphed step replays without the host (workloads/host_cost.py)
    graphed = _pair(lower(_plan(host_overhead=host, cuda_graphs=True)).stages[0], 1, 0, 0, 3)
    assert sum(t.host_s for t in graphed) == 0.0


def test_the_overlap_hides_all_to_all_time(h100):
    raw = dict(training={"global_batch": 64, "micro_batch": 1, "seq_len": 4096})
    on = simulate(plan_from_dict(_raw(**raw)), h100).summary
    off = simulate(plan_from_dict(_raw(overlap=False, delay=False, **raw)), h100).summary
    assert on["exposed_comm_s"] < off["exposed_comm_s"]
    assert on["step_time_s"] < off["step_time_s"]


# ---- reference rows --------------------------------------------------------------------
def _row(**over):
    row = {"id": "r", "framework": "megatron-core", "model": "mixtral-8x7b", "tp": "1",
           "pp": "1", "dp": "8", "cp": "1", "ep": "8", "global_batch_seqs": "64",
           "seq_len": "4096", "micro_batch": "1", "overlap": "grad_reduce;moe_a2a;delay_wgrad"}
    return {**row, **over}


def test_a_row_states_the_overlap_as_moe_keys():
    moe = plan_dict(_row())["moe"]
    assert moe["overlap_a2a"] is True and moe["delay_wgrad"] is True
    assert "overlap_a2a" not in plan_dict(_row(overlap="grad_reduce")).get("moe", {})


@pytest.mark.parametrize("over", [dict(overlap="grad_reduce;a2a"),
                                  dict(overlap="moe_a2a", ep="", moe_dispatcher=""),
                                  dict(framework="torchtitan", overlap="moe_a2a")])
def test_an_overlap_flag_the_row_cannot_have_is_refused(over):
    with pytest.raises(ValidationError):
        overlap_flags(_row(**over))


def test_the_verified_recipes_carry_the_flag():
    """Rows whose Megatron-Bridge recipe sets moe_a2a_overlap (or, in 25.09, run_script.py
    sets overlap_moe_expert_parallel_comm) at the row's commit, read for this change; and
    the Megatron-LM MoE recipes (examples/moe_recipes at e5ad09802d) whose YAML sets
    overlap_moe_expert_parallel_comm with delay_wgrad_compute; and the Megatron-Bridge
    verification runs whose perf recipe sets it (perf_recipes/qwen/h100/qwen3_moe.py at
    7ded17dae; the GB300 recipes' full-iteration helpers at 0480586879, fbb7570cf and
    79308d0d99, with delay_wgrad_compute). Among the first: the 26.02 Qwen3-30B H100 config
    at v0.3.0, the 26.06 DeepSeek-V3 GB300 GBS 15360 variant at v0.5.0, and the B300 configs
    of Qwen3-30B at v0.5.0 (bac3ffebf) and Qwen3-235B at v0.3.0 (VP 4), and the 26.04 GPT-OSS
    GB200 BF16 config at v0.4.0 (HybridEP; the 26.02/26.02.01 one at v0.3.x has no overlap)."""
    from validation.reference_rows import DEFAULT_CSV, load_rows

    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    on = {rid for rid, r in rows.items() if "moe_a2a" in (r.get("overlap") or "")}
    recipes = {rid for rid in on if rows[rid]["source_family"] == "megatron-lm-moe-recipes"}
    assert recipes == {"mlm-qwen3-235b-h100-bf16-256", "mlm-qwen3-235b-b200-mxfp8-128",
                       "mlm-qwen3-235b-gb200-mxfp8-128-fullcg",
                       "mlm-qwen3-235b-gb200-mxfp8-128-partialcg", "mlm-dsv3-b200-mxfp8-256"}
    assert on - recipes == {"mb-dsv3-b200-mxfp8-256", "mb-gptoss120b-gb200-bf16-64",
                  "mb-qwen3-235b-h100-fp8-256", "mb-qwen3-235b-h100-fp8-256-gbs2048",
                  "mb-qwen3-235b-b200-mxfp8-64", "mb-qwen3-30b-h100-fp8-16-gbs512",
                  "mb-dsv3-gb200-mxfp8-256-pp4", "mb-gptoss120b-gb200-mxfp8-64",
                  "mb-qwen3-30b-gb200-mxfp8-8", "mb-qwen3-235b-gb200-mxfp8-256-vp3",
                  "mb-dsv3-h100-fp8-1024", "mbv-qwen3-30b-h100-bf16-16-hybridep-a2a",
                  "mbv-qwen3-30b-gb300-mxfp8-8", "mbv-qwen3-30b-gb300-mxfp8-32",
                  "mbv-qwen3-30b-gb300-mxfp8-128", "mbv-qwen3-30b-gb300-mxfp8-256",
                  "mbv-gptoss120b-gb300-mxfp8-64",
                  "mbv-qwen3-235b-gb300-mxfp8-256", "mbv-dsv3-gb300-mxfp8-256",
                  "mb-qwen3-30b-h100-fp8-16-vp12", "mb-dsv3-gb300-mxfp8-256-gbs15360",
                  "mb-qwen3-30b-b300-mxfp8-8-fullcg", "mb-qwen3-235b-b300-mxfp8-256-vp4",
                  "mb-gptoss120b-gb200-bf16-64-hybridep"}




def test_the_extra_warmup_forward_is_held_in_memory():
    from workloads.memory import micro_batches_in_flight

    kw = dict(world=16, mesh={"pp": 2}, training={"global_batch": 64},
              pipeline={"schedule": "interleaved", "virtual_stages": 2})
    on, off = _plan(**kw), _plan(overlap=False, delay=False, **kw)
    # stage 0: 2 (p - 1) + (v - 1) p + 1 = 5 chunk-micro-batches, one more with the overlap
    assert micro_batches_in_flight(off, 0) == 5 / 2
    assert micro_batches_in_flight(on, 0) == 6 / 2


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_tp_sharded_shared_experts_run_before_the_dispatch(dispatcher):
    # TP 2 with expert TP 1 (DeepSeek-V3's H100 recipe): the shared experts' input is
    # gathered over TP; Megatron-Core computes them in pre_dispatch
    model = {**MOE, "n_shared_experts": 1}
    tasks = lower(_plan(world=16, model=model, mesh={"tp": 2, "ep": 8},
                        moe={"etp": 1, "dispatcher": dispatcher},
                        sharding={"sequence_parallel": True})).stages[0]
    assert all(d < t.id for t in tasks for d in t.deps)
    pair = [t.label for t in _pair(tasks, 1, 0, 0, 3) if t.phase == "forward"]
    assert pair.index("shared_w2.fwd") < pair.index("moe.dispatch")


def test_tp_comm_overlap_rings_keep_their_streams(h100x2):
    # TP overlap's ring steps (tp_ring_send / tp_ring_recv) around the shared experts'
    # input stay on their streams: moved to the ep stream they deadlocked the peers
    model = {**MOE, "n_shared_experts": 1}
    raw = _raw(model=model, mesh={"tp": 2, "ep": 8}, moe={"etp": 1},
               sharding={"sequence_parallel": True}, framework="megatron-core")
    raw["overlap"] = {"tp_comm": True}
    tasks = lower(resolve(plan_from_dict(raw), 16)).stages[0]
    assert {t.stream for t in tasks if t.op == "send_recv"} <= {
        "tp_ring_send", "tp_ring_recv", "pp_send", "pp_recv"}
    assert simulate(plan_from_dict(raw), h100x2).summary["step_time_s"] > 0


def test_hybridep_routing_map_gather_runs_in_the_dispatch_node():
    # Megatron-Core's flex dispatcher calls HybridEP (metadata preprocessing, the routing
    # maps' all-gather, the dispatch) in token_dispatch: the moe_dispatch node, on the
    # communication stream, before the dispatch
    tasks = lower(_plan(moe={"dispatcher": "deepep", "flex_backend": "hybridep"})).stages[0]
    pair = _pair(tasks, 1, 0, 0, 3)
    ep = [t.label for t in pair if t.stream == "ep" and t.kind == "comm"
          and t.phase == "forward"]
    assert ep[:2] == ["moe.routing_map", "moe.dispatch"]


def test_main_grad_adds_without_accumulation_fusion_follow_the_delayed_wgrads():
    """Megatron-Core DDP without gradient-accumulation fusion adds each weight gradient
    into main_grad; with delay_wgrad the experts' weight gradients come late in the pair,
    and the adds are issued with the layer's reductions, after them (the combined order
    had put them first: "would wait for a later task")."""
    plan = _plan(framework="megatron-core", ddp={"gradient_accumulation_fusion": False})
    tasks = lower(plan).stages[0]
    adds = [t for t in tasks if t.op == "main_grad_add"]
    assert adds and all(d < t.id for t in adds for d in t.deps)
