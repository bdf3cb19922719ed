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
