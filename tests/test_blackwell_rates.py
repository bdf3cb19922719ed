"""Blackwell rates the compute model prices: dense (not sparse) peaks per dtype, the GEMM,
attention and memory-bound rates against H100's, and the memory efficiency's source."""
import pytest

from simulator.compute import device_time_s, k_loop_efficiency, wave_efficiency
from topologies.specs import (B200_BEST_MEMORY_KERNEL_Bps, BLACKWELL_MEMORY_EFFICIENCY,
                              DEVICES, TE_B300_LAYER_GEMM_S)
from workloads.program import ATTENTION, GEMM, MEMORY, Task

TB = 1e12
# NVIDIA Blackwell datasheet, HGX B200 column, sparse figures (PFLOP/s): the dense peaks the
# simulator prices are half of them; GB200 NVL72 column likewise.
SPARSE_PFLOPS = {"b200": {"bf16": 4.5, "fp8": 9.0, "mxfp8": 9.0, "nvfp4": 18.0},
                 "gb200": {"bf16": 5.0, "fp8": 10.0, "mxfp8": 10.0, "nvfp4": 20.0}}


def _task(op_class, flops=0.0, bytes_=0.0, mnk=(0, 0, 0)):
    return Task(id=0, kind="compute", stream="compute", op="x", phase="forward", layer=0,
                microbatch=0, flops=flops, bytes=bytes_, op_class=op_class, gemm_mnk=mnk)


@pytest.mark.parametrize("gpu", ["b200", "gb200"])
def test_peaks_are_dense_halves_of_the_sparse_datasheet_figures(gpu):
    spec = DEVICES[gpu]
    for dtype, sparse in SPARSE_PFLOPS[gpu].items():
        assert spec.peak(dtype) == pytest.approx(sparse * 1e15 / 2)
    # B200's dense BF16 peak is 2.28x H100 SXM's (2250 / 989), not a sparse or FP4 figure
    assert DEVICES["b200"].peak("bf16") / DEVICES["h100"].peak("bf16") == pytest.approx(
        2250 / 989)


def test_b200_gemm_rate_over_h100_is_peak_times_efficiency():
    """A large layer GEMM on B200 against H100 SXM: the ratio is the peaks' ratio times the
    GEMM efficiencies' ratio, the wave quantisation of 148 against 132 SMs and the K-loop
    factors at each profile's reference K, nothing more (a sparse or FP4 peak slipping in
    would double it)."""
    m, n, k = 16384, 14336, 4096
    task = _task(GEMM, flops=2.0 * m * n * k, mnk=(m, n, k))
    b200, h100 = DEVICES["b200"], DEVICES["h100"]

    def rate(spec):
        launch = spec.profile.launch_overhead_s
        return task.flops / (device_time_s(task, spec, "bf16") - launch)

    waves = (wave_efficiency(m, n, k, 148, 128) / wave_efficiency(m, n, k, 132, 128))
    # and each profile's K-loop factor at K = 4096 (topologies/gemm_k_loop.py)
    waves *= k_loop_efficiency(k, b200, "bf16") / k_loop_efficiency(k, h100, "bf16")
    # B200's best-shape 77.6 % times the Blackwell layer-shape margin 0.827 (Transformer
    # Engine's GEMM benchmark on B300) against H100's best-shape 80.3 % [STAS MAMF table];
    # both at the same sustained ratio, which cancels
    expected = 2250 / 989 * 0.642 / 0.803 * waves
    assert rate(b200) / rate(h100) == pytest.approx(expected, rel=1e-9)
    assert 1.8 < rate(b200) / rate(h100) < 2.4


@pytest.mark.parametrize("dtype", ["fp8", "mxfp8", "nvfp4"])
def test_attention_on_blackwell_runs_at_the_bf16_peak_under_low_precision(dtype):
    spec = DEVICES["b200"]
    task = _task(ATTENTION, flops=1e15)
    launch = spec.profile.launch_overhead_s
    assert device_time_s(task, spec, dtype) == pytest.approx(
        device_time_s(task, spec, "bf16"))
    assert device_time_s(task, spec, dtype) - launch == pytest.approx(
        1e15 / (2250 * TB * spec.profile.attention_efficiency
                * spec.profile.sustained_tensor_ratio))


def test_blackwell_memory_bound_kernels_run_at_the_measured_b200_fraction():
    """torchao's best B200 memory-bound kernel (6462 GB/s) over the published 7.7 TB/s;
    H100 keeps its copy-kernel 0.9."""
    assert B200_BEST_MEMORY_KERNEL_Bps == 6462e9
    assert BLACKWELL_MEMORY_EFFICIENCY == 0.839
    for gpu in ("b200", "gb200", "gb300", "b300"):
        assert DEVICES[gpu].profile.memory_efficiency == 0.839
    assert DEVICES["h100"].profile.memory_efficiency == 0.9
    b200 = DEVICES["b200"]
    task = _task(MEMORY, bytes_=8e9)
    assert device_time_s(task, b200, "bf16") - b200.profile.launch_overhead_s == \
        pytest.approx(8e9 / 6462e9, rel=1e-3)


# [STAS] "Maximum Achievable Matmul FLOPS" table (stas00/ml-engineering): best-shape
# matmul TFLOP/s (BF16, FP8 e4m3) and the datasheet dense peaks they divide.
MAMF = {"h100": ((794.5, 989), (1402.6, 1979)), "b200": ((1745.0, 2250), (3432.5, 4500)),
        "gb200": ((1822.0, 2500), (3615.6, 5000)), "b300": ((1769.0, 2250), (3353.3, 4500)),
        # GB300 unmeasured: the B300's fractions (the same die)
        "gb300": ((1769.0, 2250), (3353.3, 4500))}


@pytest.mark.parametrize("gpu", sorted(MAMF))
def test_fp8_gemms_reach_the_measured_fp8_fraction_of_their_peak(gpu):
    """A large GEMM's rate per dtype: FP8 (and the FP8-class recipes) at the BF16
    efficiency times the measured FP8-over-BF16 best-shape fraction; BF16 and NVFP4 at the
    BF16 efficiency. On H100 that ratio is 0.883 (70.9 % against 80.3 %): an FP8 GEMM runs
    1.77x a BF16 one, not 2x."""
    (bf16_tf, bf16_peak), (fp8_tf, fp8_peak) = MAMF[gpu]
    ratio = (fp8_tf / fp8_peak) / (bf16_tf / bf16_peak)
    spec = DEVICES[gpu]
    m, n, k = 16384, 14336, 4096
    task = _task(GEMM, flops=2.0 * m * n * k, mnk=(m, n, k))
    times = {d: device_time_s(task, spec, d) - spec.profile.launch_overhead_s
             for d in ("bf16", "fp8", "fp8_cs", "mxfp8") if d in spec.peak_flops}
    for dtype in ("fp8", "fp8_cs") + (("mxfp8",) if "mxfp8" in times else ()):
        speedup = times["bf16"] / times[dtype]
        # MXFP8 at Transformer Engine's measured MXFP8-over-FP8 layer time on Blackwell
        block_scaled = 6.812 / 7.161 if dtype == "mxfp8" else 1.0
        # the faster MMA pays the same per-tile time over a K loop of 4096 (topologies/
        # gemm_k_loop.py): the ratio of the two K-loop factors, a few % below 1
        loops = k_loop_efficiency(k, spec, dtype) / k_loop_efficiency(k, spec, "bf16")
        assert 0.9 < loops < 1.0
        assert speedup == pytest.approx(spec.peak(dtype) / spec.peak("bf16") * ratio
                                        * block_scaled * loops, rel=2e-3)
    assert spec.gemm_efficiency("bf16") == spec.profile.gemm_efficiency
    if "nvfp4" in spec.peak_flops:
        assert spec.gemm_efficiency("nvfp4") == spec.profile.gemm_efficiency


def test_power_capped_h100_keeps_one_gemm_efficiency_for_both_dtypes():
    """FBGEMM measured the 500 W board's FP8 row-wise layer GEMMs at its BF16 fraction
    within 2 %: no FP8 ratio there; H200 takes its own measured FP8 fraction."""
    capped = DEVICES["h100-hbm2e"]
    assert capped.gemm_efficiency("fp8") == capped.gemm_efficiency("bf16")
    assert DEVICES["h200"].profile.fp8_gemm_ratio == round((1453.4 / 1979) / (794.5 / 989), 3)


def test_b300_peaks_are_the_dgx_b300_dense_figures():
    """B300 (HGX / DGX B300) dense peaks of stas00/ml-engineering's TFLOPS table (from
    NVIDIA's DGX B300 datasheet): BF16 2250, FP8 and MXFP8 4500, FP4 12600 TFLOP/s, the
    BF16 and FP8 of B200 (the same tensor-core rate at those dtypes), not GB300's 1400 W
    2500 / 5000."""
    b300 = DEVICES["b300"]
    for dtype, tflops in {"bf16": 2250, "fp8": 4500, "mxfp8": 4500, "nvfp4": 12600}.items():
        assert b300.peak(dtype) == pytest.approx(tflops * TB)
    assert b300.peak("bf16") == DEVICES["b200"].peak("bf16") < DEVICES["gb300"].peak("bf16")
    assert b300.sm_count == DEVICES["gb300"].sm_count == 160


def test_b300_prices_transformer_engines_measured_b300_layer_gemms():
    """The 12 GEMMs of one 5B-model layer (hidden 4096, QKV 12288, FFN 16384, 15,872 tokens;
    forward, data- and weight-gradient shapes) timed by Transformer Engine's GEMM benchmark
    on a B300 (topologies/specs.py TE_B300_LAYER_GEMM_S). The BF16 efficiency is set from
    this run's BF16 time; FP8 and MXFP8 come from a separate measurement (the best-shape FP8
    matmul of stas00/ml-engineering's MAMF table), so their agreement is a check: the model
    prices each at burst rate within 4 % of the measured kernel time."""
    spec = DEVICES["b300"]
    tokens = 15872
    projections = ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))

    def burst_s(m, n, k, dtype):
        task = _task(GEMM, flops=2.0 * m * n * k, mnk=(m, n, k))
        busy = device_time_s(task, spec, dtype) - spec.profile.launch_overhead_s
        return busy * spec.profile.sustained_tensor_ratio

    for dtype, measured in (("bf16", "bf16"), ("fp8_cs", "fp8"), ("mxfp8", "mxfp8")):
        layer_s = sum(burst_s(tokens, n_out, k_in, dtype) + burst_s(tokens, k_in, n_out, dtype)
                      + burst_s(k_in, n_out, tokens, dtype) for k_in, n_out in projections)
        assert layer_s == pytest.approx(TE_B300_LAYER_GEMM_S[measured], rel=0.04)


def test_gb300_prices_its_measured_cublas_matmuls():
    """GB300's GEMMs rest on cuBLAS matmuls measured on a GB300 (facebookexperimental/triton
    pull request 740, M = N = 8192), not on the 1000 W B300's fractions: the rate from
    its K = 4096 and 8192 points, the per-tile cost from its whole K sweep (flat from
    K = 1024, where the B200-derived rule would price K = 1024 at 0.75 of K = 8192). At
    burst rate the profile prices every point of the sweep within 7 % (160 SMs' wave
    quantisation of 8192 x 8192 costs 1.5 % of it) and the two rate points' mean within 3 %."""
    spec = DEVICES["gb300"]
    sweep = {512: 1595.79, 1024: 1745.78, 2048: 1751.9, 4096: 1756.31, 8192: 1717.37,
             16384: 1812.09}
    priced = {}
    for k, measured_tflops in sweep.items():
        task = _task(GEMM, flops=2.0 * 8192 * 8192 * k, mnk=(8192, 8192, k))
        busy = device_time_s(task, spec, "bf16") - spec.profile.launch_overhead_s
        priced[k] = task.flops / (busy * spec.profile.sustained_tensor_ratio) / TB
        assert priced[k] == pytest.approx(measured_tflops, rel=0.07)
    assert (priced[4096] + priced[8192]) / 2 == pytest.approx((1756.31 + 1717.37) / 2, rel=0.03)
    assert priced[1024] / priced[8192] > 0.9
    assert spec.profile.gemm_efficiency > DEVICES["b300"].profile.gemm_efficiency
