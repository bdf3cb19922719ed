"""How close a GPU gets to its peaks: the measured efficiencies a DeviceSpec carries
(topologies/specs.py), each with its source. [STAS] is stas00/ml-engineering
compute/accelerator/README.md (its "Maximum Achievable Matmul FLOPS" tables).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    """How close a device gets to its peaks; calibration (validation/) can replace it.

    Defaults are from published measurements (docs/references.md, section 5) and are
    marked where they are assumptions.
    """

    # The burst rate of a large BF16 GEMM as a fraction of the peak: best-shape
    # torch.matmul on H100 SXM reaches 794.5 of 989 TFLOP/s (80.3 %) [stas00/ml-engineering
    # "MAMF" table: mean of 100 iterations after 50 warm-up, per shape]. A layer's GEMMs
    # pay their own shape losses on top (wave quantisation, compute.py; the K loop, below),
    # and no other margin: Megatron-LM's single-MoE-layer benchmark on H100 runs its
    # expert GEMMs at no less than this rate (validation/moe_layer.py: its measured layer
    # times leave no room for them below ~0.8 of the peak). What a training step sustains
    # is sustained_tensor_ratio of it.
    gemm_efficiency: float = round(794.5 / 989, 3)
    # The K (reduction length) of the GEMMs `gemm_efficiency` was measured on: a GEMM of
    # another K is priced at its K loop's fraction over this one's (topologies/
    # gemm_k_loop.py). The H100 default rests on the best-shape BF16 matmul above,
    # 2048 x 2048 x 13312 [STAS]; other profiles set their measurement's (time-weighted).
    # 0 prices no K loop (a calibrated host; a GPU file without SMs).
    gemm_reference_k: float = 13312.0
    # The per-tile cost of this GPU's BF16 GEMMs in K-elements, where its own K sweep
    # measures it; None takes topologies/gemm_k_loop.py's rule (a B200 sweep scaled by the
    # MMA rate per SM). Other dtypes scale it by their peak over BF16's, as the rule does.
    gemm_k0_bf16: float | None = None
    # The FP8 tensor-core GEMMs' efficiency relative to `gemm_efficiency` (a BF16 one):
    # the measured best-shape FP8 matmul's fraction of the FP8 peak over the best-shape
    # BF16 one's fraction of the BF16 peak, from the same brute-force shape search
    # ([STAS] "Maximum Achievable Matmul FLOPS" table). On H100 SXM FP8 e4m3 reaches
    # 1402.6 of 1979 TFLOP/s (70.9 %) against BF16's 794.5 of 989 (80.3 %): 0.883. Applies
    # to the FP8-class dtypes (FP8_GEMM_DTYPES); NVFP4 keeps 1.0 (assumption: no published
    # best-shape FP4 sweep; cuBLAS 12.9's FP4 at up to 2.3x its FP8 matmuls on Blackwell,
    # see _blackwell_profile, sits above the FP8 efficiency at twice the peak).
    fp8_gemm_ratio: float = round((1402.6 / 1979) / (794.5 / 989), 3)
    # An MXFP8 GEMM's speed relative to a per-tensor FP8 one of the same shape (block
    # scales read inside the MMA): 1.0 where no measurement says otherwise; Blackwell
    # profiles take Transformer Engine's measured ratio (BLACKWELL_MXFP8_OVER_FP8).
    mxfp8_gemm_ratio: float = 1.0
    # Output tile of one thread block, for wave quantisation of GEMMs (assumption:
    # 128x128, the common CUTLASS/cuBLAS Hopper BF16 tile).
    gemm_tile: int = 128
    # PyTorch's SDPA flash backend is FlashAttention-2, which reaches ~335-370 TFLOP/s
    # forward (hdim 128, causal, long sequences) on H100, ~35 % of BF16 peak (Shah et al.
    # 2024, FlashAttention-3, arXiv:2407.08608, Figure 5); FA3 reaches ~60-75 %.
    attention_efficiency: float = 0.35
    # Copy kernels reach ~3.0-3.1 of 3.35 TB/s on H100 [stas00/ml-engineering,
    # compute/accelerator/README.md]: 0.9. Cross-check on H200 with PyTorch's own eager
    # kernel: torch.maximum fp16 (tile-ai/TileOPs issue #512, PyTorch 2.9.1) at 4-21 M
    # elements fits a fixed ~7.8 us plus bytes at 4.25 TB/s, 0.89 of 4.8.
    memory_efficiency: float = 0.9
    # Kernel launch + tail per op. autoparallel floors every op at 7 us; an eager
    # PyTorch launch is ~4-10 us. Assumption: 5 us.
    launch_overhead_s: float = 5e-6
    # The fraction of a burst-measured tensor-core rate (gemm_efficiency, attention_
    # efficiency) a GPU keeps through a training step. Those rates come from benchmarks of
    # tens of milliseconds (mamf-finder: 50 + 100 iterations a shape; triton's do_bench:
    # 25 + 100 ms), while a power-limited GPU's clock takes seconds to settle under
    # back-to-back kernels (about 3 s of oscillation: NVIDIA/cutlass media/docs/cpp/
    # gemm_performance_measurement_methodology_guidelines.md) and a training step keeps
    # its tensor cores busy for seconds. Measured: BF16 FlashAttention-4 run back to back on
    # a B200 at its ~1000 W limit, 1425 and 1450 TFLOP/s over iterations 0-19, 1237 over
    # iterations 70-79 as the SM clock fell from 1965 to ~1580 MHz (flashinfer-ai/
    # flashinfer pull request 2899, 2026): 1237 / 1437.5. Assumption: every GPU keeps that
    # fraction; Hopper's clock falls alike under sustained compute with communication
    # (1980 -> 1575 MHz, deepseek-ai/DeepGEMM issue 120), and no sustained H100 or A100
    # matmul rate is published. Memory-bound kernels keep theirs (the HBM clock is not the
    # one a power limit lowers). A calibrated host's rates are its sustained ones: 1.
    sustained_tensor_ratio: float = round(1237 / ((1425 + 1450) / 2), 3)
    # Fraction of compute speed kept while an NCCL collective overlaps it (on SMs; NVLS).
    # None: by the SMs the collective's kernel holds, one per channel (simulator/
    # sm_share.py); a number: a measured host's factor (validation calibrate) or a
    # user's, which overrides that for NCCL kernels.
    overlap_compute_factor: float | None = None
    overlap_compute_factor_nvls: float | None = None
    # Whether the device's GEMMs run as persistent kernels: min(tiles, SMs) thread blocks,
    # each looping over its share of the tiles, so that blocks finding no free SM beside a
    # communication kernel run as a second wave (simulator/sm_share.py). True on Hopper:
    # "all the matmuls look like they are using persistent kernels ... they launch as many
    # CUDA blocks as there are SMs" and take 2x as long beside an NCCL kernel (H100, FSDP;
    # pytorch/pytorch issue 143988, and pull request 144974's sm_carveout for it; CUTLASS's
    # "Blackwell Cluster Launch Control" page describes the same imbalance of a static
    # persistent schedule when another kernel holds some SMs). False elsewhere: on
    # Blackwell, cluster launch control lets running blocks take the tiles of blocks not
    # yet launched (the same CUTLASS page), and Ampere's cuBLAS kernels launch a block per
    # tile, so compute keeps the free SMs' share (assumption: cuBLAS's kernels do so; no
    # measurement of either beside NCCL).
    persistent_gemm_blocks: bool = False
    # Whether collectives run beside compute. GPUs: NCCL kernels run on their own CUDA
    # streams. CPU processes (the gloo validation host): torch's CPU device has no streams
    # (torch.cpu.Stream is a stub), so FSDP2 issues its all-gathers and reduce-scatters
    # synchronously and the training thread waits for each collective.
    concurrent_collectives: bool = True
    # Host time a DTensor redistribution adds to its collective and copies (placement
    # planning, the autograd nodes of the redistribution and of to_local / from_local, the
    # functional collective's wrapping and wait), paid before each tensor-parallel
    # collective. Assumption: 0 on GPUs, where this host work runs ahead of the GPU's
    # queue; `validation calibrate` measures it on a CPU host, forward and backward under
    # autograd as training runs it (validation/host_overheads.py).
    redistribute_overhead_s: float = 0.0
    # Time each member of a collective waits, on average, for the others to arrive: the
    # ranks' compute between two synchronisation points differs by host jitter (a shared
    # CPU host's scheduler), so the one that finishes first waits inside the collective.
    # Paid before every collective. Assumption: 0 on GPUs (no measurement; the launch
    # queue absorbs host jitter); `validation calibrate` measures it on a CPU host, and
    # takes it as the same for every collective whatever the compute before it.
    collective_skew_s: float = 0.0
