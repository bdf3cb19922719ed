"""The engine prices each distinct compute task once per stage (simulator/compute.py
stage_costs, keyed by cost_key): the key must hold every field the pricing reads, or two
tasks that cost differently would share one duration."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest

import topologies
from simulator.compute import cost_key, device_time_s, persistent_grid, stage_costs
from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.offload_copies import OFFLOAD_OP, RELOAD_OP
from workloads.program import ATTENTION, COMM, COMPUTE, GEMM, HOST_COPY, MEMORY, Task

from conftest import small_plan

# A different value for every Task field (the Task's own values below are all others).
OTHER = {"id": 7, "kind": COMM, "stream": "tp", "op": OFFLOAD_OP, "phase": "backward",
         "layer": 3, "microbatch": 2, "deps": (1, 2), "flops": 3e12, "bytes": 5e8,
         "op_class": MEMORY, "gemm_mnk": (8192, 4096, 512), "gemm_groups": 4,
         "group": ("dp",), "peer": 1, "tag": ("act",), "label": "other", "kernels": 3,
         "launch_streams": 2, "gemm_dtype": "fp8", "efficiency": 0.5, "host_s": 1e-5,
         "host_sync": True, "kernel_Bps": 1e11, "direct_collective": True, "sm_count": 8}

BASE = [Task(id=0, kind=COMPUTE, stream="compute", op="w1", phase="forward", layer=0,
             microbatch=0, flops=2e12, bytes=1e8, op_class=GEMM, gemm_mnk=(4096, 14336, 4096),
             kernels=4),
        Task(id=0, kind=COMPUTE, stream="compute", op="attention", phase="forward", layer=0,
             microbatch=0, flops=1e12, bytes=1e7, op_class=ATTENTION),
        Task(id=0, kind=COMPUTE, stream="compute", op="rmsnorm", phase="forward", layer=0,
             microbatch=0, bytes=1e8, op_class=MEMORY, kernels=2),
        Task(id=0, kind=COMPUTE, stream="compute", op=RELOAD_OP, phase="forward", layer=0,
             microbatch=0, bytes=1e8, op_class=HOST_COPY)]


def _price(task: Task, device) -> tuple[float, int]:
    return device_time_s(task, device, "bf16"), persistent_grid(task, device)


# nvl72: GB200's host link is faster one way, so a host copy's op (offload or reload)
# changes its price there only
@pytest.mark.parametrize("gpu", ["dgx-h100", "dgx-b200", "nvl72"])
@pytest.mark.parametrize("base", BASE, ids=lambda t: t.op_class)
def test_a_field_that_changes_the_price_changes_the_key(gpu, base):
    device = topologies.build(gpu).device(0)
    assert set(OTHER) == {f.name for f in fields(Task)}, "give the new Task field a value"
    for name, value in OTHER.items():
        if name == "kind":
            continue   # communication is not priced here (stage_costs gives it 0)
        changed = replace(base, **{name: value})
        if _price(changed, device) != _price(base, device):
            assert cost_key(changed) != cost_key(base), name


def test_stage_costs_equal_pricing_each_task_alone():
    """A lowered stage with TP, recompute and several micro-batches: the shared prices are
    each task's own, and communication costs nothing here."""
    plan = resolve(plan_from_dict(small_plan(mesh={"dp": 4, "tp": 2},
                                             training={"global_batch": 16},
                                             recompute="full")), 8)
    device = topologies.build("dgx-h100").device(0)
    tasks = lower(plan).stages[0]
    durations, grids = stage_costs(tasks, device, "bf16")
    assert len({cost_key(t) for t in tasks if t.kind == COMPUTE}) < len(tasks) / 2
    for task, duration, grid in zip(tasks, durations, grids):
        expected = _price(task, device) if task.kind == COMPUTE else (0.0, 0)
        assert (duration, grid) == expected, task.label
