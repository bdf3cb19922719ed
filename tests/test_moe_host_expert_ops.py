"""Host work that grows with the local experts (workloads/moe/host_ops.py): the per-split
quantize launches of Transformer Engine's split_quantize, one gradient hook per expert
weight, and the dispatcher's Python collectives."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 1024}
LAUNCH_S = 10e-6    # megatron-core's per-kernel host time (workloads/frameworks.py)


def _tasks(ep: int, **over):
    raw = small_plan(**{"model": MOE, "framework": "megatron-core", "mesh": {"ep": ep},
                        **over})
    stage = lower(resolve(plan_from_dict(raw), 8), "h100").stages[0]   # SDPA: flash
    return {t.label: t for t in stage if t.layer == 1 and t.microbatch == 0}


def _cast(tasks, label):
    return next(t for name, t in tasks.items() if name.startswith(label)
                and name.endswith("_cast"))


def test_split_quantize_launches_one_quantize_per_local_expert_once_per_module_call():
    for ep, local in ((4, 2), (2, 4)):
        tasks = _tasks(ep, training={"dtype": "mxfp8"})
        fc1 = _cast(tasks, "w1.")
        # one MXFP8 quantize launch per local expert (GemmRecipe.cast_per_expert), each
        # paying the host's per-launch time
        assert fc1.kernels == local
        assert fc1.host_s == pytest.approx(local * LAUNCH_S)
        # w3 is the other half of linear_fc1: its input was quantised with w1's, so its
        # forward cast moves nothing and launches nothing
        assert _cast(tasks, "w3.").bytes == 0.0 and _cast(tasks, "w3.").host_s == 0.0
        grad_fc2 = _cast(tasks, "grad.w2.")
        assert grad_fc2.kernels == local
        assert grad_fc2.host_s == pytest.approx(local * LAUNCH_S)


def test_dense_casts_and_bf16_experts_take_no_per_split_cost():
    tasks = _tasks(4, training={"dtype": "mxfp8"})
    wq = _cast(tasks, "wq.")
    assert wq.host_s == pytest.approx(wq.kernels * LAUNCH_S)
    assert not any(name.endswith("_cast") for name in _tasks(4))   # bf16: no casts


def test_one_gradient_hook_per_expert_weight_on_the_first_wgrad_of_each_module():
    few, many = _tasks(4), _tasks(2)      # 2 and 4 local experts
    # w2.wgrad: its per-expert launches plus one hook per expert weight
    assert few["w2.wgrad"].host_s == pytest.approx(2 * LAUNCH_S + 2 * LAUNCH_S)
    assert many["w2.wgrad"].host_s == pytest.approx(4 * LAUNCH_S + 4 * LAUNCH_S)
    # dense wgrads keep their single launch
    assert few["wo.wgrad"].host_s == pytest.approx(LAUNCH_S)


def test_the_dispatchers_collectives_cost_one_operator_each_way():
    tasks = _tasks(4)
    for label in ("moe.dispatch_counts", "moe.dispatch", "moe.dispatch_probs", "moe.combine",
                  "grad.moe.dispatch", "grad.moe.combine"):
        assert tasks[label].host_s == pytest.approx(LAUNCH_S), label


def test_a_cuda_graphed_or_non_te_step_takes_none_of_it():
    assert not any(t.host_s for t in _tasks(4, cuda_graphs=True).values())
    generic = _tasks(4, framework="torchtitan")
    assert not generic["moe.dispatch"].host_s
