"""The K loop's per-tile cost (topologies/gemm_k_loop.py): its constant reproduces the
kernel benchmark it rests on, the profiles' reference K, and what the compute model and the
MoE weight gradients make of it."""
import json
import math

import pytest

from moe_small import E, K, T, layer_tasks, moe_plan
from simulator.compute import device_time_s, k_loop_efficiency, wave_efficiency
from topologies import TopologyError
from topologies.gemm_k_loop import (B200_BF16_PEAK_FLOPS, B200_SM_COUNT,
                                    K_TILE_OVERHEAD_B200_BF16, SHORTEST_MEASURED_K,
                                    effective_k, k_loop_fraction, rate_at_k, tile_overhead_k)
from topologies.presets_file import load_file
from topologies.power_capped import POWER_CAPPED
from topologies.specs import BLACKWELL_GEMM_REFERENCE_K, DEVICES
from workloads.program import GEMM, Task
from workloads.tp_overlap import chunked_gemm

TB = 1e12
# meta-pytorch/tritonbench pull request 1011: cuBLAS BF16 (aten_matmul) on a B200 at
# M = N = 8192: K -> TFLOP/s.
TRITONBENCH_B200_K_SWEEP = {1024: 714.28, 2048: 838.697, 4096: 914.601, 8192: 958.591,
                            16384: 948.902}
# deepseek-ai/DeepGEMM README.md before pull request #86 (parent of commit 37aa127),
# "Normal GEMMs for dense models", H800 SXM5, FP8: (M, N, K) -> TFLOP/s.
DEEPGEMM_H800_M4096 = {(4096, 2112, 7168): 1127, (4096, 24576, 1536): 1212,
                       (4096, 32768, 512): 775, (4096, 7168, 16384): 1520,
                       (4096, 4096, 7168): 1410, (4096, 7168, 2048): 1168}


def test_the_per_tile_cost_reproduces_the_cublas_k_sweep():
    """K0 = 388 and one rate (992 TFLOP/s) put every point of the B200 sweep within
    2.2 %: a K loop of 1024 runs at three quarters of one of 8192."""
    # the rule's own B200 constants are the "b200" preset's (kept apart from specs.py)
    b200 = DEVICES["b200"]
    assert (B200_BF16_PEAK_FLOPS, B200_SM_COUNT) == (b200.peak("bf16"), b200.sm_count)
    for k, tflops in TRITONBENCH_B200_K_SWEEP.items():
        model = 992 * k_loop_fraction(k, K_TILE_OVERHEAD_B200_BF16)
        assert model == pytest.approx(tflops, rel=0.022), k
    # per SM: H100's BF16 MMA runs at half B200's rate per SM, its FP8 at the same
    assert tile_overhead_k(989 * TB, 132) == pytest.approx(191, rel=0.01)
    assert tile_overhead_k(1979 * TB, 132) == pytest.approx(383, rel=0.01)


def test_deepgemm_h800_cross_check():
    """DeepGEMM's FP8 rows fit a per-tile cost of 490 with the wave model (rms 3.7 %); the
    rule predicts 383 for H800's FP8 from the cuBLAS sweep: within 25 %, and the rows
    computed with the predicted cost stay within 15 %."""
    def rms(k0, rate):
        errors = [math.log(rate * wave_efficiency(m, n, k, 132, 128)
                           * k_loop_fraction(k, k0) / tflops)
                  for (m, n, k), tflops in DEEPGEMM_H800_M4096.items()]
        return math.sqrt(sum(e * e for e in errors) / len(errors))
    assert rms(490, 1545) < 0.04
    predicted = tile_overhead_k(1979 * TB, 132)
    assert predicted == pytest.approx(490, rel=0.25)
    best_rate = min(range(1300, 1700), key=lambda r: rms(predicted, r))
    assert rms(predicted, best_rate) < 0.06
    for (m, n, k), tflops in DEEPGEMM_H800_M4096.items():
        model = best_rate * wave_efficiency(m, n, k, 132, 128) * k_loop_fraction(k, predicted)
        assert model == pytest.approx(tflops, rel=0.15), (m, n, k)


# XLA's sm_90 matmul table (openxla/xla matmul_interpolator_data.h, as mirrored in
# tensorflow/tensorflow): BF16, batch b of 4096 x 4096 x K -> FLOP/s.
XLA_SM90_4096 = {4: {256: 503874974234136, 512: 619859436746254, 4096: 793131337247852},
                 2: {256: 464019802938634, 512: 607674484339352, 4096: 807671014191940}}


@pytest.mark.parametrize("batch", sorted(XLA_SM90_4096))
def test_hopper_cross_check_from_xlas_matmul_table(batch):
    """Time linear in K (a fixed part per wave plus a part per K-element): the line
    through K = 512 and 4096 passes K = 256 within 3 %, and its fixed part over its
    per-K part is within 15 % of the per-tile cost the rule gives H100's BF16."""
    rates = XLA_SM90_4096[batch]
    time_s = {k: 2.0 * batch * 4096 * 4096 * k / r for k, r in rates.items()}
    per_k_s = (time_s[4096] - time_s[512]) / (4096 - 512)
    fixed_s = time_s[512] - per_k_s * 512
    assert fixed_s + per_k_s * 256 == pytest.approx(time_s[256], rel=0.03)
    assert fixed_s / per_k_s == pytest.approx(tile_overhead_k(989 * TB, 132), rel=0.15)


def test_loops_shorter_than_any_measured_are_held_at_the_shortest():
    assert k_loop_fraction(128, 191) == k_loop_fraction(SHORTEST_MEASURED_K, 191)
    assert k_loop_fraction(1024, 191) > k_loop_fraction(512, 191)


def test_effective_k_is_the_flop_weighted_harmonic_mean():
    assert effective_k([(1.0, 4096)]) == pytest.approx(4096)
    assert effective_k([(1.0, 1024), (1.0, 4096)]) == pytest.approx(2 / (1 / 1024 + 1 / 4096))
    # it is the K whose loop fraction is the time-weighted one, for any per-tile cost
    gemms = [(3.0, 1024), (1.0, 16384)]
    for k0 in (191.0, 388.0, 1500.0):
        time_weighted = sum(f for f, _ in gemms) / sum(
            f / k_loop_fraction(k, k0) for f, k in gemms)
        assert k_loop_fraction(effective_k(gemms), k0) == pytest.approx(time_weighted)
    assert rate_at_k(100.0, 8192, 8192, 388) == pytest.approx(100.0)
    assert rate_at_k(100.0, 8192, 1024, 388) < 100.0


def test_profiles_reference_k_and_the_factor_around_it():
    h100, b200 = DEVICES["h100"], DEVICES["b200"]
    assert h100.profile.gemm_reference_k == 13312          # [STAS] best-shape BF16 K
    # Blackwell: TE's B300 layer; 500 W H100: FBGEMM's three shapes; 750 W B200:
    # tritonbench's 4096 and 8192 (topologies/specs.py, power_capped.py)
    assert b200.profile.gemm_reference_k == BLACKWELL_GEMM_REFERENCE_K == 7722
    assert DEVICES["h100-hbm2e"].profile.gemm_reference_k == 7820
    assert POWER_CAPPED["b200-750w"].profile.gemm_reference_k == 5461
    assert k_loop_efficiency(13312, h100, "bf16") == pytest.approx(1.0)
    assert k_loop_efficiency(768, h100, "bf16") < k_loop_efficiency(4096, h100, "bf16") < 1
    assert k_loop_efficiency(65536, h100, "bf16") > 1
    # FP8's MMA is twice as fast per SM, so the same per-tile time costs a short K more
    assert k_loop_efficiency(768, h100, "fp8") < k_loop_efficiency(768, h100, "bf16")
    assert k_loop_efficiency(0, h100, "bf16") == 1.0


def test_gemm_time_scales_by_the_k_loop_factor():
    """Two GEMMs of equal FLOPs, K 512 against K 8192: the short one is slower by the
    ratio of their loop fractions (and of their waves, which differ slightly)."""
    h100 = DEVICES["h100"]

    def busy_s(m, n, k):
        task = Task(id=0, kind="compute", stream="compute", op="x", phase="forward",
                    layer=0, microbatch=0, flops=2.0 * m * n * k, op_class=GEMM,
                    gemm_mnk=(m, n, k))
        return device_time_s(task, h100, "bf16") - h100.profile.launch_overhead_s
    short, long_ = busy_s(16384, 8192, 512), busy_s(1024, 8192, 8192)
    k0 = tile_overhead_k(h100.peak("bf16"), h100.sm_count)
    waves = (wave_efficiency(1024, 8192, 8192, 132, 128)
             / wave_efficiency(16384, 8192, 512, 132, 128))
    expected = k_loop_fraction(8192, k0) / k_loop_fraction(512, k0) * waves
    assert short / long_ == pytest.approx(expected, rel=1e-9)


def test_grouped_weight_gradient_reduces_over_each_experts_rows():
    """The experts' wgrad is one problem per local expert whose K is that expert's rows,
    without the forward's few-rows-per-expert loss; the forward keeps all rows as m."""
    plan = moe_plan()
    tasks = [t for t in layer_tasks(plan) if t.op == "w1"]
    wgrad = next(t for t in tasks if t.label.endswith(".wgrad"))
    fwd = next(t for t in tasks if t.label.endswith(".fwd"))
    rows = T * K                                     # routed rows of the micro-batch
    assert wgrad.gemm_groups == E
    assert wgrad.gemm_mnk[2] == rows // E
    assert wgrad.efficiency == 1.0
    assert fwd.gemm_groups == 1 and fwd.gemm_mnk[0] == rows


def _gpu_file(tmp_path, gpu: dict):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"gpus_per_domain": 8, "gpu": gpu}))
    return path


def test_a_gpu_file_without_sms_prices_no_k_loop(tmp_path):
    bare = load_file(_gpu_file(tmp_path, {"bf16_tflops": 500, "hbm_gb": 80, "hbm_GBps": 2000,
                                          "nvlink_GBps": 300}))
    assert bare.gpu.profile.gemm_reference_k == 0
    assert k_loop_efficiency(512, bare.gpu, "bf16") == 1.0
    with_sms = load_file(_gpu_file(tmp_path, {"bf16_tflops": 500, "hbm_gb": 80,
                                              "hbm_GBps": 2000, "nvlink_GBps": 300,
                                              "sm_count": 100}))
    assert with_sms.gpu.profile.gemm_reference_k == 13312
    based = load_file(_gpu_file(tmp_path, {"base": "b200",
                                           "profile": {"gemm_reference_k": 4096}}))
    assert based.gpu.profile.gemm_reference_k == 4096
    assert math.isclose(k_loop_efficiency(4096, based.gpu, "bf16"), 1.0)


def test_a_gpu_file_gives_its_own_k_sweep(tmp_path):
    """profile.gemm_k0_bf16 replaces the B200 rule's per-tile cost (GB300 takes 53 from
    its own cuBLAS sweep): with 0 the K loop costs nothing, so every K runs at the
    reference K's rate; FP8 scales it by its MMA rate as the rule does."""
    flat = load_file(_gpu_file(tmp_path, {"base": "b200", "profile": {"gemm_k0_bf16": 0}}))
    assert k_loop_efficiency(1024, flat.gpu, "bf16") == 1.0
    rule = DEVICES["b200"]
    assert k_loop_efficiency(1024, rule, "bf16") < 0.9
    own = load_file(_gpu_file(tmp_path, {"base": "b200", "profile": {"gemm_k0_bf16": 388}}))
    assert math.isclose(k_loop_efficiency(1024, own.gpu, "fp8"),
                        k_loop_efficiency(1024, rule, "fp8"), rel_tol=1e-3)
    assert DEVICES["gb300"].profile.gemm_k0_bf16 == 53.0
    with pytest.raises(TopologyError, match="gpu.profile.gemm_k0_bf16"):
        load_file(_gpu_file(tmp_path, {"base": "b200", "profile": {"gemm_k0_bf16": -5}}))


@pytest.mark.parametrize("value", [-1, 100, "4096", True])
def test_a_reference_k_outside_the_measured_range_is_refused(tmp_path, value):
    with pytest.raises(TopologyError, match="gpu.profile.gemm_reference_k"):
        load_file(_gpu_file(tmp_path, {"base": "h100",
                                       "profile": {"gemm_reference_k": value}}))


def test_no_gemm_runs_above_its_peak(tmp_path):
    """A profile file at efficiency 1 with a short reference K would put a long-K GEMM
    above peak; the rate is capped at the peak."""
    spec = load_file(_gpu_file(tmp_path, {"base": "h100", "profile": {
        "gemm_efficiency": 1.0, "gemm_reference_k": 512}})).gpu
    m, n, k = 8192, 8192, 16384
    task = Task(id=0, kind="compute", stream="compute", op="x", phase="forward", layer=0,
                microbatch=0, flops=2.0 * m * n * k, op_class=GEMM, gemm_mnk=(m, n, k))
    busy_s = device_time_s(task, spec, "bf16") - spec.profile.launch_overhead_s
    assert busy_s >= task.flops / spec.peak("bf16") * (1 - 1e-12)
    assert k_loop_efficiency(k, spec, "bf16") > 1      # the factor alone would exceed it


def test_a_grouped_launch_fills_waves_with_all_its_problems():
    """One expert's 768 x 2048 weight gradient is 96 tiles (under one wave of 132 SMs);
    16 experts in one launch fill 1536 tiles, 12 waves, about 0.97."""
    one = wave_efficiency(768, 2048, 2048, 132, 128)
    grouped = wave_efficiency(768, 2048, 2048, 132, 128, groups=16)
    assert one < 0.8 and grouped == pytest.approx(1536 / (12 * 132))


def test_a_chunked_weight_gradient_prices_its_whole_k_loop():
    """A weight gradient split along K over the ring's chunks keeps the whole K in each
    chunk's shape (workloads/tp_overlap.py): its chunks pay no per-tile cost of their own."""
    tasks = []

    class Sink:
        def add(self, **fields):
            tasks.append(fields)
            return len(tasks) - 1
    chunked_gemm(Sink(), [0, 1, 2, 3], 1e12, 2.0, (4096, 1024, 8192), 2, "w.wgrad")
    assert [t["gemm_mnk"] for t in tasks] == [(4096, 1024, 8192)] * 4
    tasks.clear()
    chunked_gemm(Sink(), [0, 1, 2, 3], 1e12, 2.0, (4096, 1024, 8192), 0, "w.dgrad")
    assert [t["gemm_mnk"] for t in tasks] == [(1024, 1024, 8192)] * 4
