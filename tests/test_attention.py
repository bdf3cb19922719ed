"""The attention cost (workloads/attention.py) by hand, and every builder emits it."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.attention import AttentionCost
from workloads.layer_builder import LayerBuilder
from workloads.lowering import lower
from workloads.program import ATTENTION

# one rank: 1024 query tokens, keys over a 4096 sequence, 4 heads and 2 KV heads of 128
COST = dict(queries=1024, keys=4096, heads=4, kv_heads=2, head_dim=128, act_bytes=2)


def test_flash_attention_cost_by_hand():
    c = AttentionCost(**COST)
    # QK^T and PV: 2 x (2 s_q s_k d) per head, halved by the causal mask
    forward = 2 * (2 * 1024 * 4096 * 128) * 4 / 2
    assert c.flops("forward") == forward == c.flops("recompute")
    assert c.flops("backward") == 2.5 * forward          # FlashAttention-2, Algorithm 2
    q, kv = 1024 * 4 * 128 * 2, 1024 * 2 * 128 * 2        # bytes of q (= o) and of k (= v)
    assert c.bytes("forward") == 2 * q + 2 * kv           # read q, k, v; write o
    assert c.bytes("backward") == 2 * (2 * q + 2 * kv)
    assert c.kv_block_bytes == 2 * kv
    # ring attention: one of 4 steps computes a quarter and reads its q, k, v again
    assert c.flops("backward", parts=4) == 2.5 * forward / 4
    assert c.bytes("forward", parts=4) == 2 * q + 2 * kv


def test_eager_attention_materialises_the_scores():
    c = AttentionCost(**COST, flash=False)
    flash = AttentionCost(**COST)
    scores = 1024 * 4096 * 4 * 2           # s_q x s_k per head, bf16
    assert c.flops("backward") == 2.0 * c.flops("forward")   # no recompute of S
    assert c.bytes("forward") == flash.bytes("forward") + 7 * scores
    assert c.bytes("backward") == flash.bytes("backward") + 7 * scores
    assert c.bytes("forward", parts=4) == flash.bytes("forward") + 7 * scores / 4


BUILDER_PLANS = {
    "1d": {"mesh": {"tp": 2}},
    "cp_ring": {"mesh": {"tp": 2, "cp": 2}, "context_parallel": {"mode": "ring"}},
    "cp_ulysses": {"mesh": {"tp": 2, "cp": 2}, "context_parallel": {"mode": "all_to_all"}},
    "tp2d": {"mesh": {"tp": 4}, "training": {"micro_batch": 2, "global_batch": 4},
             "sharding": {p: "tp2d" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}},
}


@pytest.mark.parametrize("attention", ["flash", "eager"])
@pytest.mark.parametrize("kind", sorted(BUILDER_PLANS))
def test_every_builder_emits_the_attention_cost(kind, attention):
    raw = {"model": {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024},
           "training": {"global_batch": 4, "micro_batch": 1, "seq_len": 512},
           "mesh": {"dp": "auto"}, "attention": attention, "recompute": "selective"}
    for key, value in BUILDER_PLANS[kind].items():
        raw[key] = {**raw.get(key, {}), **value}
    plan = resolve(plan_from_dict(raw), 8)
    tasks = [t for t in lower(plan).stages[0] if t.layer == 0 and t.microbatch == 0
             and t.op_class == ATTENTION]
    tokens = plan.training.micro_batch * 512 / plan.mesh.cp
    split = {"tp2d": (2, 2)}.get(kind, (1, plan.mesh.tp))   # (token, head) split
    cost = AttentionCost(queries=tokens / split[0], keys=512, heads=8 / split[1],
                         kv_heads=4 / split[1], head_dim=32, act_bytes=2,
                         flash=attention == "flash")
    parts = plan.mesh.cp if kind == "cp_ring" else 1
    for phase in ("forward", "recompute", "backward"):
        got = [(t.flops, t.bytes) for t in tasks if t.phase == phase]
        # selective recompute reruns the core only when flash attention does not
        steps = 0 if phase == "recompute" and attention == "flash" else parts
        assert got == [(pytest.approx(cost.flops(phase, parts)),
                        pytest.approx(cost.bytes(phase, parts)))] * steps, phase


def test_the_builders_implement_the_contract():
    import inspect

    from workloads.attention import LocalAttention
    from workloads.context_parallel import ContextParallelAttention
    from workloads.grid_layer import GridLayer
    from workloads.layer_graph import LayerGraph
    for builder in (LayerGraph, GridLayer, LocalAttention, ContextParallelAttention):
        for method in ("emit_forward", "emit_backward"):
            want = inspect.signature(getattr(LayerBuilder, method)).parameters
            got = inspect.signature(getattr(builder, method)).parameters
            assert list(got) == list(want), (builder.__name__, method)
            assert [p.default for p in got.values()] == [p.default for p in want.values()]
        assert isinstance(inspect.getattr_static(builder, "output_task"), property)


def test_flash_kernel_speed_follows_the_published_curve():
    from workloads.attention import kernel_speed
    # 1 at the 16k causal reference (the profile's attention_efficiency), causal forward
    assert kernel_speed("forward", 16384) == pytest.approx(1.0)
    assert kernel_speed("backward", 16384) == pytest.approx(1.0)
    assert kernel_speed("recompute", 65536) == pytest.approx(1.0)        # clamped past 16k
    # a 512-token causal call runs at 191 of 335 TFLOP/s; 4k at 319 (FA3 paper, Figure 5)
    assert kernel_speed("forward", 512) == pytest.approx(191 / 335)
    assert kernel_speed("forward", 4096) == pytest.approx(319 / 335)
    # log-linear between measured lengths: 2896 = sqrt(2) x 2048 is half way to 4096
    assert kernel_speed("forward", 2048 * 2 ** 0.5) == pytest.approx((298 + 319) / 2 / 335)
    # without the mask the same call is faster (no diagonal tiles)
    assert kernel_speed("forward", 2048, causal=False) == pytest.approx(362 / 335)
    assert kernel_speed("backward", 2048, causal=False) == pytest.approx(291 / 325)


def test_attention_tasks_carry_the_kernel_speed_of_their_calls():
    raw = {"model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024},
           "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 8192},
           "mesh": {"dp": "auto", "cp": 4}, "context_parallel": {"mode": "ring"}}
    tasks = [t for t in lower(resolve(plan_from_dict(raw), 8)).stages[0]
             if t.op_class == ATTENTION and t.microbatch == 0 and t.phase == "forward"]
    from workloads.attention import kernel_speed
    # ring step 0: the causal call of the rank's two 1024-token chunks; later steps: calls
    # without the mask, of the work of a sqrt(2) x 1024 square
    assert [t.efficiency for t in tasks] == [
        pytest.approx(kernel_speed("forward", 2048))] + [
        pytest.approx(kernel_speed("forward", 1024 * 2 ** 0.5, causal=False))] * 3
    local = {**raw, "mesh": {"dp": "auto"}}
    del local["context_parallel"]
    one = [t for t in lower(resolve(plan_from_dict(local), 8)).stages[0]
           if t.op_class == ATTENTION and t.phase == "backward"]
    assert one[0].efficiency == pytest.approx(kernel_speed("backward", 8192))


def test_compute_time_divides_by_the_attention_kernel_speed():
    from dataclasses import replace

    from simulator.compute import device_time_s
    from topologies.specs import DEVICES
    from workloads.program import COMPUTE, Task
    h100 = DEVICES["h100"]
    task = Task(id=0, kind=COMPUTE, stream="compute", op="attention", phase="forward",
                layer=0, microbatch=0, flops=1e15, op_class=ATTENTION)
    fast = device_time_s(task, h100, "bf16") - h100.profile.launch_overhead_s
    slow = device_time_s(replace(task, efficiency=0.5), h100, "bf16")
    assert slow - h100.profile.launch_overhead_s == pytest.approx(2 * fast)
