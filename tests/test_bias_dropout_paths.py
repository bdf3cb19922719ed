"""Linear biases and hidden dropout on every path that builds a layer (workloads/
bias_dropout.py): the MoE layer's residual add, SwiGLU's bias gradient, PyTorch's own
under eager kernels, and the 2D/2.5D/3D grid layers, which cannot price them, refusing them.

Sources: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_swiglu.py
(BiasSwiGLUFunction.backward returns one gradient for the fused fc1 output and its
bias), fused_bias_dropout.py (bias-dropout-add after attention and after the MLP, which
for an MoE layer is the MoE layer's output).
"""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.lowering import lower

from conftest import small_plan

GPT_FLAGS = {"linear_bias": True, "hidden_dropout": True}
TOKENS, HIDDEN, FFN = 2048, 1024, 4096     # small_plan: one sequence of 2048, h 1024


def _tasks(raw, layer=1):
    plan = resolve(plan_from_dict(raw), 8)
    return [t for t in lower(plan, "h100").tasks()
            if t.layer == layer and t.microbatch == 0 and t.kind == "compute"]


def _model(**over):
    return {**small_plan()["model"], **over}


def test_moe_layer_add_is_a_bias_dropout_add():
    """The MoE layer's add costs what the dense add costs: 3.5 passes in 2 kernels (bf16)."""
    moe = {"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024}
    tasks = _tasks(small_plan(model=_model(**moe, **GPT_FLAGS)))
    adds = [t for t in tasks if t.op == "residual_add" and t.phase == "backward"]
    assert len(adds) == 2
    assert all(t.bytes == pytest.approx(3.5 * TOKENS * HIDDEN * 2) and t.kernels == 2
               for t in adds)
    plain = _tasks(small_plan(model=_model(**moe)))
    adds = [t for t in plain if t.op == "residual_add" and t.phase == "backward"]
    assert len(adds) == 2 and all(t.bytes == 0 and t.kernels == 0 for t in adds)


def test_swiglu_bias_gradient_reads_both_halves():
    """Fused SwiGLU backward 4.5 passes of [tokens, ffn]; the bias reduction reads the
    [tokens, 2 ffn] gradient of fc1 once more: 6.5 passes, 2 kernels."""
    def swiglu_backward(model):
        task, = [t for t in _tasks(small_plan(model=model))
                 if t.op == "swiglu" and t.phase == "backward"]
        return task.bytes / (TOKENS * FFN * 2), task.kernels
    assert swiglu_backward(_model()) == (pytest.approx(4.5), 1)
    assert swiglu_backward(_model(linear_bias=True)) == (pytest.approx(6.5), 2)


@pytest.mark.parametrize("over,field", [
    ({"linear_bias": True}, "model.linear_bias"),
    ({"hidden_dropout": True}, "model.hidden_dropout"),
    ({"position_embedding": "learned_absolute"}, "model.position_embedding")])
def test_grid_layers_refuse_what_they_do_not_price(over, field):
    grid = {p: "tp2d" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}
    raw = small_plan(model=_model(**over), mesh={"tp": 4}, sharding=grid,
                     training={"global_batch": 8, "micro_batch": 2})
    with pytest.raises(WorkloadError, match=field):
        resolve(plan_from_dict(raw), 8)
    resolve(plan_from_dict({**raw, "model": _model()}), 8)    # a Llama-style grid is fine


def test_eager_kernels_price_pytorchs_bias_gradients_and_dropout():
    """Under eager kernels, per residual add (bf16: the one-byte mask is half a pass):
    nn.Dropout's native_dropout (read, write, mask: 2.5 passes) beside the add's own 3;
    in the backward native_dropout_backward (2.5) and one bias reduction per projection,
    attention's wq, wk, wv and wo (widths 1, 0.5, 0.5 and 1 of h with 8 of 16 KV heads:
    3 passes, 4 kernels) and the MLP's w2 (1 pass); fc1's bias gradient reads SwiGLU's two
    halves (2 passes of the activation) after PyTorch's eager SwiGLU backward (9 passes in
    3 kernels). Without biases and dropout an eager add's backward costs nothing."""
    def per_pass(tasks, op, phase, width):
        return sorted((round(t.bytes / (TOKENS * width * 2), 6), t.kernels) for t in tasks
                      if t.op == op and t.phase == phase)
    tasks = _tasks(small_plan(model=_model(**GPT_FLAGS), kernels="eager"))
    assert per_pass(tasks, "residual_add", "forward", HIDDEN) == [(5.5, 2), (5.5, 2)]
    assert per_pass(tasks, "residual_add", "backward", HIDDEN) == [(3.5, 2), (5.5, 5)]
    assert per_pass(tasks, "swiglu", "backward", FFN) == [(11.0, 4)]
    plain = _tasks(small_plan(model=_model(), kernels="eager"))
    assert per_pass(plain, "residual_add", "backward", HIDDEN) == [(0.0, 0), (0.0, 0)]
    assert per_pass(plain, "swiglu", "backward", FFN) == [(9.0, 3)]
    # learned positions need no kernel: fine under eager kernels
    resolve(plan_from_dict(small_plan(model=_model(position_embedding="learned_absolute"),
                                      kernels="eager")), 8)


def test_eager_qkv_bias_gradients_are_per_rank_under_tensor_parallelism():
    """Without sequence parallelism a column-parallel q, k or v output holds 1/tp of its
    width on every token, the residual stream all of it: at tp 2 the attention add's
    bias passes are 1 (wo) + 2/2 (wq, wk, wv); with it both hold 1/tp of the elements."""
    def attention_add(**over):
        tasks = _tasks(small_plan(model=_model(linear_bias=True), kernels="eager",
                                  mesh={"tp": 2}, **over))
        adds = [t for t in tasks if t.op == "residual_add" and t.phase == "backward"]
        return max(t.kernels for t in adds), max(t.bytes for t in adds) / (TOKENS * HIDDEN * 2)
    assert attention_add() == (4, pytest.approx(2.0))
    assert attention_add(sharding={"sequence_parallel": True}) == (4, pytest.approx(3.0 / 2))
