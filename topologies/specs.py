"""Device specifications of the GPUs the simulator knows, each constant with its source.

Units: FLOP/s, bytes, bytes/s, seconds. Peak FLOP/s are dense (no 2:4 sparsity).
Sources are abbreviated here; docs/references.md, section 4, has them in full:
  [NV-H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; dense = sparse / 2)
  [NV-H200]  NVIDIA H200 product page / datasheet (SXM column)
  [NV-B200]  NVIDIA DGX B200 / HGX B200 datasheet (1000 W B200)
  [NV-GB200] NVIDIA GB200 NVL72 datasheet (per-GPU = rack figure / 72; 1200 W B200)
  [NV-A100]  NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB column)
  [NCCL-topo] NVIDIA/nccl src/graph/topo.h, per-link NVLink bandwidth NCCL assumes
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from .errors import TopologyError

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class DeviceProfile:
    """How close a device gets to its peaks; calibration (validation/) can replace it.

    Defaults are from published measurements (docs/references.md, section 5) and are
    marked where they are assumptions.
    """

    # Best-shape torch.matmul BF16 on H100 SXM reaches 794.5 of 989 TFLOP/s (80.3 %)
    # [stas00/ml-engineering "MAMF" table]. Real layer shapes lose tile/wave quantisation;
    # autoparallel uses a flat 0.70. Assumption: 0.75 for large GEMMs, between the two.
    gemm_efficiency: float = 0.75
    # Output tile of one thread block, for wave quantisation of GEMMs (assumption:
    # 128x128, the common CUTLASS/cuBLAS Hopper BF16 tile).
    gemm_tile: int = 128
    # PyTorch's SDPA flash backend is FlashAttention-2, which reaches ~335-370 TFLOP/s
    # forward (hdim 128, causal, long sequences) on H100, ~35 % of BF16 peak (Shah et al.
    # 2024, FlashAttention-3, arXiv:2407.08608, Figure 5); FA3 reaches ~60-75 %.
    attention_efficiency: float = 0.35
    # Copy kernels reach ~3.0-3.1 of 3.35 TB/s on H100 [stas00/ml-engineering,
    # compute/accelerator/README.md]: 0.9.
    memory_efficiency: float = 0.9
    # Kernel launch + tail per op. autoparallel floors every op at 7 us; an eager
    # PyTorch launch is ~4-10 us. Assumption: 5 us.
    launch_overhead_s: float = 5e-6
    # Fraction of compute speed kept while a collective that runs on SMs overlaps it
    # (NCCL kernels occupy channels x 1 block of 132 SMs; 16-32 channels ~ 12-24 % of
    # SMs). Assumption: 0.9. NVLS offloads reduction to the switch and uses fewer SMs.
    overlap_compute_factor: float = 0.9
    overlap_compute_factor_nvls: float = 0.96
    # Whether collectives run beside compute. GPUs: NCCL kernels run on their own CUDA
    # streams. CPU processes (the gloo validation host): torch's CPU device has no streams
    # (torch.cpu.Stream is a stub), so FSDP2 issues its all-gathers and reduce-scatters
    # synchronously and the training thread waits for each collective.
    concurrent_collectives: bool = True
    # Host time a DTensor redistribution adds to its collective and copies (placement
    # planning, wrapping, the functional collective's bookkeeping), paid before each
    # tensor-parallel collective. Assumption: 0 on GPUs, where this host work runs ahead of
    # the GPU's queue; `validation calibrate` measures it on a CPU host.
    redistribute_overhead_s: float = 0.0
    # Time each member of a collective waits, on average, for the others to arrive: the
    # ranks' compute between two synchronisation points differs by host jitter (a shared
    # CPU host's scheduler), so the one that finishes first waits inside the collective.
    # Paid before every collective. Assumption: 0 on GPUs (no measurement; the launch
    # queue absorbs host jitter); `validation calibrate` measures it on a CPU host, and
    # takes it as the same for every collective whatever the compute before it.
    collective_skew_s: float = 0.0


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model: dense peak FLOP/s per dtype, HBM, and NVLink per GPU."""

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

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; fp32 matmuls use TF32 tensor cores."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise TopologyError("dtype", dtype, ", ".join(sorted(self.peak_flops))) from None

    @property
    def nccl_nvlink_Bps(self) -> float:
        """Per-direction NVLink bandwidth NCCL's tuner plans with (links x per-link)."""
        return self.nvlink_links * self.nccl_nvlink_link_Bps


def _flops(bf16: float, fp8: float | None, fp32: float) -> Mapping[str, float]:
    peaks = {"bf16": bf16, "fp16": bf16, "fp32": fp32}
    if fp8 is not None:   # GPUs without FP8 tensor cores (A100) have no fp8 entry
        peaks["fp8"] = fp8
    return MappingProxyType(peaks)


DEVICES: dict[str, DeviceSpec] = {
    # A100 SXM4 80GB [NV-A100]: 312 TFLOP/s BF16 dense, 156 TF32, no FP8; 2.039 TB/s
    # HBM2e; NVLink3 12 links x 25 GB/s/dir = 300 GB/s/dir (600 bidir); 108 SMs.
    # NCCL topo.h SM80 NVLink = 20.0 GB/s per link.
    "a100": DeviceSpec("a100", _flops(312 * TB, None, 156 * TB), 80 * GB, 2.039 * TB,
                       300 * GB, 12, 20.0 * GB, nvls=False, sm_count=108),
    # H100 SXM5 [NV-H100]: 989 TFLOP/s BF16 dense (1979 sparse), 1979 FP8, 494 TF32;
    # 80 GB HBM3 at 3.35 TB/s; NVLink4 18 links, 900 GB/s bidir = 450/dir.
    # NCCL topo.h SM90 NVLink = 20.6 GB/s per link; NVSwitch gen3 has NVLS.
    "h100": DeviceSpec("h100", _flops(989 * TB, 1979 * TB, 494 * TB), 80 * GB, 3.35 * TB,
                       450 * GB, 18, 20.6 * GB, nvls=True),
    # H100 SXM with 96 GB HBM2e at 2.4 TB/s and a 500 W limit, Meta's Grand Teton variant
    # [torchtitan benchmarks/llama3_h100_202412_torchtitan.md, hardware section]. Its peak
    # is unpublished: "between SXM and NVL, and we don't know its exact value" (same page,
    # footnote 2). Assumption: the midpoint of H100 NVL's 835 and SXM's 989 TFLOP/s BF16
    # dense [NVIDIA H100 product page], 912, with FP8 and TF32 in the SXM ratios (2x, 1/2).
    # NVLink4 and NVSwitch as the SXM5 board (the page: "fully connected with NVLink").
    "h100-hbm2e": DeviceSpec("h100-hbm2e", _flops(912 * TB, 1824 * TB, 456 * TB), 96 * GB,
                             2.4 * TB, 450 * GB, 18, 20.6 * GB, nvls=True),
    # H200 SXM [NV-H200]: same die as H100 (989 / 1979 / 494); 141 GB HBM3e at 4.8 TB/s;
    # NVLink4 900 GB/s bidir. H100 SXM5 and H200 have 132 SMs [NVIDIA H100 whitepaper].
    "h200": DeviceSpec("h200", _flops(989 * TB, 1979 * TB, 494 * TB), 141 * GB, 4.8 * TB,
                       450 * GB, 18, 20.6 * GB, nvls=True),
    # B200 in HGX/DGX B200 at 1000 W [NV-B200]: 2250 TFLOP/s BF16 dense, 4500 FP8,
    # 1100 TF32; 180 GB HBM3e (DGX B200: 1440 GB / 8) at 8 TB/s; NVLink5 18 links,
    # 1.8 TB/s bidir = 900/dir. NCCL topo.h SM100 NVLink = 40.1 GB/s per link.
    # 148 SMs [NVIDIA Blackwell architecture technical brief; assumption for GB200 too].
    "b200": DeviceSpec("b200", _flops(2250 * TB, 4500 * TB, 1100 * TB), 180 * GB, 8 * TB,
                       900 * GB, 18, 40.1 * GB, nvls=True, sm_count=148),
    # B200 inside GB200 at 1200 W [NV-GB200]: 2500 BF16 dense, 5000 FP8, 1250 TF32
    # (rack: 360 PF dense BF16 / 72); 186 GB HBM3e at 8 TB/s; NVLink5 1.8 TB/s bidir.
    "gb200": DeviceSpec("gb200", _flops(2500 * TB, 5000 * TB, 1250 * TB), 186 * GB, 8 * TB,
                        900 * GB, 18, 40.1 * GB, nvls=True, sm_count=148),
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
