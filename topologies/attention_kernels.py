"""Measured fused-attention kernel rates that the Blackwell device profiles stand for.

A device profile's `attention_efficiency` is the fraction of the BF16 peak its attention
kernel reaches at 16k tokens, causal, head dim 128, forward and backward together
(workloads/attention.py scales it by the call's length and mask). On Hopper and Ampere it
is FlashAttention-2's (DeviceProfile's default, from the FlashAttention-3 paper). On
Blackwell the training stacks run cuDNN's fused attention: Transformer Engine's
FusedAttention under Megatron-Core, and PyTorch SDPA's CUDNN_ATTENTION backend, which
torchtitan asks for first from compute capability 10.0 (workloads/attention_impls.py,
torchtitan_sdpa_backend). FlashAttention-2 on a B200 reaches about 0.15 of the peak as a
forward and backward pair (394 and 320 TFLOP/s at 16k in the benchmark below).

Measured: NVIDIA's SDPA training benchmark (NVIDIA/cudnn-frontend,
benchmark/sdpa_benchmark_training: Llama 3.1 405B's attention, batch 1, 128 query and 8
KV heads, head dim 128, causal, BF16, the GPU "with free clock"), its row at 16384 tokens,
the length DeviceProfile.attention_efficiency stands for:

    GPU    forward  backward  TFLOP/s   software (the README at the same commit)
    B200    1332.4    1074.8            NGC PyTorch 25.09 (2.9.0), cuDNN 9.13.1, SDPA cuDNN
    GB200   1668      1304              NGC PyTorch 25.11 (2.10.0), cuDNN 9.17.0, cuDNN frontend
    GB300   1978      1399              NGC PyTorch 25.11 (2.10.0), cuDNN 9.17.0, cuDNN frontend

(B200: artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv at commit bb37575d, the only
B200 series, timed through PyTorch SDPA; GB200 and GB300: ..._NVIDIA_{GB200,GB300}.csv at
d48a60eb, the "cudnn_fe" rows: cuDNN called through its frontend, the path Transformer
Engine's FusedAttention takes. The GB300 rows of bb37575d, through PyTorch SDPA on cuDNN
9.13.1, read 1702.5 / 1267.8 at 16k and lower below 8k; the frontend's series at 9.17 is
the one the Megatron-Core GB300 runs call, and it is measured as GB200's is.) The benchmark counts the backward as
2.5 forwards (its CSV's backward TFLOP/s times time is 2.5 x the forward's FLOPs), as
the simulator does, so one forward and one backward take 1/f + 2.5/b per forward FLOP:
the profile's single efficiency is that pair's rate over the BF16 peak. These are burst
rates (a benchmark of milliseconds per shape); a training step runs them at the profile's
sustained_tensor_ratio (topologies/specs.py DeviceProfile).

Assumptions: the forward and backward of a step weigh 1 : 2.5 as in the pair (a recomputed
forward is priced at the pair's rate too); each GPU's own measurement stands for every
release of the software the rows ran (cuDNN 9.10 to 9.2x); Blackwell inside a power limit
keeps the measured rate's fraction of its clock (topologies/power_capped.py).
"""
from __future__ import annotations

TB = 1e12   # FLOP/s per TFLOP/s (topologies/specs.py's unit; specs imports this module)

# (forward, backward) TFLOP/s at 16384 tokens (module docstring).
CUDNN_ATTENTION_16K_FLOPS = {
    "b200": (1332.415 * TB, 1074.776 * TB),
    "gb200": (1668.0 * TB, 1304.0 * TB),
    "gb300": (1978.0 * TB, 1399.0 * TB),
}
# The benchmark's backward FLOPs over its forward's (module docstring).
BACKWARD_OVER_FORWARD_FLOPS = 2.5


def fwd_bwd_efficiency(gpu: str, peak_bf16_flops: float) -> float:
    """The fraction of `peak_bf16_flops` one forward and one backward of cuDNN's measured
    attention reach together on `gpu` (its rate over the pair, module docstring)."""
    forward, backward = CUDNN_ATTENTION_16K_FLOPS[gpu]
    pair_flops = 1.0 + BACKWARD_OVER_FORWARD_FLOPS
    rate = pair_flops / (1.0 / forward + BACKWARD_OVER_FORWARD_FLOPS / backward)
    return round(rate / peak_bf16_flops, 3)
