"""A 128-key sliding window runs cuDNN's fused kernel at a measured fraction of its
full-sequence speed (workloads/windowed_attention.py).

Golden figures: NVIDIA/cudnn-frontend benchmark/attention_inference, config gpt_oss.py
(64 query / 8 KV heads of 64, sinks, BF16, cuDNN 9.27.0), context phase, time_ms of the
gpt_oss_swa and gpt_oss_full rows in results/gpt_oss/{h200,b200,gb200}/*.csv.
"""
from __future__ import annotations

import pytest

from workloads.attention import AttentionCost, kernel_speed
from workloads.head_dim_attention import head_dim_speed
from workloads.windowed_attention import measured_ratio, windowed_speed_ratio

SHAPE = dict(queries=4 * 4096, keys=4096, heads=64, kv_heads=8, head_dim=64, act_bytes=2)


def test_measured_ratio_from_cudnn_times():
    """H200 at s = 8192: windowed 0.135487 ms for 127 keys per query, full causal 1.201782
    ms for 4096: (127 / 4096) x 1.201782 / 0.135487 = 0.275."""
    assert measured_ratio("h200", 8192) == pytest.approx(127 / 4096 * 1.201782 / 0.135487)
    assert measured_ratio("h200", 8192) == pytest.approx(0.275, abs=0.001)
    # B200 at 2048: (124 / 1024) x 0.054336 / 0.035168
    assert measured_ratio("b200", 2048) == pytest.approx(0.187, abs=0.001)
    assert measured_ratio("gb200", 32768) == pytest.approx(0.157, abs=0.001)


def test_ratio_by_architecture_and_window():
    """H100 takes the H200's figures, B200 and GB200 their own; A100, unknown GPUs,
    windows over 128 keys and no window keep the FlashAttention-2 length curve (None)."""
    at_8k = windowed_speed_ratio("h100", 128, 8192)
    assert at_8k == pytest.approx(measured_ratio("h200", 8192))
    mid = windowed_speed_ratio("gb200", 128, 4096)
    assert measured_ratio("gb200", 8192) < mid < measured_ratio("gb200", 2048)
    assert windowed_speed_ratio("b200", 128, 1024) == measured_ratio("b200", 2048)
    for gpu, window in (("a100", 128), ("", 128), ("h100", 256), ("h100", 0)):
        assert windowed_speed_ratio(gpu, window, 4096) is None


def test_windowed_call_priced_at_the_measured_fraction():
    """A GPT-OSS windowed layer on GB200 runs at the measured fraction of the full causal
    call's speed, in the forward and (assumed) the backward; the full layer and CP-style
    calls of a given length are unchanged."""
    windowed = AttentionCost(**SHAPE, window=128, gpu="gb200")
    full = AttentionCost(**SHAPE, gpu="gb200")
    ratio = windowed_speed_ratio("gb200", 128, 4096)
    # heads of 64 features on GB200 run at cuDNN's measured fraction of head dim 128's
    # (workloads/head_dim_attention.py), on the windowed and the full layer alike
    narrow = head_dim_speed("gb200", 64, 4096)
    for phase in ("forward", "backward"):
        # the full call's speed on GB200 is cuDNN's length curve (workloads/cudnn_attention.py)
        assert windowed.speed(phase) == pytest.approx(
            kernel_speed(phase, 4096, True, "gb200") * ratio * narrow)
        assert full.speed(phase) == pytest.approx(
            kernel_speed(phase, 4096, True, "gb200") * narrow)
        assert windowed.speed(phase, length=2048) == pytest.approx(
            kernel_speed(phase, 2048, True, "gb200") * head_dim_speed("gb200", 64, 2048))
    # under a fifth of the full 4096-key call's speed on the same GPU (0.16-0.19 measured)
    assert windowed.speed("forward") < 0.2 * full.speed("forward")
    unknown = AttentionCost(**SHAPE, window=128)
    assert unknown.speed("forward") == kernel_speed("forward", 128)
