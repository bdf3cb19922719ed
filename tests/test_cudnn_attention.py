"""Blackwell attention at cuDNN's measured rate and length curve; Hopper keeps
FlashAttention-2's.

Golden figures: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training, causal, head dim
128, 128 query / 8 KV heads, BF16 (B200: artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200
.csv at bb37575d, pyt_cudnn, cuDNN 9.13.1; GB200 and GB300: ..._{GB200,GB300}.csv at
d48a60eb, cudnn_fe, cuDNN 9.17.0)."""
from dataclasses import replace

import pytest

from simulator.compute import device_time_s
from topologies.attention_kernels import CUDNN_ATTENTION_16K_FLOPS
from topologies.power_capped import POWER_CAPPED
from topologies.specs import DEVICES
from workloads.attention import AttentionCost, kernel_speed
from workloads.cudnn_attention import CUDNN_CAUSAL_TFLOPS, CUDNN_LENGTHS
from workloads.program import ATTENTION, COMPUTE, Task

TB = 1e12


def _pair_rate(forward, backward):
    """FLOP/s of one forward and one backward (2.5 forwards) together."""
    return 3.5 / (1 / forward + 2.5 / backward)


@pytest.mark.parametrize("gpu,forward,backward,peak", [
    ("b200", 1332.415, 1074.776, 2250), ("gb200", 1668.0, 1304.0, 2500),
    ("gb300", 1978.0, 1399.0, 2500)])
def test_blackwell_profiles_stand_for_cudnn_at_16k(gpu, forward, backward, peak):
    """Each Blackwell profile's efficiency is its GPU's measured cuDNN pair rate at 16k
    tokens over the BF16 peak (b200 0.506, gb200 0.556, gb300 0.611)."""
    assert DEVICES[gpu].profile.attention_efficiency == pytest.approx(
        _pair_rate(forward, backward) / peak, abs=5e-4)


def test_hopper_and_ampere_keep_flashattention2():
    """FlashAttention-2's 0.35 of the H100 peak (FlashAttention-3 paper, Figure 5); a
    Hopper call's speed follows FlashAttention-2's curve whatever the GPU name says."""
    assert DEVICES["h100"].profile.attention_efficiency == 0.35
    for gpu in ("h100", "h200", "a100", ""):
        assert kernel_speed("forward", 4096, True, gpu) == pytest.approx(319 / 335)


def test_one_measurement_in_both_packages():
    """The 16k pair the profile level rests on is the curve's own 16k point."""
    at = CUDNN_LENGTHS.index(16384)
    for gpu, (forward, backward) in CUDNN_ATTENTION_16K_FLOPS.items():
        curve_fwd, curve_bwd = CUDNN_CAUSAL_TFLOPS[gpu]
        assert (forward / TB, backward / TB) == (curve_fwd[at], curve_bwd[at])


def test_b200_speed_follows_cudnn_curve():
    """A 4096-key causal call runs at 855.678 / 1332.415 of the 16k forward rate and
    701.265 / 1074.776 of the backward's (FlashAttention-2's curve would say 0.95 / 0.88);
    beyond the measured lengths the nearest point holds."""
    assert kernel_speed("forward", 4096, True, "b200") == pytest.approx(855.678 / 1332.415)
    assert kernel_speed("backward", 4096, True, "b200") == pytest.approx(701.265 / 1074.776)
    # GB200's own (cuDNN 9.17) curve, flatter than B200's; a recompute is a forward
    assert kernel_speed("recompute", 4096, True, "gb200") == pytest.approx(1386 / 1668)
    # GB300's cuDNN-frontend series at 9.17 (d48a60eb), as GB200's is measured
    assert kernel_speed("backward", 8192, True, "gb300") == pytest.approx(1292 / 1399)
    # non-causal: the causal curve times FlashAttention-2's non-causal over causal ratio
    assert kernel_speed("forward", 2048, False, "b200") == pytest.approx(
        478.921 / 1332.415 * 362 / 298)


def test_other_blackwell_gpus_take_the_b200_curve_and_clamp(monkeypatch):
    """A GPU of compute capability 10 without its own series takes the B200's; lengths
    outside 512-131072 keep the nearest measured point; Hopper names never take it."""
    from workloads import attention_impls, cudnn_attention
    monkeypatch.setitem(attention_impls.COMPUTE_CAPABILITY, "b100", (10, 0))
    assert cudnn_attention.curve_gpu("B100") == "b200"
    assert cudnn_attention.curve_gpu("h200") == "" == cudnn_attention.curve_gpu("")
    assert kernel_speed("forward", 4096, True, "b100") == pytest.approx(855.678 / 1332.415)
    assert kernel_speed("forward", 128, True, "b200") == pytest.approx(83.991 / 1332.415)
    assert kernel_speed("backward", 1 << 20, True, "b200") == pytest.approx(
        1047.843 / 1074.776)
    # log-linear between points: the geometric mean length takes the mean value
    assert kernel_speed("forward", 4096 * 2 ** 0.5, True, "b200") == pytest.approx(
        (855.678 + 1171.278) / 2 / 1332.415)


@pytest.mark.parametrize("gpu,length,forward,backward", [
    ("b200", 8192, 1171.278, 942.509), ("b200", 4096, 855.678, 701.265),
    ("gb200", 4096, 1386.0, 1054.0)])
def test_a_forward_and_backward_take_the_measured_time(gpu, length, forward, backward):
    """The simulator prices one forward and one backward call of the benchmark's shape at
    the measured pair time (within 1 %), at the profile's sustained fraction of it."""
    spec = DEVICES[gpu]
    cost = AttentionCost(queries=length, keys=length, heads=128, kv_heads=8, head_dim=128,
                         act_bytes=2, flash=True, gpu=gpu)
    task = Task(id=0, kind=COMPUTE, stream="compute", op="attention", phase="forward",
                layer=0, microbatch=0, op_class=ATTENTION)
    launch = spec.profile.launch_overhead_s
    priced = sum(device_time_s(replace(task, phase=phase, flops=cost.flops(phase),
                                       efficiency=cost.speed(phase)), spec, "bf16") - launch
                 for phase in ("forward", "backward"))
    fwd_flops = cost.flops("forward")
    measured = fwd_flops / (forward * TB) + cost.flops("backward") / (backward * TB)
    assert cost.flops("backward") == pytest.approx(2.5 * fwd_flops)
    assert priced * spec.profile.sustained_tensor_ratio == pytest.approx(measured, rel=0.01)


def test_the_750w_b200_keeps_the_gemm_clock_ratio_of_cudnn():
    """The power-capped B200 scales the measured cuDNN level by its GEMM clock ratio."""
    capped, rated = POWER_CAPPED["b200-750w"], DEVICES["b200"]
    assert capped.profile.attention_efficiency < rated.profile.attention_efficiency
    assert capped.profile.attention_efficiency == pytest.approx(0.332, abs=1e-3)


def test_b300_takes_its_dies_gb300_measurements_before_b200s():
    """B300 is GB300's Blackwell Ultra die (compute capability 10.3): its attention takes
    GB300's measured cuDNN curve and FP8 attention, not the B200 stand-in of compute
    capability 10; where only B200 and GB200 are measured (head dim 64), the
    architecture's stand-in still applies."""
    from workloads import cudnn_attention, fp8_attention
    from workloads.head_dim_attention import HEAD_DIM_128_MS, BY_ARCH
    from workloads.attention_impls import stand_in_gpu
    assert cudnn_attention.curve_gpu("b300") == "gb300"
    assert kernel_speed("backward", 8192, True, "b300") == pytest.approx(1292 / 1399)
    assert fp8_attention.measured_gpu("b300") == "gb300"
    assert stand_in_gpu("b300", HEAD_DIM_128_MS, BY_ARCH) == "b200"
