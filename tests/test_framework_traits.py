"""Framework traits (workloads/framework_traits.py): the one place a framework's fixed
behaviours are looked up. The mechanisms ask the traits, not the framework's name, so a
framework whose traits are another's is priced as that one."""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from workloads import framework_traits, plan_from_dict, resolve
from workloads.framework_traits import TRAITS, FrameworkTraits, frameworks_with, traits
from workloads.frameworks import FRAMEWORKS
from workloads.lowering import lower
from workloads.grad_state import bucket_grad_bytes
from workloads.params import param_tensor_count
from workloads.precision import precision
from workloads.schedules import EMBED, HEAD

from conftest import SMALL_GPT as GPT, small_plan


def test_every_framework_a_plan_may_name_has_traits_and_no_more():
    assert tuple(TRAITS) == FRAMEWORKS


def test_generic_is_the_torch_baseline_and_megatron_core_runs_transformer_engine():
    assert traits("generic") == FrameworkTraits(torch_cross_entropy=True, torch_ddp=True)
    # autograd accumulates in param.grad wherever no main_grad buffer does
    assert frameworks_with("autograd_grad_accumulation") == ("generic", "megatron-lm",
                                                             "torchtitan", "nemo-automodel")
    assert frameworks_with("te_modules") == ("megatron-core",)
    assert frameworks_with("torch_cross_entropy") == ("generic", "torchtitan",
                                                      "nemo-automodel")
    # AutoModel's experts are one grouped_gemm kernel, not TE's per-expert GroupedLinear
    assert not traits("nemo-automodel").per_expert_gemm_launches
    assert traits("nemo-automodel").torch_pipelining
    assert traits("megatron-lm").p2p_host_sync == "always"


def test_a_trait_outside_its_choices_is_refused():
    with pytest.raises(ValueError, match="p2p_host_sync"):
        FrameworkTraits(p2p_host_sync="sometimes")
    with pytest.raises(ValueError, match="grad_reduce_dtype"):
        FrameworkTraits(grad_reduce_dtype="fp64")


@pytest.fixture
def generic_as_megatron_lm(monkeypatch):
    """The generic framework given Megatron-LM's traits but its own loss kernels (its
    plan-key defaults, the fused loss among them, unchanged)."""
    monkeypatch.setattr(framework_traits, "TRAITS", MappingProxyType(
        {**TRAITS, "generic": replace(TRAITS["megatron-lm"],
                                      loss_kernels=TRAITS["generic"].loss_kernels)}))


def _generic_plan(**training):
    raw = small_plan(model=GPT, mesh={"dp": 2}, overlap={"grad_reduce": False},
                     training={"global_batch": 8, "micro_batch": 1, "seq_len": 1024,
                               **training})
    return resolve(plan_from_dict(raw), 2)


def test_the_gradient_mechanisms_follow_the_traits_not_the_name(generic_as_megatron_lm):
    """Megatron-LM's traits on a generic plan that does not overlap the reduce bring its
    local DDP (flat copies) in place of torch's DDP (bucket copies)."""
    plan = _generic_plan()
    stage = lower(plan, gpu="a100").stages[0]
    assert "grad.local_ddp_copies" in {t.label for t in stage}
    assert "ddp_copy_in" not in {t.op for t in stage}


def test_without_the_traits_a_generic_plan_has_none_but_autograds_accumulation():
    plan = _generic_plan()
    stage = lower(plan, gpu="a100").stages[0]
    assert "grad.local_ddp_copies" not in {t.label for t in stage}
    assert "grad_add" in {t.op for t in stage}       # torch DDP's no_sync: the same add
    assert "ddp_copy_in" in {t.op for t in stage}    # and its Reducer's copies
    assert bucket_grad_bytes(plan, precision("bf16")) == precision("bf16").grad_reduce_bytes


def test_fused_linear_groups_count_one_qkv_tensor(monkeypatch):
    """q, k and v are one weight (and, with the GPT model's biases, one bias) under
    fused_linear_groups: two weights and two biases fewer in each of the 4 layers."""
    plan = _generic_plan()
    units = [EMBED, 0, 1, 2, 3, HEAD]
    before = param_tensor_count(plan, units)
    monkeypatch.setattr(framework_traits, "TRAITS", MappingProxyType(
        {**TRAITS, "generic": replace(TRAITS["generic"], fused_linear_groups=True)}))
    assert param_tensor_count(plan, units) == before - 4 * (2 + 2)
