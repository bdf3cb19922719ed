"""ZeRO 1/2/3, FSDP reshard_after_forward on/off and DDP: collective counts and bytes per
layer against closed forms (Rajbhandari et al., arXiv:1910.02054; PyTorch FSDP2).

Per layer with P parameters (bf16 gathers: 2P bytes; fp32 gradient reductions: 4P bytes):
  FSDP, reshard after forward: 2 all-gathers (forward, backward) + 1 reduce-scatter per
    micro-batch;
  FSDP without reshard: 1 all-gather + 1 reduce-scatter per micro-batch;
  ZeRO-2: 1 reduce-scatter per micro-batch, 1 parameter all-gather after the optimizer;
  ZeRO-1: 1 reduce-scatter per step, 1 parameter all-gather after the optimizer;
  DDP: 1 all-reduce per step.
"""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import simulated, small_plan

M = 2                                     # micro-batches per rank: 16 / (8 x 1)
LAYER_PARAMS = 2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096 + 2 * 1024


def _counts(**over):
    raw = small_plan(training={"global_batch": 16}, mesh={"dp": 8}, **over)
    prog = lower(resolve(plan_from_dict(raw), 8))
    tasks = [t for t in prog.stages[0] if t.layer == 2 and t.kind == "comm"]
    assert {t.group for t in tasks} == {("dp",)}
    return Counter((t.op, t.phase, t.bytes) for t in tasks)


AG, RS = 2 * LAYER_PARAMS, 4 * LAYER_PARAMS


@pytest.mark.parametrize("name,over,expected", [
    ("fsdp reshard", {"fsdp": {"enabled": True}},
     {("all_gather", "forward", AG): M, ("all_gather", "backward", AG): M,
      ("reduce_scatter", "backward", RS): M}),
    ("fsdp no reshard", {"fsdp": {"enabled": True, "reshard_after_forward": False}},
     {("all_gather", "forward", AG): M, ("reduce_scatter", "backward", RS): M}),
    ("zero-3 is fsdp", {"zero_stage": 3},
     {("all_gather", "forward", AG): M, ("all_gather", "backward", AG): M,
      ("reduce_scatter", "backward", RS): M}),
    ("zero-2", {"zero_stage": 2},
     {("reduce_scatter", "backward", RS): M, ("all_gather", "optimizer", AG): 1}),
    ("zero-1", {"zero_stage": 1},
     {("reduce_scatter", "backward", RS): 1, ("all_gather", "optimizer", AG): 1}),
    ("ddp", {"zero_stage": 0}, {("all_reduce", "backward", RS): 1}),
])
def test_collectives_per_layer(name, over, expected):
    assert _counts(**over) == expected, name


def test_zero1_reduces_after_the_last_micro_batch_and_gathers_after_the_step():
    raw = small_plan(training={"global_batch": 16}, mesh={"dp": 8}, zero_stage=1)
    prog = lower(resolve(plan_from_dict(raw), 8))
    tasks = prog.stages[0]
    reduce = next(t for t in tasks if t.label == "grad.reduce.2")
    assert reduce.microbatch == M - 1
    step = next(t for t in tasks if t.op == "adam")
    gather = next(t for t in tasks if t.label == "zero.gather.2")
    assert step.id in gather.deps and reduce.id in step.deps
    # The optimizer updates 1/8 of the parameters (sharded states).
    total = sum(t.bytes for t in tasks if t.op == "all_gather") / 2
    assert step.bytes == pytest.approx(total / 8 * 30)


@pytest.mark.parametrize("plan,ops", [
    ("zero1.json", {"reduce_scatter", "all_gather"}),
    ("zero2.json", {"reduce_scatter", "all_gather"}),
    ("ddp.json", {"all_reduce"}),
    ("fsdp_noreshard.json", {"reduce_scatter", "all_gather"}),
])
def test_bundled_data_parallel_plans_simulate(plan, ops):
    result = simulated(plan)
    t = result.trace.to_pandas()
    dp = t[t["group"] == "dp"]
    assert set(dp["op"]) == ops and result.summary["fits_in_memory"]
