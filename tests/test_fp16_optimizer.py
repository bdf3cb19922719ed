"""Megatron-LM's September 2020 FP16_Optimizer (workloads/fp16_optimizer.py): its overflow
check and gradient-norm loops wait for the device after every parameter tensor, and the
parameter tensors it loops over (workloads/params.py param_tensor_count)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from simulator import simulate
from topologies.presets import cluster_spec
from workloads import plan_from_dict, resolve
from workloads.fp16_optimizer import fp16_optimizer_checks
from workloads.frameworks import EAGER_HOST_KERNEL_S
from workloads.layer_builder import TaskSink
from workloads.lowering import lower
from workloads.params import param_tensor_count, unit_param_groups
from workloads.schedules import EMBED, HEAD

from conftest import SMALL_GPT, small_plan

GPT = SMALL_GPT


def _plan(optimizer: str, tp: int = 1, **over):
    raw = small_plan(framework="megatron-lm", optimizer=optimizer, model=GPT,
                     mesh={"dp": 1, "tp": tp}, training={"global_batch": 4, "micro_batch": 4,
                                                         "seq_len": 1024}, **over)
    return resolve(plan_from_dict(raw), tp)


def test_a_megatron_gpt_layer_steps_twelve_tensors():
    # megatron/model/transformer.py @c63906a ParallelTransformerLayer: input_layernorm and
    # post_attention_layernorm (weight, bias), query_key_value and dense, dense_h_to_4h and
    # dense_4h_to_h (weight, bias each); the embedding's word and position tables; the
    # final LayerNorm, the output layer tied to the word embedding.
    plan = _plan("fp16_optimizer")
    assert param_tensor_count(plan, [0]) == 12
    assert param_tensor_count(plan, [EMBED, 0, 1, HEAD]) == 2 + 2 * 12 + 2
    # a stage without the embedding holds its own output layer
    assert param_tensor_count(plan, [1, HEAD]) == 12 + 3
    # the generic framework keeps separate q, k, v
    generic = resolve(plan_from_dict(small_plan(model=GPT, mesh={"dp": 1})), 1)
    assert param_tensor_count(generic, [0]) == 16


def test_the_loops_price_each_tensor_and_wait_for_the_device():
    sink = TaskSink()
    last = fp16_optimizer_checks(sink, _plan("fp16_optimizer", tp=2), 1e9, 300, (7,))
    timer_sync, check, check_reduce, norm, norm_reduce = sink.tasks
    # train_step's timer synchronises the host before the loop: a join, no kernel
    assert timer_sync.deps == (7,) and (timer_sync.kernels, timer_sync.bytes) == (0, 0.0)
    assert (check.bytes, check.kernels) == (10e9, 900)     # cast 2+4, sum 4 B; 3 launches
    assert (norm.bytes, norm.kernels) == (4e9, 600)        # norm 4 B; 2 launches
    assert check.deps == (timer_sync.id,) and norm.deps == (check_reduce.id,)
    assert last == norm_reduce.id
    assert all(t.host_sync for t in sink.tasks)
    assert check_reduce.group == norm_reduce.group == ("tp",)
    # without tensor parallelism there is no model-parallel all-reduce
    sink = TaskSink()
    fp16_optimizer_checks(sink, _plan("fp16_optimizer"), 1e9, 300, ())
    assert [t.op for t in sink.tasks] == ["join", "overflow_check", "norm"]


def test_the_step_moves_42_bytes_then_copies_back_each_tensor():
    plan = _plan("fp16_optimizer")
    units = [EMBED, 0, 1, 2, 3, HEAD]
    params = sum(sum(unit_param_groups(plan, u).values()) for u in units)
    tensors = param_tensor_count(plan, units)
    by_label = {t.label: t for t in lower(plan, gpu="a100").stages[0]}
    step, norm = by_label["optimizer.step"], by_label["grad.norm"]
    copy_back = by_label["optimizer.copy_back"]
    assert step.deps == (norm.id,)
    # grads to fp32 masters 2 + 4, unscale 4 + 4, FusedAdam 16 + 12 B; one launch
    assert (step.bytes, step.kernels) == (pytest.approx(42 * params), 1)
    # master to model, read 4 B, write 2 B, a launch per tensor
    assert copy_back.deps == (step.id,)
    assert (copy_back.bytes, copy_back.kernels) == (pytest.approx(6 * params), tensors)
    assert by_label["grad.overflow_check"].kernels == 3 * tensors


def test_the_host_waits_make_the_loops_cost_their_host_time():
    """Each loop's launches cost the host 10 us each (workloads/frameworks.py
    EAGER_HOST_KERNEL_S) after the host has waited for the device: the overflow check
    starts that long after the gradients are ready, the norm loop after the check."""
    plan = _plan("fp16_optimizer")
    topo = replace(cluster_spec("dgx-a100"), domain_size=1).build()   # one A100
    trace = simulate(plan, topo).trace.to_pylist()
    at = {r["label"]: r for r in trace if r["rank"] == 0 and r["phase"] == "optimizer"}
    tensors = param_tensor_count(plan, [EMBED, 0, 1, 2, 3, HEAD])
    ready = at["grad.local_ddp_copies"]["end_s"]
    check, norm = at["grad.overflow_check"], at["grad.norm"]
    assert check["start_s"] - ready >= 3 * tensors * EAGER_HOST_KERNEL_S * (1 - 1e-9)
    assert norm["start_s"] - check["end_s"] >= 2 * tensors * EAGER_HOST_KERNEL_S * (1 - 1e-9)
