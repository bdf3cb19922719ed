"""The 750 W B200 (topologies/power_capped.py) and the torchtitan B200 rows that ran on it."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.compute import k_loop_efficiency

from topologies import build
from topologies.power_capped import B200_750W_GEMM_FLOPS, POWER_CAPPED
from topologies.specs import DEVICES, TB
from validation.reference_rows import hardware_name

ROWS = Path(__file__).resolve().parents[1] / "validation" / "references" / "training_runs.csv"


def test_gemm_rate_is_the_measured_750w_one():
    """The capped B200 runs GEMMs at tritonbench's ~930 TFLOP/s, well under the 1000 W
    profile's layer-shape rate (2250 x 0.642 = 1444 TFLOP/s): a regression to the rated
    part would make every GEMM ~55 % faster."""
    capped, rated = POWER_CAPPED["b200-750w"], DEVICES["b200"]
    rate = capped.peak("bf16") * capped.profile.gemm_efficiency
    assert rate == pytest.approx(930.0 * TB, rel=2e-3)
    assert rate == pytest.approx(B200_750W_GEMM_FLOPS, rel=2e-3)
    assert rate < 0.7 * rated.peak("bf16") * rated.profile.gemm_efficiency


def test_attention_loses_the_gemm_clock_and_memory_does_not():
    """Attention slows by the GEMM clock ratio (the two GEMM rates compared at the 750 W
    measurement's K loop, topologies/gemm_k_loop.py); HBM bandwidth, memory efficiency,
    peaks and NVLink stay those of the rated part."""
    capped, rated = POWER_CAPPED["b200-750w"], DEVICES["b200"]
    clock = capped.profile.gemm_efficiency / (
        rated.profile.gemm_efficiency
        * k_loop_efficiency(capped.profile.gemm_reference_k, rated, "bf16"))
    attention = capped.profile.attention_efficiency / rated.profile.attention_efficiency
    assert attention == pytest.approx(clock, rel=1e-2)
    assert capped.profile.memory_efficiency == rated.profile.memory_efficiency
    assert capped.hbm_Bps == rated.hbm_Bps
    assert capped.peak("fp8") == rated.peak("fp8")
    assert capped.tdp_w == 750 and capped.name == "b200"   # same GPU: NCCL's Blackwell class


def test_preset_builds_capped_hosts():
    """`dgx-b200-750w` and its xN form are hosts of eight capped B200s."""
    one, two = build("dgx-b200-750w"), build("dgx-b200-750wx2")
    assert one.world_size == 8 and two.world_size == 16
    assert {d.profile for d in two.devices} == {POWER_CAPPED["b200-750w"].profile}
    assert {d.tdp_w for d in one.devices} == {750}
    # NCCL's tuning still sees a Blackwell GPU (the limit changes clocks, not the part)
    from simulator.network.constants import arch_of
    assert arch_of(one.devices[0].name) == "blackwell"
    assert build("dgx-b200").devices[0].profile == DEVICES["b200"].profile


def test_b200_torchtitan_rows_run_on_the_capped_host():
    """Every torchtitan B200 row (the torchao / torchtitan run set published as '8xB200
    GPUs limited to 750W') is simulated on the capped host, in the B200 hardware group."""
    with ROWS.open(newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r["source_family"] == "torchtitan" and "b200" in r["topology"]]
    assert len(rows) == 4
    for row in rows:
        assert row["topology"] == "dgx-b200-750w", row["id"]
        assert "750" in row["notes"], row["id"]
        assert hardware_name(row) == "b200", row["id"]


def test_capped_step_is_slower_by_the_clock():
    """A GEMM-bound step on the capped host takes about the clock ratio longer."""
    from simulator import SimOptions, simulate
    from workloads import plan_from_dict

    plan = plan_from_dict({
        "name": "b200-cap", "model": "llama3-8b", "framework": "torchtitan",
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048, "dtype": "bf16"},
        "mesh": {"dp": 8}, "recompute": "none", "kernels": "fused"})
    rated = simulate(plan, build("dgx-b200"), SimOptions()).summary["step_time_s"]
    capped = simulate(plan, build("dgx-b200-750w"), SimOptions()).summary["step_time_s"]
    clock = (DEVICES["b200"].profile.gemm_efficiency
             / POWER_CAPPED["b200-750w"].profile.gemm_efficiency)
    assert 1.3 < capped / rated <= clock * 1.02


def test_priced_gemm_rate_not_above_the_explicitly_capped_measurement():
    """The priced 750 W GEMM rate (tritonbench, limit assumed) stays at or below cuBLAS
    under an explicitly stated 750 W cap (facebookexperimental/triton pull request 854:
    1110.1 and 1087.7 TFLOP/s): fitting it down further to the torchtitan rows would
    contradict that measurement, fitting it up past it would price an uncapped part."""
    from topologies.power_capped import B200_750W_CUBLAS_CAPPED_FLOPS
    capped = POWER_CAPPED["b200-750w"]
    rate = capped.peak("bf16") * capped.profile.gemm_efficiency
    assert B200_750W_CUBLAS_CAPPED_FLOPS == pytest.approx(1098.9 * TB, rel=1e-3)
    assert rate <= B200_750W_CUBLAS_CAPPED_FLOPS
    assert rate / B200_750W_CUBLAS_CAPPED_FLOPS == pytest.approx(0.846, abs=0.01)
