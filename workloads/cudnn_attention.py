"""How fast cuDNN's fused attention runs on Blackwell by the length of its call.

On Blackwell the training stacks run cuDNN's fused attention (Transformer Engine's
FusedAttention; PyTorch SDPA's cuDNN backend, which torchtitan asks for first from
compute capability 10.0), and the device profiles' attention efficiency is cuDNN's rate at
16k causal tokens (topologies/attention_kernels.py). Its speed at other lengths follows
cuDNN's own curve, which is much steeper than FlashAttention-2's below 8k tokens: on a
B200 a 4096-token causal call runs at 0.64 of the 16k rate, where FlashAttention-2's curve
(workloads/attention.py) gives 0.95 forward and 0.88 backward.

Measured: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training (Llama 3.1 405B's
attention: batch 1, 128 query and 8 KV heads, head dim 128, causal, BF16, free clock),
causal forward and backward TFLOP/s by sequence length (the backward counted as 2.5
forwards):

  B200   artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv at bb37575d, pyt_cudnn
         (NGC PyTorch 25.09, PyTorch 2.9.0, cuDNN 9.13.1: the README at that commit)
  GB200  artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv at d48a60eb, cudnn_fe
         (NGC PyTorch 25.11, cuDNN 9.17.0)
  GB300  artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB300.csv at d48a60eb, cudnn_fe
         (as GB200's: the frontend path Transformer Engine's FusedAttention calls)

Assumptions: non-causal calls (context parallelism's later ring steps) keep the causal
curve times FlashAttention-2's non-causal over causal speed at the same length (cuDNN's
non-causal rows are not in the benchmark); lengths outside 512-131072 take the nearest
measured; other Blackwell GPUs take the B200's curve; Hopper and Ampere keep
FlashAttention-2's (the profiles there stand for FlashAttention-2).

Known limits (not yet modelled): the profile's level is a forward and backward pair's
rate, so each phase alone is off while the pair is right within 1 % from 2k tokens up
(a forward priced 15-25 % slow, a backward 5-7 % fast; a recomputed forward adds the
forward's error); the benchmark runs batch 1 x 128 heads whatever a real call's batch and
heads are; and the B200 rows, timed through PyTorch, carry a per-call floor (0.10-0.16
ms at 512-1024 tokens, where the cuDNN-frontend rows of GB200 and GB300 take 0.02-0.07 ms)
that the simulator's launch and host costs also charge, so B200's curve below about 4k
tokens is low (no frontend series of B200 is published there).
"""
from __future__ import annotations

from .attention_impls import stand_in_gpu
from .interpolate import log_linear

CUDNN_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
# (forward, backward) causal TFLOP/s by CUDNN_LENGTHS (module docstring).
CUDNN_CAUSAL_TFLOPS = {
    "b200": ((83.991, 254.501, 478.921, 855.678, 1171.278, 1332.415, 1419.000, 1382.330,
              1355.418),
             (134.164, 308.529, 371.486, 701.265, 942.509, 1074.776, 1108.688, 1073.059,
              1047.843)),
    "gb200": ((408.0, 733.0, 1069.0, 1386.0, 1584.0, 1668.0, 1681.0, 1573.0, 1467.0),
              (329.0, 527.0, 655.0, 1054.0, 1211.0, 1304.0, 1348.0, 1229.0, 1188.0)),
    "gb300": ((461.0, 839.0, 1312.0, 1682.0, 1899.0, 1978.0, 2007.0, 1951.0, 1821.0),
              (330.0, 522.0, 633.0, 1110.0, 1292.0, 1399.0, 1438.0, 1399.0, 1360.0)),
}
REFERENCE_LENGTH = 16384   # the length the device profile's efficiency stands for
# Blackwell (compute capability 10.x) GPUs without their own curve take the B200's
BY_ARCH = {10: "b200"}


def curve_gpu(gpu: str) -> str:
    """The measured GPU whose cuDNN curve prices `gpu`'s attention ("" when FlashAttention-
    2's curve does: Hopper, Ampere, unknown devices)."""
    return stand_in_gpu(gpu, CUDNN_CAUSAL_TFLOPS, BY_ARCH)


def cudnn_causal_speed(gpu: str, phase: str, length: float) -> float:
    """cuDNN's causal speed on the measured GPU `gpu` (curve_gpu) for calls of `length`
    keys, relative to its 16k rate in the same phase (a recompute is a forward)."""
    forward, backward = CUDNN_CAUSAL_TFLOPS[gpu]
    series = backward if phase == "backward" else forward
    reference = series[CUDNN_LENGTHS.index(REFERENCE_LENGTH)]
    return log_linear(CUDNN_LENGTHS, series, length) / reference
