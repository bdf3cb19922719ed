"""Transformer Engine's per-tensor FP8 casts on Blackwell (workloads/precision.py
te_recipe): cuBLAS runs FP8 GEMMs in every operand layout from compute capability 10.0
(TE's nvte_is_non_tn_fp8_gemm_supported, transformer_engine/common/transformer_engine.cpp
at v2.9), so TE's Float8Quantizer / Float8CurrentScalingQuantizer write no transposed
copy there (transformer_engine/pytorch/csrc/quantizer.cpp, TE >= 2.4), while Hopper's
casts write the FP8 copy and its transpose."""
from __future__ import annotations

import pytest

import topologies
from simulator import simulate
from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.precision import RECIPES, non_tn_fp8_gemms, te_recipe
from workloads.torchao_recipes import TORCHAO_RECIPES, gemm_recipe

from conftest import small_plan

BF16, FP8, AMAX = 2, 1, 2       # bytes: a bf16 read, an FP8 write, an amax pass's read
TOKENS, HIDDEN = 2048, 1024     # small_plan's micro-batch and hidden size


def test_non_tn_capability_as_transformer_engine_decides():
    # 10.x and 11.x and 13.0 on; not Hopper, Ampere or the 12.x consumer parts
    assert non_tn_fp8_gemms((10, 0)) and non_tn_fp8_gemms((10, 3))
    assert non_tn_fp8_gemms((11, 0)) and non_tn_fp8_gemms((13, 0))
    assert not non_tn_fp8_gemms((9, 0)) and not non_tn_fp8_gemms((8, 0))
    assert not non_tn_fp8_gemms((12, 0)) and not non_tn_fp8_gemms((0, 0))


def test_blackwell_per_tensor_casts_write_no_transpose():
    hopper, blackwell = (9, 0), (10, 0)
    # Hopper: read bf16, write the FP8 copy and its transpose
    assert te_recipe("fp8", hopper).cast_bytes_per_element == BF16 + 2 * FP8
    assert te_recipe("fp8_cs", hopper).cast_bytes_per_element == AMAX + BF16 + 2 * FP8
    # Blackwell: the row-wise copy only; the kernels stay (amax, scale, cast for fp8_cs)
    assert te_recipe("fp8", blackwell).cast_bytes_per_element == BF16 + FP8
    assert te_recipe("fp8_cs", blackwell).cast_bytes_per_element == AMAX + BF16 + FP8
    assert te_recipe("fp8_cs", blackwell).cast_kernels == RECIPES["fp8_cs"].cast_kernels == 3
    # the GEMM operands are the same FP8 elements
    assert te_recipe("fp8", blackwell).operand_bytes == RECIPES["fp8"].operand_bytes
    # block-scaled recipes keep both copies (their blocks run along different dimensions)
    for dtype in ("mxfp8", "nvfp4"):
        assert te_recipe(dtype, blackwell) is RECIPES[dtype]
    assert te_recipe("bf16", blackwell) is None


def test_torchao_casts_do_not_depend_on_the_gpu():
    assert gemm_recipe("fp8", "torchtitan", (10, 0)) is TORCHAO_RECIPES["fp8"]
    assert gemm_recipe("fp8", "megatron-core", (10, 0)) is te_recipe("fp8", (10, 0))
    assert gemm_recipe("fp8", "megatron-core") is RECIPES["fp8"]   # unknown GPU: Hopper's


@pytest.mark.parametrize("dtype", ["fp8", "fp8_cs"])
def test_lowering_on_blackwell_casts_fewer_bytes(dtype):
    raw = small_plan(training={"dtype": dtype, "global_batch": 8}, framework="megatron-core")
    plan = resolve(plan_from_dict(raw), 8)

    def wq_cast(gpu: str):
        tasks = lower(plan, gpu).stages[0]
        return next(t for t in tasks if t.layer == 1 and t.microbatch == 0
                    and t.label == f"wq.{dtype}_cast")

    hopper, blackwell = wq_cast("h100"), wq_cast("b200")
    assert hopper.bytes == TOKENS * HIDDEN * RECIPES[dtype].cast_bytes_per_element
    # one FP8 byte per input element less: the transpose is not written
    assert hopper.bytes - blackwell.bytes == TOKENS * HIDDEN * FP8
    assert blackwell.kernels == hopper.kernels
    assert wq_cast("").bytes == hopper.bytes   # no GPU named: priced as Hopper


def test_simulate_picks_the_topologys_gpu():
    raw = small_plan(training={"dtype": "fp8_cs", "global_batch": 8},
                     framework="megatron-core")
    plan = plan_from_dict(raw)
    casts = {}
    for preset in ("dgx-h100", "dgx-b200"):
        result = simulate(plan, topologies.build(preset))
        casts[preset] = sum(t.bytes for t in result.program.stages[0]
                            if t.op == "fp8_cs_cast")
    assert casts["dgx-b200"] == pytest.approx(casts["dgx-h100"] * (AMAX + BF16 + FP8)
                                              / (AMAX + BF16 + 2 * FP8))
