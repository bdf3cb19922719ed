"""Autograd's accumulation of weight gradients over micro-batches (workloads/main_grad.py
autograd_accumulates): torch adds each later micro-batch's gradient into `param.grad` in
place, which the simulator prices for torch DDP and ZeRO-1 plans (generic, torchtitan) as
for Megatron-LM 2020-2021, and not where the gradients are reduced as they come (FSDP,
ZeRO-2) or written by the GEMMs into Megatron-Core's main_grad buffer."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.params import unit_param_groups

from conftest import small_plan

MODEL = {"hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 8, "intermediate_size": 1408, "vocab_size": 4096}


def _backward_ops(linear: torch.nn.Linear, x: torch.Tensor) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        linear(x).sum().backward()
    return [e.name for e in prof.events()]


def test_torch_adds_the_second_backwards_weight_gradient_into_param_grad_in_place():
    """AccumulateGrad: the first backward stores the gradient, a later one runs add_ into
    the same storage (one read of each, one write: 3 passes over the gradient)."""
    linear = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    first = _backward_ops(linear, x)
    storage, value = linear.weight.grad.data_ptr(), linear.weight.grad.clone()
    second = _backward_ops(linear, x)
    assert "aten::add_" not in first and "aten::add_" in second
    assert linear.weight.grad.data_ptr() == storage
    assert torch.allclose(linear.weight.grad.float(), 2 * value.float(), rtol=1e-2)


def _adds(**plan):
    raw = small_plan(model=MODEL, training={"global_batch": 8, "micro_batch": 1,
                                            "seq_len": 256}, **plan)
    resolved = resolve(plan_from_dict(raw), plan["mesh"]["dp"])
    return resolved, [t for t in lower(resolved, gpu="h100").stages[0] if t.op == "grad_add"]


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_a_torch_ddp_or_zero1_plan_adds_every_micro_batch_after_the_first(zero_stage):
    plan, adds = _adds(mesh={"dp": 2}, overlap={"grad_reduce": True}, zero_stage=zero_stage)
    assert plan.micro_batches == 4 and sorted({t.microbatch for t in adds}) == [1, 2, 3]
    layer = next(t for t in adds if t.layer == 0 and t.microbatch == 1)
    assert layer.bytes == pytest.approx(3 * 2 * sum(unit_param_groups(plan, 0).values()))


@pytest.mark.parametrize("plan", [
    {"mesh": {"dp": 2}, "fsdp": {"enabled": True}},                # FSDP2 reduces its own
    {"mesh": {"dp": 2}, "zero_stage": 2},                          # reduced as they come
    {"mesh": {"dp": 2}, "framework": "megatron-core"},             # the GEMMs' main_grad
])
def test_no_add_where_the_gradients_do_not_wait_in_param_grad(plan):
    assert _adds(**plan)[1] == []
