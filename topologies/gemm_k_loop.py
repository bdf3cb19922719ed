"""What a GEMM's reduction length (K) does to its speed: a fixed cost per output tile.

A tensor-core GEMM computes each output tile by looping over K; before the loop it fills
its operand pipeline and after it writes the tile out (the epilogue). That per-tile work
does not shrink with K, so a GEMM with a short K loop runs a smaller fraction of its time
at the MMA rate: the fraction is K / (K + K0), with K0 the per-tile cost expressed in
K-elements of MMA work.

K0 from a kernel benchmark: cuBLAS BF16 matmuls (torch.matmul, tritonbench `--op gemm`
aten_matmul) on a Meta B200 at M = N = 8192 with K from 1024 to 16384 (meta-pytorch/
tritonbench pull request 1011, 2026): 714.28, 838.697, 914.601, 958.591 and 948.902
TFLOP/s at K = 1024, 2048, 4096, 8192 and 16384. Their waves are the same at every K, so
rate = E x K / (K + K0) fits them by least squares on the log rates with K0 = 388 (E =
992 TFLOP/s), every point within 2.2 % (rms 1.2 %). The per-tile cost is taken as a fixed
time on every GPU and dtype (assumption: the pipeline fill and the epilogue scale with the
SM, not with its MMA rate), so in K-elements it scales with the MMA rate per SM:
K0 = 388 x (peak per SM) / (B200's BF16 peak per SM, 2250 TFLOP/s over 148 SMs); H100
BF16: 191, H100 FP8: 383. (Those hosts ran B200s under a 750 W limit, an assumption of
topologies/power_capped.py; a limit slows the clock of the MMA and of the per-tile work
alike, so K0 in K-elements does not move with it.)

Cross-check, not used for K0 (but for block-scaled FP8's, below: BLOCKWISE_FP8_TILE_COST):
DeepGEMM's dense FP8 GEMMs on H800 SXM5 (deepseek-ai/
DeepGEMM README.md before pull request #86, the parent of commit 37aa127; NVCC 12.8), its
six rows at M = 4096: N x K = 2112 x 7168, 24576 x 1536, 32768 x 512, 7168 x 16384,
4096 x 7168, 7168 x 2048 at 1127, 1212, 775, 1520, 1410, 1168 TFLOP/s. With this project's
wave model (simulator/compute.py wave_efficiency: 128 x 128 tiles on 132 SMs) they fit
K0 = 490 (rms 3.7 %), where the rule above predicts 383 for H800's FP8: the same
mechanism, a per-tile cost about a quarter larger in DeepGEMM's kernel (its FP8 scales
are promoted per K block on the CUDA cores) than in cuBLAS's (tests/test_gemm_k_loop.py).

A second cross-check, on Hopper: XLA's default matmul performance table for sm_90
(openxla/xla, mirrored in tensorflow/tensorflow third_party/xla/xla/service/gpu/model/
matmul_interpolator_data.h; the GPU SKU is not named) times BF16 batched 4096 x 4096
matmuls at K = 256, 512 and 4096: 503.9, 619.9 and 793.1 TFLOP/s with 4 in the batch,
464.0, 607.7 and 807.7 with 2. Their time is linear in K, a fixed part per wave plus a
part per K-element; the ratio of the two, with no launch time taken off, is 170 (batch 4)
and 202 (batch 2) K-elements, where the rule gives 191 for H100's BF16.

Below K = 512, the shortest K of the cuBLAS and DeepGEMM benchmarks, the factor is held
at 512's: XLA's table goes down to 256 and stays on the line, but only as a batched
4096 x 4096 matmul, and how a very short loop's fixed cost overlaps the output write
(which the memory roofline prices as a max beside it) none of them separates.

A GPU whose own K sweep is published takes its measured per-tile cost instead of this
rule (DeviceProfile.gemm_k0_bf16): GB300's cuBLAS sweep is flat from K = 1024 (K0 = 53,
topologies/specs.py GB300_GEMM_K0_BF16), so the rule's B200 sweep, taken under a 750 W
limit, does not carry to it; how far it carries to other GPUs only their own sweeps can say.

A device profile's GEMM efficiency is measured on GEMMs of some K (its reference), so a
GEMM is priced at f(K) / f(K_ref) of it: longer K loops run slightly faster than the
reference, shorter ones slower. The reference of a rate measured over several GEMMs is
the K whose loop fraction is their time-weighted one: the FLOP-weighted harmonic mean of
their Ks, whatever K0 (effective_k). The rule is per tile and so per GEMM problem: a
grouped GEMM's weight gradient reduces over each expert's rows, its own short K.
"""
from __future__ import annotations

from collections.abc import Iterable

# tritonbench pull request 1011: cuBLAS BF16 at M = N = 8192 on B200 (module docstring).
K_TILE_OVERHEAD_B200_BF16 = 388.0
B200_BF16_PEAK_FLOPS = 2250e12     # topologies/specs.py "b200" (NVIDIA HGX B200 datasheet)
B200_SM_COUNT = 148
# The shortest K of the two benchmarks (DeepGEMM's 32768 x 512 row): shorter loops are
# priced at this K's fraction.
SHORTEST_MEASURED_K = 512


def tile_overhead_k(peak_flops: float, sm_count: int) -> float:
    """The per-tile cost in K-elements on a GPU whose dtype peaks at `peak_flops` over
    `sm_count` SMs (a fixed time, module docstring)."""
    per_sm = peak_flops / max(1, sm_count)
    return K_TILE_OVERHEAD_B200_BF16 * per_sm / (B200_BF16_PEAK_FLOPS / B200_SM_COUNT)


# DeepGEMM's FP8 GEMMs on H800 (the module docstring's cross-check) scale their operands
# per block of 128 and promote the partial sums per K block on the CUDA cores; its six rows
# at M = 4096 fit a per-tile cost of 490 K-elements (rms 3.7 %, tests/test_gemm_k_loop.py)
# where the rule above gives 383 for H800's FP8 (the cuBLAS sweep's). A GEMM with
# 128-element block scales (the fp8_blockwise training dtype) takes the larger cost in that
# ratio. Assumption: cuBLAS's block-scaled FP8 kernels, which Transformer Engine's
# Float8BlockScaling calls on Hopper, pay per tile what DeepGEMM's do; their slower main
# loop, which Transformer Engine's own GEMM benchmark measures, is topologies/specs.py
# BLOCKWISE_FP8_MAINLOOP_RATIO.
DEEPGEMM_H800_K0 = 490.0
# H800 SXM5: the H100 SXM5's dense FP8 peak and SM count (NVIDIA H100 datasheet: 1,979
# TFLOP/s FP8 dense, 132 SMs; the H800 differs in its NVLink and FP64 only)
H800_FP8_PEAK_FLOPS, H800_SM_COUNT = 1979e12, 132
BLOCKWISE_FP8_TILE_COST = DEEPGEMM_H800_K0 / tile_overhead_k(H800_FP8_PEAK_FLOPS,
                                                             H800_SM_COUNT)
# Per-tile cost over the plain rule's, by training dtype (absent: 1).
TILE_COST_FACTOR = {"fp8_blockwise": BLOCKWISE_FP8_TILE_COST}


def k_loop_fraction(k: float, overhead_k: float) -> float:
    """Fraction of a tile's time spent in its K loop: K / (K + K0), with K held at the
    shortest measured K below it."""
    if k <= 0:
        return 1.0
    k = max(k, SHORTEST_MEASURED_K)
    return k / (k + overhead_k)


def effective_k(gemms: Iterable[tuple[float, float]]) -> float:
    """The single K whose loop fraction equals the time-weighted one of `gemms`, given as
    (FLOPs, K) pairs: their FLOP-weighted harmonic mean K (module docstring), what a rate
    measured over those GEMMs stands for."""
    gemms = list(gemms)
    return sum(f for f, _ in gemms) / sum(f / max(k, SHORTEST_MEASURED_K) for f, k in gemms)


def rate_at_k(rate: float, measured_k: float, k: float, overhead_k: float) -> float:
    """A GEMM rate measured at K `measured_k`, carried to K `k` by their loop fractions."""
    return rate * k_loop_fraction(k, overhead_k) / k_loop_fraction(measured_k, overhead_k)
