"""FSDP1's unsharded flat gradient is assembled by autograd: in forward the original
parameters are views torch.split cuts from the flat parameter (torch/distributed/fsdp/
_flat_param.py _use_unsharded_views(as_params=False)), so the backward runs the split's
backward, a cat of every view's gradient (split_with_sizes_backward): one read and one
write of the unit's gradient in the parameter dtype, on the compute stream, before the
pre-divide and the reduce-scatter (workloads/fsdp1.py fsdp1_grad_cat)."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.params import unit_param_groups

DP, MICRO = 8, 2


def _tasks(version: int, accumulation: int = 1):
    raw = {"name": "c", "model": "llama3-8b", "mesh": {"dp": DP},
           "fsdp": {"enabled": True, "version": version},
           "training": {"global_batch": DP * MICRO * accumulation, "micro_batch": MICRO,
                        "seq_len": 1024, "dtype": "bf16"}}
    plan = resolve(plan_from_dict(raw), DP)
    return plan, [t for stage in lower(plan, gpu="h100").stages for t in stage]


def test_every_unit_and_micro_batch_cats_its_gradient_before_the_reduce():
    plan, tasks = _tasks(1, accumulation=2)
    cats = [t for t in tasks if t.op == "fsdp1_grad_cat"]
    layers = plan.model.num_layers
    assert len(cats) == 2 * (layers + 2)          # each layer, the embedding, the head; 2 mbs
    by_id = {t.id: t for t in tasks}
    for cat in cats:
        assert cat.stream == "compute" and cat.phase == "backward"
        unit = int(cat.label.rsplit(".", 1)[1]) if cat.label[-1].isdigit() else None
        if unit is not None:
            params = sum(unit_param_groups(plan, unit).values())
            assert cat.bytes == pytest.approx(2 * params * 2)   # bf16 read and write
    predivides = [t for t in tasks if t.op == "fsdp1_predivide"]
    assert predivides and all(by_id[d].op == "fsdp1_grad_cat"
                              for t in predivides for d in t.deps)


def test_fsdp2_has_no_such_cat():
    _, tasks = _tasks(2)
    assert not [t for t in tasks if t.op == "fsdp1_grad_cat"]
