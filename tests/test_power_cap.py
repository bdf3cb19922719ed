"""The 500 W H100 (Grand Teton) profile: GEMMs and attention at the power-capped clock."""
from __future__ import annotations

import pytest

from simulator.compute import k_loop_efficiency

from topologies.specs import DEVICES, H100_500W_GEMM_FLOPS, TB


def test_500w_gemm_rate_is_the_measured_one():
    """The profile's GEMM rate is FBGEMM's 500 W measurement (~569 TFLOP/s BF16), not the
    clock-derived 0.75 x peak the uncapped H100 gets: a regression to the default profile
    would make every Grand Teton GEMM ~20 % faster."""
    capped = DEVICES["h100-hbm2e"]
    rate = capped.peak("bf16") * capped.profile.gemm_efficiency
    assert rate == pytest.approx(H100_500W_GEMM_FLOPS, rel=2e-3)
    assert rate == pytest.approx(568.9 * TB, rel=2e-3)
    uncapped = DEVICES["h100"]
    assert rate < 0.8 * uncapped.peak("bf16") * uncapped.profile.gemm_efficiency


def test_500w_cap_slows_attention_by_the_gemm_clock_ratio():
    """Attention loses the same clock as the GEMMs against the 700 W H100 SXM, the two
    GEMM rates compared at the 500 W measurement's K loop (topologies/gemm_k_loop.py)."""
    capped, uncapped = DEVICES["h100-hbm2e"], DEVICES["h100"]
    attn = capped.peak("bf16") * capped.profile.attention_efficiency
    attn_700w = uncapped.peak("bf16") * uncapped.profile.attention_efficiency
    gemm = capped.peak("bf16") * capped.profile.gemm_efficiency
    gemm_700w = uncapped.peak("bf16") * uncapped.profile.gemm_efficiency * \
        k_loop_efficiency(capped.profile.gemm_reference_k, uncapped, "bf16")
    assert attn / attn_700w == pytest.approx(gemm / gemm_700w, rel=5e-3)
