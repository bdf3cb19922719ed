"""torch DDP's Reducer copies (workloads/torch_ddp.py), measured with torch on a gloo
process group and priced by the lowering: a copy-in with the division per gradient
tensor, a copy-back per tensor unless the gradients are bucket views, and the buckets'
second copy of the gradients in memory."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workloads import WorkloadError, plan_from_dict, resolve
from workloads.grad_state import bucket_grad_bytes, grad_state_bytes
from workloads.lowering import lower
from workloads.memory import memory_breakdown
from workloads.params import param_tensor_count, unit_param_groups
from workloads.precision import precision
from workloads.schedules import EMBED, HEAD

from conftest import small_plan

PROBE = r"""
import json, sys, torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
out = {}
for view in (False, True):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=view)
    x = torch.randn(4, 64)
    ddp(x).sum().backward()                    # the first step rebuilds the buckets
    model.zero_grad(set_to_none=False)         # views stay views (set_to_none breaks them)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ddp(x).sum().backward()
    names = [e.name for e in prof.events()]
    out[str(view)] = {key: sum(key in n for n in names)
                      for key in ("reducer::mul_out", "copy_bucket_to_grad", "aten::div_")}
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_torchs_reducer_copies_each_gradient_in_and_back_unless_they_are_views(tmp_path):
    """Two weights and two biases: four copy-ins with the division and four copy-backs by
    default; as bucket views neither copy, the division runs in place (div_) instead."""
    run = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=120, check=True)
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["False"] == {"reducer::mul_out": 4, "copy_bucket_to_grad": 4, "aten::div_": 0}
    assert counts["True"] == {"reducer::mul_out": 0, "copy_bucket_to_grad": 0, "aten::div_": 4}


MODEL = {"hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 8, "intermediate_size": 1408, "vocab_size": 4096}


def _plan(**over):
    raw = small_plan(model=MODEL, mesh={"dp": 2}, overlap={"grad_reduce": True},
                     training={"global_batch": 4, "micro_batch": 1, "seq_len": 256}, **over)
    return resolve(plan_from_dict(raw), 2)


def _tasks(plan, op):
    return [t for t in lower(plan, gpu="h100").stages[0] if t.op == op]


def test_a_ddp_plan_copies_in_on_the_reducing_micro_batch_and_back_before_the_step():
    plan = _plan()
    units = [EMBED, 0, 1, HEAD]
    # read the bf16 gradient, write the bucket in the dtype the all-reduce moves (fp32)
    copy = bucket_grad_bytes(plan, precision("bf16")) + grad_state_bytes(plan)
    assert copy == 2 + 4
    ins, (back,) = _tasks(plan, "ddp_copy_in"), _tasks(plan, "ddp_copy_back")
    assert {t.microbatch for t in ins} == {plan.micro_batches - 1} and len(ins) == 4
    layer = next(t for t in ins if t.layer == 0)
    assert layer.bytes == pytest.approx(copy * sum(unit_param_groups(plan, 0).values()))
    assert layer.kernels == param_tensor_count(plan, [0])
    total = sum(sum(unit_param_groups(plan, u).values()) for u in units)
    assert back.bytes == pytest.approx(copy * total)
    assert back.kernels == param_tensor_count(plan, units)
    step = _tasks(plan, "adam")[0]
    assert back.id in step.deps


def test_bucket_views_skip_the_copy_back_and_the_buckets_second_copy():
    copies, views = _plan(), _plan(ddp={"gradient_as_bucket_view": True})
    assert _tasks(views, "ddp_copy_in") and not _tasks(views, "ddp_copy_back")
    grads = sum(sum(unit_param_groups(copies, u).values()) for u in [EMBED, 0, 1, HEAD])
    extra = memory_breakdown(copies).buffers_bytes - memory_breakdown(views).buffers_bytes
    assert extra == pytest.approx(bucket_grad_bytes(copies, precision("bf16")) * grads)


@pytest.mark.parametrize("over", [
    {"framework": "megatron-core"},            # Megatron-Core's own DDP and buffers
    {"fsdp": {"enabled": True}},               # FSDP reduce-scatters its own buffers
    {"zero_stage": 1}, {"zero_stage": 2},       # the distributed optimizer's own buckets
])
def test_the_views_key_is_refused_where_torchs_reducer_does_not_run(over):
    with pytest.raises(WorkloadError, match="ddp.gradient_as_bucket_view"):
        _plan(ddp={"gradient_as_bucket_view": True}, **over)


def test_no_reducer_without_a_data_parallel_group():
    raw = small_plan(model=MODEL, mesh={"dp": 1},
                     training={"global_batch": 2, "micro_batch": 1, "seq_len": 256})
    plan = resolve(plan_from_dict(raw), 1)
    assert not _tasks(plan, "ddp_copy_in") and not _tasks(plan, "ddp_copy_back")
    assert memory_breakdown(plan).buffers_bytes == 0
    with pytest.raises(WorkloadError, match="ddp.gradient_as_bucket_view"):   # no effect
        resolve(plan_from_dict({**raw, "ddp": {"gradient_as_bucket_view": True}}), 1)


def test_megatron_lm_runs_torchs_ddp_only_where_it_overlaps_the_reduce():
    """--DDP-impl torch (overlap.grad_reduce) takes the key; its local DDP refuses it."""
    raw = dict(framework="megatron-lm", model={**MODEL, "mlp": "gelu"},
               training={"global_batch": 4, "micro_batch": 1, "seq_len": 256},
               mesh={"dp": 2}, ddp={"gradient_as_bucket_view": True})
    assert resolve(plan_from_dict(small_plan(overlap={"grad_reduce": True}, **raw)), 2)
    with pytest.raises(WorkloadError, match="ddp.gradient_as_bucket_view"):
        resolve(plan_from_dict(small_plan(overlap={"grad_reduce": False}, **raw)), 2)
