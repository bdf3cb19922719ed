"""Megatron-LM 2020-2021's gradients between the backward and the optimizer: its local
DDP's flat copy (workloads/local_ddp.py) and autograd's accumulation into `param.grad`
over micro-batches (workloads/main_grad.py autograd_accumulates)."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.params import param_tensor_count, unit_param_groups
from workloads.schedules import EMBED, HEAD

from conftest import SMALL_GPT as GPT, small_plan


def test_megatron_lms_local_ddp_copies_the_flat_gradients_whatever_the_dp_size():
    """megatron/model/distributed.py (allreduce_params @c63906a): flatten, divide by the DP
    size, all-reduce, copy back each tensor: 6 passes over the fp16 gradients before the
    optimizer, on one rank too; torch DDP (overlap.grad_reduce) has none of it."""
    plan = resolve(plan_from_dict(small_plan(
        framework="megatron-lm", model=GPT, mesh={"dp": 1},
        training={"global_batch": 4, "micro_batch": 4, "seq_len": 1024})), 1)
    tasks = {t.label: t for t in lower(plan, gpu="a100").stages[0]}
    copies, step = tasks["grad.local_ddp_copies"], tasks["optimizer.step"]
    units = [EMBED, 0, 1, 2, 3, HEAD]
    tensors = param_tensor_count(plan, units)
    params = sum(sum(unit_param_groups(plan, u).values()) for u in units)
    assert copies.bytes == pytest.approx(6 * 2 * params) and copies.kernels == 2 + tensors
    assert step.deps == (copies.id,)
    torch_ddp = resolve(plan_from_dict(small_plan(
        framework="megatron-lm", model=GPT, mesh={"dp": 1},
        training={"global_batch": 4, "micro_batch": 4, "seq_len": 1024},
        overlap={"grad_reduce": True})), 1)
    assert "grad.local_ddp_copies" not in {t.label for t in lower(torch_ddp).stages[0]}


def test_autograd_adds_each_later_micro_batchs_weight_gradients_into_param_grad():
    """AccumulateGrad: the first micro-batch's gradient is stored, every later one added in
    place (read 2 + 2 B, write 2 B of fp16 per parameter); Megatron-Core's buffer is
    written by the GEMMs themselves (gradient-accumulation fusion): no add."""
    raw = small_plan(framework="megatron-lm", model=GPT, mesh={"dp": 1},
                     training={"global_batch": 4, "micro_batch": 1, "seq_len": 1024})
    plan = resolve(plan_from_dict(raw), 1)
    adds = [t for t in lower(plan, gpu="a100").stages[0] if t.op == "grad_add"]
    assert sorted({t.microbatch for t in adds}) == [1, 2, 3]
    layer = next(t for t in adds if t.layer == 0 and t.microbatch == 1)
    assert layer.bytes == 6 * sum(unit_param_groups(plan, 0).values())
    assert len(adds) == 3 * 6                 # embedding, 4 layers, output layer
    core = resolve(plan_from_dict({**raw, "framework": "megatron-core"}), 1)
    assert not [t for t in lower(core, gpu="a100").stages[0] if t.op == "grad_add"]
