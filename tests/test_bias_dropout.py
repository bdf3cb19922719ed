"""GPT-3's linear biases, hidden dropout and learned positions (workloads/bias_dropout.py).

Sources: NVIDIA/Megatron-LM core_r0.8.0 megatron/core/fusions/fused_bias_gelu.py
(GeLUFunction.backward returns the same gradient for the input and the bias, reduced to
the bias by autograd's sum_to), fused_bias_dropout.py (bias + dropout + residual, one
jit-fused kernel that keeps a one-byte mask); NeMo-Framework-Launcher 24.07 conf/training/
gpt3/5b.yaml (hidden_dropout 0.1) and nemotron/nemotron_8b.yaml (bias false, dropout 0.0);
NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (bias True,
position_embedding_type learned_absolute).
"""
from __future__ import annotations

import csv
import json

import pytest

from validation.reference_rows import DEFAULT_CSV, plan_dict
from workloads import plan_from_dict
from workloads.bias_dropout import activation_bias_grad, residual_add_costs
from workloads.lowering import lower
from workloads.model_presets import PRESETS
from workloads.model_spec import LEARNED


def _row(rid: str) -> dict[str, str]:
    with open(DEFAULT_CSV, newline="") as f:
        return next(r for r in csv.DictReader(f) if r["id"] == rid)


def _layer_tasks(rid: str, layer: int = 10):
    plan = plan_from_dict(plan_dict(_row(rid)))
    return plan, [t for t in lower(plan, "h100").tasks()
                  if t.layer == layer and t.microbatch == 0 and t.kind == "compute"]


def test_llama_layer_keeps_plain_residual_add():
    m = PRESETS["llama3-8b"]
    assert residual_add_costs(m, 2) == ((2.0, 1.0), None)
    assert activation_bias_grad(m) is None


def test_gpt3_bias_dropout_add_passes():
    """bf16: the mask is half a pass; backward reads the gradient and the mask and writes
    the branch gradient (2.5), then the bias's reduction reads it (1): 3.5 in 2 kernels."""
    m = PRESETS["gpt3-175b"]
    assert m.linear_bias and m.hidden_dropout and m.position_embedding == LEARNED
    assert residual_add_costs(m, 2) == ((2.0, 1.5), (3.5, 2))
    # fc1's bias gradient: one more read of the [tokens, ffn / tp] tensor, one more kernel
    assert activation_bias_grad(m) == (1.0, 1)


def test_gpt3_5b_row_layer_tasks():
    """nemo-gpt3-5b-64: TP 1, 4 x 2048 tokens, hidden 4096, FFN 16384, bf16 activations."""
    plan, tasks = _layer_tasks("nemo-gpt3-5b-64")
    hidden_pass = 4 * 2048 * 4096 * 2
    ffn_pass = 4 * 2048 * 16384 * 2
    adds_b = [t for t in tasks if t.op == "residual_add" and t.phase == "backward"]
    assert len(adds_b) == 2
    assert all(t.bytes == pytest.approx(3.5 * hidden_pass) and t.kernels == 2
               for t in adds_b)
    adds_f = [t for t in tasks if t.op == "residual_add" and t.phase == "forward"]
    assert len(adds_f) == 2
    assert all(t.bytes == pytest.approx(3.5 * hidden_pass) for t in adds_f)
    gelu_b, = [t for t in tasks if t.op == "gelu" and t.phase == "backward"]
    assert gelu_b.bytes == pytest.approx(4 * ffn_pass) and gelu_b.kernels == 2
    assert not [t for t in tasks if t.op.startswith("rope")]   # learned absolute positions


def test_nemotron_row_unchanged():
    """Nemotron-3 8B: bias false, dropout 0.0, RoPE: a plain add with no backward kernel."""
    _, tasks = _layer_tasks("nemo-nemotron3-8b-64")
    adds_b = [t for t in tasks if t.op == "residual_add" and t.phase == "backward"]
    assert len(adds_b) == 2 and all(t.bytes == 0 and t.kernels == 0 for t in adds_b)
    assert [t for t in tasks if t.op == "rope"]


def test_reference_models_json_flags():
    with open("validation/references/models.json") as f:
        models = json.load(f)
    for name in ("gpt3-5b", "gpt3-20b"):
        assert models[name]["linear_bias"] and models[name]["hidden_dropout"]
        assert models[name]["position_embedding"] == LEARNED
    for name in ("nemotron3-8b", "nemotron3-22b", "nemotron4-15b", "nemotron4-340b"):
        assert not models[name].get("linear_bias") and not models[name].get("hidden_dropout")


@pytest.mark.parametrize("rid", ["nemo-gpt3-5b-64", "dgxc-llama3-8b-bf16-8"])
def test_megatron_flags_round_trip(rid):
    """Export then import gives back the model's positions, biases and dropout, strictly
    (no --lenient): GPT-3 writes none of the bias-free, dropout-free flags and reads back
    Megatron's defaults (learned_absolute, biases, dropout 0.1)."""
    from workloads.jobs import read_megatron, write_megatron
    plan = plan_from_dict(plan_dict(_row(rid)))
    text = write_megatron(plan).text
    back = plan_from_dict(read_megatron(text).plan).model
    for name in ("position_embedding", "linear_bias", "hidden_dropout"):
        assert getattr(back, name) == getattr(plan.model, name), name
    if plan.model.linear_bias:
        assert "--disable-bias-linear" not in text and "--hidden-dropout 0" not in text
        assert "--position-embedding-type learned_absolute" in text
    else:
        assert "--disable-bias-linear" in text and "--position-embedding-type rope" in text


def test_megatron_defaults_are_gpt3s_and_attention_dropout_is_a_note():
    """core_v0.15.0's defaults (no flag): learned positions, biases, dropout 0.1."""
    from workloads.jobs import read_megatron
    flags = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 "
             "--padded-vocab-size 51200 --seq-length 2048 --micro-batch-size 1 "
             "--global-batch-size 8 --bf16 --normalization RMSNorm")
    got = read_megatron(flags)
    model = plan_from_dict(got.plan).model
    assert (model.position_embedding, model.linear_bias, model.hidden_dropout) == (
        LEARNED, True, True)
    assert any(n.startswith("not priced: --attention-dropout") for n in got.notes)
    off = read_megatron(flags + " --hidden-dropout 0.0 --attention-dropout 0 "
                        "--disable-bias-linear --position-embedding-type rope")
    model = plan_from_dict(off.plan).model
    assert (model.position_embedding, model.linear_bias, model.hidden_dropout) == (
        "rope", False, False)
    assert not any("attention-dropout" in n for n in off.notes)
