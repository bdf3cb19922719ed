"""What each training dtype's recipe offers besides its GEMMs (workloads/precision.py
GemmRecipe: quantized_weights, attention_format, fused_grouped_mlp), checked where a plan
asks for it. Sources, per key:
- ddp.fp8_param_gather needs weights Transformer Engine holds in the recipe's format
  (fp8_model_init): delayed and current per-tensor scaling, Float8BlockScaling and MXFP8
  (Megatron-Core's fp8_param_gather; NVFP4 weights are not kept quantized by Megatron-LM,
  and torchao's row-wise recipe is not Transformer Engine's);
- training.fp8_attention (fp8_dot_product_attention): per-tensor FP8 and MXFP8; Megatron
  builds Float8BlockScaling without fp8_dpa (megatron/core/fp8_utils.py at e5ad09802d);
- moe.fused_mlp: Transformer Engine's fused grouped MLP takes block-scaled MXFP8 or NVFP4
  operands only (transformer_engine/pytorch/ops/fused/)."""
from __future__ import annotations

import pytest

from conftest import small_plan
from moe_small import moe_plan
from workloads import WorkloadError, plan_from_dict, resolve

DTYPES = ("bf16", "fp8", "fp8_cs", "fp8_rowwise", "fp8_blockwise", "mxfp8", "nvfp4")
FP8_WEIGHTS = {"fp8", "fp8_cs", "fp8_blockwise", "mxfp8"}
FP8_ATTENTION = {"fp8", "fp8_cs", "mxfp8"}
FUSED_MLP = {"mxfp8", "nvfp4"}


def _accepted(build) -> bool:
    try:
        build()
    except WorkloadError:
        return False
    return True


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_param_gather_only_with_quantized_weights(dtype):
    raw = small_plan(training={"global_batch": 16, "dtype": dtype}, mesh={"dp": 8},
                     framework="megatron-core", ddp={"fp8_param_gather": True})
    assert _accepted(lambda: resolve(plan_from_dict(raw), 8)) is (dtype in FP8_WEIGHTS)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_attention_only_where_the_recipe_quantizes_attention(dtype):
    raw = small_plan(training={"global_batch": 16, "dtype": dtype, "fp8_attention": True},
                     mesh={"dp": 8}, framework="megatron-core")
    assert _accepted(lambda: plan_from_dict(raw)) is (dtype in FP8_ATTENTION)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_grouped_mlp_only_with_block_scaled_operands(dtype):
    def build():
        moe_plan(8, mesh={"ep": 2}, framework="megatron-core",
                 training={"dtype": dtype, "global_batch": 8},
                 moe={"dispatcher": "alltoall", "fused_mlp": True})
    assert _accepted(build) is (dtype in FUSED_MLP)
