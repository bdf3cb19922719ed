"""Megatron-LM's September 2020 FP16_Optimizer (workloads/fp16_optimizer.py): its overflow
check and gradient-norm loops wait for the device after every parameter tensor, and the
parameter tensors it loops over (workloads/params.py param_tensor_count)."""
from __future__ import annotations

from dataclasses import replace

from simulator import simulate
from topologies.presets import cluster_spec
from workloads import plan_from_dict, resolve
from workloads.fp16_optimizer import fp16_optimizer_checks
from workloads.kernels import adam_step_cost
from workloads.layer_builder import TaskSink
from workloads.lowering import lower
from workloads.params import param_tensor_count
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
    check, check_reduce, norm, norm_reduce = sink.tasks
    assert (check.bytes, check.kernels) == (10e9, 900)     # cast 2+4, sum 4 B; 3 launches
    assert (norm.bytes, norm.kernels) == (4e9, 600)        # norm 4 B; 2 launches
    assert check.deps == (7,) and norm.deps == (check_reduce.id,) and last == norm_reduce.id
    assert all(t.host_sync for t in sink.tasks)
    assert check_reduce.group == norm_reduce.group == ("tp",)
    # without tensor parallelism there is no model-parallel all-reduce
    sink = TaskSink()
    fp16_optimizer_checks(sink, _plan("fp16_optimizer"), 1e9, 300, ())
    assert [t.op for t in sink.tasks] == ["overflow_check", "norm"]


def test_the_step_waits_for_the_loops_and_moves_48_bytes():
    plan = _plan("fp16_optimizer")
    tasks = lower(plan, gpu="a100").stages[0]
    by_label = {t.label: t for t in tasks}
    step, norm = by_label["optimizer.step"], by_label["grad.norm"]
    tensors = param_tensor_count(plan, [EMBED, 0, 1, 2, 3, HEAD])
    assert step.deps == (norm.id,)
    assert (step.bytes, step.kernels) == adam_step_cost("fp16_optimizer", step.bytes / 48,
                                                        tensors)
    assert by_label["grad.overflow_check"].kernels == 3 * tensors


def test_the_host_waits_make_the_loops_cost_their_host_time():
    """Each loop's launches cost the host 10 us each (workloads/frameworks.py
    EAGER_HOST_KERNEL_S) after the host has waited for the device: nothing hides them, so
    the 2020 step is longer than the 2021 one by at least that host time."""
    topo = replace(cluster_spec("dgx-a100"), domain_size=1).build()   # one A100
    old, new = (simulate(_plan(o), topo).summary["step_time_s"]
                for o in ("fp16_optimizer", "megatron_float16"))
    tensors = param_tensor_count(_plan("fp16_optimizer"), [EMBED, 0, 1, 2, 3, HEAD])
    assert old - new >= 5 * tensors * 10e-6

