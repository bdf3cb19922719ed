"""cuDNN's attention at head dim 64 against 128 on Blackwell (workloads/head_dim_attention.py):
the golden ratios from NVIDIA/cudnn-frontend's attention_inference benchmark (cuDNN
9.27.0), and what the GPT-OSS layers are priced at."""
from __future__ import annotations

import pytest

from workloads.attention import AttentionCost
from workloads.head_dim_attention import head_dim_speed


@pytest.mark.parametrize("gpu,seq,ratio", [
    # 0.5 x t(head dim 128) / t(head dim 64), both full causal, 64 / 8 heads, batch 1
    ("b200", 2048, 0.5 * 0.075104 / 0.054336),     # 0.691
    ("b200", 8192, 0.5 * 0.784670 / 0.594397),     # 0.660
    ("gb200", 2048, 0.5 * 0.071900 / 0.051459),    # 0.699
    ("gb200", 8192, 0.5 * 0.764545 / 0.552673),    # 0.692
])
def test_measured_points(gpu, seq, ratio):
    assert head_dim_speed(gpu, 64, seq) == pytest.approx(ratio, rel=1e-9)


def test_between_and_outside_the_measurements():
    at_2k, at_8k = head_dim_speed("b200", 64, 2048), head_dim_speed("b200", 64, 8192)
    assert at_8k < head_dim_speed("b200", 64, 4096) < at_2k
    assert head_dim_speed("b200", 64, 1024) == at_2k         # clamped, not extrapolated
    assert head_dim_speed("b200", 64, 65536) == at_8k
    # linear in the head dim between 64 and 128, 64's below, none at 128 and above
    assert head_dim_speed("b200", 96, 8192) == pytest.approx((at_8k + 1.0) / 2)
    assert head_dim_speed("b200", 32, 8192) == at_8k
    assert head_dim_speed("b200", 128, 8192) == head_dim_speed("b200", 192, 8192) == 1.0


def test_only_blackwell_is_corrected():
    assert head_dim_speed("gb300", 64, 8192) == head_dim_speed("b200", 64, 8192)   # by CC
    for gpu in ("h100", "h200", "a100", ""):
        assert head_dim_speed(gpu, 64, 8192) == 1.0


def cost(head_dim: int, gpu: str, window: int = 0) -> AttentionCost:
    return AttentionCost(queries=4096, keys=4096, heads=64, kv_heads=8, head_dim=head_dim,
                         act_bytes=2, window=window, gpu=gpu)


@pytest.mark.parametrize("window", [0, 128])
def test_gpt_oss_layers_run_slower_per_flop_than_wide_heads(window):
    # GPT-OSS's full and 128-key windowed layers (head dim 64) on GB200: the same speed
    # as a head-dim-128 call times the measured ratio; Hopper's FlashAttention-2 pricing
    # is left alone
    for phase in ("forward", "backward"):
        narrow, wide = cost(64, "gb200", window), cost(128, "gb200", window)
        assert narrow.speed(phase) == pytest.approx(
            wide.speed(phase) * head_dim_speed("gb200", 64, 4096), rel=1e-12)
        assert cost(64, "h100", window).speed(phase) == cost(128, "h100", window).speed(phase)


def test_one_rule_picks_the_stand_in_for_every_measured_table(monkeypatch):
    """The four cuDNN tables (length curve, FP8 ratios, short windows, narrow heads) choose
    the measured GPU for an unmeasured one by the same rule (attention_impls.stand_in_gpu):
    a compute capability 10.x GPU takes each table's Blackwell figures, Hopper names the
    tables without Hopper figures leave alone."""
    from workloads import attention_impls
    from workloads.cudnn_attention import curve_gpu
    from workloads.fp8_attention import measured_gpu
    from workloads.windowed_attention import windowed_speed_ratio
    monkeypatch.setitem(attention_impls.COMPUTE_CAPABILITY, "b100", (10, 0))
    assert curve_gpu("B100") == "b200" and measured_gpu("b100") == "gb200"
    assert windowed_speed_ratio("b100", 128, 4096) == windowed_speed_ratio("b200", 128, 4096)
    assert head_dim_speed("b100", 64, 4096) == head_dim_speed("b200", 64, 4096) < 1.0
    assert curve_gpu("h200") == "" == measured_gpu("h200")
    assert head_dim_speed("h200", 64, 4096) == 1.0
