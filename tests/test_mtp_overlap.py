"""Multi-token-prediction layers in the EP all-to-all overlap (workloads/moe/mtp_overlap.py).

Megatron-Core's combined 1F1B builds a chunk's layer list over the decoder's layers and
then the MTP block's (NVIDIA/Megatron-LM d98e8a64 megatron/core/models/common/
model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.__init__), so an MTP layer
is paired with the other micro-batch's layers like a decoder layer; its mtp_post_process
node runs on the computation stream, after combine_fwd in the forward and before
combine_bwd in the backward (TransformerLayerSchedulePlan.run).
"""
from __future__ import annotations

from collections import Counter

import pytest

from simulator.api import simulate
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024}


def _raw(overlap=True, mtp=1, **over):
    """The small MoE plan with `mtp` MTP layers: 8 ranks, EP 8, 4 layers, 4 micro-batches."""
    training = {"global_batch": 32, **over.pop("training", {})}
    mesh = {"ep": 8, **over.pop("mesh", {})}
    return small_plan(model={**MOE, "mtp_layers": mtp}, mesh=mesh,
                      moe={"overlap_a2a": overlap, "delay_wgrad": overlap},
                      training=training, **over)


def _stage(**kw):
    return lower(resolve(plan_from_dict(_raw(**kw)), 8)).stages[0]


def _key(t):
    return (t.phase, t.layer, t.microbatch, t.label, t.op, t.flops, t.bytes, t.kind)


def test_the_order_is_a_permutation_with_earlier_dependencies():
    on, off = _stage(), _stage(overlap=False)
    assert Counter(map(_key, on)) == Counter(map(_key, off))
    assert all(d < t.id for t in on for d in t.deps)


def _ep_comms(tasks, phase, mb, layer):
    return [t for t in tasks if t.phase == phase and t.microbatch == mb and t.layer == layer
            and t.kind == "comm" and t.stream == "ep"]


def test_the_mtp_layer_pairs_with_the_other_micro_batchs_layers():
    # slot (F1, B0) of 4 layers + MTP: forward 0 with backward MTP, ..., forward MTP with
    # backward 0. The MTP's tasks sit in the head unit (layer -1).
    tasks = _stage()
    f_mtp, b_mtp = _ep_comms(tasks, "forward", 1, -1), _ep_comms(tasks, "backward", 0, -1)
    f_0, b_0 = _ep_comms(tasks, "forward", 1, 0), _ep_comms(tasks, "backward", 0, 0)

    def first(comms, label):
        return next(t.id for t in comms if t.label == label)
    # comm stream per pair: combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    assert (first(b_mtp, "grad.moe.combine") < first(f_0, "moe.dispatch")
            < first(b_mtp, "grad.moe.dispatch") < first(f_0, "moe.combine"))
    assert (first(b_0, "grad.moe.combine") < first(f_mtp, "moe.dispatch")
            < first(b_0, "grad.moe.dispatch") < first(f_mtp, "moe.combine"))
    # the output layers run after every layer of the forward
    main_out = next(t.id for t in tasks if t.phase == "forward" and t.microbatch == 1
                    and t.label == "output.fwd")
    assert main_out > first(f_mtp, "moe.combine")


def _head(tasks, phase, mb):
    return [t for t in tasks if t.phase == phase and t.microbatch == mb and t.layer == -1]


def test_the_mtp_post_process_is_its_norm_on_the_computation_stream():
    # mtp_post_process runs the MTP's final layernorm alone (MultiTokenPredictionLayer.
    # _postprocess): in the forward after the combine and the partner's pre_dispatch
    # backward, in the backward before the combine's gradient
    tasks = _stage()
    for phase, mb in (("forward", 1), ("backward", 0)):
        head = _head(tasks, phase, mb)
        norm = next(t for t in head if t.op == "mtp_norm")
        combine = next(t for t in head if t.label.endswith("moe.combine"))
        assert norm.stream == "compute"
        assert (norm.id > combine.id) is (phase == "forward")
    # forward MTP (micro-batch 1) with backward layer 0 (micro-batch 0): after its
    # attention backward, inside the pair, so before that last backward layer's attention
    # weight gradients, which the chunk defers past its sends (run alone at the chunk's
    # end, as the output unit, it came after them)
    norm = next(t for t in _head(tasks, "forward", 1) if t.op == "mtp_norm")
    partner = [t for t in tasks if t.phase == "backward" and t.microbatch == 0
               and t.layer == 0]
    assert norm.id > next(t.id for t in partner if t.op == "attention")
    assert norm.id < min(t.id for t in partner if t.label in ("wq.wgrad", "wo.wgrad"))


def test_the_output_layers_and_losses_run_in_the_models_post_process():
    # GPTModel._postprocess computes the MTP's output and loss with the model's, after the
    # chunk's layers, its sends and the last layer's deferred weight gradients; in the
    # backward they run before any layer
    tasks = _stage()
    outputs = [t for t in _head(tasks, "forward", 1) if t.op in ("output", "cross_entropy")]
    assert len(outputs) == 4
    last_wgrad = max(t.id for t in tasks if t.phase == "backward" and t.microbatch == 0
                     and t.label.endswith(".wgrad") and t.layer >= 0)
    assert min(t.id for t in outputs) > last_wgrad
    backward = _head(tasks, "backward", 0)
    combine_grad = next(t for t in backward if t.label == "grad.moe.combine")
    assert all(t.id < combine_grad.id for t in backward if t.op in ("output", "cross_entropy"))
    # the final norm is the MTP layer's first task: its backward comes after the MTP's
    final = next(t for t in backward if t.op == "final_norm")
    assert final.id > next(t for t in backward if t.op == "mtp_hnorm").id


# forward: 4 nodes and the post-process, each an event wait and record; backward: the same
# 5 with an autograd call each, and the delayed weight gradients of its TE modules
# (linear_qkv, linear_proj, eh_proj, the experts' fc1 and fc2). The first forward and the
# last backward run alone (combined_1f1b_schedule_for_no_pipelining), through the same
# nodes as the combined steps' (slot F1 + B0).
@pytest.mark.parametrize("phase, mb, ops", [
    ("forward", 1, 5 * 2), ("backward", 0, 5 * 3 + 5),      # combined
    ("forward", 0, 5 * 2), ("backward", 3, 5 * 3 + 5)])     # alone
def test_the_mtp_layer_runs_through_its_five_schedule_nodes(phase, mb, ops):
    host = {"per_kernel_s": 1e-5}
    on, off = (_stage(overlap=o, host_overhead=host) for o in (True, False))
    extra = sum(t.host_s for t in _head(on, phase, mb)) - sum(
        t.host_s for t in _head(off, phase, mb))
    assert extra == pytest.approx(ops * 1e-5)


def test_the_overlap_hides_the_mtp_layers_all_to_alls(h100):
    raw = dict(training={"global_batch": 64, "micro_batch": 1, "seq_len": 4096})

    def step(overlap, mtp):
        plan = plan_from_dict(_raw(overlap=overlap, mtp=mtp, **raw))
        return simulate(plan, h100).summary["exposed_comm_s"]
    # the MTP layer adds exposed all-to-all time without the overlap; with it, the
    # exposed time does not grow by as much
    assert step(True, 1) - step(True, 0) < 0.5 * (step(False, 1) - step(False, 0))


def test_a_last_chunk_holding_only_the_output_layer_and_mtp():
    # DeepSeek-V3's Megatron-Bridge layouts leave the last virtual chunk no decoder layer
    # (layer_split ending in 0): its forward is the MTP layer, then the model's loss
    raw = _raw(mesh={"ep": 4, "pp": 2},
               pipeline={"schedule": "interleaved", "virtual_stages": 2,
                         "layer_split": [1, 1, 2, 0]})
    tasks = lower(resolve(plan_from_dict(raw), 8)).stages[1]
    assert all(d < t.id for t in tasks for d in t.deps)
    head = [t for t in tasks if t.phase == "forward" and t.layer == -1 and t.microbatch == 1]
    last_mtp = max(t.id for t in head if t.op == "cross_entropy" and t.id > min(
        u.id for u in head if u.op == "mtp_norm"))
    assert next(t.id for t in head if t.op == "loss_sum") > last_mtp
