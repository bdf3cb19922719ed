"""Megatron-Core's recompute of the whole MoE layer (recompute_modules "moe":
moe/moe_layer.py moe_layer_recompute, workloads/module_recompute.py): the router, the
dispatch collectives, the experts and the combine run again before the backward; the
attention does not; Megatron-Core refuses it with the EP all-to-all overlap."""
from __future__ import annotations

import pytest

from simulator import SimOptions, simulate
from topologies import build
from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.lowering import lower

from conftest import small_plan
from moe_small import MOE

EP_MOE = {"dispatcher": "alltoall"}


def _raw(modules, moe=EP_MOE):
    return small_plan(model=MOE, mesh={"ep": 8}, moe=moe, recompute="none",
                      recompute_modules=modules)


def _rerun(modules):
    plan = resolve(plan_from_dict(_raw(modules)), 8)
    tasks = [t for t in lower(plan).stages[0] if t.layer == 1 and t.microbatch == 0]
    forward = {t.label for t in tasks if t.phase == "forward"}
    return forward, {t.label for t in tasks if t.phase == "recompute"}


def test_the_moe_block_reruns_with_its_collectives():
    forward, rerun = _rerun(["moe"])
    assert {"moe.dispatch", "moe.combine"} <= rerun          # the all-to-alls again
    assert {"w1.fwd", "w2.fwd", "permute.fwd", "unpermute.fwd"} <= rerun
    assert any(label.startswith("router") for label in rerun)
    assert rerun < forward
    # nothing of the attention block, nor the norm (that is "layernorm") or the final add
    assert not {label for label in rerun
                if label.split(".")[0] in ("attention", "wq", "wk", "wv", "wo",
                                           "ffn_norm", "attention_norm", "residual_add")}


def test_layernorm_and_moe_together_add_the_norm_only():
    _, moe = _rerun(["moe"])
    _, both = _rerun(["layernorm", "moe"])
    assert both - moe == {"ffn_norm.fwd"}
    _, act = _rerun(["moe_act"])
    assert act < moe                        # the activation alone is part of the block


def test_recomputing_the_block_costs_step_time():
    def step(modules):
        plan = plan_from_dict(_raw(modules))
        return simulate(plan, build("dgx-h100"), SimOptions()).summary["step_time_s"]
    assert step(["moe"]) > step(["moe_act"]) > step([])


def test_the_ep_overlap_refuses_it():
    raw = _raw(["moe"], moe={**EP_MOE, "overlap_a2a": True})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert "moe.overlap_a2a" in str(err.value) and "recompute_modules moe" in str(err.value)
