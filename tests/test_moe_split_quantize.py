"""Transformer Engine's split_quantize before a grouped expert GEMM: one cast launch per
local expert, except delayed-scaling FP8 with a transposed copy, which one fused
multi-tensor kernel casts (cast.cpp multi_tensor_quantize_impl; GemmRecipe.cast_per_expert)."""
from __future__ import annotations

import pytest

from moe_small import E, moe_plan
from workloads.lowering import lower

EP = 2
LOCAL_EXPERTS = E // EP


def _casts(dtype, gpu=""):
    plan = moe_plan(mesh={"ep": EP}, framework="megatron-core",
                    training={"dtype": dtype}, moe={"dispatcher": "alltoall"})
    tasks = [t for t in lower(plan, gpu).stages[0] if t.layer == 1 and t.microbatch == 0]
    return {t.label: t.kernels for t in tasks if t.op.endswith("_cast")}


@pytest.mark.parametrize("dtype, gpu, per_cast", [
    ("mxfp8", "b200", 1),       # one MXFP8 quantize kernel per split
    ("fp8_cs", "", 3),          # amax, scale, cast per split
    ("fp8", "b200", 1),         # delayed scaling without a transpose on Blackwell
])
def test_grouped_gemm_casts_launch_once_per_local_expert(dtype, gpu, per_cast):
    casts = _casts(dtype, gpu)
    assert casts[f"w1.{dtype}_cast"] == per_cast * LOCAL_EXPERTS
    assert casts[f"w3.{dtype}_cast"] == per_cast   # linear_fc1's other half: cast with w1
    assert casts[f"grad.w2.{dtype}_cast"] == per_cast * LOCAL_EXPERTS


def test_delayed_scaling_with_transpose_casts_all_experts_in_one_kernel():
    # Hopper: every split has a column-wise output, so nvte_multi_cast_transpose runs once
    casts = _casts("fp8")
    assert casts["w1.fp8_cast"] == 1
    assert casts["grad.w2.fp8_cast"] == 1


def test_dense_linears_keep_one_cast_per_linear():
    casts = _casts("mxfp8", "b200")
    for linear in ("wq", "wk", "wv", "wo"):
        assert casts[f"{linear}.mxfp8_cast"] == 1
        assert casts[f"grad.{linear}.mxfp8_cast"] == 1


def test_megatron_router_gemm_is_not_quantized():
    """Megatron-Core multiplies the router's plain weight with te_general_gemm in BF16
    (moe_utils.py RouterGatingLinearFunction): no cast, no swizzle, a BF16 GEMM."""
    plan = moe_plan(mesh={"ep": EP}, framework="megatron-core",
                    training={"dtype": "mxfp8"}, moe={"dispatcher": "alltoall"})
    tasks = [t for t in lower(plan, "b200").stages[0] if t.layer == 1 and t.microbatch == 0]
    router = [t for t in tasks if t.label.startswith(("router.", "grad.router."))]
    assert router and all(t.op == "router" for t in router)
    assert {t.gemm_dtype for t in router} == {"bf16"}
    assert [t for t in tasks if t.op == "wq"][0].gemm_dtype == ""   # the plan's (mxfp8)
    assert not [t for t in tasks if t.op.endswith("_cast") and "router" in t.label]
