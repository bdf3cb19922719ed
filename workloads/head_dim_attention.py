"""How fast cuDNN's fused attention runs heads of 64 features against heads of 128.

A flash-style kernel's tile of 128 queries against 128 keys does d multiply-adds per
(query, key) pair in each of its two GEMMs, while the softmax, the running rescale and the
tile loads and stores cost about the same per pair whatever d is: heads of 64 features
spend a larger share of the kernel outside the tensor cores, so the kernel reaches fewer
FLOP/s. The device profiles' attention levels and cuDNN's length curves
(workloads/cudnn_attention.py) are measured at head dim 128.

Measured: NVIDIA/cudnn-frontend benchmark/attention_inference, "context" phase, BF16,
batch 1, 64 query / 8 KV heads, full causal, backend "cudnn", cuDNN 9.27.0, time_ms:

  GPU    head dim 128 (prefill_sweep, llama3.1)   head dim 64 (gpt_oss_full)
         s = 2048     8192                         s = 2048     8192
  B200   0.075104     0.784670                     0.054336     0.594397
  GB200  0.071900     0.764545                     0.051459     0.552673

(results/prefill_sweep/b200/prefill_sweep_20260918_221024.csv and gb200/
prefill_sweep_20260928_124103.csv; the head-dim-64 times are the GPT-OSS figures of
workloads/windowed_attention.py.) Half the FLOPs at head dim 64, so its FLOP/s over head
dim 128's is 0.5 x t128 / t64: B200 0.691 / 0.660, GB200 0.699 / 0.692.

Assumptions: the backward loses the same fraction as the forward (cuDNN publishes no
head-dim-64 training figure); lengths outside 2048-8192 take the nearest measured; head
dims between 64 and 128 interpolate linearly, below 64 take 64's, 128 and above run at
the profile's level (DeepSeek-V3's 192 / 128 latent heads are measured in cuDNN's training
benchmark within 8 % of head dim 128 per FLOP: not priced); Blackwell GPUs without a
measurement take the B200's (by compute capability); Hopper and Ampere, whose profiles
stand for FlashAttention-2 (workloads/attention.py), are not corrected.
"""
from __future__ import annotations

from .attention_impls import stand_in_gpu
from .interpolate import log_linear
from .windowed_attention import CUDNN_GPT_OSS_CONTEXT_MS

HEAD_DIM_SEQS = (2048, 8192)
REFERENCE_HEAD_DIM = 128
SMALL_HEAD_DIM = 64
# full causal context time_ms at head dim 128, at HEAD_DIM_SEQS (module docstring)
HEAD_DIM_128_MS = {"b200": (0.075104, 0.784670), "gb200": (0.071900, 0.764545)}
# Blackwell (compute capability 10.x) GPUs without their own figures take the B200's
BY_ARCH = {10: "b200"}


def _small_head_ratio(gpu: str, seq: float) -> float:
    """Head dim 64's FLOP/s over head dim 128's on a measured `gpu` at `seq` keys."""
    full_64 = CUDNN_GPT_OSS_CONTEXT_MS[gpu][1]     # at windowed_attention's 2048, 8192, ..
    ratios = [0.5 * t128 / full_64[i] for i, t128 in enumerate(HEAD_DIM_128_MS[gpu])]
    return log_linear(HEAD_DIM_SEQS, ratios, seq)


def head_dim_speed(gpu: str, head_dim: int, seq: float) -> float:
    """cuDNN's attention speed at `head_dim` over its speed at head dim 128 on `gpu` for
    calls of `seq` keys (1.0 at 128 and above, and where not measured)."""
    measured = stand_in_gpu(gpu, HEAD_DIM_128_MS, BY_ARCH)
    if not measured or head_dim >= REFERENCE_HEAD_DIM:
        return 1.0
    small = _small_head_ratio(measured, seq)
    share = (max(head_dim, SMALL_HEAD_DIM) - SMALL_HEAD_DIM) / (
        REFERENCE_HEAD_DIM - SMALL_HEAD_DIM)
    return small + (1.0 - small) * share
