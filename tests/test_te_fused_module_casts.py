"""Megatron-Core runs q/k/v as one Transformer Engine module (linear_qkv) and gate/up as
another (linear_fc1): each casts its input to FP8 once for all its GEMMs, where separate
linears (the generic framework) cast it once each (BuildOptions.fused_te_modules)."""
from __future__ import annotations

import pytest

from conftest import small_plan
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

TOKENS, HIDDEN = 2048, 1024      # small_plan's micro-batch 1 x 2048, hidden 1024


def _casts(framework, dtype="fp8"):
    raw = small_plan(framework=framework, training={"dtype": dtype})
    stage = lower(resolve(plan_from_dict(raw), 8)).stages[0]
    return {t.label: t for t in stage
            if t.layer == 1 and t.microbatch == 0 and t.op.endswith("_cast")}


def test_megatron_core_casts_each_fused_modules_input_once():
    casts = _casts("megatron-core")
    per_input = TOKENS * HIDDEN * 4.0        # read bf16, write FP8 and its transpose
    assert casts["wq.fp8_cast"].bytes == pytest.approx(per_input)
    assert casts["wk.fp8_cast"].bytes == 0.0 and casts["wv.fp8_cast"].bytes == 0.0
    assert casts["w1.fp8_cast"].bytes == pytest.approx(per_input)
    assert casts["w3.fp8_cast"].bytes == 0.0
    # the other halves wait for the module's cast
    assert casts["wq.fp8_cast"].id in casts["wk.fp8_cast"].deps


def test_generic_linears_cast_their_own_inputs():
    casts = _casts("generic")
    assert casts["wq.fp8_cast"].bytes > 0 and casts["w1.fp8_cast"].bytes > 0
    assert casts["wk.fp8_cast"].bytes == pytest.approx(casts["wq.fp8_cast"].bytes)
    assert casts["w3.fp8_cast"].bytes == pytest.approx(casts["w1.fp8_cast"].bytes)


def test_backward_casts_of_each_output_gradient_are_kept():
    fused, generic = _casts("megatron-core"), _casts("generic")
    for linear in ("wq", "wk", "wv", "w1", "w3"):
        label = f"grad.{linear}.fp8_cast"
        assert fused[label].bytes > 0
        assert fused[label].bytes == pytest.approx(generic[label].bytes)


def _grad_sums(framework, model=None):
    raw = small_plan(framework=framework, **({"model": model} if model else {}))
    stage = lower(resolve(plan_from_dict(raw), 8)).stages[0]
    return {t.label: t for t in stage if t.layer == 1 and t.microbatch == 0
            and t.phase == "backward" and t.op in ("grad_accumulate", "join")}


def test_a_fused_modules_input_gradient_is_one_gemm_output():
    """Megatron-Core's linear_qkv and linear_fc1 (and Megatron-LM's legacy query_key_value
    and dense_h_to_4h) compute their input gradient in one GEMM over the concatenated
    weight: no add of q/k/v or gate/up gradients; the residual stream's two branches are
    still added. Separate linears (generic) add theirs."""
    fused, separate = _grad_sums("megatron-core"), _grad_sums("generic")
    # Megatron-LM's legacy model: one query_key_value and one (gated) dense_h_to_4h GEMM
    legacy = _grad_sums("megatron-lm")
    assert {k: (t.op, t.bytes) for k, t in legacy.items()} == {
        k: (t.op, t.bytes) for k, t in fused.items()}
    for norm in ("grad.attention_norm", "grad.ffn_norm"):
        assert fused[norm].op == "join" and fused[norm].bytes == 0.0
        assert separate[norm].op == "grad_accumulate"
    per_tensor = TOKENS * HIDDEN * 2.0       # bf16
    assert separate["grad.attention_norm"].bytes == pytest.approx(4 * per_tensor)  # q, k, v
    assert separate["grad.ffn_norm"].bytes == pytest.approx(3 * per_tensor)        # gate, up
    assert fused["grad.residual_add"].bytes == pytest.approx(3 * per_tensor)


def test_a_moe_layers_router_and_experts_gradients_are_still_added():
    """The routed experts' gate/up is one grouped module (no add over the rows it reads,
    sorted by local expert without EP: sort_chunks); the router's input gradient and the
    dispatch's are two modules: added."""
    moe = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 1024}
    sums = _grad_sums("megatron-core", moe)
    assert sums["grad.sort_chunks"].op == "join"
    assert sums["grad.ffn_norm"].op == "grad_accumulate"
