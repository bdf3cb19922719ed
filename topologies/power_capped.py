"""GPUs run under a power limit below their rated board power, each from a stated source.

A power limit lowers the tensor-core clock under a dense GEMM until the board fits it, so
the sustained rate of every tensor-core kernel drops; the HBM clock is not the one that
gives way (assumption: memory-bound kernels keep the uncapped device's bandwidth, as the
capped H100 profile in topologies/specs.py does).

B200 at 750 W. Meta's benchmark hosts run B200s at 750 W: the benchmark scripts of its
kernel teams set that limit for every B200 (pytorch/helion pull request 347,
benchmarks/run_input_shard.sh, 2025: `B200 -> DESIRED_POWER=750` next to H100's 500 W;
facebookexperimental/triton's denoise.sh: "the card's rated power (B200 -> 750, GB200 ->
1200)"), and the torchao / torchtitan B200 training benchmark says so for its run:
"Single-node training on 8xB200 GPUs limited to 750W" (pytorch/ao commit d8bb51f63, pull
request 2777, torchao/prototype/mx_formats/README.md, 15 August 2025; reworded four minutes
later to "8x power limited B200 GPUs", commit 9e3758d15, which torchtitan's
torchtitan/components/quantization/mxfp8.md copies).

Its GEMM rate: cuBLAS BF16 matmuls (tritonbench `--op gemm`, aten_matmul) on a Meta B200
reach 913.2 and 933.6 TFLOP/s at 8192 x 8192 x 4096 and 8192 x 8192 x 8192
(meta-pytorch/tritonbench pull request 1009, 2026) and 914.6 and 958.6 on the same shapes
(pull request 1011): mean 930.0 TFLOP/s. Assumption: those hosts ran under the 750 W limit
of Meta's B200 convention above (the pull requests do not print the limit). These are
layer-sized shapes, so, as for the 500 W H100, no shape margin is taken off (wave
quantisation is still charged per GEMM). Attention loses the same clock: the B200 profile's
attention efficiency times the ratio of this GEMM rate to the 1000 W profile's (the 500 W
H100's rule, topologies/specs.py POWER_CAPPED_500W_PROFILE).

Cross-check with the limit stated, not used for pricing: Meta's TLX tutorial benchmark,
run through denoise.sh, which prints "Locking GPU 4 power cap to 750 W" and a 1965 MHz
clock cap, times cuBLAS FP16 matmuls (the BF16 tensor-core rate) at 1110.1 and 1087.7
TFLOP/s at 4096^3 and 8192^3 (facebookexperimental/triton pull request 854, 2026;
pull request 814 printed 1056.8 and 1059.0 on the same script), and in the same run
PyTorch SDPA's attention forward at 719.2 TFLOP/s at 8192 tokens (head dim 128; the
backend is not printed); pull request 407 ("On 750W B200") has a Triton warp-specialised
attention forward at 840.6 TFLOP/s (batch 4, 32 heads, head dim 128, 8192 tokens). So
the 930 TFLOP/s above is the low end of what a 750 W B200 is measured to reach in a
benchmark (B200_750W_CUBLAS_CAPPED_FLOPS is 1.16 times it). The priced attention level,
0.332 x 2250 = 747 TFLOP/s for a forward and backward at 16k tokens (the 1000 W B200's
measured cuDNN rate, topologies/attention_kernels.py, at this clock ratio), prices a
forward at 8192 tokens at about 657 TFLOP/s (cuDNN's curve), below both measured 750 W
forwards. All of these are burst rates (triton's do_bench: 100 ms); a training step
runs at the profile's sustained_tensor_ratio of them (topologies/specs.py DeviceProfile).
"""
from __future__ import annotations

from dataclasses import replace

from .gemm_k_loop import effective_k, rate_at_k, tile_overhead_k
from .specs import TB, DeviceSpec, device

# tritonbench aten_matmul BF16 on a Meta B200, 8192 x 8192 x {4096, 8192}, two runs
# (meta-pytorch/tritonbench pull requests 1009 and 1011).
B200_750W_GEMM_FLOPS = (913.191 + 933.638 + 914.601 + 958.591) / 4 * TB
B200_750W_POWER_W = 750
# Those GEMMs' K loops (4096, 8192, 4096, 8192), each weighted alike as their rates are
# averaged: the profile's reference K (topologies/gemm_k_loop.py).
B200_750W_GEMM_REFERENCE_K = round(effective_k(
    [(1.0, 4096), (1.0, 8192), (1.0, 4096), (1.0, 8192)]))
# Cross-check only (module docstring): cuBLAS FP16 at 4096^3 and 8192^3 under an explicit
# 750 W cap (facebookexperimental/triton pull request 854).
B200_750W_CUBLAS_CAPPED_FLOPS = (1110.097549 + 1087.746585) / 2 * TB


def _b200_750w() -> DeviceSpec:
    """The 1000 W B200 spec with the measured 750 W GEMM rate and attention at the same
    clock ratio (module docstring)."""
    rated = device("b200")
    peak = rated.peak("bf16")
    # the two GEMM rates compared at one K loop, the 750 W measurement's
    rated_flops = rate_at_k(rated.profile.gemm_efficiency * peak, rated.profile.gemm_reference_k,
                        B200_750W_GEMM_REFERENCE_K, tile_overhead_k(peak, rated.sm_count))
    clock_ratio = B200_750W_GEMM_FLOPS / rated_flops
    profile = replace(rated.profile,
                      gemm_efficiency=round(B200_750W_GEMM_FLOPS / peak, 3),
                      gemm_reference_k=B200_750W_GEMM_REFERENCE_K,
                      attention_efficiency=round(rated.profile.attention_efficiency
                                                 * clock_ratio, 3))
    # The same GPU under a limit: it keeps its name, which the network model reads for
    # NCCL's architecture class (simulator/network/constants.py) and the references table
    # for its hardware group.
    return replace(rated, profile=profile, tdp_w=B200_750W_POWER_W)


POWER_CAPPED = {"b200-750w": _b200_750w()}
