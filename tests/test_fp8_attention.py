"""Quantized attention (training.fp8_attention, workloads/fp8_attention.py): cuDNN's
measured FP8 / MXFP8 over BF16 times by GPU, phase, mask and head shape.

Golden figures: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results at
fb682ce (cuDNN 9.22.0), batch 2, 4096 tokens, time_ms: llama3.1/gb200 causal head 128
(BF16 0.391 / 1.198 forward / backward, MXFP8 0.326 / 1.305), gpt_oss/gb200 window 128
(BF16 0.210 / 0.465, MXFP8 0.210 / 2.080), dsv3/gb300 MLA (BF16 0.864 / 3.127, MXFP8
0.546 / 2.348)."""
from __future__ import annotations

import pytest

from conftest import small_plan
from simulator.api import simulate
from topologies import TopologyError, build
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.attention import AttentionCost
from workloads.fp8_attention import fp8_attention_speedup
from workloads.jobs.megatron_export import _precision_flags
from workloads.lowering import lower


@pytest.mark.parametrize("gpu, shape, phase, speedup", [
    ("gb200", "causal", "forward", 0.391 / 0.326),
    ("gb200", "causal", "backward", 1.198 / 1.305),
    ("gb200", "window", "backward", 0.465 / 2.080),    # FP8's window backward: no skipping
    ("gb200", "window", "recompute", 0.210 / 0.210),
    ("gb300", "latent", "backward", 3.127 / 2.348),
    ("b200", "window", "backward", 0.465 / 2.080),     # B200 takes GB200's ratios
])
def test_measured_ratios_at_4096(gpu, shape, phase, speedup):
    assert fp8_attention_speedup(gpu, "mxfp8", phase, 4096, shape) == pytest.approx(speedup)


def test_per_tensor_fp8_and_lengths():
    """fp8 / fp8_cs take the per-tensor FP8 rows; between lengths the ratio is log-linear,
    outside them the nearest holds; the window backward falls with the square of the
    length (29 x slower than BF16 at 32k on GB200)."""
    assert fp8_attention_speedup("gb200", "fp8_cs", "backward", 4096, "window") == \
        pytest.approx(0.465 / 1.731)
    mid = fp8_attention_speedup("gb200", "mxfp8", "backward", 4096 * 2 ** 0.5, "window")
    assert mid == pytest.approx((0.465 / 2.080 + 0.911 / 7.427) / 2)
    assert fp8_attention_speedup("gb200", "mxfp8", "backward", 131072, "window") == \
        pytest.approx(3.692 / 108.370)


def test_attention_cost_applies_the_ratio_by_shape():
    """A windowed layer's backward on GB200 slows by the window ratio, a causal layer's
    forward speeds up by the causal one, MLA (unequal q/k and v heads) takes its own."""
    base = dict(queries=4096, keys=4096, heads=64, kv_heads=8, head_dim=64, act_bytes=2,
                gpu="gb200")
    for extra, phase, shape in [({"window": 128}, "backward", "window"),
                                ({}, "forward", "causal"),
                                ({"head_dim": 192, "v_head_dim": 128}, "backward", "latent")]:
        bf16 = AttentionCost(**{**base, **extra})
        mx = AttentionCost(**{**base, **extra}, quantized="mxfp8")
        assert mx.speed(phase) == pytest.approx(
            bf16.speed(phase) * fp8_attention_speedup("gb200", "mxfp8", phase, 4096, shape))


def _raw(**training):
    return small_plan(framework="megatron-core",
                      training={"dtype": "mxfp8", "fp8_attention": True, **training})


@pytest.mark.parametrize("dtype", ["bf16", "nvfp4"])
def test_plan_refuses_attention_quantization_without_an_8_bit_recipe(dtype):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(_raw(dtype=dtype))
    assert err.value.field == "training.fp8_attention"


def test_unmeasured_gpu_is_refused_not_priced_as_bf16():
    plan = resolve(plan_from_dict(_raw(dtype="fp8_cs")), 8)
    with pytest.raises(TopologyError) as err:
        simulate(plan, build("dgx-h100"))
    assert err.value.field == "training.fp8_attention" and "h100" in str(err.value)


def test_lowered_attention_and_export():
    """A plan's attention tasks on B200 carry the ratio (the small plan's 2048 tokens:
    GB200's causal figures there), and Megatron's flag is exported."""
    on = resolve(plan_from_dict(_raw()), 8)
    off = resolve(plan_from_dict(_raw(fp8_attention=False)), 8)
    for phase in ("forward", "backward"):
        quantized = [t.efficiency for t in lower(on, "b200").stages[0]
                     if t.op == "attention" and t.phase == phase]
        plain = [t.efficiency for t in lower(off, "b200").stages[0]
                 if t.op == "attention" and t.phase == phase]
        ratio = fp8_attention_speedup("b200", "mxfp8", phase, 2048, "causal")
        assert plain and quantized == pytest.approx([p * ratio for p in plain])
    assert "--fp8-dot-product-attention" in _precision_flags(on.training, 4)
    assert "--fp8-dot-product-attention" not in _precision_flags(off.training, 4)


@pytest.mark.parametrize("over, needs", [
    ({"framework": "torchtitan"}, "framework"),
    ({"attention": "eager"}, "attention"),
    ({"model": {**small_plan()["model"], "sliding_window": 4096}}, "window"),
])
def test_refused_where_unmeasured(over, needs):
    """Other frameworks, a materialised attention and a window other than the measured
    128 keys are refused (the key would be ignored or priced at another shape's ratio)."""
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict({**_raw(), **over}), 8)
    assert err.value.field == "training.fp8_attention" and needs in str(err.value)


def test_context_parallel_calls_take_their_length_and_bf16_layers_stay_bf16():
    """A call of `length` keys (a ring step) takes the ratio at that length; an unmeasured
    GPU keeps BF16's speed in a lowering (simulate refuses it); a layer the recipe keeps in
    BF16 runs BF16 attention."""
    cost = AttentionCost(queries=4096, keys=16384, heads=8, kv_heads=8, head_dim=128,
                         act_bytes=2, gpu="gb200", quantized="mxfp8")
    plain = AttentionCost(queries=4096, keys=16384, heads=8, kv_heads=8, head_dim=128,
                          act_bytes=2, gpu="gb200")
    assert cost.speed("backward", 4096) == pytest.approx(
        plain.speed("backward", 4096) * 1.198 / 1.305)
    assert fp8_attention_speedup("h100", "mxfp8", "backward", 4096, "causal") == 1.0
    mx = resolve(plan_from_dict(_raw(bf16_layers=[1, 0])), 8)
    eff = {t.layer: t.efficiency for t in lower(mx, "b200").stages[0]
           if t.op == "attention" and t.phase == "forward" and t.microbatch == 0}
    assert eff[0] == pytest.approx(eff[1] / fp8_attention_speedup("b200", "mxfp8", "forward",
                                                                   2048, "causal"))


def test_unmeasured_blackwell_takes_gb200s_by_compute_capability(monkeypatch):
    """As the other measured-kernel tables choose (windowed_attention, cudnn_attention): a
    GPU of compute capability 10.x without its own figures takes GB200's; Hopper none."""
    from workloads import attention_impls
    from workloads.fp8_attention import measured_gpu
    monkeypatch.setitem(attention_impls.COMPUTE_CAPABILITY, "b100", (10, 0))
    assert measured_gpu("B100") == "gb200" == measured_gpu("b200")
    assert measured_gpu("gb300") == "gb300"
    assert measured_gpu("h100") == "" == measured_gpu("")
