"""Activation recomputation: the recomputed forward appears in the backward with its own
collectives (Korthikanti et al. 2022, arXiv:2205.05198, section 5)."""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

TOKENS, HIDDEN = 2048, 1024


def _layer_tp_comms(recompute: str, attention: str = "flash") -> tuple[Counter, Counter]:
    raw = small_plan(mesh={"tp": 8}, training={"global_batch": 1},
                     sharding={"sequence_parallel": True}, recompute=recompute,
                     attention=attention)
    program = lower(resolve(plan_from_dict(raw), 8))
    layer = [t for t in program.stages[0] if t.layer == 1]
    comms = Counter((t.phase, t.op, t.bytes) for t in layer if t.kind == "comm")
    attention_tasks = Counter(t.phase for t in layer if t.op == "attention")
    return comms, attention_tasks


def test_full_recompute_repeats_the_forward_collectives():
    # Megatron TP + SP: 2 all-gathers and 2 reduce-scatters of tokens x hidden x 2 bytes
    # in the forward, the same again in the recomputed forward, and the transposed pair
    # in the backward.
    size = TOKENS * HIDDEN * 2
    comms, attn = _layer_tp_comms("full")
    for phase in ("forward", "recompute", "backward"):
        assert comms[(phase, "all_gather", size)] == 2
        assert comms[(phase, "reduce_scatter", size)] == 2
    assert attn == Counter({"forward": 1, "recompute": 1, "backward": 1})


@pytest.mark.parametrize("attention, recomputed", [("eager", 1), ("flash", 0)])
def test_selective_recompute_reruns_only_the_attention_core(attention, recomputed):
    # Under eager attention, selective recompute runs the attention core again (no
    # collectives); flash attention already recomputes inside its backward.
    comms, attn = _layer_tp_comms("selective", attention)
    assert not any(phase == "recompute" for phase, _, _ in comms)
    assert attn["recompute"] == recomputed


def _recomputed(recompute: str, **over) -> list:
    raw = small_plan(recompute=recompute, training={"global_batch": 8}, **over)
    program = lower(resolve(plan_from_dict(raw), 8))
    return [t for t in program.stages[0] if t.layer == 1 and t.phase == "recompute"]


def test_op_level_checkpointing_recomputes_every_second_matmul_and_no_attention():
    # torchtitan selective_ac_option "op": of wq, wk, wv, wo, w1, w3, w2 the 2nd, 4th and
    # 6th are recomputed; attention is saved; the norms, RoPE, SwiGLU and residual adds
    # are rebuilt (they are not in the save list).
    per_mb = Counter(t.op for t in _recomputed("selective_op") if t.microbatch == 0)
    assert {op for op in per_mb if op.startswith("w")} == {"wk", "wo", "w3"}
    assert "attention" not in per_mb
    assert {"attention_norm", "ffn_norm", "rope", "swiglu", "residual_add"} <= set(per_mb)
    full = Counter(t.op for t in _recomputed("full") if t.microbatch == 0)
    assert {op for op in full if op.startswith("w")} == {"wq", "wk", "wv", "wo", "w1", "w3", "w2"}


def test_op_level_checkpointing_sits_between_none_and_full():
    from simulator import simulate
    from topologies import build
    from workloads.memory import memory_breakdown

    steps, peaks = [], []
    for rc in ("none", "selective_op", "full"):
        plan = plan_from_dict(small_plan(recompute=rc))
        steps.append(simulate(plan, build("dgx-h100")).summary["step_time_s"])
        peaks.append(memory_breakdown(resolve(plan, 8)).activations_bytes)
    assert steps[0] < steps[1] < steps[2]
    assert peaks[0] > peaks[1] > peaks[2]


def test_op_level_checkpoint_memory_is_what_the_policy_keeps_under_tp_and_sp():
    # The memory model's features per token equal the saved nodes of a real layer graph
    # (Megatron TP 4 with sequence parallelism): the block input and the reduce-scatter
    # outputs sequence-sharded, column-parallel outputs 1/tp, w2's partial sum whole.
    from workloads.checkpointing import op_checkpoint_features, op_checkpoint_saved
    from workloads.layers import build_layer, layer_shape

    tp = 4
    plan = resolve(plan_from_dict(small_plan(mesh={"tp": tp}, training={"global_batch": 2},
                                             sharding={"sequence_parallel": True})), 8)
    graph = build_layer(plan, 1, layer_shape(plan))
    sh = graph.shape
    saved = [n for n in graph.nodes if n.id in op_checkpoint_saved(graph)]
    features = sum(sh.rows(n.layout) / sh.tokens * sh.cols(n.layout, n.features)
                   for n in saved) + plan.model.hidden_size / tp
    assert op_checkpoint_features(plan.model, tp, tp) == pytest.approx(features)
