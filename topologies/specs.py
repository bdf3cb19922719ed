"""Device specifications of the GPUs the simulator knows, each constant with its source.

Units: FLOP/s, bytes, bytes/s, seconds, watts. Peak FLOP/s are dense (no 2:4 sparsity):
NVIDIA's tables print the sparse figure, twice the dense one. HBM capacities are binary:
NVIDIA's memory "GB" count 2**30 bytes (an H100 "80GB" shows 81,559 MiB in nvidia-smi,
79.6 GiB after the driver's reservation; DRAM dies hold a power-of-two number of bits:
stas00/ml-engineering compute/accelerator/README.md, "Memory"), while bandwidths are
decimal (1 TB/s = 1e12 B/s).
Sources are abbreviated here; docs/references.md, section 4, has them in full:
  [NV-H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; dense = sparse / 2)
  [NV-H200]  NVIDIA H200 product page / datasheet (SXM column)
  [NV-BW]    NVIDIA Blackwell datasheet, "Individual Blackwell GPU Specifications" of the
             GB200 NVL72 and HGX B200 columns (sparse figures; dense = / 2)
  [NV-GB200] NVIDIA GB200 NVL72 datasheet (rack figures / 72; 1200 W B200)
  [NV-GB300] NVIDIA GB300 NVL72 datasheet (rack figures / 72; 1400 W Blackwell Ultra)
  [NV-BWU]   NVIDIA technical blog "Inside NVIDIA Blackwell Ultra: The Chip Powering the
             AI Factory Era" (2025): 160 SMs, 15 PFLOP/s dense NVFP4, 288 GB HBM3e, 8 TB/s
  [GK-B200]  glennklockwood.com/garden/processors/B200: dense/sparse tables of the GB200
             (1200 W) and HGX (1000 W) variants
  [STAS]     stas00/ml-engineering compute/accelerator/README.md (TFLOPS, memory and
             power tables)
  [NV-A100]  NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB and 40 GB columns)
  [NCCL-topo] NVIDIA/nccl src/graph/topo.h, per-link NVLink bandwidth NCCL assumes
Block-scaled formats: Blackwell's fifth-generation tensor cores run MXFP8 at the FP8 rate
and NVFP4 at the FP4 rate (the scales are applied inside the MMA: [NV-BW] lists one
"FP8/FP6" and one "FP4" figure). Hopper has no block-scaled tensor cores, so its specs
have no mxfp8 or nvfp4 entry and a plan asking for one is refused by `peak`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from .attention_kernels import fwd_bwd_efficiency
from .device_profile import DeviceProfile
from .errors import TopologyError
from .gemm_k_loop import effective_k, rate_at_k, tile_overhead_k

GB = 1e9
GiB = 2 ** 30   # NVIDIA's memory "GB" (see above)
TB = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model: dense peak FLOP/s per dtype, HBM, NVLink per GPU and its power."""

    name: str
    peak_flops: Mapping[str, float]  # dtype -> dense FLOP/s
    hbm_bytes: float
    hbm_Bps: float
    nvlink_Bps: float  # per GPU, per direction, raw line rate
    nvlink_links: int  # NVLink links per GPU
    nccl_nvlink_link_Bps: float  # what NCCL's tuner assumes per link (topo.h)
    nvls: bool  # NVSwitch in-network reduction (NVLink SHARP) available
    sm_count: int = 132  # streaming multiprocessors (for GEMM wave quantisation)
    profile: DeviceProfile = field(default_factory=DeviceProfile)
    tdp_w: float = 0.0  # maximum board power (0: not given)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; fp32 matmuls use TF32 tensor cores. A dtype the
        GPU has no tensor cores for (mxfp8/nvfp4 on Hopper, fp8 on A100) is an input
        error naming the GPU and what it runs."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise TopologyError("dtype", dtype, f"{', '.join(sorted(self.peak_flops))} "
                                f"on {self.name}") from None

    def gemm_efficiency(self, gemm_dtype: str) -> float:
        """Fraction of `peak(gemm_dtype)` a large GEMM reaches: the profile's (BF16-derived)
        efficiency, times its FP8 ratio for the FP8-class dtypes (and MXFP8's own ratio
        to those)."""
        eff = self.profile.gemm_efficiency
        if gemm_dtype == "mxfp8":
            return eff * self.profile.fp8_gemm_ratio * self.profile.mxfp8_gemm_ratio
        if gemm_dtype == "fp8_blockwise":
            return eff * self.profile.fp8_gemm_ratio * BLOCKWISE_FP8_MAINLOOP_RATIO
        return eff * self.profile.fp8_gemm_ratio if gemm_dtype in FP8_GEMM_DTYPES else eff

    @property
    def nccl_nvlink_Bps(self) -> float:
        """Per-direction NVLink bandwidth NCCL's tuner plans with (links x per-link)."""
        return self.nvlink_links * self.nccl_nvlink_link_Bps


# The training dtypes whose GEMMs run on the FP8 tensor-core path: per-tensor (delayed or
# current scaling), row-wise, 128-element blocks and MXFP8 (block scales applied inside
# the same MMA).
FP8_GEMM_DTYPES = frozenset({"fp8", "fp8_cs", "fp8_rowwise", "fp8_blockwise", "mxfp8"})

# Transformer Engine's Float8BlockScaling runs cuBLAS's block-scaled FP8 GEMMs on Hopper,
# which apply the 1 x 128 and 128 x 128 scales inside the main loop: their rate against the
# per-tensor FP8 kernels', on top of the per-tile cost (gemm_k_loop.py BLOCKWISE_FP8_TILE_COST).
# ESTIMATED on Transformer Engine's GEMM profiling guide (NVIDIA/TransformerEngine docs/
# examples/gemm_profiling/gemm_profiling.rst at 8f2e6357, "Worked Example: 5B Model on
# H200", benchmarks/gemm/benchmark_gemm.py on an H200 NVL): a GPT 5B layer's twelve GEMM
# shapes take 20.285 ms with quantisation under FP8 CurrentScaling and 16.785 ms
# pre-quantised (kernels alone), so 3.500 ms of quantisation; 22.882 ms under FP8 Block,
# whose kernels alone the guide could not time on Hopper. With Block's quantisation taken
# as CurrentScaling's times the simulator's cast-cost ratio of the two recipes on that
# layer (0.645: one pass writing both usages against an amax pass and a cast,
# workloads/precision.py), Block's kernels take 1.229 x CurrentScaling's, and this ratio
# makes the simulator's GEMM time on the layer 1.229 x its per-tensor one
# (tests/test_fp8_blockwise.py recomputes both). The split is an assumption: the guide
# puts Block's extra time on its quantisation ("computing per-block scale factors ... is
# not fully offset"); were Block's quantisation as costly as CurrentScaling's the ratio
# would be 0.88, at 1.5 x it 0.97. Cross-check, not used: FBGEMM's CUTLASS block-scaled
# FP8 kernels alone run at 0.73-0.77 of its row-wise ones on a 500 W H100 (pytorch/FBGEMM
# pull request 2546). Scored on the table's one block-scaled row and the moe-layer check,
# neither from the guide.
BLOCKWISE_FP8_MAINLOOP_RATIO = 0.825


def _flops(bf16: float, fp8: float | None, fp32: float,
           fp4: float | None = None) -> Mapping[str, float]:
    """Dense peaks by training dtype. `fp4` is given for Blackwell only, whose tensor cores
    also run the block-scaled formats: MXFP8 at the FP8 rate, NVFP4 at the FP4 rate."""
    peaks = {"bf16": bf16, "fp32": fp32}   # the training dtypes only (no fp16 plans)
    if fp8 is not None:   # GPUs without FP8 tensor cores (A100) have no fp8 entry
        peaks["fp8"] = fp8
        peaks["fp8_rowwise"] = fp8   # row-wise scales, applied in the epilogue: same MMA
        peaks["fp8_cs"] = fp8        # current scaling: per-tensor scales, same MMA
    if fp8 is not None and fp4 is None:
        # FP8 with 1 x 128 / 128 x 128 FP32 block scales (Transformer Engine
        # Float8BlockScaling): cuBLAS's block-scaled FP8 GEMMs on Hopper, the FP8 MMA with
        # the scales applied per K block (topologies/gemm_k_loop.py BLOCKWISE_FP8_TILE_COST;
        # their rate: BLOCKWISE_FP8_MAINLOOP_RATIO above).
        # Blackwell runs the recipe too, by a conversion not modelled here: refused there.
        peaks["fp8_blockwise"] = fp8
    if fp4 is not None:
        peaks.update(mxfp8=fp8, nvfp4=fp4)
    return MappingProxyType(peaks)


training_dtype_peaks = _flops   # GPU files build their peaks by the same rule (presets_file.py)


def _blackwell_profile(mamf_efficiency: float, attention_efficiency: float,
                       fp8_mamf_efficiency: float | None = None) -> DeviceProfile:
    """The H100 defaults with the GEMM efficiency at the measured best-shape BF16 matmul
    efficiency ("MAMF") of this GPU [STAS] times the Blackwell layer-shape margin
    (BLACKWELL_GEMM_MARGIN, measured by Transformer Engine's GEMM benchmark at a model's
    layer shapes on B300; H100's default takes none, its layer GEMMs reaching the best-
    shape rate in Megatron-LM's single-MoE-layer benchmark).
    Assumption: the margin measured on B300 holds on B200 and GB200 (the same
    fifth-generation tensor cores and cuBLAS kernel families). FP8 GEMMs take
    `fp8_mamf_efficiency`, the best-shape FP8 matmul's fraction of the FP8 peak on this GPU
    ([STAS] FP8 MAMF table), over the BF16 one as their ratio (DeviceProfile.
    fp8_gemm_ratio); block-scaled MXFP8 GEMMs that times BLACKWELL_MXFP8_OVER_FP8 (the same
    benchmark). NVFP4 GEMMs keep the BF16 efficiency: assumption, resting on
    cuBLAS 12.9 running block-scaled FP4 at up to 2.3x its FP8 matmuls on Blackwell
    (NVIDIA technical blog "Boosting Matrix Multiplication Speed and Flexibility with
    NVIDIA cuBLAS 12.9", 2025), i.e. at least the FP8 efficiency at the 2x peak.

    Memory-bound kernels reach BLACKWELL_MEMORY_EFFICIENCY of the published HBM bandwidth
    (a B200 kernel measurement, below) instead of H100's copy-kernel 0.9.

    Attention runs at `attention_efficiency`: cuDNN's fused attention measured on this GPU
    (topologies/attention_kernels.py), the kernel Transformer Engine and torchtitan run on
    Blackwell, instead of the H100 default's FlashAttention-2 fraction."""
    ratio = 1.0 if fp8_mamf_efficiency is None else round(fp8_mamf_efficiency
                                                           / mamf_efficiency, 3)
    return DeviceProfile(gemm_efficiency=round(mamf_efficiency * BLACKWELL_GEMM_MARGIN, 3),
                         gemm_reference_k=BLACKWELL_GEMM_REFERENCE_K,
                         memory_efficiency=BLACKWELL_MEMORY_EFFICIENCY, fp8_gemm_ratio=ratio,
                         mxfp8_gemm_ratio=BLACKWELL_MXFP8_OVER_FP8,
                         attention_efficiency=attention_efficiency)


# Memory-bound kernels on Blackwell: torchao's B200 quantisation-kernel benchmark (a bf16
# 16384 x 16384 read, FP8 data and 1-per-32 scales written; "NVIDIA B200 with 1000W power
# supply", pytorch/ao docs/source/workflows/training.md, "quantization kernel
# microbenchmarks") reaches at best 6462 GB/s (dim0_mxfp8_floor: 125.92 us), 0.839 of the
# HGX B200's published 7.7 TB/s [NV-BW]: the best of that table's memory-bound kernels, as
# H100's 0.9 is its best copy kernels' fraction [STAS]. Assumptions: a streaming quantise
# kernel stands for the step's memory-bound ops (no published B200 copy benchmark was
# found); GB200 and GB300 (HBM3e behind the same memory controllers) keep the same
# fraction of their published 8 TB/s. Cross-check: elementwise kernels of PyTorch's ops on
# a B200 (NVIDIA/cccl pull request #7391, cub::DeviceTransform relu bf16 and add fp16,
# 2^24 and 2^28 elements) take a fixed ~8.7 us plus bytes at 6.93-6.97 TB/s (0.90), so
# this fraction plus the launch overhead stays within 7 % above and ~9 us below them
# (tests/test_memory_bandwidth.py); no published B200 timing of PyTorch's own eager kernels
# was found that is slower.
B200_BEST_MEMORY_KERNEL_Bps = 6462e9
BLACKWELL_MEMORY_EFFICIENCY = round(B200_BEST_MEMORY_KERNEL_Bps / (7.7 * TB), 3)


# Blackwell GEMMs at layer shapes. Transformer Engine's GEMM benchmark (NVIDIA/
# TransformerEngine benchmarks/gemm/benchmark_gemm.py; its results in docs/examples/
# gemm_profiling/gemm_profiling.rst, "Autocast vs Pre-quantized": pull request 2863, commit
# 1609c890e, June 2026, in v2.17) times the 12 GEMMs of one layer of a 5B model
# (hidden 4096, FFN 16384, 32 heads without GQA: QKV 12288;
# 31 x 512 = 15,872 tokens; forward, data- and weight-gradient shapes) on a "B300 SXM6 AC"
# with the inputs quantised beforehand (kernel time only): BF16 13.102 ms, FP8 tensor-wise
# (current scaling) 6.812 ms, MXFP8 7.161 ms per layer. 3 x 2 x 15872 x 4096 x (12288 +
# 4096 + 2 x 16384) FLOPs in 13.102 ms is 1463 TFLOP/s, 65.0 % of B300's 2.25 PFLOP/s
# dense BF16 peak (the "NVIDIA B300 SXM6 AC" entry of pytorch/ao torchao/testing/training/
# roofline_utils.py, from NVIDIA's Blackwell Ultra datasheet), against B300's best-shape
# 78.6 % [STAS] (the GB300 entry below): at layer shapes Blackwell keeps 0.827 of its
# best-shape rate, where H100's reach theirs (DeviceProfile). The same run's MXFP8 layer takes
# 7.161 / 6.812 of the tensor-wise FP8 time: an MXFP8 GEMM runs at 0.951 of the FP8 rate
# (the E8M0 block scales are loaded beside the operands and applied in the MMA).
# A B200 cross-check, not used: torchao's bench_matmul on an "NVIDIA B200" (power limit
# not stated) ran BF16 matmuls at 1.41, 1.45 and 1.42 PFLOP/s at 4096^3, 6144^3 and
# 8192^3 (pytorch/ao pull request 2427, June 2025), 62.7-64.6 % of 2.25 PFLOP/s, where the
# B200 profile below prices 64.2 % (77.6 % without the layer-shape margin).
TE_B300_LAYER_GEMM_FLOPS = 3 * 2 * 15872 * 4096 * (12288 + 4096 + 2 * 16384)
TE_B300_LAYER_GEMM_S = {"bf16": 13.102e-3, "fp8": 6.812e-3, "mxfp8": 7.161e-3}
B300_BF16_PEAK_FLOPS, B300_BF16_MAMF_EFFICIENCY = 2250 * TB, 0.786
# B300 SXM's best-shape FP8 e4m3 matmul: 3353.3 of 4500 TFLOP/s [STAS]; the "b300" and
# "gb300" entries (one die) take it.
B300_FP8_MAMF_EFFICIENCY = round(3353.3 / 4500, 3)
BLACKWELL_GEMM_MARGIN = (TE_B300_LAYER_GEMM_FLOPS / TE_B300_LAYER_GEMM_S["bf16"]
                         / B300_BF16_PEAK_FLOPS / B300_BF16_MAMF_EFFICIENCY)
BLACKWELL_MXFP8_OVER_FP8 = round(TE_B300_LAYER_GEMM_S["fp8"] / TE_B300_LAYER_GEMM_S["mxfp8"], 3)
# The K loops of that benchmark's GEMMs, as (FLOPs, K) per projection and pass: forward K
# is the input width (4096 for QKV, proj and fc1; 16384 for fc2), the data gradient's the
# output width (12288, 4096, 16384, 4096), the weight gradient's the 15872 tokens. Their
# time-weighted loop fraction (the FLOP-weighted harmonic mean K) is what the Blackwell
# GEMM efficiency stands for: its reference K (topologies/gemm_k_loop.py).
_TE_LAYER_TOKENS = 15872
_TE_LAYER_PROJECTIONS = ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))
BLACKWELL_GEMM_REFERENCE_K = round(effective_k(
    [(2.0 * _TE_LAYER_TOKENS * k_in * k_out, k)
     for k_in, k_out in _TE_LAYER_PROJECTIONS for k in (k_in, k_out, _TE_LAYER_TOKENS)]))

# What a 500 W power limit does to an H100: under a dense GEMM the board reaches its power
# limit and the tensor-core clock drops until it fits, so the sustained rate sits well
# below the clock-derived peak. Measured on an "H100 500W" (Meta's fleet, the Grand Teton
# board) by FBGEMM's GEMM benchmark (pytorch/FBGEMM pull request 2546, 2024): BF16
# 585.23 TFLOP/s at 8192 x 8192 x 8192, 575.12 at 65536 x 8192 x 7168 and 546.31 at
# 65536 x 3584 x 8192 (Llama-70B-sized layer GEMMs); mean 568.9 TFLOP/s. The same run's
# FP8 row-wise GEMMs reach 1082.8-1141.4 TFLOP/s, the same fraction of the FP8 peak
# within 2 %, so one efficiency serves both dtypes. These are layer shapes, so no
# shape margin is taken off (wave quantisation is still charged per GEMM).
H100_500W_GEMM_FLOPS = (585.23 + 575.12 + 546.31) / 3 * TB
H100_500W_PEAK_FLOPS = 912 * TB    # the "h100-hbm2e" entry's assumed BF16 peak (below)
# The K loops of those three GEMMs (K = 8192, 7168, 8192), each weighted alike as their
# rates are averaged: the profile's reference K (topologies/gemm_k_loop.py).
H100_500W_GEMM_REFERENCE_K = round(effective_k([(1.0, 8192), (1.0, 7168), (1.0, 8192)]))
# The cap slows every tensor-core kernel by the same clock: the attention kernel keeps the
# H100 SXM default's efficiency times the ratio of the 500 W GEMM rate to the modelled H100
# SXM (700 W) burst GEMM rate, 0.803 x 989 TFLOP/s [NV-H100], carried to the 500 W GEMMs' K loop
# (the two rates are compared at one K). Assumption: attention is tensor-core bound as the
# GEMMs are (FlashAttention-2 at long sequences), so it loses the same clock.
H100_500W_CLOCK_RATIO = H100_500W_GEMM_FLOPS / rate_at_k(
    DeviceProfile().gemm_efficiency * 989 * TB, DeviceProfile.gemm_reference_k,
    H100_500W_GEMM_REFERENCE_K, tile_overhead_k(989 * TB, 132))
POWER_CAPPED_500W_PROFILE = DeviceProfile(
    persistent_gemm_blocks=True,   # Hopper (topologies/device_profile.py)
    gemm_efficiency=round(H100_500W_GEMM_FLOPS / H100_500W_PEAK_FLOPS, 3),
    gemm_reference_k=H100_500W_GEMM_REFERENCE_K,
    fp8_gemm_ratio=1.0,   # FBGEMM's FP8 row-wise layer GEMMs: the BF16 fraction (above)
    attention_efficiency=round(DeviceProfile().attention_efficiency * 989 / 912
                               * H100_500W_CLOCK_RATIO, 3))

# GB300's own GEMM rate, measured: cuBLAS matmuls (aten_matmul) on a GB300 at 8192 x 8192 x
# 4096 and x 8192 run 1756.31 and 1717.37 TFLOP/s (facebookexperimental/triton pull request
# 740, December 2025, "Perf number on GB300"; FP16, whose dense tensor-core peak is BF16's
# [STAS]). Assumption: the GB300's default 1400 W limit (its default and maximum, pull
# request 2023 of the same repository, where a 500 W cap held cuBLAS to ~617 TFLOP/s). Layer-
# sized shapes, the 750 W B200's two (topologies/power_capped.py), so no shape margin is
# taken off; this replaces the B300 best-shape fraction times Blackwell's layer margin,
# which priced 1593 TFLOP/s at these shapes' K (8 % below), measured on a 1000 W B300.
GB300_GEMM_FLOPS = (1756.31 + 1717.37) / 2 * TB
GB300_GEMM_REFERENCE_K = round(effective_k([(1.0, 4096), (1.0, 8192)]))
# The same run's K sweep at M = N = 8192 (K = 512 ... 16384: 1595.79, 1745.78, 1751.9,
# 1756.31, 1717.37, 1812.09 TFLOP/s) is flat from K = 1024: rate = E x K / (K + K0) fits it
# with K0 = 53 K-elements (rms 2.0 %), where topologies/gemm_k_loop.py's rule (a 750 W B200
# sweep) gives 399 and misses these points by up to 25 %. GB300 takes its own.
GB300_GEMM_K0_BF16 = 53.0

# A100's own best-shape BF16 matmul: 271.2 of 312 TFLOP/s (86.9 %) at 1024 x 10240 x 5120
# [STAS, "NVIDIA A100 SXM"]; the same die and clocks in the 40 GB part (assumption: the
# HBM2 it lacks does not bound a large matmul).
A100_PROFILE = DeviceProfile(gemm_efficiency=round(271.2 / 312, 3), gemm_reference_k=5120.0)

DEVICES: dict[str, DeviceSpec] = {
    # A100 SXM4 80GB [NV-A100]: 312 TFLOP/s BF16 dense, 156 TF32, no FP8; 2.039 TB/s
    # HBM2e; NVLink3 12 links x 25 GB/s/dir = 300 GB/s/dir (600 bidir); 108 SMs; 400 W.
    # NCCL topo.h SM80 NVLink = 20.0 GB/s per link.
    "a100": DeviceSpec("a100", _flops(312 * TB, None, 156 * TB), 80 * GiB, 2.039 * TB,
                       300 * GB, 12, 20.0 * GB, nvls=False, sm_count=108, tdp_w=400,
                       profile=A100_PROFILE),
    # A100 SXM4 40GB [NV-A100, SXM4 40 GB column]: the same die and peaks as the 80 GB
    # part, 40 GB (GiB) of HBM2 at 1,555 GB/s (against HBM2e's 2,039); NVLink3 and SMs
    # alike; 400 W. The GPU of the first DGX A100 systems (2020), which the Megatron-LM
    # README's A100 scaling table names ("DGX A100 (8x A100 40GB)").
    "a100-40gb": DeviceSpec("a100-40gb", _flops(312 * TB, None, 156 * TB), 40 * GiB,
                            1.555 * TB, 300 * GB, 12, 20.0 * GB, nvls=False, sm_count=108,
                            tdp_w=400, profile=A100_PROFILE),
    # H100 SXM5 [NV-H100]: 989 TFLOP/s BF16 dense (1979 sparse), 1979 FP8, 494 TF32;
    # 80 GB (GiB) HBM3 at 3.35 TB/s; NVLink4 18 links, 900 GB/s bidir = 450/dir; 700 W.
    # NCCL topo.h SM90 NVLink = 20.6 GB/s per link; NVSwitch gen3 has NVLS.
    "h100": DeviceSpec("h100", _flops(989 * TB, 1979 * TB, 494 * TB), 80 * GiB, 3.35 * TB,
                       450 * GB, 18, 20.6 * GB, nvls=True, tdp_w=700,
                       profile=DeviceProfile(persistent_gemm_blocks=True)),
    # H100 SXM with 96 GB HBM2e at 2.4 TB/s and a 500 W limit, Meta's Grand Teton variant
    # [torchtitan benchmarks/llama3_h100_202412_torchtitan.md, hardware section]. Its peak
    # is unpublished: "between SXM and NVL, and we don't know its exact value" (same page,
    # footnote 2). Assumption: the midpoint of H100 NVL's 835 and SXM's 989 TFLOP/s BF16
    # dense [NVIDIA H100 product page], 912, with FP8 and TF32 in the SXM ratios (2x, 1/2).
    # NVLink4 and NVSwitch as the SXM5 board (the page: "fully connected with NVLink").
    # Sustained rates under the 500 W limit: POWER_CAPPED_500W_PROFILE (above).
    "h100-hbm2e": DeviceSpec("h100-hbm2e", _flops(912 * TB, 1824 * TB, 456 * TB),
                             96 * GiB, 2.4 * TB, 450 * GB, 18, 20.6 * GB, nvls=True,
                             profile=POWER_CAPPED_500W_PROFILE, tdp_w=500),
    # H200 SXM [NV-H200]: same die as H100 (989 / 1979 / 494); 141 GB (GiB) HBM3e at
    # 4.8 TB/s; NVLink4 900 GB/s bidir; 700 W. H100 SXM5 and H200 have 132 SMs [NVIDIA
    # H100 whitepaper]. Best-shape FP8 e4m3 matmul: 1453.4 of 1979 TFLOP/s, 73.4 %, with
    # BF16 stated the same as H100's 80.3 % [STAS]: its own FP8 ratio.
    "h200": DeviceSpec("h200", _flops(989 * TB, 1979 * TB, 494 * TB), 141 * GiB, 4.8 * TB,
                       450 * GB, 18, 20.6 * GB, nvls=True, tdp_w=700,
                       profile=DeviceProfile(fp8_gemm_ratio=round((1453.4 / 1979)
                                                                  / (794.5 / 989), 3),
                                             persistent_gemm_blocks=True)),
    # B200 in HGX/DGX B200 at 1000 W [NV-BW HGX B200 column; GK-B200 HGX table; STAS]:
    # 2250 TFLOP/s BF16 dense (4.5 PF sparse), 4500 FP8 and MXFP8 (9 PF sparse), 9000 FP4
    # and NVFP4 (18 PF sparse), 1100 TF32 (2.2 PF sparse); 180 GB (GiB) HBM3e at 7.7 TB/s
    # [NV-BW] (the DGX B200 datasheet's 64 TB/s for 8 GPUs rounds it to 8); NVLink5 18
    # links, 1.8 TB/s bidir = 900/dir; 1000 W. NCCL topo.h SM100 NVLink = 40.1 GB/s per
    # link. 148 SMs, 592 tensor cores (hmc-tech.com B200 spec page; NVIDIA publishes no
    # SM count for B200). Best-shape BF16 matmul: 1745 of 2250 TFLOP/s, 77.6 % [STAS];
    # FP8 e4m3: 3432.5 of 4500, 76.3 % [STAS].
    "b200": DeviceSpec("b200", _flops(2250 * TB, 4500 * TB, 1100 * TB, 9000 * TB),
                       180 * GiB, 7.7 * TB, 900 * GB, 18, 40.1 * GB, nvls=True,
                       sm_count=148, profile=_blackwell_profile(
                           0.776, fwd_bwd_efficiency("b200", 2250 * TB), 0.763), tdp_w=1000),
    # B200 inside GB200 at 1200 W [NV-BW GB200 NVL72 column; NV-GB200; GK-B200 GB200
    # table]: 2500 BF16 dense (5 PF sparse; rack 360 PF sparse / 72), 5000 FP8 and MXFP8,
    # 10000 FP4 and NVFP4 (20 PF sparse; rack 1440 PF sparse / 72), 1250 TF32; 186 GB (GiB)
    # HBM3e at 8 TB/s (rack 13.4 TB and 576 TB/s / 72); NVLink5 1.8 TB/s bidir; 1200 W;
    # 148 SMs (hmc-tech.com GB200 page: 296 for the superchip's two GPUs). Best-shape BF16
    # matmul: 1822 of 2500 TFLOP/s, 72.9 % [STAS]; FP8 e4m3: 3615.6 of 5000, 72.3 % [STAS].
    "gb200": DeviceSpec("gb200", _flops(2500 * TB, 5000 * TB, 1250 * TB, 10000 * TB),
                        186 * GiB, 8 * TB, 900 * GB, 18, 40.1 * GB, nvls=True,
                        sm_count=148, profile=_blackwell_profile(
                            0.729, fwd_bwd_efficiency("gb200", 2500 * TB), 0.723), tdp_w=1200),
    # Blackwell Ultra in HGX/DGX B300 [STAS TFLOPS table, B300 row, from NVIDIA's DGX B300
    # datasheet; NV-BWU]: 2250 TFLOP/s BF16 dense, 4500 FP8 and MXFP8, 12600 FP4 and
    # NVFP4 (STAS's fp4 column, as B200's 9000), 1125 TF32; HBM3e at 8 TB/s [STAS memory
    # table; NV-BWU]; NVLink5 1.8 TB/s bidir, 18 links, NCCL's SM100 per-link figure; 160
    # SMs (the Blackwell Ultra GPU [NV-BWU]); 1000 W maximum TGP [STAS power table, from
    # NVIDIA's DGX B300 user guide, "power capping"]. HBM: 270 GiB, assumption: the 288 GB
    # of eight 12-high stacks [NV-BWU; STAS] less the 1/16 the HGX B200 holds back (192 ->
    # 180), as the Grace boards hold back 1/32 of the same stacks (GB200 186, GB300 279).
    # Best-shape matmuls measured on this GPU, "B300 SXM" [STAS]: BF16 1769 of 2250
    # (78.6 %), FP8 e4m3 3353.3 of 4500 (74.5 %). Attention: no B300 measurement;
    # GB300's cuDNN rate at the same fraction of its BF16 peak (assumption: one die, its
    # tensor-core clock scaling both, as under a power limit).
    "b300": DeviceSpec("b300", _flops(2250 * TB, 4500 * TB, 1125 * TB, 12600 * TB),
                       270 * GiB, 8 * TB, 900 * GB, 18, 40.1 * GB, nvls=True,
                       sm_count=160, profile=_blackwell_profile(
                           B300_BF16_MAMF_EFFICIENCY, fwd_bwd_efficiency("gb300", 2500 * TB),
                           B300_FP8_MAMF_EFFICIENCY), tdp_w=1000),
    # Blackwell Ultra inside GB300 at 1400 W [NV-GB300; NV-BWU; STAS]: 2500 BF16 dense
    # (rack 360 PF sparse / 72), 5000 FP8 and MXFP8 (rack 720 PF sparse / 72), 15000 FP4
    # and NVFP4 dense (rack 1080 PF dense / 72; NV-BWU "15 PetaFLOPS dense NVFP4"), 1250
    # TF32 (rack 180 PF sparse / 72); HBM3e 279 GB (GiB) per GPU (rack "20 TB" / 72; the
    # 288 GB of NV-BWU are the eight 12-high stacks before the reservation, as 192 vs
    # 180/186 on B200) at 8 TB/s (rack 576 TB/s / 72); NVLink5 1.8 TB/s bidir, 18 links,
    # NCCL's SM100 per-link figure (same NVLink generation); 160 SMs [NV-BWU]; 1400 W
    # [STAS power table; NVIDIA's GB300 rack-planning example: four 1.4 kW GPUs per tray].
    # GEMMs at GB300's measured cuBLAS rate (GB300_GEMM_FLOPS, above); FP8 at the FP8-over-
    # BF16 fraction of the same die's best-shape matmuls, B300 SXM's BF16 78.6 % and FP8
    # e4m3 74.5 % [STAS] (as B200 and GB200 take their own).
    "gb300": DeviceSpec("gb300", _flops(2500 * TB, 5000 * TB, 1250 * TB, 15000 * TB),
                        279 * GiB, 8 * TB, 900 * GB, 18, 40.1 * GB, nvls=True,
                        sm_count=160, profile=replace(
                            _blackwell_profile(B300_BF16_MAMF_EFFICIENCY,
                                               fwd_bwd_efficiency("gb300", 2500 * TB),
                                               B300_FP8_MAMF_EFFICIENCY),
                            gemm_efficiency=round(GB300_GEMM_FLOPS / (2500 * TB), 3),
                            gemm_reference_k=GB300_GEMM_REFERENCE_K,
                            gemm_k0_bf16=GB300_GEMM_K0_BF16),
                        tdp_w=1400),
}


def device(name: str) -> DeviceSpec:
    """The bundled spec of a GPU by its lower-case name (`h100`, `b200`, ...)."""
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise TopologyError("gpu", name, ", ".join(DEVICES)) from None


def with_profile(spec: DeviceSpec, **changes: float) -> DeviceSpec:
    """A copy of `spec` whose profile has the given fields changed."""
    return replace(spec, profile=replace(spec.profile, **changes))
