"""ZeRO-1's parameter all-gather under Megatron-Core's fp8_param_gather.

Sources: Megatron-Core's distributed optimizer keeps a Float8Tensor's uint8 data in its
parameter buffer (megatron/core/distributed/distributed_data_parallel.py at core_v0.15.0:
`param_dtype = torch.uint8`), so per-tensor FP8 weights are gathered at 1 byte; MXFP8
weights are gathered through the BF16 view of the gradient buffer and cast while copied
(param_and_grad_buffer.py at core_v0.15.0, `shared_buffer`, finish_param_sync): 2 bytes.
Megatron-Bridge's FP8 mixed-precision recipes turn it on (training/mixed_precision.py,
fp8_param_gather=True at v0.1.0rc4 through v0.6.0); Megatron-LM's --fp8-param-gather is
off by default. The embedding and the output layer stay BF16 (not Transformer Engine
modules)."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

LAYER_PARAMS = 2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096 + 2 * 1024


def _plan(dtype: str, **over):
    raw = small_plan(training={"global_batch": 16, "dtype": dtype}, mesh={"dp": 8},
                     framework="megatron-core", **over)
    return resolve(plan_from_dict(raw), 8)


def _gathers(plan):
    return [t for t in lower(plan).stages[0] if t.op == "all_gather"]


@pytest.mark.parametrize("dtype,expected", [("fp8", True), ("fp8_cs", True),
                                            ("mxfp8", True), ("bf16", False)])
def test_megatron_core_profile_turns_it_on_with_an_fp8_recipe(dtype, expected):
    assert _plan(dtype).fp8_param_gather is expected


def test_per_tensor_fp8_gathers_one_byte_per_layer_parameter():
    ddp = {"bucket_params": "unit"}
    on = _gathers(_plan("fp8", ddp=ddp))
    off = _gathers(_plan("fp8", ddp={**ddp, "fp8_param_gather": False}))
    layer_on = next(t for t in on if t.layer == 2)
    layer_off = next(t for t in off if t.layer == 2)
    assert layer_off.bytes == pytest.approx(2 * LAYER_PARAMS)
    assert layer_on.bytes == pytest.approx(1 * LAYER_PARAMS)
    # the embedding and the output layer (BF16 modules) still gather 2 bytes a parameter
    outer_on = [t.bytes for t in on if t.layer == -1]
    outer_off = [t.bytes for t in off if t.layer == -1]
    assert len(outer_on) == 2 and outer_on == pytest.approx(outer_off)
    assert outer_on[0] == pytest.approx(2 * 8192 * 1024)


def test_mxfp8_gathers_bf16():
    ddp = {"bucket_params": "unit"}
    on = sum(t.bytes for t in _gathers(_plan("mxfp8", ddp=ddp)))
    off = sum(t.bytes for t in _gathers(_plan("mxfp8", ddp={**ddp, "fp8_param_gather": False})))
    assert on == pytest.approx(off)


def test_a_bucket_spanning_the_embedding_prices_each_share():
    plan = _plan("fp8")                # Megatron-Bridge's 128 Mi-parameter buckets
    gathered = sum(t.bytes for t in _gathers(plan))
    bf16 = sum(t.bytes for t in _gathers(_plan("fp8", ddp={"fp8_param_gather": False})))
    layers = 4 * LAYER_PARAMS
    assert len(_gathers(plan)) == 1
    assert gathered == pytest.approx(bf16 - layers, rel=1e-9)   # layers 2 -> 1 byte



@pytest.mark.parametrize("dtype", ["bf16", "fp8_rowwise"])
def test_fp8_param_gather_without_an_fp8_recipe_is_refused(dtype):
    """Megatron-Core keeps FP8 primary weights only under an FP8 recipe: there the key
    would change nothing, so a plan that asks for it is refused naming the field."""
    from workloads.errors import WorkloadError
    with pytest.raises(WorkloadError, match="ddp.fp8_param_gather"):
        _plan(dtype, ddp={"fp8_param_gather": True})


def test_keys_that_would_change_nothing_are_refused():
    """moe.flex_backend names the fused dispatcher's kernels and recompute_modules an MoE
    layer's modules: elsewhere they would be accepted and ignored, so they exit 2."""
    from workloads.errors import WorkloadError
    from workloads.moe_options import MoEOptions
    with pytest.raises(WorkloadError, match="moe.flex_backend"):
        MoEOptions(dispatcher="alltoall", flex_backend="hybridep")
    assert MoEOptions(dispatcher="deepep", flex_backend="hybridep").flex_backend == "hybridep"
    with pytest.raises(WorkloadError, match="recompute_modules"):
        _plan("bf16", recompute_modules=["layernorm"])
